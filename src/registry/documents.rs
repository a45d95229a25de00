//! A local copy of what is content-addressed and small: manifests, indexes and configs,
//! stored by digest. A document named by digest is read from here without a request; a tag
//! costs one `HEAD` (its digest) and then nothing more when the document is here. Every read
//! is verified against its digest (a damaged file is removed and fetched again), so the
//! directory is never trusted. Files are `MEDIA_TYPE\n` followed by the exact bytes.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::oci::{Digest, Document, MediaType};

/// Documents above this size are not kept (manifests are at most 4 MiB; most are a few KiB).
const LIMIT: usize = 4 << 20;

/// The document cache directory.
#[derive(Clone, Debug)]
pub(crate) struct DocumentCache {
    dir: PathBuf,
}

impl DocumentCache {
    pub fn new(dir: PathBuf) -> DocumentCache {
        DocumentCache { dir }
    }

    fn path(&self, digest: &Digest) -> PathBuf {
        self.dir.join(digest.algorithm()).join(digest.hex())
    }

    /// The document with `digest`, if here and intact.
    pub fn get(&self, digest: &Digest) -> Option<Document> {
        let path = self.path(digest);
        let raw = std::fs::read(&path).ok()?;
        let (media_type, bytes) = raw
            .iter()
            .position(|&b| b == b'\n')
            .map(|at| (&raw[..at], &raw[at + 1..]))?;
        if Digest::of(bytes) != *digest {
            tracing::warn!(
                path = %path.display(),
                "a cached document does not match its digest: removed",
            );
            let _ = std::fs::remove_file(&path);
            return None;
        }
        let media_type = std::str::from_utf8(media_type).ok()?;
        Some(Document {
            media_type: MediaType::from(media_type),
            digest: digest.clone(),
            bytes: bytes.to_vec(),
        })
    }

    /// Keeps `doc` (verified bytes) for later; failures only cost a later request.
    pub fn put(&self, doc: &Document) {
        if doc.bytes.len() > LIMIT || Digest::of(&doc.bytes) != doc.digest {
            return;
        }
        let path = self.path(&doc.digest);
        if path.is_file() {
            return;
        }
        if let Err(e) = write(&path, doc) {
            tracing::debug!(path = %path.display(), error = %e, "not caching a document");
        }
    }
}

fn write(path: &Path, doc: &Document) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(doc.media_type.as_str().as_bytes())?;
    tmp.write_all(b"\n")?;
    tmp.write_all(&doc.bytes)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_round_trip_and_a_damaged_one_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DocumentCache::new(dir.path().to_path_buf());
        let doc = Document::new(MediaType::OciManifest, b"{\"a\":1}".to_vec());
        assert!(cache.get(&doc.digest).is_none());
        cache.put(&doc);
        let back = cache.get(&doc.digest).unwrap();
        assert_eq!(
            (back.bytes, back.media_type),
            (doc.bytes.clone(), doc.media_type.clone())
        );
        let path = cache.path(&doc.digest);
        std::fs::write(&path, b"application/x\n{\"a\":2}").unwrap();
        assert!(cache.get(&doc.digest).is_none(), "never trusted");
        assert!(!path.exists());
        // A document whose bytes do not match the digest it claims is not stored.
        let lying = Document {
            digest: Digest::of(b"other"),
            ..doc
        };
        cache.put(&lying);
        assert!(cache.get(&lying.digest).is_none());
    }
}
