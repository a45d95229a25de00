//! Reading the stage directory without trusting it: opening files beneath it without
//! following symlinks (openat2 `RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS`, `O_NOFOLLOW` on older
//! kernels), regular files only, and copying the layer out while checking it.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{Mode, OFlags, ResolveFlags};
use tempfile::{NamedTempFile, TempPath};

use super::{Error, StagedLayer};
use crate::io_error::IoContext as _;
use crate::oci::Hasher;

/// Opens `name` in `dir_fd` for reading without following any symlink, and checks that it is
/// a regular file. `O_NONBLOCK` keeps a planted FIFO from blocking the open.
pub(super) fn open_beneath(dir_fd: &OwnedFd, dir: &Path, name: &str) -> Result<File, Error> {
    let path = dir.join(name);
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    let opened = match rustix::fs::openat2(dir_fd, name, flags, Mode::empty(), resolve) {
        // Kernels before 5.6: `name` is one component, so O_NOFOLLOW alone covers it.
        Err(rustix::io::Errno::NOSYS) => rustix::fs::openat(dir_fd, name, flags, Mode::empty()),
        other => other,
    };
    let fd = match opened {
        Ok(fd) => fd,
        Err(rustix::io::Errno::LOOP | rustix::io::Errno::XDEV) => {
            return Err(Error::NotRegular {
                path,
                kind: "a symlink",
            });
        }
        Err(e) => {
            return Err(Error::Open {
                path,
                source: e.into(),
            });
        }
    };
    let file = File::from(fd);
    let kind = file.metadata().at("inspecting", &path)?.file_type();
    if !kind.is_file() {
        let kind = if kind.is_dir() {
            "a directory"
        } else {
            "a special file"
        };
        return Err(Error::NotRegular { path, kind });
    }
    Ok(file)
}

/// Copies `file` into a temp file in `scratch`, hashing the compressed bytes and, through a
/// gzip decoder, the tar stream; all three of size, digest and diff_id must match `layer`.
pub(super) fn copy_verified(
    file: File,
    path: &Path,
    layer: &StagedLayer,
    scratch: &Path,
) -> Result<TempPath, Error> {
    let io = |action| {
        let path = path.to_path_buf();
        move |source| {
            Error::Io(crate::io_error::IoError {
                action,
                path,
                source,
            })
        }
    };
    let blob_err = |field, expected: String, actual: String| Error::Blob {
        path: path.to_path_buf(),
        field,
        expected,
        actual,
    };
    let size = file.metadata().map_err(io("inspecting"))?.len();
    if size != layer.size {
        return Err(blob_err("size", layer.size.to_string(), size.to_string()));
    }
    let out = NamedTempFile::new_in(scratch).map_err(io("copying"))?;
    let tee = Tee {
        // Never more than the record allows, whatever happens to the file meanwhile.
        inner: file.take(layer.size + 1),
        out: out.as_file(),
        hasher: Hasher::new(),
    };
    let mut gz = flate2::read::GzDecoder::new(tee);
    let mut tar = crate::oci::HashingWriter::new(io::sink());
    let unpacked = io::copy(&mut gz, &mut tar);
    let mut tee = gz.into_inner();
    // Bytes after the gzip stream (or after a corrupt spot) still count toward the digest.
    io::copy(&mut tee, &mut io::sink()).map_err(io("reading"))?;
    let (digest, copied) = tee.hasher.finish();
    let (_, diff_id, _) = tar.finish();
    if copied != layer.size {
        return Err(blob_err("size", layer.size.to_string(), copied.to_string()));
    }
    if digest != layer.digest {
        return Err(blob_err(
            "digest",
            layer.digest.to_string(),
            digest.to_string(),
        ));
    }
    unpacked.map_err(|source| Error::Gzip {
        path: path.to_path_buf(),
        source,
    })?;
    if diff_id != layer.diff_id {
        return Err(blob_err(
            "diff_id",
            layer.diff_id.to_string(),
            diff_id.to_string(),
        ));
    }
    Ok(out.into_temp_path())
}

/// A reader that copies what it reads into `out` and hashes it.
struct Tee<'a, R> {
    inner: R,
    out: &'a File,
    hasher: Hasher,
}

impl<R: Read> Read for Tee<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.out.write_all(&buf[..n])?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}
