//! Content-addressed downloads into kiln's cache: the body streams into a temporary file,
//! hashed on the way, and is renamed into place only when its hash is the pinned one, so a
//! cached file is always a verified one and parallel builds never see a partial file.

use std::path::{Path, PathBuf};

use futures_util::StreamExt as _;
use sha2::Digest;
use tokio::io::AsyncWriteExt as _;

/// Why a download failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request failed.
    #[error("fetching {url}")]
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
    /// Local file trouble.
    #[error("{action} {path}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// Where.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// `dest` if it is there, else `url` downloaded into it when its `D` hash is `expected`.
/// `dest` must be named by that hash (the cache is content-addressed).
///
/// # Errors
/// HTTP failures, [`Error::Mismatch`], file errors.
pub async fn cached<D: Digest>(
    http: &reqwest::Client,
    url: &str,
    dest: &Path,
    expected: &[u8],
) -> Result<PathBuf, Error> {
    if dest.is_file() {
        // The last use, for `kiln cache prune`: it keeps what was used lately.
        if let Ok(file) = std::fs::File::options().append(true).open(dest) {
            let _ = file.set_modified(std::time::SystemTime::now());
        }
        return Ok(dest.to_path_buf());
    }
    let io = |action, path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io {
            action,
            path,
            source,
        }
    };
    let dir = dest.parent().unwrap_or(Path::new("."));
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(io("creating", dir))?;
    tracing::debug!(url, "downloading");
    // Unique per process and call: parallel builds may share the cache.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = dest.file_name().unwrap_or_default().to_string_lossy();
    let part = dir.join(format!(".{name}.{}.{n}.part", std::process::id()));
    let outcome = async {
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
        let mut file = tokio::fs::File::create(&part)
            .await
            .map_err(io("creating", &part))?;
        let mut hasher = D::new();
        let total = resp.content_length();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let _progress = {
            let (done, url) = (done.clone(), url.to_string());
            let show = crate::progress::Show::Bytes {
                label: format!("downloading {}", url.rsplit('/').next().unwrap_or_default()),
                done: Box::new({
                    let done = done.clone();
                    move || (done.load(std::sync::atomic::Ordering::Relaxed), total)
                }),
            };
            crate::progress::Ticker::start(crate::progress::PERIOD, show, move |elapsed| {
                let got =
                    crate::progress::megabytes(done.load(std::sync::atomic::Ordering::Relaxed));
                let of = total.map(crate::progress::megabytes);
                tracing::info!(
                    url,
                    received = got,
                    of,
                    elapsed_s = elapsed.as_secs(),
                    "downloading"
                );
            })
        };
        let mut body = resp.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(http_error)?;
            hasher.update(&chunk);
            file.write_all(&chunk).await.map_err(io("writing", &part))?;
            done.fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::Relaxed);
        }
        file.flush().await.map_err(io("writing", &part))?;
        let actual = hasher.finalize().to_vec();
        if actual != expected {
            return Err(Error::Mismatch {
                url: url.to_string(),
                actual,
            });
        }
        Ok(())
    }
    .await;
    if let Err(e) = outcome {
        let _ = tokio::fs::remove_file(&part).await;
        return Err(e);
    }
    tokio::fs::rename(&part, dest)
        .await
        .map_err(io("renaming", dest))?;
    Ok(dest.to_path_buf())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use sha2::Sha256;

    /// A one-connection-at-a-time server answering every request with `body`.
    async fn serve(body: &'static [u8]) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/file", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = [0u8; 4096];
                let _ = tokio::io::AsyncReadExt::read(&mut conn, &mut buf).await;
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(head.as_bytes()).await;
                let _ = conn.write_all(body).await;
            }
        });
        url
    }

    #[tokio::test]
    async fn only_bytes_with_the_pinned_hash_are_kept() {
        let url = serve(b"the bytes").await;
        let dir = tempfile::tempdir().unwrap();
        let http = reqwest::Client::new();
        let good = Sha256::digest(b"the bytes").to_vec();
        let dest = dir.path().join("cache/good");
        let got = cached::<Sha256>(&http, &url, &dest, &good).await.unwrap();
        assert_eq!(std::fs::read(got).unwrap(), b"the bytes");

        let bad = dir.path().join("cache/bad");
        let e = cached::<Sha256>(&http, &url, &bad, &[0; 32])
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
        cached::<Sha256>(&http, "http://127.0.0.1:9/unused", &dest, &good)
            .await
            .unwrap();
        let used = std::fs::metadata(&dest).unwrap().modified().unwrap();
        assert!(used.elapsed().unwrap() < std::time::Duration::from_secs(60));
    }
}
