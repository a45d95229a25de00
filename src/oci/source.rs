//! Walks a directory into layer entries: the Function's source tree, or an install's output.
//! Ignore rules apply (gitignore syntax: the runtime's excludes plus the Function's
//! `.kilnignore`), secret files never pass, and anything that could smuggle host content into
//! the image — a symlink leaving the tree, a device, a socket — is refused with its path.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ignore::gitignore::{Gitignore, GitignoreBuilder};

use super::{Content, EntryKind, LayerEntry};
use crate::rootpath::{self, Last};

/// The Function's own ignore file.
pub const IGNORE_FILE: &str = ".kilnignore";
/// The largest `.kilnignore` read.
const MAX_IGNORE_FILE: u64 = 1 << 20;

/// Why a tree cannot be layered.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A symlink points outside the tree.
    #[error("symlink {path} points to {target:?}, outside {root}; copy the file in instead")]
    EscapingSymlink {
        /// The link.
        path: PathBuf,
        /// Its target.
        target: PathBuf,
        /// The tree.
        root: PathBuf,
    },
    /// A device, FIFO or socket.
    #[error(
        "{path} is a {kind}, which cannot go into an image; remove it or list it in .kilnignore"
    )]
    SpecialFile {
        /// The file.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// A name that is not UTF-8.
    #[error("{0} has a name that is not valid UTF-8")]
    NonUtf8(PathBuf),
    /// A bad `.kilnignore` pattern.
    #[error("{path}: invalid pattern")]
    Ignore {
        /// The ignore file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: ignore::Error,
    },
    /// Reading the tree.
    #[error(transparent)]
    Io(#[from] crate::io_error::IoError),
    /// The tree is larger than [`WalkRules::budget`] allows.
    #[error(
        "{root} holds more than {} (at {path}), counting {} bytes per file, directory and \
         link: kiln layers no tree that large, since `kiln run` unpacks no image larger",
        super::budget::size_text(*limit),
        super::budget::ENTRY_COST
    )]
    TooLarge {
        /// The tree.
        root: PathBuf,
        /// The entry that passed the cap.
        path: PathBuf,
        /// The cap.
        limit: u64,
    },
    /// The tree has more entries than [`WalkRules::budget`] allows.
    #[error(
        "{root} holds more than {limit} files, directories and links (at {path}): kiln layers \
         no tree with that many, since `kiln run` unpacks no image with more"
    )]
    TooManyEntries {
        /// The tree.
        root: PathBuf,
        /// The entry that passed the cap.
        path: PathBuf,
        /// The cap.
        limit: u64,
    },
}

/// How to walk a tree.
#[derive(Clone, Debug, Default)]
pub struct WalkRules {
    /// gitignore-syntax patterns to leave out.
    pub exclude: Vec<String>,
    /// File names left out at any depth, whatever the patterns say (secrets).
    pub never: Vec<String>,
    /// Whether to honour a `.kilnignore` at the root.
    pub ignore_file: bool,
    /// Whether absolute symlinks are kept: true for a whole root filesystem, where they
    /// resolve against the image root; false for a Function, where they would reach into
    /// the host's file system at build time and mean nothing in the image.
    pub absolute_links: bool,
    /// What the tree may hold: bytes of files plus a metadata cost per entry, and entries
    /// ([`super::budget`]; 8 GiB and a million unless told).
    pub budget: super::budget::Budget,
}

/// A walked tree: relative path → entry kind (directories included), sorted.
#[derive(Debug, Default)]
pub struct Tree {
    /// The entries, keyed by `/`-separated relative path.
    pub entries: BTreeMap<String, EntryKind>,
}

impl Tree {
    /// Layer entries placed under `prefix` (an absolute image path such as `/kubeless`).
    pub fn to_layer_entries(&self, prefix: &str) -> Vec<LayerEntry> {
        let prefix = prefix.trim_matches('/');
        let mut out: Vec<LayerEntry> = self
            .entries
            .iter()
            .map(|(path, kind)| LayerEntry {
                path: format!("{prefix}/{path}"),
                kind: kind.clone(),
            })
            .collect();
        out.push(LayerEntry {
            path: prefix.to_string(),
            kind: EntryKind::Dir,
        });
        out
    }

    /// Number of regular files.
    pub fn file_count(&self) -> usize {
        self.entries
            .values()
            .filter(|k| matches!(k, EntryKind::File { .. }))
            .count()
    }
}

/// Walks `root` by `rules`.
///
/// # Errors
/// Escaping symlinks, special files, non-UTF-8 names, bad ignore patterns, I/O errors.
pub fn walk(root: &Path, rules: &WalkRules) -> Result<Tree, Error> {
    let ignore = build_ignore(root, rules)?;
    let mut tree = Tree::default();
    let mut left = rules.budget.clone();
    walk_dir(root, root, &ignore, rules, &mut left, &mut tree)?;
    Ok(tree)
}

fn build_ignore(root: &Path, rules: &WalkRules) -> Result<Gitignore, Error> {
    let mut builder = GitignoreBuilder::new(root);
    let bad = |source| Error::Ignore {
        path: root.join(IGNORE_FILE),
        source,
    };
    for pattern in &rules.exclude {
        builder.add_line(None, pattern).map_err(bad)?;
    }
    let file = root.join(IGNORE_FILE);
    let is_dir = std::fs::symlink_metadata(&file).is_ok_and(|m| m.is_dir());
    if rules.ignore_file && !is_dir {
        // Read beneath the tree, as every file of it: a link to a host file (a docker
        // config) would otherwise have its lines taken as patterns, and shown in errors.
        let read = crate::rootpath::read_beneath(root, Path::new(IGNORE_FILE), MAX_IGNORE_FILE);
        match read {
            Ok(bytes) => {
                let text = String::from_utf8(bytes).map_err(|_| Error::NonUtf8(file.clone()))?;
                for line in text.lines() {
                    builder.add_line(Some(file.clone()), line).map_err(bad)?;
                }
                builder.add_line(None, IGNORE_FILE).map_err(bad)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(crate::io_error::IoError::at("reading", &file)(e)),
        }
    }
    builder.build().map_err(bad)
}

fn walk_dir(
    root: &Path,
    dir: &Path,
    ignore: &Gitignore,
    rules: &WalkRules,
    left: &mut super::budget::Budget,
    tree: &mut Tree,
) -> Result<(), Error> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| {
            Error::Io(crate::io_error::IoError {
                action: "reading",
                path,
                source,
            })
        }
    };
    let mut children: Vec<_> = fs::read_dir(dir)
        .map_err(io(dir))?
        .collect::<Result<_, _>>()
        .map_err(io(dir))?;
    children.sort_by_key(|e| e.file_name());
    for child in children {
        let path = child.path();
        let name = child.file_name();
        let name = name.to_str().ok_or_else(|| Error::NonUtf8(path.clone()))?;
        let meta = fs::symlink_metadata(&path).map_err(io(&path))?;
        let kind = meta.file_type();
        if rules.never.iter().any(|n| n == name) || ignore.matched(&path, kind.is_dir()).is_ignore()
        {
            continue;
        }
        let rel = path.strip_prefix(root).unwrap_or(&path);
        let rel = rel
            .to_str()
            .ok_or_else(|| Error::NonUtf8(path.clone()))?
            .to_string();
        // Charged before the entry is kept or a directory entered.
        let size = if kind.is_file() { meta.len() } else { 0 };
        left.entry()
            .and_then(|()| left.bytes(size))
            .map_err(|over| match over {
                super::budget::Over::Bytes(limit) => Error::TooLarge {
                    root: root.to_path_buf(),
                    path: path.clone(),
                    limit,
                },
                super::budget::Over::Entries(limit) => Error::TooManyEntries {
                    root: root.to_path_buf(),
                    path: path.clone(),
                    limit,
                },
            })?;
        let entry = if kind.is_dir() {
            walk_dir(root, &path, ignore, rules, left, tree)?;
            EntryKind::Dir
        } else if kind.is_symlink() {
            let target = fs::read_link(&path).map_err(io(&path))?;
            if !rules.absolute_links {
                check_link(root, &rel, &target, &path)?;
            }
            let target = target
                .to_str()
                .ok_or_else(|| Error::NonUtf8(path.clone()))?;
            EntryKind::Symlink(target.to_string())
        } else if kind.is_file() {
            let executable = meta.permissions().mode() & 0o111 != 0;
            EntryKind::File {
                content: Content::Beneath {
                    root: root.to_path_buf(),
                    rel: PathBuf::from(&rel),
                },
                executable,
            }
        } else {
            return Err(Error::SpecialFile {
                path,
                kind: special_kind(&kind),
            });
        };
        tree.entries.insert(rel, entry);
    }
    Ok(())
}

fn special_kind(kind: &fs::FileType) -> &'static str {
    if kind.is_block_device() || kind.is_char_device() {
        "device file"
    } else if kind.is_fifo() {
        "named pipe"
    } else if kind.is_socket() {
        "socket"
    } else {
        "special file"
    }
}

/// A link at relative path `rel` may point anywhere inside the tree: it is resolved through
/// the real tree (other links included, [`rootpath::resolve_beneath`]), and an absolute
/// target or any climb above the root is refused. A loop leaves nothing and is kept.
fn check_link(root: &Path, rel: &str, target: &Path, path: &Path) -> Result<(), Error> {
    match rootpath::resolve_beneath(root, Path::new(rel), Last::Follow) {
        Ok(_) | Err(rootpath::Error::SymlinkLoop(_)) => Ok(()),
        Err(rootpath::Error::Io { path, source }) => Err(Error::Io(crate::io_error::IoError {
            action: "reading",
            path,
            source,
        })),
        Err(_) => Err(Error::EscapingSymlink {
            path: path.to_path_buf(),
            target: target.to_path_buf(),
            root: root.to_path_buf(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn rules() -> WalkRules {
        WalkRules {
            exclude: vec!["node_modules".into()],
            never: vec![".npmrc".into()],
            ignore_file: true,
            absolute_links: false,
            ..WalkRules::default()
        }
    }

    #[test]
    fn a_tree_pays_for_its_entries_and_their_number_is_capped() {
        let dir = tempfile::tempdir().unwrap();
        // 300 empty directories and links: nothing against a byte cap that counts contents.
        for i in 0..150 {
            fs::create_dir(dir.path().join(format!("d{i}"))).unwrap();
            symlink(format!("d{i}"), dir.path().join(format!("l{i}"))).unwrap();
        }
        fs::write(dir.path().join("f"), vec![0; 1000]).unwrap();
        let walk = |budget: super::super::budget::Budget| {
            walk(dir.path(), &WalkRules { budget, ..rules() })
        };
        use super::super::budget::{Budget, ENTRY_COST};
        assert_eq!(
            walk(Budget::new(301 * ENTRY_COST + 1000))
                .unwrap()
                .entries
                .len(),
            301
        );
        let err = walk(Budget::new(300 * ENTRY_COST + 1000)).unwrap_err();
        assert!(
            matches!(err, Error::TooLarge { limit, .. } if limit == 300 * ENTRY_COST + 1000),
            "{err}"
        );
        let err = walk(Budget::new(u64::MAX).max_entries(300)).unwrap_err();
        assert!(
            matches!(err, Error::TooManyEntries { limit: 300, .. }),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("more than 300 files, directories and links")
        );
    }

    #[test]
    fn ignore_rules_and_secrets_are_applied() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("node_modules/x")).unwrap();
        fs::create_dir_all(root.join("lib/tmp")).unwrap();
        for f in [
            "handler.js",
            ".npmrc",
            "lib/a.js",
            "lib/tmp/scratch",
            "lib/.npmrc",
            "notes.md",
        ] {
            fs::write(root.join(f), "x").unwrap();
        }
        fs::write(root.join(IGNORE_FILE), "*.md\nlib/tmp/\n").unwrap();
        symlink("lib/a.js", root.join("alias.js")).unwrap();
        let tree = walk(root, &rules()).unwrap();
        let paths: Vec<_> = tree.entries.keys().cloned().collect();
        assert_eq!(paths, ["alias.js", "handler.js", "lib", "lib/a.js"]);
    }

    #[test]
    fn a_kilnignore_that_links_out_of_the_tree_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let (root, outside) = (dir.path().join("fn"), dir.path().join("config.json"));
        fs::create_dir_all(&root).unwrap();
        fs::write(
            &outside,
            "{\"auths\": {\"r\": {\"auth\": \"c2VjcmV0[\"}}}\n",
        )
        .unwrap();
        symlink(&outside, root.join(IGNORE_FILE)).unwrap();
        let err = walk(&root, &rules()).unwrap_err();
        assert!(matches!(err, Error::Io(_)), "{err:?}");
        assert!(!format!("{err:#}").contains("c2VjcmV0"), "{err:#}");
        // One that links inside the tree is read.
        fs::remove_file(root.join(IGNORE_FILE)).unwrap();
        fs::write(root.join("shared-ignore"), "*.md\n").unwrap();
        fs::write(root.join("notes.md"), "x").unwrap();
        symlink("shared-ignore", root.join(IGNORE_FILE)).unwrap();
        let tree = walk(&root, &rules()).unwrap();
        assert!(!tree.entries.contains_key("notes.md"));
    }

    #[test]
    fn escaping_symlinks_are_refused() {
        for target in ["../outside", "/etc/passwd", "sub/../../x"] {
            let dir = tempfile::tempdir().unwrap();
            symlink(target, dir.path().join("link")).unwrap();
            let err = walk(dir.path(), &rules()).unwrap_err();
            assert!(
                matches!(err, Error::EscapingSymlink { .. }),
                "{target}: {err}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("sub")).unwrap();
        symlink("../handler.js", dir.path().join("sub/link")).unwrap();
        walk(dir.path(), &rules()).unwrap();
    }

    #[test]
    fn links_are_resolved_through_the_real_tree() {
        // Each link alone stays lexically inside; `e` through `d/up` climbs out.
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("fn");
        fs::create_dir_all(root.join("d")).unwrap();
        fs::write(dir.path().join("host-secret"), "secret").unwrap();
        symlink("..", root.join("d/up")).unwrap();
        symlink("d/up/d/up/../host-secret", root.join("e")).unwrap();
        let err = walk(&root, &rules()).unwrap_err();
        assert!(
            matches!(&err, Error::EscapingSymlink { path, .. } if path.ends_with("e")),
            "{err}"
        );
        // Links through links that stay inside, and loops, are kept as links.
        fs::remove_file(root.join("e")).unwrap();
        symlink("d/up/d", root.join("ok")).unwrap();
        symlink("l2", root.join("l1")).unwrap();
        symlink("l1", root.join("l2")).unwrap();
        let tree = walk(&root, &rules()).unwrap();
        assert!(matches!(tree.entries["ok"], EntryKind::Symlink(_)));
    }

    #[test]
    fn a_link_swapped_in_after_the_walk_is_not_read_into_the_layer() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("fn");
        fs::create_dir_all(root.join("lib")).unwrap();
        fs::write(root.join("handler.js"), "x").unwrap();
        fs::write(root.join("lib/a.js"), "y").unwrap();
        fs::write(dir.path().join("host-secret"), "secret").unwrap();
        let tree = walk(&root, &rules()).unwrap();
        // A concurrent writer swaps a file, and a directory, for links out of the tree.
        fs::remove_file(root.join("handler.js")).unwrap();
        symlink("../host-secret", root.join("handler.js")).unwrap();
        for swapped in [false, true] {
            if swapped {
                fs::remove_file(root.join("handler.js")).unwrap();
                fs::write(root.join("handler.js"), "x").unwrap();
                fs::rename(root.join("lib"), dir.path().join("lib")).unwrap();
                symlink("../lib", root.join("lib")).unwrap();
            }
            let out = tempfile::tempdir().unwrap();
            let err = crate::oci::layer::write_layer(
                tree.to_layer_entries("app"),
                0,
                crate::oci::MediaType::OciLayerGzip,
                out.path(),
            )
            .unwrap_err();
            assert!(
                err.to_string()
                    .contains(if swapped { "a.js" } else { "handler.js" }),
                "{err}"
            );
        }
    }

    #[test]
    fn special_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(dir.path().join("s.sock")).unwrap();
        let err = walk(dir.path(), &rules()).unwrap_err();
        assert!(err.to_string().contains("is a socket"), "{err}");
    }
}
