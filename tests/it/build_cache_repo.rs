//! `--cache-repo`: the dependency-layer cache in a registry, shared by build Pods on any
//! node. Every build here starts from an empty local cache (a fresh `Kiln`), as a stateless
//! build Pod does; installs are real (npm registry, inside a kiln-built builder image).

#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::Path;

use common::kiln::{
    Kiln, blobs_with_role, copy_fixture, kiln_built_builder, read_report, tiny_base,
};
use common::registry::{Registry, RegistryKind};

const INSTALLED: &str = "dependencies install inside the builder image";

/// A build of `dir` into `image` with `--cache-repo cache`, on a fresh machine (`kiln`);
/// the run and the dependency layer's digest.
fn build(
    kiln: &Kiln,
    dir: &Path,
    builder: &str,
    image: &str,
    cache: &str,
    insecure: &[&str],
) -> (common::kiln::Run, String) {
    common::require_tool("bwrap", "bubblewrap");
    let report = tempfile::NamedTempFile::new().unwrap();
    let base = tiny_base();
    let mut args = vec![
        "build",
        dir.to_str().unwrap(),
        "--runtime",
        "nodejs22",
        "--base",
        &base,
        "--builder-image",
        builder,
        "--image",
        image,
        "--cache-repo",
        cache,
        "--report",
        report.path().to_str().unwrap(),
    ];
    for host in insecure {
        args.extend(["--insecure-registry", host]);
    }
    let run = kiln.run(&args);
    run.reference();
    let report = read_report(report.path());
    let deps = blobs_with_role(&report, "dependencies");
    assert_eq!(deps.len(), 1, "{report}");
    let digest = deps[0]["digest"].as_str().unwrap().to_string();
    (run, digest)
}

fn tags(reg: &Registry, repo: &str) -> Vec<String> {
    let out = common::run_with_input(
        std::process::Command::new("curl")
            .args(["-sf", &format!("{}/v2/{repo}/tags/list", reg.url())]),
        b"",
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["tags"]
        .as_array()
        .map(|t| t.iter().map(|t| t.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

fn changed_copy(name: &str, dest: &Path, marker: &str) -> std::path::PathBuf {
    let dir = copy_fixture(name, dest);
    let handler = dir.join("handler.js");
    let source = std::fs::read_to_string(&handler).unwrap();
    std::fs::write(&handler, format!("{source}\n// {marker}\n")).unwrap();
    dir
}

#[test]
fn a_fresh_machine_mounts_the_dependency_layer_from_the_cache_repo_and_a_bad_entry_is_rebuilt() {
    let reg = Registry::start(RegistryKind::Plain);
    let host = reg.host();
    let work = tempfile::tempdir().unwrap();
    let builder = kiln_built_builder(&Kiln::new(), "nodejs22", &work.path().join("bases"));
    let cache = reg.reference("kiln/cache");

    // Machine A: a miss installs, and stores the layer as an artifact after the image.
    let a = Kiln::new();
    let one = changed_copy("node-deps", &work.path().join("one"), "one");
    let (run, layer) = build(
        &a,
        &one,
        &builder,
        &reg.reference("fn/one:v1"),
        &cache,
        &[&host],
    );
    assert!(run.stderr.contains(INSTALLED), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("stored the dependency layer in the cache repository"),
        "{}",
        run.stderr
    );
    let entries = tags(&reg, "kiln/cache");
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert!(entries[0].starts_with("deps-"));
    let entry_ref = reg.reference(&format!("kiln/cache:{}", entries[0]));
    let entry = reg.skopeo_inspect_raw(&entry_ref);
    let v: serde_json::Value = serde_json::from_slice(&entry).unwrap();
    assert_eq!(v["artifactType"], "application/vnd.kiln.dependencies.v1");
    assert_eq!(v["layers"][0]["digest"], layer);
    assert!(v["annotations"]["dev.kiln.dependencies.file.package-lock.json"].is_string());
    assert!(
        !String::from_utf8_lossy(&entry).contains("KILN-SECRET-TOKEN"),
        "the .npmrc token is never in the entry"
    );

    // Machine B, another Function with the same dependencies: one manifest GET, a mount,
    // no install and no upload of the layer.
    let b = Kiln::new();
    let two = changed_copy("node-deps", &work.path().join("two"), "two");
    let before = reg.settled_access_log().len();
    let (run, same) = build(
        &b,
        &two,
        &builder,
        &reg.reference("fn/two:v1"),
        &cache,
        &[&host],
    );
    let log = reg.settled_access_log()[before..].to_vec();
    assert!(!run.stderr.contains(INSTALLED), "{}", run.stderr);
    assert!(
        run.stderr.contains("from the cache repository (mounted"),
        "{}",
        run.stderr
    );
    assert_eq!(same, layer);
    let hex = layer.trim_start_matches("sha256:");
    assert!(
        log.iter()
            .any(|l| l.starts_with("POST /v2/fn/two/blobs/uploads/")
                && l.contains(hex)
                && l.contains("from=kiln")
                && l.ends_with(" 201")),
        "mounted: {log:?}"
    );
    assert!(
        !log.iter()
            .any(|l| l.starts_with("GET ") && l.contains(&format!("blobs/{layer}"))),
        "not downloaded: {log:?}"
    );
    assert_eq!(reg.missing_blobs("fn/two", "v1"), Some(vec![]));

    // The entry is replaced by one kiln did not write for this key (its diff ID dropped):
    // ignored with a warning, the dependencies installed, a good entry stored again.
    let mut bad = v.clone();
    bad["layers"][0]["annotations"] = serde_json::json!({});
    let status = common::run_with_input(
        std::process::Command::new("curl").args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-X",
            "PUT",
            "-H",
            "Content-Type: application/vnd.oci.image.manifest.v1+json",
            "--data-binary",
            "@-",
            &format!("{}/v2/kiln/cache/manifests/{}", reg.url(), entries[0]),
        ]),
        &serde_json::to_vec(&bad).unwrap(),
    );
    assert_eq!(status, "201");
    let c = Kiln::new();
    let three = changed_copy("node-deps", &work.path().join("three"), "three");
    let (run, rebuilt) = build(
        &c,
        &three,
        &builder,
        &reg.reference("fn/three:v1"),
        &cache,
        &[&host],
    );
    assert!(
        run.stderr.contains("ignoring a dependency cache entry"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains(INSTALLED), "{}", run.stderr);
    assert_eq!(rebuilt, layer, "the install is reproducible");
    let fixed: serde_json::Value =
        serde_json::from_slice(&reg.skopeo_inspect_raw(&entry_ref)).unwrap();
    assert!(fixed["layers"][0]["annotations"]["dev.kiln.dependencies.diff-id"].is_string());
}

#[test]
fn a_cache_repo_on_another_registry_is_downloaded_and_one_refusing_access_costs_only_the_cache() {
    let target = Registry::start(RegistryKind::Plain);
    let other = Registry::start(RegistryKind::Plain);
    let locked = Registry::start(RegistryKind::Token);
    let work = tempfile::tempdir().unwrap();
    let builder = kiln_built_builder(&Kiln::new(), "nodejs22", &work.path().join("bases"));
    let cache = other.reference("kiln/cache");
    let hosts = [target.host(), other.host(), locked.host()];
    let insecure: Vec<&str> = hosts.iter().map(String::as_str).collect();

    // Seed the cache on the other registry.
    let one = changed_copy("node-deps", &work.path().join("one"), "one");
    let (run, layer) = build(
        &Kiln::new(),
        &one,
        &builder,
        &other.reference("fn/one:v1"),
        &cache,
        &insecure,
    );
    assert!(run.stderr.contains(INSTALLED), "{}", run.stderr);

    // A fresh machine pushing to the target: downloaded (verified) and uploaded, with a
    // warning; no install.
    let two = changed_copy("node-deps", &work.path().join("two"), "two");
    let (run, same) = build(
        &Kiln::new(),
        &two,
        &builder,
        &target.reference("fn/two:v1"),
        &cache,
        &insecure,
    );
    assert!(!run.stderr.contains(INSTALLED), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("not on the target's registry: downloading"),
        "{}",
        run.stderr
    );
    assert_eq!(same, layer);
    assert_eq!(target.missing_blobs("fn/two", "v1"), Some(vec![]));

    // A cache repository whose registry refuses us (no credentials for its token service):
    // the build installs and succeeds, and says why the cache was not used.
    let three = changed_copy("node-deps", &work.path().join("three"), "three");
    let refused = locked.reference("kiln/cache");
    let (run, _) = build(
        &Kiln::new(),
        &three,
        &builder,
        &target.reference("fn/three:v1"),
        &refused,
        &insecure,
    );
    assert!(
        run.stderr.contains("the cache repository cannot be used"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains(INSTALLED), "{}", run.stderr);
    assert_eq!(target.missing_blobs("fn/three", "v1"), Some(vec![]));
}

/// One build Job's three stages on fresh machines: `lookup` (registry access, no install),
/// `deps` (installs unless the lookup found the layer) and `publish` (into `image`).
struct Job<'a> {
    reg: &'a Registry,
    builder: &'a str,
    cache: String,
    work: &'a Path,
}

impl Job<'_> {
    fn args(&self, dir: &Path, extra: &[&str]) -> Vec<String> {
        let base = tiny_base();
        let mut args = vec![
            "build",
            dir.to_str().unwrap(),
            "--runtime",
            "nodejs22",
            "--base",
            &base,
            "--builder-image",
            self.builder,
        ];
        args.extend(extra);
        args.iter().map(|s| s.to_string()).collect()
    }

    fn run(&self, dir: &Path, extra: &[&str]) -> common::kiln::Run {
        let kiln = Kiln::new();
        kiln.run_cmd(kiln.command().args(self.args(dir, extra)))
    }

    /// The stage directories of Function `name`: (lookup, deps).
    fn dirs(&self, name: &str) -> (String, String) {
        let dir = |stage: &str| {
            let d = self.work.join(format!("{name}-{stage}"));
            d.to_str().unwrap().to_string()
        };
        (dir("lookup"), dir("deps"))
    }

    fn lookup(&self, fun: &Path, name: &str) -> String {
        let (lookup, _) = self.dirs(name);
        let run = self.run(
            fun,
            &[
                "--stage",
                "lookup",
                "--lookup-dir",
                &lookup,
                "--cache-repo",
                &self.cache,
                "--insecure-registry",
                &self.reg.host(),
            ],
        );
        run.reference()
    }

    fn deps(&self, fun: &Path, name: &str) -> common::kiln::Run {
        common::require_tool("bwrap", "bubblewrap");
        let (lookup, deps) = self.dirs(name);
        self.run(
            fun,
            &[
                "--stage",
                "deps",
                "--stage-dir",
                &deps,
                "--lookup-dir",
                &lookup,
            ],
        )
    }

    fn publish(&self, fun: &Path, name: &str) -> common::kiln::Run {
        let (lookup, deps) = self.dirs(name);
        let image = self.reg.reference(&format!("fn/{name}:v1"));
        self.run(
            fun,
            &[
                "--stage",
                "publish",
                "--stage-dir",
                &deps,
                "--lookup-dir",
                &lookup,
                "--cache-repo",
                &self.cache,
                "--image",
                &image,
                "--insecure-registry",
                &self.reg.host(),
            ],
        )
    }
}

/// Edits the stage record in `deps_dir`, as an install script in the `deps` container
/// could.
fn forge_record(deps_dir: &str, edit: impl Fn(&mut serde_json::Value)) {
    let path = Path::new(deps_dir).join("dependencies.json");
    let mut record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut record);
    std::fs::write(&path, serde_json::to_vec(&record).unwrap()).unwrap();
}

#[test]
fn build_jobs_share_the_cache_through_a_lookup_stage_whose_key_the_install_cannot_forge() {
    let reg = Registry::start(RegistryKind::Plain);
    let work = tempfile::tempdir().unwrap();
    let builder = kiln_built_builder(&Kiln::new(), "nodejs22", &work.path().join("bases"));
    let job = Job {
        reg: &reg,
        builder: &builder,
        cache: reg.reference("kiln/cache"),
        work: work.path(),
    };

    // The first Job misses, installs, and its publish stage stores the layer.
    let one = changed_copy("node-deps", &work.path().join("one"), "one");
    assert_eq!(job.lookup(&one, "one"), "miss");
    let run = job.deps(&one, "one");
    run.reference();
    assert!(run.stderr.contains(INSTALLED), "{}", run.stderr);
    let run = job.publish(&one, "one");
    run.reference();
    assert!(
        run.stderr
            .contains("stored the dependency layer in the cache repository"),
        "{}",
        run.stderr
    );
    let entries = tags(&reg, "kiln/cache");
    assert_eq!(entries.len(), 1, "{entries:?}");

    // The second Job, another Function with the same dependencies: the lookup finds the
    // layer, the install stage installs nothing and stages no blob, publish mounts it.
    let two = changed_copy("node-deps", &work.path().join("two"), "two");
    let layer = job.lookup(&two, "two");
    assert!(layer.starts_with("sha256:"), "{layer}");
    let run = job.deps(&two, "two");
    assert_eq!(run.reference(), layer);
    assert!(!run.stderr.contains(INSTALLED), "{}", run.stderr);
    assert!(run.stderr.contains("nothing to install"), "{}", run.stderr);
    let (_, deps_two) = job.dirs("two");
    assert!(!Path::new(&deps_two).join("dependencies.tar.gz").exists());
    let before = reg.settled_access_log().len();
    let run = job.publish(&two, "two");
    run.reference();
    let log = reg.settled_access_log()[before..].to_vec();
    let hex = layer.trim_start_matches("sha256:");
    assert!(
        log.iter()
            .any(|l| l.starts_with("POST /v2/fn/two/blobs/uploads/")
                && l.contains(hex)
                && l.ends_with(" 201")),
        "mounted: {log:?}"
    );
    assert_eq!(reg.missing_blobs("fn/two", "v1"), Some(vec![]));

    // A third Function with other dependencies, whose install forges its record: under the
    // first Function's key, the layer it made is used in its own image but never stored
    // for others; claiming the first Function's cached layer instead is refused.
    let three = work.path().join("three");
    common::kiln::copy_tree(&one, &three);
    let manifest = three.join("package.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(
        &manifest,
        text.replacen('{', "{\"description\": \"three\",", 1),
    )
    .unwrap();
    assert_eq!(job.lookup(&three, "three"), "miss");
    job.deps(&three, "three").reference();
    let (_, deps_three) = job.dirs("three");
    let first_key: serde_json::Value = serde_json::from_slice(
        &std::fs::read(Path::new(&job.dirs("one").1).join("dependencies.json")).unwrap(),
    )
    .unwrap();
    let first_key = first_key["dependencies"]["key"]
        .as_str()
        .unwrap()
        .to_string();
    let own: serde_json::Value = serde_json::from_slice(
        &std::fs::read(Path::new(&deps_three).join("dependencies.json")).unwrap(),
    )
    .unwrap();
    let own_key = own["dependencies"]["key"].as_str().unwrap().to_string();
    assert_ne!(own_key, first_key);
    let swap_key = |r: &mut serde_json::Value| {
        let text = r.to_string().replace(&own_key, &first_key);
        *r = serde_json::from_str(&text).unwrap();
    };
    forge_record(&deps_three, swap_key);
    let run = job.publish(&three, "three");
    run.reference();
    assert!(
        run.stderr.contains("not the one --stage lookup computed"),
        "{}",
        run.stderr
    );
    assert_eq!(tags(&reg, "kiln/cache"), entries, "nothing stored");
    forge_record(&deps_three, |r| {
        r["dependencies"]["inCacheRepo"] = serde_json::json!(true);
        r["dependencies"]["digest"] = serde_json::json!(layer);
    });
    let err = job.publish(&three, "three");
    let err = err.failure(2);
    assert!(
        err.contains("lookup.json") && err.contains("dependency key"),
        "{err}"
    );
}
