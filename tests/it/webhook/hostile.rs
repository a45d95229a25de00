//! `kiln webhook` against hostile clients, as issue 29 found them: a review made huge by one
//! long array, fields no Function has, hundreds of connections that never finish their
//! headers and tens of large bodies sent slowly. Each is cut off or refused, the process
//! stays under half of deploy/'s 128 MiB limit, and a valid review is answered within a
//! second throughout.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::harness::{Webhook, connect};
use super::{function, node_spec, review, started};

/// Half of the memory limit deploy/webhook.yaml sets.
const MEMORY_CAP_KIB: u64 = 64 * 1024;

/// The webhook's peak resident memory (`VmHWM`), in KiB.
fn peak_rss_kib(hook: &Webhook) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", hook.child.id())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

#[tokio::test]
async fn a_review_huge_in_one_dimension_is_refused_unparsed_and_unknown_fields_are_denied() {
    let (_pki, hook) = started().await;
    // 1.4 million numbers in a field no Function has: 2.8 MB, under the body limit.
    let mut spec = node_spec();
    spec["padding"] = json!(Value::Null);
    let text = review("CREATE", function(spec)).to_string();
    let junk = format!("[{}0]", "0,".repeat(1_400_000));
    let body = text.replacen("\"padding\":null", &format!("\"padding\":{junk}"), 1);
    assert!(body.len() > 2_800_000, "{}", body.len());
    let started = Instant::now();
    let r = hook
        .client
        .post(hook.url("/validate"))
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let answer = r.text().await.unwrap();
    assert!(
        answer.contains("an array of more than 10000 elements"),
        "{answer}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let peak = peak_rss_kib(&hook);
    assert!(peak < MEMORY_CAP_KIB, "peak RSS {peak} KiB");

    // A field the CRD does not have, small: denied, named.
    let mut spec = node_spec();
    spec["sourceOverride"] = json!("x");
    let response = hook
        .review("/validate", &review("CREATE", function(spec)))
        .await;
    assert_eq!(response["allowed"], false, "{response}");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("spec.sourceOverride: unknown field"),
        "{message}"
    );
}

#[tokio::test]
async fn slow_clients_are_cut_off_and_a_valid_review_is_answered_throughout() {
    let (pki, hook) = started().await;
    let port = hook.port;
    // 300 connections that never finish their request head.
    let mut heads = Vec::new();
    for _ in 0..300 {
        let mut tls = connect(&pki, port).await;
        tls.write_all(b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            .await
            .unwrap();
        heads.push(tls);
    }
    // 40 bodies of 3 MiB announced, sent a kilobyte at a time.
    let mut bodies = Vec::new();
    for _ in 0..40 {
        let mut tls = connect(&pki, port).await;
        let head = format!(
            "POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n",
            3 * 1024 * 1024
        );
        tls.write_all(head.as_bytes()).await.unwrap();
        bodies.push(tokio::spawn(async move {
            let chunk = [b' '; 1024];
            let mut answer = Vec::new();
            loop {
                if tls.write_all(&chunk).await.is_err() {
                    break;
                }
                let mut buf = [0u8; 512];
                match tokio::time::timeout(Duration::from_millis(200), tls.read(&mut buf)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => break,
                    Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
                    Err(_) => {}
                }
            }
            String::from_utf8_lossy(&answer).into_owned()
        }));
    }
    // Valid reviews, one every 250 ms, past the header and request timeouts.
    let until = Instant::now() + Duration::from_secs(13);
    let mut slowest = Duration::ZERO;
    while Instant::now() < until {
        let started = Instant::now();
        let response = hook
            .review("/validate", &review("CREATE", function(node_spec())))
            .await;
        assert_eq!(response["allowed"], true, "{response}");
        slowest = slowest.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        slowest < Duration::from_secs(1),
        "a valid review took {slowest:?}"
    );
    // The unfinished heads were closed (hyper answers 408 first, or just closes).
    for mut tls in heads {
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(2), tls.read_to_end(&mut rest)).await;
        assert!(
            read.is_ok(),
            "a connection without a finished head is still open"
        );
    }
    // Every slow body was refused: most at once (503, their budget full), the rest after
    // the request timeout (408).
    let mut statuses = Vec::new();
    for body in bodies {
        let answer = body.await.unwrap();
        statuses.push(answer.lines().next().unwrap_or_default().to_string());
    }
    assert!(
        statuses
            .iter()
            .all(|s| s.starts_with("HTTP/1.1 503") || s.starts_with("HTTP/1.1 408")),
        "{statuses:?}"
    );
    let peak = peak_rss_kib(&hook);
    assert!(peak < MEMORY_CAP_KIB, "peak RSS {peak} KiB");
}
