//! Status conditions, Kyma's types and reasons: ConfigurationReady, BuildReady and Running,
//! each True/False/Unknown with a CamelCase reason. Setting one keeps `lastTransitionTime`
//! unless the status changes, and reports whether anything changed, so the reconciler can
//! emit an Event per change and skip the status write when nothing did. Pure.

use super::crd::{Condition, FunctionStatus};

/// The condition types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The source (ConfigMap or git commit) is in place.
    ConfigurationReady,
    /// The image is built.
    BuildReady,
    /// The Function runs.
    Running,
}

impl Kind {
    /// The condition's `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::ConfigurationReady => "ConfigurationReady",
            Kind::BuildReady => "BuildReady",
            Kind::Running => "Running",
        }
    }
}

/// A condition's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Done.
    True,
    /// Failed.
    False,
    /// In progress.
    Unknown,
}

impl State {
    /// The condition's `status`.
    pub fn as_str(self) -> &'static str {
        match self {
            State::True => "True",
            State::False => "False",
            State::Unknown => "Unknown",
        }
    }
}

/// Kyma's reasons (serverless@legacy), and kiln's few additions.
pub mod reason {
    /// An Event, not a condition: the Function's runtime is one of Kyma's names that kiln
    /// builds on another of its runtimes.
    pub const RUNTIME_SUBSTITUTED: &str = "RuntimeSubstituted";
    /// ConfigurationReady: the source ConfigMap was created.
    pub const CONFIGMAP_CREATED: &str = "ConfigMapCreated";
    /// ConfigurationReady: the source ConfigMap was updated.
    pub const CONFIGMAP_UPDATED: &str = "ConfigMapUpdated";
    /// ConfigurationReady: a git source resolved to a new commit.
    pub const SOURCE_UPDATED: &str = "SourceUpdated";
    /// ConfigurationReady=False: the git source could not be resolved.
    pub const SOURCE_UPDATE_FAILED: &str = "SourceUpdateFailed";
    /// ConfigurationReady=False: the spec is invalid.
    pub const INVALID_FUNCTION_SPEC: &str = "InvalidFunctionSpec";
    /// BuildReady=Unknown: the build Job was created.
    pub const JOB_CREATED: &str = "JobCreated";
    /// BuildReady=Unknown: the build Job runs.
    pub const JOB_RUNNING: &str = "JobRunning";
    /// BuildReady=Unknown: waiting for a build slot (kiln).
    pub const JOB_QUEUED: &str = "JobQueued";
    /// BuildReady=True: the build Job finished.
    pub const JOB_FINISHED: &str = "JobFinished";
    /// BuildReady=False: the build Job failed.
    pub const JOB_FAILED: &str = "JobFailed";
    /// BuildReady=False: the Job's image has no provenance by the image signing key for this
    /// build (`--require-provenance`; kiln).
    pub const PROVENANCE_INVALID: &str = "ProvenanceInvalid";
    /// BuildReady=True: the registry already had the image (kiln).
    pub const IMAGE_FOUND: &str = "ImageFound";
    /// BuildReady=True: the runtime's base changed and the image was rebased onto it, with
    /// no build Job (kiln).
    pub const IMAGE_REBASED: &str = "ImageRebased";
    /// BuildReady=Unknown: rebasing onto the runtime's new base waits for a rollout slot
    /// (`--max-concurrent-rollouts`; kiln).
    pub const REBASE_QUEUED: &str = "RebaseQueued";
    /// BuildReady=True: a newer base (or builder) image is available, and the Function stays
    /// on the one it was built on (its opt-out annotation, or the controller's dry run; kiln).
    pub const NEWER_BASE_AVAILABLE: &str = "NewerBaseAvailable";
    /// An Event: the runtime's base changed and the image must be built again, with why a
    /// rebase would not do (kiln).
    pub const REBUILD_FOR_BASE: &str = "RebuildForNewBase";
    /// An Event: a rebase that was safe failed to push; the image is built instead (kiln).
    pub const REBASE_FAILED: &str = "RebaseFailed";
    /// BuildReady=False: the base or builder image could not be resolved (kiln).
    pub const IMAGE_UNRESOLVED: &str = "ImageUnresolved";
    /// Running=Unknown: the Deployment was created.
    pub const DEPLOYMENT_CREATED: &str = "DeploymentCreated";
    /// Running=Unknown: the Deployment was updated.
    pub const DEPLOYMENT_UPDATED: &str = "DeploymentUpdated";
    /// Running=Unknown: the Deployment is rolling out.
    pub const DEPLOYMENT_WAITING: &str = "DeploymentWaiting";
    /// Running=True: the Deployment is available.
    pub const DEPLOYMENT_READY: &str = "DeploymentReady";
    /// Running=Unknown: fewer Pods are available than wanted.
    pub const MIN_REPLICAS_NOT_AVAILABLE: &str = "MinReplicasNotAvailable";
    /// Running=False: the Deployment failed to progress.
    pub const DEPLOYMENT_FAILED: &str = "DeploymentFailed";
    /// Running=Unknown: waiting for the image (kiln).
    pub const WAITING_FOR_BUILD: &str = "WaitingForBuild";
    /// Running: the Knative Service's Ready condition (kiln's Knative option).
    pub const SERVICE_READY: &str = "ServiceReady";
    /// Running=Unknown: the Knative Service is not ready yet.
    pub const SERVICE_WAITING: &str = "ServiceWaiting";
    /// Running=False: the Knative Service failed.
    pub const SERVICE_FAILED: &str = "ServiceFailed";
}

/// A condition change, for the Event it becomes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// Which condition.
    pub kind: Kind,
    /// Its new status.
    pub state: State,
    /// Its reason.
    pub reason: String,
    /// Its message.
    pub message: String,
}

/// Sets condition `kind` on `status`; returns the change if status, reason or message
/// differ from before. `now` (RFC 3339) becomes `lastTransitionTime` when the status flips.
pub fn set(
    status: &mut FunctionStatus,
    kind: Kind,
    state: State,
    reason: &str,
    message: impl Into<String>,
    now: &str,
) -> Option<Change> {
    let message = message.into();
    let existing = status
        .conditions
        .iter_mut()
        .find(|c| c.type_ == kind.as_str());
    let change = Change {
        kind,
        state,
        reason: reason.into(),
        message: message.clone(),
    };
    match existing {
        Some(c)
            if c.status == state.as_str()
                && c.reason.as_deref() == Some(reason)
                && c.message.as_deref() == Some(message.as_str()) =>
        {
            None
        }
        Some(c) => {
            if c.status != state.as_str() {
                c.last_transition_time = Some(now.into());
            }
            c.status = state.as_str().into();
            c.reason = Some(reason.into());
            c.message = Some(message);
            Some(change)
        }
        None => {
            status.conditions.push(Condition {
                type_: kind.as_str().into(),
                status: state.as_str().into(),
                last_transition_time: Some(now.into()),
                reason: Some(reason.into()),
                message: Some(message),
            });
            // Kyma's order, whatever order they were set in.
            status.conditions.sort_by_key(|c| order(&c.type_));
            Some(change)
        }
    }
}

fn order(type_: &str) -> usize {
    match type_ {
        "ConfigurationReady" => 0,
        "BuildReady" => 1,
        "Running" => 2,
        _ => 3,
    }
}

/// The status of condition `kind`, if set.
pub fn get(status: &FunctionStatus, kind: Kind) -> Option<&Condition> {
    status.conditions.iter().find(|c| c.type_ == kind.as_str())
}

/// Whether condition `kind` is True.
pub fn is_true(status: &FunctionStatus, kind: Kind) -> bool {
    get(status, kind).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_changes_its_transition_time_only_when_its_status_flips() {
        let mut s = FunctionStatus::default();
        let c = set(
            &mut s,
            Kind::BuildReady,
            State::Unknown,
            reason::JOB_CREATED,
            "m",
            "t1",
        );
        assert!(c.is_some());
        assert!(
            set(
                &mut s,
                Kind::BuildReady,
                State::Unknown,
                reason::JOB_CREATED,
                "m",
                "t2"
            )
            .is_none()
        );
        assert!(
            set(
                &mut s,
                Kind::BuildReady,
                State::Unknown,
                reason::JOB_RUNNING,
                "m",
                "t3"
            )
            .is_some()
        );
        assert_eq!(
            get(&s, Kind::BuildReady)
                .unwrap()
                .last_transition_time
                .as_deref(),
            Some("t1")
        );
        set(
            &mut s,
            Kind::BuildReady,
            State::True,
            reason::JOB_FINISHED,
            "done",
            "t4",
        );
        assert_eq!(
            get(&s, Kind::BuildReady)
                .unwrap()
                .last_transition_time
                .as_deref(),
            Some("t4")
        );
        set(
            &mut s,
            Kind::ConfigurationReady,
            State::True,
            reason::CONFIGMAP_CREATED,
            "",
            "t5",
        );
        let types: Vec<&str> = s.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["ConfigurationReady", "BuildReady"]);
        assert!(is_true(&s, Kind::BuildReady));
    }
}
