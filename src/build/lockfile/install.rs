//! Writing the tree `npm ci` would write from the plan: the tarballs fetched (or taken from
//! the cache), unpacked as pacote does, and the bins linked as bin-links does.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use futures_util::{StreamExt as _, TryStreamExt as _};

use super::{Error, PARALLEL_DOWNLOADS, Plan, REGISTRY, bin_dir};
use crate::build::memtree::{Building, IN_MEMORY};
use crate::io_error::IoContext as _;
use crate::oci::layer::{Content, EntryKind};
use crate::oci::source::Tree;

/// Downloads (or takes from `cache_dir/npm/`) every tarball of `plan`, verified against its
/// integrity, and returns the tree npm would write into `node_modules`, ready to layer. The
/// tree is built in memory (up to [`IN_MEMORY`] of file bytes, the rest in files in
/// `scratch`), not on disk: creating and reading back thousands of small files cost seconds
/// on an ext4 disk, far more than the decompression itself.
///
/// # Errors
/// A download that fails or does not match the lock, an unreadable tarball, I/O.
pub async fn install(
    plan: &Plan,
    http: &reqwest::Client,
    cache_dir: &Path,
    scratch: &Path,
) -> Result<Tree, Error> {
    let registry = url::Url::parse(REGISTRY).expect("a valid URL");
    let started = std::time::Instant::now();
    let cached = plan
        .packages
        .iter()
        .filter(|p| p.tarball.cached_path(cache_dir).is_ok_and(|f| f.is_file()))
        .count();
    let files: Vec<PathBuf> = futures_util::stream::iter(&plan.packages)
        .map(|p| p.tarball.fetch(http, &registry, cache_dir))
        .buffered(PARALLEL_DOWNLOADS)
        .try_collect()
        .await?;
    tracing::info!(
        downloaded = plan.packages.len() - cached,
        cached,
        seconds = started.elapsed().as_secs_f32(),
        "fetched the tarballs the lock file names"
    );
    let (plan, spill) = (plan.clone(), scratch.join("spill"));
    let tree = tokio::task::spawn_blocking(move || build_tree(&plan, &files, &spill));
    tree.await?
}

/// The entries one tarball gives below `p/` (file or link paths), every file with bytes
/// going to `spill` (none kept in memory, so the disk path is exercised): for the fuzz
/// target.
pub(crate) fn unpack_for_checks(tgz: &Path, spill: &Path) -> Result<Vec<String>, Error> {
    let mut tree = Building::new(spill, 0);
    unpack(tgz, "p", &mut tree)?;
    check_parents(&tree)?;
    Ok(tree.entries.into_keys().collect())
}

/// The tree below `node_modules`: every package unpacked (parents first), then the bins.
fn build_tree(plan: &Plan, tarballs: &[PathBuf], spill: &Path) -> Result<Tree, Error> {
    let mut tree = Building::new(spill, IN_MEMORY);
    for (p, tgz) in plan.packages.iter().zip(tarballs) {
        unpack(tgz, &p.path, &mut tree).map_err(|source| Error::Tarball {
            package: p.tarball.package.clone(),
            version: p.tarball.version.clone(),
            source: Box::new(source),
        })?;
    }
    for p in &plan.packages {
        let dir = match bin_dir(&p.path) {
            top if top.is_empty() => ".bin".to_string(),
            nested => format!("{nested}/.bin"),
        };
        for (name, target) in &p.bins {
            link_bin(&mut tree, &p.path, &dir, name, target)?;
        }
    }
    check_parents(&tree)?;
    Ok(tree.into_tree())
}

/// Links `dir/name` to the package's `target` if the package has it, and fixes the
/// target as bin-links does: executable, and LF at the end of a file's `#!` line.
pub(super) fn link_bin(
    tree: &mut Building,
    package: &str,
    dir: &str,
    name: &str,
    target: &str,
) -> Result<(), Error> {
    let path = format!("{package}/{target}");
    let below = format!("{path}/");
    let is_dir = tree
        .entries
        .range(below.clone()..)
        .next()
        .is_some_and(|(k, _)| k.starts_with(&below));
    let fixed = match tree.entries.get_mut(&path) {
        Some(EntryKind::File {
            content,
            executable,
        }) => {
            *executable = true;
            match content {
                Content::Bytes(bytes) => unix_hashbang(bytes),
                Content::Path(file) => spilled_hashbang(file, &path)?,
                Content::Beneath { .. } => None,
            }
        }
        // npm links nothing for a missing target.
        None if !is_dir => return Ok(()),
        _ => None,
    };
    if let Some(fixed) = fixed {
        // A new file, counted as one (the memory budget, the limit).
        tree.put_file(path.clone(), fixed, true)?;
    }
    let link = format!("{dir}/{name}");
    if tree.entries.contains_key(&link) {
        return Err(Error::Io(crate::io_error::IoError {
            action: "linking the bin",
            path: PathBuf::from("node_modules").join(&link),
            source: std::io::Error::from(std::io::ErrorKind::AlreadyExists),
        }));
    }
    tree.put_link(link, relative(&path, dir))?;
    Ok(())
}

/// Refuses a file where another entry needs a directory (`a` and `a/b`), which no file
/// system holds.
pub(super) fn check_parents(tree: &Building) -> Result<(), Error> {
    match tree.file_as_parent() {
        None => Ok(()),
        Some((path, file)) => Err(Error::Io(crate::io_error::IoError {
            action: "unpacking",
            path: PathBuf::from("node_modules").join(path),
            source: std::io::Error::other(format!(
                "node_modules/{file} is a file, not a directory"
            )),
        })),
    }
}

/// The `/`-separated path `to` relative to the directory `from`, both below one root.
pub(super) fn relative(to: &str, from: &str) -> String {
    let (to, from): (Vec<&str>, Vec<&str>) = (to.split('/').collect(), from.split('/').collect());
    let common = to.iter().zip(&from).take_while(|(a, b)| a == b).count();
    let ups = std::iter::repeat_n("..", from.len() - common);
    ups.chain(to[common..].iter().copied())
        .collect::<Vec<_>>()
        .join("/")
}

/// The file with its `#!` line's CRLF made LF, when it has one within its first 2048 bytes,
/// as bin-links' `dos2Unix` does: it reads and writes the file as UTF-8, so invalid bytes
/// become U+FFFD there too.
fn unix_hashbang(bytes: &[u8]) -> Option<Vec<u8>> {
    if !bytes.starts_with(b"#!") {
        return None;
    }
    let end = bytes.iter().position(|&b| b == b'\n')?;
    if !(4..2048).contains(&end) || bytes[end - 1] != b'\r' {
        return None;
    }
    let mut fixed = String::from_utf8_lossy(bytes).into_owned().into_bytes();
    // The lossy text keeps the ASCII first line where it was.
    let end = fixed.iter().position(|&b| b == b'\n')?;
    fixed.remove(end - 1);
    Some(fixed)
}

/// [`unix_hashbang`] of a file in the spill directory (`path` in the tree), decided on its
/// first 2048 bytes: a file past [`IN_MEMORY`] that needs the fix is refused rather than
/// read whole.
fn spilled_hashbang(file: &Path, path: &str) -> Result<Option<Vec<u8>>, Error> {
    use std::io::Read as _;
    let mut head = Vec::with_capacity(2048);
    std::fs::File::open(file)
        .and_then(|f| f.take(2048).read_to_end(&mut head))
        .at("reading", file)?;
    if unix_hashbang(&head).is_none() {
        return Ok(None);
    }
    let size = std::fs::metadata(file).at("reading", file)?.len();
    if size > IN_MEMORY {
        return Err(Error::Io(crate::io_error::IoError {
            action: "fixing the #! line of the bin",
            path: PathBuf::from("node_modules").join(path),
            source: std::io::Error::other(format!(
                "it is {size} bytes; kiln rewrites bins of up to {} MiB",
                IN_MEMORY >> 20
            )),
        }));
    }
    Ok(unix_hashbang(&std::fs::read(file).at("reading", file)?))
}

/// Unpacks a package tarball below `prefix` as pacote does: the top directory of each member
/// dropped; only regular files kept (links, devices and directories skipped: the layer gets
/// the directories its files need); a member whose path is absolute or climbs is skipped; a
/// `.gitignore` becomes `.npmignore` unless one was seen; executable when the mode has any
/// execute bit. Names must be UTF-8, as the layer's are.
pub(super) fn unpack(tgz: &Path, prefix: &str, tree: &mut Building) -> Result<(), Error> {
    let bad = |e: std::io::Error| {
        Error::Io(crate::io_error::IoError {
            action: "reading",
            path: tgz.to_path_buf(),
            source: e,
        })
    };
    let file = std::fs::File::open(tgz).at("opening", tgz)?;
    let (stream, meter) = crate::tarmeter::metered(flate2::read::GzDecoder::new(file));
    let mut archive = tar::Archive::new(stream);
    let mut npmignores = BTreeSet::new();
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        meter.entry();
        let kind = entry.header().entry_type();
        if !(kind.is_file() || kind == tar::EntryType::Continuous) {
            continue;
        }
        let path = entry.path().map_err(bad)?.into_owned();
        let mut steps = Vec::new();
        let mut plain = true;
        for c in path.components() {
            match c {
                Component::Normal(n) => match n.to_str() {
                    Some(n) => steps.push(n.to_string()),
                    None => {
                        return Err(bad(std::io::Error::other(format!(
                            "{} is not a UTF-8 name",
                            path.display()
                        ))));
                    }
                },
                Component::CurDir => {}
                _ => plain = false,
            }
        }
        if !plain || steps.len() < 2 {
            continue;
        }
        let name = steps.last().map(String::as_str);
        let mut rel = steps[1..].join("/");
        if name == Some(".npmignore") {
            npmignores.insert(rel.clone());
        } else if name == Some(".gitignore") {
            let renamed = format!("{}npmignore", rel.trim_end_matches("gitignore"));
            if npmignores.contains(&renamed) {
                continue;
            }
            rel = renamed;
        }
        let executable = entry.header().mode().is_ok_and(|m| m & 0o111 != 0);
        let size = entry.size();
        let put = meter
            .reading(|| tree.put_reader(format!("{prefix}/{rel}"), &mut entry, size, executable));
        match put {
            Err(crate::build::memtree::Error::Read { source, .. }) => return Err(bad(source)),
            other => other?,
        };
    }
    Ok(())
}
