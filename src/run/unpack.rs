//! Applies image layers (gzip, zstd or plain tar) in order to a root filesystem directory, with
//! OCI whiteouts (<https://github.com/opencontainers/image-spec/blob/main/layer.md#whiteouts>):
//! `.wh.NAME` deletes a lower entry, `.wh..wh..opq` clears a directory's lower contents.
//! Names and links follow the one policy of [`crate::rootpath`]: what containerd's applier
//! accepts is accepted (absolute and `./` names, a `/` entry, repeated entries, hard links to
//! earlier entries), and what would land outside the root is refused with the entry's name —
//! a name above the root, a write through a symlink the same layer made, a whiteout of `..`.
//! Unprivileged: no ownership or setuid/setgid bits; device nodes are refused, FIFOs skipped.
//! The bytes written are capped ([`Unpacker::with_limit`]), so a decompression bomb or a huge
//! sparse file stops at the cap instead of filling the disk.

use std::collections::{BTreeMap, HashSet};
use std::fs::{self, File, FileTimes, OpenOptions, Permissions};
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use flate2::read::MultiGzDecoder;
use tar::EntryType;

use crate::io_error::IoContext as _;
use crate::oci::budget::{Budget, Over};
use crate::oci::{ChunkReader, Digest, HashingReader};
use crate::rootpath::{self, Last, is_missing};

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";
/// Mode bits kept: permissions and sticky; setuid and setgid are dropped.
const MODE_MASK: u32 = 0o1777;

/// Errors applying a layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// File system trouble.
    #[error(transparent)]
    Io(#[from] crate::io_error::IoError),
    /// The tar stream is malformed.
    #[error("reading the layer archive")]
    Archive(#[source] io::Error),
    /// An entry's name or link target is unsafe, or symlinks loop.
    #[error("layer entry {name:?}")]
    Path {
        /// The entry's name as the archive gives it.
        name: PathBuf,
        /// What is wrong with it.
        #[source]
        source: rootpath::Error,
    },
    /// A whiteout whose hidden name is not a plain name (`.wh..`, `.wh...`).
    #[error("layer entry {0:?} is a whiteout of a name that is not a plain file name")]
    BadWhiteout(PathBuf),
    /// A device node.
    #[error(
        "layer entry {0:?} is a device node; kiln does not create devices (the sandbox brings \
         its own /dev)"
    )]
    Device(PathBuf),
    /// The layers unpack to more than the cap.
    #[error(
        "the image unpacks to more than {limit} bytes (at {name:?}); raise --max-unpacked-size \
         if the image is really that large"
    )]
    TooLarge {
        /// The cap.
        limit: u64,
        /// The entry that crossed it.
        name: PathBuf,
    },
    /// The layers hold more entries than the cap.
    #[error(
        "the image has more than {limit} entries (at {name:?}); kiln unpacks at most that many"
    )]
    TooManyEntries {
        /// The cap.
        limit: u64,
        /// The entry that crossed it.
        name: PathBuf,
    },
    /// A hard link points at nothing.
    #[error("hard link {path:?} points at {target:?}, which does not exist")]
    DanglingHardLink {
        /// The entry.
        path: PathBuf,
        /// Its target.
        target: PathBuf,
    },
    /// The zstd frame header is malformed.
    #[error("reading the zstd layer")]
    Zstd(#[source] ruzstd::decoding::errors::FrameDecoderError),
}

type Result<T, E = Error> = std::result::Result<T, E>;

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Error + use<> {
    crate::io_error::IoError::at(action, path)
}

/// The digests of an applied layer blob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// Of the blob as read (compressed).
    pub digest: Digest,
    /// Its size.
    pub size: u64,
    /// Of the uncompressed tar stream (the config's `diff_id`).
    pub diff_id: Digest,
}

/// Decompressed chunks in flight between the decoding thread and the writing one.
const PIPELINE_CHUNKS: usize = 8;
const CHUNK: usize = 256 * 1024;

/// The decoding half of [`Unpacker::apply`]: sends the plain stream in chunks (or the error
/// that ended it) and returns the digest and size of the compressed bytes, all read.
fn decompress(
    blob: impl Read,
    to: &std::sync::mpsc::SyncSender<io::Result<Vec<u8>>>,
) -> Result<(Digest, u64)> {
    let mut blob = BufReader::with_capacity(CHUNK, blob);
    let head = blob.fill_buf().map_err(Error::Archive)?;
    let gzip = head.starts_with(&[0x1f, 0x8b]);
    let zstd = head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]);
    let mut compressed = HashingReader::new(blob);
    let writer_stopped = {
        let mut plain: Box<dyn Read + '_> = if gzip {
            Box::new(MultiGzDecoder::new(&mut compressed))
        } else if zstd {
            match ruzstd::decoding::StreamingDecoder::new(&mut compressed) {
                Ok(decoder) => Box::new(decoder),
                Err(e) => {
                    let _ = to.send(Err(stopped()));
                    return Err(Error::Zstd(e));
                }
            }
        } else {
            Box::new(&mut compressed)
        };
        loop {
            let mut chunk = vec![0; CHUNK];
            let n = match read_full(&mut plain, &mut chunk) {
                Ok(n) => n,
                Err(e) => {
                    let _ = to.send(Err(stopped()));
                    return Err(Error::Archive(e));
                }
            };
            if n == 0 {
                break false;
            }
            chunk.truncate(n);
            if to.send(Ok(chunk)).is_err() {
                break true; // its error is the one to report: the digest is moot
            }
        }
    };
    if !writer_stopped {
        io::copy(&mut compressed, &mut io::sink()).map_err(Error::Archive)?;
    }
    Ok(compressed.finish())
}

/// What the writer reads when decoding failed (the decoder reports the cause).
fn stopped() -> io::Error {
    io::Error::other("the layer could not be decoded")
}

/// Reads until `buf` is full or the stream ends.
fn read_full(from: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match from.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// The default cap on the bytes a whole image may unpack to (file contents, and
/// [`ENTRY_COST`] per entry).
pub const DEFAULT_LIMIT: u64 = crate::oci::budget::DEFAULT_BYTES;

pub use crate::oci::budget::{ENTRY_COST, MAX_ENTRIES};

/// Applies layers, base first, to one root directory. Directory modes and times are set by
/// [`Unpacker::finish`], so directories stay writable while later layers change them.
#[derive(Debug)]
pub struct Unpacker {
    root: PathBuf,
    dirs: BTreeMap<PathBuf, (u32, SystemTime)>,
    /// File bytes and entries still allowed ([`crate::oci::budget`]).
    budget: Budget,
}

impl Unpacker {
    /// Unpacks into `root`, which must exist (normally empty), up to [`DEFAULT_LIMIT`] bytes.
    pub fn new(root: &Path) -> Unpacker {
        Unpacker::with_limit(root, DEFAULT_LIMIT)
    }

    /// Unpacks into `root` with at most `limit` bytes of file contents over all layers.
    pub fn with_limit(root: &Path, limit: u64) -> Unpacker {
        Unpacker {
            root: root.to_path_buf(),
            dirs: BTreeMap::new(),
            budget: Budget::new(limit),
        }
    }

    /// At most `entries` entries over all layers ([`MAX_ENTRIES`] unless told).
    pub fn max_entries(self, entries: u64) -> Unpacker {
        Unpacker {
            budget: self.budget.max_entries(entries),
            ..self
        }
    }

    /// What this unpacker holds besides the tree, to go on later from a copy of the tree
    /// ([`Unpacker::resume`]).
    pub fn pending(&self) -> Pending {
        let dirs = self
            .dirs
            .iter()
            .filter_map(|(path, (mode, mtime))| {
                let relative = path.strip_prefix(&self.root).ok()?;
                let since = mtime.duration_since(SystemTime::UNIX_EPOCH).ok()?;
                let name = relative.as_os_str().as_bytes().to_vec();
                Some((name, *mode, since.as_secs(), since.subsec_nanos()))
            })
            .collect();
        let (bytes, entries) = self.budget.used();
        Pending {
            dirs,
            bytes,
            entries,
        }
    }

    /// Goes on unpacking into `root`, a copy of the tree an unpacker left with `pending`,
    /// under the caps of [`Unpacker::with_limit`]; `None` when what was used already passes
    /// them (unpacking from scratch then names the entry that does).
    pub fn resume(root: &Path, limit: u64, pending: &Pending) -> Option<Unpacker> {
        let mut unpacker = Unpacker::with_limit(root, limit);
        unpacker
            .budget
            .charge(pending.bytes, pending.entries)
            .ok()?;
        for (name, mode, secs, nanos) in &pending.dirs {
            // The bytes came from this same host's paths.
            let name = std::ffi::OsStr::from_bytes(name);
            let mtime = SystemTime::UNIX_EPOCH + Duration::new(*secs, *nanos);
            unpacker.dirs.insert(root.join(name), (*mode, mtime));
        }
        Some(unpacker)
    }

    /// Charges one entry (its count and [`ENTRY_COST`] bytes) before anything of it is
    /// written.
    fn charge_entry(&mut self, name: &Path) -> Result<()> {
        self.budget.entry().map_err(|over| match over {
            Over::Entries(limit) => Error::TooManyEntries {
                limit,
                name: name.to_path_buf(),
            },
            Over::Bytes(limit) => Error::TooLarge {
                limit,
                name: name.to_path_buf(),
            },
        })
    }

    /// Applies one layer blob, detecting gzip and zstd by their magic bytes, and reads it to
    /// the end. A second thread decompresses (and hashes the compressed bytes) while this one
    /// writes the files; the writing is the larger half (the Node.js builder image on tmpfs:
    /// 1.59 s in one thread, 1.33 s in two).
    ///
    /// # Errors
    /// Unsafe entries, unsupported compression, malformed archives, file system errors.
    pub fn apply(&mut self, blob: impl Read + Send) -> Result<Applied> {
        std::thread::scope(|scope| {
            let (chunks, plain) = std::sync::mpsc::sync_channel(PIPELINE_CHUNKS);
            let decoder = scope.spawn(move || decompress(blob, &chunks));
            let mut plain = HashingReader::new(ChunkReader::new(plain));
            let applied = self.apply_tar(&mut plain).and_then(|()| {
                // The diff_id covers the whole stream, padding after the end-of-archive
                // included: a record's padding in a real archive, never megabytes.
                let limit = crate::tarmeter::WINDOW;
                let trailer = io::copy(&mut (&mut plain).take(limit + 1), &mut io::sink())
                    .map_err(Error::Archive)?;
                if trailer > limit {
                    return Err(Error::Archive(io::Error::other(format!(
                        "more than {} MiB follows the end of the archive; no option raises \
                         this: the layer is malformed or hostile",
                        limit >> 20
                    ))));
                }
                Ok(())
            });
            let diff_id = plain.finish().0; // and the decoder stops at its next chunk
            let decoded = decoder
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p));
            // A decoding error also ended the writer's stream; it is the cause to report.
            let (digest, size) = decoded?;
            applied?;
            Ok(Applied {
                digest,
                size,
                diff_id,
            })
        })
    }

    /// Sets the recorded directory modes and times, deepest first.
    ///
    /// # Errors
    /// When a directory's mode or time cannot be set.
    pub fn finish(self) -> Result<()> {
        let mut dirs: Vec<_> = self.dirs.into_iter().collect();
        dirs.sort_by_key(|(path, _)| std::cmp::Reverse(path.components().count()));
        for (path, (mode, mtime)) in dirs {
            match File::open(&path) {
                Ok(dir) => dir
                    .set_times(FileTimes::new().set_modified(mtime))
                    .at("setting the time of", &path)?,
                Err(e) if is_missing(&e) => continue,
                Err(e) => return Err(io_err("opening", &path)(e)),
            }
            fs::set_permissions(&path, Permissions::from_mode(mode))
                .at("setting the mode of", &path)?;
        }
        Ok(())
    }

    fn apply_tar(&mut self, stream: impl Read) -> Result<()> {
        let (stream, meter) = crate::tarmeter::metered(stream);
        let mut archive = tar::Archive::new(stream);
        // Host paths written by this layer: its whiteouts only hide lower layers' entries.
        let mut written: HashSet<PathBuf> = HashSet::new();
        // Symlinks this layer made: its later entries may not go through them.
        let mut links: HashSet<PathBuf> = HashSet::new();
        for entry in archive.entries().map_err(Error::Archive)? {
            let mut entry = entry.map_err(Error::Archive)?;
            meter.entry();
            let raw = entry.path().map_err(Error::Archive)?.into_owned();
            self.charge_entry(&raw)?;
            let path_err = |source| Error::Path {
                name: raw.clone(),
                source,
            };
            let name = rootpath::member(&raw).map_err(path_err)?;
            let Some(file_name) = name.file_name().and_then(|n| n.to_str()) else {
                continue; // the root directory itself
            };
            let dest =
                rootpath::resolve_for(&self.root, &name, Last::Keep, &links).map_err(path_err)?;
            let parent = dest.parent().unwrap_or(&self.root).to_path_buf();
            if file_name == OPAQUE {
                self.clear_dir(&parent, &written)?;
                continue;
            }
            if let Some(hidden) = file_name.strip_prefix(WHITEOUT) {
                if matches!(hidden, "" | "." | "..") {
                    return Err(Error::BadWhiteout(raw));
                }
                let target = parent.join(hidden);
                if !written.contains(&target) {
                    self.remove(&target)?;
                }
                continue;
            }
            fs::create_dir_all(&parent).at("creating directory", &parent)?;
            // What `write_entry` reads is file data.
            match meter.reading(|| self.write_entry(&mut entry, &raw, &dest, &links))? {
                Wrote::Nothing => {}
                Wrote::Link => {
                    links.insert(dest.clone());
                    written.insert(dest);
                }
                Wrote::Other => {
                    links.remove(&dest);
                    written.insert(dest);
                }
            }
        }
        Ok(())
    }

    /// Writes one entry at `dest`.
    fn write_entry<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        name: &Path,
        dest: &Path,
        links: &HashSet<PathBuf>,
    ) -> Result<Wrote> {
        let header = entry.header();
        let mode = header.mode().map_err(Error::Archive)? & MODE_MASK;
        let mtime =
            SystemTime::UNIX_EPOCH + Duration::from_secs(header.mtime().map_err(Error::Archive)?);
        match header.entry_type() {
            EntryType::Directory => {
                let is_dir = dest.symlink_metadata().is_ok_and(|m| m.is_dir());
                if !is_dir {
                    self.remove(dest)?;
                    fs::create_dir(dest).at("creating directory", dest)?;
                }
                self.dirs.insert(dest.to_path_buf(), (mode, mtime));
            }
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                self.remove(dest)?;
                let mut capped = Capped {
                    inner: entry,
                    budget: self.budget.bytes_left_mut(),
                    exceeded: false,
                };
                let wrote = write_file(&mut capped, dest, mode, mtime);
                if capped.exceeded {
                    return Err(Error::TooLarge {
                        limit: self.budget.byte_limit(),
                        name: name.to_path_buf(),
                    });
                }
                wrote?;
            }
            EntryType::Symlink => {
                let target = link_name(entry)?;
                self.remove(dest)?;
                symlink(&target, dest).at("creating symlink", dest)?;
                return Ok(Wrote::Link);
            }
            EntryType::Link => {
                let path_err = |source| Error::Path {
                    name: name.to_path_buf(),
                    source,
                };
                let target = rootpath::member(&link_name(entry)?).map_err(path_err)?;
                let source = rootpath::resolve_for(&self.root, &target, Last::Keep, links)
                    .map_err(path_err)?;
                if source.symlink_metadata().is_err() {
                    return Err(Error::DanglingHardLink {
                        path: name.to_path_buf(),
                        target,
                    });
                }
                self.remove(dest)?;
                fs::hard_link(&source, dest).at("creating hard link", dest)?;
            }
            EntryType::Char | EntryType::Block => return Err(Error::Device(name.to_path_buf())),
            other => {
                // FIFOs and the like need no privileges to skip and mean nothing in an image.
                tracing::debug!(path = %name.display(), kind = ?other, "skipping entry");
                return Ok(Wrote::Nothing);
            }
        }
        Ok(Wrote::Other)
    }

    /// Removes whatever is at `path` (a symlink itself, never its target), forgetting the
    /// modes recorded for directories under it; nothing there is fine.
    fn remove(&mut self, path: &Path) -> Result<()> {
        let meta = match path.symlink_metadata() {
            Ok(meta) => meta,
            Err(e) if is_missing(&e) => return Ok(()),
            Err(e) => return Err(io_err("inspecting", path)(e)),
        };
        if !meta.is_dir() {
            return Ok(fs::remove_file(path).at("removing", path)?);
        }
        make_writable(path)?;
        fs::remove_dir_all(path).at("removing", path)?;
        // The directories under `path` sort together, right after it (paths order by their
        // components): only those are visited, not every directory recorded (a whiteout per
        // directory of a large tree made that quadratic).
        let under: Vec<PathBuf> = self
            .dirs
            .range(path.to_path_buf()..)
            .map(|(dir, _)| dir)
            .take_while(|dir| dir.starts_with(path))
            .cloned()
            .collect();
        for dir in under {
            self.dirs.remove(&dir);
        }
        Ok(())
    }

    /// Removes every entry of `dir` that this layer did not write (an opaque whiteout).
    fn clear_dir(&mut self, dir: &Path, written: &HashSet<PathBuf>) -> Result<()> {
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if is_missing(&e) => return Ok(()),
            Err(e) => return Err(io_err("listing", dir)(e)),
        };
        for entry in entries {
            let path = entry.at("listing", dir)?.path();
            if !written.contains(&path) {
                self.remove(&path)?;
            }
        }
        Ok(())
    }
}

/// What an [`Unpacker`] keeps between layers besides the tree ([`Unpacker::pending`]): the
/// directory modes and times it sets at the end, and what the layers used of its caps.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Pending {
    /// Each directory: its path under the root (bytes), mode, and modification time in
    /// seconds and nanoseconds since the epoch.
    dirs: Vec<(Vec<u8>, u32, u64, u32)>,
    /// Bytes charged.
    bytes: u64,
    /// Entries charged.
    entries: u64,
}

/// What [`Unpacker::write_entry`] put at its destination.
enum Wrote {
    Nothing,
    Link,
    Other,
}

/// Reads at most `budget` bytes (shared by all layers); one byte more is an error.
struct Capped<'a, R> {
    inner: R,
    budget: &'a mut u64,
    exceeded: bool,
}

impl<R: Read> Read for Capped<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > *self.budget {
            self.exceeded = true;
            return Err(io::Error::other("the unpacked size cap is reached"));
        }
        *self.budget -= n as u64;
        Ok(n)
    }
}

fn link_name<R: Read>(entry: &tar::Entry<'_, R>) -> Result<PathBuf> {
    entry
        .link_name()
        .map_err(Error::Archive)?
        .map(|l| l.into_owned())
        .ok_or_else(|| Error::Archive(io::Error::other("link entry without a target")))
}

fn write_file(entry: &mut impl Read, dest: &Path, mode: u32, mtime: SystemTime) -> Result<()> {
    // create_new: never write through a symlink planted at `dest`.
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dest)
        .at("creating", dest)?;
    io::copy(entry, &mut file).at("writing", dest)?;
    file.set_times(FileTimes::new().set_modified(mtime))
        .at("setting the time of", dest)?;
    file.set_permissions(Permissions::from_mode(mode))
        .at("setting the mode of", dest)?;
    Ok(())
}

/// Gives the owner full access to every directory under `dir` (inclusive), so an unprivileged
/// caller can delete a tree whose directories were made read-only.
pub fn make_writable(dir: &Path) -> Result<()> {
    let meta = dir.symlink_metadata().at("inspecting", dir)?;
    if !meta.is_dir() {
        return Ok(());
    }
    if meta.permissions().mode() & 0o700 != 0o700 {
        let mode = meta.permissions().mode() | 0o700;
        fs::set_permissions(dir, Permissions::from_mode(mode)).at("setting the mode of", dir)?;
    }
    for entry in fs::read_dir(dir).at("listing", dir)? {
        let entry = entry.at("listing", dir)?;
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            make_writable(&entry.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "unpack_tests.rs"]
pub(crate) mod tests;
