//! `kiln cache prune` and `kiln build --cache-max-size`: entries go by age and least recent
//! use, what a running `kiln run` uses stays (and keeps running), the store keeps its runtime
//! base images, and nothing that is still named loses a blob.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::kiln::{Kiln, copy_fixture, tiny_base};
use common::{free_port, run};

use crate::run::{function_layout, http_get, oci};

/// Sets the modification time of `path` to `when` (e.g. `3 days ago`).
fn age(path: &Path, when: &str) {
    run(Command::new("touch").args(["-h", "-d", when]).arg(path));
}

/// Plants a dependency-cache entry (record and blob) as a build writes them.
fn plant_dependency_layer(cache: &Path, name: &str, bytes: usize) -> (String, String) {
    let blob = vec![b'x'; bytes];
    let digest = common::sha256_digest(&blob);
    let hex = digest.trim_start_matches("sha256:").to_string();
    fs::create_dir_all(cache.join("blobs/sha256")).unwrap();
    fs::create_dir_all(cache.join("deps")).unwrap();
    fs::write(cache.join("blobs/sha256").join(&hex), &blob).unwrap();
    let key = common::sha256_digest(name.as_bytes());
    let key_hex = key.trim_start_matches("sha256:").to_string();
    let record = format!(r#"{{"digest":"{digest}","diff_id":"{digest}","size":{bytes}}}"#);
    fs::write(cache.join("deps").join(format!("{key_hex}.json")), record).unwrap();
    (key_hex, hex)
}

fn rootfs_entries(cache: &Path) -> Vec<String> {
    fs::read_dir(cache.join("rootfs/sha256"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn prune_goes_by_age_then_size_and_keeps_what_is_in_use() {
    let kiln = Kiln::new();
    let cache = kiln.cache_dir();
    let layout = function_layout(kiln.home.path());
    // Two unpacked root file systems: one stays in use by a running server.
    let port = free_port();
    let mut server = kiln
        .command()
        .args(["run", &oci(&layout, "web"), "--port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_get(port, "/index.html").is_none() {
        assert!(Instant::now() < deadline, "the server did not answer");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = kiln.run(&["run", &oci(&layout, "exit")]);
    assert_eq!(out.code, 42, "{}", out.stderr);
    let unpacked = rootfs_entries(&cache);
    assert_eq!(unpacked.len(), 2, "{unpacked:?}");
    // A Function image in the store, next to a base image that must stay.
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("hello-node", &work.path().join("hello"));
    kiln.run(&[
        "build",
        dir.to_str().unwrap(),
        "--runtime",
        "nodejs22",
        "--base",
        &tiny_base(),
    ])
    .reference();
    // A runtime base image in the store (its name is not functions/…): prune keeps it.
    run(Command::new("skopeo").args([
        "copy",
        "--quiet",
        &tiny_base(),
        &format!("oci:{}:nodejs22", cache.join("store").display()),
    ]));
    // Dependency layers: an old one, a recent one.
    let (old_key, old_blob) = plant_dependency_layer(&cache, "old", 1000);
    let (new_key, new_blob) = plant_dependency_layer(&cache, "new", 2000);
    for path in [
        cache.join("deps").join(format!("{old_key}.json")),
        cache.join("blobs/sha256").join(&old_blob),
    ] {
        age(&path, "3 days ago");
    }
    for entry in &unpacked {
        age(&cache.join("rootfs/sha256").join(entry), "3 days ago");
    }
    // What the registry client learnt: old records of each kind, and a recent document.
    let records = ["documents/sha256/0a0a", "pushed/0b0b", "registries/0c0c"];
    for record in records {
        let path = cache.join(record);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, b"record").unwrap();
        age(&path, "3 days ago");
    }
    let recent_document = cache.join("documents/sha256/0d0d");
    fs::write(&recent_document, b"recent").unwrap();
    // npm tarballs and wheels: one of each unused for days, one a build took minutes ago
    // (inside the grace).
    fs::create_dir_all(cache.join("npm")).unwrap();
    fs::create_dir_all(cache.join("wheels")).unwrap();
    fs::create_dir_all(cache.join("pypi")).unwrap();
    let (old_tarball, recent_tarball) = (cache.join("npm/0e0e.tgz"), cache.join("npm/0f0f.tgz"));
    let (old_wheel, recent_wheel) = (cache.join("wheels/0a0a.whl"), cache.join("wheels/0b0b.whl"));
    let (old_page, recent_page) = (cache.join("pypi/0c0c.page"), cache.join("pypi/0d0d.page"));
    for (path, when) in [
        (&old_tarball, "3 days ago"),
        (&recent_tarball, "2 minutes ago"),
        (&old_wheel, "3 days ago"),
        (&recent_wheel, "2 minutes ago"),
        (&old_page, "3 days ago"),
        (&recent_page, "2 minutes ago"),
    ] {
        fs::write(path, b"tarball").unwrap();
        age(path, when);
    }

    // Dry run: nothing goes.
    let dry = kiln.run(&["cache", "prune", "--older-than", "1d", "--dry-run"]);
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    assert!(
        dry.stdout.contains("would remove dependencies"),
        "{}",
        dry.stdout
    );
    assert!(cache.join("blobs/sha256").join(&old_blob).exists());

    // By age: the old dependency layer and the idle rootfs go; the server's stays.
    let pruned = kiln.run(&["cache", "prune", "--older-than", "1d"]);
    assert_eq!(pruned.code, 0, "{}", pruned.stderr);
    assert!(pruned.stdout.contains("kept rootfs"), "{}", pruned.stdout);
    assert!(!cache.join("deps").join(format!("{old_key}.json")).exists());
    assert!(
        !cache.join("blobs/sha256").join(&old_blob).exists(),
        "its blob was collected"
    );
    assert!(cache.join("deps").join(format!("{new_key}.json")).exists());
    assert!(cache.join("blobs/sha256").join(&new_blob).exists());
    assert!(
        pruned.stdout.contains("removed 3 registry records"),
        "{}",
        pruned.stdout
    );
    for record in records {
        assert!(!cache.join(record).exists(), "{record}");
    }
    assert!(recent_document.exists());
    assert!(
        pruned.stdout.contains("removed 1 npm tarballs"),
        "{}",
        pruned.stdout
    );
    assert!(!old_tarball.exists());
    assert!(recent_tarball.exists(), "used inside the grace period");
    assert!(
        pruned.stdout.contains("removed 1 wheels"),
        "{}",
        pruned.stdout
    );
    assert!(!old_wheel.exists() && recent_wheel.exists());
    assert!(
        pruned.stdout.contains("removed 1 PyPI project pages"),
        "{}",
        pruned.stdout
    );
    assert!(!old_page.exists() && recent_page.exists());
    assert_eq!(rootfs_entries(&cache).len(), 1, "{}", pruned.stdout);
    assert!(
        http_get(port, "/index.html").is_some(),
        "the server still runs from its rootfs"
    );

    // By size: everything not in use goes, least recent first; the store keeps its base.
    let pruned = kiln.run(&["cache", "prune", "--max-size", "1"]);
    assert_eq!(pruned.code, 0, "{}", pruned.stderr);
    assert!(!cache.join("deps").join(format!("{new_key}.json")).exists());
    assert!(!recent_document.exists(), "{}", pruned.stdout);
    assert!(
        recent_tarball.exists(),
        "a tarball used inside the grace stays, whatever the size"
    );
    assert!(
        pruned
            .stdout
            .contains("removed store image functions/hello"),
        "{}",
        pruned.stdout
    );
    assert_eq!(
        rootfs_entries(&cache).len(),
        1,
        "the server's rootfs is still in use"
    );
    let index = fs::read_to_string(cache.join("store/index.json")).unwrap();
    assert!(!index.contains("functions/hello"), "{index}");
    assert!(index.contains("\"nodejs22\""), "{index}");
    // The base image is still whole (its blobs were not collected).
    let inspect = Command::new("skopeo")
        .args([
            "inspect",
            &format!("oci:{}:nodejs22", cache.join("store").display()),
        ])
        .output()
        .unwrap();
    assert!(
        inspect.status.success(),
        "{}",
        String::from_utf8_lossy(&inspect.stderr)
    );
    run(Command::new("kill").args(["-TERM", &server.id().to_string()]));
    server.wait().unwrap();
    // Once the server is gone, its rootfs can go too.
    let pruned = kiln.run(&["cache", "prune", "--max-size", "1"]);
    assert_eq!(pruned.code, 0, "{}", pruned.stderr);
    assert!(rootfs_entries(&cache).is_empty(), "{}", pruned.stdout);
    // Without a limit it is a usage error.
    let bad = kiln.run(&["cache", "prune"]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(bad.stderr.contains("--older-than"), "{}", bad.stderr);
}

#[test]
fn a_build_with_cache_max_size_trims_the_cache_after_it_is_done() {
    let kiln = Kiln::new();
    let cache = kiln.cache_dir();
    let (key, blob) = plant_dependency_layer(&cache, "stale", 64 * 1024);
    let record = cache.join("deps").join(format!("{key}.json"));
    age(&record, "2 days ago");
    age(&cache.join("blobs/sha256").join(&blob), "2 days ago");
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("hello-node", &work.path().join("hello"));
    let out = work.path().join("out");
    let built = kiln.build_node_into_layout(&dir, &out, &["--cache-max-size", "16K"]);
    built.reference();
    assert!(!record.exists(), "{}", built.stderr);
    assert!(
        built.stderr.contains("pruned the cache"),
        "{}",
        built.stderr
    );
}

#[test]
fn what_killed_builds_left_behind_goes_after_a_day_whatever_the_options() {
    use std::os::unix::fs::PermissionsExt as _;
    let kiln = Kiln::new();
    let cache = kiln.cache_dir();
    // A killed install's scratch directory, with a read-only directory inside (as a builder
    // image's tree has), a killed layer write, a killed unpack; each two days old.
    let install = cache.join("tmp/.tmpINSTALL");
    fs::create_dir_all(install.join("node_modules/locked")).unwrap();
    fs::write(
        install.join("node_modules/locked/index.js"),
        vec![b'x'; 4096],
    )
    .unwrap();
    fs::set_permissions(
        install.join("node_modules/locked"),
        fs::Permissions::from_mode(0o555),
    )
    .unwrap();
    let layer = cache.join("tmp/.layer-KILLED");
    fs::write(&layer, vec![b'y'; 1000]).unwrap();
    let unpack = cache.join("rootfs/tmp/unpack-KILLED");
    fs::create_dir_all(unpack.join("rootfs")).unwrap();
    // Temporary files next to the entries they were to become.
    let temp_files = [
        "npm/.tmpAAAA",
        "npm/.left-pad-1.3.0.tgz.4242.0.part",
        "deps/.tmpBBBB",
        "store/blobs/sha256/.tmpCCCC",
        "documents/sha256/.tmpDDDD",
    ];
    for f in temp_files {
        let path = cache.join(f);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, b"partial").unwrap();
    }
    let old = [&install, &layer, &unpack]
        .into_iter()
        .cloned()
        .chain(temp_files.iter().map(|f| cache.join(f)))
        .collect::<Vec<_>>();
    for path in &old {
        age(path, "2 days ago");
    }
    // What a build still running writes (2 MiB, which --max-size does not count), the
    // store's lock file, a recent dependency layer and a tarball that --older-than 30d keeps.
    let running = cache.join("tmp/.tmpRUNNING");
    fs::create_dir_all(&running).unwrap();
    fs::write(running.join("layer"), vec![0u8; 2 << 20]).unwrap();
    age(&running, "2 hours ago");
    let store_lock = cache.join("store/.lock");
    fs::write(&store_lock, b"").unwrap();
    age(&store_lock, "2 days ago");
    let (key, _) = plant_dependency_layer(&cache, "recent", 1000);
    let fresh_temp = cache.join("npm/.tmpDDDD");
    fs::write(&fresh_temp, b"partial").unwrap();
    let tarball = cache.join("npm/0e0e.tgz");
    fs::write(&tarball, b"tarball").unwrap();
    age(&tarball, "2 days ago");

    let dry = kiln.run(&["cache", "prune", "--older-than", "30d", "--dry-run"]);
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    assert!(
        dry.stdout
            .contains("would remove 8 abandoned temporary files"),
        "{}",
        dry.stdout
    );
    assert!(old.iter().all(|p| p.exists()), "a dry run removes nothing");

    let pruned = kiln.run(&["cache", "prune", "--older-than", "30d"]);
    assert_eq!(pruned.code, 0, "{}", pruned.stderr);
    assert!(
        pruned
            .stdout
            .contains("removed 8 abandoned temporary files"),
        "{}",
        pruned.stdout
    );
    for path in &old {
        assert!(!path.exists(), "{} is still there", path.display());
    }
    assert!(
        !pruned.stdout.contains("registry record"),
        "a temporary file is not a record: {}",
        pruned.stdout
    );
    assert!(
        running.exists(),
        "a running build's scratch directory stays"
    );
    assert!(fresh_temp.exists(), "a temporary file being written stays");
    assert!(store_lock.exists(), "the store's lock is no temporary file");
    assert!(tarball.exists(), "younger than --older-than");

    // A build's scratch is not what --max-size caps: the dependency layer stays.
    let pruned = kiln.run(&["cache", "prune", "--max-size", "1M"]);
    assert_eq!(pruned.code, 0, "{}", pruned.stderr);
    assert!(
        cache.join("deps").join(format!("{key}.json")).exists(),
        "{}",
        pruned.stdout
    );
}
