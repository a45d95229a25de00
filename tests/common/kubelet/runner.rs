//! The life of one replica pod on its own thread: its object created through the API server
//! (when there is one), set up, start the container, run its startup, readiness and liveness
//! probes (HTTP or HTTPS GET of the pod's IP and the probe's port; port 8080 also on the
//! mapped host port a Function listens on), restart it when it exits or a probe gives up on
//! it (`restartPolicy: Always`, the kubelet's back-off: at once, then 10 s doubling to 5
//! min), and stop it when asked.
//!
//! Probes run every min(periodSeconds, 200 ms), faster than the kubelet, and change state
//! once they have failed for the kubelet's time budget, (failureThreshold − 1) ×
//! periodSeconds from the first failure: a Function is seen ready sooner, never later;
//! `successThreshold` counts consecutive successes at that faster pace.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Probe as K8sProbe};

use super::container::{Exit, Process};
use super::plan::{self, PodInput};
use super::pod::{Admission, State};
use super::{Core, Key, random_suffix};

/// The fastest the kubelet probes.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(200);
const BACKOFF_START: Duration = Duration::from_secs(10);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// One probe's schedule and recent results.
struct Probe {
    path: String,
    https: bool,
    targets: Vec<SocketAddr>,
    timeout: Duration,
    interval: Duration,
    budget: Duration,
    success_threshold: u32,
    next: Instant,
    failing_since: Option<Instant>,
    successes: u32,
}

impl Probe {
    /// `probe` of `container` in a pod at `ip` whose 8080 is also mapped to host port
    /// `mapped`.
    fn new(
        probe: &K8sProbe,
        container: &Container,
        ip: &str,
        mapped: u16,
        started: Instant,
    ) -> Probe {
        let secs =
            |v: Option<i32>, default: i32| Duration::from_secs(v.unwrap_or(default).max(0) as u64);
        let period = secs(probe.period_seconds, 10);
        let failures = probe.failure_threshold.unwrap_or(3).max(1) as u32;
        let get = probe.http_get.clone().unwrap_or_default();
        let port = super::replica::probe_port(container, &get.port).unwrap_or(0);
        let mut targets = Vec::new();
        if let (Ok(ip), Ok(port)) = (ip.parse::<std::net::IpAddr>(), u16::try_from(port)) {
            targets.push(SocketAddr::new(ip, port));
        }
        if port == super::replica::FUNCTION_PORT && mapped != 0 {
            targets.push(SocketAddr::from(([127, 0, 0, 1], mapped)));
        }
        Probe {
            path: get.path.unwrap_or_else(|| "/".into()),
            https: get.scheme.as_deref() == Some("HTTPS"),
            targets,
            timeout: secs(probe.timeout_seconds, 1),
            interval: period.min(PROBE_INTERVAL),
            budget: period * (failures - 1),
            success_threshold: probe.success_threshold.unwrap_or(1).max(1) as u32,
            next: started + secs(probe.initial_delay_seconds, 0),
            failing_since: None,
            successes: 0,
        }
    }

    /// Probes when due: `Some(passed)`. Both addresses belong to this pod alone, so either
    /// answering is its answer.
    fn poll(&mut self, now: Instant) -> Option<bool> {
        if now < self.next {
            return None;
        }
        self.next = now + self.interval;
        let passed = self.targets.iter().any(|t| {
            if self.https {
                https_get(*t, &self.path, self.timeout)
            } else {
                http_get_at(*t, &self.path, self.timeout)
            }
        });
        if passed {
            self.failing_since = None;
            self.successes += 1;
        } else {
            self.failing_since.get_or_insert(now);
            self.successes = 0;
        }
        Some(passed)
    }

    /// Failed for the whole budget.
    fn given_up(&self, now: Instant) -> bool {
        self.failing_since
            .is_some_and(|t| now.duration_since(t) >= self.budget)
    }
}

/// `GET path` on 127.0.0.1:port; a 2xx or 3xx answer within `timeout` passes.
pub fn http_get(port: u16, path: &str, timeout: Duration) -> bool {
    http_get_at(SocketAddr::from(([127, 0, 0, 1], port)), path, timeout)
}

/// `GET path` over HTTPS, the certificate not verified (as the kubelet's probes do).
fn https_get(addr: SocketAddr, path: &str, timeout: Duration) -> bool {
    let client = reqwest::blocking::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .timeout(timeout)
        .build();
    let Ok(client) = client else {
        return false;
    };
    client
        .get(format!("https://{addr}{path}"))
        .header("User-Agent", "kube-probe/1.33")
        .send()
        .is_ok_and(|r| (200..400).contains(&r.status().as_u16()))
}

/// `GET path` on `addr`; a 2xx or 3xx answer within `timeout` passes.
fn http_get_at(addr: SocketAddr, path: &str, timeout: Duration) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, timeout) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = stream.set_write_timeout(Some(timeout));
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: kube-probe/1.33\r\n\
         Accept: */*\r\nConnection: close\r\n\r\n"
    );
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 16];
    let mut read = 0;
    while read < head.len() {
        match stream.read(&mut head[read..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => read += n,
        }
    }
    let line = String::from_utf8_lossy(&head[..read]);
    let status = line.split(' ').nth(1).and_then(|s| s.parse::<u16>().ok());
    status.is_some_and(|s| (200..400).contains(&s))
}

/// What the probes say after a tick.
enum Verdict {
    Fine,
    Restart(&'static str),
}

/// The container's probes.
struct Probes {
    startup: Option<Probe>,
    readiness: Option<Probe>,
    liveness: Option<Probe>,
}

/// Runs the replica pod `pod` until `stop` is set, then stops its container and marks the
/// pod deleted.
pub fn run(core: &Arc<Core>, pod: &Key, input: &PodInput, stop: &AtomicBool) {
    let stopped = || stop.load(Ordering::SeqCst) || core.shutting_down();
    let grace = Duration::from_secs(
        input
            .spec
            .termination_grace_period_seconds
            .unwrap_or(30)
            .max(0) as u64,
    );
    let port: u16 = input
        .overrides
        .iter()
        .find(|(k, _)| k == "FUNC_PORT")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    // The ReplicaSet controller creates the Pod object first.
    let Some(admitted) = admit(core, pod, input, &stopped) else {
        core.update_pod(pod, |p| p.deleted = true);
        return;
    };
    let input = &admitted;
    let container = &input.spec.containers[0];
    core.update_pod(pod, |p| {
        p.start_time = Some(k8s_openapi::jiff::Timestamp::now());
        p.phase = "Pending";
    });
    let mut crashes: u32 = 0;
    while !stopped() {
        let objects = core.lock().objects.clone();
        let prepared = match plan::prepare(&core.config, &core.token, input, &objects) {
            Ok(prepared) => prepared,
            Err(e) => {
                core.update_pod(pod, |p| {
                    p.main[0].state = State::Waiting {
                        reason: e.reason.into(),
                        message: Some(e.message.clone()),
                    };
                });
                wait(Duration::from_millis(200), &stopped);
                continue;
            }
        };
        let config = &core.config;
        let home = plan::pod_dir(&config.scratch, &pod.0, &pod.1).join("home");
        let plan = &prepared.main[0];
        let mut process = match Process::start(&config.kiln, config.sandbox.as_deref(), &home, plan)
        {
            Ok(process) => process,
            Err(e) => {
                let message = format!("starting {}: {e}", config.kiln.display());
                core.update_pod(pod, |p| {
                    p.main[0].state = State::Waiting {
                        reason: "RunContainerError".into(),
                        message: Some(message),
                    };
                });
                wait(BACKOFF_START, &stopped);
                continue;
            }
        };
        let started = Instant::now();
        let probe = |p: &K8sProbe| Probe::new(p, container, &input.ip, port, started);
        let mut probes = Probes {
            startup: container.startup_probe.as_ref().map(probe),
            readiness: container.readiness_probe.as_ref().map(probe),
            liveness: container.liveness_probe.as_ref().map(probe),
        };
        let id = random_suffix(12);
        core.update_pod(pod, |p| {
            p.phase = "Running";
            let c = &mut p.main[0];
            c.id = id;
            c.state = State::Running(process.started_at);
            c.started = probes.startup.is_none();
            c.ready = c.started && probes.readiness.is_none();
        });
        let exit = loop {
            if stopped() {
                let exit = process.stop(grace);
                core.update_pod(pod, |p| {
                    p.main[0].state = State::Terminated(exit);
                    p.main[0].ready = false;
                    p.deleted = true;
                });
                return;
            }
            if let Some(exit) = process.try_exit() {
                break exit;
            }
            if let Verdict::Restart(why) = tick(core, pod, &mut probes) {
                let mut exit = process.stop(grace);
                exit.message.get_or_insert_with(|| why.to_string());
                break exit;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if started.elapsed() > Duration::from_secs(600) {
            crashes = 0;
        }
        crashes += 1;
        let backoff = match crashes {
            1 => Duration::ZERO,
            n => (BACKOFF_START * 2u32.saturating_pow(n - 2)).min(BACKOFF_MAX),
        };
        record_crash(core, pod, exit, backoff);
        wait(backoff, &stopped);
    }
    core.update_pod(pod, |p| p.deleted = true);
}

fn record_crash(core: &Core, pod: &Key, exit: Exit, backoff: Duration) {
    core.update_pod(pod, |p| {
        let (ns, name) = (
            p.meta.namespace.clone().unwrap_or_default(),
            p.name().to_string(),
        );
        let c = &mut p.main[0];
        c.last = Some(exit.clone());
        c.restarts += 1;
        c.ready = false;
        c.started = false;
        c.state = if backoff.is_zero() {
            State::Terminated(exit)
        } else {
            let message = format!(
                "back-off {}s restarting failed container={} pod={name}_{ns}",
                backoff.as_secs(),
                c.name
            );
            State::Waiting {
                reason: "CrashLoopBackOff".into(),
                message: Some(message),
            }
        };
    });
}

/// Runs the probes that are due and records readiness.
fn tick(core: &Core, pod: &Key, probes: &mut Probes) -> Verdict {
    let now = Instant::now();
    let mut started = probes.startup.is_none();
    if let Some(startup) = &mut probes.startup {
        match startup.poll(now) {
            Some(true) => {
                started = true;
                probes.startup = None;
            }
            _ if startup.given_up(now) => return Verdict::Restart("Startup probe failed"),
            _ => {}
        }
    }
    if !started {
        return Verdict::Fine;
    }
    if let Some(liveness) = &mut probes.liveness {
        liveness.poll(now);
        if liveness.given_up(now) {
            return Verdict::Restart("Liveness probe failed");
        }
    }
    let ready = match &mut probes.readiness {
        None => Some(true),
        Some(readiness) => match readiness.poll(now) {
            Some(true) if readiness.successes >= readiness.success_threshold => Some(true),
            Some(false) if readiness.given_up(now) => Some(false),
            _ => None,
        },
    };
    let mut state = core.lock();
    if let Some(p) = state.pods.get_mut(pod) {
        let c = &mut p.main[0];
        let changed = !c.started || ready.is_some_and(|r| r != c.ready);
        c.started = true;
        if let Some(ready) = ready {
            c.ready = ready;
        }
        if changed {
            p.touch();
        }
    }
    Verdict::Fine
}

/// Sleeps up to `how_long`, waking early when `stopped`.
fn wait(how_long: Duration, stopped: &dyn Fn() -> bool) {
    let until = Instant::now() + how_long;
    while Instant::now() < until && !stopped() {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Creates pod `pod`'s object through the API server when the kubelet has one (the Job and
/// ReplicaSet controllers' part), retrying every second while admission refuses it (the pod
/// does not run meanwhile, and the refusal is kept on its record); returns what to run: the
/// spec as admitted, with its ServiceAccount token. `None` when it was stopped first.
pub(crate) fn admit(
    core: &Core,
    pod: &Key,
    input: &PodInput,
    stopped: &dyn Fn() -> bool,
) -> Option<PodInput> {
    let Some(admission) = core.admission() else {
        return Some(input.clone());
    };
    loop {
        let object = core
            .lock()
            .pods
            .get(pod)
            .map(super::pod::PodRecord::to_pod)?;
        match admission(&object) {
            Ok(admitted) => {
                let mut state = core.lock();
                if let Some(p) = state.pods.get_mut(pod) {
                    p.admission = Admission::Admitted(Instant::now());
                    let node = p.spec.node_name.clone();
                    p.spec = admitted.spec.clone();
                    p.spec.node_name = node;
                    p.touch();
                }
                // The object exists; the API layer writes only its status from now on.
                state.written.insert(pod.clone(), serde_json::Value::Null);
                return Some(PodInput {
                    spec: admitted.spec,
                    admitted: true,
                    sa_token: admitted.token,
                    ..input.clone()
                });
            }
            Err(message) => {
                core.update_pod(pod, |p| p.admission = Admission::Pending(Some(message)))
            }
        }
        wait(Duration::from_secs(1), stopped);
        if stopped() {
            return None;
        }
    }
}
