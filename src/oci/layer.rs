//! Deterministic tar+gzip layers, written in one streaming pass to a temp file while the tar
//! stream (diff_id) and the gzip stream (digest, size) are hashed (go-containerregistry's
//! `stream.Layer` idea). Same entries in, same bytes out, on any machine:
//! entries sorted by path, parents added, uid/gid 0 with empty names, modes normalised to
//! 0755 (directories, executables) or 0644, one mtime for every entry, and a gzip header
//! with neither file name nor timestamp at a fixed compression level.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use tempfile::TempPath;

use super::{Compression, Descriptor, Digest, Hasher, HashingWriter, MediaType};

/// The name prefix of a layer file being written (`kiln cache prune` knows it).
pub const TEMP_PREFIX: &str = ".layer-";

/// The gzip level of every layer. Part of the reproducibility contract: changing it changes
/// every digest kiln produces.
pub const GZIP_LEVEL: u32 = 6;

/// One entry of a layer, at a path relative to the image root (`usr/src/app/handler.js`).
#[derive(Clone, Debug)]
pub struct LayerEntry {
    /// Relative path, `/`-separated, without `.` or `..` components.
    pub path: String,
    /// What it is.
    pub kind: EntryKind,
}

/// The kind and content of a layer entry.
#[derive(Clone, Debug)]
pub enum EntryKind {
    /// A directory (mode 0755).
    Dir,
    /// A directory with an explicit mode (`/tmp` is 01777).
    ModeDir(u32),
    /// A regular file (mode 0755 when executable, else 0644).
    File {
        /// Where the bytes come from.
        content: Content,
        /// Whether any execute bit was set.
        executable: bool,
    },
    /// A symbolic link to `target`.
    Symlink(String),
}

/// The bytes of a file entry.
#[derive(Clone, Debug)]
pub enum Content {
    /// Read from this file while the layer is written (a file kiln made or trusts).
    Path(PathBuf),
    /// Read from `rel` under `root` while the layer is written, opened without following any
    /// symlink ([`crate::rootpath::open_beneath`]): for trees kiln does not control, where a
    /// link may be swapped in after the walk.
    Beneath {
        /// The tree.
        root: PathBuf,
        /// The file, relative to it.
        rel: PathBuf,
    },
    /// Held in memory (small generated files, inline Function source).
    Bytes(Vec<u8>),
}

/// Errors writing a layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An entry path is absolute, empty or has `.`/`..` components.
    #[error("layer entry path {0:?} is not a clean relative path")]
    BadPath(String),
    /// Two entries share a path.
    #[error("layer has two entries for {0:?}")]
    Duplicate(String),
    /// A file changed size while it was being read.
    #[error("file {path} changed while the layer was being written")]
    Changed {
        /// The file.
        path: PathBuf,
    },
    /// Reading an input file.
    #[error("reading {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Writing the layer file.
    #[error("writing the layer to {dir}")]
    Write {
        /// The directory of the temp file.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// A written layer: its descriptor, the digest of its uncompressed tar, and the temp file
/// holding the compressed bytes (deleted on drop unless persisted).
#[derive(Debug)]
pub struct LayerBlob {
    /// Media type, digest and size of the compressed blob.
    pub descriptor: Descriptor,
    /// sha256 of the uncompressed tar, for `rootfs.diff_ids`.
    pub diff_id: Digest,
    /// The compressed bytes.
    pub file: TempPath,
}

/// The tar inside a gzip or zstd layer (told apart by zstd's magic number).
///
/// # Errors
/// An unreadable stream or a broken zstd frame header.
pub fn decompressed<'a, R: std::io::BufRead + 'a>(mut r: R) -> std::io::Result<Box<dyn Read + 'a>> {
    let zstd = r.fill_buf()?.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]);
    Ok(if zstd {
        Box::new(ruzstd::decoding::StreamingDecoder::new(r).map_err(io::Error::other)?)
    } else {
        Box::new(flate2::read::MultiGzDecoder::new(r))
    })
}

/// The diff ID of a gzip or zstd layer file: the digest of its uncompressed tar.
///
/// # Errors
/// An unreadable file or a broken gzip stream.
pub fn diff_id_of(path: &Path) -> std::io::Result<Digest> {
    let file = std::io::BufReader::new(std::fs::File::open(path)?);
    let mut gz = decompressed(file)?;
    let mut hasher = Hasher::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = std::io::Read::read(&mut gz, &mut buf)?;
        if n == 0 {
            return Ok(hasher.finish().0);
        }
        hasher.update(&buf[..n]);
    }
}

/// Writes `entries` as a layer of `media_type` (zstd for a `+zstd` type, else gzip) into a
/// temp file in `dir`, with every entry's mtime set to `mtime` (seconds since the epoch).
///
/// # Errors
/// Bad or duplicate paths, unreadable inputs, or a failing write.
pub fn write_layer(
    entries: Vec<LayerEntry>,
    mtime: u64,
    media_type: MediaType,
    dir: &Path,
) -> Result<LayerBlob, Error> {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    write_layer_with_threads(entries, mtime, media_type, dir, threads)
}

/// [`write_layer`] compressing on `threads` threads (the blob is the same for any count).
///
/// # Errors
/// As [`write_layer`].
pub fn write_layer_with_threads(
    entries: Vec<LayerEntry>,
    mtime: u64,
    media_type: MediaType,
    dir: &Path,
    threads: usize,
) -> Result<LayerBlob, Error> {
    let entries = normalise(entries)?;
    let write_err = |source| Error::Write {
        dir: dir.to_path_buf(),
        source,
    };
    let tmp = tempfile::Builder::new()
        .prefix(TEMP_PREFIX)
        .tempfile_in(dir)
        .map_err(write_err)?;
    let (file, path) = tmp.into_parts();
    let compressed = HashingWriter::new(BufWriter::with_capacity(1 << 20, file));
    let compressor = match Compression::of(&media_type) {
        Some(Compression::Zstd) => Compressor::Zstd(super::zstd::ZstdWriter::new(compressed)),
        // Deterministic gzip, parallel above a threshold (see `gzip.rs`).
        _ => Compressor::Gzip(Box::new(super::gzip::LayerGzip::new(
            compressed, GZIP_LEVEL, threads,
        ))),
    };
    let mut tar = tar::Builder::new(HashingWriter::new(compressor));
    tar.mode(tar::HeaderMode::Deterministic);
    for (path, kind) in &entries {
        append(&mut tar, path, kind, mtime).map_err(|e| match e {
            AppendError::Io(source) => write_err(source),
            AppendError::Input(err) => err,
        })?;
    }
    let tarred = tar.into_inner().map_err(write_err)?;
    let (gzip, diff_id, _) = tarred.finish();
    let compressed = gzip.finish().map_err(write_err)?;
    let (buffered, digest, size) = compressed.finish();
    // Not synced: most layers (the source layer of every build) are pushed and deleted; the
    // one place a layer is kept, the dependency cache, syncs it before it names it.
    buffered
        .into_inner()
        .map_err(|e| write_err(e.into_error()))?;
    Ok(LayerBlob {
        descriptor: Descriptor::new(media_type, digest, size),
        diff_id,
        file: path,
    })
}

/// The compressor a layer's media type names.
enum Compressor<W: Write + Send + 'static> {
    Gzip(Box<super::gzip::LayerGzip<W>>),
    Zstd(super::zstd::ZstdWriter<W>),
}

impl<W: Write + Send + 'static> Compressor<W> {
    fn finish(self) -> io::Result<W> {
        match self {
            Compressor::Gzip(g) => g.finish(),
            Compressor::Zstd(z) => z.finish(),
        }
    }
}

impl<W: Write + Send + 'static> Write for Compressor<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Compressor::Gzip(g) => g.write(buf),
            Compressor::Zstd(z) => z.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Sorts entries by path and adds every missing parent directory.
fn normalise(entries: Vec<LayerEntry>) -> Result<BTreeMap<String, EntryKind>, Error> {
    let mut out = BTreeMap::new();
    for entry in entries {
        let clean = entry.path.trim_end_matches('/');
        let bad = clean.is_empty()
            || clean.starts_with('/')
            || clean
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..");
        if bad {
            return Err(Error::BadPath(entry.path));
        }
        if out.insert(clean.to_string(), entry.kind).is_some() {
            return Err(Error::Duplicate(clean.to_string()));
        }
    }
    let parents: Vec<String> = out
        .keys()
        .flat_map(|p| p.match_indices('/').map(move |(i, _)| p[..i].to_string()))
        .collect();
    for parent in parents {
        out.entry(parent).or_insert(EntryKind::Dir);
    }
    Ok(out)
}

enum AppendError {
    Io(io::Error),
    Input(Error),
}

impl From<io::Error> for AppendError {
    fn from(e: io::Error) -> Self {
        AppendError::Io(e)
    }
}

fn header(kind: tar::EntryType, mode: u32, size: u64, mtime: u64) -> tar::Header {
    // GNU headers carry long names via ././@LongLink; uid/gid 0 and empty user and group
    // names make ownership independent of who ran the build.
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(mtime);
    h.set_size(size);
    h
}

fn append<W: Write>(
    tar: &mut tar::Builder<W>,
    path: &str,
    kind: &EntryKind,
    mtime: u64,
) -> Result<(), AppendError> {
    match kind {
        EntryKind::Dir => {
            let mut h = header(tar::EntryType::Directory, 0o755, 0, mtime);
            tar.append_data(&mut h, format!("{path}/"), io::empty())?;
        }
        EntryKind::ModeDir(mode) => {
            let mut h = header(tar::EntryType::Directory, *mode, 0, mtime);
            tar.append_data(&mut h, format!("{path}/"), io::empty())?;
        }
        EntryKind::Symlink(target) => {
            let mut h = header(tar::EntryType::Symlink, 0o777, 0, mtime);
            tar.append_link(&mut h, path, target)?;
        }
        EntryKind::File {
            content,
            executable,
        } => {
            let mode = if *executable { 0o755 } else { 0o644 };
            match content {
                Content::Bytes(bytes) => {
                    let mut h = header(tar::EntryType::Regular, mode, bytes.len() as u64, mtime);
                    tar.append_data(&mut h, path, bytes.as_slice())?;
                }
                Content::Path(file) => {
                    let f = File::open(file);
                    append_file(tar, path, f, file, mode, mtime)?;
                }
                Content::Beneath { root, rel } => {
                    let f = crate::rootpath::open_beneath(root, rel);
                    append_file(tar, path, f, &root.join(rel), mode, mtime)?;
                }
            }
        }
    }
    Ok(())
}

fn append_file<W: Write>(
    tar: &mut tar::Builder<W>,
    path: &str,
    opened: io::Result<File>,
    file: &Path,
    mode: u32,
    mtime: u64,
) -> Result<(), AppendError> {
    let read_err = |source| {
        AppendError::Input(Error::Read {
            path: file.to_path_buf(),
            source,
        })
    };
    let f = opened.map_err(read_err)?;
    let len = f.metadata().map_err(read_err)?.len();
    let mut h = header(tar::EntryType::Regular, mode, len, mtime);
    let mut reader = CountingReader {
        inner: f.take(len),
        count: 0,
    };
    tar.append_data(&mut h, path, &mut reader)?;
    if reader.count != len {
        return Err(AppendError::Input(Error::Changed {
            path: file.to_path_buf(),
        }));
    }
    Ok(())
}

struct CountingReader<R> {
    inner: R,
    count: u64,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, bytes: &[u8], executable: bool) -> LayerEntry {
        LayerEntry {
            path: path.into(),
            kind: EntryKind::File {
                content: Content::Bytes(bytes.to_vec()),
                executable,
            },
        }
    }

    fn fixed_entries() -> Vec<LayerEntry> {
        vec![
            file("app/b.txt", b"bee\n", false),
            file("app/run.sh", b"#!/bin/sh\necho hi\n", true),
            LayerEntry {
                path: "app/link".into(),
                kind: EntryKind::Symlink("b.txt".into()),
            },
            file("app/a.txt", b"ay\n", false),
        ]
    }

    /// Golden digests: a change here means every image kiln builds changes digest, a
    /// reproducibility break. Only update (by copying the new values from the failure) after
    /// reviewing why the bytes changed — a flate2 (or its backend: zlib-rs is chosen in
    /// Cargo.toml), tar or header change.
    #[test]
    fn a_fixed_layer_has_golden_digests() {
        let dir = tempfile::tempdir().unwrap();
        let blob = write_layer(fixed_entries(), 0, MediaType::OciLayerGzip, dir.path()).unwrap();
        let got = (
            blob.diff_id.to_string(),
            blob.descriptor.digest.to_string(),
            blob.descriptor.size,
        );
        let want = (
            "sha256:3be7c5891dc790c52a75a464d156d60a8f4bbe712c9baea3b70bc2c7020edc03".to_string(),
            "sha256:5815bae3b1e0a44f3ffd7fdac7bcaa8dbf28e7b18af15bccb2160e2c870e1761".to_string(),
            201,
        );
        assert_eq!(got, want);
        // Keep a copy for inspection with GNU tar when KILN_KEEP_GOLDEN is set.
        if std::env::var_os("KILN_KEEP_GOLDEN").is_some() {
            std::fs::copy(&blob.file, "/tmp/golden-layer.tar.gz").unwrap();
        }
    }

    #[test]
    fn entries_are_sorted_with_parents_and_normalised_headers() {
        let dir = tempfile::tempdir().unwrap();
        let blob = write_layer(fixed_entries(), 1234, MediaType::OciLayerGzip, dir.path()).unwrap();
        let gz = flate2::read::GzDecoder::new(File::open(&blob.file).unwrap());
        let mut archive = tar::Archive::new(gz);
        let mut seen = Vec::new();
        for entry in archive.entries().unwrap() {
            let entry = entry.unwrap();
            let h = entry.header();
            assert_eq!((h.uid().unwrap(), h.gid().unwrap()), (0, 0));
            assert_eq!(h.mtime().unwrap(), 1234);
            assert_eq!(h.username().unwrap(), Some(""));
            seen.push((
                entry.path().unwrap().display().to_string(),
                h.mode().unwrap(),
            ));
        }
        let want = [
            ("app/", 0o755),
            ("app/a.txt", 0o644),
            ("app/b.txt", 0o644),
            ("app/link", 0o777),
            ("app/run.sh", 0o755),
        ];
        let want: Vec<_> = want.iter().map(|(p, m)| (p.to_string(), *m)).collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn diff_id_is_the_digest_of_the_uncompressed_tar() {
        let dir = tempfile::tempdir().unwrap();
        let blob = write_layer(fixed_entries(), 0, MediaType::OciLayerGzip, dir.path()).unwrap();
        let mut tar_bytes = Vec::new();
        flate2::read::GzDecoder::new(File::open(&blob.file).unwrap())
            .read_to_end(&mut tar_bytes)
            .unwrap();
        assert_eq!(blob.diff_id, Digest::of(&tar_bytes));
        let gz = std::fs::read(&blob.file).unwrap();
        assert_eq!(blob.descriptor.digest, Digest::of(&gz));
        assert_eq!(blob.descriptor.size, gz.len() as u64);
    }

    #[test]
    fn bad_and_duplicate_paths_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["/abs", "a/../b", "", "a//b", "./a"] {
            let err = write_layer(
                vec![file(bad, b"", false)],
                0,
                MediaType::OciLayerGzip,
                dir.path(),
            );
            assert!(matches!(err, Err(Error::BadPath(_))), "{bad}");
        }
        let dup = vec![file("a", b"1", false), file("a", b"2", false)];
        assert!(matches!(
            write_layer(dup, 0, MediaType::OciLayerGzip, dir.path()),
            Err(Error::Duplicate(_))
        ));
    }
}
