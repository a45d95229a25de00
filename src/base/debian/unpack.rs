//! Unpacking a .deb's `data.tar.{xz,gz,zst}` into a root filesystem directory the way dpkg
//! would without running maintainer scripts: merged-/usr aware, modes, symlinks and hard links
//! kept, ownership not preserved. Every entry is placed by the one policy of
//! [`crate::rootpath`], so no entry (absolute, `..`, or through a symlink) can write outside
//! the root, and no entry goes through a symlink its own package made.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tar::EntryType;
use tracing::{debug, warn};

use super::{Error, Result};
use crate::rootpath::{self, Last};

/// The merged-/usr links every Debian root has since bookworm (`/bin -> usr/bin`, …).
const MERGED_USR: [(&str, &str); 4] = [
    ("bin", "usr/bin"),
    ("lib", "usr/lib"),
    ("lib64", "usr/lib64"),
    ("sbin", "usr/sbin"),
];

/// Creates `usr/{bin,lib,lib64,sbin}` and the `bin lib lib64 sbin -> usr/…` links in `rootfs`.
/// Run it before unpacking: trixie packages ship only under `/usr`, yet ELF interpreters are
/// looked up at `/lib64`. Idempotent.
///
/// # Errors
/// [`Error::MergedUsr`] when a real file or directory is at a link's place.
pub fn merged_usr_links(rootfs: &Path) -> Result<()> {
    for (link, target) in MERGED_USR {
        let dir = rootfs.join(target);
        fs::create_dir_all(&dir).map_err(Error::io("creating directory", &dir))?;
        let path = rootfs.join(link);
        match fs::symlink_metadata(&path) {
            Ok(meta)
                if meta.is_symlink()
                    && fs::read_link(&path).ok().as_deref() == Some(Path::new(target)) => {}
            Ok(_) => return Err(Error::MergedUsr { path }),
            Err(_) => symlink(target, &path).map_err(Error::io("creating symlink", &path))?,
        }
    }
    Ok(())
}

/// Unpacks the data member of the .deb at `deb` into `rootfs` and returns the root-relative
/// paths it wrote, in archive order. A directory entry whose destination is a symlink to a
/// directory is skipped (as dpkg does); a file that another package already wrote is replaced
/// with a warning. Blocking file I/O: async callers run it in `spawn_blocking`.
///
/// # Errors
/// [`Error::DebFormat`] for a file without a data member, [`Error::UnsafeEntry`] for an entry
/// that would escape the root, [`Error::EntryConflict`] when a directory and a non-directory
/// collide, [`Error::Decompress`] and [`Error::Io`].
pub fn unpack_deb(deb: &Path, rootfs: &Path) -> Result<Vec<PathBuf>> {
    let file = File::open(deb).map_err(Error::io("opening", deb))?;
    let mut archive = ar::Archive::new(BufReader::new(file));
    while let Some(member) = archive.next_entry() {
        let member = member.map_err(|source| Error::Decompress {
            what: deb.display().to_string(),
            source,
        })?;
        let name = String::from_utf8_lossy(member.header().identifier()).into_owned();
        let name = name.trim_end_matches('/');
        let Some(compression) = name.strip_prefix("data.tar") else {
            continue;
        };
        let reader: Box<dyn Read + '_> = match compression {
            "" => Box::new(member),
            ".xz" => Box::new(liblzma::read::XzDecoder::new(member)),
            ".gz" => Box::new(flate2::read::GzDecoder::new(member)),
            ".zst" => Box::new(
                ruzstd::decoding::StreamingDecoder::new(member).map_err(|e| Error::Decompress {
                    what: format!("{} {name}", deb.display()),
                    source: io::Error::other(e),
                })?,
            ),
            _ => {
                return Err(Error::DebFormat {
                    deb: deb.to_path_buf(),
                    reason: "unknown data.tar compression",
                });
            }
        };
        let mut unpacker = Unpacker {
            deb,
            root: rootfs,
            written: Vec::new(),
            links: HashSet::new(),
        };
        unpacker.unpack_tar(reader, name)?;
        debug!(deb = %deb.display(), entries = unpacker.written.len(), "unpacked");
        return Ok(unpacker.written);
    }
    Err(Error::DebFormat {
        deb: deb.to_path_buf(),
        reason: "no data.tar member",
    })
}

struct Unpacker<'a> {
    deb: &'a Path,
    root: &'a Path,
    written: Vec<PathBuf>,
    /// Host paths of the symlinks this package made.
    links: HashSet<PathBuf>,
}

impl Unpacker<'_> {
    fn unpack_tar(&mut self, reader: impl Read, member: &str) -> Result<()> {
        let decompress = |source| Error::Decompress {
            what: format!("{} {member}", self.deb.display()),
            source,
        };
        let mut archive = tar::Archive::new(reader);
        for entry in archive.entries().map_err(decompress)? {
            self.unpack_entry(entry.map_err(decompress)?)?;
        }
        Ok(())
    }

    fn unpack_entry<R: Read>(&mut self, mut entry: tar::Entry<'_, R>) -> Result<()> {
        let raw = entry.path().map_err(|e| self.read_error(e))?.into_owned();
        let shown = raw.display().to_string();
        let names = rootpath::member(&raw).map_err(|e| self.unsafe_entry(&shown, e))?;
        if names.as_os_str().is_empty() {
            return Ok(()); // `./`, the root itself
        }
        let dest = rootpath::resolve_for(self.root, &names, Last::Keep, &self.links)
            .map_err(|e| self.unsafe_entry(&shown, e))?;
        let parent = dest.parent().unwrap_or(self.root);
        fs::create_dir_all(parent).map_err(Error::io("creating directory", parent))?;
        self.links.remove(&dest);
        let header = entry.header();
        let mode = header.mode().map_err(|e| self.read_error(e))? & 0o7777;
        let wrote = match header.entry_type() {
            EntryType::Directory => self.directory(&dest, &names, mode, &shown)?,
            EntryType::Regular | EntryType::Continuous => {
                let mtime = header.mtime().map_err(|e| self.read_error(e))?;
                self.make_room(&dest, &shown)?;
                write_file(&mut entry, &dest, mode, mtime)?;
                true
            }
            EntryType::Symlink => {
                let target = self.link_target(&entry, &shown)?;
                let made = self.symlink(&target, &dest, &shown)?;
                if made {
                    self.links.insert(dest.clone());
                }
                made
            }
            EntryType::Link => {
                let target = self.link_target(&entry, &shown)?;
                let names = rootpath::member(&target).map_err(|e| self.unsafe_entry(&shown, e))?;
                let source = rootpath::resolve_for(self.root, &names, Last::Keep, &self.links)
                    .map_err(|e| self.unsafe_entry(&shown, e))?;
                self.make_room(&dest, &shown)?;
                fs::hard_link(&source, &dest).map_err(Error::io("hard-linking", &dest))?;
                true
            }
            other => {
                debug!(entry = %shown, kind = ?other, "skipping special file");
                false
            }
        };
        if wrote {
            self.written.push(names);
        }
        Ok(())
    }

    /// Creates a directory entry, or skips it when a symlink to a directory is already there
    /// (a merged-/usr `lib -> usr/lib`, for example).
    fn directory(&self, dest: &Path, names: &Path, mode: u32, shown: &str) -> Result<bool> {
        match fs::symlink_metadata(dest) {
            Ok(meta) if meta.is_symlink() => {
                let target = rootpath::resolve(self.root, names, Last::Follow)
                    .map_err(|e| self.unsafe_entry(shown, e))?;
                if target.is_dir() {
                    return Ok(false);
                }
                Err(self.conflict(shown, "a symlink to a non-directory is in the way"))
            }
            Ok(meta) if meta.is_dir() => {
                set_mode(dest, mode)?;
                Ok(true)
            }
            Ok(_) => Err(self.conflict(shown, "a file is in the way of a directory")),
            Err(_) => {
                fs::create_dir(dest).map_err(Error::io("creating directory", dest))?;
                set_mode(dest, mode)?;
                Ok(true)
            }
        }
    }

    fn symlink(&self, target: &Path, dest: &Path, shown: &str) -> Result<bool> {
        match fs::symlink_metadata(dest) {
            Ok(meta) if meta.is_dir() => {
                warn!(
                    entry = %shown,
                    deb = %self.deb.display(),
                    "keeping the directory in place of a symlink",
                );
                return Ok(false);
            }
            Ok(meta)
                if meta.is_symlink() && fs::read_link(dest).ok().as_deref() == Some(target) =>
            {
                return Ok(true);
            }
            _ => self.make_room(dest, shown)?,
        }
        symlink(target, dest).map_err(Error::io("creating symlink", dest))?;
        Ok(true)
    }

    /// Clears `dest` for a non-directory: an existing file or symlink is removed with a
    /// warning (two packages shipping one path), a directory is a conflict.
    fn make_room(&self, dest: &Path, shown: &str) -> Result<()> {
        match fs::symlink_metadata(dest) {
            Ok(meta) if meta.is_dir() => Err(self.conflict(shown, "a directory is in the way")),
            Ok(_) => {
                warn!(
                    entry = %shown,
                    deb = %self.deb.display(),
                    "overwriting a file unpacked before",
                );
                fs::remove_file(dest).map_err(Error::io("removing", dest))
            }
            Err(_) => Ok(()),
        }
    }

    fn link_target<R: Read>(&self, entry: &tar::Entry<'_, R>, shown: &str) -> Result<PathBuf> {
        match entry.link_name().map_err(|e| self.read_error(e))? {
            Some(target) => Ok(target.into_owned()),
            None => Err(self.conflict(shown, "a link entry has no target")),
        }
    }

    fn read_error(&self, source: io::Error) -> Error {
        Error::Decompress {
            what: self.deb.display().to_string(),
            source,
        }
    }

    fn unsafe_entry(&self, entry: &str, source: rootpath::Error) -> Error {
        Error::UnsafeEntry {
            deb: self.deb.to_path_buf(),
            entry: entry.to_string(),
            source,
        }
    }

    fn conflict(&self, entry: &str, reason: &'static str) -> Error {
        Error::EntryConflict {
            deb: self.deb.to_path_buf(),
            entry: entry.to_string(),
            reason,
        }
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(Error::io("setting permissions of", path))
}

/// Writes a regular file with `create_new`, which never follows a symlink at `dest`.
fn write_file(content: &mut impl Read, dest: &Path, mode: u32, mtime: u64) -> Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dest)
        .map_err(Error::io("creating", dest))?;
    io::copy(content, &mut file).map_err(Error::io("writing", dest))?;
    file.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(Error::io("setting permissions of", dest))?;
    file.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(mtime))
        .map_err(Error::io("setting mtime of", dest))
}

#[cfg(test)]
#[path = "unpack_tests.rs"]
mod tests;
