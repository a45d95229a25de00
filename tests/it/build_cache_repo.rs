//! `--cache-repo`: the dependency-layer cache in a registry, shared by build Pods on any
//! node. Every build here starts from an empty local cache (a fresh `Kiln`), as a stateless
//! build Pod does; installs are real (npm registry, inside a kiln-built builder image).

#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::Path;

use common::kiln::{
    Kiln, blobs_with_role, copy_fixture, kiln_built_builder, read_report, test_cache_key, tiny_base,
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
        "--cache-sign-key",
        &test_cache_key().private,
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
                "--cache-trust-key",
                &test_cache_key().public,
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
                "--cache-sign-key",
                &test_cache_key().private,
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

/// The bytes of the blob `digest` in `reg`'s storage.
fn stored_blob(reg: &Registry, digest: &str) -> Vec<u8> {
    let hex = digest.trim_start_matches("sha256:");
    let path = reg
        .storage_root()
        .join("docker/registry/v2/blobs/sha256")
        .join(&hex[..2])
        .join(hex)
        .join("data");
    std::fs::read(path).unwrap()
}

/// What the dependency layer `digest` holds at `node_modules/dayjs/index.js`, if anything,
/// and whether it holds the real package's `dayjs.min.js`.
fn dayjs_in(reg: &Registry, digest: &str) -> (Option<String>, bool) {
    let layer = stored_blob(reg, digest);
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(layer.as_slice()));
    let (mut index, mut real) = (None, false);
    for entry in tar.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().display().to_string();
        if path.ends_with("node_modules/dayjs/index.js") {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut entry, &mut text).unwrap();
            index = Some(text);
        }
        real |= path.ends_with("node_modules/dayjs/dayjs.min.js");
    }
    (index, real)
}

/// The manifest digest of the image named `name` in the OCI layout `dir`.
fn layout_digest(dir: &Path, name: &str) -> String {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == name)
        .and_then(|m| m["digest"].as_str())
        .unwrap()
        .to_string()
}

/// Issue 29's cross-tenant poisoning, replayed. A tenant runs `kiln build` as if natively
/// inside the builder image (`KILN_BUILDER`, a `--builder-image` pinned by digest), so the
/// key names that builder, with a tampered `npm` first on PATH, and pushes its layer to the
/// cache repository under the key an honest build of the same package.json computes. A
/// reader that trusted the tenant's key would mount it (the control: the keys do collide);
/// an honest build that trusts only its own key ignores the entry, installs, and its image
/// holds the real package. The honest build's own entry is then used by the next trusted
/// build on a fresh machine.
#[test]
fn a_poisoned_cache_entry_is_ignored_and_the_honest_build_installs_the_real_packages() {
    common::require_tool("bwrap", "bubblewrap");
    let reg = Registry::start(RegistryKind::Plain);
    let host = reg.host();
    let work = tempfile::tempdir().unwrap();
    let bases = work.path().join("bases");
    let builder = kiln_built_builder(&Kiln::new(), "nodejs22", &bases);
    let builder_digest = layout_digest(&bases, "nodejs22-builder");
    let cache = reg.reference("kiln/cache");
    let tenant_key = common::kiln::CacheKey::new();
    let fun = copy_fixture("node-deps", &work.path().join("fun"));

    // The tenant: a node that claims the runtime's version and an npm that writes its own
    // dayjs.
    let tools = work.path().join("tampered");
    std::fs::create_dir_all(&tools).unwrap();
    let script = |name: &str, body: &str| {
        let path = tools.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
        let mut perms = std::fs::metadata(&path).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&path, perms).unwrap();
    };
    script("node", "echo v22.23.3\n");
    script(
        "npm",
        "[ \"$1\" = --version ] && { echo 11.6.2; exit 0; }\n\
         mkdir -p node_modules/dayjs\n\
         echo '{\"name\":\"dayjs\",\"version\":\"1.11.13\"}' > node_modules/dayjs/package.json\n\
         echo \"module.exports = 'POISONED'\" > node_modules/dayjs/index.js\n",
    );
    let tenant = Kiln::new();
    let path = format!(
        "{}:{}",
        tools.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let pinned = format!("oci:{}@{builder_digest}", bases.display());
    let tiny = common::kiln::tiny_base();
    // A build as if natively inside the builder pinned by digest, with the tampered tools.
    let tenant_build = |image: &str, extra: &[&str]| {
        tenant.run_cmd(
            tenant
                .command()
                .env("KILN_BUILDER", "nodejs22")
                .env("PATH", &path)
                .args(["build", fun.to_str().unwrap(), "--runtime", "nodejs22"])
                .args(["--base", &tiny, "--builder-image", &pinned])
                .args(["--image", &reg.reference(image)])
                .args(extra),
        )
    };
    let poisoned = tenant_build(
        "tenant-a/fn:v1",
        &[
            "--cache-repo",
            &cache,
            "--cache-sign-key",
            &tenant_key.private,
            "--insecure-registry",
            &host,
        ],
    );
    poisoned.reference();
    assert!(
        poisoned
            .stderr
            .contains("stored the dependency layer in the cache repository"),
        "{}",
        poisoned.stderr
    );
    // Natively inside a builder, the toolchain on PATH is checked against the runtime's
    // as well: another Node.js there is an error, not a layer stored under the builder's
    // name.
    script("node", "echo v20.11.0\n");
    let refused = tenant_build("tenant-a/fn:v2", &["--no-cache"]);
    assert!(
        refused.code != 0 && refused.stderr.contains("the nodejs22 runtime needs v22.*"),
        "{}",
        refused.stderr
    );

    // The control: a reader that trusts the tenant's key gets the tenant's layer, so the
    // honest key is the one the tenant wrote to.
    let gullible = Kiln::new();
    let report = work.path().join("gullible.json");
    let run = gullible.run(&[
        "build",
        fun.to_str().unwrap(),
        "--runtime",
        "nodejs22",
        "--base",
        &common::kiln::tiny_base(),
        "--builder-image",
        &builder,
        "--image",
        &reg.reference("gullible/fn:v1"),
        "--cache-repo",
        &cache,
        "--cache-trust-key",
        &tenant_key.public,
        "--insecure-registry",
        &host,
        "--report",
        report.to_str().unwrap(),
    ]);
    run.reference();
    assert!(!run.stderr.contains(INSTALLED), "{}", run.stderr);
    let layer = blobs_with_role(&read_report(&report), "dependencies")[0]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        dayjs_in(&reg, &layer),
        (Some("module.exports = 'POISONED'\n".into()), false)
    );

    // The honest build trusts only its own key: the tenant's entry is ignored, the real
    // packages are installed in the builder image, and its own signed entry replaces it.
    let honest = Kiln::new();
    let (run, layer) = build(
        &honest,
        &fun,
        &builder,
        &reg.reference("tenant-b/fn:v1"),
        &cache,
        &[&host],
    );
    assert!(
        run.stderr
            .contains("ignoring a dependency cache entry no trusted build wrote")
            && run
                .stderr
                .contains(&format!("signed by {}", key_id(&tenant_key.public))),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains(INSTALLED), "{}", run.stderr);
    assert_eq!(dayjs_in(&reg, &layer), (None, true));

    // A fresh trusted machine uses the honest entry.
    let next = Kiln::new();
    let (run, same) = build(
        &next,
        &fun,
        &builder,
        &reg.reference("tenant-c/fn:v1"),
        &cache,
        &[&host],
    );
    assert!(!run.stderr.contains(INSTALLED), "{}", run.stderr);
    assert_eq!(same, layer);

    // A cache repository with no key to trust is refused up front.
    let err = next
        .run(&[
            "build",
            fun.to_str().unwrap(),
            "--runtime",
            "nodejs22",
            "--base",
            &common::kiln::tiny_base(),
            "--image",
            &reg.reference("tenant-d/fn:v1"),
            "--cache-repo",
            &cache,
        ])
        .failure(2)
        .to_string();
    assert!(
        err.contains("--cache-repo needs --cache-trust-key FILE"),
        "{err}"
    );
}

/// The id kiln names a public key by: `sha256:` over its DER.
fn key_id(public_pem: &str) -> String {
    let text = std::fs::read_to_string(public_pem).unwrap();
    kiln::signing::PublicKey::from_pem(&text).unwrap().id()
}
