//! The nodejs26 runtime's new handler API (`main(req, res)` with Express's own objects, the
//! `sdk` module), with Kyma's samples from its Function specification, run on
//! `runtimes/_servers/express` as the other servers are.

use crate::common;

use std::time::Duration;

use common::echo::Publisher;
use common::function_server::{Runtime, Server, client, header, metrics, sample};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The JSON answer to `request`.
async fn json(request: reqwest::RequestBuilder) -> Value {
    request.send().await.unwrap().json().await.unwrap()
}

/// A new-API server publishing to `publisher`, with a 1 s FUNC_TIMEOUT, and the body limit
/// set both ways: Kyma's FUNC_BODY_MB_LIMIT (0.001) wins over the legacy REQ_MB_LIMIT (5).
fn sdk_server(runtime: Runtime, publisher: &Publisher) -> Server {
    Server::start(
        runtime,
        &[
            ("PUBLISHER_PROXY_ADDRESS", &publisher.url),
            ("FUNC_TIMEOUT", "1"),
            ("REQ_MB_LIMIT", "5"),
            ("FUNC_BODY_MB_LIMIT", "0.001"),
        ],
    )
}

/// A server started with FUNC_BODY_MB_LIMIT 0.001 answers 413, naming it, to a sized and a
/// chunked body over the limit.
async fn bodies_over_the_limit_get_413(server: &Server) {
    let http = client();
    let resp = http
        .post(server.url("/echo"))
        .header("content-type", "text/plain")
        .body(vec![b'x'; 2_000])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let text = resp.text().await.unwrap();
    assert!(
        text.contains("FUNC_BODY_MB_LIMIT"),
        "the 413 names the limit set: {text}"
    );
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
}

#[tokio::test]
async fn nodejs26_serves_kymas_new_api_samples_with_express_request_and_response() {
    let server = Server::start(Runtime::Express, &[]);
    let http = client();
    let get = |path: &str| http.get(server.url(path)).send();
    let resp = get("/hello").await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{}", server.logs());
    assert_eq!(header(&resp, "access-control-allow-origin"), "*");
    assert!(header(&resp, "content-type").starts_with("text/html"));
    assert_eq!(
        resp.text().await.unwrap(),
        "Hello World!",
        "the return value is ignored"
    );
    // Query parameters and status codes.
    let resp = get("/query").await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(resp.text().await.unwrap(), "Missing id parameter");
    let resp = get("/query?id=7").await.unwrap();
    assert_eq!(resp.json::<Value>().await.unwrap(), json!({"id": "7"}));
    // Bodies as Express's parsers give them.
    let echo = |body: &'static str, ty: &'static str| {
        json(
            http.post(server.url("/echo"))
                .header("content-type", ty)
                .body(body),
        )
    };
    let json_body = echo(r#"{"a":[1,2]}"#, "application/json").await;
    assert_eq!(json_body["body"], json!({"a": [1, 2]}));
    let text = echo("plain words", "text/plain").await;
    assert_eq!(text["body"], "plain words");
    let form = echo("a=1&b=2", "application/x-www-form-urlencoded").await;
    assert_eq!(form["body"], json!({"a": "1", "b": "2"}));
    // An async handler, a throw.
    let resp = get("/async").await.unwrap();
    assert_eq!(resp.json::<Value>().await.unwrap(), json!({"later": true}));
    let resp = get("/throw").await.unwrap();
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(resp.text().await.unwrap(), "Internal server error");
    let stderr = server.stderr_containing("boom from").await;
    assert!(stderr.contains("handler.js"), "{stderr}");
    // A thrown string is the answer's text, as in Kyma's server.
    let resp = get("/throw-string").await.unwrap();
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(resp.text().await.unwrap(), "bad input");
    // A throw once part of the answer is out cuts it: not a short answer that looks whole.
    let resp = get("/throw-after-write").await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.text().await.is_err(), "the answer is cut");
    // A rejection after the answer: the answer stands, and the failure is counted.
    let resp = get("/reject-after-answer").await.unwrap();
    assert_eq!(resp.text().await.unwrap(), "ok");
    server.stderr_containing("after the answer").await;
    // Health and metrics, as the legacy servers answer them.
    let resp = get("/healthz").await.unwrap();
    assert_eq!(resp.text().await.unwrap(), "OK");
    let text = metrics(&server).await;
    assert_eq!(sample(&text, "function_calls_total"), 11.0, "{text}");
    assert_eq!(sample(&text, "function_failures_total"), 4.0, "{text}");
}

#[tokio::test]
async fn nodejs26_gives_functions_the_sdk_and_keeps_the_timeout_and_body_limit() {
    let publisher = Publisher::start();
    let server = sdk_server(Runtime::Express, &publisher);
    let http = client();
    let sdk = json(http.get(server.url("/sdk"))).await;
    assert_eq!(
        sdk,
        json!({"name": "fixture", "namespace": "tests", "runtime": "nodejs26", "timeout": 1,
               "bodySizeLimit": 0.001, "tracer": "function"})
    );
    // A binary-mode CloudEvent in, one emitted to the publisher.
    let ce = json(
        http.post(server.url("/cloudevent"))
            .header("ce-type", "order.created")
            .header("ce-source", "/shop")
            .header("ce-id", "e-1")
            .header("ce-specversion", "1.0")
            .header("content-type", "application/json")
            .body(r#"{"n":1}"#),
    )
    .await;
    assert_eq!(
        ce,
        json!({"type": "order.created", "source": "/shop", "id": "e-1", "data": {"n": 1}})
    );
    let plain = json(http.post(server.url("/cloudevent")).body("x")).await;
    assert_eq!(plain, Value::Null, "not a CloudEvent");
    let emitted = json(http.get(server.url("/emit"))).await;
    assert_eq!(emitted["status"], 200, "{}", server.logs());
    let (_, event) = publisher.seen().pop().unwrap();
    assert_eq!(
        (&event["type"], &event["source"], &event["data"]),
        (&json!("order.created"), &json!("/shop"), &json!({"n": 1}))
    );
    // A structured-mode CloudEvent too.
    let ce = json(
        http.post(server.url("/cloudevent"))
            .header("content-type", "application/cloudevents+json")
            .body(r#"{"specversion":"1.0","type":"t.s","source":"/s","id":"e-2","data":{"m":2}}"#),
    )
    .await;
    assert_eq!(
        ce,
        json!({"type": "t.s", "source": "/s", "id": "e-2", "data": {"m": 2}})
    );
    // FUNC_TIMEOUT → 408, for a promise that never settles and for a main() that returned
    // without answering; FUNC_BODY_MB_LIMIT → 413, sized or chunked.
    for path in ["/hang", "/hang-sync"] {
        let resp = http.get(server.url(path)).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT, "{path}");
    }
    bodies_over_the_limit_get_413(&server).await;
    // Found over the limit twice (the server's count, then Express's parser), answered once.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !server.stderr().contains("ERR_HTTP_HEADERS_SENT"),
        "{}",
        server.logs()
    );
}

/// Kyma's nodejs26 access log: SERVER_INTERNAL_LOGGER set, a line per request.
#[tokio::test]
async fn nodejs26_logs_each_request_when_server_internal_logger_is_set() {
    let server = Server::start(Runtime::Express, &[("SERVER_INTERNAL_LOGGER", "true")]);
    let resp = client().get(server.url("/hello?x=1")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !server.stdout().contains("GET /hello?x=1 200") {
        assert!(std::time::Instant::now() < deadline, "{}", server.logs());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn python314_serves_kymas_new_api_samples_with_flasks_request_and_responses() {
    let server = Server::start(Runtime::Flask, &[]);
    let http = client();
    let get = |path: &str| http.get(server.url(path)).send();
    let resp = get("/hello").await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{}", server.logs());
    assert_eq!(header(&resp, "access-control-allow-origin"), "*");
    assert!(header(&resp, "content-type").starts_with("text/html"));
    assert_eq!(resp.text().await.unwrap(), "Hello World!");
    // Query parameters through flask.request.
    let resp = get("/name?name=kiln").await.unwrap();
    assert_eq!(resp.text().await.unwrap(), "Hello kiln!");
    assert_eq!(
        get("/name").await.unwrap().text().await.unwrap(),
        "Hello World!"
    );
    // Kyma's custom-response sample: Flask Responses with their own status and type.
    let resp = get("/accept").await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        resp.json::<Value>().await.unwrap(),
        json!({"error": "Invalid Content-Type."})
    );
    let resp = http
        .post(server.url("/accept"))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    assert_eq!(header(&resp, "content-type"), "application/json");
    // Bodies as Flask reads them; a dict answers JSON.
    let echo = |body: &'static str, ty: &'static str| {
        json(
            http.post(server.url("/echo"))
                .header("content-type", ty)
                .body(body),
        )
    };
    let json_body = echo(r#"{"a":[1,2]}"#, "application/json").await;
    assert_eq!(json_body["json"], json!({"a": [1, 2]}));
    let form = echo("a=1&b=2", "application/x-www-form-urlencoded").await;
    assert_eq!(form["form"], json!({"a": "1", "b": "2"}));
    let text = echo("plain words", "text/plain").await;
    assert_eq!(
        (&text["text"], &text["method"]),
        (&json!("plain words"), &json!("POST"))
    );
    // A (body, status, headers) tuple, flask.abort, no answer, a raise.
    let resp = get("/tuple").await.unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    assert_eq!(header(&resp, "x-fixture"), "tuple");
    let resp = get("/abort").await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert!(resp.text().await.unwrap().contains("no such thing"));
    let resp = get("/none").await.unwrap();
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let resp = get("/throw").await.unwrap();
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(resp.text().await.unwrap(), "Internal server error");
    let stderr = server.stderr_containing("boom from").await;
    assert!(stderr.contains("handler.py"), "{stderr}");
    // Health, metrics and a CORS preflight, as the legacy servers answer them.
    let resp = get("/healthz").await.unwrap();
    assert_eq!(resp.text().await.unwrap(), "OK");
    let resp = http
        .request(reqwest::Method::OPTIONS, server.url("/any"))
        .header("Origin", "https://app.example")
        .header("Access-Control-Request-Method", "PUT")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    assert_eq!(header(&resp, "access-control-allow-methods"), "PUT");
    let text = metrics(&server).await;
    assert_eq!(sample(&text, "function_calls_total"), 12.0, "{text}");
    assert_eq!(sample(&text, "function_failures_total"), 2.0, "{text}");
}

#[tokio::test]
async fn python314_gives_functions_the_sdk_and_keeps_the_timeout_and_body_limit() {
    let publisher = Publisher::start();
    let server = sdk_server(Runtime::Flask, &publisher);
    let http = client();
    let sdk = json(http.get(server.url("/sdk"))).await;
    assert_eq!(
        sdk,
        json!({"name": "fixture", "namespace": "tests", "runtime": "python314", "timeout": 1,
               "bodySizeLimit": 0.001, "tracer": true}),
        "{}",
        server.logs()
    );
    // A binary-mode and a structured CloudEvent in, one emitted to the publisher.
    let ce = json(
        http.post(server.url("/cloudevent"))
            .header("ce-type", "order.created")
            .header("ce-source", "/shop")
            .header("ce-id", "e-1")
            .header("ce-specversion", "1.0")
            .header("content-type", "application/json")
            .body(r#"{"n":1}"#),
    )
    .await;
    assert_eq!(
        ce,
        json!({"type": "order.created", "source": "/shop", "id": "e-1", "data": {"n": 1}})
    );
    let structured = json(
        http.post(server.url("/cloudevent"))
            .header("content-type", "application/cloudevents+json")
            .body(
                json!({"specversion": "1.0", "type": "t.s", "source": "/s", "id": "e-2",
                       "datacontenttype": "application/json", "data": {"m": 2}})
                .to_string(),
            ),
    )
    .await;
    assert_eq!(
        structured,
        json!({"type": "t.s", "source": "/s", "id": "e-2", "data": {"m": 2}})
    );
    let plain = json(http.post(server.url("/cloudevent")).body("x")).await;
    assert_eq!(plain, Value::Null, "not a CloudEvent");
    let emitted = json(http.get(server.url("/emit"))).await;
    assert_eq!(emitted["status"], 200, "{}", server.logs());
    let (_, event) = publisher.seen().pop().unwrap();
    assert_eq!(
        (
            &event["type"],
            &event["source"],
            &event["data"],
            &event["eventtypeversion"]
        ),
        (
            &json!("order.created"),
            &json!("/shop"),
            &json!({"n": 1}),
            &json!("v1")
        )
    );
    // FUNC_TIMEOUT → 408; FUNC_BODY_MB_LIMIT → 413, sized or chunked.
    let resp = http.get(server.url("/hang")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT);
    assert_eq!(
        resp.text().await.unwrap(),
        "Timeout while processing the function\n"
    );
    bodies_over_the_limit_get_413(&server).await;
}

/// Kyma's migration guide writes a nodejs26 handler as an ES module that imports the sdk's
/// functions by name: each must be a name Node finds in the sdk's CommonJS exports.
#[tokio::test]
async fn nodejs26_loads_an_es_module_handler_that_imports_every_sdk_function_by_name() {
    let dir = tempfile::tempdir().unwrap();
    // As in the image: the sdk in a node_modules the handler's directory is under (an ES
    // module resolves packages so, not through NODE_PATH).
    let modules = dir.path().join("node_modules");
    std::fs::create_dir_all(&modules).unwrap();
    let sdk =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("runtimes/_servers/express/sdk");
    std::os::unix::fs::symlink(sdk, modules.join("sdk")).unwrap();
    let handler = dir.path().join("function/handler.mjs");
    std::fs::create_dir_all(handler.parent().unwrap()).unwrap();
    std::fs::write(
        &handler,
        "import { getTracer, getCloudEvent, emitCloudEvent, getFunctionName, getNamespace,\n\
         \x20 getRuntime, getTimeout, getBodySizeLimit } from 'sdk';\n\
         export function main(req, res) {\n\
         \x20 res.json({ name: getFunctionName(), namespace: getNamespace(),\n\
         \x20   runtime: getRuntime(),\n\
         \x20   timeout: getTimeout(), bodySizeLimit: getBodySizeLimit(),\n\
         \x20   tracer: typeof getTracer().startSpan, ce: getCloudEvent(req),\n\
         \x20   emit: typeof emitCloudEvent });\n\
         }\n",
    )
    .unwrap();
    let server = Server::start(
        Runtime::Express,
        &[
            ("HANDLER_PATH", handler.to_str().unwrap()),
            ("FUNC_TIMEOUT", "7"),
        ],
    );
    let resp = client().get(server.url("/")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{}", server.logs());
    assert_eq!(
        resp.json::<Value>().await.unwrap(),
        json!({"name": "fixture", "namespace": "tests", "runtime": "nodejs26", "timeout": 7,
               "bodySizeLimit": 1, "tracer": "function", "ce": null, "emit": "function"})
    );
}

/// Flask serves nothing itself: with a `static/` folder in the working directory (the image's is
/// the Function's own, /kubeless), `/static/…` still reaches main().
#[tokio::test]
async fn python314_passes_static_paths_to_the_function() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("static")).unwrap();
    std::fs::write(dir.path().join("static/a.txt"), "served by flask").unwrap();
    let server = Server::start_in(Runtime::Flask, &[], Some(dir.path()));
    let resp = client()
        .get(server.url("/static/a.txt"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND, "{}", server.logs());
    assert_eq!(resp.text().await.unwrap(), "no fixture at /static/a.txt");
}
