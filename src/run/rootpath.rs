//! Paths inside an unpacked root filesystem, resolved the way the sandboxed process will see
//! them: symlinks (absolute or relative, with `..`) are followed with the root directory as
//! `/`, so a resolved path never leaves the root (like `filepath-securejoin`). Only lexical
//! work and `lstat`/`readlink`; nothing here writes.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io;
use std::path::{Component, Path, PathBuf};

/// How many symlinks one resolution may follow (Linux's `MAXSYMLINKS`).
const MAX_SYMLINKS: usize = 40;

/// Whether the last component of a path is followed when it is a symlink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Last {
    /// Follow it (reading a file through a link).
    Follow,
    /// Keep it (replacing, deleting or linking to the entry itself).
    Keep,
}

/// Why a path cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The path is absolute or has a `..` component.
    #[error("path {0:?} is absolute or leaves its directory with ..")]
    Unsafe(PathBuf),
    /// Too many symlinks (a loop).
    #[error("too many levels of symbolic links resolving {0:?}")]
    SymlinkLoop(PathBuf),
    /// `lstat` or `readlink` failed.
    #[error("resolving {path:?}")]
    Io {
        /// The host path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// Checks an archive path: relative, without `..`; `.` components and a leading `./` dropped.
/// The root itself (`./`) becomes the empty path.
///
/// # Errors
/// [`Error::Unsafe`] for absolute paths and `..` components.
pub fn clean(path: &Path) -> Result<PathBuf, Error> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(name) => out.push(name),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(Error::Unsafe(path.to_path_buf()));
            }
        }
    }
    Ok(out)
}

/// Resolves `path` (relative to `root`, as produced by [`clean`], or absolute as seen inside
/// the sandbox) to a host path under `root`, following symlinks inside the root. Components
/// that do not exist are taken literally.
///
/// # Errors
/// [`Error::SymlinkLoop`], or [`Error::Io`] when `lstat` fails other than with "not found".
pub fn resolve(root: &Path, path: &Path, last: Last) -> Result<PathBuf, Error> {
    let mut todo: VecDeque<OsString> = components(path);
    let mut done: Vec<OsString> = Vec::new();
    let mut links = 0;
    while let Some(name) = todo.pop_front() {
        if name == ".." {
            done.pop();
            continue;
        }
        let candidate = join(root, &done).join(&name);
        if todo.is_empty() && last == Last::Keep {
            done.push(name);
            break;
        }
        let meta = match candidate.symlink_metadata() {
            Ok(meta) => meta,
            Err(e) if is_missing(&e) => {
                done.push(name);
                continue;
            }
            Err(source) => {
                return Err(Error::Io {
                    path: candidate,
                    source,
                });
            }
        };
        if !meta.file_type().is_symlink() {
            done.push(name);
            continue;
        }
        links += 1;
        if links > MAX_SYMLINKS {
            return Err(Error::SymlinkLoop(path.to_path_buf()));
        }
        let target = candidate.read_link().map_err(|source| Error::Io {
            path: candidate.clone(),
            source,
        })?;
        if target.is_absolute() {
            done.clear();
        }
        for part in components(&target).into_iter().rev() {
            todo.push_front(part);
        }
    }
    Ok(join(root, &done))
}

/// The components of `path` as names, `..` kept, `/` and `.` dropped.
fn components(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect()
}

fn join(root: &Path, parts: &[OsString]) -> PathBuf {
    let mut out = root.to_path_buf();
    out.extend(parts);
    out
}

/// Whether an I/O error means "nothing there" (including a file used as a directory).
pub fn is_missing(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn clean_rejects_absolute_and_parent_paths_and_drops_dots() {
        assert_eq!(clean(Path::new("./a/./b")).unwrap(), Path::new("a/b"));
        assert_eq!(clean(Path::new("./")).unwrap(), Path::new(""));
        assert!(matches!(clean(Path::new("/etc")), Err(Error::Unsafe(_))));
        assert!(matches!(
            clean(Path::new("a/../../b")),
            Err(Error::Unsafe(_))
        ));
    }

    #[test]
    fn symlinks_resolve_inside_the_root_never_outside() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("usr/lib")).unwrap();
        symlink("usr/lib", root.join("lib")).unwrap();
        symlink("/usr/lib", root.join("abs")).unwrap();
        symlink("../../../../etc", root.join("usr/lib/up")).unwrap();
        symlink("loop", root.join("loop")).unwrap();
        let r = |p: &str, last| resolve(root, Path::new(p), last).unwrap();
        assert_eq!(r("lib/x", Last::Follow), root.join("usr/lib/x"));
        assert_eq!(r("abs/x", Last::Follow), root.join("usr/lib/x"));
        assert_eq!(
            r("usr/lib/up/passwd", Last::Follow),
            root.join("etc/passwd")
        );
        assert_eq!(r("/lib", Last::Keep), root.join("lib"));
        assert_eq!(r("lib", Last::Follow), root.join("usr/lib"));
        assert_eq!(r("missing/a/b", Last::Follow), root.join("missing/a/b"));
        assert!(matches!(
            resolve(root, Path::new("loop/x"), Last::Follow),
            Err(Error::SymlinkLoop(_))
        ));
    }
}
