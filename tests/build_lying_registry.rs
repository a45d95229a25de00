//! A registry that lies: a proxy in front of the real one that changes manifest or blob bytes
//! but keeps the digests. kiln must notice, fail, and write or push nothing.

#![allow(clippy::unwrap_used)]

mod common;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use common::images::push_base_images;
use common::kiln::{Kiln, copy_fixture};
use common::registry::{Registry, RegistryKind};

#[derive(Clone, Copy, PartialEq)]
enum Lie {
    Manifest,
    Blob,
}

#[derive(Clone)]
struct Proxy {
    upstream: String,
    lie: Lie,
    http: reqwest::Client,
}

async fn forward(State(p): State<Proxy>, req: Request) -> Response {
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_default();
    let method = req.method().clone();
    let mut out = p
        .http
        .request(method.clone(), format!("http://{}{path}", p.upstream));
    for (k, v) in req.headers() {
        if k != "host" {
            out = out.header(k, v);
        }
    }
    let body = axum::body::to_bytes(req.into_body(), usize::MAX)
        .await
        .unwrap();
    let resp = out.body(body).send().await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let mut bytes = resp.bytes().await.unwrap().to_vec();
    let tamper = method == "GET"
        && status.is_success()
        && !path.starts_with("/v2/?")
        && path != "/v2/"
        && match p.lie {
            Lie::Manifest => path.contains("/manifests/"),
            Lie::Blob => path.contains("/blobs/sha256:") && bytes.len() > 1000,
        };
    if tamper {
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
    }
    let mut builder = Response::builder().status(status.as_u16());
    for (k, v) in &headers {
        if k != "content-length" && k != "transfer-encoding" {
            builder = builder.header(k.as_str(), v.as_bytes());
        }
    }
    builder.body(Body::from(bytes)).unwrap()
}

fn start_proxy(upstream: String, lie: Lie) -> (String, tokio::runtime::Runtime) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let app = axum::Router::new().fallback(forward).with_state(Proxy {
        upstream,
        lie,
        http: reqwest::Client::new(),
    });
    rt.spawn(async move { axum::serve(listener, app).await.unwrap() });
    (host, rt)
}

fn build_through(lie: Lie) -> (common::kiln::Run, tempfile::TempDir) {
    let reg = Registry::start(RegistryKind::Plain);
    let bases = push_base_images(&reg, "base/busybox");
    let (proxy, _rt) = start_proxy(reg.host(), lie);
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("hello-node", &work.path().join("fn"));
    let base = bases.oci.replace(&reg.host(), &proxy);
    let out = work.path().join("out");
    let run = kiln.run(&[
        "build",
        dir.to_str().unwrap(),
        "--runtime=nodejs22",
        "--base",
        &base,
        "--output",
        &format!("oci:{}", out.display()),
        "--insecure-registry",
        &proxy,
    ]);
    (run, work)
}

#[test]
fn a_manifest_that_does_not_match_its_digest_fails_the_build() {
    let (run, work) = build_through(Lie::Manifest);
    let err = run.failure(1);
    assert!(err.contains("digest"), "{err}");
    assert!(
        !work.path().join("out/index.json").exists(),
        "no image was written"
    );
}

#[test]
fn a_base_layer_that_does_not_match_its_digest_fails_the_build_and_leaves_no_image() {
    let (run, work) = build_through(Lie::Blob);
    let err = run.failure(1);
    assert!(err.contains("digest"), "{err}");
    let index = std::fs::read_to_string(work.path().join("out/index.json")).unwrap_or_default();
    assert!(
        !index.contains("latest"),
        "the layout must not name an image: {index}"
    );
}
