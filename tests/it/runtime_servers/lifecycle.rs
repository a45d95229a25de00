//! The server's life around slow calls, on both runtimes: FUNC_TIMEOUT answers 408 and the
//! server serves on, SIGTERM drains in-flight calls (or does not wait for timed-out ones),
//! and Python serves as many calls at once as CHERRYPY_NUMTHREADS allows.

use crate::common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::function_server::{Runtime, Server, client, metrics, sample};
use reqwest::StatusCode;
use serde_json::Value;

/// One server thread (Python): the timed-out call still runs on it, so the server must have
/// put another in its place.
pub(super) async fn a_slow_function_times_out_with_408(rt: Runtime) {
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

/// Calls in flight together time out on their own: the one that finishes between two slow
/// ones is answered, and each slow one gets its 408 (Node.js keeps the waiting calls in a
/// list the finished one leaves from its middle).
pub(super) async fn calls_in_flight_together_time_out_each_on_its_own(rt: Runtime) {
    let server = Server::start(rt, &[("FUNC_TIMEOUT", "2")]);
    let call = |path: &'static str, after: u64| {
        let url = server.url(path);
        async move {
            tokio::time::sleep(Duration::from_millis(after)).await;
            let resp = client().get(url).send().await.unwrap();
            (resp.status(), resp.text().await.unwrap())
        }
    };
    let started = Instant::now();
    let (first, middle, last) =
        tokio::join!(call("/sleep", 0), call("/slow", 100), call("/sleep", 200));
    assert_eq!(middle, (StatusCode::OK, "slow done".to_string()));
    for answer in [&first, &last] {
        assert_eq!(answer.0, StatusCode::REQUEST_TIMEOUT, "{answer:?}");
    }
    assert!(
        started.elapsed() < Duration::from_millis(4000),
        "took {:?}",
        started.elapsed()
    );
    let page = metrics(&server).await;
    assert_eq!(sample(&page, "function_failures_total"), 2.0, "{page}");
    assert_eq!(sample(&page, "function_calls_total"), 3.0, "{page}");
}

/// A call past FUNC_TIMEOUT was answered; that its Function still runs must not hold up the
/// exit on SIGTERM.
pub(super) async fn sigterm_exits_promptly_while_a_timed_out_call_still_runs(rt: Runtime) {
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

pub(super) async fn sigterm_drains_in_flight_requests_then_exits_zero(rt: Runtime) {
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

pub(super) async fn a_late_return_into_a_busy_pool_wedges_nothing() {
    let mut server = Server::start(
        Runtime::Python,
        &[("FUNC_TIMEOUT", "3"), ("CHERRYPY_NUMTHREADS", "4")],
    );
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    // /sleep takes 5 s: 408 at 3 s, and its thread returns at 5 s, when every thread is busy
    // with the six calls sent after the 408 (two of them waiting in cheroot's queue).
    let first = http.get(server.url("/sleep")).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::REQUEST_TIMEOUT);
    let calls: Vec<_> = (0..6)
        .map(|_| tokio::spawn(http.get(server.url("/sleep")).send()))
        .collect();
    for call in calls {
        let resp = call.await.unwrap().expect("an answer");
        assert_eq!(
            resp.status(),
            StatusCode::REQUEST_TIMEOUT,
            "{}",
            server.logs()
        );
    }
    let resp = http
        .get(server.url("/healthz"))
        .send()
        .await
        .expect("healthz");
    assert_eq!(resp.status(), StatusCode::OK);
    server.terminate();
    let status = server.wait_exit(Duration::from_secs(10)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "exit {status:?}:\n{}",
        server.logs()
    );
}
