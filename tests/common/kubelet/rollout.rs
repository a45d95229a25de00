//! The Deployment controller's rolling-update arithmetic, pure: how `maxSurge` and
//! `maxUnavailable` resolve for a number of replicas, and one step of a rollout (which pods
//! to start and stop so that at most `replicas + maxSurge` run and at least
//! `replicas - maxUnavailable` stay ready).

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::replica::{Replica, WorkloadRecord};

/// What one rollout step does: how many pods of the current template to start, and which
/// pods (indices into `record.pods`) to stop.
pub(crate) struct Step {
    /// Pods of the current template to start.
    pub start: i32,
    /// Indices into the record's pods to stop.
    pub stop: Vec<usize>,
}

/// One step of the Deployment controller's rolling update (its ReplicaSets' scaling) over
/// `record`'s pods, `ready` telling which are ready.
pub(crate) fn rollout(record: &WorkloadRecord, ready: &dyn Fn(&Replica) -> bool) -> Step {
    let n = record.replicas;
    let current = |r: &Replica| r.hash == record.template_hash;
    let count = |f: &dyn Fn(&Replica) -> bool| {
        i32::try_from(record.pods.iter().filter(|r| f(r)).count()).unwrap_or(i32::MAX)
    };
    let new = count(&current);
    let old = count(&|r| !current(r));
    let mut stop = Vec::new();
    // Scale the new ReplicaSet up within the surge.
    let start = (n - new).min(n + record.max_surge - new - old).max(0);
    // Too many new pods (scaled down): stop the extra ones, unready first.
    let mut extra = new - n;
    for want_ready in [false, true] {
        for (i, r) in record.pods.iter().enumerate() {
            if extra > 0 && current(r) && ready(r) == want_ready {
                stop.push(i);
                extra -= 1;
            }
        }
    }
    // Scale old ReplicaSets down: unready pods cost no availability; ready ones only while
    // the others keep `replicas - maxUnavailable` available.
    let mut available = record
        .pods
        .iter()
        .enumerate()
        .filter(|(i, r)| ready(r) && !stop.contains(i))
        .count();
    let available_min = usize::try_from(record.min_available()).unwrap_or(0);
    for want_ready in [false, true] {
        for (i, r) in record.pods.iter().enumerate() {
            if current(r) || ready(r) != want_ready {
                continue;
            }
            if !want_ready {
                stop.push(i);
            } else if available > available_min {
                stop.push(i);
                available -= 1;
            }
        }
    }
    Step { start, stop }
}

/// `maxSurge` and `maxUnavailable` of the rollout strategy, resolved as the Deployment
/// controller does: percentages of `replicas` (25% by default), surge rounded up,
/// unavailability down, and not both 0 (then 1 may be unavailable). Recreate: 0 surge,
/// everything unavailable.
pub(crate) fn fenceposts(
    spec: &k8s_openapi::api::apps::v1::DeploymentSpec,
    replicas: i32,
) -> (i32, i32) {
    let strategy = spec.strategy.clone().unwrap_or_default();
    if strategy.type_.as_deref() == Some("Recreate") {
        return (0, replicas);
    }
    let rolling = strategy.rolling_update.unwrap_or_default();
    let resolve = |value: Option<IntOrString>, round_up: bool| match value {
        Some(IntOrString::Int(n)) => n,
        Some(IntOrString::String(p)) => {
            let percent: i32 = p.trim_end_matches('%').parse().unwrap_or(25);
            scaled(replicas, percent, round_up)
        }
        None => scaled(replicas, 25, round_up),
    };
    let surge = resolve(rolling.max_surge, true);
    let unavailable = resolve(rolling.max_unavailable, false);
    if surge == 0 && unavailable == 0 {
        (0, 1)
    } else {
        (surge, unavailable)
    }
}

fn scaled(replicas: i32, percent: i32, round_up: bool) -> i32 {
    let product = replicas * percent;
    if round_up {
        (product + 99) / 100
    } else {
        product / 100
    }
}
