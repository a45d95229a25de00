//! The status the Deployment controller (Available, Progressing, ReplicaFailure, replica
//! counts) writes for a workload's replicas, and Knative Serving (ConfigurationsReady, Ready,
//! RoutesReady, url, revisions) for its current revision's replica.

use k8s_openapi::api::apps::v1::{DeploymentCondition, DeploymentStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use super::pod::{Admission, PodRecord};
use super::replica::WorkloadRecord;

/// The Deployment status the Deployment controller writes for `record` and its pods, each
/// with whether it runs the current template.
pub fn deployment(
    record: &mut WorkloadRecord,
    name: &str,
    pods: &[(bool, &PodRecord)],
) -> DeploymentStatus {
    let live: Vec<&(bool, &PodRecord)> = pods.iter().filter(|(_, p)| !p.deleted).collect();
    let total = len(live.len());
    let updated = len(live.iter().filter(|(new, _)| *new).count());
    let available = len(live.iter().filter(|(_, p)| p.ready()).count());
    let new_available = len(live.iter().filter(|(new, p)| *new && p.ready()).count());
    let refused = live.iter().find_map(|(_, p)| match &p.admission {
        Admission::Pending(Some(message)) => Some(message.clone()),
        _ => None,
    });
    let count = |n: i32| (n > 0).then_some(n);
    let rs = record.revision_name(name);
    let ok = available >= record.min_available();
    let (a_status, a_reason, a_message) = if ok {
        (
            "True",
            "MinimumReplicasAvailable",
            "Deployment has minimum availability.".to_string(),
        )
    } else {
        (
            "False",
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability.".to_string(),
        )
    };
    let complete =
        updated == record.replicas && total == record.replicas && new_available == record.replicas;
    let (p_status, p_reason, p_message) = if complete {
        (
            "True",
            "NewReplicaSetAvailable",
            format!("ReplicaSet {rs:?} has successfully progressed."),
        )
    } else if record.changed_at.elapsed().as_secs() > record.progress_deadline {
        (
            "False",
            "ProgressDeadlineExceeded",
            format!("ReplicaSet {rs:?} has timed out progressing."),
        )
    } else {
        (
            "True",
            "ReplicaSetUpdated",
            format!("ReplicaSet {rs:?} is progressing."),
        )
    };
    let mut condition = |kind: &'static str, status: &str, reason: &str, message: String| {
        let at = record.transition(kind, format!("{status}/{reason}"));
        DeploymentCondition {
            type_: kind.into(),
            status: status.into(),
            reason: Some(reason.into()),
            message: Some(message),
            last_transition_time: Some(Time(at)),
            last_update_time: Some(Time(at)),
        }
    };
    let mut conditions = vec![
        condition("Available", a_status, a_reason, a_message),
        condition("Progressing", p_status, p_reason, p_message),
    ];
    // The ReplicaSet controller could not create a pod: admission refused it.
    if let Some(message) = refused {
        conditions.push(condition("ReplicaFailure", "True", "FailedCreate", message));
    }
    DeploymentStatus {
        observed_generation: record.generation,
        replicas: count(total),
        updated_replicas: count(updated),
        ready_replicas: count(available),
        available_replicas: count(available),
        unavailable_replicas: count(record.replicas - available),
        conditions: Some(conditions),
        ..DeploymentStatus::default()
    }
}

fn len(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The `status` Knative Serving writes for the Service of `record` and its pod.
pub fn knative(
    record: &mut WorkloadRecord,
    ns: &str,
    name: &str,
    pod: Option<&PodRecord>,
) -> Value {
    let ready = pod.is_some_and(PodRecord::ready);
    let revision = record.revision_name(name);
    let crashed = pod.and_then(|p| p.main.iter().find(|c| c.restarts > 0 && !c.ready));
    let (status, reason, message) = match (ready, crashed) {
        (true, _) => ("True", None, None),
        (false, Some(c)) => {
            let why = c
                .last
                .as_ref()
                .and_then(|e| e.message.clone())
                .unwrap_or_else(|| "Container failed".into());
            (
                "False",
                Some("RevisionFailed"),
                Some(format!("Revision {revision:?} failed with message: {why}.")),
            )
        }
        (false, None) => (
            "Unknown",
            Some("RevisionMissing"),
            Some(format!(
                "Configuration {name:?} is waiting for a Revision to become ready."
            )),
        ),
    };
    let mut conditions = Vec::new();
    for kind in ["ConfigurationsReady", "Ready", "RoutesReady"] {
        let at = record.transition(kind, format!("{status}/{reason:?}"));
        let mut c = json!({"type": kind, "status": status, "lastTransitionTime": Time(at)});
        if let (Some(r), Some(m)) = (reason, &message) {
            c["reason"] = json!(r);
            c["message"] = json!(m);
        }
        conditions.push(c);
    }
    let domain = if record.cluster_local {
        "svc.cluster.local"
    } else {
        "example.com"
    };
    let mut status = json!({
        "observedGeneration": record.generation,
        "conditions": conditions,
        "latestCreatedRevisionName": revision,
        "url": format!("http://{name}.{ns}.{domain}"),
        "address": {"url": format!("http://{name}.{ns}.svc.cluster.local")},
    });
    if ready {
        status["latestReadyRevisionName"] = json!(revision);
        status["traffic"] =
            json!([{"revisionName": revision, "latestRevision": true, "percent": 100}]);
    }
    status
}
