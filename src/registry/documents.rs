//! A local copy of what is content-addressed and small: manifests, indexes and configs,
//! stored by digest. A document named by digest is read from here without a request.
//!
//! Two kinds:
//! - **a directory**, kept across runs (`kiln build --cache-dir`): a tag costs one `HEAD` (its
//!   digest) and then nothing more when the document is here. Every read is verified against
//!   its digest (a damaged file is removed and fetched again), so the directory is never
//!   trusted. Files are `MEDIA_TYPE\n` followed by the exact bytes.
//! - **memory**, for a long-running process (the controller): the documents last read or
//!   written, each up to 16 KiB, up to a budget of bytes (each entry's own cost counted), the
//!   least recently used dropped first. A tag is read with a plain `GET`, as without a cache:
//!   a `HEAD` first would only add a request for the tags such a process reads (each once).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::oci::{Digest, Document, MediaType, named_media_type, sniff_media_type};

/// Documents above this size are not kept (manifests are at most 4 MiB; most are a few KiB).
const LIMIT: usize = 4 << 20;

/// Documents above this size are not kept in memory: manifests and configs are a few KiB, and
/// a large one (an SBOM attestation) kept for each of a fleet's images would push out the
/// others.
const MEMORY_LIMIT: usize = 16 << 10;

/// Where documents are kept.
#[derive(Debug)]
pub(crate) enum DocumentCache {
    /// Files in a directory.
    Dir(PathBuf),
    /// The most recently used, in memory; and the largest document kept (the budget, at most
    /// [`MEMORY_LIMIT`]), outside the lock: it never changes.
    Memory(Mutex<Recent>, usize),
}

/// Documents in memory, least recently used first out once over `budget` bytes.
#[derive(Debug, Default)]
pub(crate) struct Recent {
    budget: usize,
    held: usize,
    tick: u64,
    docs: HashMap<Digest, (Document, u64)>,
    /// The documents by last use.
    order: BTreeMap<u64, Digest>,
}

impl DocumentCache {
    pub fn new(dir: PathBuf) -> DocumentCache {
        DocumentCache::Dir(dir)
    }

    /// A cache in memory of at most `budget` bytes: the documents, and what keeping each costs
    /// beside its bytes ([`cost`]).
    pub fn in_memory(budget: usize) -> DocumentCache {
        let recent = Recent {
            budget,
            ..Recent::default()
        };
        DocumentCache::Memory(Mutex::new(recent), budget.min(MEMORY_LIMIT))
    }

    /// Whether a tag is best read as `HEAD` (its digest), then the document from here (a
    /// directory); else it is read with a `GET` (memory).
    pub fn resolves_tags(&self) -> bool {
        matches!(self, DocumentCache::Dir(_))
    }

    /// Whether a document of `size` bytes that was pushed is kept: in memory, when it fits
    /// (a build's directory is not written on its way: the build is over before any read).
    pub fn keeps_pushed(&self, size: u64) -> bool {
        match self {
            DocumentCache::Dir(_) => false,
            DocumentCache::Memory(_, largest) => usize::try_from(size).is_ok_and(|n| n <= *largest),
        }
    }

    /// The document with `digest`, if here and intact.
    pub fn get(&self, digest: &Digest) -> Option<Document> {
        match self {
            DocumentCache::Dir(dir) => read(dir, digest),
            DocumentCache::Memory(recent, _) => {
                let mut recent = recent.lock().unwrap_or_else(|e| e.into_inner());
                recent.get(digest)
            }
        }
    }

    /// Keeps `doc` (verified bytes) for later; failures only cost a later request. A
    /// manifest or index is kept only under the type its bytes say, and bytes that name a
    /// manifest or index type only under that type: the cache serves documents by digest to
    /// every registry, and one registry's label (a manifest given as another's config, say)
    /// must not decide how another's reads parse.
    pub fn put(&self, doc: &Document) {
        let limit = match self {
            DocumentCache::Dir(_) => LIMIT,
            DocumentCache::Memory(_, largest) => *largest,
        };
        if doc.bytes.len() > limit || Digest::of(&doc.bytes) != doc.digest {
            return;
        }
        let lists = |m: &MediaType| m.is_manifest() || m.is_index();
        let refused = if lists(&doc.media_type) {
            sniff_media_type(&doc.bytes).is_some_and(|m| m != doc.media_type)
        } else {
            named_media_type(&doc.bytes).is_some_and(|m| lists(&m))
        };
        if refused {
            return;
        }
        match self {
            DocumentCache::Dir(dir) => {
                let path = path(dir, &doc.digest);
                // Kept already under this type (the bytes are checked when read, not here).
                let head = format!("{}\n", doc.media_type.as_str());
                if std::fs::read(&path).is_ok_and(|raw| raw.starts_with(head.as_bytes())) {
                    return;
                }
                if let Err(e) = write(&path, doc) {
                    tracing::debug!(path = %path.display(), error = %e, "not caching a document");
                }
            }
            DocumentCache::Memory(recent, _) => {
                let mut recent = recent.lock().unwrap_or_else(|e| e.into_inner());
                recent.put(doc);
            }
        }
    }
}

impl Recent {
    /// Marks `digest` used now (every call advances the clock); its document, if kept.
    fn touch(&mut self, digest: &Digest) -> Option<&Document> {
        self.tick += 1;
        let (doc, used) = self.docs.get_mut(digest)?;
        self.order.remove(used);
        *used = self.tick;
        self.order.insert(self.tick, digest.clone());
        Some(doc)
    }

    fn get(&mut self, digest: &Digest) -> Option<Document> {
        self.touch(digest).cloned()
    }

    /// Keeps `doc`, of at most the cache's largest size ([`DocumentCache::put`] checks).
    fn put(&mut self, doc: &Document) {
        // One that would hold more than the whole budget would push out every other and then
        // itself.
        if cost(doc) > self.budget {
            return;
        }
        let kept = self.touch(&doc.digest);
        match kept.map(|k| (k.media_type == doc.media_type, ())) {
            Some((true, _)) => return,
            // The same bytes read as another type: the latest read's type, counted once.
            Some((false, _)) => {
                let held = self.docs.get(&doc.digest).map_or(0, |(kept, _)| cost(kept));
                self.held -= held;
                self.order.remove(&self.tick);
                self.docs.remove(&doc.digest);
            }
            None => {}
        }
        self.held += cost(doc);
        self.docs
            .insert(doc.digest.clone(), (doc.clone(), self.tick));
        self.order.insert(self.tick, doc.digest.clone());
        while self.held > self.budget {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            if let Some((gone, _)) = self.docs.remove(&oldest) {
                self.held -= cost(&gone);
            }
        }
    }
}

/// What a document kept in memory holds of the budget: its bytes, and what keeping it costs
/// beside them (three copies of its digest: the map's key, its own, the use order's; a media
/// type kiln does not name; the two maps' entries). Without it, a fleet's small documents
/// held about twice the budget.
fn cost(doc: &Document) -> usize {
    use std::mem::size_of;
    // The text of each copy; the structures themselves are in the entries.
    const DIGEST_TEXT: usize = "sha256:".len() + 64;
    // A hash map's entry (with its control byte and the free slots of a table at most 7/8
    // full) and a B-tree's (nodes hold 11 entries, at least half full): generously.
    const ENTRIES: usize =
        2 * size_of::<(Digest, (Document, u64))>() + 2 * size_of::<(u64, Digest)>();
    let media_type = match &doc.media_type {
        MediaType::Other(s) => s.len(),
        _ => 0,
    };
    doc.bytes.len() + 3 * DIGEST_TEXT + ENTRIES + media_type
}

fn path(dir: &Path, digest: &Digest) -> PathBuf {
    dir.join(digest.algorithm()).join(digest.hex())
}

/// The document with `digest` in `dir`, if there and intact.
fn read(dir: &Path, digest: &Digest) -> Option<Document> {
    let path = path(dir, digest);
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
        let path = path(dir.path(), &doc.digest);
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

    #[test]
    fn memory_keeps_the_most_recently_used_within_its_budget() {
        let doc = |n: u8| Document::new(MediaType::OciConfig, vec![n; 100]);
        // Each costs more than its 100 bytes (digests, map entries): room for two.
        let each = cost(&doc(1));
        assert!(each > 300, "{each}");
        let budget = 2 * each + 50;
        let cache = DocumentCache::in_memory(budget);
        assert!(!cache.resolves_tags());
        assert!(cache.keeps_pushed(budget as u64) && !cache.keeps_pushed(budget as u64 + 1));
        assert!(!DocumentCache::new(PathBuf::from("/nonexistent")).keeps_pushed(1));
        cache.put(&doc(1));
        cache.put(&doc(2));
        // 1 used after 2: 2 is the least recently used when 3 comes.
        assert!(cache.get(&doc(1).digest).is_some());
        cache.put(&doc(3));
        assert!(cache.get(&doc(2).digest).is_none());
        assert_eq!(cache.get(&doc(1).digest).unwrap().bytes, doc(1).bytes);
        assert_eq!(cache.get(&doc(3).digest).unwrap().bytes, doc(3).bytes);
        // Putting what is there again neither counts it twice nor drops anything.
        cache.put(&doc(3));
        assert!(cache.get(&doc(1).digest).is_some());
        // The same bytes under another type (one whose name costs more to keep): the latest
        // type, counted once.
        let relabelled = Document {
            media_type: MediaType::from("application/vnd.example.config.v1+json"),
            ..doc(3)
        };
        cache.put(&relabelled);
        assert_eq!(
            cache.get(&doc(3).digest).unwrap().media_type,
            relabelled.media_type
        );
        let each_relabelled = cost(&relabelled);
        assert!(each_relabelled > each);
        // Over the whole budget: not kept, and nothing dropped for it.
        cache.put(&Document::new(MediaType::OciConfig, vec![9; budget + 1]));
        // Nor one whose bytes fit and whose cost does not.
        cache.put(&Document::new(MediaType::OciConfig, vec![8; budget - 100]));
        assert!(cache.get(&doc(1).digest).is_some() && cache.get(&doc(3).digest).is_some());
        let lying = Document {
            digest: Digest::of(b"other"),
            ..doc(4)
        };
        cache.put(&lying);
        assert!(cache.get(&lying.digest).is_none());
        let DocumentCache::Memory(recent, _) = &cache else {
            unreachable!()
        };
        let recent = recent.lock().unwrap();
        assert_eq!(
            (recent.held, recent.docs.len(), recent.order.len()),
            (each + each_relabelled, 2, 2)
        );
    }

    #[test]
    fn a_manifest_whose_bytes_name_another_type_is_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = concat!(
            r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","#,
            r#""config":{},"layers":[]}"#
        )
        .as_bytes();
        for cache in [
            DocumentCache::new(dir.path().to_path_buf()),
            DocumentCache::in_memory(1 << 20),
        ] {
            let lying = Document::new(MediaType::OciIndex, manifest.to_vec());
            cache.put(&lying);
            assert!(cache.get(&lying.digest).is_none());
            let honest = Document::new(MediaType::OciManifest, manifest.to_vec());
            cache.put(&honest);
            assert_eq!(
                cache.get(&honest.digest).unwrap().media_type,
                MediaType::OciManifest
            );
            // Another registry's manifest naming those bytes as its config does not relabel
            // them: a config type for a manifest's bytes is not kept, nor does it replace them.
            let relabelled = Document::new(MediaType::OciConfig, manifest.to_vec());
            cache.put(&relabelled);
            assert_eq!(
                cache.get(&honest.digest).unwrap().media_type,
                MediaType::OciManifest
            );
        }
    }
}
