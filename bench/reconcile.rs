//! Reconcile throughput at steady state: 1,000 Functions built and running, then the
//! controller resyncs them again and again. Per pass it measures reconciles per second, API
//! requests and writes per reconcile (target: zero writes) and registry requests per
//! reconcile (target: at most one). Run it with
//!
//!     cargo test --release --features bench --test bench_reconcile -- --ignored --nocapture
//!
//! and record the printed medians in bench/RESULTS.md.

#![allow(clippy::unwrap_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::controller_env::{ControllerEnv, node_function};
use common::fake_builds::{FakeBuilds, FakeRollouts, Outcome};

const PASSES: usize = 5;

/// Waits (polling every millisecond, for a fine timing) until the controller counts
/// `reconciles` reconciles since it started.
fn until(env: &ControllerEnv, reconciles: f64) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while env.metric("kiln_reconciles_total") < reconciles {
        assert!(
            Instant::now() < deadline,
            "no {reconciles} reconciles in 300 s:\n{}",
            env.log_tail()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
#[ignore = "a benchmark: run it on purpose, in release mode"]
fn reconcile_throughput_at_steady_state() {
    // KILN_BENCH_FUNCTIONS: fewer Functions, for trying the benchmark out.
    let functions: usize = std::env::var("KILN_BENCH_FUNCTIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000);
    let mut env =
        ControllerEnv::start(&["--resync", "0", "--workers", "16", "--max-build-jobs", "50"]);
    {
        let digest = env.tiny.digest.clone();
        let _builds = FakeBuilds::start(env.api.client(), Duration::from_millis(10), move |_| {
            Outcome::Report(digest.clone())
        });
        let _rollouts = FakeRollouts::start(env.api.client());
        for i in 0..functions {
            env.create_function(
                "bench",
                &node_function(
                    &format!("f{i:04}"),
                    &format!("module.exports = {{ main: () => {i} }}"),
                    None,
                ),
            );
        }
        let started = Instant::now();
        env.wait("every Function running", Duration::from_secs(1200), || {
            env.running() == functions
        });
        println!(
            "setup: {functions} Functions built (stand-in builds, 50 at a time) and running in \
                {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    // Steady state: a fresh controller (its first pass fills its caches), then passes over
    // every Function on SIGHUP, each timed from the signal to its last reconcile.
    env.api.reset_requests();
    let log_before = env.registry.access_log().len();
    let begun = Instant::now();
    env.spawn(&["--resync", "0", "--workers", "16"]);
    until(&env, functions as f64);
    let took = begun.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(300));
    let requests = env.api.requests();
    println!(
        "first pass after a restart (process start, lists, watches, caches filled): {functions} \
            reconciles in {took:.2} s; API requests {} reads + {} writes; registry requests {}",
        requests.iter().filter(|r| !r.write).count(),
        requests.iter().filter(|r| r.write).count(),
        env.registry.access_log().len() - log_before
    );
    std::thread::sleep(Duration::from_secs(1));
    let (mut rates, mut api, mut writes, mut registry) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for pass in 1..=PASSES {
        let target = env.metric("kiln_reconciles_total") + functions as f64;
        env.api.reset_requests();
        let log_before = env.registry.access_log().len();
        let begun = Instant::now();
        env.hangup();
        until(&env, target);
        let took = begun.elapsed().as_secs_f64();
        let requests = env.api.requests();
        let reads = requests.iter().filter(|r| !r.watch && !r.write).count();
        let w = requests.iter().filter(|r| r.write).count();
        std::thread::sleep(Duration::from_millis(300));
        let reg = env.registry.access_log().len() - log_before;
        rates.push(functions as f64 / took);
        api.push((reads + w) as f64 / functions as f64);
        writes.push(w as f64 / functions as f64);
        registry.push(reg as f64 / functions as f64);
        println!(
            "pass {pass}: {functions} reconciles in {took:.2} s = {:.0}/s; API requests {reads} \
                reads + {w} writes; registry requests {reg}",
            functions as f64 / took
        );
    }
    println!(
        "median of {PASSES} passes: {:.0} reconciles/s; {:.3} API requests and {:.3} writes per \
            reconcile; {:.3} registry requests per reconcile",
        median(rates),
        median(api),
        median(writes.clone()),
        median(registry.clone())
    );
    assert_eq!(median(writes), 0.0, "a steady-state resync writes nothing");
    assert!(
        median(registry) <= 1.0,
        "at most one registry request per Function"
    );
}
