//! Real dependency installs from the npm registry and PyPI inside a builder image that kiln
//! assembled (`kiln base build`, bubblewrap), on the tiny base given with `--base`: the
//! dependency layer holds what was installed, secrets from `.npmrc`/`pip.conf` never reach
//! the image or the logs, and a cached dependency layer makes a source-only rebuild skip the
//! install entirely. The host's toolchain never stands in.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::fs;
use std::io::Read;
use std::path::Path;

use common::kiln::{
    Kiln, blobs_with_role, copy_fixture, kiln_built_builder, read_report, tiny_base,
};
use common::schema::validate_layout;

/// Every file path and the concatenated content of every layer in the layout's only image.
fn layer_contents(layout: &Path) -> (Vec<String>, Vec<u8>) {
    let index: serde_json::Value =
        serde_json::from_slice(&fs::read(layout.join("index.json")).unwrap()).unwrap();
    let manifest_digest = index["manifests"][0]["digest"].as_str().unwrap();
    let blob = |d: &str| {
        fs::read(
            layout
                .join("blobs/sha256")
                .join(d.trim_start_matches("sha256:")),
        )
        .unwrap()
    };
    let manifest: serde_json::Value = serde_json::from_slice(&blob(manifest_digest)).unwrap();
    let (mut paths, mut content) = (Vec::new(), Vec::new());
    for layer in manifest["layers"].as_array().unwrap() {
        let bytes = blob(layer["digest"].as_str().unwrap());
        let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(&bytes[..]));
        for entry in tar.entries().unwrap() {
            let mut entry = entry.unwrap();
            paths.push(entry.path().unwrap().display().to_string());
            entry.read_to_end(&mut content).unwrap();
        }
    }
    content.extend_from_slice(&blob(manifest["config"]["digest"].as_str().unwrap()));
    (paths, content)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A build of `dir` on the tiny base, its dependencies installed in `builder`.
fn build(
    kiln: &Kiln,
    dir: &Path,
    runtime: &str,
    builder: &str,
    out: &Path,
    report: &Path,
    installs: bool,
) -> common::kiln::Run {
    common::require_tool("bwrap", "bubblewrap");
    let (base, output) = (tiny_base(), format!("oci:{}", out.display()));
    let run = kiln.run(&[
        "build",
        dir.to_str().unwrap(),
        "--runtime",
        runtime,
        "--base",
        &base,
        "--builder-image",
        builder,
        "--output",
        &output,
        "--report",
        report.to_str().unwrap(),
    ]);
    // The builder is unpacked only for an install; a cached dependency layer needs neither.
    assert_eq!(
        run.stderr
            .contains("dependencies install inside the builder image"),
        installs,
        "{}",
        run.stderr
    );
    // A Node.js Function here has an .npmrc (and maybe no lock): npm must run, and the log
    // says why.
    if runtime.starts_with("nodejs") {
        let why = [".npmrc may name another registry", "no package-lock.json"];
        assert!(
            run.stderr
                .contains("the dependencies need npm: the lock file does not decide them alone")
                && why.iter().any(|w| run.stderr.contains(w)),
            "{}",
            run.stderr
        );
    }
    assert!(
        !run.stderr.contains("on PATH is"),
        "the toolchain on PATH is never consulted: {}",
        run.stderr
    );
    run
}

#[test]
fn npm_dependencies_are_layered_without_the_npmrc_and_cached_for_source_only_rebuilds() {
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let builder = kiln_built_builder(&kiln, "nodejs22", &work.path().join("bases"));
    let dir = copy_fixture("node-deps", &work.path().join("fn"));
    let (out, report) = (work.path().join("out"), work.path().join("r.json"));
    let run = build(&kiln, &dir, "nodejs22", &builder, &out, &report, true);
    run.reference();
    validate_layout(&out);
    let (paths, content) = layer_contents(&out);
    for want in [
        "usr/src/app/function/node_modules/lodash/package.json",
        "usr/src/app/function/node_modules/dayjs/package.json",
        "usr/src/app/function/handler.js",
        "usr/src/app/function/package-lock.json",
    ] {
        assert!(paths.iter().any(|p| p == want), "{want} missing");
    }
    assert!(
        !paths.iter().any(|p| p.contains("left-pad")),
        "dev dependencies are omitted"
    );
    assert!(
        !paths.iter().any(|p| p.ends_with(".npmrc")),
        "the .npmrc never enters a layer"
    );
    assert!(
        !contains(&content, b"KILN-SECRET-TOKEN-5f1c"),
        "the token never enters the image"
    );
    assert!(!run.stderr.contains("KILN-SECRET-TOKEN"), "nor the logs");
    let first = read_report(&report);
    let deps = blobs_with_role(&first, "dependencies");
    assert_eq!(deps.len(), 1);

    // A source-only change reuses the cached dependency layer: no install runs.
    fs::write(
        dir.join("handler.js"),
        "module.exports = { main: () => 'changed' };\n",
    )
    .unwrap();
    // Without the unpacked builder: a cache hit must not need it.
    let rootfs_cache = kiln.cache_dir().join("rootfs");
    fs::remove_dir_all(&rootfs_cache).unwrap();
    let again = build(&kiln, &dir, "nodejs22", &builder, &out, &report, false);
    assert!(!rootfs_cache.exists(), "the builder was not unpacked again");
    again.reference();
    assert!(
        again.stderr.contains("dependency layer from cache"),
        "{}",
        again.stderr
    );
    assert!(
        !again.stderr.contains("installing dependencies"),
        "{}",
        again.stderr
    );
    let second = read_report(&report);
    let deps2 = blobs_with_role(&second, "dependencies");
    assert_eq!(deps2[0]["digest"], deps[0]["digest"]);
}

#[test]
fn a_long_install_reports_its_progress_with_the_last_line_masked() {
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let builder = kiln_built_builder(&kiln, "nodejs22", &work.path().join("bases"));
    let dir = work.path().join("fn");
    fs::create_dir_all(&dir).unwrap();
    fs::write(
        dir.join("handler.js"),
        "module.exports = { main: () => 'hi' };\n",
    )
    .unwrap();
    fs::write(
        dir.join(".npmrc"),
        "//registry.npmjs.org/:_authToken=KILN-PROGRESS-TOKEN-77\n",
    )
    .unwrap();
    // The Function's own lifecycle script (npm runs it on install): a step of 7 s whose
    // last line printed before it names the token.
    fs::write(
        dir.join("package.json"),
        r#"{"name": "slow", "version": "1.0.0", "dependencies": {"ms": "2.1.3"},
            "scripts": {"preinstall": "echo warming up with KILN-PROGRESS-TOKEN-77 && sleep 7"}}"#,
    )
    .unwrap();
    let (out, report) = (work.path().join("out"), work.path().join("r.json"));
    let run = build(&kiln, &dir, "nodejs22", &builder, &out, &report, true);
    run.reference();
    let progress: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("dependency install running"))
        .collect();
    assert!(!progress.is_empty(), "{}", run.stderr);
    assert!(
        progress.iter().any(|l| l.contains("warming up with")),
        "{progress:?}"
    );
    assert!(
        !run.stderr.contains("KILN-PROGRESS-TOKEN-77"),
        "{}",
        run.stderr
    );

    // On a terminal the running install is the dependencies step's live line instead,
    // redrawn in place: a spinner with the same masked last line, and no periodic log lines.
    let (base, output) = (tiny_base(), format!("oci:{}", out.display()));
    let (code, shown) = kiln.run_on_terminal(&[
        "build",
        dir.to_str().unwrap(),
        "--runtime",
        "nodejs22",
        "--base",
        &base,
        "--builder-image",
        &builder,
        "--output",
        &output,
        "--no-cache",
    ]);
    assert_eq!(code, 0, "{shown}");
    let live: Vec<&str> = shown
        .split(['\r', '\n'])
        .filter(|l| l.contains("dependencies") && l.contains("warming up with"))
        .collect();
    assert!(live.len() > 1, "the line is redrawn: {shown:?}");
    assert!(!shown.contains("dependency install running"), "{shown}");
    assert!(!shown.contains("KILN-PROGRESS-TOKEN-77"), "{shown}");
    assert!(
        shown.contains("✓ dependencies "),
        "the step is done: {shown}"
    );
    assert!(shown.contains("  image "), "the summary follows: {shown}");
}

#[test]
fn a_fresh_install_reproduces_the_same_dependency_layer() {
    let work = tempfile::tempdir().unwrap();
    let builder = kiln_built_builder(&Kiln::new(), "nodejs22", &work.path().join("bases"));
    let dir = copy_fixture("node-deps", &work.path().join("fn"));
    let mut digests = Vec::new();
    for i in 0..2 {
        // A separate kiln home each time: no shared cache, a real second install.
        let kiln = Kiln::new();
        let report = work.path().join(format!("r{i}.json"));
        build(
            &kiln,
            &dir,
            "nodejs22",
            &builder,
            &work.path().join(format!("out{i}")),
            &report,
            true,
        )
        .reference();
        digests.push(blobs_with_role(&read_report(&report), "dependencies")[0]["digest"].clone());
    }
    assert_eq!(digests[0], digests[1]);
}

#[test]
fn pip_dependencies_are_layered_without_the_pip_conf() {
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let builder = kiln_built_builder(&kiln, "python313", &work.path().join("bases"));
    let dir = copy_fixture("python-deps", &work.path().join("fn"));
    let (out, report) = (work.path().join("out"), work.path().join("r.json"));
    let run = build(&kiln, &dir, "python313", &builder, &out, &report, true);
    run.reference();
    validate_layout(&out);
    let (paths, content) = layer_contents(&out);
    assert!(
        paths
            .iter()
            .any(|p| p == "kubeless/site-packages/yaml/__init__.py"),
        "PyYAML installed"
    );
    assert!(
        paths.iter().any(
            |p| p.starts_with("kubeless/site-packages/yaml/_yaml.cpython-313-")
                && p.ends_with(".so")
        ),
        "with its compiled extension, built for the builder's Python 3.13"
    );
    assert!(paths.iter().any(|p| p == "kubeless/handler.py"));
    assert!(!paths.iter().any(|p| p.ends_with("pip.conf")));
    assert!(
        !paths.iter().any(|p| p.ends_with(".pyc")),
        "no bytecode: it would embed build times"
    );
    assert!(
        !contains(&content, b"KILN-PIP-SECRET-9a7e"),
        "the password never enters the image"
    );
    assert!(!run.stderr.contains("KILN-PIP-SECRET"), "nor the logs");
}

const LEFT_PAD_LOCK: &str = "{
  \"name\": \"conc\",
  \"version\": \"1.0.0\",
  \"lockfileVersion\": 3,
  \"requires\": true,
  \"packages\": {
    \"\": {
      \"name\": \"conc\",
      \"version\": \"1.0.0\",
      \"dependencies\": {
        \"left-pad\": \"1.3.0\"
      }
    },
    \"node_modules/left-pad\": {
      \"version\": \"1.3.0\",
      \"resolved\": \"https://registry.npmjs.org/left-pad/-/left-pad-1.3.0.tgz\",
      \"integrity\": \
          \"sha512-XI5MPzVNApjAyhQzphX8BkmKsKUxD4LdyK24iZeQGinBN9yTQT3bFlCBy/\
          aVx2HrNcqQGsdot8ghrjyrvMCoEA==\",
      \"license\": \"WTFPL\"
    }
  }
}
";

/// Issue 10's concurrency case: eight different Functions and four copies of one Function
/// (same tag), built at once with one cache directory into one registry. Every image is
/// named and complete, the shared dependency cache holds one consistent entry that a later
/// build hits, and nothing temporary is left behind.
#[test]
fn twelve_concurrent_builds_share_one_cache_and_one_registry_without_losing_anything() {
    use common::registry::{Registry, RegistryKind};
    common::require_tool("bwrap", "bubblewrap");
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let builder = kiln_built_builder(&kiln, "nodejs22", &work.path().join("bases"));
    let reg = Registry::start(RegistryKind::Plain);
    let host = reg.host();
    let base = tiny_base();
    // One small dependency (a single file), locked: the same dependency key everywhere.
    let function = |name: &str, n: usize| {
        let dir = work.path().join(name);
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("handler.js"),
            format!("module.exports = {{ main: () => {n} }};\n"),
        )
        .unwrap();
        fs::write(
            dir.join("package.json"),
            r#"{"name":"conc","version":"1.0.0","dependencies":{"left-pad":"1.3.0"}}"#,
        )
        .unwrap();
        fs::write(dir.join("package-lock.json"), LEFT_PAD_LOCK).unwrap();
        dir
    };
    let mut jobs: Vec<(std::path::PathBuf, String)> = (0..8)
        .map(|n| (function(&format!("f{n}"), n), format!("{host}/conc/f{n}:1")))
        .collect();
    let same = function("same", 99);
    jobs.extend((0..4).map(|_| (same.clone(), format!("{host}/conc/same:1"))));
    let children: Vec<_> = jobs
        .iter()
        .map(|(dir, image)| {
            kiln.command()
                .args(["build", dir.to_str().unwrap(), "--runtime", "nodejs22"])
                .args(["--base", &base, "--builder-image", &builder])
                .args(["--image", image, "--insecure-registry", &host])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (child, (_, image)) in children.into_iter().zip(&jobs) {
        let done = child.wait_with_output().unwrap();
        assert!(
            done.status.success(),
            "{image}: {}",
            String::from_utf8_lossy(&done.stderr)
        );
    }
    for repo in (0..8)
        .map(|n| format!("conc/f{n}"))
        .chain(["conc/same".into()])
    {
        let missing = reg
            .missing_blobs(&repo, "1")
            .unwrap_or_else(|| panic!("{repo}:1 is not there"));
        assert!(
            missing.is_empty(),
            "{repo}:1 names missing blobs {missing:?}"
        );
    }
    // One dependency key (the same package.json and lock everywhere): one record, whose blob
    // is whole, and no temporary file anywhere in the cache.
    let cache = kiln.cache_dir();
    // (`<key>.lock` next to it is the entry's in-use lock, kept for the next user.)
    let records: Vec<_> = fs::read_dir(cache.join("deps"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !name.ends_with(".lock"))
        .collect();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(
        fs::read_dir(cache.join("tmp")).unwrap().count(),
        0,
        "cache tmp/ is empty"
    );
    let record: serde_json::Value =
        serde_json::from_slice(&fs::read(cache.join("deps").join(&records[0])).unwrap()).unwrap();
    let blob = cache.join("blobs/sha256").join(
        record["digest"]
            .as_str()
            .unwrap()
            .trim_start_matches("sha256:"),
    );
    assert_eq!(
        common::sha256_file(&blob),
        record["digest"].as_str().unwrap(),
        "the cached blob is whole"
    );
    // A later build of another Function hits the cache.
    let later = function("later", 100);
    let run = kiln.run(&[
        "build",
        later.to_str().unwrap(),
        "--runtime",
        "nodejs22",
        "--base",
        &base,
        "--builder-image",
        &builder,
        "--image",
        &format!("{host}/conc/later:1"),
        "--insecure-registry",
        &host,
    ]);
    run.reference();
    assert!(
        run.stderr.contains("dependency layer from cache"),
        "{}",
        run.stderr
    );
}
