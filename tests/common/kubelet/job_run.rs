//! The thread of one Job pod: wait for a Job slot, set the pod up (retrying while a
//! ConfigMap or Secret is missing), run the init containers in order and then the container,
//! and kill it at the Job's deadline.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

use super::container::{Exit, Process};
use super::job::Outcome;
use super::plan::{self, PodInput};
use super::pod::{ContainerRecord, PodRecord, State};
use super::{Core, Key, random_suffix};

/// Why a container run ended early.
enum Ended {
    Exited(Exit),
    Deadline(Exit),
    Stopped,
}

/// Whole seconds, negative as zero.
pub fn secs(s: i64) -> Duration {
    Duration::from_secs(u64::try_from(s).unwrap_or(0))
}

/// Runs the pod to its end; `None` when it was stopped (Job deleted, kubelet dropped).
pub fn run_pod(
    core: &Arc<Core>,
    pod: &Key,
    input: &PodInput,
    deadline: Option<Instant>,
    grace: Duration,
    stop: &AtomicBool,
) -> Option<Outcome> {
    let past_deadline = || deadline.is_some_and(|d| Instant::now() >= d);
    let stopped = || stop.load(Ordering::SeqCst) || core.shutting_down();
    // The Job controller creates the Pod object; admission may refuse it until the deadline.
    let Some(admitted) = super::runner::admit(core, pod, input, &|| stopped() || past_deadline())
    else {
        return (!stopped()).then(|| fail_deadline(core, pod));
    };
    let input = &admitted;
    let slot = core.acquire_slot(|| past_deadline() || stopped());
    if slot.is_none() {
        return (!stopped()).then(|| fail_deadline(core, pod));
    }
    core.update_pod(pod, |p| {
        p.unschedulable = None;
        p.start_time = Some(Timestamp::now());
    });
    let prepared = loop {
        let objects = core.lock().objects.clone();
        match plan::prepare(&core.config, &core.token, input, &objects) {
            Ok(prepared) => break prepared,
            Err(e) => core.update_pod(pod, |p| {
                let first = p.init.iter_mut().chain(p.main.iter_mut()).next();
                if let Some(c) = first {
                    c.state = State::Waiting {
                        reason: e.reason.into(),
                        message: Some(e.message.clone()),
                    };
                }
            }),
        }
        if stopped() {
            return None;
        }
        if past_deadline() {
            return Some(fail_deadline(core, pod));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let containers = prepared
        .init
        .iter()
        .map(|p| (true, p))
        .chain(prepared.main.iter().map(|p| (false, p)));
    for (index, (init, plan)) in containers.enumerate() {
        let ended = run_container(core, pod, init, index, plan, deadline, grace, &stopped);
        match ended {
            Ended::Exited(exit) if exit.code == 0 => continue,
            Ended::Exited(_) => {
                core.update_pod(pod, |p| p.phase = "Failed");
                let message = "Job has reached the specified backoff limit";
                return Some(Outcome::Failed {
                    at: Timestamp::now(),
                    reason: "BackoffLimitExceeded",
                    message,
                });
            }
            Ended::Deadline(_) => return Some(fail_deadline(core, pod)),
            Ended::Stopped => return None,
        }
    }
    core.update_pod(pod, |p| p.phase = "Succeeded");
    drop(slot);
    Some(Outcome::Succeeded(Timestamp::now()))
}

/// Marks the pod failed for the Job's deadline.
fn fail_deadline(core: &Core, pod: &Key) -> Outcome {
    core.update_pod(pod, |p| {
        p.phase = "Failed";
        p.reason = Some("DeadlineExceeded".into());
        p.message = Some("Pod was active on the node longer than the specified deadline".into());
    });
    Outcome::Failed {
        at: Timestamp::now(),
        reason: "DeadlineExceeded",
        message: "Job was active longer than specified deadline",
    }
}

/// The container record `index` (counting init containers first).
fn record(p: &mut PodRecord, init: bool, index: usize) -> &mut ContainerRecord {
    if init {
        &mut p.init[index]
    } else {
        let at = index - p.init.len();
        &mut p.main[at]
    }
}

#[allow(clippy::too_many_arguments)]
fn run_container(
    core: &Core,
    pod: &Key,
    init: bool,
    index: usize,
    plan: &super::container::Plan,
    deadline: Option<Instant>,
    grace: Duration,
    stopped: &dyn Fn() -> bool,
) -> Ended {
    let config = &core.config;
    let home = plan::pod_dir(&config.scratch, &pod.0, &pod.1).join("home");
    let started = Process::start(&config.kiln, config.sandbox.as_deref(), &home, plan);
    let mut process = match started {
        Ok(process) => process,
        Err(e) => {
            let message = format!("starting {}: {e}", config.kiln.display());
            core.update_pod(pod, |p| {
                let c = record(p, init, index);
                c.state = State::Waiting {
                    reason: "RunContainerError".into(),
                    message: Some(message),
                };
            });
            return Ended::Exited(Exit {
                code: 128,
                reason: "ContainerCannotRun".into(),
                message: None,
                started_at: Timestamp::now(),
                finished_at: Timestamp::now(),
            });
        }
    };
    let id = random_suffix(12);
    core.update_pod(pod, |p| {
        if !init {
            p.phase = "Running";
        }
        let c = record(p, init, index);
        c.id = id;
        c.state = State::Running(process.started_at);
        c.started = true;
        c.ready = !init;
    });
    let ended = loop {
        if let Some(exit) = process.try_exit() {
            break Ended::Exited(exit);
        }
        if stopped() {
            process.stop(Duration::ZERO);
            return Ended::Stopped;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break Ended::Deadline(process.stop(grace));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if let Ended::Exited(exit) | Ended::Deadline(exit) = &ended {
        let exit = exit.clone();
        core.update_pod(pod, |p| {
            let c = record(p, init, index);
            c.state = State::Terminated(exit);
            c.ready = false;
        });
    }
    ended
}
