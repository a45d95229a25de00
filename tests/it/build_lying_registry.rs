//! A registry that lies: a proxy in front of the real one that changes manifest or blob bytes
//! but keeps the digests. kiln must notice, fail, and write or push nothing. A registry
//! whose blob redirect ends on a hostile host: no registry credential may reach it. And a
//! token realm that answers without end: kiln stops reading at its limit.

#![allow(clippy::unwrap_used)]

use crate::common;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use common::images::push_base_images;
use common::kiln::{Kiln, copy_fixture};
use common::registry::{Registry, RegistryKind};
use futures_util::StreamExt as _;

#[derive(Clone, Copy, PartialEq)]
enum Lie {
    Manifest,
    Blob,
    /// Blob GETs are redirected to the `scheme://host:port` in [`Proxy::redirect_to`].
    Redirect,
}

#[derive(Clone)]
struct Proxy {
    upstream: String,
    lie: Lie,
    http: reqwest::Client,
    redirect_to: String,
    scheme: &'static str,
}

async fn forward(State(p): State<Proxy>, req: Request) -> Response {
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_default();
    let method = req.method().clone();
    if p.lie == Lie::Redirect && method == "GET" && path.contains("/blobs/sha256:") {
        return Response::builder()
            .status(307)
            .header("location", format!("{}/storage{path}", p.redirect_to))
            .body(Body::empty())
            .unwrap();
    }
    let mut out = p.http.request(
        method.clone(),
        format!("{}://{}{path}", p.scheme, p.upstream),
    );
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
            Lie::Redirect => false,
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

fn start_proxy(upstream: String, lie: Lie, redirect_to: &str) -> (String, tokio::runtime::Runtime) {
    start_proxy_to(upstream, lie, redirect_to, None)
}

/// The proxy, to an upstream over TLS trusting `ca` when given.
fn start_proxy_to(
    upstream: String,
    lie: Lie,
    redirect_to: &str,
    ca: Option<&std::path::Path>,
) -> (String, tokio::runtime::Runtime) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let app = axum::Router::new().fallback(forward).with_state(Proxy {
        upstream,
        lie,
        http: match ca {
            Some(ca) => reqwest::Client::builder()
                .add_root_certificate(
                    reqwest::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap(),
                )
                .build()
                .unwrap(),
            None => reqwest::Client::new(),
        },
        redirect_to: redirect_to.to_string(),
        scheme: if ca.is_some() { "https" } else { "http" },
    });
    rt.spawn(async move { axum::serve(listener, app).await.unwrap() });
    (host, rt)
}

fn build_through(lie: Lie) -> (common::kiln::Run, tempfile::TempDir) {
    let reg = Registry::start(RegistryKind::Plain);
    let bases = push_base_images(&reg, "base/busybox");
    let (proxy, _rt) = start_proxy(reg.host(), lie, "");
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

/// A 401 with a Bearer challenge of `params`.
fn bearer_challenge(params: &str) -> Response {
    Response::builder()
        .status(401)
        .header("www-authenticate", format!("Bearer {params}"))
        .body(Body::empty())
        .unwrap()
}

/// A storage host that refuses everything with a Bearer challenge naming its own token realm,
/// and records each request's path and Authorization header.
fn start_hostile_storage(
    rt: &tokio::runtime::Runtime,
) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let realm = format!("http://{host}/token");
    let log = seen.clone();
    let app = axum::Router::new().fallback(move |req: Request| {
        let (log, realm) = (log.clone(), realm.clone());
        async move {
            let auth = req
                .headers()
                .get("authorization")
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_default();
            log.lock()
                .unwrap()
                .push(format!("{} auth={auth}", req.uri()));
            bearer_challenge(&format!(
                "realm=\"{realm}\",service=\"storage\",scope=\"repository:base/busybox:pull\""
            ))
        }
    });
    rt.spawn(async move { axum::serve(listener, app).await.unwrap() });
    (host, seen)
}

#[test]
fn a_token_response_without_end_fails_the_build_at_its_limit() {
    use std::sync::atomic::{AtomicU64, Ordering};
    const SENT: u64 = 256 << 20;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let realm = format!("http://{host}/token");
    let produced = std::sync::Arc::new(AtomicU64::new(0));
    let counter = produced.clone();
    let token = move || {
        let counter = counter.clone();
        async move {
            // 256 MiB of a JSON string that never closes.
            let chunks = futures_util::stream::iter(0..SENT >> 16).map(move |i| {
                counter.fetch_add(1 << 16, Ordering::Relaxed);
                let mut chunk = vec![b'a'; 1 << 16];
                if i == 0 {
                    chunk[..10].copy_from_slice(b"{\"token\":\"");
                }
                Ok::<_, std::io::Error>(bytes::Bytes::from(chunk))
            });
            Response::new(Body::from_stream(chunks))
        }
    };
    let app = axum::Router::new()
        .route("/token", axum::routing::get(token))
        .fallback(move || {
            let challenge = format!("realm=\"{realm}\",service=\"reg\"");
            async move { bearer_challenge(&challenge) }
        });
    rt.spawn(async move { axum::serve(listener, app).await.unwrap() });

    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("hello-node", &work.path().join("fn"));
    let run = kiln.run(&[
        "build",
        dir.to_str().unwrap(),
        "--runtime=nodejs22",
        "--base",
        &format!("{host}/base/busybox:1"),
        "--output",
        &format!("oci:{}", work.path().join("out").display()),
        "--insecure-registry",
        &host,
    ]);
    let err = run.failure(1);
    assert!(
        err.contains(&format!("the token response of http://{host}/token")),
        "{err}"
    );
    assert!(
        err.contains("is larger than the 1048576-byte limit"),
        "{err}"
    );
    // What the server produced: the limit, plus what the sockets buffered.
    let produced = produced.load(Ordering::Relaxed);
    assert!(produced < 32 << 20, "{produced} bytes were produced");
}

#[test]
fn a_redirect_to_another_host_gets_no_credentials_and_its_challenge_is_not_the_registrys() {
    for kind in [RegistryKind::Token, RegistryKind::BasicTls] {
        redirect_to_hostile_storage(kind);
    }
}

fn redirect_to_hostile_storage(kind: RegistryKind) {
    let reg = Registry::start(kind);
    let bases = push_base_images(&reg, "base/busybox");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (storage, seen) = start_hostile_storage(&rt);
    let (proxy, _proxy_rt) = start_proxy_to(
        reg.host(),
        Lie::Redirect,
        &format!("http://{storage}"),
        reg.ca_pem(),
    );
    let kiln = Kiln::new();
    let (user, password) = reg.credentials().unwrap();
    kiln.log_in(&proxy, user, password);
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("hello-node", &work.path().join("fn"));
    let run = kiln.run(&[
        "build",
        dir.to_str().unwrap(),
        "--runtime=nodejs22",
        "--base",
        &bases.oci.replace(&reg.host(), &proxy),
        "--output",
        &format!("oci:{}", work.path().join("out").display()),
        "--insecure-registry",
        &proxy,
    ]);
    let err = run.failure(1);
    assert!(err.contains(&format!("redirected to {storage}")), "{err}");
    let seen = seen.lock().unwrap().clone();
    assert!(!seen.is_empty(), "the redirect reached the storage host");
    for request in &seen {
        assert!(
            request.ends_with("auth="),
            "a credential reached the storage host: {request}"
        );
        assert!(
            !request.starts_with("/token"),
            "kiln asked the storage host for a token: {request}"
        );
    }
    assert!(!err.contains(password), "{err}");
}

/// An HTTPS storage host (Python, a test CA's certificate): `GET /storage/v2/…` answers what
/// the registry at `upstream` answers for `/v2/…`; each request's path and Authorization
/// header is appended to `log`; it writes its port to `portfile` once it listens.
const HTTPS_STORAGE: &str = r#"
import http.server, ssl, sys, urllib.request
cert, key, upstream, log, portfile = sys.argv[1:6]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(log, 'a') as f:
            f.write(f"{self.path} auth={self.headers.get('Authorization', '')}\n")
        if not self.path.startswith('/storage/'):
            self.send_error(404); return
        with urllib.request.urlopen(f"http://{upstream}{self.path[len('/storage'):]}") as r:
            body = r.read()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(('127.0.0.1', 0), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); ctx.load_cert_chain(cert, key)
s.socket = ctx.wrap_socket(s.socket, server_side=True)
open(portfile + '.tmp', 'w').write(str(s.server_address[1]))
import os; os.rename(portfile + '.tmp', portfile)
s.serve_forever()
"#;

#[test]
fn a_plain_http_registry_that_sends_blobs_to_https_storage_builds_without_leaking_credentials() {
    // The registry client keeps no TLS roots for plain-HTTP registries; a redirect to https
    // storage is followed with the TLS client, trusting --registry-ca.
    let reg = Registry::start(RegistryKind::Plain);
    let bases = push_base_images(&reg, "base/busybox");
    let work = tempfile::tempdir().unwrap();
    let ca = common::registry::make_test_tls(&work.path().join("tls"));
    let (log, portfile) = (work.path().join("storage.log"), work.path().join("port"));
    let tls = work.path().join("tls");
    let mut storage = std::process::Command::new("python3")
        .args(["-c", HTTPS_STORAGE])
        .arg(tls.join("cert.pem"))
        .arg(tls.join("key.pem"))
        .arg(reg.host())
        .arg(&log)
        .arg(&portfile)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !portfile.exists() {
        if std::time::Instant::now() >= deadline {
            let _ = storage.kill();
            let _ = storage.wait();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the storage host did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let port = std::fs::read_to_string(&portfile).unwrap();
    let storage_host = format!("127.0.0.1:{port}");
    let (proxy, _rt) = start_proxy_to(
        reg.host(),
        Lie::Redirect,
        &format!("https://{storage_host}"),
        None,
    );
    let kiln = Kiln::new();
    // Credentials for the registry (it ignores them): they must not reach the storage host.
    kiln.log_in(&proxy, "robot", "kiln-storage-secret-4e1d");
    let dir = copy_fixture("hello-node", &work.path().join("fn"));
    let run = kiln.run(&[
        "build",
        dir.to_str().unwrap(),
        "--runtime=nodejs22",
        "--base",
        &bases.oci.replace(&reg.host(), &proxy),
        "--output",
        &format!("oci:{}", work.path().join("out").display()),
        "--insecure-registry",
        &proxy,
        "--registry-ca",
        ca.to_str().unwrap(),
    ]);
    let _ = storage.kill();
    let _ = storage.wait();
    run.reference();
    let seen = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        seen.lines()
            .any(|l| l.starts_with("/storage/v2/base/busybox/blobs/sha256:")),
        "the blobs came from the https storage host: {seen:?}"
    );
    for line in seen.lines() {
        assert!(
            line.ends_with("auth="),
            "a credential reached the storage host: {line}"
        );
    }
}
