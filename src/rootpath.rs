//! One policy for paths inside a root directory, used by every unpacker (image layers under
//! `kiln run` and `--builder-image`, Debian packages, npm tarballs), by the sandboxes' mounts
//! and by source collection. The policy:
//!
//! - **A root filesystem resolves as the kernel resolves it for a process whose root it is**
//!   ([`resolve`]): symlinks are followed by hand, an absolute target starts again at the root
//!   and `..` at the root stays there — `openat2(RESOLVE_IN_ROOT)` semantics, as containerd's
//!   `fs.RootPath`. A resolved path therefore never names anything outside the root.
//! - **A source tree is not a root** ([`resolve_beneath`]): a Function directory is read on
//!   the host, where its links mean what they say. A link that is absolute, or whose
//!   resolution (through the real tree, other links included) climbs above the tree, leaves
//!   it and is refused.
//! - **Archive member names** ([`member`]) are cleaned as GNU tar and containerd clean them:
//!   leading `/` and `./`, and `.` components, are dropped and `a/../b` folds; the root itself
//!   becomes the empty path. A name that climbs above the root is refused.
//! - **An archive never writes through a symlink it created itself**: the unpackers keep the
//!   links an archive made and pass them as `own` to [`resolve_for`], which refuses a later
//!   member whose path goes through one (`evil -> /` then `evil/etc/x`, the tar-slip shape;
//!   GNU tar defers its symlinks for the same reason). Links from lower layers or earlier
//!   packages are followed inside the root, as merged-/usr images need.
//! - The last component is never followed when writing: files are created with `O_EXCL`
//!   after whatever was there is removed, so a planted link is replaced, not written through.
//!
//! The directories kiln unpacks into are private staging directories no sandboxed process
//! sees while kiln works, so checking with `lstat` and then creating is not racy there. A
//! source tree is not private — CI checks out whatever a pull request holds and a concurrent
//! process may change it — so its files are opened with [`open_beneath`], which lets the
//! kernel refuse any symlink on the way.

use std::collections::{HashSet, VecDeque};
use std::ffi::OsString;
use std::fs::File;
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
    /// An archive member name climbs above the root.
    #[error("{0:?} climbs above the root with ..")]
    AboveRoot(PathBuf),
    /// In a source tree: an absolute link, or a resolution that climbs above the tree.
    #[error("{path:?} leaves the directory through symlink {link:?}")]
    Leaves {
        /// The path being resolved.
        path: PathBuf,
        /// The link (relative to the tree) whose target leaves it.
        link: PathBuf,
    },
    /// The path goes through a symlink the same archive created.
    #[error(
        "{path:?} goes through the symlink {link:?} that the same archive created; an archive \
         may not write through its own links"
    )]
    ThroughOwnLink {
        /// The path being resolved.
        path: PathBuf,
        /// The link, relative to the root.
        link: PathBuf,
    },
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

/// Cleans an archive member name (or a hard link's target name) into a path relative to the
/// root: `/`, `./` and `.` dropped, `a/../b` folded. The root itself becomes the empty path.
///
/// # Errors
/// [`Error::AboveRoot`] when a `..` would climb above the root.
pub fn member(name: &Path) -> Result<PathBuf, Error> {
    let mut out = PathBuf::new();
    for component in name.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                if !out.pop() {
                    return Err(Error::AboveRoot(name.to_path_buf()));
                }
            }
        }
    }
    Ok(out)
}

/// Resolves `path` (relative to `root`, or absolute as seen inside it) to a host path under
/// `root` with chroot semantics. Components that do not exist are taken literally.
///
/// # Errors
/// [`Error::SymlinkLoop`], or [`Error::Io`] when `lstat` fails other than with "not found".
pub fn resolve(root: &Path, path: &Path, last: Last) -> Result<PathBuf, Error> {
    resolve_for(root, path, last, &HashSet::new())
}

/// [`resolve`] for an archive member: a symlink in `own` (host paths of the links this archive
/// created) is not followed but refused.
///
/// # Errors
/// As [`resolve`], and [`Error::ThroughOwnLink`].
pub fn resolve_for(
    root: &Path,
    path: &Path,
    last: Last,
    own: &HashSet<PathBuf>,
) -> Result<PathBuf, Error> {
    walk(root, path, last, Bound::Root, own)
}

/// Resolves `path` (relative) inside a source tree: absolute links and any climb above `root`
/// are refused.
///
/// # Errors
/// [`Error::Leaves`], [`Error::SymlinkLoop`], [`Error::Io`].
pub fn resolve_beneath(root: &Path, path: &Path, last: Last) -> Result<PathBuf, Error> {
    walk(root, path, last, Bound::Tree, &HashSet::new())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Bound {
    /// `..` at the root stays at the root; absolute links restart there.
    Root,
    /// Leaving the tree is an error.
    Tree,
}

fn walk(
    root: &Path,
    path: &Path,
    last: Last,
    bound: Bound,
    own: &HashSet<PathBuf>,
) -> Result<PathBuf, Error> {
    let mut todo: VecDeque<OsString> = components(path);
    let mut done: Vec<OsString> = Vec::new();
    let mut links = 0;
    // The link whose target is being walked, for the error when it leaves the tree.
    let mut via: Option<PathBuf> = None;
    let leaves = |link: Option<PathBuf>| Error::Leaves {
        path: path.to_path_buf(),
        link: link.unwrap_or_else(|| path.to_path_buf()),
    };
    if bound == Bound::Tree && path.is_absolute() {
        return Err(leaves(None));
    }
    while let Some(name) = todo.pop_front() {
        if name == ".." {
            if done.pop().is_none() && bound == Bound::Tree {
                return Err(leaves(via));
            }
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
        let rel: PathBuf = done.iter().chain([&name]).collect();
        if own.contains(&candidate) {
            return Err(Error::ThroughOwnLink {
                path: path.to_path_buf(),
                link: rel,
            });
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
            if bound == Bound::Tree {
                return Err(leaves(Some(rel)));
            }
            done.clear();
        }
        via = Some(rel);
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

/// Opens the regular file at `rel` under `root` for reading without following any symlink on
/// the way or at the end (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`; on kernels
/// without it, one `O_NOFOLLOW` open per component). A link swapped in after a walk makes
/// this fail with `ELOOP` or `ENOTDIR` rather than read what it points at.
///
/// # Errors
/// Whatever the opens return; [`io::ErrorKind::InvalidInput`] when `rel` is not a plain
/// relative path or names something other than a regular file.
pub fn open_beneath(root: &Path, rel: &Path) -> io::Result<File> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a plain relative path", rel.display()),
        ));
    }
    let dir = rustix::fs::open(
        root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let read = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY;
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    let fd = match rustix::fs::openat2(&dir, rel, read | OFlags::NONBLOCK, Mode::empty(), resolve) {
        Err(rustix::io::Errno::NOSYS) => {
            let mut dir = dir;
            let mut parts = rel.components().peekable();
            loop {
                let Some(part) = parts.next() else {
                    unreachable!("a plain relative path has a last component");
                };
                if parts.peek().is_none() {
                    break rustix::fs::openat(
                        &dir,
                        part.as_os_str(),
                        read | OFlags::NONBLOCK,
                        Mode::empty(),
                    )?;
                }
                let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                dir = rustix::fs::openat(&dir, part.as_os_str(), flags, Mode::empty())?;
            }
        }
        other => other?,
    };
    let file = File::from(fd);
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", rel.display()),
        ));
    }
    Ok(file)
}

/// Reads the file at `rel` in the source tree `root`: links inside the tree are followed
/// ([`resolve_beneath`]), one that leaves it is an error, and the file is then opened with
/// [`open_beneath`], so nothing outside the tree is ever read.
///
/// At most `limit` bytes are read: a larger file is an error, never held whole.
///
/// # Errors
/// [`io::ErrorKind::NotFound`] when nothing is there; [`io::ErrorKind::PermissionDenied`]
/// when a link leaves the tree; [`io::ErrorKind::FileTooLarge`] past `limit`; other open and
/// read errors.
pub fn read_beneath(root: &Path, rel: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let resolved = resolve_beneath(root, rel, Last::Follow).map_err(|e| match e {
        Error::Io { source, .. } => source,
        other => io::Error::new(io::ErrorKind::PermissionDenied, other.to_string()),
    })?;
    let inside = resolved.strip_prefix(root).unwrap_or(&resolved);
    read_to_limit(open_beneath(root, inside)?, limit)
}

/// All of `reader` when it holds at most `limit` bytes; never more than `limit + 1` of it
/// read.
///
/// # Errors
/// [`io::ErrorKind::FileTooLarge`] past `limit`; read errors.
pub fn read_to_limit(reader: impl io::Read, limit: u64) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    io::Read::read_to_end(&mut reader.take(limit.saturating_add(1)), &mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("it is over {limit} bytes, the most kiln reads of it"),
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
#[path = "rootpath_tests.rs"]
mod tests;
