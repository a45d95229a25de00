//! Jobs: one pod per Job (`backoffLimit: 0`), named `<job>-<5 chars>` with the Job
//! controller's labels and an owner reference; it waits for one of the kubelet's Job slots,
//! runs its init containers in order and then its container, each on this pod's own thread;
//! `activeDeadlineSeconds` (counted from the Job's start) kills it. The Job's status follows
//! as Kubernetes 1.33's Job controller writes it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus, UncountedTerminatedPods};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;

use super::job_run::{self, secs};
use super::plan::PodInput;
use super::pod::PodRecord;
use super::spec::{self, Unsupported, Workload};
use super::{Key, TestKubelet, random_suffix};

/// How a Job ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Its pod succeeded.
    Succeeded(Timestamp),
    /// It failed: `BackoffLimitExceeded` or `DeadlineExceeded`.
    Failed {
        /// When.
        at: Timestamp,
        /// The condition reason.
        reason: &'static str,
        /// The condition message.
        message: &'static str,
    },
}

/// A Job the kubelet runs.
#[derive(Debug)]
pub struct JobRecord {
    /// The Job's uid (as given, or made up when the object had none).
    pub uid: String,
    given_uid: Option<String>,
    /// Its pod.
    pub pod: Key,
    /// When the Job controller started it.
    pub start: Timestamp,
    /// How it ended.
    pub outcome: Option<Outcome>,
    stop: Arc<AtomicBool>,
}

impl JobRecord {
    /// Asks its pod to stop (the Job was deleted).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The Job's status from its record and pod, as the Job controller writes it.
pub fn status(job: &JobRecord, pod: Option<&PodRecord>) -> JobStatus {
    let condition = |kind: &str, at: Timestamp, reason: &str, message: &str| JobCondition {
        type_: kind.into(),
        status: "True".into(),
        last_probe_time: Some(Time(at)),
        last_transition_time: Some(Time(at)),
        reason: Some(reason.into()),
        message: Some(message.into()),
    };
    let mut status = JobStatus {
        start_time: Some(Time(job.start)),
        ready: Some(0),
        terminating: Some(0),
        uncounted_terminated_pods: Some(UncountedTerminatedPods::default()),
        ..JobStatus::default()
    };
    match &job.outcome {
        None => {
            status.active = Some(1);
            status.ready = Some(i32::from(pod.is_some_and(PodRecord::ready)));
        }
        Some(Outcome::Succeeded(at)) => {
            let message = "Reached expected number of succeeded pods";
            status.succeeded = Some(1);
            status.completion_time = Some(Time(*at));
            status.conditions = Some(vec![
                condition("SuccessCriteriaMet", *at, "CompletionsReached", message),
                condition("Complete", *at, "CompletionsReached", message),
            ]);
        }
        Some(Outcome::Failed {
            at,
            reason,
            message,
        }) => {
            status.failed = Some(1);
            status.conditions = Some(vec![
                condition("FailureTarget", *at, reason, message),
                condition("Failed", *at, reason, message),
            ]);
        }
    }
    status
}

/// Whether the kubelet implements everything `job` asks for, without running it.
///
/// # Errors
/// [`Unsupported`] naming the first field it does not implement.
pub fn check(job: &Job) -> Result<(), Unsupported> {
    let spec = job.spec.clone().unwrap_or_default();
    spec::check_job_spec(&serde_json::to_value(&spec).unwrap_or_default())?;
    let pod_spec = spec.template.spec.unwrap_or_default();
    spec::check_pod_spec(&pod_spec, Workload::Job, "spec.template.spec")
}

impl TestKubelet {
    /// Starts `job`'s pod (once per Job uid; a new uid under the same name replaces the old
    /// Job's pod). The pod waits Pending while the kubelet already runs `max_jobs` Jobs.
    ///
    /// # Errors
    /// [`Unsupported`] naming the first field the kubelet does not implement.
    pub fn start_job(&self, job: &Job) -> Result<(), Unsupported> {
        let ns = job
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = job.metadata.name.clone().unwrap_or_default();
        let key = (ns.clone(), name.clone());
        if let Some(old) = self.core.lock().jobs.get(&key)
            && old.given_uid == job.metadata.uid
        {
            return Ok(());
        }
        check(job)?;
        let spec = job.spec.clone().unwrap_or_default();
        let template = spec.template;
        let pod_spec = template.spec.unwrap_or_default();
        self.stop_job(&ns, &name);
        let uid = job
            .metadata
            .uid
            .clone()
            .unwrap_or_else(|| random_suffix(16));
        let pod_name = format!("{name}-{}", random_suffix(5));
        let tmeta = template.metadata.unwrap_or_default();
        let mut labels = tmeta.labels.unwrap_or_default();
        for label in ["job-name", "batch.kubernetes.io/job-name"] {
            labels.insert(label.into(), name.clone());
        }
        for label in ["controller-uid", "batch.kubernetes.io/controller-uid"] {
            labels.insert(label.into(), uid.clone());
        }
        let pod_uid = random_suffix(16);
        let meta = ObjectMeta {
            name: Some(pod_name.clone()),
            namespace: Some(ns.clone()),
            uid: Some(pod_uid.clone()),
            labels: Some(labels.clone()),
            annotations: tmeta.annotations.clone(),
            owner_references: Some(vec![OwnerReference {
                api_version: "batch/v1".into(),
                kind: "Job".into(),
                name: name.clone(),
                uid: uid.clone(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        };
        let input = PodInput {
            namespace: ns.clone(),
            name: pod_name.clone(),
            uid: pod_uid,
            labels,
            annotations: tmeta.annotations.unwrap_or_default(),
            spec: pod_spec.clone(),
            overrides: Vec::new(),
            ip: self.core.pod_ip(),
            admitted: false,
            sa_token: None,
        };
        let start = Timestamp::now();
        let deadline = spec
            .active_deadline_seconds
            .map(|s| Instant::now() + secs(s));
        let grace = secs(pod_spec.termination_grace_period_seconds.unwrap_or(30));
        let stop = Arc::new(AtomicBool::new(false));
        let pod_key = (ns.clone(), pod_name);
        {
            let mut state = self.core.lock();
            let waiting = Some("waiting for a free Job slot of the test kubelet".to_string());
            let mut pod = PodRecord::new(meta, pod_spec, waiting, input.ip.clone());
            if self.core.admission().is_some() {
                pod.admission = super::pod::Admission::Pending(None);
            }
            state.pods.insert(pod_key.clone(), pod);
            let record = JobRecord {
                uid,
                given_uid: job.metadata.uid.clone(),
                pod: pod_key.clone(),
                start,
                outcome: None,
                stop: Arc::clone(&stop),
            };
            state.jobs.insert(key.clone(), record);
        }
        self.core.spawn(move |core| {
            let outcome = job_run::run_pod(&core, &pod_key, &input, deadline, grace, &stop);
            if let Some(job) = core.lock().jobs.get_mut(&key).filter(|j| j.pod == pod_key) {
                job.outcome = outcome;
            }
        });
        Ok(())
    }

    /// Stops a Job's pod (if running) and forgets the Job; its Pod object is deleted.
    pub fn stop_job(&self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        let mut state = self.core.lock();
        if let Some(job) = state.jobs.remove(&key) {
            job.stop();
            if let Some(pod) = state.pods.get_mut(&job.pod) {
                pod.deleted = true;
                pod.touch();
            }
        }
    }

    /// The Job's status now, as the Job controller would write it.
    pub fn job_status(&self, namespace: &str, name: &str) -> Option<JobStatus> {
        let state = self.core.lock();
        let job = state.jobs.get(&(namespace.to_string(), name.to_string()))?;
        Some(status(job, state.pods.get(&job.pod)))
    }

    /// The Job's pod.
    pub fn job_pod(&self, namespace: &str, name: &str) -> Option<k8s_openapi::api::core::v1::Pod> {
        let state = self.core.lock();
        let job = state.jobs.get(&(namespace.to_string(), name.to_string()))?;
        state.pods.get(&job.pod).map(PodRecord::to_pod)
    }

    /// Waits until the Job has finished and returns its status; panics after `timeout` with
    /// the pod and its logs.
    pub fn wait_job(&self, namespace: &str, name: &str, timeout: Duration) -> JobStatus {
        let finished = self.wait_for(timeout, |k| {
            let s = k.job_status(namespace, name)?;
            (s.succeeded.is_some() || s.failed.is_some()).then_some(s)
        });
        finished.unwrap_or_else(|| {
            let pod = self.job_pod(namespace, name);
            let logs = self.all_logs(namespace, pod.as_ref());
            panic!("Job {namespace}/{name} did not finish within {timeout:?}:\n{pod:#?}\n{logs}")
        })
    }

    /// Every container's log of `pod`, for panic messages.
    pub fn all_logs(
        &self,
        namespace: &str,
        pod: Option<&k8s_openapi::api::core::v1::Pod>,
    ) -> String {
        let Some(pod) = pod else { return String::new() };
        let name = pod.metadata.name.clone().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let names = spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .map(|c| &c.name);
        names
            .map(|c| format!("--- {c} ---\n{}", self.logs(namespace, &name, c)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}
