//! `kiln cache prune`: trims a kiln cache directory by age and to a size, safely while builds
//! and runs use it.
//!
//! What it removes, least recently used first:
//! - dependency layers (`deps/<key>.json` and the blob it names), last used when a build hit
//!   or wrote them;
//! - unpacked root file systems (`rootfs/sha256/<digest>/`), last used when a run or an
//!   install looked them up, and the base prefixes they were copied from
//!   (`rootfs/chains/sha256/<chain ID>/`, [`crate::run::chain`]), last used when copied;
//! - Function images in the local store (`store`, names `functions/…`), as old as their
//!   manifest file. The runtime base images in the store stay (they are rebuilt from Debian
//!   and npm, which takes minutes); so do the Debian package downloads;
//! - npm tarballs (`npm/<sha512>.tgz`) and Python wheels (`wheels/<sha256>.whl`), the
//!   downloads of kiln's own installs and of base images, by last use (a build touches each
//!   one it takes from the cache), never one used in the last [`GRACE`], so none goes between
//!   a build's download and its unpack; and PyPI project pages (`pypi/<sha256 of the
//!   URL>.page`), as old as their last fetch;
//! - what the registry client learnt ([`REGISTRY_RECORD`]s): manifests and configs by digest
//!   (`documents/`), the blobs pushed to each repository (`pushed/`) and what each registry
//!   refuses (`registries/`), as old as their last write. Removing one costs a later build a
//!   request, never a wrong answer; a build keeps one file per pushed image, so without this
//!   `documents/` only grows;
//! - whatever a killed build, run or prune left behind: entries of the scratch directories
//!   (`tmp/`, `rootfs/tmp/`) and temporary files next to the entries they were to become,
//!   once untouched for [`ABANDONED_AFTER`], whatever the options say. They are outside the
//!   size `max_size` caps.
//!
//! Safety: a build holds a shared lock on its dependency entry until it has published, a run
//! or an install on its root file system until it ends ([`crate::inuse`]); prune takes the
//! exclusive lock without waiting and skips what is in use. Blobs are collected only when
//! nothing names them and they are older than [`GRACE`], since a build writes a blob before
//! the record or image that names it. Abandoned temporary files have no lock: they go by
//! age alone, so an operation that ran for longer than [`ABANDONED_AFTER`] would lose its
//! scratch (none does: the longest are installs and unpacks of minutes).

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::build::cache::LayerCache;
use crate::build::pinned::pages;
use crate::inuse::try_exclusive;
use crate::oci::Layout;
use crate::run::cache::RootfsCache;

/// The kind of a file of what the registry client learnt.
pub const REGISTRY_RECORD: &str = "registry record";

/// The kind of a cached npm tarball.
pub const NPM_TARBALL: &str = "npm tarball";

/// The kind of a cached Python wheel.
pub const WHEEL: &str = "wheel";

/// The kind of a layer's SBOM record (the packages `kiln build --sign-key` read in it).
pub const SBOM_RECORD: &str = "layer SBOM record";

/// The kind of a cached PyPI project page.
pub const PYPI_PAGE: &str = "PyPI project page";

/// The kind of an abandoned temporary file or directory.
pub const ABANDONED: &str = "abandoned temporary file";

/// Where the registry client keeps what it learnt, under the cache directory.
const REGISTRY_RECORD_DIRS: [&str; 3] = ["documents/sha256", "pushed", "registries"];

/// The scratch directories under the cache directory: everything in them is temporary.
const SCRATCH_DIRS: [&str; 2] = ["tmp", "rootfs/tmp"];

/// Directories where kiln writes a temporary file and renames it to the entry it becomes.
const TEMP_FILE_DIRS: [&str; 11] = [
    "deps",
    "sbom",
    "documents/sha256",
    "pushed",
    "registries",
    "npm",
    "wheels",
    pages::DIR,
    "debs",
    "store",
    "store/blobs/sha256",
];

/// Whether `name` is one of kiln's temporary files: `tempfile`'s `.tmp…`, a layer or blob
/// being written (`.layer-…`, `.kiln-blob-…`), a download (`.NAME.PID.N.part`). Other
/// dot-files (the store's `.lock`) are not.
fn is_temp_file(name: &str) -> bool {
    [
        ".tmp",
        crate::oci::layer::TEMP_PREFIX,
        crate::registry::BLOB_TEMP_PREFIX,
    ]
    .iter()
    .any(|p| name.starts_with(p))
        || (name.starts_with('.') && name.ends_with(crate::fetch::download::PART_SUFFIX))
}

pub use crate::run::cache::ABANDONED_AFTER;

/// Blobs younger than this are never collected.
pub const GRACE: Duration = Duration::from_secs(600);

/// What to prune.
#[derive(Clone, Debug)]
pub struct Options {
    /// The kiln cache directory.
    pub cache_dir: PathBuf,
    /// Remove entries not used for this long.
    pub older_than: Option<Duration>,
    /// Then remove least recently used entries until the cache is at most this many bytes.
    pub max_size: Option<u64>,
    /// Report what would go, remove nothing.
    pub dry_run: bool,
}

/// What a prune did.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// `(kind, name, bytes)` of each removed entry.
    pub removed: Vec<(&'static str, String, u64)>,
    /// Entries that should have gone but were in use.
    pub in_use: Vec<(&'static str, String)>,
    /// Bytes freed, blobs collected included.
    pub freed: u64,
    /// The cache's size before and after.
    pub before: u64,
    /// See `before`.
    pub after: u64,
}

#[derive(Debug)]
struct Candidate {
    kind: &'static str,
    name: String,
    last_use: SystemTime,
    size: u64,
    lock: Option<PathBuf>,
    what: Removal,
}

#[derive(Debug)]
enum Removal {
    Record(PathBuf),
    /// A root file system: moved aside at once, then deleted.
    Dir(PathBuf),
    /// A scratch directory no one uses: deleted where it is.
    Scratch(PathBuf),
    StoreImage(String),
}

/// Prunes the cache as `opts` says.
///
/// # Errors
/// A cache directory that cannot be read, an entry that cannot be removed.
pub fn prune(opts: &Options) -> io::Result<Report> {
    let now = SystemTime::now();
    let trash = RootfsCache::new(&opts.cache_dir).trash();
    let mut report = Report::default();
    // First what killed operations left, whatever the options say; outside the size that
    // `max_size` caps.
    for c in abandoned(&opts.cache_dir, now) {
        if !opts.dry_run
            && let Err(e) = remove(&c.what, &trash)
        {
            // Garbage that stays costs only space: the prune goes on.
            tracing::warn!(
                path = %opts.cache_dir.join(&c.name).display(),
                error = %e,
                "could not remove what a killed kiln left; remove it by hand"
            );
            continue;
        }
        report.removed.push((c.kind, c.name, c.size));
    }
    report.before = cache_size(&opts.cache_dir);
    let mut size = report.before;
    let mut candidates = candidates(&opts.cache_dir)?;
    candidates.sort_by_key(|c| c.last_use);
    let mut store_names = Vec::new();
    for c in candidates {
        let age = now.duration_since(c.last_use).unwrap_or_default();
        let too_old = opts.older_than.is_some_and(|limit| age >= limit);
        let too_big = opts.max_size.is_some_and(|max| size > max);
        if !(too_old || too_big) {
            continue;
        }
        let held = match &c.lock {
            Some(lock) => match try_exclusive(lock)? {
                Some(held) => Some(held),
                None => {
                    report.in_use.push((c.kind, c.name));
                    continue;
                }
            },
            None => None,
        };
        if !opts.dry_run {
            match &c.what {
                Removal::StoreImage(name) => store_names.push(name.clone()),
                what => remove(what, &trash)?,
            }
        }
        drop(held);
        size = size.saturating_sub(c.size);
        report.removed.push((c.kind, c.name, c.size));
    }
    if !opts.dry_run {
        report.freed += collect_layer_blobs(&opts.cache_dir)?;
        let store = opts.cache_dir.join("store");
        if store.join("oci-layout").is_file() {
            let layout = Layout::open(&store).map_err(io::Error::other)?;
            report.freed += layout
                .remove_refs_and_collect(&store_names, GRACE)
                .map_err(io::Error::other)?;
        }
        report.freed += report
            .removed
            .iter()
            .filter(|(kind, ..)| *kind == "rootfs")
            .map(|(.., size)| size)
            .sum::<u64>();
    }
    report.after = if opts.dry_run {
        size
    } else {
        cache_size(&opts.cache_dir)
    };
    Ok(report)
}

fn candidates(cache_dir: &Path) -> io::Result<Vec<Candidate>> {
    let mut out = Vec::new();
    let layers = LayerCache::open(cache_dir)?;
    for (hex, record, blob, size) in layers.records() {
        out.push(Candidate {
            kind: "dependencies",
            name: hex.chars().take(12).collect(),
            last_use: modified(&record),
            size: fs::metadata(&blob).map_or(size, |m| m.len()),
            lock: Some(layers.lock_path(&hex)),
            what: Removal::Record(record),
        });
    }
    let rootfs = RootfsCache::new(cache_dir);
    for (hex, dir, lock) in rootfs.entries() {
        out.push(Candidate {
            kind: "rootfs",
            name: hex.chars().take(12).collect(),
            last_use: modified(&dir),
            size: tree_size(&dir),
            lock: Some(lock),
            what: Removal::Dir(dir),
        });
    }
    registry_records(cache_dir, &mut out);
    downloads(cache_dir, &mut out);
    store_images(cache_dir, &mut out)?;
    Ok(out)
}

/// The registry client's records: cached documents, pushed blobs, registries' answers.
fn registry_records(cache_dir: &Path, out: &mut Vec<Candidate>) {
    for sub in REGISTRY_RECORD_DIRS {
        let Ok(entries) = fs::read_dir(cache_dir.join(sub)) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = fs::symlink_metadata(entry.path()) else {
                continue;
            };
            // A temporary file is not a record yet: see `abandoned`.
            if !meta.is_file() || is_temp_file(&entry.file_name().to_string_lossy()) {
                continue;
            }
            out.push(Candidate {
                kind: REGISTRY_RECORD,
                name: format!("{sub}/{}", entry.file_name().to_string_lossy()),
                last_use: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                size: meta.len(),
                lock: None,
                what: Removal::Record(entry.path()),
            });
        }
    }
}

/// Downloaded npm tarballs, wheels and PyPI pages, and layers' SBOM records (read again
/// when needed), but for those used within [`GRACE`].
fn downloads(cache_dir: &Path, out: &mut Vec<Candidate>) {
    for (dir, suffix, kind) in [
        ("npm", ".tgz", NPM_TARBALL),
        ("wheels", ".whl", WHEEL),
        (pages::DIR, pages::SUFFIX, PYPI_PAGE),
        ("sbom", ".json", SBOM_RECORD),
    ] {
        let Ok(entries) = fs::read_dir(cache_dir.join(dir)) else {
            continue;
        };
        let now = SystemTime::now();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(meta) = fs::symlink_metadata(entry.path()) else {
                continue;
            };
            let last_use = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            let recent = now.duration_since(last_use).unwrap_or_default() < GRACE;
            if !meta.is_file() || !name.ends_with(suffix) || recent {
                continue;
            }
            out.push(Candidate {
                kind,
                name,
                last_use,
                size: meta.len(),
                lock: None,
                what: Removal::Record(entry.path()),
            });
        }
    }
}

/// The local store's Function images.
fn store_images(cache_dir: &Path, out: &mut Vec<Candidate>) -> io::Result<()> {
    let store = cache_dir.join("store");
    if store.join("oci-layout").is_file() {
        let layout = Layout::open(&store).map_err(io::Error::other)?;
        let index = layout.index().map_err(io::Error::other)?;
        for d in index.manifests {
            let name = d
                .annotations
                .as_ref()
                .and_then(|a| a.get("org.opencontainers.image.ref.name"));
            let Some(name) = name.filter(|n| n.starts_with("functions/")) else {
                continue;
            };
            let name = name.to_string();
            let size = layout
                .read_document(&d)
                .ok()
                .and_then(|doc| doc.parse::<crate::oci::Manifest>().ok())
                .map_or(0, |m| {
                    m.layers.iter().map(|l| l.size).sum::<u64>() + m.config.size
                });
            out.push(Candidate {
                kind: "store image",
                last_use: modified(&layout.blob_path(&d.digest)),
                name: name.clone(),
                size,
                lock: None,
                what: Removal::StoreImage(name),
            });
        }
    }
    Ok(())
}

/// What killed builds, runs and prunes left behind, untouched for [`ABANDONED_AFTER`]: the
/// entries of the scratch directories and the temporary files next to cache entries.
fn abandoned(cache_dir: &Path, now: SystemTime) -> Vec<Candidate> {
    let mut out = Vec::new();
    let dirs = SCRATCH_DIRS.iter().map(|d| (d, true));
    for (sub, scratch) in dirs.chain(TEMP_FILE_DIRS.iter().map(|d| (d, false))) {
        let Ok(entries) = fs::read_dir(cache_dir.join(sub)) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(meta) = fs::symlink_metadata(entry.path()) else {
                continue;
            };
            let last_use = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            let old = now.duration_since(last_use).unwrap_or_default() >= ABANDONED_AFTER;
            if !old || !(scratch || (meta.is_file() && is_temp_file(&name))) {
                continue;
            }
            let (size, what) = if meta.is_dir() {
                (tree_size(&entry.path()), Removal::Scratch(entry.path()))
            } else {
                (meta.len(), Removal::Record(entry.path()))
            };
            out.push(Candidate {
                kind: ABANDONED,
                name: format!("{sub}/{name}"),
                last_use,
                size,
                lock: None,
                what,
            });
        }
    }
    out
}

/// Deletes dependency-cache blobs no record names (older than [`GRACE`]).
fn collect_layer_blobs(cache_dir: &Path) -> io::Result<u64> {
    let layers = LayerCache::open(cache_dir)?;
    let named: std::collections::BTreeSet<PathBuf> = layers
        .records()
        .into_iter()
        .map(|(_, _, blob, _)| blob)
        .collect();
    let dir = layers.root().join("blobs/sha256");
    let mut freed = 0;
    for entry in fs::read_dir(&dir)?.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        let young = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_none_or(|age| age < GRACE);
        if young || named.contains(&entry.path()) {
            continue;
        }
        if fs::remove_file(entry.path()).is_ok() {
            freed += meta.len();
        }
    }
    Ok(freed)
}

fn modified(path: &Path) -> SystemTime {
    fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Removes a file or a directory (a store image is removed from the store's index instead).
fn remove(what: &Removal, trash: &Path) -> io::Result<()> {
    match what {
        Removal::Record(path) => remove_file(path),
        Removal::Dir(dir) => remove_tree(dir, trash),
        Removal::Scratch(dir) => {
            make_writable(dir);
            fs::remove_dir_all(dir)
        }
        Removal::StoreImage(_) => Ok(()),
    }
}

fn remove_file(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Moves `dir` aside (so it disappears at once) and deletes it, making read-only directories
/// of the image writable first.
fn remove_tree(dir: &Path, trash: &Path) -> io::Result<()> {
    fs::create_dir_all(trash)?;
    let aside = tempfile::Builder::new()
        .prefix("prune-")
        .tempdir_in(trash)?
        .keep();
    let target = aside.join("entry");
    fs::rename(dir, &target)?;
    make_writable(&target);
    fs::remove_dir_all(&aside)
}

fn make_writable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                make_writable(&e.path());
            }
        }
    }
}

/// Bytes of regular files under `dir` (not following links). A file with several links (the
/// rootfs of images on one base share their base's files) counts for its share: what
/// removing one of them frees is counted once over all of them.
fn tree_size(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_size(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len() / m.nlink().max(1)),
            _ => 0,
        })
        .sum()
}

/// The size of what prune manages: layer blobs, unpacked root file systems, the store, what
/// the registry client learnt. Not the scratch directories: what builds under way keep there
/// must not make `--max-size` evict what they will use.
pub fn cache_size(cache_dir: &Path) -> u64 {
    ["blobs", "deps", "rootfs/sha256", "rootfs/chains", "store"]
        .iter()
        .chain(&REGISTRY_RECORD_DIRS)
        .map(|d| tree_size(&cache_dir.join(d)))
        .sum()
}

/// Parses `30m`, `12h`, `7d`, `90s` or plain seconds.
///
/// # Errors
/// Anything else.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map_or((text, ""), |i| text.split_at(i));
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (e.g. 90s, 30m, 12h, 7d)"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => {
            return Err(format!(
                "{text:?} is not a duration (e.g. 90s, 30m, 12h, 7d)"
            ));
        }
    };
    Ok(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("30m").unwrap(), Duration::from_secs(1800));
        assert_eq!(parse_duration("7d").unwrap(), Duration::from_secs(604_800));
        assert!(parse_duration("7w").is_err());
        assert!(parse_duration("h").is_err());
    }
}
