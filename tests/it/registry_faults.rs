//! Registry faults, injected by a proxy in front of the real registry: 503s, 429s with
//! `Retry-After`, connection resets mid-upload, stalls, refused single-request uploads, a
//! registry killed mid-push. kiln retries only what is safe, in bounded time, and never leaves
//! a tag whose manifest names a missing blob (checked by fetching every blob the tag lists,
//! straight from the registry).

#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::faults::{FaultProxy, Faults};
use common::kiln::{Kiln, Run, copy_fixture, read_report, tiny_base};
use common::registry::{Registry, RegistryKind};

struct Setup {
    reg: Registry,
    kiln: Kiln,
    work: tempfile::TempDir,
}

fn setup() -> Setup {
    Setup {
        reg: Registry::start(RegistryKind::Plain),
        kiln: Kiln::new(),
        work: tempfile::tempdir().unwrap(),
    }
}

impl Setup {
    /// A copy of hello-node whose handler returns `n`: a different source layer per `n`.
    fn function(&self, n: usize) -> PathBuf {
        let dir = self.work.path().join(format!("f{n}"));
        if !dir.exists() {
            copy_fixture("hello-node", &dir);
            std::fs::write(
                dir.join("handler.js"),
                format!("module.exports = {{ main: () => {n} }};\n"),
            )
            .unwrap();
        }
        dir
    }

    /// `kiln build` of function `n` to `HOST/faults/fN:1`, with short timeouts.
    fn build(&self, host: &str, n: usize, extra: &[&str]) -> Run {
        let dir = self.function(n);
        let image = format!("{host}/faults/f{n}:1");
        let base = tiny_base();
        let mut args = vec![
            "build",
            dir.to_str().unwrap(),
            "--runtime",
            "nodejs22",
            "--base",
            &base,
            "--image",
            &image,
            "--insecure-registry",
            host,
            "--registry-timeout",
            "3",
        ];
        args.extend_from_slice(extra);
        self.kiln.run(&args)
    }

    /// Panics when `faults/fN:1` exists but names a blob the registry does not have.
    fn assert_no_broken_tag(&self, n: usize) -> bool {
        match self.reg.missing_blobs(&format!("faults/f{n}"), "1") {
            None => false,
            Some(missing) => {
                assert!(
                    missing.is_empty(),
                    "faults/f{n}:1 names missing blobs {missing:?}"
                );
                true
            }
        }
    }
}

/// Runs `count` builds, `parallel` at a time, each with the `extra` flags; returns each
/// build's outcome and duration.
fn builds(
    s: &Setup,
    host: &str,
    count: usize,
    parallel: usize,
    extra: &[&str],
) -> Vec<(usize, Run, Duration)> {
    let next = Arc::new(Mutex::new(0));
    let results = Arc::new(Mutex::new(Vec::new()));
    std::thread::scope(|scope| {
        for _ in 0..parallel {
            let (next, results) = (next.clone(), results.clone());
            scope.spawn(move || {
                loop {
                    let n = {
                        let mut next = next.lock().unwrap();
                        *next += 1;
                        *next - 1
                    };
                    if n >= count {
                        return;
                    }
                    let started = Instant::now();
                    let run = s.build(host, n, extra);
                    results.lock().unwrap().push((n, run, started.elapsed()));
                }
            });
        }
    });
    let mut out = Arc::try_unwrap(results).unwrap().into_inner().unwrap();
    out.sort_by_key(|(n, ..)| *n);
    out
}

fn retries_logged(runs: &[(usize, Run, Duration)]) -> usize {
    runs.iter()
        .map(|(_, r, _)| r.stderr.matches("retrying").count())
        .sum()
}

#[test]
fn fifty_builds_finish_through_twenty_percent_failures_throttling_and_resets() {
    let s = setup();
    // 50 here (CI time); bench/fault_soak.sh runs 200 the same way.
    const BUILDS: usize = 50;
    for n in 0..BUILDS {
        s.function(n);
    }
    let proxy = FaultProxy::start(
        &s.reg.host(),
        Faults {
            fail_rate: 0.2,
            throttle_every: 37,
            resets: 3,
            ..Faults::default()
        },
    );
    let runs = builds(&s, &proxy.host(), BUILDS, 4, &[]);
    let failed: Vec<_> = runs.iter().filter(|(_, r, _)| r.code != 0).collect();
    let seen = proxy.seen();
    let resets = seen.iter().filter(|x| x.outcome == "reset").count();
    let throttled = seen.iter().filter(|x| x.outcome == "answered 429").count();
    eprintln!(
        "{} requests, {} faults ({resets} resets, {throttled} 429s), {} retries logged, \
         slowest build {:?}",
        seen.len(),
        proxy.faults_injected(),
        retries_logged(&runs),
        runs.iter().map(|(.., d)| *d).max().unwrap()
    );
    assert!(
        failed.is_empty(),
        "{} of {BUILDS} builds failed; first: {}",
        failed.len(),
        failed[0].1.stderr
    );
    assert_eq!(resets, 3, "every reset was injected");
    assert!(throttled > 0);
    assert!(proxy.faults_injected() > 25, "{}", proxy.faults_injected());
    for n in 0..BUILDS {
        assert!(s.assert_no_broken_tag(n), "faults/f{n}:1 was not pushed");
        let open = s.reg.open_uploads(&format!("faults/f{n}"));
        assert!(
            open.is_empty(),
            "faults/f{n} has upload sessions left open: {open:?}"
        );
    }
}

#[test]
fn at_fifty_percent_every_build_finishes_or_fails_in_bounded_time_naming_status_and_request() {
    let s = setup();
    let proxy = FaultProxy::start(
        &s.reg.host(),
        Faults {
            fail_rate: 0.5,
            ..Faults::default()
        },
    );
    // Three retries instead of eight: some builds fail, so the error is checked too, and the
    // test stays short (with the default, 4 builds took 47 s here).
    let runs = builds(&s, &proxy.host(), 4, 4, &["--registry-retries", "3"]);
    for (n, run, took) in &runs {
        assert!(*took < Duration::from_secs(120), "build {n} took {took:?}");
        let pushed = s.assert_no_broken_tag(*n);
        if run.code == 0 {
            assert!(pushed, "build {n} succeeded but faults/f{n}:1 is not there");
        } else {
            let err = run.failure(1);
            assert!(!pushed, "a failed build left a tag");
            // The request that gave up: a probe (`/v2/`) or one for this repository.
            let request = ["GET", "HEAD", "POST", "PUT", "PATCH"]
                .iter()
                .any(|m| err.contains(&format!("{m} http://{}/v2/", proxy.host())));
            assert!(
                err.contains("returned 503") && request,
                "the error names the status and the request: {err}"
            );
        }
    }
    eprintln!(
        "{} of 4 builds finished at 50 %",
        runs.iter().filter(|(_, r, _)| r.code == 0).count()
    );
}

#[test]
fn a_stalled_request_times_out_and_is_retried_and_a_dead_registry_fails_in_bounded_time() {
    let s = setup();
    let proxy = FaultProxy::start(
        &s.reg.host(),
        Faults {
            stalls: 2,
            stall_for: Duration::from_secs(60),
            ..Faults::default()
        },
    );
    let started = Instant::now();
    let run = s.build(&proxy.host(), 0, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stderr.contains("timed out"), "{}", run.stderr);
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(s.assert_no_broken_tag(0));

    // Every request stalls: two attempts of the first request, then a clear error.
    proxy.set(Faults {
        stalls: u32::MAX,
        stall_for: Duration::from_secs(60),
        ..Faults::default()
    });
    let started = Instant::now();
    let run = s.build(&proxy.host(), 1, &["--registry-retries", "1"]);
    let took = started.elapsed();
    let err = run.failure(1);
    assert!(
        err.contains("timed out") && err.contains("--registry-timeout"),
        "{err}"
    );
    assert!(took < Duration::from_secs(20), "{took:?}");
    assert!(!s.assert_no_broken_tag(1));
}

#[test]
fn retry_after_is_honoured_and_retries_do_not_multiply() {
    let s = setup();
    let proxy = FaultProxy::start(
        &s.reg.host(),
        Faults {
            fail_rate: 1.0,
            status: 503,
            retry_after: Some(1),
            ..Faults::default()
        },
    );
    let run = s.build(&proxy.host(), 0, &["--registry-retries", "2"]);
    let err = run.failure(1);
    assert!(err.contains("returned 503"), "{err}");
    let seen = proxy.seen();
    // One request and its two retries; before, the probe and the token fetch retried inside
    // each attempt of the request that needed them (16 requests for one blob GET).
    assert_eq!(seen.len(), 3, "{seen:?}");
    for pair in seen.windows(2) {
        let gap = pair[1].at - pair[0].at;
        assert!(
            gap >= Duration::from_millis(950),
            "Retry-After: 1 waited {gap:?}"
        );
        assert_eq!(pair[0].request, pair[1].request);
    }
}

#[test]
fn a_failure_mid_publish_leaves_no_tag() {
    let s = setup();
    // The second blob upload is refused for good (400), after the first succeeded.
    let uploads = Arc::new(Mutex::new(0));
    let counter = uploads.clone();
    let proxy = FaultProxy::start(
        &s.reg.host(),
        Faults {
            rule: Some(Box::new(move |method, path, _| {
                if method == "PUT" && path.contains("/blobs/uploads/") {
                    let mut n = counter.lock().unwrap();
                    *n += 1;
                    return (*n == 2).then_some(400);
                }
                None
            })),
            ..Faults::default()
        },
    );
    // One blob at a time, so "after others succeeded" is an order, not a race.
    let run = s.build(&proxy.host(), 0, &["--jobs", "1"]);
    let err = run.failure(1);
    assert!(err.contains("returned 400"), "{err}");
    assert!(*uploads.lock().unwrap() >= 2);
    let forwarded_puts = proxy
        .seen()
        .iter()
        .filter(|x| x.request.starts_with("PUT ") && x.outcome == "forwarded 201")
        .count();
    assert!(
        forwarded_puts >= 1,
        "one blob was stored before the failure: {:?}",
        proxy.seen()
    );
    assert!(!s.assert_no_broken_tag(0), "a failed publish left a tag");
    assert!(
        !s.reg
            .storage_root()
            .join("docker/registry/v2/repositories/faults/f0/_manifests")
            .exists(),
        "no manifest at all"
    );
    // The manifest PUT refused: no tag either.
    proxy.set(Faults {
        rule: Some(Box::new(|method, path, _| {
            (method == "PUT" && path.contains("/manifests/")).then_some(400)
        })),
        ..Faults::default()
    });
    s.build(&proxy.host(), 0, &[]).failure(1);
    assert!(!s.assert_no_broken_tag(0));
}

#[test]
fn a_refused_single_request_upload_falls_back_to_chunks() {
    for status in [413, 416] {
        let s = setup();
        let proxy = FaultProxy::start(
            &s.reg.host(),
            Faults {
                // Any upload request that carries a whole blob is refused.
                rule: Some(Box::new(move |method, path, len| {
                    let whole = matches!(method, "PUT" | "POST") && len > 0;
                    (whole && path.contains("/blobs/uploads/")).then_some(status)
                })),
                ..Faults::default()
            },
        );
        let run = s.build(&proxy.host(), 0, &[]);
        assert_eq!(run.code, 0, "{status}: {}", run.stderr);
        let seen = proxy.seen();
        assert!(
            seen.iter()
                .any(|x| x.request.starts_with("PATCH ") && x.outcome == "forwarded 202"),
            "{status}: {seen:?}"
        );
        assert!(s.assert_no_broken_tag(0));
    }
}

#[test]
fn http_proxy_is_honoured_and_no_proxy_bypasses_it() {
    let s = setup();
    let proxy = FaultProxy::start(&s.reg.host(), Faults::default());
    let host = s.reg.host();
    let via = format!("http://{}", proxy.host());
    let dir = s.function(0);
    let base = tiny_base();
    let image = format!("{host}/faults/f0:1");
    let args = [
        "build",
        dir.to_str().unwrap(),
        "--runtime",
        "nodejs22",
        "--base",
        &base,
        "--image",
        &image,
        "--insecure-registry",
        &host,
    ];
    let run = s.kiln.run_cmd(
        s.kiln
            .command()
            .args(args)
            .env("HTTP_PROXY", &via)
            .env_remove("NO_PROXY")
            .env_remove("no_proxy"),
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let through = proxy.seen().len();
    assert!(through >= 3, "the build went through HTTP_PROXY: {through}");
    let run = s.kiln.run_cmd(
        s.kiln
            .command()
            .args(args)
            .env("HTTP_PROXY", &via)
            .env("NO_PROXY", "127.0.0.1"),
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(proxy.seen().len(), through, "NO_PROXY bypassed the proxy");
}

#[test]
fn a_registry_killed_mid_push_is_resumed_uploading_only_what_is_missing() {
    let mut s = setup();
    let report = s.work.path().join("report.json");
    let report_arg = report.to_str().unwrap().to_string();
    // The registry is SIGKILLed when the second blob upload finishes arriving, so the first
    // blob is stored and the rest of the push meets a dead registry.
    let puts = Arc::new(Mutex::new(0));
    let counter = puts.clone();
    let pid = s.reg.pid();
    let proxy = FaultProxy::start(
        &s.reg.host(),
        Faults {
            rule: Some(Box::new(move |method, path, _| {
                if method == "PUT" && path.contains("/blobs/uploads/") && path.contains("digest=") {
                    let mut n = counter.lock().unwrap();
                    *n += 1;
                    if *n == 2 {
                        common::run(
                            std::process::Command::new("kill").args(["-9", &pid.to_string()]),
                        );
                        return Some(502);
                    }
                }
                None
            })),
            ..Faults::default()
        },
    );
    let run = s.build(
        &proxy.host(),
        0,
        &["--registry-retries", "1", "--jobs", "1"],
    );
    run.failure(1);
    assert!(*puts.lock().unwrap() >= 2, "{:?}", proxy.seen());
    s.reg.restart();
    assert!(!s.assert_no_broken_tag(0));
    let stored_before = s.reg.stored_blobs();
    assert!(!stored_before.is_empty());
    proxy.set(Faults::default());
    let run = s.build(&proxy.host(), 0, &["--report", &report_arg]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(s.assert_no_broken_tag(0));
    let report = read_report(&report);
    for blob in report["blobs"].as_array().unwrap() {
        let digest = blob["digest"].as_str().unwrap();
        if stored_before
            .iter()
            .any(|d| d.contains(digest.trim_start_matches("sha256:")))
        {
            assert_eq!(blob["outcome"], "existed", "re-uploaded {digest}: {report}");
        }
    }
}

/// The soak (not in CI; `bench/fault_soak.sh`): `KILN_SOAK_BUILDS` builds (200), 4 at a time,
/// through 20 % failures, 429s and resets; reports failures, retries, injected faults and
/// upload sessions left open in the registry.
#[test]
#[ignore = "a soak run: bench/fault_soak.sh"]
fn soak_builds_through_the_flaky_proxy() {
    let count: usize = std::env::var("KILN_SOAK_BUILDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let s = setup();
    for n in 0..count {
        s.function(n);
    }
    let proxy = FaultProxy::start(
        &s.reg.host(),
        Faults {
            fail_rate: 0.2,
            throttle_every: 37,
            resets: u32::try_from(count / 10).unwrap(),
            ..Faults::default()
        },
    );
    let started = Instant::now();
    let runs = builds(&s, &proxy.host(), count, 4, &[]);
    let took = started.elapsed();
    let failed = runs.iter().filter(|(_, r, _)| r.code != 0).count();
    let mut leaked = 0;
    let mut broken = 0;
    for n in 0..count {
        leaked += s.reg.open_uploads(&format!("faults/f{n}")).len();
        if s.reg
            .missing_blobs(&format!("faults/f{n}"), "1")
            .is_some_and(|m| !m.is_empty())
        {
            broken += 1;
        }
    }
    let mut durations: Vec<_> = runs.iter().map(|(.., d)| *d).collect();
    durations.sort();
    let seen = proxy.seen();
    println!(
        "soak: {count} builds, 4 parallel, {took:.1?}: {failed} failed, {broken} broken tags, \
         {} requests, {} faults injected ({} resets, {} 429s), {} retries logged, \
         {leaked} upload sessions left open; build time median {:.2?}, max {:.2?}",
        seen.len(),
        proxy.faults_injected(),
        seen.iter().filter(|x| x.outcome == "reset").count(),
        seen.iter().filter(|x| x.outcome == "answered 429").count(),
        retries_logged(&runs),
        durations[durations.len() / 2],
        durations[durations.len() - 1],
    );
    assert_eq!((failed, broken, leaked), (0, 0, 0));
}
