//! `kiln rebase` against a real registry and real base changes: `kiln base build` with a lock
//! that pins another Node.js patch release (or another major, or another version of a Kyma
//! Python package), real Functions built on the first base and moved to the second. A safe
//! rebase gives, to the digest, the image a full build on the new base gives, pushes no layer
//! bytes, and the image still answers HTTP; an unsafe one is refused with the reason, and the
//! tag is left alone.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::base_change::{bottle_lock, node_lock, push_base, push_base_with};

/// A build for two platforms.
const BOTH: [&str; 2] = ["--platform", "linux/amd64,linux/arm64"];
use crate::sign::check;
use common::function_run::serve;
use common::http;
use common::kiln::{Kiln, Run, copy_fixture};
use common::registry::{Registry, RegistryKind};

/// A registry, and a kiln whose downloads are the tests' shared ones.
pub(crate) struct Setup {
    pub kiln: Kiln,
    pub reg: Registry,
    pub work: tempfile::TempDir,
}

impl Setup {
    pub(crate) fn new() -> Setup {
        common::require_tool("bwrap", "bubblewrap");
        Setup {
            kiln: Kiln::new(),
            reg: Registry::start(RegistryKind::Plain),
            work: tempfile::tempdir().unwrap(),
        }
    }

    pub(crate) fn kiln(&self, args: &[&str]) -> Run {
        self.kiln.run_cmd(
            self.kiln
                .command_with_shared_downloads()
                .args(args)
                .args(["--insecure-registry", &self.reg.host()]),
        )
    }

    /// The runtime's images from `lock` as `kiln/RUNTIME:TAG` (see [`push_base`]).
    pub(crate) fn base(&self, runtime: &str, tag: &str, lock: Option<&Path>) -> (String, String) {
        push_base(&self.reg, runtime, tag, lock)
    }

    /// [`Setup::base`] as indexes over both platforms.
    pub(crate) fn base_for_both(
        &self,
        runtime: &str,
        tag: &str,
        lock: Option<&Path>,
    ) -> (String, String) {
        push_base_with(&self.reg, runtime, tag, lock, &BOTH)
    }

    /// Builds the fixture `name` on `base` (dependencies installed in `builder` when they need
    /// it) as `fns/NAME:TAG`; returns the `repo@digest` reference.
    pub(crate) fn build(
        &self,
        name: &str,
        runtime: &str,
        (base, builder): &(String, String),
        tag: &str,
        extra: &[&str],
    ) -> String {
        // The directory's name is the Function's name, which the image records.
        let dir = self.work.path().join(tag).join(name);
        copy_fixture(name, &dir);
        let image = self.reg.reference(&format!("fns/{name}:{tag}"));
        let mut args = vec!["build", dir.to_str().unwrap(), "--runtime", runtime];
        args.extend([
            "--base",
            base,
            "--builder-image",
            builder,
            "--image",
            &image,
            "-q",
        ]);
        args.extend(extra);
        let run = self.kiln(&args);
        assert_eq!(run.code, 0, "building {name}:\n{}", run.stderr);
        run.stdout.trim().to_string()
    }

    /// `kiln rebase fns/NAME:live --base BASE` with `extra` flags, and its `--report`.
    pub(crate) fn rebase(
        &self,
        name: &str,
        base: &str,
        extra: &[&str],
    ) -> (Run, serde_json::Value) {
        let report = self.work.path().join(format!("{name}-rebase.json"));
        let image = self.reg.reference(&format!("fns/{name}:live"));
        let mut args = vec!["rebase", &image, "--base", base];
        args.extend(["--report", report.to_str().unwrap()]);
        args.extend(extra);
        let run = self.kiln(&args);
        let report = std::fs::read(&report)
            .map(|b| serde_json::from_slice(&b).unwrap())
            .unwrap_or(serde_json::Value::Null);
        (run, report)
    }

    /// A directory with the keys `check.py keys` writes (a.key, a.pub, b.key, b.pub).
    pub(crate) fn keys(&self) -> std::path::PathBuf {
        let keys = self.work.path().join("keys");
        if !keys.exists() {
            std::fs::create_dir_all(&keys).unwrap();
            check(&["keys", keys.to_str().unwrap()]);
        }
        keys
    }

    /// The digest `fns/NAME:live` points at now.
    pub(crate) fn live(&self, name: &str) -> String {
        manifest_digest(&self.reg, &format!("fns/{name}"), "live")
    }
}

/// The digest of `repo:tag`, from the registry's `Docker-Content-Digest`.
pub(crate) fn manifest_digest(reg: &Registry, repo: &str, tag: &str) -> String {
    let out = Command::new("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false"])
        .arg(format!(
            "docker://{}",
            reg.reference(&format!("{repo}:{tag}"))
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    common::sha256_digest(&out.stdout)
}

pub(crate) fn digest_of(reference: &str) -> &str {
    reference.rsplit_once('@').unwrap().1
}

/// Asserts a rebase's report: pushed with mounts, the config and the manifest only.
fn assert_mounts_only(report: &serde_json::Value) {
    let blobs = report["blobs"].as_array().unwrap();
    let count = |outcome: &str| blobs.iter().filter(|b| b["outcome"] == outcome).count();
    let uploaded: Vec<&str> = blobs
        .iter()
        .filter(|b| b["outcome"] == "uploaded")
        .map(|b| b["role"].as_str().unwrap())
        .collect();
    assert_eq!(uploaded, ["config", "manifest"], "{report:#}");
    assert!(count("mounted") >= 1, "no base layer mounted: {report:#}");
    let push = &report["push"];
    // The config's upload is two requests (open, then put), the manifest one.
    assert!(
        push["requests"].as_u64().unwrap() <= 3 + count("mounted") as u64,
        "{report:#}"
    );
    assert!(
        push["bytesSent"].as_u64().unwrap() <= 8 * 1024,
        "{report:#}"
    );
}

#[test]
fn a_node_patch_release_is_rebased_to_the_image_a_full_build_gives_and_an_abi_change_is_not() {
    let s = Setup::new();
    let old = s.base("nodejs22", "1", None);
    let new = s.base("nodejs22", "2", Some(&node_lock(s.work.path(), "22.23.5")));

    // Dependencies from the lock file by kiln itself (no builder involved), and none at all.
    for name in ["node-lockfile", "hello-node"] {
        let built = s.build(name, "nodejs22", &old, "live", &[]);
        let (run, report) = s.rebase(name, &new.0, &[]);
        assert_eq!(run.code, 0, "{name}: {}", run.stderr);
        let rebased = run.stdout.trim();
        assert_ne!(digest_of(rebased), digest_of(&built));
        let full = s.build(name, "nodejs22", &new, "full", &[]);
        assert_eq!(
            digest_of(rebased),
            digest_of(&full),
            "{name}: rebase ≠ full build"
        );
        assert_eq!(s.live(name), digest_of(&full), "{name}: the tag moved");
        assert_mounts_only(&report);
        // Again: on the new base already, nothing to do.
        let (again, report) = s.rebase(name, &new.0, &[]);
        assert_eq!(again.code, 0, "{}", again.stderr);
        assert_eq!(report["decision"], "current");
        // On the new base already, and asked for elsewhere: put where a rebase would have put
        // it, under --image (another tag, another repository) and its key's tag.
        for repo in [format!("fns/{name}"), format!("moved/{name}")] {
            let target = s.reg.reference(&format!("{repo}:v2"));
            let (placed, report) = s.rebase(name, &new.0, &["--image", &target, "--tag-by-key"]);
            assert_eq!(placed.code, 0, "{}", placed.stderr);
            assert_eq!(report["decision"], "current");
            assert_eq!(manifest_digest(&s.reg, &repo, "v2"), digest_of(&full));
            let listed = Command::new("skopeo")
                .args(["list-tags", "--tls-verify=false"])
                .arg(format!("docker://{}", s.reg.reference(&repo)))
                .output()
                .unwrap();
            let tags: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
            let key_tags: Vec<&str> = tags["Tags"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|t| t.as_str().filter(|t| t.starts_with("kiln-")))
                .collect();
            assert_eq!(key_tags.len(), 1, "{tags}");
            assert_eq!(
                manifest_digest(&s.reg, &repo, key_tags[0]),
                digest_of(&full)
            );
        }
    }
    let rebased = s.reg.reference("fns/node-lockfile:live");
    let (port, _running) = serve(&s.kiln, &rebased, &["--insecure-registry", &s.reg.host()]);
    let (status, body) = http::request(port, "GET", "/", &[], b"");
    assert_eq!(status, 200, "{}", body);
    assert!(body.starts_with("1.3.0 1m function"), "{body:?}");

    // Signed: the image's push is the same, and a signature, a provenance of the rebase and
    // an SBOM are stored beside it, which Python's cryptography, the in-toto and SLSA models,
    // cyclonedx-python-lib and kiln verify all accept.
    // The build is signed: a signed rebase signs only an image whose build is proven.
    let keys = s.keys();
    let key = keys.join("a.key");
    let signed = ["--sign-key", key.to_str().unwrap()];
    let built = s.build("node-lockfile", "nodejs22", &old, "live", &signed);
    let (run, report) = s.rebase(
        "node-lockfile",
        &new.0,
        &["--sign-key", key.to_str().unwrap()],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_mounts_only(&report);
    assert!(
        report["signing"]["requests"].as_u64().unwrap() > 0,
        "{report:#}"
    );
    let digest = digest_of(run.stdout.trim());
    assert_ne!(digest, digest_of(&built));
    let (host, public) = (s.reg.host(), keys.join("a.pub"));
    let public = public.to_str().unwrap();
    let on = ["fns/node-lockfile", digest, public];
    assert_eq!(check(&[&["verify", &host][..], &on].concat()), "1");
    let image_key = report["imageKey"].as_str().unwrap();
    assert_eq!(
        check(&[&["provenance", &host][..], &on].concat()),
        image_key
    );
    let packages = check(&[&["sbom", &host][..], &on].concat());
    let packages: serde_json::Value = serde_json::from_str(&packages).unwrap();
    let purls: Vec<&String> = packages.as_object().unwrap().keys().collect();
    for wanted in ["pkg:npm/ms@2.1.3", "pkg:deb/debian/libc6@"] {
        assert!(
            purls.iter().any(|p| p.starts_with(wanted)),
            "{wanted} not in {purls:?}"
        );
    }
    let verify = s.kiln(&[
        "verify",
        run.stdout.trim(),
        "--key",
        public,
        "--build-key",
        image_key,
    ]);
    assert_eq!(verify.code, 0, "{}", verify.stderr);

    // npm ran in the old builder: the new base pairs with another one, so a build would
    // install there. Refused, and the tag stays.
    let built = s.build(
        "node-deps",
        "nodejs22",
        &old,
        "live",
        &["--lockfile-install", "off"],
    );
    for extra in [&[][..], &["--builder", &new.1]] {
        let (run, report) = s.rebase("node-deps", &new.0, extra);
        assert_eq!(run.code, 3, "{}", run.stderr);
        assert_eq!(report["decision"], "rebuild");
        assert!(
            run.stderr.contains("installed in builder image sha256:"),
            "{}",
            run.stderr
        );
        assert_eq!(s.live("node-deps"), digest_of(&built));
    }
    // Paired with the builder it was installed in, it is safe.
    let (run, _) = s.rebase("node-deps", &new.0, &["--builder", &old.1, "--dry-run"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.starts_with("rebase "), "{}", run.stdout);

    // Another Node.js major in the same runtime's base: native modules would not load.
    let major = s.base("nodejs22", "3", Some(&node_lock(s.work.path(), "24.19.0")));
    let before = s.live("node-lockfile");
    let (run, report) = s.rebase("node-lockfile", &major.0, &["--dry-run"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout
            .contains("Node.js changes from 22 (modules 127) to 24 (modules 137)"),
        "{}",
        run.stdout
    );
    assert_eq!(report["decision"], "rebuild");
    let (run, _) = s.rebase("node-lockfile", &major.0, &[]);
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert_eq!(s.live("node-lockfile"), before);
    // Without dependencies there is nothing native to break.
    let (run, _) = s.rebase("hello-node", &major.0, &["--dry-run"]);
    assert!(run.stdout.starts_with("rebase "), "{}", run.stdout);
}

#[test]
fn a_python_base_change_rebases_a_function_without_dependencies_and_not_pinned_wheels() {
    let s = Setup::new();
    // Both bases for two platforms: a one-platform build takes amd64's.
    let old = s.base_for_both("python313", "1", None);
    let lock = bottle_lock(s.work.path(), "0.13.3");
    let new = s.base_for_both("python313", "2", Some(&lock));

    s.build("hello-python", "python313", &old, "live", &[]);
    let (run, report) = s.rebase("hello-python", &new.0, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let full = s.build("hello-python", "python313", &new, "full", &[]);
    assert_eq!(digest_of(run.stdout.trim()), digest_of(&full));
    assert_mounts_only(&report);
    let rebased = s.reg.reference("fns/hello-python:live");
    let (port, _running) = serve(&s.kiln, &rebased, &["--insecure-registry", &s.reg.host()]);
    let (status, body) = http::request(
        port,
        "POST",
        "/",
        &[("Content-Type", "application/json")],
        br#"{"name":"rebase"}"#,
    );
    assert_eq!(status, 200);
    assert!(body.contains("Hello, rebase!"), "{body:?}");

    // Pinned wheels name the builder too (pip runs there for what they do not pin).
    let built = s.build("python-pinned", "python313", &old, "live", &[]);
    let (run, _) = s.rebase("python-pinned", &new.0, &["--builder", &new.1]);
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert!(
        run.stderr.contains("the new base pairs with builder"),
        "{}",
        run.stderr
    );
    assert_eq!(s.live("python-pinned"), digest_of(&built));

    // A build for both platforms: its index moves, each image onto its own platform's new
    // base, to the index a full build for both gives.
    // Signed: the index, and each platform's image with its provenance and SBOM (of a
    // signed build: a signed rebase signs only an image whose build is proven).
    let keys = s.keys();
    let key = keys.join("a.key");
    let signed = ["--sign-key", key.to_str().unwrap()];
    let multi = s.build(
        "hello-python",
        "python313",
        &old,
        "multi",
        &[&BOTH[..], &signed].concat(),
    );
    let image = s.reg.reference("fns/hello-python:multi");
    let planned = s.kiln(&["rebase", &image, "--base", &new.0, "--dry-run"]);
    assert_eq!(planned.code, 0, "{}", planned.stderr);
    // The same Function built for both on the new base, not signed (yet).
    let full = s.build("hello-python", "python313", &new, "multi-full", &BOTH);
    planted_index_is_refused(&s, (&multi, &full), &new.0, &signed);
    let run = s.kiln(&[&["rebase", &image, "--base", &new.0][..], &signed].concat());
    assert_eq!(run.code, 0, "{}", run.stderr);
    let verify = |public: &str| {
        let public = keys.join(public);
        s.kiln(&[
            "verify",
            run.stdout.trim(),
            "--key",
            public.to_str().unwrap(),
        ])
    };
    let verified = verify("a.pub");
    assert_eq!(verified.code, 0, "{}", verified.stderr);
    // Each platform's image has its provenance (its build key) and SBOM, read by check.py.
    let index = s.reg.skopeo_inspect_raw(run.stdout.trim());
    let index: serde_json::Value = serde_json::from_slice(&index).unwrap();
    let public = keys.join("a.pub");
    for entry in index["manifests"].as_array().unwrap() {
        let digest = entry["digest"].as_str().unwrap();
        let on = ["fns/hello-python", digest, public.to_str().unwrap()];
        let host = s.reg.host();
        check(&[&["provenance", &host][..], &on].concat());
        let packages = check(&[&["sbom", &host][..], &on].concat());
        assert!(packages.contains("pkg:pypi/bottle@"), "{packages}");
    }
    assert_eq!(
        verify("b.pub").code,
        1,
        "another key's signature is not there"
    );
    assert_ne!(digest_of(&multi), digest_of(&full));
    assert_eq!(digest_of(run.stdout.trim()), digest_of(&full));
    assert!(
        planned.stdout.starts_with("rebase ") && planned.stdout.contains(digest_of(&full)),
        "{}",
        planned.stdout
    );
    assert_eq!(
        manifest_digest(&s.reg, "fns/hello-python", "multi"),
        digest_of(&full)
    );
    // On the new base already, and asked for in another repository: each platform's image
    // goes there by mounts, then the index (which the registry takes only once they are).
    let moved = s.reg.reference("moved/hello-python:multi");
    let run = s.kiln(&["rebase", &image, "--base", &new.0, "--image", &moved]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        manifest_digest(&s.reg, "moved/hello-python", "multi"),
        digest_of(&full)
    );
    // One platform that cannot move keeps the whole index where it is.
    let pinned = s.build("python-pinned", "python313", &old, "multi", &BOTH);
    let image = s.reg.reference("fns/python-pinned:multi");
    let run = s.kiln(&["rebase", &image, "--base", &new.0, "--builder", &new.1]);
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert!(run.stderr.contains("for linux/amd64: "), "{}", run.stderr);
    assert_eq!(
        manifest_digest(&s.reg, "fns/python-pinned", "multi"),
        digest_of(&pinned)
    );
}

/// `kiln rebase --sign-key` of an image index proves every platform's image the new index
/// lists, those a rebase moves and those on the new base already: the `signed` build's index
/// with its arm64 entry pointed at the `unsigned` build's (as an attacker who can push would
/// plant it) is refused, naming that image, and nothing is written.
fn planted_index_is_refused(s: &Setup, (signed, unsigned): (&str, &str), base: &str, key: &[&str]) {
    let index = |reference: &str| -> serde_json::Value {
        serde_json::from_slice(&s.reg.skopeo_inspect_raw(reference)).unwrap()
    };
    let (mut planted, theirs) = (index(signed), index(unsigned));
    let arm64 = |i: &serde_json::Value| {
        i["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .position(|m| m["platform"]["architecture"] == "arm64")
            .unwrap()
    };
    let (at, from) = (arm64(&planted), arm64(&theirs));
    planted["manifests"][at] = theirs["manifests"][from].clone();
    let unsigned_arm64 = theirs["manifests"][from]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let index_type = "application/vnd.oci.image.index.v1+json";
    let bytes = serde_json::to_vec(&planted).unwrap();
    let host = s.reg.host();
    common::registry::put_manifest(&host, "fns/hello-python", "planted", index_type, &bytes);
    let before = s.reg.settled_access_log().len();
    let image = s.reg.reference("fns/hello-python:planted");
    let run = s.kiln(&[&["rebase", &image, "--base", base][..], key].concat());
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stderr.contains(&unsigned_arm64), "{}", run.stderr);
    assert!(run.stderr.contains("has no signatures"), "{}", run.stderr);
    let log = s.reg.access_log_since(before);
    assert_eq!(common::registry::writes(&log), Vec::<&String>::new());
    assert_eq!(
        manifest_digest(&s.reg, "fns/hello-python", "planted"),
        common::sha256_digest(&bytes)
    );
}
