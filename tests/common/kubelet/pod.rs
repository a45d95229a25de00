//! The state of one pod as the kubelet tracks it (phase, each container's state, restarts,
//! readiness) and the Pod object it turns into: metadata, spec and a `status` with phase,
//! conditions, `initContainerStatuses` and `containerStatuses`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ContainerState as K8sState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, Pod, PodCondition, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

use super::container::Exit;

/// The node every pod runs on.
pub const NODE_NAME: &str = "kiln-test-kubelet";

/// A container's current state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Not started (yet): `PodInitializing`, `ContainerCreating`, `CrashLoopBackOff`, …
    Waiting {
        /// The reason.
        reason: String,
        /// Details.
        message: Option<String>,
    },
    /// Running since then.
    Running(Timestamp),
    /// Ended.
    Terminated(Exit),
}

/// One container's record.
#[derive(Clone, Debug)]
pub struct ContainerRecord {
    /// Its name.
    pub name: String,
    /// Its image, as the spec gives it.
    pub image: String,
    /// Now.
    pub state: State,
    /// The previous run, after a restart.
    pub last: Option<Exit>,
    /// Restarts so far.
    pub restarts: i32,
    /// Passed its readiness probe (or running, without one).
    pub ready: bool,
    /// Passed its startup probe (or running, without one).
    pub started: bool,
    /// A stable id per run, for `containerID`.
    pub id: String,
}

impl ContainerRecord {
    /// A container that waits with `reason`.
    pub fn waiting(name: &str, image: &str, reason: &str) -> ContainerRecord {
        ContainerRecord {
            name: name.into(),
            image: image.into(),
            state: State::Waiting {
                reason: reason.into(),
                message: None,
            },
            last: None,
            restarts: 0,
            ready: false,
            started: false,
            id: String::new(),
        }
    }

    fn status(&self) -> ContainerStatus {
        let running = matches!(self.state, State::Running(_));
        ContainerStatus {
            name: self.name.clone(),
            image: self.image.clone(),
            image_id: String::new(),
            container_id: (!self.id.is_empty()).then(|| format!("kiln://{}", self.id)),
            ready: self.ready,
            restart_count: self.restarts,
            started: Some(running && self.started),
            state: Some(to_k8s(&self.state, &self.id)),
            last_state: Some(
                self.last
                    .as_ref()
                    .map(|e| to_k8s(&State::Terminated(e.clone()), &self.id))
                    .unwrap_or_default(),
            ),
            ..ContainerStatus::default()
        }
    }
}

fn to_k8s(state: &State, id: &str) -> K8sState {
    match state {
        State::Waiting { reason, message } => K8sState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.clone()),
                message: message.clone(),
            }),
            ..K8sState::default()
        },
        State::Running(at) => K8sState {
            running: Some(ContainerStateRunning {
                started_at: Some(Time(*at)),
            }),
            ..K8sState::default()
        },
        State::Terminated(exit) => K8sState {
            terminated: Some(ContainerStateTerminated {
                exit_code: exit.code,
                reason: Some(exit.reason.clone()),
                message: exit.message.clone(),
                started_at: Some(Time(exit.started_at)),
                finished_at: Some(Time(exit.finished_at)),
                container_id: (!id.is_empty()).then(|| format!("kiln://{id}")),
                ..ContainerStateTerminated::default()
            }),
            ..K8sState::default()
        },
    }
}

/// A pod's object and the API server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// No API server (the core alone): the API layer creates the object, if one runs.
    NotNeeded,
    /// Not created yet; the last refusal, if any (the pod does not run meanwhile).
    Pending(Option<String>),
    /// Created: the API server admitted it, then.
    Admitted(std::time::Instant),
}

/// A pod the kubelet runs.
#[derive(Clone, Debug)]
pub struct PodRecord {
    /// Name, namespace, labels, annotations, owner references.
    pub meta: ObjectMeta,
    /// The spec it was created from (`nodeName` set).
    pub spec: PodSpec,
    /// `Pending`, `Running`, `Succeeded` or `Failed`.
    pub phase: &'static str,
    /// `None` while it waits for a slot, with the reason.
    pub unschedulable: Option<String>,
    /// When it started on the node.
    pub start_time: Option<Timestamp>,
    /// Init containers, in order.
    pub init: Vec<ContainerRecord>,
    /// Containers.
    pub main: Vec<ContainerRecord>,
    /// Pod-level reason (e.g. `DeadlineExceeded`).
    pub reason: Option<String>,
    /// Pod-level message.
    pub message: Option<String>,
    /// Bumped on every change; the API layer writes when it moved.
    pub version: u64,
    /// The pod is gone; the API layer deletes the object.
    pub deleted: bool,
    /// The host port the Function listens on (replicas).
    pub port: Option<u16>,
    /// Its IP (`status.podIP`), a loopback address of its own.
    pub ip: String,
    /// Where its object stands with the API server.
    pub admission: Admission,
    /// Condition type → (status, last transition).
    transitions: BTreeMap<&'static str, (bool, Timestamp)>,
    created: Timestamp,
}

impl PodRecord {
    /// A new pending pod waiting for a slot (or scheduled, when `unschedulable` is `None`),
    /// with IP `ip`.
    pub fn new(
        meta: ObjectMeta,
        mut spec: PodSpec,
        unschedulable: Option<String>,
        ip: String,
    ) -> PodRecord {
        spec.node_name = Some(NODE_NAME.into());
        let record = |c: &k8s_openapi::api::core::v1::Container, reason: &str| {
            ContainerRecord::waiting(&c.name, c.image.as_deref().unwrap_or(""), reason)
        };
        let init_reason = "PodInitializing";
        let init = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| record(c, init_reason))
            .collect();
        let main_reason = if spec.init_containers.iter().flatten().next().is_some() {
            "PodInitializing"
        } else {
            "ContainerCreating"
        };
        let main = spec
            .containers
            .iter()
            .map(|c| record(c, main_reason))
            .collect();
        let mut pod = PodRecord {
            meta,
            spec,
            phase: "Pending",
            unschedulable,
            start_time: None,
            init,
            main,
            reason: None,
            message: None,
            version: 1,
            deleted: false,
            port: None,
            ip,
            admission: Admission::NotNeeded,
            transitions: BTreeMap::new(),
            created: Timestamp::now(),
        };
        pod.touch();
        pod
    }

    /// The pod's name.
    pub fn name(&self) -> &str {
        self.meta.name.as_deref().unwrap_or("")
    }

    /// Whether every container is ready (the pod's Ready condition).
    pub fn ready(&self) -> bool {
        self.phase == "Running" && self.main.iter().all(|c| c.ready)
    }

    /// Records a change: recomputes condition transitions and bumps [`PodRecord::version`].
    pub fn touch(&mut self) {
        let initialized = self
            .init
            .iter()
            .all(|c| matches!(&c.state, State::Terminated(e) if e.code == 0));
        let ready = self.ready();
        let now = Timestamp::now();
        let created = self.created;
        for (kind, value) in [
            ("PodScheduled", self.unschedulable.is_none()),
            ("Initialized", initialized),
            ("ContainersReady", ready),
            ("Ready", ready),
        ] {
            let entry = self.transitions.entry(kind).or_insert((value, created));
            if entry.0 != value {
                *entry = (value, now);
            }
        }
        self.version += 1;
    }

    /// The Pod object, status included.
    pub fn to_pod(&self) -> Pod {
        let conditions = self
            .transitions
            .iter()
            .map(|(kind, (value, at))| {
                let (reason, message) = match (*kind, value) {
                    ("PodScheduled", false) => {
                        (Some("Unschedulable".into()), self.unschedulable.clone())
                    }
                    ("Initialized", false) => (Some("ContainersNotInitialized".into()), None),
                    ("ContainersReady" | "Ready", false) => {
                        (Some("ContainersNotReady".into()), None)
                    }
                    _ => (None, None),
                };
                PodCondition {
                    type_: kind.to_string(),
                    status: if *value { "True" } else { "False" }.into(),
                    last_transition_time: Some(Time(*at)),
                    reason,
                    message,
                    ..PodCondition::default()
                }
            })
            .collect();
        let statuses =
            |list: &[ContainerRecord]| list.iter().map(ContainerRecord::status).collect();
        let scheduled = self.unschedulable.is_none();
        let status = PodStatus {
            phase: Some(self.phase.into()),
            conditions: Some(conditions),
            reason: self.reason.clone(),
            message: self.message.clone(),
            host_ip: scheduled.then(|| "127.0.0.1".into()),
            pod_ip: scheduled.then(|| self.ip.clone()),
            start_time: self.start_time.map(Time),
            init_container_statuses: (!self.init.is_empty()).then(|| statuses(&self.init)),
            container_statuses: Some(statuses(&self.main)),
            ..PodStatus::default()
        };
        Pod {
            metadata: self.meta.clone(),
            spec: Some(self.spec.clone()),
            status: Some(status),
        }
    }
}
