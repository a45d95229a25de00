//! OCI image layouts on disk
//! (<https://github.com/opencontainers/image-spec/blob/main/image-layout.md>): `oci-layout`,
//! `index.json` and content-addressed `blobs/sha256/<hex>`. Blobs are written to a temp file
//! and renamed, so a reader never sees a partial blob.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::{Descriptor, Digest, Document, HashingReader, Index, MediaType, canonical};
use crate::io_error::IoContext as _;

/// The annotation naming an image inside a layout (the `:tag` of `oci:DIR:tag`).
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Errors reading or writing a layout.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// File system trouble.
    #[error(transparent)]
    Io(#[from] crate::io_error::IoError),
    /// The directory is not an OCI layout.
    #[error("{0} is not an OCI image layout (no oci-layout file)")]
    NotALayout(PathBuf),
    /// `index.json` does not parse.
    #[error("parsing {path}")]
    Index {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// No image of that name.
    #[error("layout {layout} has no image named {name:?} (it has: {available})")]
    NoSuchRef {
        /// The layout.
        layout: PathBuf,
        /// The wanted name.
        name: String,
        /// Names present.
        available: String,
    },
    /// A blob's content does not match its name.
    #[error("blob {expected} in {layout} has digest {actual}")]
    Corrupt {
        /// The layout.
        layout: PathBuf,
        /// Its name.
        expected: Digest,
        /// Of its bytes.
        actual: Digest,
    },
}

type Result<T, E = Error> = std::result::Result<T, E>;

/// An OCI image layout directory.
#[derive(Clone, Debug)]
pub struct Layout {
    root: PathBuf,
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Error {
    crate::io_error::IoError::at(action, path)
}

impl Layout {
    /// Opens `root`, creating an empty layout there if it has none.
    ///
    /// # Errors
    /// When the directory cannot be created or written.
    pub fn create(root: &Path) -> Result<Layout> {
        let layout = Layout {
            root: root.to_path_buf(),
        };
        let blobs = root.join("blobs").join("sha256");
        fs::create_dir_all(&blobs).at("creating", &blobs)?;
        let _lock = layout.lock_index()?;
        let marker = root.join("oci-layout");
        if !marker.exists() {
            write_atomic(&marker, br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        }
        if !root.join("index.json").exists() {
            layout.write_index(&Index {
                schema_version: 2,
                media_type: Some(MediaType::OciIndex),
                manifests: vec![],
                annotations: None,
            })?;
        }
        Ok(layout)
    }

    /// Opens an existing layout.
    ///
    /// # Errors
    /// When `root` has no `oci-layout` file.
    pub fn open(root: &Path) -> Result<Layout> {
        if !root.join("oci-layout").is_file() {
            return Err(Error::NotALayout(root.to_path_buf()));
        }
        Ok(Layout {
            root: root.to_path_buf(),
        })
    }

    /// The layout directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where blob `digest` lives.
    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.root
            .join("blobs")
            .join(digest.algorithm())
            .join(digest.hex())
    }

    /// Whether the blob is present with the given size.
    pub fn has_blob(&self, digest: &Digest, size: u64) -> bool {
        fs::metadata(self.blob_path(digest)).is_ok_and(|m| m.len() == size)
    }

    /// Stores bytes as a blob and returns their digest.
    ///
    /// # Errors
    /// When writing fails.
    pub fn write_blob(&self, bytes: &[u8]) -> Result<Digest> {
        let digest = Digest::of(bytes);
        let path = self.blob_path(&digest);
        if !self.has_blob(&digest, bytes.len() as u64) {
            write_atomic(&path, bytes)?;
        }
        Ok(digest)
    }

    /// Stores the file at `src` as blob `digest`, checking the digest while copying: a file
    /// that does not match never lands under that name.
    ///
    /// # Errors
    /// [`Error::Corrupt`] when the bytes do not match, [`Error::Io`] when copying fails.
    pub fn import_blob(&self, src: &Path, digest: &Digest) -> Result<()> {
        let dest = self.blob_path(digest);
        if dest.exists() {
            return Ok(());
        }
        let dir = self.root.join("blobs/sha256");
        // A unique temp file: two writers of the same blob must not share one.
        let mut tmp =
            tempfile::NamedTempFile::new_in(&dir).at("creating a temporary file in", &dir)?;
        let file = fs::File::open(src).at("opening", src)?;
        let mut reader = HashingReader::new(file);
        io::copy(&mut reader, tmp.as_file_mut()).at("copying a blob to", &dest)?;
        let (actual, _) = reader.finish();
        if actual != *digest {
            return Err(Error::Corrupt {
                layout: src.to_path_buf(),
                expected: digest.clone(),
                actual,
            });
        }
        tmp.persist(&dest)
            .map_err(|e| io_err("renaming into", &dest)(e.error))?;
        Ok(())
    }

    /// Reads a whole (JSON) blob and checks its digest.
    ///
    /// # Errors
    /// When missing or corrupt.
    pub fn read_blob(&self, digest: &Digest) -> Result<Vec<u8>> {
        let path = self.blob_path(digest);
        let bytes = fs::read(&path).at("reading", &path)?;
        let actual = Digest::of(&bytes);
        if actual != *digest {
            return Err(Error::Corrupt {
                layout: self.root.clone(),
                expected: digest.clone(),
                actual,
            });
        }
        Ok(bytes)
    }

    /// Checks a (possibly large) blob's digest by streaming it.
    ///
    /// # Errors
    /// When missing or corrupt.
    pub fn verify_blob(&self, digest: &Digest) -> Result<u64> {
        let path = self.blob_path(digest);
        let file = fs::File::open(&path).at("opening", &path)?;
        let mut reader = HashingReader::new(file);
        io::copy(&mut reader, &mut io::sink()).at("reading", &path)?;
        let (actual, size) = reader.finish();
        if actual != *digest {
            return Err(Error::Corrupt {
                layout: self.root.clone(),
                expected: digest.clone(),
                actual,
            });
        }
        Ok(size)
    }

    /// Reads a JSON document blob with its media type.
    ///
    /// # Errors
    /// When missing or corrupt.
    pub fn read_document(&self, descriptor: &Descriptor) -> Result<Document> {
        let bytes = self.read_blob(&descriptor.digest)?;
        Ok(Document {
            media_type: descriptor.media_type.clone(),
            digest: descriptor.digest.clone(),
            bytes,
        })
    }

    /// The top-level `index.json`.
    ///
    /// # Errors
    /// When unreadable or malformed.
    pub fn index(&self) -> Result<Index> {
        let path = self.root.join("index.json");
        let bytes = fs::read(&path).at("reading", &path)?;
        serde_json::from_slice(&bytes).map_err(|source| Error::Index { path, source })
    }

    /// An exclusive `flock` on the layout directory, held while `index.json` is read, changed
    /// and replaced: without it concurrent builds into one layout each rewrote the index from
    /// their own read, and images went missing (6 or 7 of 8 named). The lock is on the
    /// directory itself, so the layout holds no file the spec does not name.
    fn lock_index(&self) -> Result<fs::File> {
        let dir = fs::File::open(&self.root).at("opening", &self.root)?;
        rustix::fs::flock(&dir, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| io_err("locking", &self.root)(e.into()))?;
        Ok(dir)
    }

    fn write_index(&self, index: &Index) -> Result<()> {
        let path = self.root.join("index.json");
        let bytes = canonical::to_vec(index).map_err(|source| Error::Index {
            path: path.clone(),
            source,
        })?;
        write_atomic(&path, &bytes)
    }

    /// Points `name` at `descriptor` in `index.json`, replacing an earlier image of that name.
    ///
    /// # Errors
    /// When the index cannot be read or written.
    pub fn set_ref(&self, mut descriptor: Descriptor, name: &str) -> Result<()> {
        let _lock = self.lock_index()?;
        let mut index = self.index()?;
        index.manifests.retain(|d| ref_name(d) != Some(name));
        descriptor
            .annotations
            .get_or_insert_with(Default::default)
            .insert(REF_NAME.into(), name.into());
        index.manifests.push(descriptor);
        self.write_index(&index)
    }

    /// Removes the images named in `names` from `index.json`, then deletes every blob no
    /// remaining image reaches (manifests, child manifests of indexes, configs, layers) that
    /// is older than `grace` (a build writes its blobs before it names its image). Returns
    /// the bytes deleted. Holds the index lock throughout.
    ///
    /// # Errors
    /// When the index cannot be read or written, or a reachable document does not parse.
    pub fn remove_refs_and_collect(
        &self,
        names: &[String],
        grace: std::time::Duration,
    ) -> Result<u64> {
        let _lock = self.lock_index()?;
        let mut index = self.index()?;
        index
            .manifests
            .retain(|d| !ref_name(d).is_some_and(|n| names.iter().any(|x| x == n)));
        self.write_index(&index)?;
        let mut reachable = std::collections::BTreeSet::new();
        let mut todo: Vec<Descriptor> = index.manifests.clone();
        while let Some(d) = todo.pop() {
            if !reachable.insert(d.digest.hex().to_string()) {
                continue;
            }
            if !(d.media_type.is_index() || d.media_type.is_manifest()) {
                continue;
            }
            let Ok(doc) = self.read_document(&d) else {
                continue;
            };
            if let Ok(child) = doc.parse::<Index>()
                && d.media_type.is_index()
            {
                todo.extend(child.manifests);
            } else if let Ok(m) = doc.parse::<crate::oci::Manifest>() {
                todo.push(m.config);
                todo.extend(m.layers);
            }
        }
        let dir = self.root.join("blobs/sha256");
        let mut freed = 0;
        for entry in fs::read_dir(&dir).at("reading", &dir)?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(meta) = entry.metadata() else { continue };
            let young = meta
                .modified()
                .ok()
                .and_then(|m| m.elapsed().ok())
                .is_none_or(|age| age < grace);
            if reachable.contains(&name) || young {
                continue;
            }
            if fs::remove_file(entry.path()).is_ok() {
                freed += meta.len();
            }
        }
        Ok(freed)
    }

    /// The descriptor named `name`, or with no name the layout's only image.
    ///
    /// # Errors
    /// When there is no such image (or, without a name, not exactly one).
    pub fn resolve(&self, name: Option<&str>) -> Result<Descriptor> {
        let index = self.index()?;
        let found = match name {
            Some(name) => index.manifests.iter().find(|d| ref_name(d) == Some(name)),
            None if index.manifests.len() == 1 => index.manifests.first(),
            None => None,
        };
        found.cloned().ok_or_else(|| Error::NoSuchRef {
            layout: self.root.clone(),
            name: name.unwrap_or("").to_string(),
            available: index
                .manifests
                .iter()
                .filter_map(ref_name)
                .collect::<Vec<_>>()
                .join(", "),
        })
    }
}

fn ref_name(d: &Descriptor) -> Option<&str> {
    d.annotations.as_ref()?.get(REF_NAME).map(String::as_str)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir).at("creating a file in", dir)?;
    tmp.write_all(bytes).at("writing", path)?;
    tmp.persist(path).map_err(|e| {
        Error::Io(crate::io_error::IoError {
            action: "writing",
            path: path.to_path_buf(),
            source: e.error,
        })
    })?;
    Ok(())
}

/// Splits `DIR[:NAME]`. Names may contain `/` (the store names Functions `functions/NAME`)
/// and directories may contain `:`, so the first `:` whose left side is an existing OCI layout
/// wins; failing that (a layout still to be written), a `:` after the last `/` starts the name.
pub fn split_layout_ref(s: &str) -> (&str, Option<String>) {
    for (i, _) in s.match_indices(':') {
        let dir = &s[..i];
        if !dir.is_empty() && std::path::Path::new(dir).join("oci-layout").is_file() {
            return (dir, Some(s[i + 1..].to_string()));
        }
    }
    let slash = s.rfind('/').map_or(0, |i| i + 1);
    match s[slash..].rfind(':') {
        Some(i) => (&s[..slash + i], Some(s[slash + i + 1..].to_string())),
        None => (s, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_references_split_at_the_last_colon_after_the_last_slash() {
        assert_eq!(
            split_layout_ref("./out/img:v1"),
            ("./out/img", Some("v1".into()))
        );
        assert_eq!(split_layout_ref("/a:b/img"), ("/a:b/img", None));
        assert_eq!(split_layout_ref("img"), ("img", None));
    }

    #[test]
    fn concurrent_writers_into_one_layout_lose_no_image() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let root = root.clone();
                std::thread::spawn(move || {
                    // Each writer opens the layout itself, as a separate kiln process does.
                    for i in 0..10 {
                        let layout = Layout::create(&root).unwrap();
                        let digest = layout.write_blob(format!("{t}-{i}").as_bytes()).unwrap();
                        let descriptor = Descriptor::new(MediaType::OciManifest, digest, 3);
                        layout.set_ref(descriptor, &format!("fn{t}:{i}")).unwrap();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let index = Layout::open(&root).unwrap().index().unwrap();
        assert_eq!(index.manifests.len(), 80);
    }

    #[test]
    fn set_ref_replaces_an_image_of_the_same_name() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::create(dir.path()).unwrap();
        let a = layout.write_blob(b"a").unwrap();
        let b = layout.write_blob(b"b").unwrap();
        layout
            .set_ref(Descriptor::new(MediaType::OciManifest, a, 1), "x")
            .unwrap();
        layout
            .set_ref(Descriptor::new(MediaType::OciManifest, b.clone(), 1), "x")
            .unwrap();
        let index = layout.index().unwrap();
        assert_eq!(index.manifests.len(), 1);
        assert_eq!(layout.resolve(Some("x")).unwrap().digest, b);
        assert_eq!(layout.resolve(None).unwrap().digest, b);
        assert!(matches!(
            layout.resolve(Some("y")),
            Err(Error::NoSuchRef { .. })
        ));
        assert_eq!(layout.read_blob(&b).unwrap(), b"b");
    }

    #[test]
    fn a_corrupt_blob_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::create(dir.path()).unwrap();
        let d = layout.write_blob(b"good").unwrap();
        fs::write(layout.blob_path(&d), b"evil").unwrap();
        assert!(matches!(layout.read_blob(&d), Err(Error::Corrupt { .. })));
        assert!(matches!(layout.verify_blob(&d), Err(Error::Corrupt { .. })));
    }

    #[test]
    fn an_imported_blob_is_checked_before_it_is_stored() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::create(&dir.path().join("l")).unwrap();
        let src = dir.path().join("blob");
        fs::write(&src, b"good").unwrap();
        let good = Digest::of(b"good");
        layout.import_blob(&src, &good).unwrap();
        assert_eq!(layout.read_blob(&good).unwrap(), b"good");
        let claimed = Digest::of(b"other");
        let err = layout.import_blob(&src, &claimed).unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
        assert!(!layout.blob_path(&claimed).exists());
        let leftovers = fs::read_dir(dir.path().join("l/blobs/sha256"))
            .unwrap()
            .count();
        assert_eq!(leftovers, 1, "only the good blob, no temporary file");
    }
}
