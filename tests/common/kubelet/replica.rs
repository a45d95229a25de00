//! Deployments and Knative Services: ONE replica of the pod template runs while
//! `spec.replicas` (Knative: always) is at least 1, its port 8080 mapped to a free host port
//! (`FUNC_PORT`, and Knative's `PORT`); a changed template stops it and starts a new pod;
//! deletion stops it. The status is what the Deployment controller (or Knative) writes,
//! counting that one replica honestly.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::plan::PodInput;
use super::pod::PodRecord;
use super::rollout::{fenceposts, rollout};
use super::spec::{self, Unsupported, Workload};
use super::{Core, Key, TestKubelet, random_suffix, runner, workload_status};

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

/// One replica pod of a workload.
#[derive(Debug)]
pub struct Replica {
    /// Its pod.
    pub pod: Key,
    /// The host port its 8080 is mapped to (`FUNC_PORT`).
    pub port: u16,
    /// The template hash it runs.
    pub hash: String,
    stop: Arc<AtomicBool>,
}

impl Replica {
    fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }
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
    /// Resolved `maxSurge`: how many pods beyond `replicas` a rollout may run.
    pub max_surge: i32,
    /// Resolved `maxUnavailable`: how far below `replicas` availability may drop.
    pub max_unavailable: i32,
    /// Hash of the current pod template.
    pub template_hash: String,
    /// Knative revisions (and Deployment rollouts) so far.
    pub revision: u32,
    /// `progressDeadlineSeconds`.
    pub progress_deadline: u64,
    /// When the template last changed.
    pub changed_at: Instant,
    /// Knative: `networking.knative.dev/visibility: cluster-local`.
    pub cluster_local: bool,
    /// The replicas running or stopping, oldest first.
    pub pods: Vec<Replica>,
    /// The current template's metadata and pod spec, which new replicas run.
    template: Option<(ObjectMeta, PodSpec)>,
    transitions: BTreeMap<&'static str, (String, Timestamp)>,
}

impl WorkloadRecord {
    /// The least number of available replicas for Available=True.
    pub fn min_available(&self) -> i32 {
        (self.replicas - self.max_unavailable).max(0)
    }

    fn stop_all(&mut self) {
        for replica in self.pods.drain(..) {
            replica.stop();
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
    max_surge: i32,
    max_unavailable: i32,
    progress_deadline: u64,
    cluster_local: bool,
}

/// The pod counts a rollout step sees.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Pods of the current template.
    pub new: i32,
    /// Pods of older templates.
    pub old: i32,
    /// Ready pods of the current template.
    pub new_ready: i32,
    /// Ready pods of older templates.
    pub old_ready: i32,
}

impl TestKubelet {
    /// Runs (or scales, rolls or stops) the replicas of `deployment`, as its ReplicaSets
    /// would: a rolling update starts at most `maxSurge` pods beyond `spec.replicas` and stops
    /// old ones only while `spec.replicas − maxUnavailable` pods stay ready.
    ///
    /// # Errors
    /// [`Unsupported`] naming the first field the kubelet does not implement.
    pub fn apply_deployment(&self, deployment: &Deployment) -> Result<(), Unsupported> {
        check_deployment(deployment)?;
        let spec = deployment.spec.clone().unwrap_or_default();
        let pod_spec = spec.template.spec.clone().unwrap_or_default();
        let replicas = spec.replicas.unwrap_or(1).max(0);
        let (max_surge, max_unavailable) = fenceposts(&spec, replicas);
        let meta = &deployment.metadata;
        let target = Target {
            kind: Kind::Deployment,
            key: key(meta),
            generation: meta.generation,
            replicas,
            max_surge,
            max_unavailable,
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
    /// 8080, as Knative defaults them. A new revision replaces the old once it is ready.
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
            max_surge: 1,
            max_unavailable: 0,
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
                max_surge: 0,
                max_unavailable: 0,
                template_hash: String::new(),
                revision: 0,
                progress_deadline: 600,
                changed_at: Instant::now(),
                cluster_local: false,
                pods: Vec::new(),
                template: None,
                transitions: BTreeMap::new(),
            });
        record.generation = target.generation;
        record.replicas = target.replicas;
        record.max_surge = target.max_surge;
        record.max_unavailable = target.max_unavailable;
        record.progress_deadline = target.progress_deadline;
        record.cluster_local = target.cluster_local;
        record.template = Some((tmeta, pod_spec));
        if record.template_hash != hash {
            record.template_hash = hash;
            record.revision += 1;
            record.changed_at = Instant::now();
        }
        drop(state);
        roll(&self.core, &(target.kind, target.key));
    }
}

/// Runs [`roll`] over every workload until the kubelet shuts down: rollouts go on as pods
/// become ready, whether or not anyone applies the workload again.
pub(crate) fn keep_rolling(core: &Arc<Core>) {
    while !core.shutting_down() {
        let keys: Vec<(Kind, Key)> = core.lock().workloads.keys().cloned().collect();
        for key in keys {
            roll(core, &key);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One step of workload `key`'s rollout: its pods started and stopped as its ReplicaSets
/// would scale them.
fn roll(core: &Arc<Core>, key: &(Kind, Key)) {
    let mut state = core.lock();
    let super::State {
        workloads, pods, ..
    } = &mut *state;
    let Some(record) = workloads.get_mut(key) else {
        return;
    };
    // Pods that are gone (stopped, and their thread done) leave the record.
    record
        .pods
        .retain(|r| pods.get(&r.pod).is_some_and(|p| !p.deleted));
    let Some((tmeta, pod_spec)) = record.template.clone() else {
        return;
    };
    if core.shutting_down() {
        return;
    }
    let ready = |r: &Replica| pods.get(&r.pod).is_some_and(PodRecord::ready);
    let plan = rollout(record, &ready);
    for index in plan.stop {
        record.pods[index].stop();
    }
    record.pods.retain(|r| !r.stop.load(Ordering::SeqCst));
    let mut started = Vec::new();
    for _ in 0..plan.start {
        started.push(new_replica(core, record, &key.1, &tmeta, &pod_spec, pods));
    }
    drop(state);
    for (pod_key, input, stop) in started {
        core.spawn(move |core| runner::run(&core, &pod_key, &input, &stop));
    }
}

/// Adds a replica of the current template to `record` and its pod to `pods`; returns what
/// its thread runs.
fn new_replica(
    core: &Core,
    record: &mut WorkloadRecord,
    key: &Key,
    tmeta: &ObjectMeta,
    pod_spec: &PodSpec,
    pods: &mut BTreeMap<Key, PodRecord>,
) -> (Key, PodInput, Arc<AtomicBool>) {
    let port = crate::common::free_port();
    let ip = core.pod_ip();
    let (ns, name) = key.clone();
    let revision = record.revision_name(&name);
    let mut labels = tmeta.labels.clone().unwrap_or_default();
    let mut overrides = vec![
        ("FUNC_PORT".to_string(), port.to_string()),
        // kiln's own servers listen on the pod's IP (deviation: one host network).
        ("KILN_LISTEN_IP".to_string(), ip.clone()),
    ];
    let pod_name = match record.kind {
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
        annotations: tmeta.annotations.clone().unwrap_or_default(),
        spec: pod_spec.clone(),
        overrides,
        ip: ip.clone(),
        admitted: false,
        sa_token: None,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let pod_key = (ns, pod_name);
    record.pods.push(Replica {
        pod: pod_key.clone(),
        port,
        hash: record.template_hash.clone(),
        stop: Arc::clone(&stop),
    });
    let mut pod = PodRecord::new(meta, pod_spec.clone(), None, ip);
    pod.port = Some(port);
    if core.admission().is_some() {
        pod.admission = super::pod::Admission::Pending(None);
    }
    pods.insert(pod_key.clone(), pod);
    (pod_key, input, stop)
}

impl TestKubelet {
    /// Stops pod `key` (its object was deleted): a replica is then replaced by the rollout,
    /// a Job's pod just ends.
    pub fn kill_pod(&self, key: &Key) {
        let mut state = self.core.lock();
        for record in state.workloads.values_mut() {
            if let Some(i) = record.pods.iter().position(|r| r.pod == *key) {
                record.pods.remove(i).stop();
                return;
            }
        }
        if let Some(job) = state.jobs.values().find(|j| j.pod == *key) {
            job.stop();
        }
    }

    /// Stops a Deployment's or Knative Service's replicas and forgets it.
    pub fn stop_workload(&self, kind: Kind, namespace: &str, name: &str) {
        let key = (kind, (namespace.to_string(), name.to_string()));
        if let Some(mut record) = self.core.lock().workloads.remove(&key) {
            record.stop_all();
        }
    }

    /// The host port of a replica of the Deployment's (or else Knative Service's) current
    /// template: a ready one if there is one.
    pub fn port(&self, namespace: &str, name: &str) -> Option<u16> {
        let state = self.core.lock();
        let key = (namespace.to_string(), name.to_string());
        [Kind::Deployment, Kind::Knative].iter().find_map(|kind| {
            let record = state.workloads.get(&(*kind, key.clone()))?;
            let current: Vec<&Replica> = record
                .pods
                .iter()
                .filter(|r| r.hash == record.template_hash)
                .collect();
            let ready = current
                .iter()
                .find(|r| state.pods.get(&r.pod).is_some_and(PodRecord::ready));
            ready.or(current.first()).map(|r| r.port)
        })
    }

    /// A replica pod of the current template of a Deployment or Knative Service (the first
    /// started).
    pub fn replica_pod(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
    ) -> Option<k8s_openapi::api::core::v1::Pod> {
        self.replica_pods(kind, namespace, name).into_iter().next()
    }

    /// Every replica pod of a Deployment or Knative Service, old templates' included, oldest
    /// first.
    pub fn replica_pods(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
    ) -> Vec<k8s_openapi::api::core::v1::Pod> {
        let state = self.core.lock();
        let Some(record) = state
            .workloads
            .get(&(kind, (namespace.to_string(), name.to_string())))
        else {
            return Vec::new();
        };
        record
            .pods
            .iter()
            .filter(|r| r.hash == record.template_hash)
            .chain(
                record
                    .pods
                    .iter()
                    .filter(|r| r.hash != record.template_hash),
            )
            .filter_map(|r| state.pods.get(&r.pod).map(PodRecord::to_pod))
            .collect()
    }

    /// The Deployment's status now, as the Deployment controller would write it.
    pub fn deployment_status(&self, namespace: &str, name: &str) -> Option<DeploymentStatus> {
        let mut state = self.core.lock();
        let super::State {
            workloads, pods, ..
        } = &mut *state;
        let record =
            workloads.get_mut(&(Kind::Deployment, (namespace.to_string(), name.to_string())))?;
        let members: Vec<(bool, &PodRecord)> = record
            .pods
            .iter()
            .filter_map(|r| {
                pods.get(&r.pod)
                    .map(|p| (r.hash == record.template_hash, p))
            })
            .collect();
        Some(workload_status::deployment(record, name, &members))
    }

    /// The Knative Service's `status` now, as Knative Serving would write it.
    pub fn knative_status(&self, namespace: &str, name: &str) -> Option<Value> {
        let mut state = self.core.lock();
        let super::State {
            workloads, pods, ..
        } = &mut *state;
        let record =
            workloads.get_mut(&(Kind::Knative, (namespace.to_string(), name.to_string())))?;
        let pod = record
            .pods
            .iter()
            .find(|r| r.hash == record.template_hash)
            .and_then(|r| pods.get(&r.pod));
        Some(workload_status::knative(record, namespace, name, pod))
    }
}

fn key(meta: &ObjectMeta) -> Key {
    let ns = meta.namespace.clone().unwrap_or_else(|| "default".into());
    (ns, meta.name.clone().unwrap_or_default())
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
