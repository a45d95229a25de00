//! Registry access: Basic auth over TLS with a test CA, credentials from the docker config and
//! from a Kubernetes `.dockerconfigjson`, and Bearer tokens — one token carrying both the
//! target push scope and the mount-source pull scope, so cross-repository mounts work.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::faults::{FaultProxy, Faults};
use common::images::push_base_images;
use common::kiln::{Kiln, Run, blobs_with_role, copy_fixture, read_report, tiny_base};
use common::registry::{PASSWORD, Registry, RegistryKind, TOKEN_SERVICE, USER};
use common::schema::validate_json;

#[test]
fn basic_auth_over_tls_works_with_the_docker_config_and_the_test_ca() {
    let reg = Registry::start(RegistryKind::BasicTls);
    let bases = push_base_images(&reg, "base/busybox");
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("hello-node", &work.path().join("fn"));
    let image = reg.reference("team/hello:tls");
    let report = work.path().join("r.json");
    let run = kiln.run_cmd(
        kiln.command()
            .env("DOCKER_CONFIG", reg.docker_config_dir())
            .args([
                "build",
                dir.to_str().unwrap(),
                "--runtime=nodejs22",
                "--base",
                &bases.oci,
                "--image",
                &image,
                "--registry-ca",
                reg.ca_pem().unwrap().to_str().unwrap(),
                "--report",
                report.to_str().unwrap(),
            ]),
    );
    let reference = run.reference();
    validate_json("manifest", &reg.skopeo_inspect_raw(&reference));
    assert!(
        !run.stderr.contains(common::registry::PASSWORD),
        "the password never reaches a log line"
    );
    assert_eq!(
        blobs_with_role(&read_report(&report), "base")[0]["outcome"],
        "mounted"
    );
}

#[test]
fn a_kubernetes_dockerconfigjson_secret_file_supplies_credentials() {
    let reg = Registry::start(RegistryKind::BasicTls);
    let bases = push_base_images(&reg, "base/busybox");
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("hello-node", &work.path().join("fn"));
    let secret = work.path().join(".dockerconfigjson");
    std::fs::copy(reg.docker_config_dir().join("config.json"), &secret).unwrap();
    let run = kiln.run(&[
        "build",
        dir.to_str().unwrap(),
        "--runtime=nodejs22",
        "--base",
        &bases.docker,
        "--image",
        &reg.reference("team/hello:secret"),
        "--registry-ca",
        reg.ca_pem().unwrap().to_str().unwrap(),
        "--registry-auth",
        secret.to_str().unwrap(),
    ]);
    run.reference();
}

#[test]
fn token_auth_uses_one_token_with_push_and_mount_source_scopes() {
    let reg = Registry::start(RegistryKind::Token);
    let bases = push_base_images(&reg, "base/busybox");
    let before = reg.token_grants().len();
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("hello-node", &work.path().join("fn"));
    let report = work.path().join("r.json");
    let run = kiln.run_cmd(
        kiln.command()
            .env("DOCKER_CONFIG", reg.docker_config_dir())
            .args([
                "build",
                dir.to_str().unwrap(),
                "--runtime=nodejs22",
                "--base",
                &bases.oci,
                "--image",
                &reg.reference("team/hello:token"),
                "--insecure-registry",
                &reg.host(),
                "--report",
                report.to_str().unwrap(),
            ]),
    );
    let reference = run.reference();
    let grants = reg.token_grants()[before..].to_vec();
    assert_eq!(grants.len(), 1, "one token for the whole build: {grants:?}");
    assert!(
        grants
            .iter()
            .any(|g| g.contains("repository:team/hello:pull,push")
                && g.contains("repository:base/busybox:pull")),
        "one token request must carry both scopes: {grants:?}"
    );
    for base in blobs_with_role(&read_report(&report), "base") {
        assert_eq!(
            base["outcome"], "mounted",
            "cross-repo mount with a bearer token"
        );
    }
    validate_json("manifest", &reg.skopeo_inspect_raw(&reference));
}

/// A docker config directory with one `auths` entry for `host`.
fn docker_config(dir: &Path, host: &str, entry: serde_json::Value) -> std::path::PathBuf {
    let config = dir.join("docker");
    std::fs::create_dir_all(&config).unwrap();
    let json = serde_json::json!({ "auths": { host: entry } });
    std::fs::write(config.join("config.json"), json.to_string()).unwrap();
    config
}

fn push_tiny(kiln: &Kiln, work: &Path, docker_config: &Path, host: &str, extra: &[&str]) -> Run {
    let dir = copy_fixture("hello-node", &work.join("fn"));
    let image = format!("{host}/team/hello:1");
    let base = tiny_base();
    let mut args = vec![
        "build",
        dir.to_str().unwrap(),
        "--runtime=nodejs22",
        "--base",
        &base,
        "--image",
        &image,
        "--insecure-registry",
        host,
    ];
    args.extend_from_slice(extra);
    kiln.run_cmd(
        kiln.command()
            .env("DOCKER_CONFIG", docker_config)
            .args(args),
    )
}

#[test]
fn an_expiring_token_is_replaced_during_a_long_push() {
    // 2 s tokens; every request is delayed so the push outlives several of them, and the proxy
    // refuses an expired token as a registry without clock leeway would.
    let reg = Registry::start_token_ttl(2);
    let realm = reg.token_realm().unwrap();
    let proxy = FaultProxy::start(
        &reg.host(),
        Faults {
            delay: Duration::from_millis(300),
            expired_tokens: Some(format!(
                "Bearer realm=\"{realm}\",service=\"{TOKEN_SERVICE}\""
            )),
            ..Faults::default()
        },
    );
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let auth = common::base64(format!("{USER}:{PASSWORD}").as_bytes());
    let config = docker_config(
        work.path(),
        &proxy.host(),
        serde_json::json!({ "auth": auth }),
    );
    let started = std::time::Instant::now();
    let run = push_tiny(&kiln, work.path(), &config, &proxy.host(), &["--jobs", "1"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let took = started.elapsed();
    assert!(
        took > Duration::from_secs(3),
        "the push outlived a token: {took:?}"
    );
    let grants = reg.token_grants();
    assert!(grants.len() >= 2, "a new token was fetched: {grants:?}");
    assert!(
        !run.stderr.contains(PASSWORD),
        "the password never reaches a log line"
    );
}

#[test]
fn an_oauth2_refresh_token_from_the_docker_config_is_exchanged_for_access_tokens() {
    let reg = Registry::start(RegistryKind::Token);
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let refresh = reg.refresh_token();
    let config = docker_config(
        work.path(),
        &reg.host(),
        serde_json::json!({ "identitytoken": refresh }),
    );
    let run = push_tiny(&kiln, work.path(), &config, &reg.host(), &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let grants = reg.token_grant_types();
    assert!(!grants.is_empty());
    assert!(
        grants.iter().all(|g| g == "refresh_token"),
        "only the refresh-token grant was used: {grants:?}"
    );
    assert!(
        !run.stderr.contains(&refresh),
        "the refresh token is never logged"
    );
    // A wrong refresh token is refused, naming the registry.
    let bad = docker_config(
        &work.path().join("bad"),
        &reg.host(),
        serde_json::json!({ "identitytoken": "refresh-wrong" }),
    );
    let run = push_tiny(&kiln, &work.path().join("bad"), &bad, &reg.host(), &[]);
    let err = run.failure(1);
    assert!(err.contains("401"), "{err}");
    assert!(!err.contains("refresh-wrong"), "{err}");
}
