//! `kiln warm`: a cluster registry prepared before its first build — the runtime's images
//! copied from the local store, a Function's dependency layer pre-built into the cache
//! repository, and a second run that uploads nothing.

#![allow(clippy::unwrap_used)]

use crate::common;

use common::kiln::{CacheKey, Kiln, base_images_into, blobs_with_role, copy_fixture, read_report};
use common::registry::{Registry, RegistryKind, writes};

#[test]
fn warm_copies_the_runtime_images_and_prebuilds_dependency_layers_once() {
    common::require_tool("bwrap", "bubblewrap");
    let reg = Registry::start(RegistryKind::Plain);
    let host = reg.host();
    let kiln = Kiln::new();
    // The local store as a first build leaves it (assembling it is `kiln base build`'s test).
    std::fs::create_dir_all(kiln.cache_dir()).unwrap();
    base_images_into(&kiln, "nodejs22", &kiln.cache_dir().join("store"));
    let work = tempfile::tempdir().unwrap();
    let with_deps = copy_fixture("node-deps", &work.path().join("with-deps"));
    let without = copy_fixture("hello-node", &work.path().join("without"));
    let cache = reg.reference("kiln/cache");
    let key = CacheKey::new();
    let args = [
        "warm",
        "--registry",
        &host,
        "--insecure-registry",
        &host,
        "--cache-repo",
        &cache,
        "--cache-sign-key",
        &key.private,
        "nodejs22",
        with_deps.to_str().unwrap(),
        without.to_str().unwrap(),
    ];

    let first = kiln.run(&args);
    assert_eq!(first.code, 0, "{}", first.stderr);
    let lines: Vec<&str> = first.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", first.stdout);
    let base = format!("{host}/kiln/nodejs22:latest@sha256:");
    let builder = format!("{host}/kiln/nodejs22-builder:latest@sha256:");
    assert!(
        lines[0].starts_with(&base) && lines[0].ends_with(" pushed"),
        "{lines:?}"
    );
    assert!(
        lines[1].starts_with(&builder) && lines[1].ends_with(" pushed"),
        "{lines:?}"
    );
    let entry = format!("{cache}:deps-");
    assert!(
        lines[2].starts_with(&entry)
            && lines[2].ends_with(&format!(" stored {}", with_deps.display())),
        "{lines:?}"
    );
    assert_eq!(
        lines[3],
        format!("none no-dependencies {}", without.display())
    );
    assert!(
        first
            .stderr
            .contains("dependencies install inside the builder image"),
        "{}",
        first.stderr
    );
    assert_eq!(reg.missing_blobs("kiln/nodejs22", "latest"), Some(vec![]));
    assert_eq!(
        reg.missing_blobs("kiln/nodejs22-builder", "latest"),
        Some(vec![])
    );

    // A second run: one HEAD per image and one manifest request per Function with
    // dependencies; nothing written.
    let before = reg.settled_access_log().len();
    let second = kiln.run(&args);
    assert_eq!(second.code, 0, "{}", second.stderr);
    let log = reg.access_log_since(before);
    let again: Vec<&str> = second.stdout.lines().collect();
    assert_eq!(again[0], lines[0].replace(" pushed", " unchanged"));
    assert_eq!(again[1], lines[1].replace(" pushed", " unchanged"));
    assert_eq!(again[2], lines[2].replace(" stored ", " present "));
    assert!(writes(&log).is_empty(), "{log:?}");
    assert_eq!(log.len(), 3, "{log:?}");
    assert!(
        !second.stderr.contains("dependencies install"),
        "{}",
        second.stderr
    );

    // What a stateless build Pod on another machine sees: the warmed images and entry. Its
    // dependency key is the warmed one, so the layer is mounted, not installed.
    let pod = Kiln::new();
    let report = work.path().join("report.json");
    let image = reg.reference("fn/orders:v1");
    let built = pod.run(&[
        "build",
        with_deps.to_str().unwrap(),
        "--runtime",
        "nodejs22",
        "--base",
        &lines[0][..lines[0].find('@').unwrap()],
        "--builder-image",
        &lines[1][..lines[1].find('@').unwrap()],
        "--image",
        &image,
        "--cache-repo",
        &cache,
        "--cache-trust-key",
        &key.public,
        "--insecure-registry",
        &host,
        "--report",
        report.to_str().unwrap(),
    ]);
    built.reference();
    assert!(
        !built.stderr.contains("dependencies install"),
        "{}",
        built.stderr
    );
    assert!(
        built.stderr.contains("from the cache repository (mounted"),
        "{}",
        built.stderr
    );
    let report = read_report(&report);
    let deps = blobs_with_role(&report, "dependencies");
    assert_eq!(deps[0]["outcome"], "mounted", "{report}");

    // For a cluster with arm64 Nodes too: each platform's images by digest (arm64's assembled
    // into the store, from the shared downloads), an index over them at the tag, which still
    // lists the same amd64 images; then nothing more to write.
    for dir in ["debs", "npm", "wheels", "pypi"] {
        let shared = common::kiln::shared_download_cache().join(dir);
        std::fs::create_dir_all(&shared).unwrap();
        let own = kiln.cache_dir().join(dir);
        if !own.exists() {
            std::os::unix::fs::symlink(&shared, own).unwrap();
        }
    }
    let both = [
        "warm",
        "--registry",
        &host,
        "--insecure-registry",
        &host,
        "--platform",
        "linux/amd64,linux/arm64",
        "nodejs22",
    ];
    let indexed = kiln.run(&both);
    assert_eq!(indexed.code, 0, "{}", indexed.stderr);
    let index_lines: Vec<&str> = indexed.stdout.lines().collect();
    assert_eq!(index_lines.len(), 2, "{}", indexed.stdout);
    for (line, name) in index_lines.iter().zip(["nodejs22", "nodejs22-builder"]) {
        assert!(line.ends_with(" pushed"), "{line}");
        let raw = common::run(std::process::Command::new("skopeo").args([
            "inspect",
            "--raw",
            "--tls-verify=false",
            &format!("docker://{host}/kiln/{name}:latest"),
        ]));
        let index: serde_json::Value = serde_json::from_str(&raw).unwrap();
        let listed: Vec<(String, String)> = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let arch = m["platform"]["architecture"].as_str().unwrap().to_string();
                (arch, m["digest"].as_str().unwrap().to_string())
            })
            .collect();
        assert_eq!(listed[0].0, "amd64");
        assert_eq!(listed[1].0, "arm64");
        let before = if name == "nodejs22" {
            lines[0]
        } else {
            lines[1]
        };
        assert!(before.contains(&listed[0].1), "{before} {listed:?}");
    }
    assert!(
        indexed.stderr.contains("no kiln for this platform"),
        "{}",
        indexed.stderr
    );
    let before = reg.settled_access_log().len();
    let again = kiln.run(&both);
    assert_eq!(again.code, 0, "{}", again.stderr);
    let log = reg.access_log_since(before);
    assert!(writes(&log).is_empty(), "{log:?}");
    assert_eq!(
        again.stdout.lines().collect::<Vec<_>>(),
        index_lines
            .iter()
            .map(|l| l.replace(" pushed", " unchanged"))
            .collect::<Vec<_>>()
    );
}

#[test]
fn warm_says_what_is_missing() {
    let kiln = Kiln::new();
    let err = kiln.run(&["warm"]).failure(2).to_string();
    assert!(err.contains("pass --registry REGISTRY"), "{err}");
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("node-deps", &work.path().join("f"));
    let err = kiln
        .run(&[
            "warm",
            "--registry",
            "127.0.0.1:5000",
            dir.to_str().unwrap(),
        ])
        .failure(2)
        .to_string();
    assert!(err.contains("pass --runtime RUNTIME"), "{err}");
    let err = kiln
        .run(&[
            "warm",
            "--registry",
            "127.0.0.1:5000",
            "nodejs22",
            dir.to_str().unwrap(),
        ])
        .failure(2)
        .to_string();
    assert!(err.contains("pass --cache-repo REPO"), "{err}");
    // Entries nobody signed would be of no use to any reader.
    let err = kiln
        .run(&[
            "warm",
            "--cache-repo",
            "127.0.0.1:5000/cache",
            "nodejs22",
            dir.to_str().unwrap(),
        ])
        .failure(2)
        .to_string();
    assert!(err.contains("pass --cache-sign-key FILE"), "{err}");
    let err = kiln
        .run(&["warm", "--registry", "r.example", "cobol"])
        .failure(2)
        .to_string();
    assert!(
        err.contains("neither a runtime nor a Function directory"),
        "{err}"
    );
}
