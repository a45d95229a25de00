//! The registry client against scripted fault-injecting servers (axum on 127.0.0.1:0) and
//! against real CNCF distribution registries (plain HTTP, Basic auth over TLS with a test CA,
//! and Bearer token auth) started by the shared harness.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use bytes::Bytes;
use common::registry::{PASSWORD, Registry, RegistryKind, USER};
use kiln::oci::{Descriptor, Digest, Document, MediaType};
use kiln::registry::{
    BlobOutcome, BlobSource, Client, ClientConfig, Credential, CredentialStore, Error, Hint,
    Reference, RetryPolicy, Scope, TransportKind, UploadPolicy,
};

fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        max_retries: 3,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
        max_retry_after: Duration::from_millis(5),
    }
}

fn config(insecure: &[&str]) -> ClientConfig {
    ClientConfig {
        insecure_hosts: insecure.iter().map(|h| h.to_string()).collect(),
        retry: fast_retry(),
        request_timeout: Duration::from_secs(20),
        ..ClientConfig::default()
    }
}

fn reference(s: &str) -> Reference {
    s.parse().unwrap()
}

fn blob(bytes: &[u8]) -> (Descriptor, BlobSource) {
    let d = Descriptor::new(
        MediaType::OciLayerGzip,
        Digest::of(bytes),
        bytes.len() as u64,
    );
    (d, BlobSource::Bytes(Bytes::copy_from_slice(bytes)))
}

/// Deterministic, incompressible-looking bytes.
fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Fault injection

/// Serves `app` on 127.0.0.1:0 and returns `127.0.0.1:PORT`.
async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("127.0.0.1:{port}")
}

fn respond(status: u16, headers: &[(&str, String)], body: impl Into<Body>) -> Response {
    let mut b = Response::builder().status(status);
    for (k, v) in headers {
        b = b.header(*k, v.as_str());
    }
    b.body(body.into()).unwrap()
}

/// A scripted registry: `/v2/` answers 200, everything else goes to `script`, which also gets
/// how many non-probe requests came before this one.
async fn scripted<F>(script: F) -> (String, Arc<AtomicUsize>)
where
    F: Fn(usize, &Method, &str, &HeaderMap) -> Response + Clone + Send + Sync + 'static,
{
    let count = Arc::new(AtomicUsize::new(0));
    let counter = count.clone();
    // Taking the body makes the server read it all, as a real registry does before answering.
    let app = Router::new().fallback(
        move |method: Method, uri: Uri, headers: HeaderMap, _body: Bytes| {
            let script = script.clone();
            let counter = counter.clone();
            async move {
                if uri.path() == "/v2/" {
                    return respond(200, &[], "{}");
                }
                let n = counter.fetch_add(1, Ordering::SeqCst);
                let path = uri
                    .path_and_query()
                    .map(|p| p.to_string())
                    .unwrap_or_default();
                script(n, &method, &path, &headers)
            }
        },
    );
    (serve(app).await, count)
}

const MANIFEST: &[u8] = b"{\"schemaVersion\":2,\"mediaType\":\"application/\
    vnd.oci.image.manifest.v1+json\",\"config\":\
    {\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\"digest\":\"sha256:\
    44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a\",\"size\":2},\"layers\":[]}";

#[tokio::test]
async fn a_manifest_whose_bytes_do_not_match_its_digest_is_rejected() {
    let claimed = Digest::of(b"what the registry claims");
    let header_digest = claimed.to_string();
    let (host, _) = scripted(move |_, _, _, _| {
        let ct = ("Content-Type", MediaType::OciManifest.to_string());
        respond(
            200,
            &[ct, ("Docker-Content-Digest", header_digest.clone())],
            MANIFEST,
        )
    })
    .await;
    let client = Client::new(config(&[&host])).unwrap();

    // Pinned by digest: checked against the reference.
    let pinned = reference(&format!("{host}/lying/app@{claimed}"));
    match client.get_manifest(&pinned, &[]).await {
        Err(Error::DigestMismatch {
            expected, actual, ..
        }) => {
            assert_eq!(expected, claimed);
            assert_eq!(actual, Digest::of(MANIFEST));
        }
        other => panic!("expected a digest mismatch, got {other:?}"),
    }
    // By tag: checked against Docker-Content-Digest.
    let tagged = reference(&format!("{host}/lying/app:v1"));
    let err = client.get_manifest(&tagged, &[]).await.unwrap_err();
    assert!(matches!(err, Error::DigestMismatch { .. }), "{err}");
    assert!(err.to_string().contains("lying/app:v1"), "{err}");
}

#[tokio::test]
async fn an_honest_manifest_without_content_type_is_sniffed_and_kept_byte_exact() {
    let (host, _) = scripted(|_, method, _, _| {
        let digest = ("Docker-Content-Digest", Digest::of(MANIFEST).to_string());
        let body = if method == Method::HEAD {
            Body::empty()
        } else {
            Body::from(MANIFEST)
        };
        respond(200, &[digest], body)
    })
    .await;
    let client = Client::new(config(&[&host])).unwrap();
    let doc = client
        .get_manifest(&reference(&format!("{host}/honest/app:v1")), &[])
        .await
        .unwrap();
    assert_eq!(doc.media_type, MediaType::OciManifest);
    assert_eq!(doc.bytes, MANIFEST);
    assert_eq!(doc.digest, Digest::of(MANIFEST));
}

#[tokio::test]
async fn a_blob_with_wrong_content_is_rejected_and_leaves_no_file() {
    let good = pseudo_random(300_000, 1);
    let mut bad = good.clone();
    bad[123_456] ^= 0xff;
    let (host, _) = scripted(move |_, _, _, _| respond(200, &[], bad.clone())).await;
    let client = Client::new(config(&[&host])).unwrap();
    let repo = reference(&format!("{host}/lying/app"));
    let (d, _) = blob(&good);
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("layer.tar.gz");

    let err = client.get_blob_to_file(&repo, &d, &dest).await.unwrap_err();
    assert!(matches!(err, Error::DigestMismatch { .. }), "{err}");
    assert!(!dest.exists());
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "a temporary file was left behind"
    );
    let err = client.get_blob(&repo, &d).await.unwrap_err();
    assert!(matches!(err, Error::DigestMismatch { .. }), "{err}");
}

#[tokio::test]
async fn a_blob_longer_than_its_descriptor_is_cut_off() {
    let (host, _) = scripted(|_, _, _, _| respond(200, &[], vec![7u8; 10_000])).await;
    let client = Client::new(config(&[&host])).unwrap();
    let (d, _) = blob(&[7u8; 100]);
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("b");
    let err = client
        .get_blob_to_file(&reference(&format!("{host}/a")), &d, &dest)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::SizeMismatch { expected: 100, .. }),
        "{err}"
    );
    assert!(!dest.exists());
}

#[tokio::test]
async fn a_server_error_is_retried_and_then_succeeds() {
    let (host, count) = scripted(|n, _, _, _| {
        if n == 0 {
            respond(
                500,
                &[],
                r#"{"errors":[{"code":"UNKNOWN","message":"try again"}]}"#,
            )
        } else {
            let ct = ("Content-Type", MediaType::OciManifest.to_string());
            respond(200, &[ct], MANIFEST)
        }
    })
    .await;
    let client = Client::new(config(&[&host])).unwrap();
    let doc = client
        .get_manifest(&reference(&format!("{host}/flaky/app:v1")), &[])
        .await
        .unwrap();
    assert_eq!(doc.bytes, MANIFEST);
    assert_eq!(count.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn persistent_server_errors_give_up_after_the_retry_budget() {
    let (host, count) = scripted(|_, _, _, _| respond(503, &[], "")).await;
    let client = Client::new(config(&[&host])).unwrap();
    let err = client
        .blob_exists(&reference(&format!("{host}/down/app")), &Digest::of(b"x"))
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(503));
    assert!(err.is_retryable());
    assert_eq!(count.load(Ordering::SeqCst), 4, "1 attempt + 3 retries");
}

#[tokio::test]
async fn a_wrong_password_is_unauthorized_and_not_retried() {
    let count = Arc::new(AtomicUsize::new(0));
    let counter = count.clone();
    let app = Router::new().fallback(move |uri: Uri, headers: HeaderMap| {
        let counter = counter.clone();
        async move {
            let auth = headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            // Requests that carry the credential (the first goes without: its 401 names the
            // scheme).
            if uri.path() != "/v2/" && !auth.is_empty() {
                counter.fetch_add(1, Ordering::SeqCst);
            }
            let challenge = ("WWW-Authenticate", r#"Basic realm="fake""#.to_string());
            let body =
                r#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#;
            if auth.is_empty() || uri.path() != "/v2/" {
                respond(401, &[challenge], body)
            } else {
                respond(200, &[], "{}")
            }
        }
    });
    let host = serve(app).await;
    let mut cfg = config(&[&host]);
    cfg.credentials = CredentialStore::default()
        .with_credential(&host, Credential::basic("alice", "wrong-s3cret"));
    let client = Client::new(cfg).unwrap();
    let err = client
        .get_manifest(&reference(&format!("{host}/private/app:v1")), &[])
        .await
        .unwrap_err();
    match &err {
        Error::Unauthorized {
            registry,
            status: 401,
            had_credentials: true,
            errors,
            ..
        } => {
            assert_eq!(registry, &host);
            assert_eq!(errors[0].code, "UNAUTHORIZED");
        }
        other => panic!("expected Unauthorized, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("--registry-auth") && text.contains("docker login"),
        "{text}"
    );
    assert!(!text.contains("wrong-s3cret") && !format!("{err:?}").contains("wrong-s3cret"));
    assert!(!err.is_retryable());
    assert_eq!(
        count.load(Ordering::SeqCst),
        1,
        "a rejected credential must not be retried"
    );
}

#[tokio::test]
async fn a_202_without_location_is_a_protocol_error() {
    let (host, count) = scripted(|_, method, _, _| match *method {
        Method::HEAD => respond(404, &[], Body::empty()),
        _ => respond(202, &[], Body::empty()),
    })
    .await;
    let client = Client::new(config(&[&host])).unwrap();
    let (d, src) = blob(b"some layer");
    let err = client
        .push_blob(&reference(&format!("{host}/a")), &d, src, None)
        .await
        .unwrap_err();
    match &err {
        Error::Protocol { problem, .. } => assert!(problem.contains("Location"), "{err}"),
        other => panic!("expected a protocol error, got {other:?}"),
    }
    assert_eq!(count.load(Ordering::SeqCst), 2, "HEAD + one POST, no retry");
}

#[tokio::test]
async fn a_missing_manifest_is_not_found_with_the_reference_and_codes() {
    let (host, _) = scripted(|_, _, _, _| {
        respond(
            404,
            &[],
            r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#,
        )
    })
    .await;
    let client = Client::new(config(&[&host])).unwrap();
    let r = reference(&format!("{host}/gone/app:v9"));
    let err = client.get_manifest(&r, &[]).await.unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err}");
    assert!(err.to_string().contains(&r.to_string()), "{err}");
    assert_eq!(err.codes(), ["MANIFEST_UNKNOWN"]);
    assert_eq!(client.head_manifest(&r).await.unwrap(), None);
}

#[tokio::test]
async fn upload_state_and_credentials_never_appear_in_errors() {
    let (host, _) = scripted(|_, method, path, _| match *method {
        Method::HEAD => respond(404, &[], Body::empty()),
        Method::POST => respond(
            202,
            &[(
                "Location",
                "/v2/a/blobs/uploads/u1?_state=S3CRET-STATE".into(),
            )],
            "",
        ),
        _ if path.contains("S3CRET-STATE") => {
            respond(400, &[], r#"{"errors":[{"code":"DIGEST_INVALID"}]}"#)
        }
        _ => respond(500, &[], ""),
    })
    .await;
    let client = Client::new(config(&[&host])).unwrap();
    let (d, src) = blob(b"layer");
    let err = client
        .push_blob(&reference(&format!("{host}/a")), &d, src, None)
        .await
        .unwrap_err();
    assert_eq!(err.codes(), ["DIGEST_INVALID"]);
    let text = format!("{err} {err:?}");
    assert!(!text.contains("S3CRET-STATE"), "{text}");
    assert!(text.contains("_state=REDACTED"), "{text}");
}

#[tokio::test]
async fn an_unreachable_registry_names_the_host_and_tls_to_plain_http_suggests_insecure() {
    // Nothing listens on a port that was just released.
    let port = common::free_port();
    let client = Client::new(config(&[&format!("127.0.0.1:{port}")])).unwrap();
    let err = client
        .head_manifest(&reference(&format!("127.0.0.1:{port}/a:v")))
        .await
        .unwrap_err();
    match &err {
        Error::Transport {
            kind: TransportKind::Refused,
            host,
            ..
        } => assert_eq!(host, &format!("127.0.0.1:{port}")),
        other => panic!("expected connection refused, got {other:?}"),
    }

    let (host, _) = scripted(|_, _, _, _| respond(200, &[], "")).await;
    let tls_client = Client::new(config(&[])).unwrap();
    let err = tls_client
        .head_manifest(&reference(&format!("{host}/a:v")))
        .await
        .unwrap_err();
    match &err {
        Error::Transport {
            kind: TransportKind::Tls,
            hint: Hint::InsecureRegistry,
            ..
        } => {}
        other => panic!("expected a TLS error with a hint, got {other:?}"),
    }
    assert!(
        err.to_string()
            .contains(&format!("--insecure-registry {host}")),
        "{err}"
    );
}

#[tokio::test]
async fn file_uploads_stream_with_a_content_length_to_relative_and_absolute_locations() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let log = seen.clone();
    let (host, _) = scripted(move |_, method, path, headers| {
        let h = |k: &str| {
            headers
                .get(k)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_string()
        };
        log.lock().unwrap().push(format!(
            "{method} {path} len={} te={}",
            h("content-length"),
            h("transfer-encoding")
        ));
        match *method {
            Method::HEAD => respond(404, &[], Body::empty()),
            Method::POST if path.contains("relative") => respond(
                202,
                &[("Location", "/v2/relative/blobs/uploads/u1?_state=x".into())],
                "",
            ),
            Method::POST => {
                let port = headers
                    .get("host")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                respond(
                    202,
                    &[("Location", format!("http://{port}/elsewhere/u2?token=t"))],
                    "",
                )
            }
            _ => respond(201, &[], ""),
        }
    })
    .await;
    let mut cfg = config(&[&host]);
    cfg.upload.monolithic_max = 0;
    let client = Client::new(cfg).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = pseudo_random(700_000, 3);
    let path = dir.path().join("blob");
    std::fs::write(&path, &data).unwrap();
    let d = Descriptor::new(
        MediaType::OciLayerGzip,
        Digest::of(&data),
        data.len() as u64,
    );
    for repo in ["relative", "absolute"] {
        let outcome = client
            .push_blob(
                &reference(&format!("{host}/{repo}")),
                &d,
                BlobSource::File(path.clone()),
                None,
            )
            .await;
        assert_eq!(uploaded(outcome.unwrap()), d.size);
    }
    let seen = seen.lock().unwrap().clone();
    let digest = urlenc(&d.digest);
    assert!(
        seen.contains(&format!(
            "PUT /v2/relative/blobs/uploads/u1?_state=x&digest={digest} len=700000 te=-"
        )),
        "{seen:#?}"
    );
    assert!(
        seen.contains(&format!(
            "PUT /elsewhere/u2?token=t&digest={digest} len=700000 te=-"
        )),
        "{seen:#?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Real registry

/// A minimal image: config blob, one layer, and its manifest.
struct TestImage {
    config: (Descriptor, BlobSource),
    layer: (Descriptor, BlobSource),
    manifest: Document,
}

fn test_image(seed: u64) -> TestImage {
    let config_bytes = format!(
        r#"{{"architecture":"amd64","os":"linux","rootfs":{{"type":"layers","diff_ids":["{}"]}}}}"#,
        Digest::of(&seed.to_be_bytes())
    );
    let (mut cd, cs) = blob(config_bytes.as_bytes());
    cd.media_type = MediaType::OciConfig;
    let layer = blob(&pseudo_random(50_000, seed));
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MediaType::OciManifest.as_str(),
        "config": cd,
        "layers": [layer.0],
    });
    let manifest = Document::new(
        MediaType::OciManifest,
        serde_json::to_vec(&manifest).unwrap(),
    );
    TestImage {
        config: (cd, cs),
        layer,
        manifest,
    }
}

async fn push_image(client: &Client, target: &Reference, image: &TestImage) -> Digest {
    for (d, s) in [&image.config, &image.layer] {
        client.push_blob(target, d, s.clone(), None).await.unwrap();
    }
    client.put_manifest(target, &image.manifest).await.unwrap()
}

fn uploaded(outcome: BlobOutcome) -> u64 {
    match outcome {
        BlobOutcome::Uploaded { bytes_sent } => bytes_sent,
        other => panic!("expected an upload, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn blobs_are_uploaded_skipped_and_mounted_on_a_real_registry() {
    let reg = Registry::start(RegistryKind::Plain);
    let host = reg.host();
    let client = Client::new(config(&[&host])).unwrap();
    let app = reference(&format!("{host}/team/app"));
    let other = reference(&format!("{host}/team/other"));

    // First small blob: the single-request POST is tried, distribution 2.8 answers 202 and
    // stores nothing, and the upload continues with PUT in that session.
    let (d1, s1) = blob(b"first small blob");
    let sent = uploaded(client.push_blob(&app, &d1, s1.clone(), None).await.unwrap());
    assert_eq!(
        sent,
        2 * d1.size,
        "body sent with the POST (ignored) and with the PUT"
    );
    // Second small blob: the registry is known to ignore it, so POST (no body) + PUT.
    let (d2, s2) = blob(b"second small blob");
    assert_eq!(
        uploaded(client.push_blob(&app, &d2, s2, None).await.unwrap()),
        d2.size
    );
    let log = reg.settled_access_log().join("\n");
    assert!(
        log.contains(&format!(
            "POST /v2/team/app/blobs/uploads/?digest={} 202",
            urlenc(&d1.digest)
        )),
        "{log}"
    );
    assert_eq!(
        log.matches("?digest=").count(),
        1,
        "only the first blob tries the single POST:\n{log}"
    );

    // Existing blob: nothing sent.
    assert_eq!(
        client.push_blob(&app, &d1, s1.clone(), None).await.unwrap(),
        BlobOutcome::Existed
    );

    // A 3 MiB file, streamed with Content-Length.
    let dir = tempfile::tempdir().unwrap();
    let big = pseudo_random(3 << 20, 9);
    let path = dir.path().join("big");
    std::fs::write(&path, &big).unwrap();
    let big_d = Descriptor::new(MediaType::OciLayerGzip, Digest::of(&big), big.len() as u64);
    let sent = uploaded(
        client
            .push_blob(&app, &big_d, BlobSource::File(path.clone()), None)
            .await
            .unwrap(),
    );
    assert_eq!(sent, big_d.size);

    // Cross-repository mount.
    let outcome = client
        .push_blob(
            &other,
            &big_d,
            BlobSource::File(path.clone()),
            Some("team/app"),
        )
        .await
        .unwrap();
    assert_eq!(outcome, BlobOutcome::Mounted);
    assert_eq!(
        client.blob_exists(&other, &big_d.digest).await.unwrap(),
        Some(big_d.size)
    );
    // A mount the registry declines continues in the session it opened.
    let (d3, s3) = blob(b"not in the source repo");
    assert_eq!(
        uploaded(
            client
                .push_blob(&other, &d3, s3, Some("team/app"))
                .await
                .unwrap()
        ),
        d3.size
    );
    assert!(
        !client
            .mount_blob(&app, &d3.digest, "team/nothing")
            .await
            .unwrap()
    );
    // Neither declined mount left an upload session open (the first was used, the second
    // cancelled; it used to stay until the registry's purge, a week later).
    assert_eq!(
        reg.open_uploads("team/other"),
        Vec::<String>::new(),
        "{:#?}",
        reg.settled_access_log()
    );
    assert_eq!(
        reg.open_uploads("team/app"),
        Vec::<String>::new(),
        "{:#?}",
        reg.settled_access_log()
    );
    assert!(
        client
            .mount_blob(&app, &d3.digest, "team/other")
            .await
            .unwrap()
    );

    // Read back, verified while streaming.
    let back = dir.path().join("back");
    client
        .get_blob_to_file(&other, &big_d, &back)
        .await
        .unwrap();
    assert_eq!(std::fs::read(&back).unwrap(), big);
    assert_eq!(
        client.get_blob(&app, &d1).await.unwrap(),
        b"first small blob"
    );
    let stored = reg.stored_blobs();
    for d in [&d1, &d2, &d3, &big_d] {
        assert!(
            stored.contains(&d.digest.to_string()),
            "{} not stored",
            d.digest
        );
    }
}

fn urlenc(d: &Digest) -> String {
    d.to_string().replace(':', "%3A")
}

#[tokio::test(flavor = "multi_thread")]
async fn manifests_round_trip_through_a_real_registry() {
    let reg = Registry::start(RegistryKind::Plain);
    let host = reg.host();
    let client = Client::new(config(&[&host])).unwrap();
    let image = test_image(1);
    let tagged = reference(&format!("{host}/team/app:v1"));

    assert_eq!(client.head_manifest(&tagged).await.unwrap(), None);
    let digest = push_image(&client, &tagged, &image).await;
    assert_eq!(digest, image.manifest.digest);

    let got = client.get_manifest(&tagged, &[]).await.unwrap();
    assert_eq!(
        got, image.manifest,
        "same media type, digest and exact bytes"
    );
    let head = client.head_manifest(&tagged).await.unwrap().unwrap();
    assert_eq!(head, image.manifest.descriptor());
    let by_digest = client
        .get_manifest(&tagged.with_digest(digest.clone()), &[])
        .await
        .unwrap();
    assert_eq!(by_digest.bytes, image.manifest.bytes);
    assert_eq!(
        reg.skopeo_inspect_raw(&tagged.to_string()),
        image.manifest.bytes
    );
    assert_eq!(
        client.get_blob(&tagged, &image.config.0).await.unwrap(),
        match &image.config.1 {
            BlobSource::Bytes(b) => b.to_vec(),
            BlobSource::File(_) => unreachable!(),
        }
    );

    // Push by digest only.
    let image2 = test_image(2);
    let untagged = reference(&format!("{host}/team/app"));
    for (d, s) in [&image2.config, &image2.layer] {
        client
            .push_blob(&untagged, d, s.clone(), None)
            .await
            .unwrap();
    }
    let d2 = client
        .put_manifest(&untagged, &image2.manifest)
        .await
        .unwrap();
    assert!(
        client
            .head_manifest(&untagged.with_digest(d2))
            .await
            .unwrap()
            .is_some()
    );

    // A manifest whose blobs are missing is refused with the registry's code.
    let image3 = test_image(3);
    let err = client
        .put_manifest(
            &reference(&format!("{host}/team/app:broken")),
            &image3.manifest,
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.codes(),
        ["MANIFEST_BLOB_UNKNOWN", "MANIFEST_BLOB_UNKNOWN"],
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn large_blobs_go_up_in_chunks() {
    let reg = Registry::start(RegistryKind::Plain);
    let host = reg.host();
    let mut cfg = config(&[&host]);
    cfg.upload = UploadPolicy {
        monolithic_max: 0,
        chunked_threshold: 1 << 20,
        chunk_size: 400 << 10,
    };
    let client = Client::new(cfg).unwrap();
    let repo = reference(&format!("{host}/team/chunked"));
    let data = pseudo_random((1 << 20) + 12_345, 5);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blob");
    std::fs::write(&path, &data).unwrap();
    let d = Descriptor::new(
        MediaType::OciLayerGzip,
        Digest::of(&data),
        data.len() as u64,
    );
    let sent = uploaded(
        client
            .push_blob(&repo, &d, BlobSource::File(path), None)
            .await
            .unwrap(),
    );
    assert_eq!(sent, d.size);
    let patches = reg
        .settled_access_log()
        .iter()
        .filter(|l| l.starts_with("PATCH "))
        .count();
    assert_eq!(patches, 3, "{:?}", reg.access_log());
    let back = dir.path().join("back");
    client.get_blob_to_file(&repo, &d, &back).await.unwrap();
    assert_eq!(std::fs::read(back).unwrap(), data);
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_pushes_share_one_client() {
    use futures_util::{StreamExt, TryStreamExt, stream};
    let reg = Registry::start(RegistryKind::Plain);
    let host = reg.host();
    let client = Client::new(config(&[&host])).unwrap();
    let repo = reference(&format!("{host}/team/parallel"));
    let blobs: Vec<_> = (0..12)
        .map(|i| blob(&pseudo_random(20_000 + i, i as u64)))
        .collect();
    let outcomes: Vec<BlobOutcome> = stream::iter(
        blobs
            .iter()
            .map(|(d, s)| client.push_blob(&repo, d, s.clone(), None)),
    )
    .buffer_unordered(4)
    .try_collect()
    .await
    .unwrap();
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, BlobOutcome::Uploaded { .. }))
    );
    for (d, _) in &blobs {
        assert_eq!(
            client.blob_exists(&repo, &d.digest).await.unwrap(),
            Some(d.size)
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cross_repository_mount_works_with_token_auth_using_one_token_with_both_scopes() {
    let reg = Registry::start(RegistryKind::Token);
    let host = reg.host();
    let mut cfg = config(&[&host]);
    cfg.credentials = CredentialStore::default().with_docker_config_dir(reg.docker_config_dir());

    // The base image's layer lives in `base/node`.
    let base_client = Client::new(cfg.clone()).unwrap();
    let base = reference(&format!("{host}/base/node"));
    let (layer, src) = blob(&pseudo_random(80_000, 42));
    uploaded(
        base_client
            .push_blob(&base, &layer, src.clone(), None)
            .await
            .unwrap(),
    );
    let before = reg.token_requests().len();

    // A build pushing to `team/fn` authorizes once, with the mount source's pull scope.
    let client = Client::new(cfg.clone()).unwrap();
    let target = reference(&format!("{host}/team/fn:v1"));
    client
        .authorize(
            &target.registry,
            &[Scope::push(&target.repository), Scope::pull("base/node")],
        )
        .await
        .unwrap();
    let outcome = client
        .push_blob(&target, &layer, src.clone(), Some("base/node"))
        .await
        .unwrap();
    assert_eq!(outcome, BlobOutcome::Mounted);
    let image = test_image(7);
    let digest = push_image(&client, &target, &image).await;
    assert_eq!(
        client.get_manifest(&target, &[]).await.unwrap().digest,
        digest
    );

    let requests = reg.token_requests()[before..].to_vec();
    assert_eq!(
        requests.len(),
        1,
        "one token for the whole push: {requests:?}"
    );
    let scopes: Vec<&str> = requests[0].split(' ').collect();
    assert!(
        scopes.contains(&"repository:team/fn:pull,push"),
        "{requests:?}"
    );
    assert!(
        scopes.contains(&"repository:base/node:pull"),
        "{requests:?}"
    );

    // Without authorize: the mount request itself asks for both scopes in one token.
    let lazy = Client::new(cfg).unwrap();
    let second = reference(&format!("{host}/team/fn2"));
    let before = reg.token_requests().len();
    let outcome = lazy
        .push_blob(&second, &layer, src, Some("base/node"))
        .await
        .unwrap();
    assert_eq!(outcome, BlobOutcome::Mounted);
    let requests = reg.token_requests()[before..].to_vec();
    let last = requests.last().unwrap();
    assert!(
        last.contains("repository:team/fn2:pull,push")
            && last.contains("repository:base/node:pull"),
        "{requests:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn token_auth_with_a_wrong_password_is_unauthorized_without_retry() {
    let reg = Registry::start(RegistryKind::Token);
    let host = reg.host();
    let mut cfg = config(&[&host]);
    cfg.credentials = CredentialStore::default()
        .with_credential(&host, Credential::basic(USER, "not-the-password"));
    let client = Client::new(cfg).unwrap();
    let err = client
        .authorize(&host, &[Scope::push("team/fn")])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unauthorized {
                had_credentials: true,
                ..
            }
        ),
        "{err}"
    );
    assert!(!err.to_string().contains("not-the-password"));
    assert_eq!(
        reg.token_requests().len(),
        1,
        "no retry of a rejected credential"
    );

    // Anonymous: the token service refuses too, and the message says credentials are missing.
    let anonymous = Client::new(config(&[&host])).unwrap();
    let err = anonymous
        .head_manifest(&reference(&format!("{host}/team/fn:v1")))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unauthorized {
                had_credentials: false,
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn basic_auth_over_tls_works_with_the_test_ca() {
    let reg = Registry::start(RegistryKind::BasicTls);
    let host = reg.host();
    let ca = std::fs::read(reg.ca_pem().unwrap()).unwrap();
    let cfg = ClientConfig {
        extra_ca_pem: vec![ca],
        credentials: CredentialStore::new(Some(reg.docker_config_dir()), None, "".into()),
        ..config(&[])
    };
    let client = Client::new(cfg.clone()).unwrap();
    let target = reference(&format!("{host}/team/secure:v1"));
    client
        .authorize(&host, &[Scope::push(&target.repository)])
        .await
        .unwrap();
    let image = test_image(11);
    let digest = push_image(&client, &target, &image).await;
    let got = client.get_manifest(&target, &[]).await.unwrap();
    assert_eq!(got.digest, digest);
    let dir = tempfile::tempdir().unwrap();
    client
        .get_blob_to_file(&target, &image.layer.0, &dir.path().join("l"))
        .await
        .unwrap();

    // No CA: the certificate is not trusted, and the error says what to do.
    let untrusting = Client::new(ClientConfig {
        extra_ca_pem: vec![],
        ..cfg.clone()
    })
    .unwrap();
    let err = untrusting.head_manifest(&target).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Transport {
                kind: TransportKind::Tls,
                hint: Hint::RegistryCa,
                ..
            }
        ),
        "{err:?}"
    );

    // No credentials, or wrong ones: Unauthorized.
    let anonymous = Client::new(ClientConfig {
        credentials: CredentialStore::default(),
        ..cfg.clone()
    })
    .unwrap();
    let err = anonymous.head_manifest(&target).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unauthorized {
                had_credentials: false,
                ..
            }
        ),
        "{err}"
    );
    let wrong = CredentialStore::default()
        .with_credential(&host, Credential::basic(USER, format!("{PASSWORD}x")));
    let wrong = Client::new(ClientConfig {
        credentials: wrong,
        ..cfg
    })
    .unwrap();
    let err = wrong
        .authorize(&host, &[Scope::pull(&target.repository)])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unauthorized {
                had_credentials: true,
                ..
            }
        ),
        "{err}"
    );
}

/// A `tracing` writer that keeps everything in memory.
#[derive(Clone, Default)]
struct Capture(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn debug_logs_show_requests_but_never_credentials_tokens_or_upload_state() {
    let capture = Capture::default();
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // tracing caches each callsite's interest globally; while only one dispatcher is
    // registered, a callsite first hit by another test's thread asks that thread's (empty)
    // default and is cached as "never". An idle second dispatcher makes it ask all of them.
    let _idle = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
    let _guard = tracing::subscriber::set_default(subscriber);

    let reg = Registry::start(RegistryKind::Token);
    let host = reg.host();
    let mut cfg = config(&[&host]);
    cfg.credentials = CredentialStore::default().with_docker_config_dir(reg.docker_config_dir());
    let client = Client::new(cfg).unwrap();
    let target = reference(&format!("{host}/team/logged:v1"));
    push_image(&client, &target, &test_image(21)).await;

    let logs = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains("registry request") && logs.contains("status=201"),
        "{logs}"
    );
    assert!(logs.contains("_state=REDACTED"), "{logs}");
    let basic = common::base64(format!("{USER}:{PASSWORD}").as_bytes());
    for secret in [PASSWORD, basic.as_str(), "eyJ", "Bearer ", "Basic "] {
        assert!(
            !logs.contains(secret),
            "{secret:?} leaked into the logs:\n{logs}"
        );
    }
}
