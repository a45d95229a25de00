//! Tracing, on both runtimes: W3C and B3 headers continue into the Function's outgoing calls
//! and its own spans, a request without them starts a trace of its own, and spans are
//! exported to TRACE_COLLECTOR_ENDPOINT over OTLP/HTTP.

use crate::common;

use std::time::{Duration, Instant};

use common::echo::Publisher;
use common::function_server::{Runtime, Server, call_json, client};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// The outgoing calls the tracing fixture makes, by runtime (its two HTTP clients).
fn outgoing_paths(rt: Runtime) -> &'static [&'static str] {
    match rt {
        Runtime::Node | Runtime::Express => &["/http", "/fetch", "/fetch-request", "/axios"],
        Runtime::Python | Runtime::Flask => &["/urllib", "/requests"],
    }
}

pub(super) async fn incoming_traces_continue_into_outgoing_calls_and_the_functions_spans(
    rt: Runtime,
) {
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
        own_headers_stay(rt, &echo);
        let inner = echo.request("/inner").headers;
        assert_eq!(
            inner["traceparent"],
            format!("00-{TRACE_ID}-{}-01", answer["inner"].as_str().unwrap()),
            "a call inside an active span carries that span"
        );
    }
}

/// A request without a trace starts one, as on Kyma: its sampling from `X-B3-Sampled` when
/// the caller sends only that (Kyma's tracing acceptance test does), else sampled; every
/// outgoing call carries it, and the OpenTelemetry SDK stays unloaded.
pub(super) async fn a_request_without_a_trace_starts_one_that_outgoing_calls_carry(rt: Runtime) {
    let server = Server::start(rt, &[]);
    let mut seen = Vec::new();
    for (sent, sampled) in [(None, "1"), (Some("1"), "1"), (Some("0"), "0")] {
        let echo = Publisher::start();
        let mut call = client().get(server.url(&format!("/trace-out?url={}", echo.base())));
        if let Some(value) = sent {
            call = call.header("X-B3-Sampled", value);
        }
        let resp = call.send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{}", server.logs());
        let mut ids = None;
        for path in outgoing_paths(rt).iter().copied() {
            let h = echo.request(path).headers;
            let traceparent = h
                .get("traceparent")
                .unwrap_or_else(|| panic!("{path}: {h:?}"));
            let parts: Vec<&str> = traceparent.split('-').collect();
            assert_eq!(parts.len(), 4, "{path}: {h:?}");
            let (trace, span) = (parts[1].to_string(), parts[2].to_string());
            assert!(
                trace.len() == 32 && trace.chars().any(|c| c != '0') && span.len() == 16,
                "{path}: {h:?}"
            );
            assert_eq!(parts[3], if sampled == "1" { "01" } else { "00" }, "{h:?}");
            assert_eq!(h["x-b3-traceid"], trace, "{h:?}");
            assert_eq!(h["x-b3-spanid"], span, "{h:?}");
            assert_eq!(h["x-b3-sampled"], sampled, "{h:?}");
            assert!(!h.contains_key("x-b3-parentspanid"), "a root: {h:?}");
            // One trace and one span of the request, whichever client sent the call.
            assert_eq!(
                *ids.get_or_insert((trace.clone(), span.clone())),
                (trace, span)
            );
        }
        own_headers_stay(rt, &echo);
        seen.push(ids.unwrap().0);
    }
    seen.dedup();
    assert_eq!(seen.len(), 3, "each request a trace of its own: {seen:?}");
    let loaded = call_json(&server, Method::GET, "/otel-loaded", None).await;
    assert_eq!(loaded, json!(false), "the OpenTelemetry SDK stays unloaded");
}

pub(super) async fn spans_are_exported_to_the_trace_collector_over_otlp_http(rt: Runtime) {
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

/// A Function that instruments requests with OpenTelemetry itself runs in the request's
/// context: the instrumented call continues the caller's trace from the request's span, with
/// the W3C and B3 headers the global propagator (Kyma's) injects.
/// A fetch `Request` with headers of its own (the JavaScript runtimes) sends them beside the
/// trace's.
fn own_headers_stay(rt: Runtime, echo: &Publisher) {
    if matches!(rt, Runtime::Node | Runtime::Express) {
        let h = echo.request("/fetch-request").headers;
        assert_eq!(h.get("x-mine").map(String::as_str), Some("kept"), "{h:?}");
    }
}

pub(super) async fn a_library_the_function_instruments_continues_the_requests_trace(rt: Runtime) {
    let server = Server::start(rt, &[]);
    let echo = Publisher::start();
    let resp = client()
        .get(server.url(&format!("/trace-otel?url={}", echo.base())))
        .header("traceparent", format!("00-{TRACE_ID}-{CALLER_SPAN}-01"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{}", server.logs());
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["traceId"], TRACE_ID, "{answer}");
    let request_span = answer["spanId"].as_str().unwrap();
    assert_ne!(request_span, CALLER_SPAN, "{answer}");
    let propagators: Vec<&str> = answer["propagators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for field in ["traceparent", "x-b3-traceid", "x-b3-spanid", "x-b3-sampled"] {
        assert!(propagators.contains(&field), "{propagators:?}");
    }
    let h = echo.request("/otel-requests").headers;
    assert_eq!(
        h["traceparent"],
        format!("00-{TRACE_ID}-{request_span}-01"),
        "{h:?}"
    );
    assert_eq!(h["x-b3-traceid"], TRACE_ID, "{h:?}");
    assert_eq!(h["x-b3-spanid"], request_span, "{h:?}");
}

/// Each request's trace stays with its own code: calls made while other requests run, on the
/// same keep-alive connection or another, and calls a timer makes after the answer has gone.
#[tokio::test]
async fn node_keeps_each_requests_trace_across_interleaved_requests_and_leftover_timers() {
    let server = Server::start(Runtime::Node, &[]);
    let echo = Publisher::start();
    let trace = |n: u8| format!("{:032x}", 0x1000 + u32::from(n));
    let call = |http: reqwest::Client, tag: &'static str, n: u8, wait: u32, after: u32| {
        let url = server.url(&format!(
            "/trace-later?url={}&tag={tag}&wait={wait}&after={after}",
            echo.base()
        ));
        let parent = format!("00-{}-{CALLER_SPAN}-01", trace(n));
        async move {
            let resp = http
                .get(url)
                .header("traceparent", parent)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
        }
    };
    // `a` answers at once and leaves a timer that calls out 300 ms later; `b` follows on the same
    // keep-alive connection; `c` waits 200 ms on another connection while `b` runs.
    let (one, other) = (client(), client());
    let c = tokio::spawn(call(other, "c", 3, 200, 0));
    call(one.clone(), "a", 1, 0, 300).await;
    call(one, "b", 2, 100, 0).await;
    c.await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while echo.requests().len() < 6 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (path, n) in [
        ("/during-a", 1),
        ("/after-a", 1),
        ("/during-b", 2),
        ("/after-b", 2),
        ("/during-c", 3),
        ("/after-c", 3),
    ] {
        let h = echo.request(path).headers;
        assert_eq!(h["x-b3-traceid"], trace(n), "{path}: {h:?}");
        assert!(h["traceparent"].contains(&trace(n)), "{path}: {h:?}");
    }
}
