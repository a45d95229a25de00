//! The registry client against scripted registries (axum on 127.0.0.1:0) that lie or fail:
//! wrong digests and lengths, server errors to retry or give up on, wrong passwords, a 202
//! without a Location, missing manifests, unreachable hosts, and uploads to relative and
//! absolute locations. Errors never show upload state or credentials.

use crate::common;

use std::io::Read as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{blob, config, pseudo_random, reference, uploaded, urlenc};
use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use bytes::Bytes;
use kiln::oci::{Descriptor, Digest, MediaType};
use kiln::registry::{BlobSource, Client, Credential, CredentialStore, Error, Hint, TransportKind};

/// Serves `app` on 127.0.0.1:0 and returns `127.0.0.1:PORT`.
async fn serve(app: Router) -> String {
    common::http::serve(app).await.to_string()
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
    // Streamed to a reader: what it made of the bytes is never returned, even when it stopped
    // reading before the changed byte (the rest is drained and checked).
    for stop in [10, usize::MAX] {
        let read = move |r: &mut dyn std::io::Read| {
            let mut seen = Vec::new();
            r.take(stop as u64)
                .read_to_end(&mut seen)
                .map(|_| seen.len())
        };
        let err = client.read_blob(&repo, &d, read).await.unwrap_err();
        assert!(matches!(err, Error::DigestMismatch { .. }), "{err}");
    }
}

#[tokio::test]
async fn a_blob_streamed_to_a_reader_gives_its_answer_once_the_whole_blob_is_checked() {
    let good = pseudo_random(300_000, 2);
    let (host, _) = scripted({
        let good = good.clone();
        move |_, _, _, _| respond(200, &[], good.clone())
    })
    .await;
    let client = Client::new(config(&[&host])).unwrap();
    let repo = reference(&format!("{host}/honest/app"));
    let (d, _) = blob(&good);
    let first = client
        .read_blob(&repo, &d, |r: &mut dyn std::io::Read| {
            let mut head = [0u8; 4];
            r.read_exact(&mut head).map(|()| head)
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first, good[..4]);
    // The reader's own failure comes back as its own, not the registry's.
    let failed = client
        .read_blob(&repo, &d, |_: &mut dyn std::io::Read| {
            Err::<(), _>(std::io::Error::other("not a tar"))
        })
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(failed.to_string(), "not a tar");
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
    let read = |r: &mut dyn std::io::Read| std::io::copy(r, &mut std::io::sink());
    let err = client
        .read_blob(&reference(&format!("{host}/a")), &d, read)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::SizeMismatch { expected: 100, .. }),
        "{err}"
    );
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
