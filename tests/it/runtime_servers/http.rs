//! The request and answer side of the contract, on both runtimes: bodies of every content
//! type, the status and headers a Function sets, the built-in endpoints and CORS preflight,
//! the metrics page, a throwing Function, the body-size limit and HTTP/1.0 keep-alive.

use crate::common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::function_server::{
    Runtime, Server, assert_json, call_json, client, header, metrics, sample,
};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

pub(super) async fn json_body_round_trips_with_context(rt: Runtime) {
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

pub(super) async fn text_form_raw_and_empty_bodies_are_parsed(rt: Runtime) {
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

pub(super) async fn status_and_headers_set_by_the_function_reach_the_client(rt: Runtime) {
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

pub(super) async fn built_in_endpoints_and_preflight_skip_the_function(rt: Runtime) {
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

pub(super) async fn metrics_count_calls_and_failures(rt: Runtime) {
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

pub(super) async fn a_throw_answers_500_and_logs_the_stack(rt: Runtime) {
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

pub(super) async fn a_body_over_the_limit_gets_413(rt: Runtime) {
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

/// A client that writes its whole upload before it reads the answer (Python's http.client,
/// requests) reads the 413, rather than a reset: the server reads the rest of an 11 MiB
/// body, sized or chunked, before it closes.
pub(super) async fn a_client_that_writes_the_whole_body_first_reads_the_413(rt: Runtime) {
    use std::io::{Read, Write};
    let server = Server::start(rt, &[("REQ_MB_LIMIT", "1")]);
    let port = server.port;
    tokio::task::spawn_blocking(move || {
        let body = vec![b'x'; 11 << 20];
        for chunked in [false, true] {
            let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let framing = if chunked {
                "Transfer-Encoding: chunked".to_string()
            } else {
                format!("Content-Length: {}", body.len())
            };
            write!(
                stream,
                "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n{framing}\r\n\r\n"
            )
            .unwrap();
            let written = if chunked {
                body.chunks(64 << 10)
                    .try_for_each(|c| {
                        write!(stream, "{:x}\r\n", c.len())?;
                        stream.write_all(c)?;
                        stream.write_all(b"\r\n")
                    })
                    .and_then(|()| stream.write_all(b"0\r\n\r\n"))
            } else {
                stream.write_all(&body)
            };
            assert!(
                written.is_ok(),
                "chunked {chunked}: the server stopped reading the upload: {written:?}"
            );
            let mut answer = Vec::new();
            let _ = stream.read_to_end(&mut answer);
            let answer = String::from_utf8_lossy(&answer[..answer.len().min(200)]);
            assert!(
                answer.starts_with("HTTP/1.1 413 "),
                "chunked {chunked}: {answer:?}"
            );
        }
        // A client that waits for `100 Continue` gets the 413 at once and sends nothing
        // (Node.js); cheroot answers `100 Continue` before the application sees the request,
        // and the 413 follows the body.
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        write!(
            stream,
            "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
            body.len()
        )
        .unwrap();
        let mut answer = [0; 64];
        let mut n = stream.read(&mut answer).unwrap();
        if answer.starts_with(b"HTTP/1.1 100 Continue\r\n\r\n")
            && matches!(rt, Runtime::Python | Runtime::Flask)
        {
            stream.write_all(&body).unwrap();
            n = stream.read(&mut answer).unwrap();
        }
        let answer = String::from_utf8_lossy(&answer[..n]);
        assert!(answer.starts_with("HTTP/1.1 413 "), "{answer:?}");
    })
    .await
    .unwrap();
}

/// (`Keep-Alive` as ab and HTTP/1.0 clients spell it: cheroot compares the value case-sensitively.)
pub(super) async fn http_1_0_keep_alive_clients_reuse_the_connection(rt: Runtime) {
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

/// An upload over the limit that never ends (chunked, so nothing declares it too big) is
/// read for a bounded time only: the 413 comes, and the connection is cut, long before the
/// client stops sending.
pub(super) async fn an_endless_upload_over_the_limit_is_cut_off(rt: Runtime) {
    use std::io::{Read, Write};
    let server = Server::start(rt, &[("REQ_MB_LIMIT", "1"), ("FUNC_BODY_MB_LIMIT", "1")]);
    let port = server.port;
    tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_write_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        write!(
            stream,
            "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n\
             Transfer-Encoding: chunked\r\n\r\n"
        )
        .unwrap();
        let chunk = vec![b'z'; 64 << 10];
        let started = Instant::now();
        let mut sent = 0u64;
        // 1 GiB at most: far past the 64 MiB / 2 s the servers drain.
        while sent < 1 << 30 {
            let wrote = write!(stream, "{:x}\r\n", chunk.len())
                .and_then(|()| stream.write_all(&chunk))
                .and_then(|()| stream.write_all(b"\r\n"));
            if wrote.is_err() {
                break;
            }
            sent += chunk.len() as u64;
        }
        assert!(
            sent < 1 << 30 && started.elapsed() < Duration::from_secs(15),
            "{rt:?} read {sent} bytes in {:?} without cutting the upload off",
            started.elapsed()
        );
        let mut answer = Vec::new();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let _ = stream.read_to_end(&mut answer);
        let answer = String::from_utf8_lossy(&answer[..answer.len().min(100)]).into_owned();
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 413 "),
            "{rt:?}: {answer:?}"
        );
    })
    .await
    .unwrap();
}

pub(super) async fn unsendable_results_answer_500() {
    let server = Server::start(Runtime::Node, &[]);
    let http = client_with_timeout();
    for path in ["/circular", "/bad-status"] {
        let resp = http.get(server.url(path)).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR, "{path}");
    }
    // A Latin-1 text body is decoded as Latin-1.
    let resp = http
        .post(server.url("/echo"))
        .header("content-type", "text/plain; charset=ISO-8859-1")
        .body(b"caf\xe9".to_vec())
        .send()
        .await
        .unwrap();
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["data"], "café", "{answer}");
}

pub(super) async fn python_bottle_limits_cors_and_a_bad_chunk() {
    use std::io::{Read, Write};
    let server = Server::start(Runtime::Python, &[]);
    let http = client_with_timeout();
    let items: Vec<u32> = (0..50_000).collect();
    let resp = http
        .post(server.url("/big-json"))
        .json(&json!({ "items": items }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{}", server.logs());
    assert_eq!(
        resp.json::<Value>().await.unwrap(),
        json!({"items": 50_000})
    );
    let resp = http.get(server.url("/own-cors")).send().await.unwrap();
    assert_eq!(
        header(&resp, "access-control-allow-origin"),
        "https://app.example"
    );
    // What follows a malformed chunk is no request of its own.
    let mut socket = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    socket
        .write_all(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n\
              GET /text HTTP/1.1\r\nHost: x\r\n\r\n",
        )
        .unwrap();
    let mut answer = Vec::new();
    let _ = socket.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert_eq!(answer.matches("HTTP/1.1 ").count(), 1, "{answer}");
}

/// A client that gives up after 10 s: an answer that never comes fails the test, not hangs it.
fn client_with_timeout() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}
