//! The status the Deployment controller (Available, Progressing, replica counts) and Knative
//! Serving (ConfigurationsReady, Ready, RoutesReady, url, revisions) write for a workload's
//! one replica.

use k8s_openapi::api::apps::v1::{DeploymentCondition, DeploymentStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use super::pod::PodRecord;
use super::replica::WorkloadRecord;

/// The Deployment status the Deployment controller writes for `record` and its pod.
pub fn deployment(
    record: &mut WorkloadRecord,
    name: &str,
    pod: Option<&PodRecord>,
) -> DeploymentStatus {
    let running = pod.is_some_and(|p| !p.deleted);
    let available = i32::from(pod.is_some_and(PodRecord::ready));
    let count = |n: i32| (n > 0).then_some(n);
    let rs = record.revision_name(name);
    let ok = available >= record.min_available;
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
    let (p_status, p_reason, p_message) = if available >= record.replicas.min(1) {
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
    let conditions = vec![
        condition("Available", a_status, a_reason, a_message),
        condition("Progressing", p_status, p_reason, p_message),
    ];
    DeploymentStatus {
        observed_generation: record.generation,
        replicas: count(i32::from(running)),
        updated_replicas: count(i32::from(running)),
        ready_replicas: count(available),
        available_replicas: count(available),
        unavailable_replicas: count(record.replicas - available),
        conditions: Some(conditions),
        ..DeploymentStatus::default()
    }
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
