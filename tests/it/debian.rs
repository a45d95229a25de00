//! The Debian package pipeline against the machine's configured mirror (from apt's sources; no
//! host is named here): InRelease verification with the archive keyring, the python3.13
//! closure, fetching and unpacking it into a root that runs python in a chroot, and refusal of
//! corrupted .debs. Downloads are cached content-addressed under `<target>/tmp/kiln-test-cache`.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Instant, SystemTime};

use kiln::base::debian::{
    self, DEBIAN_ARCHIVE_KEYRING, Error, Keyring, LockedPackage, Mirror, PackageIndex,
};

const SUITE: &str = "trixie";

fn mirror() -> Mirror {
    let url = debian::system_mirror_url().expect(
        "no Debian mirror is configured: these tests need a `deb` source for `main` of the \
         Debian archive in /etc/apt/sources.list or /etc/apt/sources.list.d/",
    );
    Mirror::new(url, SUITE)
}

fn keyring() -> Keyring {
    Keyring::load(Path::new(DEBIAN_ARCHIVE_KEYRING))
        .expect("the Debian archive keyring is missing: apt-get install debian-archive-keyring")
}

fn cache_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kiln-test-cache")
}

fn strings(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

async fn index(http: &reqwest::Client) -> PackageIndex {
    let mirror = mirror();
    let release = debian::fetch_release(http, &mirror, &keyring())
        .await
        .unwrap();
    let started = Instant::now();
    let index = debian::fetch_packages(http, &mirror, &release)
        .await
        .unwrap();
    eprintln!(
        "Packages index: {} names in {:?}",
        index.len(),
        started.elapsed()
    );
    index
}

fn names(locked: &[LockedPackage]) -> Vec<&str> {
    locked.iter().map(|p| p.name.as_str()).collect()
}

#[tokio::test]
async fn the_genuine_inrelease_verifies_and_a_one_byte_edit_is_rejected() {
    let mirror = mirror();
    let url = format!(
        "{}/dists/{SUITE}/InRelease",
        mirror.url.as_str().trim_end_matches('/')
    );
    let bytes = reqwest::get(&url)
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .bytes()
        .await;
    let bytes = bytes.unwrap().to_vec();
    let keyring = keyring();
    let release = debian::verify_release(&bytes, &keyring, SystemTime::now()).unwrap();
    assert_eq!(release.codename, SUITE);
    eprintln!("InRelease signed by {:?}", release.signed_by);
    assert!(!release.signed_by.is_empty());
    release.check_suite(SUITE).unwrap();
    let packages = release.index("main/binary-amd64/Packages.xz").unwrap();
    assert!(packages.size > 1_000_000, "{packages:?}");

    // Change one hex digit of the first SHA256 entry of the body.
    let mut tampered = bytes.clone();
    let at = bytes.windows(8).position(|w| w == b"SHA256:\n").unwrap() + 9;
    tampered[at] = if tampered[at] == b'0' { b'1' } else { b'0' };
    let err = debian::verify_release(&tampered, &keyring, SystemTime::now()).unwrap_err();
    assert!(matches!(err, Error::NoValidSignature { .. }), "{err}");
}

#[tokio::test]
async fn the_python3_13_closure_has_its_libraries_and_leaves_out_excluded_packages() {
    let http = reqwest::Client::new();
    let index = index(&http).await;
    let started = Instant::now();
    let closure = index.resolve(&strings(&["python3.13"]), &[]).unwrap();
    eprintln!(
        "resolved {} packages in {:?}",
        closure.len(),
        started.elapsed()
    );
    let got = names(&closure);
    for name in [
        "python3.13",
        "libpython3.13-stdlib",
        "libc6",
        "libssl3t64",
        "libsqlite3-0",
    ] {
        assert!(got.contains(&name), "{name} missing from {got:?}");
    }
    assert!(got.is_sorted(), "{got:?}");
    for p in &closure {
        assert!(p.filename.starts_with("pool/main/"), "{p:?}");
        assert_eq!(p.sha256.len(), 64, "{p:?}");
    }

    // python3-minimal pulls in dpkg (and tar with it) unless dpkg is excluded.
    let roots = strings(&["python3.13", "python3-minimal"]);
    let with_dpkg = index.resolve(&roots, &[]).unwrap();
    assert!(names(&with_dpkg).contains(&"dpkg"));
    let without = index.resolve(&roots, &strings(&["dpkg"])).unwrap();
    assert!(!names(&without).contains(&"dpkg"), "{:?}", names(&without));
    assert!(names(&without).contains(&"python3-minimal"));

    let err = index
        .resolve(&strings(&["no-such-package-kiln"]), &[])
        .unwrap_err();
    assert!(matches!(err, Error::UnknownPackage { .. }), "{err}");
}

/// Fetches `closure` (through the shared cache) and unpacks it into a fresh root filesystem.
async fn unpack_closure(http: &reqwest::Client, closure: &[LockedPackage]) -> tempfile::TempDir {
    let started = Instant::now();
    let debs = debian::fetch_debs(http, &mirror().url, closure, &cache_dir(), 4)
        .await
        .unwrap();
    let bytes: u64 = closure.iter().map(|p| p.size).sum();
    eprintln!(
        "fetched {} .debs ({bytes} bytes) in {:?}",
        debs.len(),
        started.elapsed()
    );

    let root = tempfile::tempdir().unwrap();
    debian::merged_usr_links(root.path()).unwrap();
    let started = Instant::now();
    let mut files = 0;
    for deb in &debs {
        files += debian::unpack_deb(deb, root.path()).unwrap().len();
    }
    let du = Command::new("du")
        .arg("-sb")
        .arg(root.path())
        .output()
        .unwrap();
    let du = String::from_utf8_lossy(&du.stdout);
    eprintln!("unpacked {files} entries in {:?}: {du}", started.elapsed());
    root
}

#[tokio::test]
async fn python3_13_runs_in_a_chroot_of_its_unpacked_closure() {
    assert!(
        Command::new("id").arg("-u").output().unwrap().stdout == b"0\n",
        "this test runs chroot and must run as root"
    );
    let http = reqwest::Client::new();
    let closure = index(&http)
        .await
        .resolve(&strings(&["python3.13"]), &[])
        .unwrap();
    let root = unpack_closure(&http, &closure).await;

    let out = Command::new("env")
        .args(["-i", "/usr/sbin/chroot"])
        .arg(root.path())
        .args([
            "/usr/bin/python3.13",
            "-c",
            "import ssl, json, sqlite3; print(1)",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "python3.13 failed in the chroot: {stderr}"
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "1\n", "{stderr}");

    let licensed: Vec<(String, Vec<String>)> = closure
        .iter()
        .map(|p| (p.name.clone(), debian::licenses(root.path(), &p.name)))
        .filter(|(_, licenses)| !licenses.is_empty())
        .collect();
    eprintln!("licenses: {licensed:?}");
    assert!(licensed.len() >= closure.len() / 3, "{licensed:?}");
}

/// A loopback mirror serving `bytes` for every path.
async fn serve(bytes: Vec<u8>) -> url::Url {
    let app = axum::Router::new().fallback(move || {
        let bytes = bytes.clone();
        async move { bytes }
    });
    let addr = crate::common::http::serve(app).await;
    url::Url::parse(&format!("http://{addr}/debian")).unwrap()
}

#[tokio::test]
async fn a_corrupted_deb_fails_naming_the_package_and_both_hashes() {
    let http = reqwest::Client::new();
    let closure = index(&http)
        .await
        .resolve(&strings(&["netbase"]), &[])
        .unwrap();
    let pkg = closure.iter().find(|p| p.name == "netbase").unwrap();
    let good = debian::fetch_deb(&http, &mirror().url, pkg, &cache_dir())
        .await
        .unwrap();
    let mut bytes = std::fs::read(&good).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;

    // A mirror that serves the flipped bytes.
    let lying = serve(bytes.clone()).await;
    let cache = tempfile::tempdir().unwrap();
    let err = debian::fetch_deb(&http, &lying, pkg, cache.path())
        .await
        .unwrap_err();
    let Error::HashMismatch {
        what,
        expected,
        actual,
        ..
    } = &err
    else {
        panic!("unexpected {err}");
    };
    assert!(what.contains("netbase"), "{err}");
    assert_eq!(expected, &pkg.sha256);
    assert_ne!(actual, &pkg.sha256);
    let message = err.to_string();
    assert!(
        message.contains(expected) && message.contains(actual),
        "{message}"
    );
    let left: Vec<_> = std::fs::read_dir(cache.path().join("debs"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "the bad download is deleted: {left:?}");

    // A corrupted cached copy is replaced by a verified download.
    let cached = cache
        .path()
        .join("debs")
        .join(format!("{}.deb", pkg.sha256));
    std::fs::write(&cached, &bytes).unwrap();
    let path = debian::fetch_deb(&http, &mirror().url, pkg, cache.path())
        .await
        .unwrap();
    assert_eq!(path, cached);
    assert_eq!(std::fs::read(&path).unwrap(), std::fs::read(&good).unwrap());
}
