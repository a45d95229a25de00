//! The tree kiln's own installs ([`super::lockfile`], [`super::pinned`]) build in memory on its
//! way into the dependency layer. Creating and reading back thousands of small files cost
//! seconds on an ext4 disk, far more than unpacking them; so file bytes stay in memory up to
//! a budget ([`IN_MEMORY`]) and only past it go to numbered files in a spill directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::source::Tree;
use crate::oci::layer::{Content, EntryKind};

/// File bytes an install keeps in memory; past this, files are written to the scratch
/// directory and read back by the layer writer.
pub(crate) const IN_MEMORY: u64 = 64 << 20;

/// A file could not be spilled.
#[derive(Debug, thiserror::Error)]
#[error("{action} {}", path.display())]
pub struct SpillError {
    action: &'static str,
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

fn spill_error(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SpillError {
    let path = path.to_path_buf();
    move |source| SpillError {
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
}

impl Building {
    /// An empty tree keeping up to `budget` bytes of files in memory, the rest in `spill`.
    pub(crate) fn new(spill: &Path, budget: u64) -> Building {
        Building {
            entries: BTreeMap::new(),
            in_memory: 0,
            budget,
            spill: spill.to_path_buf(),
            spilled: 0,
        }
    }

    /// Adds a file, or replaces the entry at `path` (as a later tar member does), which it
    /// returns.
    pub(crate) fn put_file(
        &mut self,
        path: String,
        bytes: Vec<u8>,
        executable: bool,
    ) -> Result<Option<EntryKind>, SpillError> {
        let content = if self.in_memory + bytes.len() as u64 <= self.budget {
            self.in_memory += bytes.len() as u64;
            Content::Bytes(bytes)
        } else {
            std::fs::create_dir_all(&self.spill).map_err(spill_error("creating", &self.spill))?;
            let file = self.spill.join(self.spilled.to_string());
            self.spilled += 1;
            std::fs::write(&file, &bytes).map_err(spill_error("writing", &file))?;
            Content::Path(file)
        };
        Ok(self.entries.insert(
            path,
            EntryKind::File {
                content,
                executable,
            },
        ))
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
}
