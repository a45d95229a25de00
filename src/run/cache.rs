//! Unpacked root filesystems cached by manifest digest: `<cache>/rootfs/sha256/<hex>/` holds
//! `rootfs/` and the image's exact `config.json`. An entry is unpacked in
//! `<cache>/rootfs/tmp/<random>/` and renamed into place whole, so a half-unpacked rootfs is
//! never found; what a killed run left there is removed a day later. Synchronous: callers use
//! `spawn_blocking`.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::Error;
use super::unpack;
use crate::io_error::IoContext as _;
use crate::oci::{Digest, ImageConfig};
use crate::rootpath::{self, Last};

/// Mount points the sandbox needs, created in a fresh rootfs so that running it never has to
/// change the cached tree: directories, then files.
const MOUNT_DIRS: [&str; 3] = ["proc", "dev", "tmp"];
const MOUNT_FILES: [&str; 1] = ["etc/resolv.conf"];

/// The rootfs cache under a kiln cache directory.
#[derive(Clone, Debug)]
pub struct RootfsCache {
    root: PathBuf,
}

/// A cached, runnable image.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The image's manifest digest.
    pub digest: Digest,
    /// The unpacked root filesystem.
    pub rootfs: PathBuf,
    /// The image config.
    pub config: ImageConfig,
    /// Keeps `kiln cache prune` away while the entry is used.
    pub in_use: crate::inuse::InUse,
}

/// Where prefixes shared by layer chain go, under the rootfs cache ([`super::chain`]).
const PREFIXES: &str = "chains";
/// A prefix's unpacker state, beside its `rootfs/`.
const PENDING: &str = "pending.json";

/// A stored prefix of layers, unpacked ([`super::chain`]), held in use while it is copied.
#[derive(Debug)]
pub struct Prefix {
    /// The tree, as the unpacker left it between two layers.
    pub rootfs: PathBuf,
    /// What the unpacker held besides the tree.
    pub pending: unpack::Pending,
    _in_use: crate::inuse::InUse,
}

/// Whose entry a commit left in place.
enum Committed {
    Ours,
    Theirs,
}

/// A rootfs being unpacked; deleted on drop unless committed.
#[derive(Debug)]
pub struct Staging {
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl Staging {
    /// Where the layers go.
    pub fn rootfs(&self) -> PathBuf {
        self.path.join("rootfs")
    }

    /// Scratch space for downloaded layer blobs, on the same file system.
    pub fn blobs(&self) -> PathBuf {
        self.path.join("blobs")
    }

    /// Empties the rootfs again (after a copy of a prefix that failed half-way).
    ///
    /// # Errors
    /// When it cannot be removed or made again.
    pub fn reset_rootfs(&self) -> Result<(), Error> {
        let rootfs = self.rootfs();
        unpack::make_writable(&rootfs).map_err(Error::Finish)?;
        fs::remove_dir_all(&rootfs).at("removing", &rootfs)?;
        fs::create_dir(&rootfs).at("creating", &rootfs)?;
        fs::set_permissions(&rootfs, fs::Permissions::from_mode(0o755))
            .at("setting the mode of", &rootfs)?;
        Ok(())
    }

    /// Creates `/proc`, `/dev`, `/tmp` and an empty `/etc/resolv.conf` when the image lacks
    /// them, so running it never changes the cached tree. A symlinked `resolv.conf` becomes a
    /// plain file: the host's is bound over it at run time. Call it before the image's
    /// directory modes are applied (they may forbid writing).
    ///
    /// # Errors
    /// When they cannot be created.
    pub fn add_mount_points(&self) -> Result<(), Error> {
        let rootfs = self.rootfs();
        for dir in MOUNT_DIRS {
            let path = rootpath::resolve(&rootfs, Path::new(dir), Last::Follow)?;
            if path.symlink_metadata().is_err() {
                fs::create_dir_all(&path).at("creating", &path)?;
            }
        }
        for file in MOUNT_FILES {
            let path = rootpath::resolve(&rootfs, Path::new(file), Last::Keep)?;
            match path.symlink_metadata() {
                Ok(meta) if !meta.file_type().is_symlink() => continue,
                Ok(_) => fs::remove_file(&path).at("removing", &path)?,
                Err(_) => {}
            }
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).at("creating", parent)?;
            }
            fs::write(&path, b"").at("creating", &path)?;
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // Directory modes from the image may forbid deleting; restore access first.
        if self.dir.is_some() {
            let _ = unpack::make_writable(&self.path);
        }
    }
}

/// How old a temporary file or directory in the cache must be to count as abandoned (left by a
/// killed build, run or prune): far longer than any unpack, install or build takes.
pub const ABANDONED_AFTER: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Removes staging areas a killed run left behind (dropping [`Staging`] removes its own, but
/// SIGKILL skips that). Best effort: what cannot be removed now is tried again next time.
fn remove_abandoned(tmp: &Path) {
    let Ok(entries) = fs::read_dir(tmp) else {
        return;
    };
    for entry in entries.flatten() {
        let abandoned = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|modified| modified.elapsed().ok())
            .is_some_and(|age| age > ABANDONED_AFTER);
        if abandoned && entry.file_name().to_string_lossy().starts_with("unpack-") {
            tracing::debug!(path = %entry.path().display(), "removing an abandoned unpack");
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Error + use<> {
    crate::io_error::IoError::at(action, path)
}

impl RootfsCache {
    /// The cache in `cache_dir` (nothing is created yet).
    pub fn new(cache_dir: &Path) -> RootfsCache {
        RootfsCache {
            root: cache_dir.join("rootfs"),
        }
    }

    fn entry_dir(&self, digest: &Digest) -> PathBuf {
        self.root.join(digest.algorithm()).join(digest.hex())
    }

    /// The entry for manifest `digest`, if it is complete, marked in use (waiting while a
    /// prune removes it) and touched (its last use, for prune).
    pub fn lookup(&self, digest: &Digest) -> Option<Entry> {
        let in_use = crate::inuse::InUse::shared(&self.lock_path(digest)).ok()?;
        self.lookup_held(digest, in_use)
    }

    /// [`RootfsCache::lookup`] for a caller that already holds the entry's lock.
    fn lookup_held(&self, digest: &Digest, in_use: crate::inuse::InUse) -> Option<Entry> {
        let dir = self.entry_dir(digest);
        let bytes = fs::read(dir.join("config.json")).ok()?;
        let config = serde_json::from_slice(&bytes).ok()?;
        let rootfs = dir.join("rootfs");
        if !rootfs.is_dir() {
            return None;
        }
        crate::inuse::touch(&dir);
        Some(Entry {
            digest: digest.clone(),
            rootfs,
            config,
            in_use,
        })
    }

    /// Marks entry `digest` in use (waiting while a prune removes it): what keeps it from
    /// being removed while it is looked up, unpacked and run.
    ///
    /// # Errors
    /// When the lock file cannot be created or locked.
    pub fn hold(&self, digest: &Digest) -> Result<crate::inuse::InUse, Error> {
        let dir = self.root.join("locks");
        fs::create_dir_all(&dir).at("creating", &dir)?;
        let path = self.lock_path(digest);
        Ok(crate::inuse::InUse::shared(&path).at("locking", &path)?)
    }

    /// The entry for `digest` under the in-use mark `in_use` (from [`RootfsCache::hold`]), or
    /// the mark back when there is no complete entry yet.
    ///
    /// # Errors
    /// The mark, when the entry is not there.
    pub fn lookup_holding(
        &self,
        digest: &Digest,
        in_use: crate::inuse::InUse,
    ) -> Result<Entry, crate::inuse::InUse> {
        if !self.entry_dir(digest).join("config.json").is_file() {
            return Err(in_use);
        }
        self.lookup_held(digest, in_use.clone()).ok_or(in_use)
    }

    fn lock_path(&self, digest: &Digest) -> PathBuf {
        self.root
            .join("locks")
            .join(format!("{}.lock", digest.hex()))
    }

    /// Every entry, images' and prefixes': (manifest digest or chain ID hex, directory, lock
    /// file), for `kiln cache prune`.
    pub fn entries(&self) -> Vec<(String, PathBuf, PathBuf)> {
        [
            self.root.join("sha256"),
            self.root.join(PREFIXES).join("sha256"),
        ]
        .iter()
        .filter_map(|dir| fs::read_dir(dir).ok())
        .flat_map(|read| read.flatten())
        .map(|e| {
            let hex = e.file_name().to_string_lossy().into_owned();
            let lock = self.root.join("locks").join(format!("{hex}.lock"));
            (hex, e.path(), lock)
        })
        .collect()
    }

    fn prefix_dir(&self, chain: &Digest) -> PathBuf {
        self.root
            .join(PREFIXES)
            .join(chain.algorithm())
            .join(chain.hex())
    }

    /// Whether the prefix of chain ID `chain` is stored (it may be pruned at any time).
    pub fn has_prefix(&self, chain: &Digest) -> bool {
        self.prefix_dir(chain).join(PENDING).is_file()
    }

    /// The stored prefix of chain ID `chain` ([`super::chain`]), marked in use and touched.
    pub fn lookup_prefix(&self, chain: &Digest) -> Option<Prefix> {
        if !self.has_prefix(chain) {
            return None; // no lock file made for every layer looked for
        }
        let in_use = crate::inuse::InUse::shared(&self.lock_path(chain)).ok()?;
        let dir = self.prefix_dir(chain);
        let pending = serde_json::from_slice(&fs::read(dir.join(PENDING)).ok()?).ok()?;
        let rootfs = dir.join("rootfs");
        if !rootfs.is_dir() {
            return None;
        }
        crate::inuse::touch(&dir);
        Some(Prefix {
            rootfs,
            pending,
            _in_use: in_use,
        })
    }

    /// Stores the staged tree as the prefix of chain ID `chain`, with what its unpacker had
    /// `pending`. When another run stored it first, that one stays.
    ///
    /// # Errors
    /// When writing or renaming fails.
    pub fn commit_prefix(
        &self,
        staging: Staging,
        chain: &Digest,
        pending: &unpack::Pending,
    ) -> Result<(), Error> {
        let blobs = staging.blobs();
        fs::remove_dir_all(&blobs).at("removing", &blobs)?;
        let path = staging.path.join(PENDING);
        let json = serde_json::to_vec(pending).map_err(|e| io_err("writing", &path)(e.into()))?;
        fs::write(&path, json).at("writing", &path)?;
        self.commit_dir(staging, &self.prefix_dir(chain), || self.has_prefix(chain))
            .map(|_| ())
    }

    /// Where entries are moved to be deleted (on the cache's file system).
    pub fn trash(&self) -> PathBuf {
        self.root.join("tmp")
    }

    /// Takes the exclusive lock on unpacking image `digest` (blocking while another kiln
    /// holds it), so concurrent runs of one image unpack it once: the others wait, then find
    /// it in the cache. Released when dropped. It is not the in-use lock ([`RootfsCache::
    /// hold`]): a run of the image, which holds that one shared while it runs, must not keep
    /// a second run from unpacking, nor from finding the entry (once they shared one lock
    /// file, a second run that missed the entry an instant before the first one committed it
    /// waited for the first one's container to exit).
    ///
    /// # Errors
    /// When the lock file cannot be created or locked.
    pub fn lock_unpack(&self, digest: &Digest) -> Result<fs::File, Error> {
        let dir = self.root.join("locks");
        fs::create_dir_all(&dir).at("creating", &dir)?;
        let path = dir.join(format!("{}.unpack.lock", digest.hex()));
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .at("opening", &path)?;
        if rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
            tracing::info!(%digest, "another kiln is unpacking this image; waiting for it");
            rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
                .map_err(|e| io_err("locking", &path)(e.into()))?;
        }
        Ok(file)
    }

    /// Creates an empty staging area.
    ///
    /// # Errors
    /// When the cache directory cannot be written.
    pub fn stage(&self) -> Result<Staging, Error> {
        let tmp = self.root.join("tmp");
        fs::create_dir_all(&tmp).at("creating", &tmp)?;
        remove_abandoned(&tmp);
        let dir = tempfile::Builder::new()
            .prefix("unpack-")
            .tempdir_in(&tmp)
            .at("creating a directory in", &tmp)?;
        let path = dir.path().to_path_buf();
        let staging = Staging {
            dir: Some(dir),
            path,
        };
        for sub in [staging.rootfs(), staging.blobs()] {
            fs::create_dir(&sub).at("creating", &sub)?;
        }
        // Everyone in the sandbox must be able to enter `/` whatever the tar says.
        let rootfs = staging.rootfs();
        fs::set_permissions(&rootfs, fs::Permissions::from_mode(0o755))
            .at("setting the mode of", &rootfs)?;
        Ok(staging)
    }

    /// Stores `config` and renames the staged rootfs into place as the entry for manifest
    /// `digest`. When another run committed it first, that entry is used.
    ///
    /// # Errors
    /// When writing or renaming fails, or `config` does not parse.
    pub fn commit(&self, staging: Staging, digest: &Digest, config: &[u8]) -> Result<Entry, Error> {
        let parsed: ImageConfig =
            serde_json::from_slice(config).map_err(|source| Error::Malformed {
                digest: digest.clone(),
                source,
            })?;
        let blobs = staging.blobs();
        fs::remove_dir_all(&blobs).at("removing", &blobs)?;
        let config_path = staging.path.join("config.json");
        fs::write(&config_path, config).at("writing", &config_path)?;
        let dest = self.entry_dir(digest);
        match self.commit_dir(staging, &dest, || self.entry_dir(digest).is_dir())? {
            Committed::Ours => Ok(Entry {
                digest: digest.clone(),
                rootfs: dest.join("rootfs"),
                config: parsed,
                in_use: crate::inuse::InUse::default(),
            }),
            // Another run committed the same image first: its entry is as good.
            Committed::Theirs => self
                .lookup(digest)
                .ok_or_else(|| io_err("looking up", &dest)(io::ErrorKind::NotFound.into())),
        }
    }

    /// Renames the staging area to `dest`, unless another run put an entry there first
    /// (`theirs` says whether one is there); ours is then deleted when `staging` drops.
    fn commit_dir(
        &self,
        mut staging: Staging,
        dest: &Path,
        theirs: impl FnOnce() -> bool,
    ) -> Result<Committed, Error> {
        let parent = dest.parent().unwrap_or(&self.root);
        fs::create_dir_all(parent).at("creating", parent)?;
        if let Err(e) = fs::rename(&staging.path, dest) {
            return match theirs() {
                true => Ok(Committed::Theirs),
                false => Err(io_err("renaming the unpacked rootfs to", dest)(e)),
            };
        }
        if let Some(dir) = staging.dir.take() {
            let _ = dir.keep();
        }
        Ok(Committed::Ours)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &[u8] = br#"{"architecture":"amd64","os":"linux",
        "config":{"Cmd":["/bin/sh"]},"rootfs":{"type":"layers","diff_ids":[]}}"#;

    #[test]
    fn a_committed_rootfs_is_found_with_its_config_and_mount_points() {
        let dir = tempfile::tempdir().unwrap();
        let cache = RootfsCache::new(dir.path());
        let digest = Digest::of(b"manifest");
        assert!(cache.lookup(&digest).is_none());
        let staging = cache.stage().unwrap();
        fs::create_dir_all(staging.rootfs().join("etc")).unwrap();
        std::os::unix::fs::symlink("/run/resolv.conf", staging.rootfs().join("etc/resolv.conf"))
            .unwrap();
        fs::write(staging.blobs().join("layer"), "x").unwrap();
        staging.add_mount_points().unwrap();
        let entry = cache.commit(staging, &digest, CONFIG).unwrap();
        let rootfs = &entry.rootfs;
        for d in MOUNT_DIRS {
            assert!(rootfs.join(d).is_dir(), "{d}");
        }
        let resolv = rootfs.join("etc/resolv.conf").symlink_metadata().unwrap();
        assert!(resolv.is_file());
        let found = cache.lookup(&digest).unwrap();
        assert_eq!(found.rootfs, entry.rootfs);
        assert_eq!(found.config.config.unwrap().cmd.unwrap(), ["/bin/sh"]);
        assert!(!rootfs.parent().unwrap().join("blobs").exists());
        assert_eq!(
            fs::read_dir(dir.path().join("rootfs/tmp")).unwrap().count(),
            0
        );
    }

    #[test]
    fn a_second_commit_of_the_same_digest_keeps_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let cache = RootfsCache::new(dir.path());
        let digest = Digest::of(b"m");
        let first = cache.stage().unwrap();
        fs::write(first.rootfs().join("one"), "1").unwrap();
        cache.commit(first, &digest, CONFIG).unwrap();
        let second = cache.stage().unwrap();
        fs::create_dir(second.rootfs().join("ro")).unwrap();
        fs::set_permissions(
            second.rootfs().join("ro"),
            fs::Permissions::from_mode(0o555),
        )
        .unwrap();
        let entry = cache.commit(second, &digest, CONFIG).unwrap();
        assert!(entry.rootfs.join("one").is_file());
        assert_eq!(
            fs::read_dir(dir.path().join("rootfs/tmp")).unwrap().count(),
            0
        );
    }

    #[test]
    fn an_abandoned_staging_area_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let cache = RootfsCache::new(dir.path());
        let staging = cache.stage().unwrap();
        fs::write(staging.rootfs().join("half"), "x").unwrap();
        drop(staging);
        assert_eq!(
            fs::read_dir(dir.path().join("rootfs/tmp")).unwrap().count(),
            0
        );
    }

    #[test]
    fn staging_areas_a_killed_run_left_are_removed_once_a_day_old() {
        let dir = tempfile::tempdir().unwrap();
        let cache = RootfsCache::new(dir.path());
        let tmp = dir.path().join("rootfs/tmp");
        let (old, recent) = (tmp.join("unpack-old"), tmp.join("unpack-recent"));
        for leftover in [&old, &recent] {
            fs::create_dir_all(leftover.join("rootfs")).unwrap();
        }
        let two_days_ago = std::time::SystemTime::now() - 2 * ABANDONED_AFTER;
        fs::File::open(&old)
            .unwrap()
            .set_modified(two_days_ago)
            .unwrap();
        let _staging = cache.stage().unwrap();
        assert!(!old.exists(), "a day-old unpack is abandoned");
        assert!(recent.exists(), "another run may still be unpacking");
    }

    #[test]
    fn a_run_holding_an_image_keeps_nobody_from_unpacking_or_finding_it() {
        let dir = tempfile::tempdir().unwrap();
        let cache = RootfsCache::new(dir.path());
        let digest = Digest::of(b"manifest");
        // A run: it unpacked the image and holds it in use while its container runs.
        let running = cache.hold(&digest).unwrap();
        let staging = cache.stage().unwrap();
        let mut entry = cache.commit(staging, &digest, CONFIG).unwrap();
        entry.in_use = running;
        // Another run that missed the entry an instant earlier takes the unpack lock: at
        // once, not when the first container exits.
        let (done, finished) = std::sync::mpsc::channel();
        let other = cache.clone();
        let d = digest.clone();
        std::thread::spawn(move || {
            let in_use = other.hold(&d).unwrap();
            let _unpacking = other.lock_unpack(&d).unwrap();
            let _ = done.send(other.lookup_holding(&d, in_use).is_ok());
        });
        let found = finished.recv_timeout(std::time::Duration::from_secs(5));
        assert_eq!(
            found,
            Ok(true),
            "the second run found the entry without waiting"
        );
        drop(entry);
    }
}
