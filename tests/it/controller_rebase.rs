//! The controller rolls its fleet onto a runtime's new base: the real nodejs22 base and
//! builder from `kiln base build` in the registry (for linux/amd64 and linux/arm64),
//! Functions whose "build Jobs" (ended by the stand-in) push real kiln-built images, then
//! `kiln base build` again with another Node.js patch release under the same tags. A Function
//! without dependencies is rebased by the controller itself, with no Job, and so is one built
//! for both platforms (its index, to the digest a build gives); one whose dependencies npm
//! installed in the old builder is built again by a Job; one that opted out stays and says a
//! newer base is available. A dry run first says which would be which, and changes nothing.
//! The controller signs (`--image-signing-secret`) and deploys only proven images
//! (`--require-provenance`): what it rebases, it signs, with a provenance and an SBOM, so the
//! rebased Functions run without a Job.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::sign::check;
use common::base_change::{node_lock, push_base_with};
use common::controller_env::{ControllerEnv, SYSTEM, node_function};
use common::fake_builds::{FakeBuilds, FakeRollouts, Outcome, job_arg};
use common::kiln::Kiln;

use base64::Engine as _;

const HELLO: &str = "module.exports = { main: () => 'hello' }";
const WITH_DEPS: &str = "const ms = require('ms'); module.exports = { main: () => ms(60000) }";
const DEPS: &str = r#"{"name": "deps", "version": "1.0.0", "dependencies": {"ms": "2.1.3"}}"#;

/// The Node.js release of the new base: one npm has for both platforms.
const NEXT_NODE: &str = "22.23.2";

/// The platforms of the Function built for several.
const BOTH: &str = "linux/amd64,linux/arm64";

/// `kiln base build nodejs22` for both platforms as the registry's `kiln/nodejs22:latest`
/// (and the builder), from `lock` when given.
fn base_images(env: &ControllerEnv, lock: Option<&Path>) {
    push_base_with(
        &env.registry,
        "nodejs22",
        "latest",
        lock,
        &["--platform", BOTH],
    );
}

/// The image a build Job would push for Function `name` (namespace `team`): built by kiln on
/// the registry's current base (dependencies installed by npm in its builder) into a layout;
/// returns the layout and the manifest digest.
fn job_image(
    env: &ControllerEnv,
    work: &Path,
    name: &str,
    deps: Option<&str>,
) -> (std::path::PathBuf, String) {
    // `multi` is built for both platforms, as its annotation asks.
    let platforms: &[&str] = match name {
        "multi" => &["--platform", BOTH],
        _ => &[],
    };
    let dir = work.join("src").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let source = if deps.is_some() { WITH_DEPS } else { HELLO };
    std::fs::write(dir.join("handler.js"), source).unwrap();
    std::fs::write(dir.join("package.json"), deps.unwrap_or("{}")).unwrap();
    let layout = work.join("layouts").join(name);
    let kiln = Kiln::new();
    let reg = &env.registry;
    let pinned = |repo: &str| {
        let digest = common::sha256_digest(&common::run_bytes(
            Command::new("skopeo")
                .args(["inspect", "--raw", "--tls-verify=false"])
                .arg(format!(
                    "docker://{}",
                    reg.reference(&format!("{repo}:latest"))
                )),
        ));
        format!("{}@{digest}", reg.reference(repo))
    };
    let run = kiln.run_cmd(
        kiln.command_with_shared_downloads()
            .arg("build")
            .arg(&dir)
            .args([
                "--runtime",
                "nodejs22",
                "--namespace",
                "team",
                "--name",
                name,
                "-q",
            ])
            .args(["--base", &pinned("kiln/nodejs22")])
            .args(["--builder-image", &pinned("kiln/nodejs22-builder")])
            .args(["--insecure-registry", &reg.host()])
            .args(platforms)
            .arg("--output")
            .arg(format!("oci:{}:{name}", layout.display())),
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let digest = run.stdout.trim().rsplit_once('@').unwrap().1.to_string();
    (layout, digest)
}

/// The Event reasons and notes about Function `name`.
fn events(env: &ControllerEnv, name: &str) -> Vec<(String, String)> {
    env.api
        .list("Event.events.k8s.io")
        .into_iter()
        .filter(|e| e["regarding"]["name"] == name)
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (s("reason"), s("note"))
        })
        .collect()
}

/// The base digest the image `status.image` of Function `name` records.
fn image_base(env: &ControllerEnv, name: &str) -> String {
    let image = env.function("team", name)["status"]["image"]
        .as_str()
        .unwrap()
        .to_string();
    let config = common::run_bytes(
        Command::new("skopeo")
            .args(["inspect", "--config", "--tls-verify=false"])
            .arg(format!("docker://{image}")),
    );
    common::jq_raw(
        ".config.Labels[\"org.opencontainers.image.base.digest\"]",
        &config,
    )
}

fn reason(env: &ControllerEnv, name: &str) -> (String, String) {
    let (status, reason, message) = env.condition("team", name, "BuildReady").unwrap();
    (format!("{status} {reason}"), message)
}

#[test]
fn a_base_change_rebases_safe_functions_without_a_job_and_builds_the_others() {
    common::require_tool("bwrap", "bubblewrap");
    let work = tempfile::tempdir().unwrap();
    let mut env = ControllerEnv::start(&[]);
    let keys = work.path().join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    check(&["keys", keys.to_str().unwrap()]);
    let read = |name: &str| std::fs::read_to_string(keys.join(name)).unwrap();
    let b64 = |t: &str| base64::engine::general_purpose::STANDARD.encode(t);
    env.api.insert(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "kiln-image-signing", "namespace": SYSTEM},
        "data": {"cosign.key": b64(&read("a.key")), "cosign.pub": b64(&read("a.pub")),
                 "cosign.password": ""},
    }));
    base_images(&env, None);
    let reg = &env.registry;
    let flags = [
        format!(
            "--base-image=nodejs22={}",
            reg.reference("kiln/nodejs22:latest")
        ),
        format!(
            "--builder-image=nodejs22={}",
            reg.reference("kiln/nodejs22-builder:latest")
        ),
        "--image-cache-ttl=1".to_string(),
        "--image-signing-secret=kiln-image-signing".to_string(),
        "--require-provenance".to_string(),
    ];
    let flags: Vec<String> = flags.to_vec();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    env.spawn(&flags);

    let functions = [
        ("hello", None),
        ("deps", Some(DEPS)),
        ("pinned", None),
        ("multi", None),
    ];
    let images: BTreeMap<&str, (std::path::PathBuf, String)> = functions
        .iter()
        .map(|(name, deps)| (*name, job_image(&env, work.path(), name, *deps)))
        .collect();
    let builds = FakeBuilds::start(env.api.client(), Duration::from_millis(100), {
        let images = images.clone();
        let key = keys.join("a.key");
        move |job| {
            let target = job_arg(job, "--image").unwrap_or_default();
            let name = target
                .rsplit_once(':')
                .unwrap()
                .0
                .rsplit('/')
                .next()
                .unwrap()
                .to_string();
            let (layout, digest) = images[name.as_str()].clone();
            Outcome::Signed {
                push: Box::new(Outcome::Push {
                    layout,
                    tag: name,
                    digest,
                    creds: None,
                }),
                key: key.clone(),
                pushed_as: None,
            }
        }
    });
    let _rollouts = FakeRollouts::start(env.api.client());
    for (name, deps) in functions {
        let mut yaml = node_function(name, if deps.is_some() { WITH_DEPS } else { HELLO }, deps);
        let annotation = match name {
            "pinned" => "kiln.io/auto-rebase: \"false\"".to_string(),
            "multi" => format!("kiln.io/platforms: \"{BOTH}\""),
            _ => String::new(),
        };
        if !annotation.is_empty() {
            let metadata = format!("metadata:\n  annotations: {{{annotation}}}\n");
            yaml = yaml.replacen("metadata:\n", &metadata, 1);
        }
        env.create_function("team", &yaml);
    }
    for (name, _) in functions {
        env.wait_condition("team", name, "Running", "True", Some("DeploymentReady"));
    }
    assert_eq!(builds.stats().ended.len(), 4, "one Job per Function");
    let before: BTreeMap<&str, String> = functions
        .iter()
        .map(|(n, _)| {
            (
                *n,
                env.function("team", n)["status"]["digest"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect();
    let old_base = image_base(&env, "hello");
    let builder_tag = env.registry.reference("kiln/nodejs22-builder:latest");
    let old_builder = tag_digest(&builder_tag);

    // A dry run: every Function says what would happen, and stays.
    let mut dry: Vec<&str> = flags.clone();
    dry.push("--rebase-dry-run");
    env.spawn(&dry);
    base_images(&env, Some(&node_lock(work.path(), NEXT_NODE)));
    for name in ["hello", "deps", "pinned", "multi"] {
        env.wait(
            &format!("{name} says a newer base is available"),
            Duration::from_secs(60),
            || reason(&env, name).0 == "True NewerBaseAvailable",
        );
    }
    let said = |name| reason(&env, name).1;
    assert!(
        said("hello").contains("would rebase to sha256:"),
        "{}",
        said("hello")
    );
    assert!(
        said("deps").contains("would build: the dependencies were installed in builder image"),
        "{}",
        said("deps")
    );
    assert!(
        said("hello").starts_with("the base and builder images changed"),
        "{}",
        said("hello")
    );
    assert!(
        said("multi").contains("would rebase to sha256:"),
        "{}",
        said("multi")
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(builds.stats().ended.len(), 4, "no Job in a dry run");
    for (name, digest) in &before {
        assert_eq!(
            env.function("team", name)["status"]["digest"],
            digest.as_str()
        );
    }

    // For real: hello is rebased with no Job, deps is built again, pinned stays.
    env.spawn(&flags);
    env.wait("hello rebased", Duration::from_secs(60), || {
        reason(&env, "hello").0 == "True ImageRebased"
    });
    env.wait_condition("team", "hello", "Running", "True", Some("DeploymentReady"));
    let hello = env.function("team", "hello");
    assert_ne!(hello["status"]["digest"], before["hello"].as_str());
    let new_base = image_base(&env, "hello");
    assert_ne!(new_base, old_base, "the rebased image names the new base");
    let deployment = env.api.get("Deployment", "team", "hello").unwrap();
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        hello["status"]["image"]
    );
    assert!(
        events(&env, "hello")
            .iter()
            .any(|(r, n)| r == "ImageRebased" && n.contains("no build")),
        "{:?}",
        events(&env, "hello")
    );
    // Signed by the controller: the signature, the provenance (naming the image's build
    // key) and the SBOM, each checked by Python's cryptography and the in-toto, SLSA and
    // CycloneDX models; and by kiln verify, as pushed under the Function's build key tag.
    let digest = hello["status"]["digest"].as_str().unwrap();
    let (host, public) = (env.registry.host(), keys.join("a.pub"));
    let on = ["functions/team/hello", digest, public.to_str().unwrap()];
    assert_eq!(check(&[&["verify", &host][..], &on].concat()), "1");
    check(&[&["provenance", &host][..], &on].concat());
    let packages = check(&[&["sbom", &host][..], &on].concat());
    assert!(packages.contains("pkg:deb/debian/libc6@"), "{packages}");

    // multi's index is rebased too, each platform's image onto its own new base: the index
    // a build for both platforms on the new base gives.
    env.wait("multi rebased", Duration::from_secs(60), || {
        reason(&env, "multi").0 == "True ImageRebased"
    });
    let multi = env.function("team", "multi");
    let (_, built) = job_image(&env, work.path(), "multi", None);
    assert_eq!(multi["status"]["digest"], built.as_str(), "{multi:#}");
    assert_ne!(built, before["multi"]);
    let index = multi["status"]["image"].as_str().unwrap();
    let verify = Kiln::new().run(&[
        "verify",
        index,
        "--key",
        public.to_str().unwrap(),
        "--insecure-registry",
        &host,
    ]);
    assert_eq!(verify.code, 0, "{}", verify.stderr);

    env.wait("deps built again", Duration::from_secs(90), || {
        builds.stats().ended.len() == 5 && reason(&env, "deps").0 == "True JobFinished"
    });
    let deps_events = events(&env, "deps");
    assert!(
        deps_events
            .iter()
            .any(|(r, n)| r == "RebuildForNewBase" && n.contains("installed in builder image")),
        "{deps_events:?}"
    );
    assert_eq!(reason(&env, "pinned").0, "True NewerBaseAvailable");
    assert!(
        reason(&env, "pinned").1.contains("kiln.io/auto-rebase"),
        "{}",
        reason(&env, "pinned").1
    );
    assert_eq!(
        env.function("team", "pinned")["status"]["digest"],
        before["pinned"].as_str()
    );
    let ended = builds.stats().ended;
    assert_eq!(ended.len(), 5, "one more Job, for deps only: {ended:?}");
    assert!(ended[4].contains("deps"), "{ended:?}");

    // Only the builder changes (back to the one before). hello installed nothing there, so
    // its image is what a build on these images makes: kept for the new key, and signed for
    // it, a provenance naming the new key's tag beside the rebase's.
    let digest = digest.to_string();
    let attestations = || {
        let tag = format!(
            "functions/team/hello:sha256-{}.att",
            digest.trim_start_matches("sha256:")
        );
        let raw = common::run_bytes(
            Command::new("skopeo")
                .args(["inspect", "--raw", "--tls-verify=false"])
                .arg(format!("docker://{}", env.registry.reference(&tag))),
        );
        let manifest: serde_json::Value = serde_json::from_slice(&raw).unwrap();
        manifest["layers"].as_array().unwrap().len()
    };
    let before_keep = attestations();
    let key_before = env.function("team", "hello")["status"]["buildKey"].clone();
    let hello_ref = env.registry.reference("functions/team/hello");
    let raw = env
        .registry
        .skopeo_inspect_raw(&format!("{hello_ref}@{digest}"));
    let manifest: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    let config = manifest["config"]["digest"].as_str().unwrap().to_string();
    let log_before = env.registry.settled_access_log().len();
    let copied = Command::new("skopeo")
        .args(["copy", "--all", "--quiet", "--src-tls-verify=false"])
        .args(["--dest-tls-verify=false", "--preserve-digests"])
        .arg(format!(
            "docker://{}@{old_builder}",
            builder_tag.rsplit_once(':').unwrap().0
        ))
        .arg(format!("docker://{builder_tag}"))
        .status()
        .unwrap();
    assert!(copied.success());
    env.wait(
        "hello kept for the new key",
        Duration::from_secs(60),
        || {
            let f = env.function("team", "hello");
            f["status"]["buildKey"] != key_before && reason(&env, "hello").1.contains("kept")
        },
    );
    // The controller pushed that image (the rebase): it reads neither its manifest nor its
    // config back. It reads each cosign tag once, to add to it: the provenance it adds, it
    // does not read back to check (--require-provenance).
    let reads: Vec<String> = env
        .registry
        .access_log_since(log_before)
        .into_iter()
        .filter(|l| l.starts_with("GET /v2/functions/team/hello/"))
        .collect();
    let read_back: Vec<&String> = reads
        .iter()
        .filter(|l| l.contains(&format!("/manifests/{digest} ")) || l.contains(&config))
        .collect();
    assert!(read_back.is_empty(), "{read_back:?}");
    let hex = digest.trim_start_matches("sha256:");
    for tag in ["sig", "att"] {
        let tag = format!("/manifests/sha256-{hex}.{tag} ");
        let read = reads.iter().filter(|l| l.contains(&tag)).count();
        assert_eq!(read, 1, "{tag}: {reads:?}");
    }
    assert_eq!(
        env.function("team", "hello")["status"]["digest"],
        digest.as_str()
    );
    assert_eq!(attestations(), before_keep + 1, "one more provenance");
    let on = [
        "functions/team/hello",
        digest.as_str(),
        public.to_str().unwrap(),
    ];
    assert_eq!(check(&[&["verify", &host][..], &on].concat()), "1");
    check(&[&["provenance", &host][..], &on].concat());

    // A key the controller cannot sign with (the Secret's cosign.key is another key than its
    // cosign.pub): the next move is not signed, and falls back to a build Job.
    env.api.insert(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "kiln-image-signing", "namespace": SYSTEM},
        "data": {"cosign.key": b64(&read("b.key")), "cosign.pub": b64(&read("a.pub"))},
    }));
    let jobs_before = builds.stats().ended.len();
    // A builder never seen before: the same images under an index with an annotation.
    let raw = env.registry.skopeo_inspect_raw(&builder_tag);
    let mut index: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    index["annotations"] = serde_json::json!({"test": "another builder"});
    let put = common::run_bytes(
        Command::new("curl")
            .args(["-sf", "-X", "PUT", "--data-binary"])
            .arg(index.to_string())
            .arg("-H")
            .arg(format!(
                "Content-Type: {}",
                index["mediaType"].as_str().unwrap()
            ))
            .arg(format!(
                "http://{host}/v2/kiln/nodejs22-builder/manifests/latest"
            )),
    );
    assert!(put.is_empty(), "{}", String::from_utf8_lossy(&put));
    env.wait("hello built by a Job", Duration::from_secs(90), || {
        builds.stats().ended[jobs_before..]
            .iter()
            .any(|j| j.contains("hello"))
            && reason(&env, "hello").0 == "True JobFinished"
    });
    let failed = events(&env, "hello");
    assert!(
        failed
            .iter()
            .any(|(r, n)| r == "RebaseFailed" && n.contains("not the private half")),
        "{failed:?}"
    );
    // The private key is not repeated anywhere.
    let secret = read("b.key");
    let body = secret.lines().nth(1).unwrap();
    assert!(failed.iter().all(|(_, n)| !n.contains(body)), "{failed:?}");
    let status = env.function("team", "hello")["status"].to_string();
    assert!(!status.contains(body), "{status}");
}

/// The manifest digest `reference` (a tag) names.
fn tag_digest(reference: &str) -> String {
    common::sha256_digest(&common::run_bytes(
        Command::new("skopeo")
            .args(["inspect", "--raw", "--tls-verify=false"])
            .arg(format!("docker://{reference}")),
    ))
}
