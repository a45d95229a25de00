//! Builds whose image already exists: the build key (every input of the image) is known
//! before anything is installed or uploaded, so a build that finds it in the target prints
//! the existing digest and stops. Requests are counted from the real registry's access log and
//! checked against the report's own count.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::Path;

use common::images::push_base_images;
use common::kiln::{Kiln, copy_fixture, read_report, tiny_base};
use common::registry::{Registry, RegistryKind, writes};

/// `kiln build` of `dir` onto `base` into `image` on `reg`, with `extra` flags; the reference
/// and the report.
fn build(
    kiln: &Kiln,
    reg: &Registry,
    dir: &Path,
    base: &str,
    image: &str,
    extra: &[&str],
) -> (String, serde_json::Value) {
    let report = tempfile::NamedTempFile::new().unwrap();
    let (image, host) = (reg.reference(image), reg.host());
    let mut args = vec![
        "build",
        dir.to_str().unwrap(),
        "--runtime",
        "nodejs22",
        "--base",
        base,
        "--image",
        &image,
        "--insecure-registry",
        &host,
        "--report",
        report.path().to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let run = kiln.run(&args);
    (run.reference(), read_report(report.path()))
}

fn since(reg: &Registry, before: usize) -> Vec<String> {
    reg.access_log_since(before)
}

#[test]
fn an_unchanged_build_finds_its_image_with_one_manifest_request_and_pushes_nothing() {
    let reg = Registry::start(RegistryKind::Plain);
    let bases = push_base_images(&reg, "base/busybox");
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("hello-node", &work.path().join("fn"));
    let (first, report) = build(&kiln, &reg, &dir, &bases.oci, "fn/hello:v1", &[]);
    assert_eq!(report["unchanged"], false);
    let key = report["buildKey"].as_str().unwrap().to_string();
    let manifest: serde_json::Value =
        serde_json::from_slice(&reg.skopeo_inspect_raw(&first)).unwrap();
    assert_eq!(
        manifest["annotations"]["dev.kiln.build-key"], key,
        "the manifest names its build key"
    );

    let before = reg.settled_access_log().len();
    let (again, report) = build(&kiln, &reg, &dir, &bases.oci, "fn/hello:v1", &[]);
    let log = since(&reg, before);
    assert_eq!(again, first, "the same image");
    assert_eq!(report["unchanged"], true);
    assert_eq!(report["buildKey"], key);
    assert_eq!(report["blobs"].as_array().unwrap().len(), 0);
    assert!(writes(&log).is_empty(), "nothing pushed: {log:?}");
    let target: Vec<_> = log.iter().filter(|l| l.contains("/v2/fn/hello/")).collect();
    // The manifest the first build pushed is in the document cache: its tag is one HEAD.
    assert_eq!(
        target,
        ["HEAD /v2/fn/hello/manifests/v1 200"],
        "one manifest request to the target: {log:?}"
    );
    assert_eq!(
        report["registry"]["requests"].as_u64().unwrap(),
        log.len() as u64,
        "the report counts what the registry saw: {log:?}"
    );
    // The base's tag is the other request: its manifest and config are in the document
    // cache since the first build.
    assert_eq!(log.len(), 2, "{log:?}");

    // Any input of the image changes the key: here FUNC_NAME.
    let (renamed, report) = build(
        &kiln,
        &reg,
        &dir,
        &bases.oci,
        "fn/hello:v1",
        &["--name", "other"],
    );
    assert_eq!(report["unchanged"], false);
    assert_ne!(renamed, first);
    assert_ne!(report["buildKey"], key);
}

#[test]
fn with_tag_by_key_an_unchanged_build_is_one_head_and_moves_a_tag_that_went_elsewhere() {
    let reg = Registry::start(RegistryKind::Plain);
    let bases = push_base_images(&reg, "base/busybox");
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("hello-node", &work.path().join("fn"));
    let (first, report) = build(&kiln, &reg, &dir, &bases.oci, "fn/hello", &["--tag-by-key"]);
    let key = report["buildKey"].as_str().unwrap();
    let key_tag = format!("kiln-{}", key.trim_start_matches("sha256:"));
    let tagged = reg.skopeo_inspect_raw(&reg.reference(&format!("fn/hello:{key_tag}")));
    assert_eq!(
        common::sha256_digest(&tagged),
        first.rsplit('@').next().unwrap(),
        "tagged by its key"
    );

    let before = reg.settled_access_log().len();
    let (again, report) = build(&kiln, &reg, &dir, &bases.oci, "fn/hello", &["--tag-by-key"]);
    let log = since(&reg, before);
    assert_eq!(
        (again.as_str(), &report["unchanged"]),
        (first.as_str(), &true.into())
    );
    let target: Vec<_> = log.iter().filter(|l| l.contains("/v2/fn/hello/")).collect();
    assert_eq!(
        target,
        [&format!("HEAD /v2/fn/hello/manifests/{key_tag} 200")],
        "{log:?}"
    );
    // And the base's tag, one HEAD: its manifest and config are in the document cache.
    // No registry probe.
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!(report["registry"]["requests"], 2);

    // The human tag went to another build; the unchanged build moves it back, uploading no
    // blob.
    let (elsewhere, _) = build(
        &kiln,
        &reg,
        &dir,
        &bases.oci,
        "fn/hello:live",
        &["--name", "other"],
    );
    assert_ne!(elsewhere, first);
    let before = reg.settled_access_log().len();
    let (back, report) = build(
        &kiln,
        &reg,
        &dir,
        &bases.oci,
        "fn/hello:live",
        &["--tag-by-key"],
    );
    let log = since(&reg, before);
    assert_eq!((back, &report["unchanged"]), (first.clone(), &true.into()));
    assert_eq!(
        writes(&log),
        [&"PUT /v2/fn/hello/manifests/live 201".to_string()],
        "only the tag moves: {log:?}"
    );
    let live = reg.skopeo_inspect_raw(&reg.reference("fn/hello:live"));
    assert_eq!(
        common::sha256_digest(&live),
        first.rsplit('@').next().unwrap()
    );
}

#[test]
fn a_layout_build_is_unchanged_only_while_the_image_is_complete() {
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("hello-node", &work.path().join("fn"));
    let out = work.path().join("out");
    let build = || {
        let report = work.path().join("r.json");
        let run = kiln.run(&[
            "build",
            dir.to_str().unwrap(),
            "--runtime",
            "nodejs22",
            "--base",
            &tiny_base(),
            "--output",
            &format!("oci:{}:hello", out.display()),
            "--report",
            report.to_str().unwrap(),
        ]);
        (run.reference(), read_report(&report))
    };
    let (first, report) = build();
    assert_eq!(report["unchanged"], false);
    let (again, report) = build();
    assert_eq!((&again, &report["unchanged"]), (&first, &true.into()));
    // A blob of the image goes missing: the layout no longer holds the build.
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            out.join("blobs/sha256")
                .join(first.rsplit("sha256:").next().unwrap()),
        )
        .unwrap(),
    )
    .unwrap();
    let layers = manifest["layers"].as_array().unwrap();
    let last = layers.last().unwrap()["digest"].as_str().unwrap();
    std::fs::remove_file(
        out.join("blobs/sha256")
            .join(last.trim_start_matches("sha256:")),
    )
    .unwrap();
    let (rebuilt, report) = build();
    assert_eq!((&rebuilt, &report["unchanged"]), (&first, &false.into()));
    assert!(
        out.join("blobs/sha256")
            .join(last.trim_start_matches("sha256:"))
            .is_file()
    );
}

/// The base pinned by digest, as the controller and careful users name it.
fn pinned(reg: &Registry, tagged: &str) -> String {
    let digest = common::sha256_digest(&reg.skopeo_inspect_raw(tagged));
    format!("{}@{digest}", tagged.rsplit_once(':').unwrap().0)
}

#[test]
fn a_source_only_rebuild_is_six_requests_and_a_stale_push_record_is_recovered_from() {
    let reg = Registry::start(RegistryKind::Plain);
    let bases = push_base_images(&reg, "base/busybox");
    let base = pinned(&reg, &bases.oci);
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("hello-node", &work.path().join("fn"));
    build(&kiln, &reg, &dir, &base, "fn/hello", &["--tag-by-key"]);

    let handler = dir.join("handler.js");
    let source = std::fs::read_to_string(&handler).unwrap();
    std::fs::write(&handler, format!("{source}\n// a change\n")).unwrap();
    let before = reg.settled_access_log().len();
    let (_, report) = build(&kiln, &reg, &dir, &base, "fn/hello", &["--tag-by-key"]);
    let log = since(&reg, before);
    // The key's tag (not there yet), the source layer and the config (POST + PUT each: the
    // first build learnt that this registry ignores a single-request POST), the manifest.
    // The pinned base, its config and the base layers the repository was given before cost
    // nothing.
    let shape: Vec<String> = log
        .iter()
        .map(|l| {
            let mut parts = l.split(' ');
            let (method, path) = (parts.next().unwrap(), parts.next().unwrap());
            let kind = ["manifests", "uploads", "blobs"]
                .into_iter()
                .find(|k| path.contains(&format!("/{k}/")))
                .unwrap_or(path);
            format!("{method} {kind}")
        })
        .collect();
    // The source layer and the config go up at once: their four requests interleave.
    let (first, uploads, last) = (
        &shape[0],
        &shape[1..shape.len() - 1],
        &shape[shape.len() - 1],
    );
    let mut uploads = uploads.to_vec();
    uploads.sort();
    assert_eq!(
        (first.as_str(), uploads, last.as_str()),
        (
            "HEAD manifests",
            vec![
                "POST uploads".to_string(),
                "POST uploads".into(),
                "PUT uploads".into(),
                "PUT uploads".into()
            ],
            "PUT manifests"
        ),
        "{log:?}"
    );
    assert_eq!(report["registry"]["requests"], 6);
    assert_eq!(report["unchanged"], false);

    // A record that names blobs a repository does not have (it was deleted, say): the
    // registry refuses the manifest, kiln checks every blob and finishes.
    let manifest: serde_json::Value =
        serde_json::from_slice(&reg.skopeo_inspect_raw(&base)).unwrap();
    let record: String = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| format!("{}\n", l["digest"].as_str().unwrap()))
        .collect();
    let name = format!("{}/fn/other", reg.host());
    let path = kiln
        .cache_dir()
        .join("pushed")
        .join(common::sha256_digest(name.as_bytes()).trim_start_matches("sha256:"));
    std::fs::write(&path, record).unwrap();
    let (other, report) = build(&kiln, &reg, &dir, &base, "fn/other:v1", &[]);
    assert_eq!(report["unchanged"], false);
    assert_eq!(reg.missing_blobs("fn/other", "v1"), Some(vec![]), "{other}");
    let log = reg.log();
    assert!(
        log.contains("MANIFEST_BLOB_UNKNOWN") || log.contains("blob unknown"),
        "the stale record was used first"
    );
}
