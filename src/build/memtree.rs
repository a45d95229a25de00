//! The tree kiln's own installs ([`super::lockfile`], [`super::pinned`]) build in memory on its
//! way into the dependency layer. Creating and reading back thousands of small files cost
//! seconds on an ext4 disk, far more than unpacking them; so file bytes stay in memory up to
//! a budget ([`IN_MEMORY`]) and only past it go to numbered files in a spill directory.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use crate::oci::budget::{Budget, Over};
use crate::oci::layer::{Content, EntryKind};
use crate::oci::source::Tree;

/// File bytes an install keeps in memory; past this, files are written to the scratch
/// directory and read back by the layer writer.
pub(crate) const IN_MEMORY: u64 = 64 << 20;

/// The most bytes one install may unpack, every entry (file, link, directory) costing its
/// metadata too ([`crate::oci::budget`]): what `kiln run` unpacks of a whole image by
/// default; a larger dependency layer could not run.
pub(crate) const LIMIT: u64 = crate::oci::budget::DEFAULT_BYTES;

/// A file that could not be added to the tree.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The spill directory could not be written.
    #[error("{action} {}", path.display())]
    Spill {
        /// What was being done.
        action: &'static str,
        /// Where.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The files passed the tree's limit.
    #[error(
        "the dependencies unpack to more than {} (passed at {path}): kiln refuses a \
         dependency layer that large, since `kiln run` unpacks no image over 8 GiB by \
         default; leave the largest packages out or replace them",
        crate::oci::budget::size_text(*limit)
    )]
    TooLarge {
        /// The file that passed the limit.
        path: String,
        /// The limit.
        limit: u64,
    },
    /// The tree passed the entry cap.
    #[error(
        "the dependencies unpack to more than {limit} files, links and directories (passed \
         at {path}): kiln refuses a dependency layer with that many, since `kiln run` unpacks no \
         image with more; leave the largest packages out or replace them"
    )]
    TooManyEntries {
        /// The entry that passed the cap.
        path: String,
        /// The cap.
        limit: u64,
    },
    /// The file's bytes could not be read from where they are unpacked from.
    #[error("reading {path}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

fn spill_error(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Spill {
        action,
        path,
        source,
    }
}

/// A tree being built: `/`-separated paths below the install's directory (files and links;
/// the layer writer adds their directories).
pub(crate) struct Building {
    pub(crate) entries: BTreeMap<String, EntryKind>,
    /// File bytes held in memory so far.
    in_memory: u64,
    /// How many may be; past this, files go to `spill`.
    budget: u64,
    spill: PathBuf,
    spilled: u64,
    /// What is left of the bytes and entries the tree may hold (replaced files count again).
    left: Budget,
    /// The directories the entries imply, each charged once.
    dirs: HashSet<String>,
}

impl Building {
    /// An empty tree keeping up to `budget` bytes of files in memory, the rest in `spill`,
    /// and refusing files past [`LIMIT`] bytes in all.
    pub(crate) fn new(spill: &Path, budget: u64) -> Building {
        Building {
            entries: BTreeMap::new(),
            in_memory: 0,
            budget,
            spill: spill.to_path_buf(),
            spilled: 0,
            left: Budget::new(LIMIT),
            dirs: HashSet::new(),
        }
    }

    /// The same tree with another limit than [`LIMIT`].
    #[cfg(test)]
    pub(crate) fn with_limit(self, limit: u64) -> Building {
        Building {
            left: Budget::new(limit),
            ..self
        }
    }

    /// The same tree with at most `entries` entries.
    #[cfg(test)]
    pub(crate) fn with_max_entries(self, entries: u64) -> Building {
        Building {
            left: self.left.clone().max_entries(entries),
            ..self
        }
    }

    /// Counts an entry at `path` with `bytes` of contents, and each directory it implies
    /// that no earlier entry did, against the budget.
    fn count(&mut self, path: &str, bytes: u64) -> Result<(), Error> {
        let over = |over: Over| match over {
            Over::Bytes(limit) => Error::TooLarge {
                path: path.to_string(),
                limit,
            },
            Over::Entries(limit) => Error::TooManyEntries {
                path: path.to_string(),
                limit,
            },
        };
        // Deepest first: once a parent is known, so are all above it.
        for (i, _) in path.rmatch_indices('/') {
            if self.dirs.contains(&path[..i]) {
                break;
            }
            self.dirs.insert(path[..i].to_string());
            self.left.entry().map_err(over)?;
        }
        self.left.entry().map_err(over)?;
        self.left.bytes(bytes).map_err(over)
    }

    /// Adds a symbolic link at `path` to `target`, or replaces the entry there.
    ///
    /// # Errors
    /// The budget is spent.
    pub(crate) fn put_link(&mut self, path: String, target: String) -> Result<(), Error> {
        self.count(&path, target.len() as u64)?;
        self.entries.insert(path, EntryKind::Symlink(target));
        Ok(())
    }

    /// The next file of the spill directory.
    fn spill_path(&mut self) -> Result<PathBuf, Error> {
        std::fs::create_dir_all(&self.spill).map_err(spill_error("creating", &self.spill))?;
        let file = self.spill.join(self.spilled.to_string());
        self.spilled += 1;
        Ok(file)
    }

    /// Adds a file, or replaces the entry at `path` (as a later tar member does), which it
    /// returns.
    pub(crate) fn put_file(
        &mut self,
        path: String,
        bytes: Vec<u8>,
        executable: bool,
    ) -> Result<Option<EntryKind>, Error> {
        self.count(&path, bytes.len() as u64)?;
        let content = if self.in_memory + bytes.len() as u64 <= self.budget {
            self.in_memory += bytes.len() as u64;
            Content::Bytes(bytes)
        } else {
            let file = self.spill_path()?;
            std::fs::write(&file, &bytes).map_err(spill_error("writing", &file))?;
            Content::Path(file)
        };
        Ok(self.insert(path, content, executable))
    }

    /// Adds a file of `size` bytes read from `reader` (a tar member, which ends after its
    /// size): into memory if it fits the budget, else copied to the spill directory as it
    /// is read, so no file past the budget is ever whole in memory. Like
    /// [`Building::put_file`] otherwise.
    pub(crate) fn put_reader(
        &mut self,
        path: String,
        reader: impl std::io::Read,
        size: u64,
        executable: bool,
    ) -> Result<Option<EntryKind>, Error> {
        use std::io::{Read as _, Write as _};
        let read_error = |source| Error::Read {
            path: path.clone(),
            source,
        };
        // Refused before anything is read: `size` is what the reader yields at most.
        self.count(&path, size)?;
        let mut reader = reader.take(size);
        if self.in_memory + size <= self.budget {
            let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
            reader.read_to_end(&mut bytes).map_err(read_error)?;
            self.in_memory += bytes.len() as u64;
            return Ok(self.insert(path, Content::Bytes(bytes), executable));
        }
        let file = self.spill_path()?;
        let mut out = std::fs::File::create(&file).map_err(spill_error("creating", &file))?;
        let mut buf = vec![0; 256 << 10];
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(read_error(e)),
            };
            out.write_all(&buf[..n])
                .map_err(spill_error("writing", &file))?;
        }
        Ok(self.insert(path, Content::Path(file), executable))
    }

    fn insert(&mut self, path: String, content: Content, executable: bool) -> Option<EntryKind> {
        self.entries.insert(
            path,
            EntryKind::File {
                content,
                executable,
            },
        )
    }

    /// The finished tree.
    pub(crate) fn into_tree(self) -> Tree {
        Tree {
            entries: self.entries,
        }
    }

    /// The first path below another that is a file (`a` a file and `a/b` another), with that
    /// file: no file system holds both.
    pub(crate) fn file_as_parent(&self) -> Option<(&str, &str)> {
        self.entries.keys().find_map(|path| {
            path.match_indices('/')
                .map(|(i, _)| &path[..i])
                .find(|parent| self.entries.contains_key(*parent))
                .map(|parent| (path.as_str(), parent))
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn past_the_budget_files_go_to_the_spill_directory_with_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let mut tree = Building::new(&dir.path().join("spill"), 1);
        tree.put_file("p/a".into(), b"x".to_vec(), false).unwrap();
        tree.put_file("p/b".into(), b"yz".to_vec(), true).unwrap();
        assert!(matches!(
            &tree.entries["p/a"],
            EntryKind::File {
                content: Content::Bytes(b),
                executable: false,
            } if b == b"x"
        ));
        let EntryKind::File {
            content: Content::Path(spilled),
            executable: true,
        } = &tree.entries["p/b"]
        else {
            panic!("{:?}", tree.entries["p/b"]);
        };
        assert_eq!(std::fs::read(spilled).unwrap(), b"yz");
    }

    #[test]
    fn files_past_the_limit_are_refused_before_they_are_read() {
        /// A reader that must not be read.
        struct Untouched;
        impl std::io::Read for Untouched {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                panic!("read past the limit");
            }
        }
        let dir = tempfile::tempdir().unwrap();
        // Each file also costs its metadata.
        let limit = 2 * crate::oci::budget::ENTRY_COST + 10;
        let mut tree = Building::new(dir.path(), 4).with_limit(limit);
        tree.put_reader("a".into(), &b"12345678"[..], 8, false)
            .unwrap();
        assert!(matches!(
            &tree.entries["a"],
            EntryKind::File {
                content: Content::Path(p),
                ..
            } if std::fs::read(p).unwrap() == b"12345678"
        ));
        let err = tree
            .put_reader("b".into(), Untouched, 3, false)
            .unwrap_err();
        assert!(
            matches!(&err, Error::TooLarge { path, limit: l } if path == "b" && *l == limit),
            "{err}"
        );
        let err = tree
            .put_file("c".into(), b"xyz".to_vec(), false)
            .unwrap_err();
        assert!(
            matches!(&err, Error::TooLarge { path, .. } if path == "c"),
            "{err}"
        );
    }

    #[test]
    fn a_file_where_a_directory_must_be_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let mut tree = Building::new(dir.path(), IN_MEMORY);
        tree.put_file("a/b".into(), b"1".to_vec(), false).unwrap();
        tree.put_file("a/bc".into(), b"1".to_vec(), false).unwrap();
        assert_eq!(tree.file_as_parent(), None);
        tree.put_file("a/b/c/d".into(), b"2".to_vec(), false)
            .unwrap();
        assert_eq!(tree.file_as_parent(), Some(("a/b/c/d", "a/b")));
        // A replaced entry is returned.
        let old = tree.put_file("a/bc".into(), b"3".to_vec(), false).unwrap();
        assert!(old.is_some());
    }

    #[test]
    fn every_entry_and_every_directory_it_implies_is_counted_once() {
        use crate::oci::budget::ENTRY_COST;
        let dir = tempfile::tempdir().unwrap();
        // `p/a/b/f`: the file and its three directories.
        let mut tree = Building::new(dir.path(), 1 << 20).with_max_entries(5);
        tree.put_file("p/a/b/f".into(), Vec::new(), false).unwrap();
        // A sibling in the same directories costs one more entry.
        tree.put_file("p/a/b/g".into(), Vec::new(), false).unwrap();
        let err = tree.put_link("p/a/c".into(), "b/f".into()).unwrap_err();
        assert!(
            matches!(&err, Error::TooManyEntries { path, limit: 5 } if path == "p/a/c"),
            "{err}"
        );
        // Empty files pay their metadata against the byte cap: `p` and `p/x` fit, `p/y`
        // does not.
        let mut tree = Building::new(dir.path(), 1 << 20).with_limit(3 * ENTRY_COST - 1);
        tree.put_file("p/x".into(), Vec::new(), false).unwrap();
        let err = tree.put_file("p/y".into(), Vec::new(), false).unwrap_err();
        assert!(
            matches!(&err, Error::TooLarge { path, .. } if path == "p/y"),
            "{err}"
        );
    }
}
