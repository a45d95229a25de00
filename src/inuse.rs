//! "In use" marks for cache entries, so `kiln cache prune` never removes what a running build
//! or `kiln run` is reading: a user holds a shared `flock` on the entry's lock file for as long
//! as it uses the entry; prune removes an entry only while it holds the exclusive lock, which
//! it takes without waiting (an entry in use is skipped, not waited for).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::Path;
use std::sync::Arc;

use rustix::fs::{FlockOperation, flock};

/// A held shared lock on a cache entry (nothing held when empty). Cheap to clone; released
/// when the last clone drops.
#[derive(Clone, Debug, Default)]
pub struct InUse(#[allow(dead_code, reason = "held for its lock, never read")] Option<Arc<File>>);

impl PartialEq for InUse {
    fn eq(&self, _: &InUse) -> bool {
        true
    }
}

fn open(path: &Path) -> io::Result<File> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
}

impl InUse {
    /// Marks the entry of `lock` in use, waiting while a prune is removing it.
    ///
    /// # Errors
    /// When the lock file cannot be created or locked.
    pub fn shared(lock: &Path) -> io::Result<InUse> {
        let file = open(lock)?;
        flock(&file, FlockOperation::LockShared)?;
        Ok(InUse(Some(Arc::new(file))))
    }
}

/// The exclusive lock on `lock` if nobody holds it (for removing its entry), else `None`.
///
/// # Errors
/// When the lock file cannot be created.
pub fn try_exclusive(lock: &Path) -> io::Result<Option<File>> {
    let file = open(lock)?;
    match flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(file)),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Sets `path`'s modification time to now: the entry's last use, which prune orders by.
pub fn touch(path: &Path) {
    let now = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_NOW,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_NOW,
        },
    };
    let _ = rustix::fs::utimensat(
        rustix::fs::CWD,
        path,
        &now,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_in_use_cannot_be_taken_and_is_free_once_released() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("locks/x.lock");
        let held = InUse::shared(&lock).unwrap();
        let also = held.clone();
        assert!(try_exclusive(&lock).unwrap().is_none());
        drop(held);
        assert!(
            try_exclusive(&lock).unwrap().is_none(),
            "a clone still holds it"
        );
        drop(also);
        let taken = try_exclusive(&lock).unwrap().expect("free");
        assert!(try_exclusive(&lock).unwrap().is_none());
        drop(taken);
    }
}
