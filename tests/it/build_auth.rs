//! Registry access: Basic auth over TLS with a test CA, credentials from the docker config and
//! from a Kubernetes `.dockerconfigjson`, and Bearer tokens — one token carrying both the
//! target push scope and the mount-source pull scope, so cross-repository mounts work.

#![allow(clippy::unwrap_used)]

use crate::common;

use common::images::push_base_images;
use common::kiln::{Kiln, blobs_with_role, copy_fixture, read_report};
use common::registry::{Registry, RegistryKind};
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
