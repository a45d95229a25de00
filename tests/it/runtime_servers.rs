//! The function servers in `runtimes/_servers/` (Node.js, and Python on bottle and cheroot)
//! implement Kyma's runtime contract, so existing Kyma Functions run unchanged.
//!
//! Each test starts the host's `node` or `python3` directly on `runtimes/_servers/*/server.*`
//! with a fixture Function from `tests/fixtures/servers/` (its `main` dispatches on the request
//! path), on port 0 (the server logs the port it got), and talks HTTP to it on 127.0.0.1. No
//! image is involved: the base images' Kyma runtime packages (the OpenTelemetry SDK, axios;
//! bottle, cheroot, requests…) are installed from the same locks into shared directories for
//! `NODE_PATH` and `PYTHONPATH`. `KILN_TEST_NODE` / `KILN_TEST_PYTHON` pick other interpreters.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::fs;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::echo::Publisher;
use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};

#[derive(Clone, Copy, Debug)]
enum Runtime {
    Node,
    Python,
}

impl Runtime {
    /// What the fixture reports as `context.runtime` (`FUNC_RUNTIME`).
    fn name(self) -> &'static str {
        match self {
            Runtime::Node => "nodejs20",
            Runtime::Python => "python311",
        }
    }

    /// File name of the fixture Function, as it appears in stack traces.
    fn handler_file(self) -> &'static str {
        match self {
            Runtime::Node => "handler.js",
            Runtime::Python => "handler.py",
        }
    }
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A running function server; killed (and reaped) on drop.
struct Server {
    child: Child,
    port: u16,
    logs: tempfile::TempDir,
    exit: Option<ExitStatus>,
}

impl Server {
    /// Starts `runtime`'s server with the fixture Function and `env` on top of the defaults,
    /// and waits until it logs the port it listens on.
    fn start(runtime: Runtime, env: &[(&str, &str)]) -> Server {
        let logs = tempfile::tempdir().unwrap();
        let fixtures = repo().join("tests/fixtures/servers");
        let servers = repo().join("runtimes/_servers");
        let (program, script) = match runtime {
            Runtime::Node => (interpreter("KILN_TEST_NODE", "node"), "node/server.js"),
            Runtime::Python => (
                interpreter("KILN_TEST_PYTHON", "python3"),
                "python/server.py",
            ),
        };
        let mut cmd = Command::new(program);
        cmd.arg(servers.join(script));
        // A clean environment, like the image's: only what the contract defines.
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("FUNC_PORT", "0")
            .env("FUNC_NAME", "fixture")
            .env("SERVICE_NAMESPACE", "tests")
            .env("FUNC_RUNTIME", runtime.name())
            .env("FUNC_HANDLER", "main")
            .env("MOD_NAME", "handler");
        match runtime {
            Runtime::Node => cmd
                .env("NODE_PATH", node_packages())
                .env("HANDLER_PATH", fixtures.join("node/handler.js")),
            Runtime::Python => cmd
                .env("PYTHONPATH", python_packages())
                .env("FUNCTION_PATH", fixtures.join("python"))
                .env("PYTHONUNBUFFERED", "TRUE")
                .env("PYTHONDONTWRITEBYTECODE", "1"),
        };
        cmd.envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(fs::File::create(logs.path().join("stdout")).unwrap())
            .stderr(fs::File::create(logs.path().join("stderr")).unwrap());
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        let mut server = Server {
            child,
            port: 0,
            logs,
            exit: None,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(port) = listening_port(&server.stdout()) {
                server.port = port;
                return server;
            }
            if let Some(status) = server.child.try_wait().unwrap() {
                panic!(
                    "{runtime:?} server exited ({status}) before listening:\n{}",
                    server.logs()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{runtime:?} server did not start:\n{}",
                server.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn stdout(&self) -> String {
        fs::read_to_string(self.logs.path().join("stdout")).unwrap_or_default()
    }

    fn stderr(&self) -> String {
        fs::read_to_string(self.logs.path().join("stderr")).unwrap_or_default()
    }

    fn logs(&self) -> String {
        format!("--- stdout\n{}--- stderr\n{}", self.stdout(), self.stderr())
    }

    /// Sends SIGTERM, as the kubelet does when a Pod stops.
    fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -TERM failed");
    }

    /// The exit status, once the process exits within `timeout`.
    async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                self.exit = Some(status);
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// Polls `stderr` until it contains `needle` (the server may log just after answering).
    async fn stderr_containing(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let stderr = self.stderr();
            if stderr.contains(needle) || Instant::now() > deadline {
                return stderr;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The nodejs22 base image's Kyma runtime packages (the OpenTelemetry SDK for tracing),
/// installed from the same pinned tarballs into a `node_modules` shared by every test, for
/// `NODE_PATH`, as they sit in the image's /usr/src/app/node_modules.
fn node_packages() -> PathBuf {
    let (_, lock) = kiln::base::recipe::embedded("nodejs22").unwrap();
    let key: String = lock
        .npm_tree
        .iter()
        .map(|p| p.tarball.integrity.clone())
        .collect();
    shared_install("node-packages", &key, move |http, cache, into| {
        let registry: url::Url = "https://registry.npmjs.org/".parse().unwrap();
        Box::pin(async move {
            kiln::base::packages::install_npm(&http, &registry, &cache, &lock.npm_tree, &into)
                .await
                .unwrap();
        })
    })
}

type Install = Box<
    dyn FnOnce(reqwest::Client, PathBuf, PathBuf) -> std::pin::Pin<Box<dyn Future<Output = ()>>>
        + Send,
>;

/// Installs once into a directory named by `prefix` and a hash of `key`, shared by every
/// test process (the first to finish renames its copy into place).
fn shared_install(
    prefix: &str,
    key: &str,
    install: impl FnOnce(
        reqwest::Client,
        PathBuf,
        PathBuf,
    ) -> std::pin::Pin<Box<dyn Future<Output = ()>>>
    + Send
    + 'static,
) -> PathBuf {
    let install: Install = Box::new(install);
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = tmp.join(format!(
        "{prefix}-{}",
        &kiln::oci::Digest::of(key.as_bytes()).hex()[..16]
    ));
    if dir.is_dir() {
        return dir;
    }
    let cache = tmp.join("kiln-test-cache");
    let staging = tempfile::tempdir_in(tmp).unwrap();
    let into = staging.path().to_path_buf();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(install(reqwest::Client::new(), cache, into));
    })
    .join()
    .unwrap();
    let kept = staging.keep();
    if fs::rename(&kept, &dir).is_err() {
        let _ = fs::remove_dir_all(&kept);
    }
    dir
}

/// The python313 base image's Kyma runtime packages (bottle and cheroot serve the Python
/// server), installed from the same pinned wheels into a directory shared by every test, for
/// `PYTHONPATH`, as they sit in the image's dist-packages.
fn python_packages() -> PathBuf {
    let (_, lock) = kiln::base::recipe::embedded("python313").unwrap();
    let key: String = lock.wheel.iter().map(|w| w.sha256.clone()).collect();
    shared_install("python-packages", &key, move |http, cache, into| {
        Box::pin(async move {
            kiln::base::packages::install_wheels(&http, &cache, &lock.wheel, &into)
                .await
                .unwrap();
        })
    })
}

fn interpreter(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from)
}

/// The port in the start line, "… listening on 0.0.0.0:<port>, …".
fn listening_port(stdout: &str) -> Option<u16> {
    let rest = &stdout[stdout.find("listening on 0.0.0.0:")? + "listening on 0.0.0.0:".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn client() -> Client {
    Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Calls `path` with `method` and an optional JSON body; returns status and parsed JSON.
async fn call_json(server: &Server, method: Method, path: &str, body: Option<Value>) -> Value {
    let mut req = client().request(method, server.url(path));
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{path}");
    assert_json(&resp);
    resp.json().await.unwrap()
}

fn header<'a>(resp: &'a reqwest::Response, name: &str) -> &'a str {
    resp.headers().get(name).map_or("", |v| v.to_str().unwrap())
}

fn assert_json(resp: &reqwest::Response) {
    let ctype = header(resp, "content-type");
    assert!(
        ctype.starts_with("application/json"),
        "content type {ctype:?}"
    );
}

/// The value of the sample `name` (no labels, or the exact label set) in a metrics page.
fn sample(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| {
            line.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no sample {name} in:\n{metrics}"))
}

async fn metrics(server: &Server) -> String {
    let resp = client().get(server.url("/metrics")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let ctype = header(&resp, "content-type");
    assert!(
        ctype.starts_with("text/plain; version=0.0.4"),
        "content type {ctype:?}"
    );
    resp.text().await.unwrap()
}

// ---- the checks, run against both runtimes ----

async fn json_body_round_trips_with_context(rt: Runtime) {
    let server = Server::start(rt, &[]);
    let resp = client()
        .post(server.url("/echo?name=kiln&n=1"))
        .json(&json!({"hello": "world", "list": [1, 2, 3], "nested": {"ok": true}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(header(&resp, "access-control-allow-origin"), "*");
    assert_json(&resp);
    let echo: Value = resp.json().await.unwrap();
    assert_eq!(echo["kind"], "json");
    assert_eq!(
        echo["data"],
        json!({"hello": "world", "list": [1, 2, 3], "nested": {"ok": true}})
    );
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["query"]["name"], "kiln");
    let context = &echo["context"];
    assert_eq!(context["function-name"], "fixture");
    assert_eq!(context["namespace"], "tests");
    assert_eq!(context["runtime"], rt.name());
    assert_eq!(context["timeout"].as_f64(), Some(180.0));
    assert!(
        context["body-size-limit"].as_f64().unwrap() > 0.0,
        "{context}"
    );
}

async fn binary_cloud_event_fills_ce_fields(rt: Runtime) {
    let server = Server::start(rt, &[]);
    // Title-cased names on the wire ("Ce-Type"): CE headers are case-insensitive.
    let client = Client::builder()
        .no_proxy()
        .http1_title_case_headers()
        .build()
        .unwrap();
    let resp = client
        .post(server.url("/echo"))
        .header("Ce-Type", "order.created")
        .header("CE-SOURCE", "/shop")
        .header("ce-id", "A-123")
        .header("Ce-Specversion", "1.0")
        .header("Ce-Time", "2024-05-01T12:00:00Z")
        .header("Ce-Eventtypeversion", "v1")
        .json(&json!({"order": 42}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let echo: Value = resp.json().await.unwrap();
    assert_eq!(echo["data"], json!({"order": 42}));
    let ce = &echo["ce"];
    assert_eq!(ce["type"], "order.created");
    assert_eq!(ce["source"], "/shop");
    assert_eq!(ce["id"], "A-123");
    assert_eq!(ce["specversion"], "1.0");
    // Node normalises time as the CloudEvents SDK does.
    let time = match rt {
        Runtime::Node => "2024-05-01T12:00:00.000Z",
        Runtime::Python => "2024-05-01T12:00:00Z",
    };
    assert_eq!(ce["time"], time);
    assert_eq!(ce["eventtypeversion"], "v1");
    assert_eq!(ce["datacontenttype"], "application/json");
}

async fn structured_cloud_event_fills_ce_fields(rt: Runtime) {
    let server = Server::start(rt, &[]);
    let envelope = json!({
        "specversion": "1.0",
        "type": "order.shipped",
        "source": "/warehouse",
        "id": "B-7",
        "time": "2024-05-02T08:30:00Z",
        "datacontenttype": "application/json",
        "data": {"order": 43, "carrier": "dhl"}
    });
    let resp = client()
        .post(server.url("/echo"))
        .header(
            "content-type",
            "application/cloudevents+json; charset=utf-8",
        )
        .body(envelope.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let echo: Value = resp.json().await.unwrap();
    assert_eq!(echo["data"], json!({"order": 43, "carrier": "dhl"}));
    let ce = &echo["ce"];
    assert_eq!(ce["type"], "order.shipped");
    assert_eq!(ce["source"], "/warehouse");
    assert_eq!(ce["id"], "B-7");
    assert_eq!(ce["specversion"], "1.0");
    let time = match rt {
        Runtime::Node => "2024-05-02T08:30:00.000Z",
        Runtime::Python => "2024-05-02T08:30:00Z",
    };
    assert_eq!(ce["time"], time);
    assert_eq!(ce["datacontenttype"], "application/json");

    // data_base64 (binary data in a JSON envelope) becomes raw bytes.
    let resp = client()
        .put(server.url("/echo"))
        .header("content-type", "application/cloudevents+json")
        .body(r#"{"specversion":"1.0","type":"t","source":"s","id":"1","data_base64":"aGk="}"#)
        .send()
        .await
        .unwrap();
    let echo: Value = resp.json().await.unwrap();
    assert_eq!(
        (&echo["kind"], &echo["data"]),
        (&json!("bytes"), &json!("hi"))
    );
}

async fn text_form_raw_and_empty_bodies_are_parsed(rt: Runtime) {
    let server = Server::start(rt, &[]);
    let http = client();
    let cases = [
        (
            Method::PUT,
            "text/plain; charset=utf-8",
            "héllo text",
            "string",
            json!("héllo text"),
        ),
        (
            Method::PATCH,
            "application/x-www-form-urlencoded",
            "a=1&b=two+words",
            "json",
            json!({"a": "1", "b": "two words"}),
        ),
        (
            Method::DELETE,
            "application/octet-stream",
            "raw bytes",
            "bytes",
            json!("raw bytes"),
        ),
    ];
    for (method, ctype, body, kind, data) in cases {
        let resp = http
            .request(method.clone(), server.url("/echo"))
            .header("content-type", ctype)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{method} {ctype}");
        let echo: Value = resp.json().await.unwrap();
        assert_eq!(echo["method"], method.as_str());
        assert_eq!(
            (&echo["kind"], &echo["data"]),
            (&json!(kind), &data),
            "{method} {ctype}"
        );
    }
    // A GET without a body: data is undefined/None, the query is on the request.
    let echo = call_json(&server, Method::GET, "/echo?x=1", None).await;
    assert_eq!(echo["kind"], "none");
    assert_eq!(echo["query"]["x"], "1");

    // A returned string is sent as text.
    let resp = http.get(server.url("/text")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(header(&resp, "content-type").starts_with("text/plain"));
    assert!(resp.text().await.unwrap().starts_with("plain text from "));
    // Returning nothing is an empty 200.
    let resp = http.post(server.url("/empty")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.text().await.unwrap(), "");
}

async fn status_and_headers_set_by_the_function_reach_the_client(rt: Runtime) {
    let server = Server::start(rt, &[]);
    let resp = client().post(server.url("/status")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    assert_eq!(header(&resp, "x-fixture"), "yes");
    assert_eq!(header(&resp, "access-control-allow-origin"), "*");
    assert_json(&resp);
    assert_eq!(
        resp.json::<Value>().await.unwrap(),
        json!({"created": true})
    );
}

async fn built_in_endpoints_and_preflight_skip_the_function(rt: Runtime) {
    let server = Server::start(rt, &[]);
    let http = client();
    let resp = http.get(server.url("/healthz")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.text().await.unwrap(), "OK");
    let resp = http.get(server.url("/favicon.ico")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let resp = http
        .request(Method::OPTIONS, server.url("/anything"))
        .header("Origin", "https://example.com")
        .header("Access-Control-Request-Method", "PUT")
        .header("Access-Control-Request-Headers", "content-type, x-custom")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    assert_eq!(header(&resp, "access-control-allow-origin"), "*");
    assert!(header(&resp, "access-control-allow-methods").contains("PUT"));
    assert!(header(&resp, "access-control-allow-headers").contains("x-custom"));
    assert_eq!(sample(&metrics(&server).await, "function_calls_total"), 0.0);
}

async fn metrics_count_calls_and_failures(rt: Runtime) {
    let server = Server::start(rt, &[]);
    let before = metrics(&server).await;
    for family in ["function_calls_total", "function_failures_total"] {
        assert!(
            before.contains(&format!("# TYPE {family} counter")),
            "{before}"
        );
        assert!(before.contains(&format!("# HELP {family} ")), "{before}");
        assert_eq!(sample(&before, family), 0.0);
    }
    let http = client();
    for path in ["/text", "/echo", "/throw"] {
        http.get(server.url(path)).send().await.unwrap();
    }
    let after = metrics(&server).await;
    assert_eq!(sample(&after, "function_calls_total"), 3.0, "{after}");
    assert_eq!(sample(&after, "function_failures_total"), 1.0, "{after}");
    assert!(
        after.contains("# TYPE function_duration_seconds histogram"),
        "{after}"
    );
    assert!(
        after.contains("# HELP function_duration_seconds "),
        "{after}"
    );
    assert_eq!(
        sample(&after, "function_duration_seconds_bucket{le=\"+Inf\"}"),
        3.0
    );
    assert_eq!(sample(&after, "function_duration_seconds_count"), 3.0);
    assert!(sample(&after, "function_duration_seconds_sum") >= 0.0);
    let buckets = after
        .lines()
        .filter(|l| l.starts_with("function_duration_seconds_bucket{le=\""));
    assert!(buckets.count() > 5, "{after}");
}

async fn a_throw_answers_500_and_logs_the_stack(rt: Runtime) {
    let server = Server::start(rt, &[]);
    let resp = client().post(server.url("/throw")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(header(&resp, "access-control-allow-origin"), "*");
    assert_eq!(resp.text().await.unwrap().trim(), "Internal server error");
    let stderr = server.stderr_containing(rt.handler_file()).await;
    assert!(stderr.contains("boom from the fixture"), "{stderr}");
    // The stack points into the Function's file.
    assert!(
        stderr.contains(rt.handler_file()),
        "no stack in stderr:\n{stderr}"
    );
}

/// One server thread (Python): the timed-out call still runs on it, so the server must have
/// put another in its place.
async fn a_slow_function_times_out_with_408(rt: Runtime) {
    let server = Server::start(rt, &[("FUNC_TIMEOUT", "1"), ("CHERRYPY_NUMTHREADS", "1")]);
    let started = Instant::now();
    let resp = client().get(server.url("/sleep")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(
        resp.text().await.unwrap(),
        "Timeout while processing the function\n"
    );
    let page = metrics(&server).await;
    assert_eq!(sample(&page, "function_failures_total"), 1.0, "{page}");
    // The server still serves while the timed-out call lingers (which it does for 5 s).
    let resp = client().get(server.url("/text")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        started.elapsed() < Duration::from_millis(4500),
        "waited for the timed-out call: {:?}",
        started.elapsed()
    );
    // The Function returns (after 5 s): its result goes nowhere, nothing breaks, and the
    // server serves on.
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(started.elapsed())).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..3 {
        let resp = client().get(server.url("/text")).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }
    let page = metrics(&server).await;
    assert_eq!(sample(&page, "function_failures_total"), 1.0, "{page}");
    assert_eq!(sample(&page, "function_calls_total"), 5.0, "{page}");
    let stderr = server.stderr();
    assert!(stderr.contains("Function timed out after 1s"), "{stderr}");
    assert!(
        !stderr.contains("Error") && !stderr.contains("Traceback"),
        "{stderr}"
    );
}

/// A call past FUNC_TIMEOUT was answered; that its Function still runs must not hold up the
/// exit on SIGTERM.
async fn sigterm_exits_promptly_while_a_timed_out_call_still_runs(rt: Runtime) {
    let mut server = Server::start(rt, &[("FUNC_TIMEOUT", "1")]);
    let resp = client().get(server.url("/sleep")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT);
    let started = Instant::now();
    server.terminate();
    let status = server.wait_exit(Duration::from_secs(5)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "exit {status:?}:\n{}",
        server.logs()
    );
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "took {:?} to exit:\n{}",
        started.elapsed(),
        server.logs()
    );
}

async fn a_body_over_the_limit_gets_413(rt: Runtime) {
    // 0.001 MiB = 1048 bytes.
    let server = Server::start(rt, &[("REQ_MB_LIMIT", "0.001")]);
    let http = client();
    for size in [2_000, 512 * 1024] {
        let resp = http
            .post(server.url("/echo"))
            .header("content-type", "text/plain")
            .body(vec![b'x'; size])
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE, "{size} bytes");
    }
    // Chunked, no Content-Length: cut off while streaming.
    let chunks = (0..8).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b'y'; 512])));
    let resp = http
        .post(server.url("/echo"))
        .header("content-type", "text/plain")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE, "chunked");
    // Under the limit still works, chunked or not; the function never saw the big ones.
    let chunks = (0..2).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b'z'; 256])));
    let resp = http
        .post(server.url("/echo"))
        .header("content-type", "text/plain")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let echo: Value = resp.json().await.unwrap();
    assert_eq!(echo["data"].as_str().unwrap().len(), 512);
    assert_eq!(sample(&metrics(&server).await, "function_calls_total"), 1.0);
}

async fn sigterm_drains_in_flight_requests_then_exits_zero(rt: Runtime) {
    let mut server = Server::start(rt, &[("FUNC_TIMEOUT", "10")]);
    let slow = tokio::spawn(client().get(server.url("/slow")).send());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!slow.is_finished(), "/slow answered too early");
    server.terminate();

    // New connections are refused while /slow is still running.
    let deadline = Instant::now() + Duration::from_secs(3);
    while TcpStream::connect(("127.0.0.1", server.port)).is_ok() {
        assert!(
            Instant::now() < deadline,
            "still accepting after SIGTERM:\n{}",
            server.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !slow.is_finished(),
        "/slow finished before the listener closed"
    );

    let resp = slow.await.unwrap().unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.text().await.unwrap(), "slow done");
    let status = server.wait_exit(Duration::from_secs(5)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "exit {status:?}:\n{}",
        server.logs()
    );
    let stdout = server.stdout();
    assert!(stdout.contains("SIGTERM received"), "{stdout}");
}

/// (`Keep-Alive` as ab and HTTP/1.0 clients spell it: cheroot compares the value case-sensitively.)
async fn http_1_0_keep_alive_clients_reuse_the_connection(rt: Runtime) {
    use std::io::{BufRead, BufReader, Read, Write};
    let server = Server::start(rt, &[]);
    let port = server.port;
    tokio::task::spawn_blocking(move || {
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut writer = stream;
        for path in ["/text", "/echo", "/empty"] {
            write!(
                writer,
                "GET {path} HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"
            )
            .unwrap();
            let mut length = None;
            let mut status = String::new();
            reader.read_line(&mut status).unwrap();
            assert!(status.contains(" 200 "), "{path}: {status:?}");
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                if line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = Some(v.trim().parse::<usize>().unwrap());
                }
            }
            let length = length.unwrap_or_else(|| panic!("{path}: no Content-Length"));
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
        }
    })
    .await
    .unwrap();
}

/// One test per runtime and check, each named as a sentence.
macro_rules! for_both_runtimes {
    ($($check:ident: $node:ident, $python:ident;)*) => {$(
        #[tokio::test]
        async fn $node() {
            $check(Runtime::Node).await;
        }

        #[tokio::test]
        async fn $python() {
            $check(Runtime::Python).await;
        }
    )*};
}

for_both_runtimes! {
    json_body_round_trips_with_context:
        node_echoes_a_json_body_as_json_with_the_function_context,
        python_echoes_a_json_body_as_json_with_the_function_context;
    binary_cloud_event_fills_ce_fields:
        node_fills_the_ce_fields_from_binary_mode_cloud_event_headers,
        python_fills_the_ce_fields_from_binary_mode_cloud_event_headers;
    structured_cloud_event_fills_ce_fields:
        node_fills_the_ce_fields_and_data_from_a_structured_mode_cloud_event,
        python_fills_the_ce_fields_and_data_from_a_structured_mode_cloud_event;
    text_form_raw_and_empty_bodies_are_parsed:
        node_passes_text_form_raw_and_missing_bodies_as_string_object_bytes_and_nothing,
        python_passes_text_form_raw_and_missing_bodies_as_string_object_bytes_and_nothing;
    status_and_headers_set_by_the_function_reach_the_client:
        node_sends_the_status_and_headers_the_function_set,
        python_sends_the_status_and_headers_the_function_set;
    built_in_endpoints_and_preflight_skip_the_function:
        node_answers_healthz_favicon_and_cors_preflight_without_calling_the_function,
        python_answers_healthz_favicon_and_cors_preflight_without_calling_the_function;
    metrics_count_calls_and_failures:
        node_metrics_count_calls_and_failures_and_expose_a_duration_histogram,
        python_metrics_count_calls_and_failures_and_expose_a_duration_histogram;
    a_throw_answers_500_and_logs_the_stack:
        node_answers_500_when_the_function_throws_and_logs_the_stack,
        python_answers_500_when_the_function_raises_and_logs_the_traceback;
    a_slow_function_times_out_with_408:
        node_answers_408_when_the_function_runs_past_func_timeout,
        python_answers_408_when_the_function_runs_past_func_timeout;
    a_body_over_the_limit_gets_413:
        node_answers_413_to_a_body_over_req_mb_limit_without_calling_the_function,
        python_answers_413_to_a_body_over_req_mb_limit_without_calling_the_function;
    sigterm_drains_in_flight_requests_then_exits_zero:
        node_finishes_in_flight_requests_on_sigterm_then_exits_zero,
        python_finishes_in_flight_requests_on_sigterm_then_exits_zero;
    sigterm_exits_promptly_while_a_timed_out_call_still_runs:
        node_exits_promptly_on_sigterm_while_a_timed_out_call_still_runs,
        python_exits_promptly_on_sigterm_while_a_timed_out_call_still_runs;
    emitted_cloud_events_are_valid_with_a_time_and_return_the_publishers_answer:
        node_emits_valid_cloud_events_with_a_time_and_resolves_to_the_publishers_answer,
        python_emits_valid_cloud_events_with_a_time_and_returns_the_publishers_answer;
    a_reply_event_is_built_and_published_the_deprecated_way:
        node_builds_and_publishes_a_reply_event_the_deprecated_way,
        python_builds_and_publishes_a_reply_event_the_deprecated_way;
    a_request_is_a_cloud_event_only_when_it_is_one_and_gets_an_id_and_a_time:
        node_sets_ce_fields_only_for_cloud_events_and_fills_id_and_time,
        python_sets_ce_keys_only_for_cloud_events_and_fills_id_and_time;
    incoming_traces_continue_into_outgoing_calls_and_the_functions_spans:
        node_continues_w3c_and_b3_traces_into_outgoing_calls_and_the_functions_spans,
        python_continues_w3c_and_b3_traces_into_outgoing_calls_and_the_functions_spans;
    without_trace_headers_or_a_collector_nothing_is_traced:
        node_traces_nothing_and_loads_no_sdk_without_trace_headers_or_a_collector,
        python_traces_nothing_and_loads_no_sdk_without_trace_headers_or_a_collector;
    http_1_0_keep_alive_clients_reuse_the_connection:
        node_sizes_every_answer_so_http_1_0_keep_alive_clients_reuse_the_connection,
        python_sizes_every_answer_so_http_1_0_keep_alive_clients_reuse_the_connection;
    spans_are_exported_to_the_trace_collector_over_otlp_http:
        node_exports_spans_to_the_trace_collector_over_otlp_http,
        python_exports_spans_to_the_trace_collector_over_otlp_http;
}

#[tokio::test]
async fn python_functions_get_bottles_request_and_answer_through_bottles_response() {
    let server = Server::start(Runtime::Python, &[]);
    let resp = client()
        .post(server.url("/bottle?n=5&q=1"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("cookie", "c=chocolate")
        .header("x-custom", "custom")
        .body("f=form-value")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    assert_eq!(header(&resp, "x-bottle"), "yes");
    assert!(header(&resp, "set-cookie").starts_with("seen=1"));
    assert_eq!(header(&resp, "access-control-allow-origin"), "*");
    assert_json(&resp);
    let got: Value = resp.json().await.unwrap();
    assert_eq!(
        got,
        json!({
            "type": "LocalRequest",
            "params": {"n": "5", "q": "1", "f": "form-value"},
            "forms": "form-value",
            "n": 5,
            "missing": 7,
            "body": "f=form-value",
            "content_type": "application/x-www-form-urlencoded",
            "method": "POST",
            "cookie": "chocolate",
            "cookies": {"c": "chocolate"},
            "header": "custom",
        })
    );

    let resp = client()
        .post(server.url("/json"))
        .json(&json!({"a": [1, 2]}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.json::<Value>().await.unwrap(),
        json!({"json": {"a": [1, 2]}})
    );

    // A raised bottle.HTTPError is an answer, not a failure.
    let resp = client()
        .get(server.url("/http-error"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 418);
    assert_eq!(resp.text().await.unwrap(), "a teapot");
    assert_eq!(
        sample(&metrics(&server).await, "function_failures_total"),
        0.0
    );
}

/// The highest number of `/peak` calls that ran at once, of `n` sent together.
async fn peak_of(server: &Server, n: usize) -> u64 {
    let calls: Vec<_> = (0..n)
        .map(|_| tokio::spawn(client().get(server.url("/peak")).send()))
        .collect();
    let mut peak = 0;
    for call in calls {
        let got: Value = call.await.unwrap().unwrap().json().await.unwrap();
        peak = peak.max(got["max"].as_u64().unwrap());
    }
    peak
}

#[tokio::test]
async fn python_serves_as_many_requests_at_once_as_cherrypy_numthreads_allows() {
    let one = Server::start(Runtime::Python, &[("CHERRYPY_NUMTHREADS", "1")]);
    assert!(one.stdout().contains("1 threads"), "{}", one.stdout());
    assert_eq!(
        peak_of(&one, 3).await,
        1,
        "one thread serves one call at a time"
    );
    let four = Server::start(Runtime::Python, &[("CHERRYPY_NUMTHREADS", "4")]);
    assert!(
        peak_of(&four, 3).await >= 2,
        "four threads serve calls side by side"
    );
}

#[tokio::test]
async fn node_functions_can_answer_through_the_send_response_argument() {
    let server = Server::start(Runtime::Node, &[]);
    let resp = client().post(server.url("/send")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    assert_eq!(header(&resp, "x-sent"), "1");
    assert_eq!(resp.text().await.unwrap(), "sent");
}

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// The outgoing calls the tracing fixture makes, by runtime (its two HTTP clients).
fn outgoing_paths(rt: Runtime) -> &'static [&'static str] {
    match rt {
        Runtime::Node => &["/http", "/fetch", "/axios"],
        Runtime::Python => &["/urllib", "/requests"],
    }
}

async fn incoming_traces_continue_into_outgoing_calls_and_the_functions_spans(rt: Runtime) {
    let server = Server::start(rt, &[]);
    let styles: [&[(&str, String)]; 3] = [
        &[("traceparent", format!("00-{TRACE_ID}-{CALLER_SPAN}-01"))],
        &[("b3", format!("{TRACE_ID}-{CALLER_SPAN}-1"))],
        &[
            ("X-B3-TraceId", TRACE_ID.to_string()),
            ("X-B3-SpanId", CALLER_SPAN.to_string()),
            ("X-B3-Sampled", "1".to_string()),
        ],
    ];
    for headers in styles {
        let echo = Publisher::start();
        let mut call = client().get(server.url(&format!("/trace-out?url={}&spans=1", echo.base())));
        for (name, value) in headers {
            call = call.header(*name, value);
        }
        let resp = call.send().await.unwrap();
        assert_eq!(
            resp.status(),
            StatusCode::OK,
            "{headers:?}\n{}",
            server.logs()
        );
        let answer: Value = resp.json().await.unwrap();
        let mut own_span = None;
        for path in outgoing_paths(rt).iter().copied() {
            let h = echo.request(path).headers;
            let traceparent = &h["traceparent"];
            let parts: Vec<&str> = traceparent.split('-').collect();
            assert_eq!(
                parts[1], TRACE_ID,
                "{path} continues the trace ({headers:?}): {h:?}"
            );
            assert_ne!(
                parts[2], CALLER_SPAN,
                "the request has a span of its own: {h:?}"
            );
            assert_eq!(parts[3], "01");
            assert_eq!(h["x-b3-traceid"], TRACE_ID, "{h:?}");
            assert_eq!(h["x-b3-spanid"], parts[2], "{h:?}");
            assert_eq!(h["x-b3-parentspanid"], CALLER_SPAN, "{h:?}");
            assert_eq!(h["x-b3-sampled"], "1", "{h:?}");
            assert_eq!(*own_span.get_or_insert(parts[2].to_string()), parts[2]);
        }
        let own_span = own_span.unwrap();
        assert_eq!(answer["child"]["traceId"], TRACE_ID, "{answer}");
        assert_eq!(
            answer["parent"],
            own_span.as_str(),
            "event.tracer's span is the request's child"
        );
        let inner = echo.request("/inner").headers;
        assert_eq!(
            inner["traceparent"],
            format!("00-{TRACE_ID}-{}-01", answer["inner"].as_str().unwrap()),
            "a call inside an active span carries that span"
        );
    }
}

async fn without_trace_headers_or_a_collector_nothing_is_traced(rt: Runtime) {
    let server = Server::start(rt, &[]);
    let echo = Publisher::start();
    let resp = client()
        .get(server.url(&format!("/trace-out?url={}", echo.base())))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{}", server.logs());
    for path in outgoing_paths(rt).iter().copied() {
        let h = echo.request(path).headers;
        assert!(
            !h.keys()
                .any(|k| k == "traceparent" || k.starts_with("x-b3-")),
            "{path}: {h:?}"
        );
    }
    let loaded = call_json(&server, Method::GET, "/otel-loaded", None).await;
    assert_eq!(loaded, json!(false), "the OpenTelemetry SDK stays unloaded");
}

async fn spans_are_exported_to_the_trace_collector_over_otlp_http(rt: Runtime) {
    let collector = Publisher::start();
    let server = Server::start(rt, &[("TRACE_COLLECTOR_ENDPOINT", &collector.url)]);
    let echo = Publisher::start();
    let resp = client()
        .get(server.url(&format!("/trace-out?url={}&spans=1", echo.base())))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{}", server.logs());
    // A trace of its own: no caller's.
    let traceparent = echo.request(outgoing_paths(rt)[0]).headers["traceparent"].clone();
    let parts: Vec<&str> = traceparent.split('-').collect();
    let (trace_id, server_span) = (parts[1], parts[2]);
    // Node exports OTLP/JSON, Python OTLP/protobuf: the request's SERVER span, the Function's
    // two spans as its children.
    let deadline = Instant::now() + Duration::from_secs(10);
    let spans = loop {
        let spans = common::echo::exported_spans(&collector);
        let names = ["GET /trace-out", "child", "active"];
        if names.iter().all(|n| spans.iter().any(|s| s.name == *n)) {
            break spans;
        }
        assert!(
            Instant::now() < deadline,
            "the collector got {spans:?}: {:?}\n{}",
            collector.requests(),
            server.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let by_name = |name: &str| {
        spans
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no span {name}: {spans:?}"))
    };
    let request = by_name("GET /trace-out");
    assert_eq!(
        (request.trace_id.as_str(), request.span_id.as_str()),
        (trace_id, server_span)
    );
    assert_eq!(request.parent_id, "", "a trace of its own");
    for name in ["child", "active"] {
        let span = by_name(name);
        assert_eq!(span.trace_id, trace_id, "{span:?}");
        assert_eq!(span.parent_id, server_span, "{span:?}");
    }
    for export in collector.requests() {
        assert!(
            !export.headers.contains_key("traceparent"),
            "the SDK's own exports are not traced: {:?}",
            export.headers
        );
    }
    let content_type = &collector.requests()[0].headers["content-type"];
    assert!(
        content_type.starts_with("application/json")
            || content_type.starts_with("application/x-protobuf"),
        "{content_type}"
    );
}

async fn emitted_cloud_events_are_valid_with_a_time_and_return_the_publishers_answer(rt: Runtime) {
    let publisher = Publisher::start();
    let server = Server::start(rt, &[("PUBLISHER_PROXY_ADDRESS", &publisher.url)]);
    let answer = call_json(&server, Method::POST, "/emit", None).await;
    assert_eq!(answer, json!({"status": 200, "data": {"accepted": 1}}));
    let (content_type, event) = publisher.seen().remove(0);
    assert!(
        content_type.starts_with("application/cloudevents+json"),
        "{content_type}"
    );
    assert_eq!(event["specversion"], "1.0");
    assert_eq!(event["type"], "order.created");
    assert_eq!(event["source"], "/shop");
    assert_eq!(event["eventtypeversion"], "v1");
    assert_eq!(event["datacontenttype"], "application/json");
    assert_eq!(event["data"], json!({"n": 1}));
    assert_eq!(event["id"].as_str().unwrap().len(), 36, "{event}");
    // RFC 3339 in UTC: Node writes `…T…Z` (JavaScript's ISO form), Python `…T…+00:00`.
    let time = event["time"].as_str().unwrap();
    assert!(
        time.as_bytes()[10] == b'T' && (time.ends_with('Z') || time.ends_with("+00:00")),
        "RFC 3339 time: {time}"
    );

    // An invalid event is refused before anything is sent, with the attribute named.
    let answer = call_json(&server, Method::POST, "/emit-invalid", None).await;
    let error = answer["error"].as_str().unwrap();
    assert!(error.contains("\"type\""), "{error}");
    assert_eq!(publisher.seen().len(), 1);
}

async fn a_reply_event_is_built_and_published_the_deprecated_way(rt: Runtime) {
    let publisher = Publisher::start();
    let server = Server::start(rt, &[("PUBLISHER_PROXY_ADDRESS", &publisher.url)]);
    let resp = client()
        .post(server.url("/reply"))
        .header("ce-type", "order.created")
        .header("ce-source", "/shop")
        .header("ce-specversion", "1.0")
        .header("ce-eventtypeversion", "v1")
        .json(&json!({"order": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let answer: Value = resp.json().await.unwrap();
    let reply = json!({"type": "order.confirmed", "source": "/shop", "eventtypeversion": "v1",
        "specversion": "1.0", "id": "reply-1", "data": {"ok": true},
        "datacontenttype": "application/json"});
    assert_eq!(answer, json!({"reply": reply, "data": {"accepted": 1}}));
    assert_eq!(publisher.seen()[0].1, reply);
}

async fn a_request_is_a_cloud_event_only_when_it_is_one_and_gets_an_id_and_a_time(rt: Runtime) {
    let server = Server::start(rt, &[]);
    // A plain request, and one with a lone ce-type header: no CloudEvent fields at all.
    let plain = call_json(&server, Method::POST, "/ce-keys", Some(json!({"a": 1}))).await;
    assert_eq!(plain, json!([]));
    let resp = client()
        .post(server.url("/ce-keys"))
        .header("ce-type", "only.a.type")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.json::<Value>().await.unwrap(), json!([]));
    // ce-type and ce-source: an event; id and time filled in.
    let resp = client()
        .post(server.url("/echo"))
        .header("ce-type", "t")
        .header("ce-source", "s")
        .header("ce-specversion", "1.0")
        .json(&json!({"a": 1}))
        .send()
        .await
        .unwrap();
    let echo: Value = resp.json().await.unwrap();
    assert_eq!(echo["ce"]["id"].as_str().map(str::len), Some(36), "{echo}");
    let time = echo["ce"]["time"].as_str().unwrap_or_default().to_string();
    assert!(time.ends_with('Z') || time.ends_with("+00:00"), "{echo}");
    assert_eq!(echo["data"], json!({"a": 1}));
}

#[tokio::test]
async fn node_functions_get_expresss_request_and_response_helpers() {
    let server = Server::start(Runtime::Node, &[]);
    let client = Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let resp = client
        .post(server.url("/express"))
        .header("accept", "text/html;q=0.5, application/json")
        .json(&json!({"a": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let cookies: Vec<&str> = resp
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(cookies.len(), 2, "{cookies:?}");
    assert!(
        cookies[0].starts_with("session=a%20b; Max-Age=60; Path=/; Expires=")
            && cookies[0].ends_with(" GMT; HttpOnly; SameSite=Lax"),
        "{}",
        cookies[0]
    );
    assert_eq!(cookies[1], "prefs=j%3A%7B%22dark%22%3Atrue%7D; Path=/");
    let multi: Vec<&str> = resp
        .headers()
        .get_all("x-multi")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(multi, ["1", "2"]);
    assert_eq!(header(&resp, "location"), "/there");
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(
        answer,
        json!({"is": "json", "isWild": "application/json", "isHtml": false, "accepts": "json",
            "acceptsHtml": "html", "acceptsPng": false, "protocol": "http",
            "hostname": "127.0.0.1", "ip": "127.0.0.1"})
    );

    let resp = client.get(server.url("/redirect")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::MOVED_PERMANENTLY);
    assert_eq!(header(&resp, "location"), "/elsewhere");

    let resp = client.get(server.url("/attachment")).send().await.unwrap();
    assert_eq!(
        header(&resp, "content-disposition"),
        r#"attachment; filename="q1.csv""#
    );
    assert_eq!(header(&resp, "content-type"), "text/csv");
    assert_eq!(resp.text().await.unwrap(), "a,b\n");

    // sendFile streams the file even though the Function returns at once.
    let resp = client.get(server.url("/file")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(header(&resp, "content-type"), "text/javascript");
    let handler =
        fs::read_to_string(repo().join("tests/fixtures/servers/node/handler.js")).unwrap();
    assert_eq!(resp.text().await.unwrap(), handler);
    let resp = client.get(server.url("/no-file")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
}
