//! CloudEvents, on both runtimes: binary and structured mode requests fill the `ce` fields,
//! a plain request is no event, and a Function emits events (and the deprecated reply event)
//! to the publisher proxy.

use crate::common;

use common::echo::Publisher;
use common::function_server::{Runtime, Server, call_json, client};
use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};

pub(super) async fn binary_cloud_event_fills_ce_fields(rt: Runtime) {
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
        Runtime::Node | Runtime::Express => "2024-05-01T12:00:00.000Z",
        Runtime::Python | Runtime::Flask => "2024-05-01T12:00:00Z",
    };
    assert_eq!(ce["time"], time);
    assert_eq!(ce["eventtypeversion"], "v1");
    assert_eq!(ce["datacontenttype"], "application/json");
}

pub(super) async fn structured_cloud_event_fills_ce_fields(rt: Runtime) {
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
        Runtime::Node | Runtime::Express => "2024-05-02T08:30:00.000Z",
        Runtime::Python | Runtime::Flask => "2024-05-02T08:30:00Z",
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

pub(super) async fn emitted_cloud_events_are_valid_with_a_time_and_return_the_publishers_answer(
    rt: Runtime,
) {
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

pub(super) async fn a_reply_event_is_built_and_published_the_deprecated_way(rt: Runtime) {
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

pub(super) async fn a_request_is_a_cloud_event_only_when_it_is_one_and_gets_an_id_and_a_time(
    rt: Runtime,
) {
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
