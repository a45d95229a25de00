//! What this machine pushed to a repository: after each image, the digests of its blobs are
//! kept in the cache directory (`pushed/HASH`, HASH naming the registry and repository), so
//! the next push to that repository skips asking about them (a rebuild's base and dependency
//! layers: one `HEAD` each). The record is only a hint: when the registry refuses a manifest
//! for a blob the record named (`MANIFEST_BLOB_UNKNOWN`: the repository was deleted or
//! collected), the publisher forgets the record and checks every blob.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::oci::Digest;
use crate::registry::Reference;

/// Records kept per repository are capped; the oldest digests go first.
const MAX_DIGESTS: usize = 4096;

/// The record of one repository.
#[derive(Clone, Debug)]
pub struct PushedBlobs {
    path: PathBuf,
}

impl PushedBlobs {
    /// The record of `target`'s repository under `cache_dir`.
    pub fn new(cache_dir: &Path, target: &Reference) -> PushedBlobs {
        let name = format!("{}/{}", target.registry, target.repository);
        PushedBlobs {
            path: cache_dir
                .join("pushed")
                .join(Digest::of(name.as_bytes()).hex()),
        }
    }

    /// The digests recorded (empty when there is no record or it is unreadable).
    pub fn load(&self) -> BTreeSet<Digest> {
        std::fs::read_to_string(&self.path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.parse().ok())
            .collect()
    }

    /// Adds `digests` to the record (newest last). A failure costs only later requests.
    pub fn record<'a>(&self, digests: impl IntoIterator<Item = &'a Digest>) {
        let old = std::fs::read_to_string(&self.path).unwrap_or_default();
        let new: Vec<String> = digests.into_iter().map(ToString::to_string).collect();
        let mut lines: Vec<&str> = old
            .lines()
            .filter(|l| !new.iter().any(|n| n == l))
            .collect();
        lines.extend(new.iter().map(String::as_str));
        let keep = &lines[lines.len().saturating_sub(MAX_DIGESTS)..];
        if let Err(e) = write(&self.path, keep) {
            tracing::debug!(path = %self.path.display(), error = %e, "not recording pushed blobs");
        }
    }

    /// Drops the record: it named a blob the repository does not have.
    pub fn forget(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn write(path: &Path, lines: &[&str]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    for line in lines {
        writeln!(tmp, "{line}")?;
    }
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_per_repository_deduplicated_and_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let reference = |s: &str| s.parse::<Reference>().unwrap();
        let a = PushedBlobs::new(dir.path(), &reference("reg.example/team/a:1"));
        let b = PushedBlobs::new(dir.path(), &reference("reg.example/team/b"));
        let (x, y) = (Digest::of(b"x"), Digest::of(b"y"));
        assert!(a.load().is_empty());
        a.record([&x, &y]);
        a.record([&x]);
        assert_eq!(a.load(), BTreeSet::from([x.clone(), y.clone()]));
        assert_eq!(std::fs::read_to_string(&a.path).unwrap().lines().count(), 2);
        assert!(b.load().is_empty(), "another repository has its own record");
        a.forget();
        assert!(a.load().is_empty());
    }
}
