//! Deployments and Knative Services: ONE replica of the pod template runs while
//! `spec.replicas` (Knative: always) is at least 1, its port 8080 mapped to a free host port
//! (`FUNC_PORT`, and Knative's `PORT`); a changed template stops it and starts a new pod;
//! deletion stops it. The status is what the Deployment controller (or Knative) writes,
//! counting that one replica honestly.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::plan::PodInput;
use super::pod::PodRecord;
use super::spec::{self, Unsupported, Workload};
use super::{Key, TestKubelet, random_suffix, runner, workload_status};

/// The port a Function listens on in its container (Kyma's `FUNC_PORT`).
pub const FUNCTION_PORT: i32 = 8080;

/// The container port a probe's `port` names (a number, or a named container port).
pub fn probe_port(c: &Container, port: &IntOrString) -> Option<i32> {
    match port {
        IntOrString::Int(n) => Some(*n),
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .map(|p| p.container_port),
    }
}

/// Which API a workload came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// apps/v1 Deployment.
    Deployment,
    /// serving.knative.dev/v1 Service.
    Knative,
}

/// Whether the kubelet implements everything `deployment` asks for, without running it.
///
/// # Errors
/// [`Unsupported`] naming the first field it does not implement.
pub fn check_deployment(deployment: &Deployment) -> Result<(), Unsupported> {
    let spec = deployment.spec.clone().unwrap_or_default();
    spec::check_deployment_spec(&serde_json::to_value(&spec).unwrap_or_default())?;
    let pod_spec = spec.template.spec.unwrap_or_default();
    spec::check_pod_spec(&pod_spec, Workload::Replica, "spec.template.spec")
}

/// Whether the kubelet implements everything a Knative Service (JSON) asks for; its template
/// with Knative's defaults filled in, and the pod spec.
///
/// # Errors
/// [`Unsupported`] naming the first field it does not implement.
pub fn check_knative_service(service: &Value) -> Result<(Value, PodSpec), Unsupported> {
    spec::check_knative_spec(&service["spec"])?;
    let mut template = service["spec"]["template"].clone();
    default_knative_containers(&mut template["spec"]);
    let parsed: PodSpec =
        serde_json::from_value(template["spec"].clone()).map_err(|e| Unsupported {
            field: "spec.template.spec".into(),
            reason: format!("not a pod spec: {e}"),
        })?;
    spec::check_pod_spec(&parsed, Workload::Replica, "spec.template.spec")?;
    Ok((template, parsed))
}

/// The replica running now.
#[derive(Debug)]
pub struct Replica {
    /// Its pod.
    pub pod: Key,
    /// The host port its 8080 is mapped to.
    pub port: u16,
    stop: Arc<AtomicBool>,
}

/// A Deployment or Knative Service the kubelet runs.
#[derive(Debug)]
pub struct WorkloadRecord {
    /// Its kind.
    pub kind: Kind,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `spec.replicas`.
    pub replicas: i32,
    /// The least number of available replicas for Available=True.
    pub min_available: i32,
    /// Hash of the pod template the replica runs.
    pub template_hash: String,
    /// Knative revisions (and Deployment rollouts) so far.
    pub revision: u32,
    /// `progressDeadlineSeconds`.
    pub progress_deadline: u64,
    /// When the template last changed.
    pub changed_at: Instant,
    /// Knative: `networking.knative.dev/visibility: cluster-local`.
    pub cluster_local: bool,
    /// The replica, if one runs.
    pub replica: Option<Replica>,
    transitions: BTreeMap<&'static str, (String, Timestamp)>,
}

impl WorkloadRecord {
    fn stop_replica(&mut self) {
        if let Some(replica) = self.replica.take() {
            replica.stop.store(true, Ordering::SeqCst);
        }
    }

    /// The time of the last change of condition `kind` to `state` (status + reason).
    pub(crate) fn transition(&mut self, kind: &'static str, state: String) -> Timestamp {
        let now = Timestamp::now();
        let entry = self.transitions.entry(kind).or_insert((state.clone(), now));
        if entry.0 != state {
            *entry = (state, now);
        }
        entry.1
    }

    /// The ReplicaSet (or Knative Revision) name of the current template.
    pub fn revision_name(&self, name: &str) -> String {
        match self.kind {
            Kind::Deployment => format!("{name}-{}", self.template_hash),
            Kind::Knative => format!("{name}-{:05}", self.revision),
        }
    }
}

/// A short stable hash of a pod template.
fn template_hash(template: &Value) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    template.to_string().hash(&mut hasher);
    format!("{:x}", hasher.finish())[..10].to_string()
}

/// What an apply needs besides the template.
struct Target {
    kind: Kind,
    key: Key,
    generation: Option<i64>,
    replicas: i32,
    min_available: i32,
    progress_deadline: u64,
    cluster_local: bool,
}

impl TestKubelet {
    /// Runs (or updates, or stops) the replica of `deployment`.
    ///
    /// # Errors
    /// [`Unsupported`] naming the first field the kubelet does not implement.
    pub fn apply_deployment(&self, deployment: &Deployment) -> Result<(), Unsupported> {
        check_deployment(deployment)?;
        let spec = deployment.spec.clone().unwrap_or_default();
        let pod_spec = spec.template.spec.clone().unwrap_or_default();
        let replicas = spec.replicas.unwrap_or(1);
        let meta = &deployment.metadata;
        let target = Target {
            kind: Kind::Deployment,
            key: key(meta),
            generation: meta.generation,
            replicas,
            min_available: replicas - max_unavailable(&spec, replicas),
            progress_deadline: spec.progress_deadline_seconds.unwrap_or(600).max(0) as u64,
            cluster_local: false,
        };
        let template = serde_json::to_value(&spec.template).unwrap_or_default();
        let tmeta = spec.template.metadata.unwrap_or_default();
        self.apply(target, &template, tmeta, pod_spec);
        Ok(())
    }

    /// Runs (or updates) the replica of a Knative `serving.knative.dev/v1` Service (as JSON).
    /// Containers without a name are called `user-container`, probes without a port use
    /// 8080, as Knative defaults them.
    ///
    /// # Errors
    /// [`Unsupported`] naming the first field the kubelet does not implement.
    pub fn apply_knative_service(&self, service: &Value) -> Result<(), Unsupported> {
        let (template, parsed) = check_knative_service(service)?;
        let meta: ObjectMeta =
            serde_json::from_value(service["metadata"].clone()).unwrap_or_default();
        let visibility = meta
            .labels
            .as_ref()
            .and_then(|l| l.get("networking.knative.dev/visibility"));
        let target = Target {
            kind: Kind::Knative,
            key: key(&meta),
            generation: meta.generation,
            replicas: 1,
            min_available: 1,
            progress_deadline: 600,
            cluster_local: visibility.is_some_and(|v| v == "cluster-local"),
        };
        let tmeta: ObjectMeta =
            serde_json::from_value(template["metadata"].clone()).unwrap_or_default();
        self.apply(target, &template, tmeta, parsed);
        Ok(())
    }

    fn apply(&self, target: Target, template: &Value, tmeta: ObjectMeta, pod_spec: PodSpec) {
        let hash = template_hash(template);
        let mut state = self.core.lock();
        let record = state
            .workloads
            .entry((target.kind, target.key.clone()))
            .or_insert_with(|| WorkloadRecord {
                kind: target.kind,
                generation: None,
                replicas: 0,
                min_available: 0,
                template_hash: String::new(),
                revision: 0,
                progress_deadline: 600,
                changed_at: Instant::now(),
                cluster_local: false,
                replica: None,
                transitions: BTreeMap::new(),
            });
        record.generation = target.generation;
        record.replicas = target.replicas;
        record.min_available = target.min_available;
        record.progress_deadline = target.progress_deadline;
        record.cluster_local = target.cluster_local;
        if record.template_hash != hash {
            record.template_hash = hash;
            record.revision += 1;
            record.changed_at = Instant::now();
            record.stop_replica();
        }
        if target.replicas < 1 {
            record.stop_replica();
            return;
        }
        if record.replica.is_some() || self.core.shutting_down() {
            return;
        }
        let port = crate::common::free_port();
        let (ns, name) = target.key.clone();
        let revision = record.revision_name(&name);
        let mut labels = tmeta.labels.unwrap_or_default();
        let mut overrides = vec![("FUNC_PORT".to_string(), port.to_string())];
        let pod_name = match target.kind {
            Kind::Deployment => {
                labels.insert("pod-template-hash".into(), record.template_hash.clone());
                format!("{revision}-{}", random_suffix(5))
            }
            Kind::Knative => {
                for (k, v) in [
                    ("serving.knative.dev/service", &name),
                    ("serving.knative.dev/configuration", &name),
                    ("serving.knative.dev/revision", &revision),
                    ("app", &revision),
                ] {
                    labels.insert(k.into(), v.clone());
                }
                overrides.push(("PORT".into(), port.to_string()));
                format!("{revision}-deployment-{}", random_suffix(5))
            }
        };
        let uid = random_suffix(16);
        let meta = ObjectMeta {
            name: Some(pod_name.clone()),
            namespace: Some(ns.clone()),
            uid: Some(uid.clone()),
            labels: Some(labels.clone()),
            annotations: tmeta.annotations.clone(),
            ..ObjectMeta::default()
        };
        let input = PodInput {
            namespace: ns.clone(),
            name: pod_name.clone(),
            uid,
            labels,
            annotations: tmeta.annotations.unwrap_or_default(),
            spec: pod_spec.clone(),
            overrides,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let pod_key = (ns, pod_name);
        record.replica = Some(Replica {
            pod: pod_key.clone(),
            port,
            stop: Arc::clone(&stop),
        });
        let mut pod = PodRecord::new(meta, pod_spec, None);
        pod.port = Some(port);
        state.pods.insert(pod_key.clone(), pod);
        drop(state);
        self.core
            .spawn(move |core| runner::run(&core, &pod_key, &input, &stop));
    }

    /// Stops a Deployment's or Knative Service's replica and forgets it.
    pub fn stop_workload(&self, kind: Kind, namespace: &str, name: &str) {
        let key = (kind, (namespace.to_string(), name.to_string()));
        if let Some(mut record) = self.core.lock().workloads.remove(&key) {
            record.stop_replica();
        }
    }

    /// The host port of the Deployment's (or else Knative Service's) running replica.
    pub fn port(&self, namespace: &str, name: &str) -> Option<u16> {
        let state = self.core.lock();
        let key = (namespace.to_string(), name.to_string());
        [Kind::Deployment, Kind::Knative].iter().find_map(|kind| {
            state
                .workloads
                .get(&(*kind, key.clone()))?
                .replica
                .as_ref()
                .map(|r| r.port)
        })
    }

    /// The replica pod of a Deployment or Knative Service.
    pub fn replica_pod(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
    ) -> Option<k8s_openapi::api::core::v1::Pod> {
        let state = self.core.lock();
        let record = state
            .workloads
            .get(&(kind, (namespace.to_string(), name.to_string())))?;
        state
            .pods
            .get(&record.replica.as_ref()?.pod)
            .map(PodRecord::to_pod)
    }

    /// The Deployment's status now, as the Deployment controller would write it.
    pub fn deployment_status(&self, namespace: &str, name: &str) -> Option<DeploymentStatus> {
        let mut state = self.core.lock();
        let super::State {
            workloads, pods, ..
        } = &mut *state;
        let record =
            workloads.get_mut(&(Kind::Deployment, (namespace.to_string(), name.to_string())))?;
        let pod = record.replica.as_ref().and_then(|r| pods.get(&r.pod));
        Some(workload_status::deployment(record, name, pod))
    }

    /// The Knative Service's `status` now, as Knative Serving would write it.
    pub fn knative_status(&self, namespace: &str, name: &str) -> Option<Value> {
        let mut state = self.core.lock();
        let super::State {
            workloads, pods, ..
        } = &mut *state;
        let record =
            workloads.get_mut(&(Kind::Knative, (namespace.to_string(), name.to_string())))?;
        let pod = record.replica.as_ref().and_then(|r| pods.get(&r.pod));
        Some(workload_status::knative(record, namespace, name, pod))
    }
}

fn key(meta: &ObjectMeta) -> Key {
    let ns = meta.namespace.clone().unwrap_or_else(|| "default".into());
    (ns, meta.name.clone().unwrap_or_default())
}

/// `maxUnavailable` of the rollout strategy (RollingUpdate's default 25%, rounded down;
/// Recreate: 0).
fn max_unavailable(spec: &k8s_openapi::api::apps::v1::DeploymentSpec, replicas: i32) -> i32 {
    let strategy = spec.strategy.clone().unwrap_or_default();
    if strategy.type_.as_deref() == Some("Recreate") {
        return 0;
    }
    let value = strategy.rolling_update.and_then(|r| r.max_unavailable);
    match value {
        Some(IntOrString::Int(n)) => n,
        Some(IntOrString::String(p)) => {
            let percent: i32 = p.trim_end_matches('%').parse().unwrap_or(25);
            replicas * percent / 100
        }
        None => replicas * 25 / 100,
    }
}

/// Knative's defaults for what its webhook fills in: container names and probe ports.
fn default_knative_containers(spec: &mut Value) {
    let Some(containers) = spec["containers"].as_array_mut() else {
        return;
    };
    for c in containers {
        if c["name"].is_null() {
            c["name"] = json!("user-container");
        }
        for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
            if c[probe]["httpGet"].is_object() && c[probe]["httpGet"]["port"].is_null() {
                c[probe]["httpGet"]["port"] = json!(FUNCTION_PORT);
            }
        }
    }
}
