//! Dependencies installed from the lock file by kiln itself (`--lockfile-install auto`) are
//! what npm installs: the same Function built both ways — kiln alone, then `npm ci` in the
//! builder image kiln assembled — gives dependency layers with the same files, modes, links
//! and bytes (npm's hidden `.package-lock.json` aside). Real packages from the npm registry:
//! bins, a nested second version, a skipped optional package for another OS and a dev
//! dependency.

use crate::common;

use std::fs;

use common::kiln::{Kiln, copy_fixture, dependency_layer, kiln_built_builder, tiny_base};

#[test]
fn kiln_installs_a_lock_file_as_npm_ci_does_without_the_builder() {
    common::require_tool("bwrap", "bubblewrap");
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("node-lockfile", &work.path().join("fn"));
    let base = tiny_base();
    let mut layers = Vec::new();
    for mode in ["auto", "off"] {
        let kiln = Kiln::new();
        let (out, report) = (
            work.path().join(mode),
            work.path().join(format!("{mode}.json")),
        );
        let mut args = vec![
            "build".to_string(),
            dir.display().to_string(),
            "--runtime".into(),
            "nodejs22".into(),
            "--base".into(),
            base.clone(),
            "--output".into(),
            format!("oci:{}", out.display()),
            "--report".into(),
            report.display().to_string(),
            "--lockfile-install".into(),
            mode.into(),
        ];
        if mode == "off" {
            let builder = kiln_built_builder(&kiln, "nodejs22", &work.path().join("bases"));
            args.extend(["--builder-image".into(), builder]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = kiln.run(&args);
        run.reference();
        let (by_kiln, by_npm) = (
            run.stderr
                .contains("installing dependencies from the lock file, without npm"),
            run.stderr
                .contains("dependencies install inside the builder image"),
        );
        // `auto` needs no --builder-image even on another base: nothing runs in one.
        assert_eq!(
            (by_kiln, by_npm),
            (mode == "auto", mode == "off"),
            "{}",
            run.stderr
        );
        layers.push(dependency_layer(&out, &report));
    }
    let npm_only = "usr/src/app/function/node_modules/.package-lock.json";
    let (by_kiln, mut by_npm) = (layers[0].clone(), layers.remove(1));
    assert!(
        by_npm.remove(npm_only).is_some(),
        "npm writes its hidden lock"
    );
    let nm = |p: &str| format!("usr/src/app/function/node_modules/{p}");
    for present in [
        "debug/node_modules/ms/package.json",
        "chokidar/package.json",
    ] {
        assert!(by_kiln.contains_key(&nm(present)), "{present} missing");
    }
    assert_eq!(by_kiln[&nm(".bin/semver")].1, "../semver/bin/semver.js");
    assert!(by_kiln[&nm("semver/bin/semver.js")].0.ends_with("755"));
    for absent in ["fsevents/package.json", "left-pad/package.json"] {
        assert!(!by_kiln.contains_key(&nm(absent)), "{absent} installed");
    }
    let differ: Vec<_> = by_kiln
        .keys()
        .chain(by_npm.keys())
        .filter(|k| by_kiln.get(*k) != by_npm.get(*k))
        .map(|k| (k, by_kiln.get(k), by_npm.get(k)))
        .take(10)
        .collect();
    assert!(differ.is_empty(), "kiln vs npm: {differ:#?}");
}

#[test]
fn a_tarball_that_is_not_the_one_the_lock_pins_fails_the_build_and_writes_nothing() {
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("node-lockfile", &work.path().join("fn"));
    let lock_path = dir.join("package-lock.json");
    let mut lock: serde_json::Value =
        serde_json::from_slice(&fs::read(&lock_path).unwrap()).unwrap();
    // A well-formed integrity of other bytes: what a registry serving a swapped tarball gives.
    let forged = format!("sha512-{}", "A".repeat(86) + "==");
    lock["packages"]["node_modules/ms"]["integrity"] = forged.clone().into();
    fs::write(&lock_path, serde_json::to_vec_pretty(&lock).unwrap()).unwrap();
    let out = work.path().join("out");
    let run = Kiln::new().build_node_into_layout(&dir, &out, &[]);
    assert_ne!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stderr.contains("ms@2.1.3 tarball has integrity")
            && run.stderr.contains(&forged)
            && run.stderr.contains("from the lock file"),
        "{}",
        run.stderr
    );
    assert!(!out.join("index.json").exists(), "nothing is written");
}

/// A lock whose `resolved` points off the registry: npm would fetch it as written, so the
/// build refuses it before anything is fetched (found in issue 29).
#[test]
fn a_lock_resolved_off_the_registry_is_refused_before_anything_is_fetched() {
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("node-lockfile", &work.path().join("fn"));
    let lock_path = dir.join("package-lock.json");
    let mut lock: serde_json::Value =
        serde_json::from_slice(&fs::read(&lock_path).unwrap()).unwrap();
    let evil = "https://evil.example/ms/-/ms-2.1.3.tgz";
    lock["packages"]["node_modules/ms"]["resolved"] = evil.into();
    fs::write(&lock_path, serde_json::to_vec_pretty(&lock).unwrap()).unwrap();
    let out = work.path().join("out");
    let run = Kiln::new().build_node_into_layout(&dir, &out, &[]);
    let err = run.failure(2);
    assert!(
        err.contains(&format!(
            "package-lock.json line {}: \"node_modules/ms\" is resolved to \"{evil}\", not a \
             configured registry",
            line_of(
                &fs::read_to_string(&lock_path).unwrap(),
                "\"node_modules/ms\""
            )
        )),
        "{err}"
    );
    assert!(!out.join("index.json").exists(), "nothing is written");
}

fn line_of(text: &str, needle: &str) -> usize {
    1 + text[..text.find(needle).unwrap()].matches('\n').count()
}
