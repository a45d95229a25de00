//! Proves the integration-test harness itself (`tests/common`): real registries, base images,
//! the OCI schema checker and the token server.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::fs;
use std::process::Command;

use common::images::{make_layout, push_base_images, read_blob, tagged_digest, write_blob};
use common::registry::{Registry, RegistryKind, TOKEN_SERVICE};
use common::schema::{check_json, check_layout, validate_json, validate_layout};
use common::{base64, jq, jq_raw, run, sha256_digest};

const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// Pushes the base images to a registry of `kind`, reads everything back with skopeo and checks
/// it with the schema validator and the registry's storage.
fn base_images_round_trip(kind: RegistryKind) {
    let reg = Registry::start(kind);
    let images = push_base_images(&reg, "harness/busybox");
    assert_eq!(images.oci, format!("{}/harness/busybox:oci", reg.host()));

    let oci = reg.skopeo_inspect_raw(&images.oci);
    validate_json("manifest", &oci);
    assert_eq!(jq(".layers | length", &oci), "1");
    let config = reg.skopeo_inspect_config(&images.oci);
    validate_json("config", &config);
    assert_eq!(
        jq_raw(".architecture + \"/\" + .os", &config),
        "amd64/linux"
    );
    assert_eq!(jq(".config.Cmd", &config), r#"["/bin/sh"]"#);
    assert_eq!(jq(".config.Env", &config), r#"["PATH=/bin:/usr/bin"]"#);
    assert_eq!(sha256_digest(&config), jq_raw(".config.digest", &oci));

    let docker = reg.skopeo_inspect_raw(&images.docker);
    validate_json("manifest", &docker);
    assert_eq!(jq_raw(".mediaType", &docker), DOCKER_MANIFEST);
    validate_json("config", &reg.skopeo_inspect_config(&images.docker));
    assert_eq!(
        jq(".layers[0].digest", &docker),
        jq(".layers[0].digest", &oci)
    );

    let index = reg.skopeo_inspect_raw(&images.index);
    validate_json("index", &index);
    assert_eq!(
        jq(".manifests | map(.platform.architecture)", &index),
        r#"["amd64","arm64"]"#
    );
    for (digest, arch) in jq_raw(
        ".manifests[] | .digest + \" \" + .platform.architecture",
        &index,
    )
    .lines()
    .map(|l| l.split_once(' ').unwrap())
    {
        let by_digest = reg.reference(&format!("harness/busybox@{digest}"));
        let manifest = reg.skopeo_inspect_raw(&by_digest);
        assert_eq!(sha256_digest(&manifest), digest);
        validate_json("manifest", &manifest);
        let config = reg.skopeo_inspect_config(&by_digest);
        validate_json("config", &config);
        assert_eq!(jq_raw(".architecture", &config), arch);
    }

    let back = tempfile::tempdir().unwrap();
    let (oci_dir, all_dir, docker_dir) = (
        back.path().join("oci"),
        back.path().join("all"),
        back.path().join("docker"),
    );
    reg.skopeo_copy_to_layout(&images.oci, &oci_dir, "x");
    validate_layout(&oci_dir);
    assert_eq!(tagged_digest(&oci_dir, "x"), sha256_digest(&oci));
    reg.skopeo_copy_all_to_layout(&images.index, &all_dir, "x");
    validate_layout(&all_dir);
    assert_eq!(tagged_digest(&all_dir, "x"), sha256_digest(&index));
    reg.skopeo_copy_to_layout(&images.docker, &docker_dir, "x");
    validate_layout(&docker_dir);
    assert_eq!(tagged_digest(&docker_dir, "x"), sha256_digest(&docker));

    let blobs = reg.stored_blobs();
    for digest in [
        jq_raw(".layers[0].digest", &oci),
        jq_raw(".config.digest", &oci),
        sha256_digest(&oci),
        sha256_digest(&index),
    ] {
        assert!(
            blobs.contains(&digest),
            "{digest} not in registry storage: {blobs:?}"
        );
    }
    assert!(
        reg.settled_access_log()
            .iter()
            .any(|l| l.starts_with("PUT /v2/harness/busybox/manifests/"))
    );
    if kind == RegistryKind::Token {
        let grants = reg.token_grants();
        assert!(
            grants
                .iter()
                .any(|s| s.contains("repository:harness/busybox:") && s.contains("push")),
            "no push token was issued: {grants:?}"
        );
    }
}

#[test]
fn a_plain_http_registry_round_trips_base_images_that_pass_the_oci_schemas() {
    base_images_round_trip(RegistryKind::Plain);
}

#[test]
fn a_tls_registry_with_basic_auth_round_trips_base_images_that_pass_the_oci_schemas() {
    base_images_round_trip(RegistryKind::BasicTls);
}

#[test]
fn a_token_auth_registry_round_trips_base_images_that_pass_the_oci_schemas() {
    base_images_round_trip(RegistryKind::Token);
}

const GOOD_MANIFEST: &str = r#"{"schemaVersion":2,
 "mediaType":"application/vnd.oci.image.manifest.v1+json",
 "config":{"mediaType":"application/vnd.oci.image.config.v1+json","size":2,
  "digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"},
 "layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","size":32,
  "digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"}]}"#;

#[test]
fn the_schema_checker_accepts_a_well_formed_manifest() {
    validate_json("manifest", GOOD_MANIFEST.as_bytes());
}

#[test]
fn the_schema_checker_rejects_a_manifest_whose_schema_version_is_a_string() {
    let bad = jq(".schemaVersion = \"2\"", GOOD_MANIFEST.as_bytes());
    let err = check_json("manifest", bad.as_bytes()).unwrap_err();
    assert!(err.contains("is not of type 'integer'"), "{err}");
}

#[test]
fn the_schema_checker_rejects_a_layer_descriptor_without_a_digest() {
    let bad = jq("del(.layers[0].digest)", GOOD_MANIFEST.as_bytes());
    let err = check_json("manifest", bad.as_bytes()).unwrap_err();
    assert!(err.contains("'digest' is a required property"), "{err}");
    let result = std::panic::catch_unwind(|| validate_json("manifest", bad.as_bytes()));
    assert!(
        result.is_err(),
        "validate_json must panic on an invalid manifest"
    );
}

#[test]
fn the_schema_checker_rejects_a_bad_index_config_layout_file_and_non_json() {
    let index = br#"{"schemaVersion":2,"manifests":[{"size":1,"digest":"sha256:00",
        "mediaType":"application/vnd.oci.image.manifest.v1+json","platform":{"os":"linux"}}]}"#;
    assert!(
        check_json("index", index)
            .unwrap_err()
            .contains("'architecture' is a required")
    );
    let config = br#"{"architecture":"amd64","os":"linux","created":"yesterday",
        "rootfs":{"type":"layers","diff_ids":[]}}"#;
    assert!(
        check_json("config", config)
            .unwrap_err()
            .contains("is not a 'date-time'")
    );
    assert!(check_json("layout", br#"{"imageLayoutVersion":"2.0.0"}"#).is_err());
    check_json("layout", br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    assert!(
        check_json("manifest", b"{not json")
            .unwrap_err()
            .contains("not valid JSON")
    );
}

#[test]
fn a_locally_made_layout_is_valid_deterministic_and_rejected_once_a_blob_is_corrupted() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (la, lb) = (make_layout(a.path()), make_layout(b.path()));
    validate_layout(&la);
    assert_eq!(tagged_digest(&la, "base"), tagged_digest(&lb, "base"));

    let manifest = read_blob(&la, &tagged_digest(&la, "base"));
    let config = read_blob(&la, &jq_raw(".config.digest", &manifest));
    assert_eq!(jq_raw(".config.Cmd[0]", &config), "/bin/sh");
    let layer = la
        .join("blobs/sha256")
        .join(&jq_raw(".layers[0].digest", &manifest)[7..]);
    let listing = run(Command::new("tar").arg("-tvzf").arg(&layer));
    for entry in [
        "bin/busybox",
        "bin/sh -> busybox",
        "etc/passwd",
        "drwxrwxrwt",
    ] {
        assert!(
            listing.contains(entry),
            "{entry} missing from base layer:\n{listing}"
        );
    }

    // A blob whose bytes no longer match its digest, and a manifest pointing at a missing blob.
    fs::write(&layer, b"corrupted").unwrap();
    let err = check_layout(&la).unwrap_err();
    assert!(
        err.contains("has digest") && err.contains("descriptor says"),
        "{err}"
    );
    let (missing, _) = write_blob(&lb, b"{}");
    fs::remove_file(lb.join("blobs/sha256").join(&missing[7..])).unwrap();
    let index = fs::read(lb.join("index.json")).unwrap();
    let index = jq(&format!(".manifests[0].digest = \"{missing}\""), &index);
    fs::write(lb.join("index.json"), index).unwrap();
    assert!(check_layout(&lb).unwrap_err().contains("missing"));
}

/// `curl` returning (HTTP status, body).
fn curl(args: &[&str]) -> (u16, String) {
    let out = run(Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}"])
        .args(args));
    let (body, status) = out.rsplit_once('\n').unwrap();
    (status.parse().unwrap(), body.to_string())
}

#[test]
fn the_token_server_refuses_missing_credentials_records_scopes_and_its_tokens_open_the_registry() {
    let reg = Registry::start(RegistryKind::Token);
    let realm = reg.token_realm().unwrap();
    let url = |query: &str| format!("{realm}?service={TOKEN_SERVICE}&{query}");
    assert_eq!(curl(&[&url("scope=repository:t/a:pull")]).0, 401);
    assert_eq!(
        curl(&["-u", "testuser:wrong", &url("scope=repository:t/a:pull")]).0,
        401
    );

    let query = "scope=repository:t/target:pull,push&scope=repository:t/source:pull";
    let (status, body) = curl(&["-u", "testuser:testpass", &url(query)]);
    assert_eq!(status, 200, "{body}");
    let token = jq_raw(".token", body.as_bytes());
    assert_eq!(token, jq_raw(".access_token", body.as_bytes()));
    let payload = run(Command::new("python3").args([
        "-c",
        "import base64,sys; p=sys.argv[1].split('.')[1]; \
         sys.stdout.write(base64.urlsafe_b64decode(p + '=' * (-len(p) % 4)).decode())",
        &token,
    ]));
    assert_eq!(
        jq(
            ".access | map(.name + \" \" + (.actions | join(\",\")))",
            payload.as_bytes()
        ),
        r#"["t/target pull,push","t/source pull"]"#
    );
    assert_eq!(
        jq_raw(".access | map(.type) | unique[]", payload.as_bytes()),
        "repository"
    );
    assert_eq!(jq_raw(".aud", payload.as_bytes()), TOKEN_SERVICE);

    let space_separated = "scope=repository:t/a:pull%20repository:t/b:push";
    assert_eq!(
        curl(&["-u", "testuser:testpass", &url(space_separated)]).0,
        200
    );
    assert_eq!(
        reg.token_requests(),
        [
            "repository:t/a:pull",
            "repository:t/a:pull",
            "repository:t/target:pull,push repository:t/source:pull",
            "repository:t/a:pull repository:t/b:push",
        ]
    );
    assert_eq!(reg.token_grants().len(), 2);

    // The registry trusts the token for the granted repository only.
    let bearer = format!("Authorization: Bearer {token}");
    let tags = |repo: &str| format!("{}/v2/{repo}/tags/list", reg.url());
    assert_eq!(
        curl(&["-H", &bearer, &tags("t/source")]).0,
        404,
        "unknown repo, but authorized"
    );
    assert_eq!(curl(&["-H", &bearer, &tags("t/other")]).0, 401);
    assert_eq!(curl(&[&tags("t/source")]).0, 401);
}

#[test]
fn the_tls_registry_requires_basic_auth_and_is_trusted_only_through_its_test_ca() {
    let reg = Registry::start(RegistryKind::BasicTls);
    assert_eq!(reg.get_status("/v2/", false), 401);
    assert_eq!(reg.get_status("/v2/", true), 200);
    let without_ca = Command::new("curl")
        .args(["-s", &format!("{}/v2/", reg.url())])
        .status();
    assert_eq!(
        without_ca.unwrap().code(),
        Some(60),
        "curl must reject the unknown CA"
    );
    let ca = reg.ca_pem().unwrap().to_path_buf();
    let localhost = format!("https://localhost:{}/v2/", reg.port());
    let cacert = ca.to_str().unwrap();
    assert_eq!(
        curl(&["--cacert", cacert, "-u", "testuser:testpass", &localhost]).0,
        200
    );
    assert_eq!(reg.credentials(), Some(("testuser", "testpass")));
}

#[test]
fn docker_config_dirs_hold_credentials_only_for_registries_that_need_them() {
    let plain = Registry::start(RegistryKind::Plain);
    let config = fs::read(plain.docker_config_dir().join("config.json")).unwrap();
    assert_eq!(jq(".auths", &config), "{}");
    assert_eq!(plain.credentials(), None);

    let token = Registry::start(RegistryKind::Token);
    let config = fs::read(token.docker_config_dir().join("config.json")).unwrap();
    let auth = jq_raw(&format!(".auths[\"{}\"].auth", token.host()), &config);
    assert_eq!(auth, base64(b"testuser:testpass"));
    assert_eq!(
        run(Command::new("sh").args(["-c", &format!("echo {auth} | base64 -d")])),
        "testuser:testpass"
    );
    assert_eq!(base64(b"ab"), "YWI=");
    assert_eq!(base64(b"abc"), "YWJj");
    assert_eq!(base64(b"a"), "YQ==");
    assert!(
        plain.log().contains("listening on 127.0.0.1:"),
        "{}",
        plain.log()
    );
}
