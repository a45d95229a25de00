//! The local dependency-layer cache, shared by every Function built on this machine:
//! `<cache>/deps/<key>.json` records the layer built for a dependency key, and the layer blob
//! lives content-addressed in `<cache>/blobs/sha256/`. A hit skips the install entirely.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::oci::{Digest, LayerBlob};

/// A cached dependency layer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CachedLayer {
    /// Compressed digest.
    pub digest: Digest,
    /// Uncompressed digest.
    pub diff_id: Digest,
    /// Compressed size.
    pub size: u64,
}

/// The cache directory.
#[derive(Clone, Debug)]
pub struct LayerCache {
    root: PathBuf,
}

impl LayerCache {
    /// Opens (creating) the cache at `root`.
    ///
    /// # Errors
    /// When the directories cannot be created.
    pub fn open(root: &Path) -> std::io::Result<LayerCache> {
        for sub in ["deps", "blobs/sha256", "tmp"] {
            fs::create_dir_all(root.join(sub))?;
        }
        Ok(LayerCache {
            root: root.to_path_buf(),
        })
    }

    /// Scratch space on the cache's file system, so layers can be renamed into it.
    pub fn tmp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    /// Where a cached blob lives.
    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.root.join("blobs/sha256").join(digest.hex())
    }

    fn entry_path(&self, key: &Digest) -> PathBuf {
        self.root.join("deps").join(format!("{}.json", key.hex()))
    }

    /// The lock file marking the entry for `key` in use.
    pub fn lock_path(&self, key_hex: &str) -> PathBuf {
        self.root.join("deps").join(format!("{key_hex}.lock"))
    }

    /// Marks the entry for `key` in use until the mark drops (see [`crate::inuse`]).
    ///
    /// # Errors
    /// When the lock file cannot be created or locked.
    pub fn hold(&self, key: &Digest) -> std::io::Result<crate::inuse::InUse> {
        crate::inuse::InUse::shared(&self.lock_path(key.hex()))
    }

    /// The layer cached for `key`, if its record and blob (with the right size) are present;
    /// a hit is touched (its last use, for prune).
    pub fn get(&self, key: &Digest) -> Option<CachedLayer> {
        let path = self.entry_path(key);
        let bytes = fs::read(&path).ok()?;
        let layer: CachedLayer = serde_json::from_slice(&bytes).ok()?;
        let size = fs::metadata(self.blob_path(&layer.digest)).ok()?.len();
        if size != layer.size {
            return None;
        }
        crate::inuse::touch(&path);
        Some(layer)
    }

    /// Every record: (key hex, record path, the blob it names, the blob's size), for prune.
    pub fn records(&self) -> Vec<(String, PathBuf, PathBuf, u64)> {
        let Ok(read) = fs::read_dir(self.root.join("deps")) else {
            return Vec::new();
        };
        read.flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let hex = name.strip_suffix(".json")?.to_string();
                let layer: CachedLayer = serde_json::from_slice(&fs::read(e.path()).ok()?).ok()?;
                let blob = self.blob_path(&layer.digest);
                Some((hex, e.path(), blob, layer.size))
            })
            .collect()
    }

    /// The cache's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Moves a freshly written layer into the cache under `key`, its bytes on the disk before
    /// the name that says what they are (after a crash, a blob is whole or absent).
    ///
    /// # Errors
    /// When the blob cannot be synced or moved, or the record written.
    pub fn put(&self, key: &Digest, blob: LayerBlob) -> std::io::Result<CachedLayer> {
        let layer = CachedLayer {
            digest: blob.descriptor.digest.clone(),
            diff_id: blob.diff_id.clone(),
            size: blob.descriptor.size,
        };
        fs::File::open(&blob.file)?.sync_data()?;
        blob.file
            .persist(self.blob_path(&layer.digest))
            .map_err(|e| e.error)?;
        let record = serde_json::to_vec(&layer).map_err(std::io::Error::other)?;
        // A temporary file of its own: builds of the same Function put the same key at once
        // (with one fixed `.tmp` name, one's rename failed or the record came out mixed).
        let mut tmp = tempfile::NamedTempFile::new_in(self.root.join("deps"))?;
        std::io::Write::write_all(&mut tmp, &record)?;
        tmp.persist(self.entry_path(key)).map_err(|e| e.error)?;
        Ok(layer)
    }

    /// [`LayerCache::put`] on the blocking pool (it waits for the disk), for async callers.
    ///
    /// # Errors
    /// Those of [`LayerCache::put`].
    pub async fn put_blocking(
        &self,
        key: &Digest,
        blob: LayerBlob,
    ) -> std::io::Result<CachedLayer> {
        let (cache, key) = (self.clone(), key.clone());
        tokio::task::spawn_blocking(move || cache.put(&key, blob))
            .await
            .map_err(std::io::Error::other)?
    }
}

/// The layer cache in `cache_dir`.
///
/// # Errors
/// The directory cannot be made or read.
pub fn open_cache(cache_dir: &std::path::Path) -> Result<LayerCache, super::Error> {
    LayerCache::open(cache_dir).map_err(|source| super::Error::Cache {
        path: cache_dir.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oci::{Content, EntryKind, LayerEntry, MediaType, layer::write_layer};

    #[test]
    fn concurrent_puts_of_one_key_all_succeed_and_leave_no_temporary_files() {
        let dir = tempfile::tempdir().unwrap();
        let cache = LayerCache::open(dir.path()).unwrap();
        let key = Digest::of(b"same function");
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..20 {
                        let entry = LayerEntry {
                            path: "a".into(),
                            kind: EntryKind::File {
                                content: Content::Bytes(b"x".to_vec()),
                                executable: false,
                            },
                        };
                        let blob =
                            write_layer(vec![entry], 0, MediaType::OciLayerGzip, &cache.tmp_dir())
                                .unwrap();
                        cache.put(&key, blob).unwrap();
                        assert!(cache.get(&key).is_some());
                    }
                });
            }
        });
        let names: Vec<_> = fs::read_dir(dir.path().join("deps"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        assert_eq!(fs::read_dir(cache.tmp_dir()).unwrap().count(), 0);
    }

    #[test]
    fn a_put_layer_is_found_and_a_truncated_blob_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let cache = LayerCache::open(dir.path()).unwrap();
        let entry = LayerEntry {
            path: "a".into(),
            kind: EntryKind::File {
                content: Content::Bytes(b"x".to_vec()),
                executable: false,
            },
        };
        let blob = write_layer(vec![entry], 0, MediaType::OciLayerGzip, &cache.tmp_dir()).unwrap();
        let key = Digest::of(b"key");
        assert!(cache.get(&key).is_none());
        let put = cache.put(&key, blob).unwrap();
        let got = cache.get(&key).unwrap();
        assert_eq!(got.digest, put.digest);
        fs::write(cache.blob_path(&got.digest), b"").unwrap();
        assert!(cache.get(&key).is_none());
    }
}
