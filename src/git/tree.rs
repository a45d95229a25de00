//! Writes a tree from the object database into a fresh directory, without gix's worktree
//! checkout: every entry name is checked (no `/`, `..`, NUL or `.git`), every file, directory
//! and symlink is created relative to a directory handle kiln created itself with
//! `O_NOFOLLOW|O_EXCL`, so nothing is ever written through a symlink, and submodules are
//! skipped with a warning. Whether symlinks stay inside the Function is the source walk's
//! business, as for a directory build.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::Path;

use gix::ObjectId;
use gix::objs::tree::EntryKind;
use rustix::fs::{Mode, OFlags};

use super::{BaseDir, Error, Fetched, RemoteUrl};
use crate::io_error::IoContext as _;

/// Deeper trees are refused: no Function needs them, and recursion must stay bounded.
const MAX_DEPTH: usize = 64;
/// More entries are refused, so a hostile repository cannot fill the disk with tiny files.
const MAX_ENTRIES: usize = 100_000;
/// The most bytes of file contents written: what `kiln run` unpacks of a whole image (8 GiB,
/// `oci::budget::DEFAULT_BYTES`, a layer above this one). The download is capped, but a blob
/// compresses well (a GiB of zeros is a MiB), and one blob may be named by every entry.
const MAX_BYTES: u64 = 8 << 30;

/// Writes the tree at `base_dir` of `commit` into `dest`, which must not exist yet.
pub(super) fn write_base_dir(
    repo: &gix::Repository,
    url: &RemoteUrl,
    commit: ObjectId,
    base_dir: &BaseDir,
    dest: &Path,
) -> Result<Fetched, Error> {
    write_capped(repo, url, commit, (base_dir, dest), MAX_BYTES)
}

/// [`write_base_dir`] with `max_bytes` of file contents at most.
fn write_capped(
    repo: &gix::Repository,
    url: &RemoteUrl,
    commit: ObjectId,
    (base_dir, dest): (&BaseDir, &Path),
    max_bytes: u64,
) -> Result<Fetched, Error> {
    let mut writer = Writer {
        repo,
        url,
        commit: commit.to_hex().to_string(),
        files: 0,
        entries: 0,
        bytes: 0,
        max_bytes,
        skipped_submodules: Vec::new(),
    };
    let mut tree = repo
        .find_commit(commit)
        .and_then(|c| c.tree_id())
        .map_err(|e| writer.object_error(e))?
        .detach();
    for name in base_dir.components() {
        let entries = writer.entries_of(tree)?;
        match entries.into_iter().find(|(n, _, _)| n == name.as_bytes()) {
            Some((_, EntryKind::Tree, id)) => tree = id,
            _ => {
                return Err(Error::MissingBaseDir {
                    url: url.to_string(),
                    commit: writer.commit,
                    base_dir: base_dir.to_string(),
                });
            }
        }
    }
    std::fs::create_dir(dest).at("creating", dest)?;
    let root = rustix::fs::open(dest, dir_flags(), Mode::empty()).at("opening", dest)?;
    let prefix = base_dir.components().join("/");
    writer.write_tree(tree, &root, &prefix, 0)?;
    Ok(Fetched {
        commit: writer.commit,
        files: writer.files,
        skipped_submodules: writer.skipped_submodules,
    })
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

struct Writer<'a> {
    repo: &'a gix::Repository,
    url: &'a RemoteUrl,
    commit: String,
    files: usize,
    entries: usize,
    /// File contents written so far (sizes from the object headers, before any is read).
    bytes: u64,
    /// The most [`Writer::bytes`] may reach.
    max_bytes: u64,
    skipped_submodules: Vec<String>,
}

impl Writer<'_> {
    fn write_tree(
        &mut self,
        tree: ObjectId,
        dir: &OwnedFd,
        path: &str,
        depth: usize,
    ) -> Result<(), Error> {
        if depth > MAX_DEPTH {
            return Err(self.unsafe_entry(path, "the tree is nested too deeply"));
        }
        for (name, kind, id) in self.entries_of(tree)? {
            let child = join(path, &String::from_utf8_lossy(&name));
            self.entries += 1;
            if self.entries > MAX_ENTRIES {
                return Err(self.unsafe_entry(&child, "the tree has too many entries"));
            }
            let name = check_name(&name).map_err(|problem| self.unsafe_entry(&child, problem))?;
            let io = |action: &'static str| {
                let child = child.clone();
                move |e: rustix::io::Errno| {
                    Error::Io(crate::io_error::IoError {
                        action,
                        path: child.into(),
                        source: e.into(),
                    })
                }
            };
            match kind {
                EntryKind::Tree => {
                    rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o755))
                        .map_err(io("creating the directory"))?;
                    let sub = rustix::fs::openat(dir, name, dir_flags(), Mode::empty())
                        .map_err(io("opening the directory"))?;
                    self.write_tree(id, &sub, &child, depth + 1)?;
                }
                EntryKind::Blob | EntryKind::BlobExecutable => {
                    let mode = if kind == EntryKind::BlobExecutable {
                        0o755
                    } else {
                        0o644
                    };
                    let flags = OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC;
                    let size = self
                        .repo
                        .find_header(id)
                        .map_err(|e| self.object_error(e))?
                        .size();
                    self.bytes = self.bytes.saturating_add(size);
                    if self.bytes > self.max_bytes {
                        let problem = "its files hold more than 8 GiB, what kiln run unpacks";
                        return Err(self.unsafe_entry(&child, problem));
                    }
                    let fd = rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(mode))
                        .map_err(io("creating"))?;
                    let data = self.blob(id)?;
                    std::fs::File::from(fd)
                        .write_all(&data)
                        .at("writing", &child)?;
                    self.files += 1;
                }
                EntryKind::Link => {
                    let target = self.blob(id)?;
                    let target = std::str::from_utf8(&target)
                        .ok()
                        .filter(|t| !t.is_empty() && !t.contains('\0'))
                        .ok_or_else(|| {
                            self.unsafe_entry(&child, "its symlink target is empty or not UTF-8")
                        })?;
                    rustix::fs::symlinkat(target, dir, name).map_err(io("creating the symlink"))?;
                }
                EntryKind::Commit => {
                    tracing::warn!(
                        path = %child,
                        "skipping a git submodule: kiln does not fetch submodules",
                    );
                    self.skipped_submodules.push(child);
                }
            }
        }
        Ok(())
    }

    /// A tree's entries: name, kind, object id.
    fn entries_of(&self, tree: ObjectId) -> Result<Vec<(Vec<u8>, EntryKind, ObjectId)>, Error> {
        let tree = self
            .repo
            .find_tree(tree)
            .map_err(|e| self.object_error(e))?;
        let decoded = tree.decode().map_err(|e| self.object_error(e))?;
        Ok(decoded
            .entries
            .iter()
            .map(|e| (e.filename.to_vec(), e.mode.kind(), e.oid.to_owned()))
            .collect())
    }

    fn blob(&self, id: ObjectId) -> Result<Vec<u8>, Error> {
        let blob = self.repo.find_blob(id).map_err(|e| self.object_error(e))?;
        Ok(blob.detach().data)
    }

    fn object_error(&self, e: impl Into<gix::Error>) -> Error {
        Error::Remote {
            action: "reading the objects fetched from",
            url: self.url.to_string(),
            source: Box::new(e.into()),
        }
    }

    fn unsafe_entry(&self, path: &str, problem: &'static str) -> Error {
        Error::UnsafeEntry {
            url: self.url.to_string(),
            commit: self.commit.clone(),
            path: path.to_string(),
            problem,
        }
    }
}

fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

/// A tree entry name kiln writes: one plain path component.
fn check_name(name: &[u8]) -> Result<&str, &'static str> {
    let name = std::str::from_utf8(name).map_err(|_| "its name is not valid UTF-8")?;
    if name.is_empty() || name == "." || name == ".." {
        return Err("its name is empty, . or ..");
    }
    if name.contains('/') || name.contains('\0') {
        return Err("its name contains / or NUL");
    }
    if name.eq_ignore_ascii_case(".git") {
        return Err("a repository may not contain a .git entry");
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_whose_files_hold_more_than_the_cap_is_refused_before_it_is_written() {
        // One blob that compresses to nothing, named twice: 2 MiB to write, in 4 KiB packed.
        let dir = tempfile::tempdir().unwrap();
        let repo_dir = dir.path().join("repo");
        std::fs::create_dir(&repo_dir).unwrap();
        std::fs::write(repo_dir.join("a"), vec![0u8; 1 << 20]).unwrap();
        std::fs::write(repo_dir.join("b"), vec![0u8; 1 << 20]).unwrap();
        let git = |args: &[&str]| {
            let out = std::process::Command::new("git")
                .args(["-c", "user.name=t", "-c", "user.email=t@t", "-C"])
                .arg(&repo_dir)
                .args(args)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        git(&["init", "-q"]);
        git(&["add", "."]);
        git(&["commit", "-q", "-m", "bomb"]);
        let repo = gix::open(&repo_dir).unwrap();
        let commit = repo.head_id().unwrap().detach();
        let url = RemoteUrl::parse("https://git.example/fn.git").unwrap();
        let root = BaseDir::parse("/").unwrap();
        let write = |dest: &str, cap: u64| {
            write_capped(&repo, &url, commit, (&root, &dir.path().join(dest)), cap)
        };
        let err = write("small", (1 << 20) + 100).unwrap_err();
        assert!(
            matches!(err, Error::UnsafeEntry { ref path, .. } if path == "b"),
            "{err:?}"
        );
        assert_eq!(write("enough", 2 << 20).unwrap().files, 2);
    }

    #[test]
    fn entry_names_are_single_plain_components() {
        assert_eq!(check_name(b"handler.js"), Ok("handler.js"));
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0b", b".GIT", b"\xff"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
