//! What each runtime's own framework gives a Function: Express's request and response
//! helpers and the `send` argument on Node.js, bottle's request and response on Python.

use crate::common;

use std::fs;

use common::function_server::{
    Runtime, Server, assert_json, client, fixtures, header, metrics, sample,
};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};

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

#[tokio::test]
async fn node_functions_can_answer_through_the_send_response_argument() {
    let server = Server::start(Runtime::Node, &[]);
    let resp = client().post(server.url("/send")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    assert_eq!(header(&resp, "x-sent"), "1");
    assert_eq!(resp.text().await.unwrap(), "sent");
}

#[tokio::test]
async fn node_answers_the_function_writes_itself_allow_any_origin_unless_it_set_its_own() {
    let server = Server::start(Runtime::Node, &[]);
    let resp = client().post(server.url("/raw")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(header(&resp, "access-control-allow-origin"), "*");
    assert_eq!(resp.text().await.unwrap(), "raw");
    let resp = client()
        .post(server.url("/own-origin"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        header(&resp, "access-control-allow-origin"),
        "https://app.example"
    );
    assert_eq!(resp.text().await.unwrap(), "own");
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
    let handler = fs::read_to_string(fixtures().join("node/handler.js")).unwrap();
    assert_eq!(resp.text().await.unwrap(), handler);
    let resp = client.get(server.url("/no-file")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
}
