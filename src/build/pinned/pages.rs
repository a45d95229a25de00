//! PyPI project pages kept in `cache_dir/pypi/`: used again for as long as the index's
//! `Cache-Control: max-age` allows (PyPI sends 600 s, and pip's HTTP cache keeps them as
//! long), then revalidated with their `ETag`, which costs a request but no body. The wheels
//! themselves are held to the SHA-256 the page lists, as before.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use reqwest::header::{CACHE_CONTROL, ETAG, HeaderMap};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// The directory under the kiln cache directory (`kiln cache prune` knows it).
pub(crate) const DIR: &str = "pypi";
/// The end of a cached page's file name.
pub(crate) const SUFFIX: &str = ".page";

/// What is known of a cached page: the first line of its file, the body follows.
#[derive(Debug, Serialize, Deserialize)]
struct Meta {
    url: String,
    /// Seconds since the epoch.
    fetched: u64,
    #[serde(rename = "maxAge")]
    max_age: u64,
    etag: Option<String>,
}

/// A page from the cache.
#[derive(Debug)]
pub(super) struct Page {
    meta: Meta,
    pub(super) body: Vec<u8>,
}

impl Page {
    /// Whether it may be used without asking the index, at `now` (seconds since the epoch).
    pub(super) fn fresh(&self, now: u64) -> bool {
        now.checked_sub(self.meta.fetched)
            .is_some_and(|age| age < self.meta.max_age)
    }

    /// The validator to ask the index with.
    pub(super) fn etag(&self) -> Option<&str> {
        self.meta.etag.as_deref()
    }
}

fn path(cache_dir: &Path, url: &str) -> PathBuf {
    let name = format!("{}{SUFFIX}", hex::encode(Sha256::digest(url.as_bytes())));
    cache_dir.join(DIR).join(name)
}

/// The cached page of `url`, when there is one that reads back whole.
pub(super) fn read(cache_dir: &Path, url: &str) -> Option<Page> {
    let bytes = std::fs::read(path(cache_dir, url)).ok()?;
    let newline = bytes.iter().position(|&b| b == b'\n')?;
    let meta: Meta = serde_json::from_slice(&bytes[..newline]).ok()?;
    (meta.url == url).then(|| Page {
        meta,
        body: bytes[newline + 1..].to_vec(),
    })
}

/// Keeps `body` as `url`'s page, fetched now, fresh for as long as `headers` say; `etag` is
/// the validator when the answer (a 304) gave none. Best effort: when it cannot be written,
/// the next build asks the index again.
pub(super) fn write(
    cache_dir: &Path,
    url: &str,
    headers: &HeaderMap,
    body: &[u8],
    etag: Option<&str>,
) {
    let meta = Meta {
        url: url.to_string(),
        fetched: now(),
        max_age: max_age(headers),
        etag: headers
            .get(ETAG)
            .and_then(|v| v.to_str().ok())
            .or(etag)
            .map(str::to_string),
    };
    let dest = path(cache_dir, url);
    let written = (|| -> std::io::Result<()> {
        let dir = cache_dir.join(DIR);
        std::fs::create_dir_all(&dir)?;
        let mut tmp = tempfile::NamedTempFile::new_in(&dir)?;
        serde_json::to_writer(&mut tmp, &meta)?;
        tmp.write_all(b"\n")?;
        tmp.write_all(body)?;
        tmp.persist(&dest).map_err(|e| e.error)?;
        Ok(())
    })();
    if let Err(e) = written {
        tracing::debug!(
            %url,
            path = %dest.display(),
            error = %e,
            "the project page was not cached",
        );
    }
}

/// `max-age` of the `Cache-Control` header in seconds: 0 when there is none, or when
/// `no-cache` or `no-store` says the page is not to be used without asking.
fn max_age(headers: &HeaderMap) -> u64 {
    let mut age = 0;
    for value in headers.get_all(CACHE_CONTROL) {
        let Ok(value) = value.to_str() else { continue };
        for directive in value.split(',').map(|d| d.trim().to_ascii_lowercase()) {
            if directive == "no-cache" || directive == "no-store" {
                return 0;
            }
            if let Some(n) = directive.strip_prefix("max-age=") {
                age = n.trim_matches('"').parse().unwrap_or(0);
            }
        }
    }
    age
}

/// Seconds since the epoch.
pub(super) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(*k, HeaderValue::from_static(v));
        }
        map
    }

    #[test]
    fn max_age_follows_cache_control() {
        assert_eq!(
            max_age(&headers(&[("cache-control", "max-age=600, public")])),
            600
        );
        assert_eq!(
            max_age(&headers(&[("cache-control", "Public, Max-Age=60")])),
            60
        );
        assert_eq!(
            max_age(&headers(&[("cache-control", "max-age=600, no-cache")])),
            0
        );
        assert_eq!(max_age(&headers(&[("cache-control", "no-store")])), 0);
        assert_eq!(max_age(&headers(&[("cache-control", "max-age=x")])), 0);
        assert_eq!(max_age(&headers(&[])), 0);
    }

    #[test]
    fn a_page_reads_back_with_its_freshness_and_validator() {
        let dir = tempfile::tempdir().unwrap();
        let url = "https://pypi.org/simple/six/";
        assert!(read(dir.path(), url).is_none());
        let h = headers(&[("cache-control", "max-age=600"), ("etag", "\"v1\"")]);
        write(dir.path(), url, &h, b"{\"files\": []}\nsecond line", None);
        let page = read(dir.path(), url).unwrap();
        assert_eq!(page.body, b"{\"files\": []}\nsecond line");
        assert_eq!(page.etag(), Some("\"v1\""));
        let t = now();
        assert!(page.fresh(t));
        assert!(!page.fresh(t + 600), "stale after max-age");
        assert!(
            !page.fresh(t.saturating_sub(3600)),
            "not fresh before it was fetched"
        );
        assert!(read(dir.path(), "https://pypi.org/simple/other/").is_none());

        // A 304 without a validator keeps the old one; no max-age means ask every time.
        write(dir.path(), url, &headers(&[]), &page.body, page.etag());
        let page = read(dir.path(), url).unwrap();
        assert_eq!(page.etag(), Some("\"v1\""));
        assert!(!page.fresh(now()));

        // A file that does not read back whole is no page.
        std::fs::write(
            path(dir.path(), url),
            b"{\"url\": \"https://pypi.org/simple/six/\"",
        )
        .unwrap();
        assert!(read(dir.path(), url).is_none());
    }
}
