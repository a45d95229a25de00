//! Fetching from package servers (npm, PyPI, Debian mirrors), which kiln does not trust:
//! - content-addressed downloads into kiln's cache: the body streams into a temporary file,
//!   hashed on the way, and is renamed into place only when its hash is the pinned one, so a
//!   cached file is always a verified one and parallel builds never see a partial file;
//! - documents (indexes, package metadata) read into memory.
//!
//! Every body has a size limit and every client a stall limit, so a server that sends without
//! end, or stops sending, fails the fetch instead of filling the memory or the disk, or
//! hanging the build.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt as _;
use sha2::Digest;
use tokio::io::AsyncWriteExt as _;

use crate::io_error::IoContext as _;

/// Why a download failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request failed (or the server sent nothing for [`STALL`]).
    #[error("fetching {url}{}", stalled(source))]
    Http {
        /// What was fetched.
        url: String,
        /// The cause.
        #[source]
        source: reqwest::Error,
    },
    /// The server answered with an error status.
    #[error("fetching {url}: HTTP {status}")]
    Status {
        /// What was fetched.
        url: String,
        /// The status.
        status: u16,
    },
    /// The bytes are not the pinned ones (nothing was kept).
    #[error("{url} does not have the pinned hash")]
    Mismatch {
        /// What was fetched.
        url: String,
        /// The hash of what arrived.
        actual: Vec<u8>,
    },
    /// The body is longer than kiln takes for it (or says it will be): the size its index
    /// lists, or kiln's limit for what it is.
    #[error(
        "{url} sends more than {limit} bytes, the most kiln takes for it (the size its index \
         lists, or kiln's limit); a server that does is faulty or hostile: check the registry \
         or mirror it names"
    )]
    TooLarge {
        /// What was fetched.
        url: String,
        /// The limit in bytes.
        limit: u64,
    },
    /// A document that is not the JSON expected.
    #[error("reading {url}")]
    Json {
        /// What was fetched.
        url: String,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// Local file trouble.
    #[error(transparent)]
    Io(#[from] crate::io_error::IoError),
}

/// The most a download may be when nothing names its size: above any package on PyPI or
/// npm, and the bound on what a server can write into the cache.
pub const LIMIT: u64 = 4 << 30;

/// The suffix of a download in progress (`kiln cache prune` knows it).
pub const PART_SUFFIX: &str = ".part";

/// Where a download of `name` into `dir` is written before it is renamed: `.NAME.PID.N.part`,
/// unique per process and call, so parallel builds sharing the cache never share a file.
pub fn part_path(dir: &Path, name: &str) -> PathBuf {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    dir.join(format!(".{name}.{}.{n}{PART_SUFFIX}", std::process::id()))
}

/// How long a package server may keep kiln waiting, to connect or for the next bytes of an
/// answer, before the fetch fails.
pub const STALL: Duration = Duration::from_secs(60);

/// What an HTTP error adds to its message: that the server kept kiln waiting too long.
fn stalled(e: &reqwest::Error) -> String {
    match e.is_timeout() {
        true => format!(" (nothing came for {} s, kiln's limit)", STALL.as_secs()),
        false => String::new(),
    }
}

/// A client for package servers: kiln's user agent and the [`STALL`] limit.
pub fn client_builder() -> reqwest::ClientBuilder {
    builder_with(STALL)
}

fn builder_with(stall: Duration) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .user_agent(concat!("kiln/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(stall)
        .read_timeout(stall)
}

/// The body of `resp` (from `url`), at most `limit` bytes: a declared length above it fails
/// before anything is read, a longer body as soon as it passes the limit. The one place a
/// [`crate::capped::Failure`] from a package server becomes an error: npm, PyPI and Debian
/// mirror fetches all read their documents here.
///
/// # Errors
/// HTTP failures, [`Error::TooLarge`].
pub async fn document(resp: reqwest::Response, url: &str, limit: u64) -> Result<Vec<u8>, Error> {
    crate::capped::read(resp, limit)
        .await
        .map_err(|failure| match failure {
            crate::capped::Failure::TooLarge => Error::TooLarge {
                url: url.to_string(),
                limit,
            },
            crate::capped::Failure::Http(source) => Error::Http {
                url: url.to_string(),
                source,
            },
        })
}

/// [`document`] parsed as JSON.
///
/// # Errors
/// Those of [`document`], and [`Error::Json`].
pub async fn json<T: serde::de::DeserializeOwned>(
    resp: reqwest::Response,
    url: &str,
    limit: u64,
) -> Result<T, Error> {
    let body = document(resp, url, limit).await?;
    serde_json::from_slice(&body).map_err(|source| Error::Json {
        url: url.to_string(),
        source,
    })
}

/// `dest` if it is there, else `url` downloaded into it when its `D` hash is `expected` and it
/// is at most `limit` bytes ([`LIMIT`], or the size the index names). `dest` must be named by
/// that hash (the cache is content-addressed).
///
/// # Errors
/// HTTP failures, [`Error::Mismatch`], [`Error::TooLarge`], file errors.
pub async fn cached<D: Digest>(
    http: &reqwest::Client,
    url: &str,
    dest: &Path,
    expected: &[u8],
    limit: u64,
) -> Result<PathBuf, Error> {
    if dest.is_file() {
        // The last use, for `kiln cache prune`: it keeps what was used lately.
        if let Ok(file) = std::fs::File::options().append(true).open(dest) {
            let _ = file.set_modified(std::time::SystemTime::now());
        }
        return Ok(dest.to_path_buf());
    }
    let dir = dest.parent().unwrap_or(Path::new("."));
    tokio::fs::create_dir_all(dir).await.at("creating", dir)?;
    tracing::debug!(url, "downloading");
    let part = part_path(dir, &dest.file_name().unwrap_or_default().to_string_lossy());
    if let Err(e) = download_to::<D>(http, url, &part, expected, limit).await {
        let _ = tokio::fs::remove_file(&part).await;
        return Err(e);
    }
    tokio::fs::rename(&part, dest).await.at("renaming", dest)?;
    Ok(dest.to_path_buf())
}

/// `url` into `part`, synced, when its `D` hash is `expected` and it is at most `limit`
/// bytes; what is left of `part` on an error is the caller's to remove.
async fn download_to<D: Digest>(
    http: &reqwest::Client,
    url: &str,
    part: &Path,
    expected: &[u8],
    limit: u64,
) -> Result<(), Error> {
    let http_error = |source| Error::Http {
        url: url.to_string(),
        source,
    };
    let resp = http.get(url).send().await.map_err(http_error)?;
    if !resp.status().is_success() {
        return Err(Error::Status {
            url: url.to_string(),
            status: resp.status().as_u16(),
        });
    }
    let too_large = || Error::TooLarge {
        url: url.to_string(),
        limit,
    };
    let total = resp.content_length();
    if total.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let mut file = tokio::fs::File::create(part).await.at("creating", part)?;
    let mut hasher = D::new();
    let done = Arc::new(AtomicU64::new(0));
    let _progress = progress(url, total, done.clone());
    let mut body = resp.bytes_stream();
    let mut received = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(http_error)?;
        received += chunk.len() as u64;
        if received > limit {
            return Err(too_large());
        }
        hasher.update(&chunk);
        file.write_all(&chunk).await.at("writing", part)?;
        done.fetch_add(chunk.len() as u64, Ordering::Relaxed);
    }
    file.flush().await.at("writing", part)?;
    // On the disk before the name that says what it is: after a crash, a cached file is
    // whole or absent (a hit is trusted by its name).
    file.sync_data().await.at("syncing", part)?;
    let actual = hasher.finalize().to_vec();
    if actual != expected {
        return Err(Error::Mismatch {
            url: url.to_string(),
            actual,
        });
    }
    Ok(())
}

/// Shows and logs every few seconds how much of `url` (`total` bytes, when it says) is `done`.
fn progress(url: &str, total: Option<u64>, done: Arc<AtomicU64>) -> crate::progress::Ticker {
    let url = url.to_string();
    let label = format!("downloading {}", url.rsplit('/').next().unwrap_or_default());
    crate::progress::Ticker::bytes(label, done, total, move |elapsed, got| {
        tracing::info!(
            url,
            received = crate::progress::megabytes(got),
            of = total.map(crate::progress::megabytes),
            elapsed_s = elapsed.as_secs(),
            "downloading"
        );
    })
}

/// A test server for hostile answers.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod test_server {
    use tokio::io::AsyncWriteExt as _;

    /// How the test server answers.
    #[derive(Clone, Copy)]
    pub(crate) enum Answer {
        /// `body`, with its length.
        Body(&'static [u8]),
        /// 256 MiB, no length given: past any limit a test sets, but finite, so a test
        /// whose limit is gone fails instead of filling memory or the disk.
        Endless,
        /// A head promising 100 bytes, then nothing.
        Stall,
    }

    /// A one-connection-at-a-time server answering every request with `answer`.
    pub(crate) async fn serve_with(answer: Answer) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/file", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = [0u8; 4096];
                let _ = tokio::io::AsyncReadExt::read(&mut conn, &mut buf).await;
                let head = match answer {
                    Answer::Body(body) => format!("Content-Length: {}\r\n", body.len()),
                    Answer::Endless => String::new(),
                    Answer::Stall => "Content-Length: 100\r\n".into(),
                };
                let head = format!("HTTP/1.1 200 OK\r\n{head}Connection: close\r\n\r\n");
                let _ = conn.write_all(head.as_bytes()).await;
                match answer {
                    Answer::Body(body) => {
                        let _ = conn.write_all(body).await;
                    }
                    Answer::Endless => {
                        let chunk = vec![b'x'; 1 << 16];
                        for _ in 0..(256 << 20) / chunk.len() {
                            if conn.write_all(&chunk).await.is_err() {
                                break;
                            }
                        }
                    }
                    Answer::Stall => {
                        // Held open until the client gives up.
                        let _ = tokio::io::AsyncReadExt::read(&mut conn, &mut buf).await;
                    }
                }
            }
        });
        url
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::test_server::{Answer, serve_with};
    use super::*;
    use sha2::Sha256;

    async fn serve(body: &'static [u8]) -> String {
        serve_with(Answer::Body(body)).await
    }

    #[tokio::test]
    async fn only_bytes_with_the_pinned_hash_are_kept() {
        let url = serve(b"the bytes").await;
        let dir = tempfile::tempdir().unwrap();
        let http = reqwest::Client::new();
        let good = Sha256::digest(b"the bytes").to_vec();
        let dest = dir.path().join("cache/good");
        let got = cached::<Sha256>(&http, &url, &dest, &good, LIMIT)
            .await
            .unwrap();
        assert_eq!(std::fs::read(got).unwrap(), b"the bytes");

        let bad = dir.path().join("cache/bad");
        let e = cached::<Sha256>(&http, &url, &bad, &[0; 32], LIMIT)
            .await
            .unwrap_err();
        assert!(
            matches!(e, Error::Mismatch { ref actual, .. } if *actual == good),
            "{e:?}"
        );
        let left: Vec<_> = std::fs::read_dir(dir.path().join("cache"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["good"], "no partial or wrong file is left");

        // A hit is a use: `kiln cache prune` goes by it.
        let long_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(86_400);
        let file = std::fs::File::options().append(true).open(&dest).unwrap();
        file.set_modified(long_ago).unwrap();
        cached::<Sha256>(&http, "http://127.0.0.1:9/unused", &dest, &good, LIMIT)
            .await
            .unwrap();
        let used = std::fs::metadata(&dest).unwrap().modified().unwrap();
        assert!(used.elapsed().unwrap() < std::time::Duration::from_secs(60));
    }

    #[tokio::test]
    async fn a_body_past_its_limit_fails_the_fetch_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let http = reqwest::Client::new();
        let endless = serve_with(Answer::Endless).await;
        let dest = dir.path().join("cache/endless");
        let e = cached::<Sha256>(&http, &endless, &dest, &[0; 32], 1 << 20)
            .await
            .unwrap_err();
        assert!(
            matches!(e, Error::TooLarge { limit, .. } if limit == 1 << 20),
            "{e:?}"
        );
        assert!(
            std::fs::read_dir(dir.path().join("cache"))
                .unwrap()
                .next()
                .is_none(),
            "no partial file is left"
        );
        let resp = http.get(&endless).send().await.unwrap();
        let e = document(resp, &endless, 1 << 20).await.unwrap_err();
        assert!(matches!(e, Error::TooLarge { .. }), "{e:?}");
        assert!(e.to_string().contains("more than 1048576 bytes"), "{e}");

        // A declared length over the limit fails before a byte is read.
        let small = serve(b"the bytes").await;
        let e = cached::<Sha256>(&http, &small, &dest, &[0; 32], 4)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::TooLarge { limit: 4, .. }), "{e:?}");
        let resp = http.get(&small).send().await.unwrap();
        assert!(matches!(
            document(resp, &small, 4).await,
            Err(Error::TooLarge { limit: 4, .. })
        ));
        let resp = http.get(&small).send().await.unwrap();
        assert_eq!(document(resp, &small, 9).await.unwrap(), b"the bytes");
    }

    #[tokio::test]
    async fn a_server_that_stops_sending_fails_the_fetch() {
        let url = serve_with(Answer::Stall).await;
        let http = builder_with(Duration::from_millis(300)).build().unwrap();
        let started = std::time::Instant::now();
        let resp = http.get(&url).send().await.unwrap();
        let e = document(resp, &url, LIMIT).await.unwrap_err();
        assert!(
            matches!(&e, Error::Http { source, .. } if source.is_timeout()),
            "{e:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(10));
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("stalled");
        let e = cached::<Sha256>(&http, &url, &dest, &[0; 32], LIMIT)
            .await
            .unwrap_err();
        assert!(
            matches!(&e, Error::Http { source, .. } if source.is_timeout()),
            "{e:?}"
        );
    }
}
