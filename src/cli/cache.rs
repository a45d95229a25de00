//! `kiln cache prune`.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::Failure;

/// Manage the cache directory.
#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// Remove least recently used dependency layers, unpacked root file systems and Function
    /// images of the local store, by age and to a size. Safe while builds and runs use the
    /// cache: what they use is skipped. The runtime base images and Debian package downloads
    /// stay. Temporary files that killed builds and runs left, untouched for a day, go
    /// whatever the options say.
    #[command(
        after_help = "Examples:\n  kiln cache prune --older-than 7d\n  kiln cache prune --max-size \
            10G\n  kiln cache prune --older-than 12h --max-size 2G --dry-run"
    )]
    Prune(PruneArgs),
}

/// `kiln cache prune` flags.
#[derive(Debug, Args)]
pub struct PruneArgs {
    /// The cache directory [default: $XDG_CACHE_HOME/kiln or ~/.cache/kiln].
    #[arg(long, value_name = "DIR", env = "KILN_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Remove entries not used for this long (90s, 30m, 12h, 7d).
    #[arg(long, value_name = "DURATION", value_parser = crate::prune::parse_duration)]
    pub older_than: Option<std::time::Duration>,
    /// Then remove least recently used entries until the cache is at most this size
    /// (bytes or a K, M, G, T suffix).
    #[arg(long, value_name = "SIZE", value_parser = super::run::parse_size)]
    pub max_size: Option<u64>,
    /// Print what would be removed; remove nothing.
    #[arg(long)]
    pub dry_run: bool,
}

pub(super) fn run(cmd: CacheCommand) -> Result<String, Failure> {
    let CacheCommand::Prune(args) = cmd;
    if args.older_than.is_none() && args.max_size.is_none() {
        return Err(Failure::Usage(anyhow::anyhow!(
            "say what to prune: --older-than DURATION and/or --max-size SIZE"
        )));
    }
    let cache_dir = super::cache_dir(args.cache_dir.as_deref()).map_err(Failure::Usage)?;
    let opts = crate::prune::Options {
        cache_dir,
        older_than: args.older_than,
        max_size: args.max_size,
        dry_run: args.dry_run,
    };
    let report = crate::prune::prune(&opts).map_err(|e| {
        Failure::Build(
            anyhow::Error::new(e)
                .context(format!("pruning the cache in {}", opts.cache_dir.display())),
        )
    })?;
    Ok(summary(&report, args.dry_run))
}

/// One line per removed or skipped entry, then the totals.
pub(super) fn summary(report: &crate::prune::Report, dry_run: bool) -> String {
    let verb = if dry_run { "would remove" } else { "removed" };
    let mut out = String::new();
    // Registry records and package downloads are many small files: one line for each kind.
    let grouped = [
        (
            crate::prune::REGISTRY_RECORD,
            "registry records (manifests, configs, pushed-blob and registry notes",
        ),
        (crate::prune::NPM_TARBALL, "npm tarballs (package downloads"),
        (crate::prune::WHEEL, "wheels (package downloads"),
        (crate::prune::PYPI_PAGE, "PyPI project pages (index answers"),
        (
            crate::prune::ABANDONED,
            "abandoned temporary files (left by killed builds, runs and prunes",
        ),
    ];
    let mut counts = [(0, 0); 5];
    for (kind, name, size) in &report.removed {
        match grouped.iter().position(|(k, _)| k == kind) {
            Some(i) => counts[i] = (counts[i].0 + 1, counts[i].1 + size),
            None => out.push_str(&format!("{verb} {kind} {name} ({})\n", human(*size))),
        }
    }
    for ((_, what), (n, bytes)) in grouped.iter().zip(counts) {
        if n > 0 {
            out.push_str(&format!("{verb} {n} {what}; {})\n", human(bytes)));
        }
    }
    for (kind, name) in &report.in_use {
        out.push_str(&format!("kept {kind} {name}: in use\n"));
    }
    out.push_str(&format!(
        "{} entries {verb}, {} in use; cache {} -> {}",
        report.removed.len(),
        report.in_use.len(),
        human(report.before),
        human(report.after)
    ));
    out
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
