//! All network I/O of the Debian module: InRelease, the Packages index and .deb files, each
//! checked against signed metadata before anything uses it. .debs land content-addressed in
//! `CACHE/debs/<sha256>.deb`, written to a temporary name and renamed only once verified, so
//! the cache never holds a file whose name lies about its content.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use futures_util::{StreamExt, TryStreamExt, stream};
use tokio::io::AsyncWriteExt;
use tracing::{debug, info, warn};
use url::Url;

use super::keyring::Keyring;
use super::packages::{LockedPackage, PackageIndex};
use super::release::{IndexEntry, Release, verify_release_signature};
use super::{Error, Mirror, Result};
use crate::fetch::download;
use crate::oci::{Digest, Hasher};

/// The most an `InRelease` file may be (Debian's are about 140 kB); the `Packages` index is
/// held to the size that file signs.
const RELEASE_LIMIT: u64 = 16 << 20;

/// `base/path`, keeping the last segment of `base` (`http://h/debian` + `dists` →
/// `…/debian/dists`).
pub(crate) fn join(base: &Url, path: &str) -> Result<Url> {
    let mut root = base.clone();
    if !root.path().ends_with('/') {
        root.set_path(&format!("{}/", root.path()));
    }
    root.join(path).map_err(|_| Error::BadUrl {
        base: base.to_string(),
        path: path.to_string(),
    })
}

async fn get(http: &reqwest::Client, url: &Url) -> Result<reqwest::Response> {
    let http_error = |source| Error::Http {
        url: url.to_string(),
        source,
    };
    let response = http.get(url.clone()).send().await.map_err(http_error)?;
    let status = response.status();
    debug!(%url, status = status.as_u16(), "GET");
    if !status.is_success() {
        return Err(Error::HttpStatus {
            url: url.to_string(),
            status: status.as_u16(),
        });
    }
    Ok(response)
}

/// The body at `url`, at most `limit` bytes.
async fn get_bytes(http: &reqwest::Client, url: &Url, limit: u64) -> Result<Vec<u8>> {
    let response = get(http, url).await?;
    download::document(response, url.as_str(), limit)
        .await
        .map_err(|source| Error::Body { source })
}

/// Fetches `dists/SUITE/InRelease`, verifies its signature with `keyring` at the current time
/// (see [`verify_release`]) and checks that it answers for the requested suite.
///
/// # Errors
/// HTTP failures, and every error of [`verify_release`] and [`Release::check_suite`].
pub async fn fetch_release(
    http: &reqwest::Client,
    mirror: &Mirror,
    keyring: &Keyring,
) -> Result<Release> {
    let url = join(&mirror.url, &format!("dists/{}/InRelease", mirror.suite))?;
    let bytes = get_bytes(http, &url, RELEASE_LIMIT).await?;
    let now = SystemTime::now();
    let release = verify_release_signature(&bytes, keyring, now)?;
    release.check_suite(&mirror.suite)?;
    match release.check_valid_until(now) {
        Err(Error::ReleaseExpired { suite, valid_until }) if mirror.allow_expired_release => {
            warn!(%suite, %valid_until, date = %release.date,
                "the Release has expired; locking from it anyway (--allow-expired-release): \
                 its packages may lack security fixes published since");
        }
        checked => checked?,
    }
    info!(%url, suite = %release.suite, codename = %release.codename, date = %release.date,
        "verified InRelease");
    Ok(release)
}

/// Fetches the `Packages.xz` index of the mirror's component and architecture by the SHA256
/// listed in the verified `release` (under `by-hash/` when the Release allows it, so a mirror
/// update cannot race the download), checks size and hash, decompresses and parses it.
///
/// # Errors
/// [`Error::MissingIndex`], HTTP failures, [`Error::HashMismatch`], [`Error::Decompress`] and
/// the parse errors of [`PackageIndex::parse`].
pub async fn fetch_packages(
    http: &reqwest::Client,
    mirror: &Mirror,
    release: &Release,
) -> Result<PackageIndex> {
    let dir = format!("{}/binary-{}", mirror.component, mirror.arch);
    let path = format!("{dir}/Packages.xz");
    let entry = release
        .index(&path)
        .ok_or_else(|| Error::MissingIndex { path: path.clone() })?;
    let dists = format!("dists/{}", mirror.suite);
    let plain = join(&mirror.url, &format!("{dists}/{path}"))?;
    let bytes = if release.acquire_by_hash {
        let by_hash = join(
            &mirror.url,
            &format!("{dists}/{dir}/by-hash/SHA256/{}", entry.sha256),
        )?;
        match get_bytes(http, &by_hash, entry.size).await {
            // A mirror may lag in publishing by-hash files; the hash check below still holds.
            Err(Error::HttpStatus { status: 404, .. }) => {
                get_bytes(http, &plain, entry.size).await?
            }
            other => other?,
        }
    } else {
        get_bytes(http, &plain, entry.size).await?
    };
    check_bytes(&path, &plain, &bytes, entry)?;
    let index = tokio::task::spawn_blocking(move || decode_index(&path, &bytes))
        .await
        .expect("the index parser does not panic")?;
    info!(packages = index.len(), "parsed Packages index");
    Ok(index)
}

fn check_bytes(what: &str, url: &Url, bytes: &[u8], entry: &IndexEntry) -> Result<()> {
    let actual = Digest::of(bytes);
    if actual.hex() != entry.sha256 || bytes.len() as u64 != entry.size {
        return Err(Error::HashMismatch {
            what: what.to_string(),
            url: url.to_string(),
            expected: entry.sha256.clone(),
            actual: actual.hex().to_string(),
            expected_size: entry.size,
            actual_size: bytes.len() as u64,
        });
    }
    Ok(())
}

fn decode_index(path: &str, xz: &[u8]) -> Result<PackageIndex> {
    let mut text = String::new();
    liblzma::read::XzDecoder::new(xz)
        .read_to_string(&mut text)
        .map_err(|source| Error::Decompress {
            what: path.to_string(),
            source,
        })?;
    PackageIndex::parse(&text)
}

/// Downloads `MIRROR/<filename>` of `pkg` into `cache_dir/debs/<sha256>.deb` unless a valid copy
/// is already there, verifying size and SHA256 while streaming. A cached copy that fails the
/// check is replaced. Returns the path of the verified file.
///
/// # Errors
/// [`Error::HashMismatch`] naming the package and both hashes (the partial file is deleted),
/// HTTP failures, and file errors in the cache.
pub async fn fetch_deb(
    http: &reqwest::Client,
    mirror_url: &Url,
    pkg: &LockedPackage,
    cache_dir: &Path,
) -> Result<PathBuf> {
    // The hash becomes a file name: it must be hex, never a path.
    if pkg.sha256.len() != 64 || !pkg.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::PackageField {
            package: pkg.name.clone(),
            field: "SHA256",
            value: pkg.sha256.clone(),
        });
    }
    let expected = pkg.sha256.to_ascii_lowercase();
    let dir = cache_dir.join("debs");
    let dest = dir.join(format!("{expected}.deb"));
    if cached_copy_is_valid(&dest, pkg).await? {
        debug!(package = %pkg.name, path = %dest.display(), "cached .deb");
        return Ok(dest);
    }
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(Error::io("creating directory", &dir))?;
    let url = join(mirror_url, &pkg.filename)?;
    let part = crate::fetch::download::part_path(&dir, &expected);
    let outcome = download(http, &url, pkg, &part).await;
    if outcome.is_err() {
        // Best effort: the download error is what matters to the caller.
        let _ = tokio::fs::remove_file(&part).await;
    }
    outcome?;
    tokio::fs::rename(&part, &dest)
        .await
        .map_err(Error::io("renaming into place", &dest))?;
    info!(package = %pkg.name, size = pkg.size, "fetched .deb");
    Ok(dest)
}

/// Whether `dest` exists with the package's size and hash; an invalid copy is removed.
async fn cached_copy_is_valid(dest: &Path, pkg: &LockedPackage) -> Result<bool> {
    if !tokio::fs::try_exists(dest).await.unwrap_or(false) {
        return Ok(false);
    }
    let path = dest.to_path_buf();
    let (digest, size) = tokio::task::spawn_blocking(move || -> std::io::Result<(Digest, u64)> {
        let mut hasher = Hasher::new();
        let mut file = std::fs::File::open(&path)?;
        let mut buf = vec![0; 1 << 16];
        loop {
            match file.read(&mut buf)? {
                0 => return Ok(hasher.finish()),
                n => hasher.update(&buf[..n]),
            }
        }
    })
    .await
    .expect("hashing a file does not panic")
    .map_err(Error::io("reading cached .deb", dest))?;
    if digest.hex().eq_ignore_ascii_case(&pkg.sha256) && size == pkg.size {
        return Ok(true);
    }
    warn!(
        package = %pkg.name,
        path = %dest.display(),
        actual = %digest,
        "replacing corrupt cached .deb",
    );
    tokio::fs::remove_file(dest)
        .await
        .map_err(Error::io("removing corrupt .deb", dest))?;
    Ok(false)
}

/// Streams `url` into `part`, hashing as it goes, and checks the result against `pkg`.
async fn download(
    http: &reqwest::Client,
    url: &Url,
    pkg: &LockedPackage,
    part: &Path,
) -> Result<()> {
    let mut response = get(http, url).await?;
    let mut file = tokio::fs::File::create(part)
        .await
        .map_err(Error::io("creating", part))?;
    let mut hasher = Hasher::new();
    let http_error = |source| Error::Http {
        url: url.to_string(),
        source,
    };
    while let Some(chunk) = response.chunk().await.map_err(http_error)? {
        hasher.update(&chunk);
        file.write_all(&chunk)
            .await
            .map_err(Error::io("writing", part))?;
        if hasher.len() > pkg.size {
            // Longer than the signed size: stop rather than fill the disk.
            break;
        }
    }
    file.flush().await.map_err(Error::io("writing", part))?;
    let (actual, actual_size) = hasher.finish();
    if !actual.hex().eq_ignore_ascii_case(&pkg.sha256) || actual_size != pkg.size {
        return Err(Error::HashMismatch {
            what: format!("package {}", pkg.name),
            url: url.to_string(),
            expected: pkg.sha256.clone(),
            actual: actual.hex().to_string(),
            expected_size: pkg.size,
            actual_size,
        });
    }
    file.sync_all().await.map_err(Error::io("syncing", part))?;
    Ok(())
}

/// [`fetch_deb`] for every package, up to `jobs` at a time; paths in the order of `packages`.
///
/// # Errors
/// The first error of any download.
pub async fn fetch_debs(
    http: &reqwest::Client,
    mirror_url: &Url,
    packages: &[LockedPackage],
    cache_dir: &Path,
    jobs: usize,
) -> Result<Vec<PathBuf>> {
    stream::iter(packages)
        .map(|pkg| fetch_deb(http, mirror_url, pkg, cache_dir))
        .buffered(jobs.max(1))
        .try_collect()
        .await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::fetch::download::test_server::{Answer, serve_with};

    #[tokio::test]
    async fn a_mirror_that_sends_without_end_fails_at_the_limit() {
        let url = serve_with(Answer::Endless).await;
        let mirror = Mirror::new(Url::parse(&url).unwrap(), "trixie");
        let keyring = Keyring::load(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("src/base/debian/testdata/signing-key.asc"),
        )
        .unwrap();
        let http = reqwest::Client::new();
        let e = fetch_release(&http, &mirror, &keyring).await.unwrap_err();
        assert!(
            matches!(
                &e,
                Error::Body { source: download::Error::TooLarge { limit, .. } }
                    if *limit == RELEASE_LIMIT
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("--debian-mirror"), "{e}");
    }

    #[test]
    fn joining_keeps_the_mirror_path() {
        let base = Url::parse("http://mirror.example/debian").unwrap();
        let url = join(&base, "dists/trixie/InRelease").unwrap();
        assert_eq!(
            url.as_str(),
            "http://mirror.example/debian/dists/trixie/InRelease"
        );
        let slash = Url::parse("http://mirror.example/debian/").unwrap();
        assert_eq!(
            join(&slash, "pool/a.deb").unwrap().as_str(),
            "http://mirror.example/debian/pool/a.deb"
        );
    }

    #[test]
    fn index_bytes_are_checked_against_the_release() {
        let url = Url::parse("http://mirror.example/debian/x").unwrap();
        let entry = IndexEntry {
            sha256: Digest::of(b"abc").hex().to_string(),
            size: 3,
        };
        check_bytes("x", &url, b"abc", &entry).unwrap();
        let err = check_bytes("x", &url, b"abd", &entry).unwrap_err();
        assert!(err.to_string().contains(&entry.sha256), "{err}");
    }
}
