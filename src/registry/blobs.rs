//! Blob reads: existence checks (`HEAD`), small blobs into memory and large ones streamed to a
//! file. Content is verified while it streams (digest and size); a mismatch is an error and
//! leaves no file behind.

use std::path::{Path, PathBuf};

use reqwest::header::CONTENT_LENGTH;
use reqwest::{Method, Response, StatusCode};
use tokio::io::AsyncWriteExt;

use super::client::Client;
use super::error::{Error, Result};
use super::reference::Reference;
use super::retry::retry;
use super::scope::Scope;
use super::session::Registry;
use super::transport::{Call, header, next_chunk, not_found, status_error, transfer_timeout};
use crate::oci::{Descriptor, Digest, Document, Hasher};

/// Largest blob [`Client::get_blob`] reads into memory (configs are kilobytes).
pub const IN_MEMORY_BLOB_LIMIT: u64 = 32 * 1024 * 1024;

impl Client {
    /// The size of blob `digest` in `repo` (tag and digest of `repo` are ignored), or `None`
    /// when the registry does not have it there.
    ///
    /// # Errors
    /// The usual request errors.
    pub async fn blob_exists(&self, repo: &Reference, digest: &Digest) -> Result<Option<u64>> {
        let reg = self.inner.registry(&repo.registry)?;
        let url = reg.url(&blob_path(repo, digest));
        let call = Call::new(Method::HEAD, url, vec![Scope::pull(&repo.repository)]);
        let resp = self.inner.send(&reg, &call).await?;
        match resp.status() {
            StatusCode::OK => Ok(Some(
                header(&resp, &CONTENT_LENGTH)
                    .and_then(|l| l.parse().ok())
                    .unwrap_or(0),
            )),
            StatusCode::NOT_FOUND => Ok(None),
            _ => Err(status_error(&call, resp).await),
        }
    }

    /// Reads a small blob (a config) into memory, verifying size and digest as it arrives.
    ///
    /// # Errors
    /// [`Error::TooLarge`] above [`IN_MEMORY_BLOB_LIMIT`], [`Error::NotFound`],
    /// [`Error::DigestMismatch`], [`Error::SizeMismatch`], plus the usual request errors.
    pub async fn get_blob(&self, repo: &Reference, descriptor: &Descriptor) -> Result<Vec<u8>> {
        if descriptor.size > IN_MEMORY_BLOB_LIMIT {
            let what = blob_what(repo, &descriptor.digest);
            return Err(Error::TooLarge {
                what,
                limit: IN_MEMORY_BLOB_LIMIT,
            });
        }
        let cache = self.inner.documents.as_ref();
        // Kept bytes of another size than the descriptor says: read, to fail as a read would.
        let kept = cache.and_then(|c| c.get(&descriptor.digest));
        if let Some(doc) = kept.filter(|d| d.bytes.len() as u64 == descriptor.size) {
            return Ok(doc.bytes);
        }
        let reg = self.inner.registry(&repo.registry)?;
        let call = self.blob_call(&reg, repo, descriptor);
        let bytes = retry(&self.inner.retry, "GET blob", || async {
            let mut resp = self.open_blob(&reg, &call, repo, descriptor).await?;
            let mut check = Verifier::new(repo, descriptor);
            let mut out = Vec::with_capacity(usize::try_from(descriptor.size).unwrap_or(0));
            while let Some(chunk) =
                next_chunk(&call, &mut resp, self.inner.transport.timeout).await?
            {
                check.update(&chunk)?;
                out.extend_from_slice(&chunk);
            }
            check.finish()?;
            Ok(out)
        })
        .await?;
        if let Some(cache) = cache {
            cache.put(&Document {
                media_type: descriptor.media_type.clone(),
                digest: descriptor.digest.clone(),
                bytes: bytes.clone(),
            });
        }
        Ok(bytes)
    }

    /// Streams a blob into `dest`, hashing as it writes. The data goes to a temporary file
    /// next to `dest` that is renamed into place only after the digest and size match; on any
    /// failure nothing is left behind.
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::DigestMismatch`], [`Error::SizeMismatch`], [`Error::Io`],
    /// plus the usual request errors.
    pub async fn get_blob_to_file(
        &self,
        repo: &Reference,
        descriptor: &Descriptor,
        dest: &Path,
    ) -> Result<()> {
        let reg = self.inner.registry(&repo.registry)?;
        let call = self.blob_call(&reg, repo, descriptor);
        retry(&self.inner.retry, "GET blob", || async {
            let mut resp = self.open_blob(&reg, &call, repo, descriptor).await?;
            let (file, temp) = temp_file_near(dest).await?;
            let io = |action, source| {
                Error::Io(crate::io_error::IoError {
                    action,
                    path: temp.to_path_buf(),
                    source,
                })
            };
            let mut file = tokio::fs::File::from_std(file);
            let mut check = Verifier::new(repo, descriptor);
            while let Some(chunk) =
                next_chunk(&call, &mut resp, self.inner.transport.timeout).await?
            {
                check.update(&chunk)?;
                file.write_all(&chunk)
                    .await
                    .map_err(|e| io("writing blob to", e))?;
            }
            check.finish()?;
            file.flush().await.map_err(|e| io("writing blob to", e))?;
            drop(file);
            let dest_buf = dest.to_path_buf();
            let persisted = tokio::task::spawn_blocking(move || temp.persist(&dest_buf)).await;
            match persisted {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(Error::Io(crate::io_error::IoError {
                    action: "renaming downloaded blob to",
                    path: dest.to_path_buf(),
                    source: e.error,
                })),
                Err(join) => Err(Error::Io(crate::io_error::IoError {
                    action: "renaming downloaded blob to",
                    path: dest.to_path_buf(),
                    source: std::io::Error::other(join),
                })),
            }
        })
        .await
    }

    /// Streams a blob into `read`, which runs on a blocking thread as the chunks arrive (a
    /// layer read with neither a file nor the whole blob in memory: a few chunks are in
    /// flight at most). What `read` leaves unread is drained, so its result is returned only
    /// once the whole blob's digest and size are checked; a failed request is retried from
    /// the start, with `read` run again.
    ///
    /// # Errors
    /// The outer [`Result`]: [`Error::NotFound`], [`Error::DigestMismatch`],
    /// [`Error::SizeMismatch`], plus the usual request errors. The inner one is `read`'s.
    pub async fn read_blob<T, F>(
        &self,
        repo: &Reference,
        descriptor: &Descriptor,
        read: F,
    ) -> Result<std::io::Result<T>>
    where
        T: Send + 'static,
        F: Fn(&mut dyn std::io::Read) -> std::io::Result<T> + Clone + Send + 'static,
    {
        let reg = self.inner.registry(&repo.registry)?;
        let call = self.blob_call(&reg, repo, descriptor);
        retry(&self.inner.retry, "GET blob", || async {
            let mut resp = self.open_blob(&reg, &call, repo, descriptor).await?;
            let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(8);
            let read = read.clone();
            let reader = tokio::task::spawn_blocking(move || {
                let mut chunks = Chunks {
                    rx,
                    current: bytes::Bytes::new(),
                };
                let out = read(&mut chunks);
                // Drained, so the stream reaches its end and is checked whole.
                std::io::copy(&mut chunks, &mut std::io::sink()).map(|_| out)
            });
            let streamed = async {
                let mut check = Verifier::new(repo, descriptor);
                while let Some(chunk) =
                    next_chunk(&call, &mut resp, self.inner.transport.timeout).await?
                {
                    check.update(&chunk)?;
                    // The reader drains to the end, so it is there until the last chunk
                    // unless it failed (a panic): its failure is the answer then.
                    if tx.send(chunk).await.is_err() {
                        return Ok(false);
                    }
                }
                check.finish().map(|()| true)
            }
            .await;
            drop(tx);
            let read = reader.await.map_err(|e| {
                Error::Io(crate::io_error::IoError {
                    action: "reading blob",
                    path: PathBuf::from(descriptor.digest.to_string()),
                    source: std::io::Error::other(e),
                })
            })?;
            if !streamed? {
                return Err(Error::Io(crate::io_error::IoError {
                    action: "reading blob",
                    path: PathBuf::from(descriptor.digest.to_string()),
                    source: std::io::Error::other("the reader stopped before the blob's end"),
                }));
            }
            Ok(read.and_then(|r| r))
        })
        .await
    }

    fn blob_call(&self, reg: &Registry, repo: &Reference, descriptor: &Descriptor) -> Call {
        let url = reg.url(&blob_path(repo, &descriptor.digest));
        let mut call = Call::new(Method::GET, url, vec![Scope::pull(&repo.repository)]);
        call.timeout = Some(transfer_timeout(
            self.inner.transport.timeout,
            descriptor.size,
        ));
        call
    }

    async fn open_blob(
        &self,
        reg: &Registry,
        call: &Call,
        repo: &Reference,
        descriptor: &Descriptor,
    ) -> Result<Response> {
        let resp = self.inner.send_once(reg, call).await?;
        match resp.status() {
            StatusCode::OK => Ok(resp),
            StatusCode::NOT_FOUND => {
                Err(not_found(call, resp, blob_what(repo, &descriptor.digest)).await)
            }
            _ => Err(status_error(call, resp).await),
        }
    }
}

pub(crate) fn blob_path(repo: &Reference, digest: &Digest) -> String {
    format!("/v2/{}/blobs/{digest}", repo.repository)
}

fn blob_what(repo: &Reference, digest: &Digest) -> String {
    format!("blob {digest} in {}", repo.repository_path())
}

/// The chunks of a blob as they arrive, read on a blocking thread.
struct Chunks {
    rx: tokio::sync::mpsc::Receiver<bytes::Bytes>,
    current: bytes::Bytes,
}

impl std::io::Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(chunk) => self.current = chunk,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        bytes::Buf::advance(&mut self.current, n);
        Ok(n)
    }
}

/// Checks streamed bytes against a descriptor: fails as soon as there are too many, and at the
/// end when there are too few or the digest differs.
struct Verifier {
    hasher: Hasher,
    expected: Descriptor,
    what: String,
}

impl Verifier {
    fn new(repo: &Reference, descriptor: &Descriptor) -> Verifier {
        let what = blob_what(repo, &descriptor.digest);
        Verifier {
            hasher: Hasher::new(),
            expected: descriptor.clone(),
            what,
        }
    }

    fn update(&mut self, chunk: &[u8]) -> Result<()> {
        self.hasher.update(chunk);
        if self.hasher.len() > self.expected.size {
            let (what, expected, actual) =
                (self.what.clone(), self.expected.size, self.hasher.len());
            return Err(Error::SizeMismatch {
                what,
                expected,
                actual,
            });
        }
        Ok(())
    }

    fn finish(self) -> Result<()> {
        let (actual, len) = self.hasher.finish();
        if actual != self.expected.digest {
            return Err(Error::DigestMismatch {
                what: self.what,
                expected: self.expected.digest,
                actual,
            });
        }
        if len != self.expected.size {
            return Err(Error::SizeMismatch {
                what: self.what,
                expected: self.expected.size,
                actual: len,
            });
        }
        Ok(())
    }
}

/// The name prefix of a blob being downloaded (`kiln cache prune` knows it).
pub const TEMP_PREFIX: &str = ".kiln-blob-";

/// A temporary file in `dest`'s directory (so the final rename stays on one filesystem),
/// deleted on drop unless persisted.
async fn temp_file_near(dest: &Path) -> Result<(std::fs::File, tempfile::TempPath)> {
    let dir: PathBuf = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let dir_for_error = dir.clone();
    let made = tokio::task::spawn_blocking(move || {
        tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .tempfile_in(&dir)
    })
    .await
    .map_err(std::io::Error::other)
    .and_then(|r| r);
    let file = made.map_err(|source| {
        Error::Io(crate::io_error::IoError {
            action: "creating a temporary file in",
            path: dir_for_error,
            source,
        })
    })?;
    Ok(file.into_parts())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::oci::MediaType;

    fn repo() -> Reference {
        "reg.example/app".parse().unwrap()
    }

    #[test]
    fn the_verifier_catches_wrong_content_short_and_long_bodies() {
        let d = Descriptor::new(MediaType::OciConfig, Digest::of(b"hello"), 5);
        let mut ok = Verifier::new(&repo(), &d);
        ok.update(b"hel").unwrap();
        ok.update(b"lo").unwrap();
        ok.finish().unwrap();

        let mut wrong = Verifier::new(&repo(), &d);
        wrong.update(b"HELLO").unwrap();
        assert!(matches!(wrong.finish(), Err(Error::DigestMismatch { .. })));

        let mut long = Verifier::new(&repo(), &d);
        assert!(matches!(
            long.update(b"hello!"),
            Err(Error::SizeMismatch { actual: 6, .. })
        ));

        let mut short = Verifier::new(&repo(), &d);
        short.update(b"hell").unwrap();
        assert!(matches!(short.finish(), Err(Error::DigestMismatch { .. })));
    }
}
