//! The runtime contract, on each kiln-built base: the contract fixture Function built on it
//! answers over HTTP inside `kiln run` (rootless sandbox, read-only root, user 1000) as Kyma's
//! runtimes do, CloudEvents, metrics, tracing and timeouts included.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::base_build;
use common::echo::{Publisher, exported_spans};
use common::function_run::serve;
use common::http;
use common::kiln::{Kiln, copy_tree, fixtures};
use common::schema::validate_layout;

/// Builds the contract fixture Function on `runtime`'s kiln-built base and checks it over
/// HTTP inside `kiln run`.
fn runtime_serves_the_contract(runtime: &str, server_fixture: &str) {
    let k = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let bases = work.path().join("bases");
    base_build(&k, runtime, &bases);
    validate_layout(&bases);
    let dir = work.path().join("fn");
    copy_tree(&fixtures().join("servers").join(server_fixture), &dir);
    let out = work.path().join("out");
    let base = format!("oci:{}:{runtime}", bases.display());
    let built = k.run_cmd(k.command_with_shared_downloads().args([
        "build",
        dir.to_str().unwrap(),
        "--runtime",
        runtime,
        "--base",
        &base,
        "--output",
        &format!("oci:{}", out.display()),
    ]));
    let reference = built.reference();
    // Loopback stand-ins for what a Function talks to: an echo service that is also the
    // eventing publisher proxy, and an OTLP/HTTP trace receiver.
    let echo = Publisher::start();
    let collector = Publisher::start();
    let (port, mut running) = serve(
        &k,
        &reference,
        &[
            // /sleep takes 5 s: a 408. Every other call must fit, the trace's first loads of
            // axios, fetch and the OpenTelemetry SDK included, on a machine busy with other
            // tests (1 s did not, once: a 408 from /trace-out).
            "--env",
            "FUNC_TIMEOUT=3",
            "--env",
            "REQ_MB_LIMIT=0.01",
            "--env",
            &format!("TRACE_COLLECTOR_ENDPOINT={}", collector.url),
            "--env",
            &format!("PUBLISHER_PROXY_ADDRESS={}", echo.url),
        ],
    );

    let (status, body) = http::request(
        port,
        "POST",
        "/echo",
        &[("Content-Type", "application/json")],
        br#"{"a":1}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(r#""a":1"#) || body.contains(r#""a": 1"#),
        "{body}"
    );
    assert!(
        body.contains("\"function-name\""),
        "context is passed: {body}"
    );
    let ce = [
        ("ce-type", "com.example.t"),
        ("ce-source", "/src"),
        ("ce-id", "42"),
        ("ce-specversion", "1.0"),
        ("Content-Type", "application/json"),
    ];
    let (status, body) = http::request(port, "POST", "/echo", &ce, br#"{"x":2}"#);
    assert_eq!(status, 200);
    assert!(
        body.contains("com.example.t") && body.contains("\"42\""),
        "binary CloudEvent: {body}"
    );
    let structured =
        br#"{"specversion":"1.0","type":"com.example.s","source":"/s","id":"7","data":{"y":3}}"#;
    let (_, body) = http::request(
        port,
        "POST",
        "/echo",
        &[("Content-Type", "application/cloudevents+json")],
        structured,
    );
    assert!(
        body.contains("com.example.s"),
        "structured CloudEvent: {body}"
    );
    assert_eq!(http::request(port, "GET", "/healthz", &[], b"").0, 200);
    assert_eq!(http::request(port, "GET", "/throw", &[], b"").0, 500);
    assert_eq!(http::request(port, "GET", "/sleep", &[], b"").0, 408);
    assert_eq!(
        http::request(
            port,
            "POST",
            "/echo",
            &[("Content-Type", "text/plain")],
            &vec![b'x'; 64 * 1024]
        )
        .0,
        413
    );
    let (_, metrics) = http::request(port, "GET", "/metrics", &[], b"");
    assert!(
        metrics.contains("function_calls_total") && metrics.contains("function_failures_total"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("function_calls_total 0\n"),
        "calls counted: {metrics}"
    );

    // The event API: a valid CloudEvent reaches the publisher.
    let (status, body) = http::request(port, "POST", "/emit", &[], b"");
    assert_eq!(status, 200, "{body}");
    let (content_type, event) = echo.seen().remove(0);
    assert!(content_type.starts_with("application/cloudevents+json"));
    assert_eq!(event["type"], "order.created", "{event}");
    assert!(
        event["time"].as_str().is_some_and(|t| t.contains('T')),
        "{event}"
    );

    // Tracing: the caller's trace goes on into the Function's outgoing calls (the runtime's
    // HTTP clients in the image), and the request's span and the Function's own reach the
    // receiver as its children.
    let (trace_id, caller) = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331");
    let (status, body) = http::request(
        port,
        "GET",
        &format!("/trace-out?url={}&spans=1", echo.base()),
        &[("traceparent", &format!("00-{trace_id}-{caller}-01"))],
        b"",
    );
    assert_eq!(status, 200, "{body}");
    let clients: &[&str] = if server_fixture == "node" {
        &["/http", "/fetch", "/axios"]
    } else {
        &["/urllib", "/requests"]
    };
    let mut own = String::new();
    for path in clients.iter().copied() {
        let h = echo.request(path).headers;
        let parts: Vec<&str> = h["traceparent"].split('-').collect();
        assert_eq!(
            (parts[1], h["x-b3-traceid"].as_str()),
            (trace_id, trace_id),
            "{path}: {h:?}"
        );
        assert_eq!(h["x-b3-spanid"], parts[2], "{path}: {h:?}");
        assert_eq!(h["x-b3-parentspanid"], caller, "{path}: {h:?}");
        own = parts[2].to_string();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let spans = loop {
        let spans = exported_spans(&collector);
        let names = ["child", "active"];
        if spans.iter().any(|s| s.span_id == own)
            && names.iter().all(|n| spans.iter().any(|s| s.name == *n))
        {
            break spans;
        }
        assert!(Instant::now() < deadline, "exported: {spans:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let request = spans.iter().find(|s| s.span_id == own).unwrap();
    assert_eq!(request.parent_id, caller, "{spans:?}");
    for name in ["child", "active"] {
        let span = spans.iter().find(|s| s.name == name).unwrap();
        assert_eq!(
            (span.trace_id.as_str(), span.parent_id.as_str()),
            (trace_id, own.as_str())
        );
    }

    if server_fixture == "python" {
        // The request is bottle's.
        let (status, body) = http::request(
            port,
            "POST",
            "/bottle?n=5",
            &[("Content-Type", "application/x-www-form-urlencoded")],
            b"f=v",
        );
        assert_eq!(status, 202, "{body}");
        assert!(
            body.contains(r#""n": 5"#) || body.contains(r#""n":5"#),
            "{body}"
        );
        assert!(body.contains("LocalRequest"), "{body}");
        // Modules load from the image's compiled bytecode, not from source at every start.
        let (_, body) = http::request(port, "GET", "/pyc", &[], b"");
        assert!(
            body.contains("/usr/lib/kiln/pycache/") && body.contains("true"),
            "{body}"
        );
    }

    // The sandbox: user 1000 (from the image), a read-only root.
    let mut child = std::mem::replace(&mut running.0, Command::new("true").spawn().unwrap());
    let pid = child.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "kiln run did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        status.success(),
        "SIGTERM drains and exits cleanly: {status}"
    );
}

#[test]
fn the_nodejs22_base_runs_a_function_that_honours_the_contract() {
    runtime_serves_the_contract("nodejs22", "node");
}

/// `runtime`'s base (and builder) built fresh under `work`, and the fixture Function
/// `tests/fixtures/servers/<fixture>` (plus `files`) built on it into a layout; its reference.
/// With `in_builder`, the dependencies install in the builder image (its package manager,
/// not kiln's own lock-file install).
fn build_on_fresh_base(
    k: &Kiln,
    runtime: &str,
    fixture: &str,
    files: &[(&str, &str)],
    work: &Path,
    in_builder: bool,
) -> String {
    let bases = work.join("bases");
    base_build(k, runtime, &bases);
    validate_layout(&bases);
    let dir = work.join("fn");
    copy_tree(&fixtures().join("servers").join(fixture), &dir);
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    let base = format!("oci:{}:{runtime}", bases.display());
    let builder = format!("oci:{}:{runtime}-builder", bases.display());
    let output = format!("oci:{}", work.join("out").display());
    let mut args = vec!["build", dir.to_str().unwrap(), "--runtime", runtime];
    args.extend(["--base", &base, "--output", &output]);
    if in_builder {
        args.extend(["--builder-image", &builder, "--deps-sandbox", "bwrap"]);
        args.extend(["--lockfile-install", "off"]);
    }
    k.run_cmd(k.command_with_shared_downloads().args(&args))
        .reference()
}

/// Kyma's new-API runtime: its "Hello World from Node.js 26" sample (`res.send`, which the
/// legacy API has not), query parameters and status codes, an async handler and the `sdk`
/// module, built on the kiln-built nodejs26 base and run under `kiln run`.
#[test]
fn the_nodejs26_base_runs_kymas_new_api_samples() {
    let k = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let built = build_on_fresh_base(&k, "nodejs26", "express", &[], work.path(), false);
    let (port, running) = serve(&k, &built, &[]);
    let get = |path: &str| http::request(port, "GET", path, &[], b"");
    assert_eq!(get("/hello"), (200, "Hello World!".to_string()));
    assert_eq!(get("/query"), (400, "Missing id parameter".to_string()));
    assert_eq!(get("/query?id=7"), (200, r#"{"id":"7"}"#.to_string()));
    assert_eq!(get("/async"), (200, r#"{"later":true}"#.to_string()));
    let (status, body) = get("/sdk");
    assert_eq!(status, 200, "{body}");
    let sdk: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (&sdk["runtime"], &sdk["timeout"], &sdk["tracer"]),
        (
            &serde_json::json!("nodejs26"),
            &serde_json::json!(180),
            &serde_json::json!("function")
        ),
        "{body}"
    );
    let (status, body) = http::request(
        port,
        "POST",
        "/echo",
        &[("Content-Type", "application/json")],
        br#"{"a":1}"#,
    );
    assert_eq!(
        (status, body.contains(r#""body":{"a":1}"#)),
        (200, true),
        "{body}"
    );
    drop(running);
}

/// Kyma's other new-API runtime: CPython 3.14 from Debian testing, its "Hello World" and
/// "Accessing the request" samples (`main()` reading Flask's `request`), a Flask Response with
/// its own status, the `sdk` module and a dependency of the Function's own, built on the
/// kiln-built python314 base and builder and run under `kiln run`.
#[test]
fn the_python314_base_runs_kymas_new_api_samples() {
    let k = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let files = [("requirements.txt", "idna==3.10\n")];
    // pip 26 on CPython 3.14 in the builder image, not kiln's own wheel install.
    let built = build_on_fresh_base(&k, "python314", "flask", &files, work.path(), true);
    let (port, running) = serve(&k, &built, &[]);
    let get = |path: &str| http::request(port, "GET", path, &[], b"");
    assert_eq!(get("/hello"), (200, "Hello World!".to_string()));
    assert_eq!(get("/name?name=kiln"), (200, "Hello kiln!".to_string()));
    let (status, body) = get("/accept");
    assert_eq!(
        (status, body.as_str()),
        (400, r#"{"error": "Invalid Content-Type."}"#)
    );
    let (status, body) = get("/sdk");
    assert_eq!(status, 200, "{body}");
    let sdk: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (
            &sdk["runtime"],
            &sdk["timeout"],
            &sdk["bodySizeLimit"],
            &sdk["tracer"]
        ),
        (
            &serde_json::json!("python314"),
            &serde_json::json!(180),
            &serde_json::json!(1),
            &serde_json::json!(true)
        ),
        "{body}"
    );
    let (status, body) = get("/dependency");
    let dep: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(dep["idna"], "3.10", "{body}");
    assert!(
        dep["from"]
            .as_str()
            .unwrap()
            .starts_with("/kubeless/site-packages/"),
        "{body}"
    );
    let (status, body) = http::request(
        port,
        "POST",
        "/echo",
        &[("Content-Type", "application/json")],
        br#"{"a":1}"#,
    );
    assert_eq!(
        (status, body.contains(r#""json":{"a":1}"#)),
        (200, true),
        "{body}"
    );
    drop(running);
}

#[test]
fn the_nodejs24_base_runs_a_function_that_honours_the_contract() {
    runtime_serves_the_contract("nodejs24", "node");
}

#[test]
fn the_python313_base_runs_a_function_that_honours_the_contract() {
    runtime_serves_the_contract("python313", "python");
}
