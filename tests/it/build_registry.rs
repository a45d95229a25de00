//! `kiln build` against a real registry (Debian's docker-registry on loopback): every base
//! media-type family, read back and schema-validated by independent clients, deduplicated
//! pushes, and the per-blob report checked against the registry's own storage.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeSet;

use common::images::push_base_images;
use common::kiln::{Kiln, blob_bytes_sent, blobs_with_role, copy_fixture, read_report};
use common::registry::{Registry, RegistryKind};
use common::schema::validate_json;
use common::{jq_raw, sha256_digest};

fn build(
    kiln: &Kiln,
    reg: &Registry,
    dir: &std::path::Path,
    base: &str,
    image: &str,
    report: &std::path::Path,
) -> String {
    let image = reg.reference(image);
    let run = kiln.run(&[
        "build",
        dir.to_str().unwrap(),
        "--runtime",
        "nodejs22",
        "--base",
        base,
        "--image",
        &image,
        "--insecure-registry",
        &reg.host(),
        "--report",
        report.to_str().unwrap(),
        "--verify",
    ]);
    run.reference()
}

/// Reads the image back with skopeo and checks manifest and config against the OCI schemas.
fn read_back(reg: &Registry, reference: &str) -> (Vec<u8>, Vec<u8>) {
    let manifest = reg.skopeo_inspect_raw(reference);
    let config = reg.skopeo_inspect_config(reference);
    validate_json("manifest", &manifest);
    validate_json("config", &config);
    let digest = reference.rsplit('@').next().unwrap();
    assert_eq!(
        sha256_digest(&manifest),
        digest,
        "the pushed bytes are the ones kiln hashed"
    );
    (manifest, config)
}

#[test]
fn a_function_builds_onto_oci_docker_and_multi_platform_bases() {
    let reg = Registry::start(RegistryKind::Plain);
    let bases = push_base_images(&reg, "base/busybox");
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("hello-node", &work.path().join("fn"));
    let cases = [
        (
            &bases.oci,
            "application/vnd.oci.image.manifest.v1+json",
            "application/vnd.oci.image.layer.v1.tar+gzip",
        ),
        (
            &bases.docker,
            "application/vnd.docker.distribution.manifest.v2+json",
            "application/vnd.docker.image.rootfs.diff.tar.gzip",
        ),
        (
            &bases.index,
            "application/vnd.oci.image.manifest.v1+json",
            "application/vnd.oci.image.layer.v1.tar+gzip",
        ),
    ];
    for (i, (base, manifest_type, layer_type)) in cases.iter().enumerate() {
        let report = work.path().join(format!("report-{i}.json"));
        let reference = build(&kiln, &reg, &dir, base, &format!("team/hello:{i}"), &report);
        assert!(
            reference.starts_with(&format!("{}/team/hello@sha256:", reg.host())),
            "{reference}"
        );
        let (manifest, config) = read_back(&reg, &reference);
        assert_eq!(jq_raw(".mediaType", &manifest), *manifest_type);
        assert_eq!(jq_raw(".layers[-1].mediaType", &manifest), *layer_type);
        assert_eq!(
            jq_raw(".architecture", &config),
            "amd64",
            "linux/amd64 picked from the index"
        );
        let env = jq_raw(".config.Env | join(\" \")", &config);
        for var in [
            "FUNC_RUNTIME=nodejs22",
            "FUNC_HANDLER=main",
            "MOD_NAME=handler",
            "FUNC_PORT=8080",
            "FUNC_NAME=fn",
            "SERVICE_NAMESPACE=default",
            "PATH=",
        ] {
            assert!(env.contains(var), "{var} missing from {env}");
        }
        assert_eq!(jq_raw(".config.User", &config), "1000");
        assert!(jq_raw(".config.Labels[\"dev.kiln.build-key\"]", &config).starts_with("sha256:"));
        assert_eq!(jq_raw(".created", &config), "1970-01-01T00:00:00Z");
        // Base layers were mounted or already there; never uploaded.
        let r = read_report(&report);
        for base_blob in blobs_with_role(&r, "base") {
            assert_ne!(base_blob["outcome"], "uploaded", "{base_blob}");
            assert_eq!(base_blob["bytes_sent"], 0);
        }
    }
    // Docker's v2 schema 2 has no zstd layer type: asking for zstd on that base is a usage
    // error naming the way out, before anything is pushed; on an OCI base it builds.
    let zstd = |base: &str, tag: &str| {
        kiln.run(&[
            "build",
            dir.to_str().unwrap(),
            "--runtime",
            "nodejs22",
            "--base",
            base,
            "--image",
            &reg.reference(tag),
            "--insecure-registry",
            &reg.host(),
            "--compression",
            "zstd",
        ])
    };
    let refused = zstd(&bases.docker, "team/zstd:docker");
    let err = refused.failure(2);
    assert!(
        err.contains("--compression zstd needs an OCI base image"),
        "{err}"
    );
    assert_eq!(
        reg.missing_blobs("team/zstd", "docker"),
        None,
        "nothing pushed"
    );
    let built = zstd(&bases.oci, "team/zstd:oci").reference();
    let (manifest, _) = read_back(&reg, &built);
    assert_eq!(
        jq_raw(".layers[-1].mediaType", &manifest),
        "application/vnd.oci.image.layer.v1.tar+zstd"
    );
}

#[test]
fn a_second_push_sends_no_blob_bytes_and_a_source_change_sends_only_source_config_and_manifest() {
    let reg = Registry::start(RegistryKind::Plain);
    let bases = push_base_images(&reg, "base/busybox");
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("hello-node", &work.path().join("fn"));
    let report = work.path().join("report.json");

    let first = build(&kiln, &reg, &dir, &bases.oci, "team/hello:v1", &report);
    let r1 = read_report(&report);
    assert_eq!(
        blobs_with_role(&r1, "base")[0]["outcome"],
        "mounted",
        "base layers are mounted cross-repo"
    );
    let stored = reg.stored_blobs();

    let again = build(&kiln, &reg, &dir, &bases.oci, "team/hello:v1", &report);
    assert_eq!(again, first, "same inputs, same digest");
    let r2 = read_report(&report);
    assert_eq!(blob_bytes_sent(&r2), 0, "{r2:#}");
    assert!(
        r2["blobs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["role"] != "manifest")
            .all(|b| b["outcome"] == "existed")
    );
    assert_eq!(reg.stored_blobs(), stored, "nothing new in the registry");

    std::fs::write(
        dir.join("lib/greet.js"),
        "exports.greet = (n) => `Hi, ${n}!`;\n",
    )
    .unwrap();
    let changed = build(&kiln, &reg, &dir, &bases.oci, "team/hello:v2", &report);
    assert_ne!(changed, first);
    let r3 = read_report(&report);
    let uploaded: BTreeSet<String> = r3["blobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["outcome"] == "uploaded")
        .map(|b| b["role"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        uploaded,
        BTreeSet::from(["config".into(), "manifest".into(), "source".into()])
    );
    let new_blobs: BTreeSet<String> = reg.stored_blobs().difference(&stored).cloned().collect();
    let expected: BTreeSet<String> = r3["blobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["outcome"] == "uploaded")
        .map(|b| b["digest"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        new_blobs, expected,
        "the registry stored exactly the source layer, config and manifest"
    );
}

#[test]
fn the_image_reads_back_with_a_second_independent_client_that_verifies_every_blob() {
    let reg = Registry::start(RegistryKind::Plain);
    let bases = push_base_images(&reg, "base/busybox");
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("hello-node", &work.path().join("fn"));
    let reference = build(
        &kiln,
        &reg,
        &dir,
        &bases.docker,
        "team/hello:oci-client",
        &work.path().join("r.json"),
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let image = runtime.block_on(async {
        let client = oci_client::Client::new(oci_client::client::ClientConfig {
            protocol: oci_client::client::ClientProtocol::Http,
            ..Default::default()
        });
        let reference: oci_client::Reference = reference.parse().unwrap();
        let accepted = vec![
            oci_client::manifest::IMAGE_DOCKER_LAYER_GZIP_MEDIA_TYPE,
            oci_client::manifest::IMAGE_LAYER_GZIP_MEDIA_TYPE,
        ];
        client
            .pull(
                &reference,
                &oci_client::secrets::RegistryAuth::Anonymous,
                accepted,
            )
            .await
            .unwrap()
    });
    // oci-client verified each layer digest while pulling; the source layer is the manifest's
    // last one (pull returns layers in completion order).
    let manifest = image.manifest.unwrap();
    let last = &manifest.layers.last().unwrap().digest;
    let source = image
        .layers
        .iter()
        .find(|l| &l.sha256_digest() == last)
        .unwrap();
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(&source.data[..]));
    let names: Vec<String> = tar
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    assert!(
        names.contains(&"usr/src/app/function/handler.js".to_string()),
        "{names:?}"
    );
    assert!(
        names.contains(&"usr/src/app/function/lib/greet.js".to_string()),
        "{names:?}"
    );
}

#[test]
fn a_layout_base_is_pushed_from_disk_with_one_existence_check_per_blob() {
    let kiln = Kiln::new();
    let reg = Registry::start(RegistryKind::Plain);
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("hello-node", &work.path().join("fn"));
    let report = work.path().join("r.json");
    let base = common::kiln::tiny_base();
    build(&kiln, &reg, &dir, &base, "fn/hello:1", &report);
    let log = reg.settled_access_log();
    let report = read_report(&report);
    for blob in report["blobs"].as_array().unwrap() {
        let digest = blob["digest"].as_str().unwrap();
        let heads = log
            .iter()
            .filter(|l| l.starts_with("HEAD /v2/fn/hello/blobs/") && l.contains(digest))
            .count();
        assert!(heads <= 1, "{digest} checked {heads} times: {log:?}");
    }
    let base_layers = blobs_with_role(&report, "base");
    assert!(!base_layers.is_empty(), "{report}");
    for layer in base_layers {
        assert_eq!(layer["outcome"], "uploaded", "{report}");
    }
}
