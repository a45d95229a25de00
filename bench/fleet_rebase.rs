//! A base patch across a fleet: 1,000 Functions built by real `kiln build`s (run by the
//! build-Job stand-in, one per Job, on the base the Job names) and running on the nodejs22
//! base `kiln base build` made, in the in-memory cluster; then `kiln base build` again with
//! another Node.js patch release under the same tag. Measured: the time from the new base's
//! push until every Function runs on it (its Deployment rolled: the rollout stand-in marks a
//! new generation available `ROLLOUT` after it appears, a Pod's start), the registry requests
//! per Function in that time (reads and writes), the bytes of the configs and manifests
//! pushed, and the Jobs created. Beside it, in the same run: the per-build time of kiln's own
//! build of these Functions on the new base, and what rebuilding the fleet with Jobs takes at
//! that time, 50 Jobs at a time with no Pod overhead at all (which favours the Jobs). Between
//! the two, a second patch is rebased too: the first rebase of an image a Job built reads its
//! manifest and config; the controller keeps what it pushed, so later patches read neither
//! back. Run it
//! with
//!
//!     cargo test --release --features bench --test bench_fleet_rebase -- --ignored --nocapture
//!
//! With `KILN_BENCH_SIGN=1` the controller signs (`--image-signing-secret`) and deploys only
//! proven images (`--require-provenance`), and the Jobs' builds sign (`--sign-key`): the
//! rebases are then signed by the controller, with a provenance and an SBOM each.
//!
//! Record the printed results in bench/RESULTS.md.

#![allow(clippy::unwrap_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::base_change::{node_lock, push_base};
use common::controller_env::{ControllerEnv, node_function};
use common::fake_builds::{FakeBuilds, FakeRollouts, Outcome, job_arg};

/// How long a Deployment's new Pods take to be ready, in the rollout stand-in.
const ROLLOUT: Duration = Duration::from_secs(1);
/// Rollouts (rebases) at once, and build Jobs at once.
const CONCURRENT: usize = 50;

fn kiln() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
    cmd.env("KILN_CACHE_DIR", common::kiln::shared_download_cache());
    cmd
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The Function's source directory.
fn source(work: &Path, name: &str) -> PathBuf {
    work.join("src").join(name)
}

#[test]
#[ignore = "a benchmark: run it on purpose, in release mode"]
fn a_base_patch_reaches_every_function_of_the_fleet() {
    // KILN_BENCH_FUNCTIONS: fewer Functions, for trying the benchmark out.
    let functions: usize = std::env::var("KILN_BENCH_FUNCTIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000);
    let work = tempfile::tempdir().unwrap();
    let mut env = ControllerEnv::start(&[]);
    push_base(&env.registry, "nodejs22", "latest", None);
    let reg = env.registry.host();
    let concurrent = CONCURRENT.to_string();
    let sign = std::env::var_os("KILN_BENCH_SIGN").is_some();
    let key = work.path().join("keys/a.key");
    if sign {
        sign_with(&env, &work.path().join("keys"));
    }
    let mut flags = vec![
        format!("--base-image=nodejs22={reg}/kiln/nodejs22:latest"),
        format!("--builder-image=nodejs22={reg}/kiln/nodejs22-builder:latest"),
        "--image-cache-ttl=1".into(),
        "--resync=0".into(),
        "--workers=16".into(),
        format!("--max-build-jobs={concurrent}"),
        format!("--max-concurrent-rollouts={concurrent}"),
    ];
    if sign {
        flags.push("--image-signing-secret=kiln-image-signing".into());
        flags.push("--require-provenance".into());
    }
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    env.spawn(&flags);
    let names: Vec<String> = (0..functions).map(|i| format!("f{i:04}")).collect();
    for (i, name) in names.iter().enumerate() {
        let dir = source(work.path(), name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("handler.js"),
            format!("module.exports = {{ main: () => {i} }}"),
        )
        .unwrap();
        std::fs::write(dir.join("package.json"), "{}").unwrap();
    }
    // Each Job is a real kiln build of its Function onto the base the Job names.
    let cache = work.path().join("cache");
    let builds = FakeBuilds::start(env.api.client(), Duration::from_millis(10), {
        let (src, host, cache) = (work.path().join("src"), reg.clone(), cache.clone());
        let key = key.clone();
        move |job| {
            let image = job_arg(job, "--image").unwrap_or_default();
            let name = image
                .rsplit_once(':')
                .unwrap()
                .0
                .rsplit('/')
                .next()
                .unwrap();
            let dir = src.join(name);
            let base = job_arg(job, "--base").unwrap_or_default();
            let argv = [
                env!("CARGO_BIN_EXE_kiln"),
                "build",
                dir.to_str().unwrap(),
                "--runtime",
                "nodejs22",
                "--namespace",
                "bench",
                "--name",
                name,
                "--base",
                &base,
                "--image",
                "{image}",
                "-q",
                "--insecure-registry",
                &host,
                "--cache-dir",
                cache.to_str().unwrap(),
            ];
            let mut argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
            if sign {
                argv.extend(["--sign-key".into(), key.to_str().unwrap().into()]);
            }
            Outcome::Exec(argv)
        }
    });
    let _rollouts = FakeRollouts::start_after(env.api.client(), ROLLOUT);
    let started = Instant::now();
    for name in &names {
        env.create_function(
            "bench",
            &node_function(name, "built from a directory", None),
        );
    }
    env.wait("every Function running", Duration::from_secs(3600), || {
        env.running() == functions
    });
    println!(
        "setup: {functions} Functions built (real kiln builds, one per Job) and running in \
            {:.0} s",
        started.elapsed().as_secs_f64()
    );
    // The patch, rebased; then another (the same packages at another SOURCE_DATE_EPOCH),
    // rebuilt by Jobs (`--no-rebase`), each Job a real kiln build as above.
    let lock = node_lock(work.path(), "22.23.5");
    let rebase = move_fleet(&env, &builds, &names, &work.path().join("next"), &lock, "0");
    report("rebase", &rebase, functions);
    // The next patch: the controller read each image when it rebased it first (a Job built
    // it); what it pushed then it holds, so a later patch reads nothing of it back.
    let again = move_fleet(
        &env,
        &builds,
        &names,
        &work.path().join("later"),
        &lock,
        "2",
    );
    report("the next patch, rebased", &again, functions);
    assert_eq!(again.jobs, 0, "a safe rebase runs no Job");
    let starts = pod_starts(&env, &names[..names.len().min(8)]);
    println!(
        "a Pod start as the test kubelet makes one (kiln run of a rebased image until it \
            answers /healthz, on a node cache without the new base): the first {:.0} ms (it \
            unpacks the base), then {:.0} ms median of {} (its own layers on a copy of the base \
            the first stored); the rollout stand-in takes {:.0} ms",
        starts[0],
        median(starts[1..].to_vec()),
        starts.len() - 1,
        ROLLOUT.as_secs_f64() * 1000.0
    );
    let mut jobs_flags = flags.clone();
    jobs_flags.push("--no-rebase");
    env.spawn(&jobs_flags);
    let rebuild = move_fleet(
        &env,
        &builds,
        &names,
        &work.path().join("again"),
        &lock,
        "1",
    );
    report("rebuild by Jobs", &rebuild, functions);
    println!(
        "the rebase moved the fleet {:.1}x faster than Jobs running kiln's own builds ({} Jobs \
            at a time, no Pod to schedule or start)",
        rebuild.took / rebase.took,
        CONCURRENT
    );
    assert_eq!(rebase.jobs, 0, "a safe rebase runs no Job");
    assert_eq!(rebase.rebased, functions);
    // A Function reconciled between the builder's and the base's tag moves builds for the
    // builder alone first: a few more Jobs than Functions.
    assert!(rebuild.jobs >= functions, "{} Jobs", rebuild.jobs);
}

/// Keys in `dir` (`a.key`, `a.pub`), and the image signing Secret with them.
fn sign_with(env: &ControllerEnv, dir: &Path) {
    use base64::Engine as _;
    std::fs::create_dir_all(dir).unwrap();
    common::run(
        Command::new("python3")
            .arg(common::kiln::fixtures().join("cosign/check.py"))
            .arg("keys")
            .arg(dir),
    );
    let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    env.api.insert(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "kiln-image-signing",
                     "namespace": common::controller_env::SYSTEM},
        "data": {"cosign.key": b64(&read("a.key")), "cosign.pub": b64(&read("a.pub"))},
    }));
}

/// Milliseconds each of `names`' images took from `kiln run` to its first answer on
/// /healthz, one after the other, with one cache (a node's) that starts empty.
fn pod_starts(env: &ControllerEnv, names: &[String]) -> Vec<f64> {
    let node = tempfile::tempdir().unwrap();
    names
        .iter()
        .map(|name| {
            let status = &env.function("bench", name)["status"];
            let image = status["image"].as_str().unwrap().to_string();
            let port = common::free_port();
            let started = Instant::now();
            let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
                .args(["run", &image, "--port", &port.to_string()])
                .args(["--insecure-registry", &env.registry.host()])
                .env("KILN_CACHE_DIR", node.path())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            let ready = |port| {
                std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
                    && common::http::request(port, "GET", "/healthz", &[], b"").0 == 200
            };
            while !ready(port) {
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "{image} never answered"
                );
                assert!(
                    child.try_wait().unwrap().is_none(),
                    "kiln run {image} exited"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            let took = started.elapsed().as_secs_f64() * 1000.0;
            common::run(Command::new("kill").args(["-TERM", &child.id().to_string()]));
            child.wait().unwrap();
            took
        })
        .collect()
}

/// What moving the fleet to a new base took.
struct Moved {
    /// Seconds from the tags' move until every Function ran on the new base.
    took: f64,
    /// Build Jobs that ran.
    jobs: usize,
    /// Functions whose BuildReady says ImageRebased.
    rebased: usize,
    /// The registry's access log lines for the Functions' repositories meanwhile.
    log: Vec<String>,
    /// Requests to the runtime images' repositories meanwhile (the controller's tag lookups
    /// and reads of the new base; the Jobs' base pulls).
    base_requests: usize,
    /// Config and manifest bytes of a sample of the new images.
    uploaded: f64,
}

/// Assembles the nodejs22 images from `lock` at `epoch` into `layout`, uploads them under the
/// tag `next`, then moves the tags the controller follows (builder, then base) and waits until
/// every Function runs on the new base.
fn move_fleet(
    env: &ControllerEnv,
    builds: &FakeBuilds,
    names: &[String],
    layout: &Path,
    lock: &Path,
    epoch: &str,
) -> Moved {
    common::run(
        kiln()
            .env("SOURCE_DATE_EPOCH", epoch)
            .args(["base", "build", "nodejs22", "-q", "--lock"])
            .arg(lock)
            .arg("--output")
            .arg(format!("oci:{}", layout.display())),
    );
    let copy = |tag: &str| {
        for image in ["nodejs22-builder", "nodejs22"] {
            let reference = env.registry.reference(&format!("kiln/{image}:{tag}"));
            env.registry
                .skopeo_copy_from_layout(layout, image, &reference, None);
        }
    };
    copy("next");
    let new_base = common::images::tagged_digest(layout, "nodejs22");
    let jobs_before = builds.stats().ended.len();
    let log_before = env.registry.settled_access_log().len();
    let moved = Instant::now();
    copy("latest");
    // Every Function runs on the new base: BuildReady True (the image is the new key's, not
    // the last one still running) and Running True, and its Deployment runs that image. One
    // list of each per look, once a second: the API server runs in this process, and a look
    // per Function (or twice a second: a fifth of the CPU at 1,000) starves the controller.
    let moved_all = || {
        let deployments: std::collections::HashMap<String, serde_json::Value> = env
            .api
            .list("Deployment")
            .into_iter()
            .filter(|d| d["metadata"]["namespace"] == "bench")
            .map(|d| {
                let image = d["spec"]["template"]["spec"]["containers"][0]["image"].clone();
                (
                    d["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    image,
                )
            })
            .collect();
        env.api
            .list("Function")
            .iter()
            .filter(|f| f["metadata"]["namespace"] == "bench")
            .filter(|f| {
                let status = &f["status"];
                let name = f["metadata"]["name"].as_str().unwrap_or_default();
                status["runtimeImage"]
                    .as_str()
                    .is_some_and(|b| b.ends_with(&new_base))
                    && status["conditions"].as_array().is_some_and(|cs| {
                        ["Running", "BuildReady"]
                            .iter()
                            .all(|t| cs.iter().any(|c| c["type"] == *t && c["status"] == "True"))
                    })
                    && deployments.get(name) == Some(&status["image"])
            })
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(3600);
    loop {
        let done = moved_all();
        if done == names.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} Functions not moved:\n{}",
            names.len() - done,
            env.log_tail()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let took = moved.elapsed().as_secs_f64();
    let jobs = builds.stats().ended.len() - jobs_before;
    // What each Job's Function said about it, when there are a few (a safe rebase runs none).
    let ended = builds.stats().ended;
    if (1..=10).contains(&jobs) {
        for job in &ended[jobs_before..] {
            let notes: Vec<String> = env
                .api
                .list("Event.events.k8s.io")
                .iter()
                .filter(|e| job.contains(e["regarding"]["name"].as_str().unwrap_or("-")))
                .map(|e| format!("{}: {}", e["reason"], e["note"]))
                .collect();
            println!("Job {job}: {notes:#?}");
        }
    }
    if std::env::var("KILN_BENCH_DEBUG").is_ok() {
        let log = std::fs::read_to_string(&env.log).unwrap_or_default();
        let mut counts = std::collections::BTreeMap::new();
        for line in log.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
            let message = v["fields"]["message"].as_str().unwrap_or_default();
            let key: String = message.chars().take(60).collect();
            *counts.entry(key).or_insert(0usize) += 1;
        }
        let mut counts: Vec<_> = counts.into_iter().collect();
        counts.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        for (message, n) in counts.iter().take(25) {
            println!("  {n:6} {message}");
        }
        for line in log
            .lines()
            .filter(|l| l.contains("rebased onto") || l.contains("slot released"))
            .take(120)
        {
            let v: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
            println!(
                "  {} {} {}",
                v["timestamp"], v["fields"]["message"], v["fields"]
            );
        }
    }
    let all = env.registry.access_log_since(log_before);
    let base_requests = all.iter().filter(|l| l.contains("/v2/kiln/")).count();
    let log = all
        .into_iter()
        .filter(|l| l.contains("/v2/functions/bench/"))
        .collect();
    let rebased = names
        .iter()
        .filter(|n| {
            env.condition("bench", n, "BuildReady")
                .is_some_and(|(_, reason, _)| reason == "ImageRebased")
        })
        .count();
    let mut uploaded = Vec::new();
    for name in names.iter().take(20) {
        let image = env.function("bench", name)["status"]["image"]
            .as_str()
            .unwrap()
            .to_string();
        let raw = |extra: &[&str]| {
            common::run_bytes(
                Command::new("skopeo")
                    .args(["inspect", "--tls-verify=false"])
                    .args(extra)
                    .arg(format!("docker://{image}")),
            )
            .len()
        };
        uploaded.push((raw(&["--raw"]) + raw(&["--config", "--raw"])) as f64);
    }
    Moved {
        took,
        jobs,
        rebased,
        log,
        base_requests,
        uploaded: median(uploaded),
    }
}

fn report(what: &str, moved: &Moved, functions: usize) {
    let per = |n: usize| n as f64 / functions as f64;
    let count = |p: &dyn Fn(&String) -> bool| moved.log.iter().filter(|l| p(l)).count();
    let writes =
        count(&|l| l.starts_with("PUT") || l.starts_with("POST") || l.starts_with("PATCH"));
    let mounts = count(&|l| l.contains("mount="));
    let whole = count(&|l| l.contains("uploads/?digest="));
    let reads = count(&|l| l.starts_with("GET") || l.starts_with("HEAD"));
    println!(
        "{what}: {functions} Functions on the new base in {:.1} s ({} rebased, {} Jobs) with \
            {CONCURRENT} rollouts (or Jobs) at a time and a {:.0} s rollout; registry requests \
            per Function {:.2}: {:.2} writes, of them {:.2} mounts and {:.2} single-request \
            uploads, and {:.2} reads; the new image's config and manifest: {:.0} bytes; requests \
            to the runtime images' repositories: {}",
        moved.took,
        moved.rebased,
        moved.jobs,
        ROLLOUT.as_secs_f64(),
        per(moved.log.len()),
        per(writes),
        per(mounts),
        per(whole),
        per(reads),
        moved.uploaded,
        moved.base_requests,
    );
    // The reads by what they read, the commonest first.
    let mut kinds: Vec<(String, usize)> = Vec::new();
    for line in moved
        .log
        .iter()
        .filter(|l| l.starts_with("GET") || l.starts_with("HEAD"))
    {
        let kind = read_kind(line);
        match kinds.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => kinds.push((kind, 1)),
        }
    }
    kinds.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    let shown: Vec<String> = kinds
        .iter()
        .map(|(k, n)| format!("{k} {:.2}", per(*n)))
        .collect();
    println!("  reads per Function: {}", shown.join(", "));
}

/// What a read of the access log (`METHOD /v2/functions/bench/NAME/... STATUS`) reads: its
/// method, the kind of path (a manifest by digest or tag, and which tag; a blob; referrers)
/// and its status.
fn read_kind(line: &str) -> String {
    let mut parts = line.split_whitespace();
    let (method, path, status) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let what = match path.split_once("/manifests/") {
        Some((_, r)) if r.starts_with("sha256:") => "manifest by digest",
        Some((_, r)) if r.ends_with(".sig") => "the .sig tag",
        Some((_, r)) if r.ends_with(".att") => "the .att tag",
        Some((_, r)) if r.starts_with("kiln-") => "a key tag",
        Some(_) => "another tag",
        None if path.contains("/blobs/") => "blob",
        None if path.contains("/referrers/") => "referrers",
        None => "other",
    };
    format!("{method} {what} {status}")
}
