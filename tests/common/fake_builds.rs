//! A stand-in for the Job controller and kubelet in controller tests that are about the
//! controller's logic, not about building (the test kubelet runs builds for real elsewhere):
//! it watches the build Jobs the controller creates, keeps each "running" for a while, then
//! ends it the way a kubelet and the Job controller would — a Pod whose container terminated
//! with a message, then the Job's status — either by really pushing a small image to the
//! Job's `--image` (so the registry has it), by reporting a digest without pushing (for
//! hundreds of builds), or by failing with a message. It also records how many Jobs were
//! active at once.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// How a build ends.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// Push the image tagged `tag` of the OCI layout `layout` to the Job's `--image` with
    /// skopeo (`skopeo_args`: e.g. `--dest-tls-verify=false`), and report its digest.
    Push {
        /// The layout.
        layout: PathBuf,
        /// The tag in it.
        tag: String,
        /// The layout's digest for that tag.
        digest: String,
    },
    /// Report this digest without pushing anything.
    Report(String),
    /// Fail with this termination message.
    Fail(String),
}

/// What the runner saw.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    /// The most Jobs active at once.
    pub max_active: usize,
    /// Jobs ended, by name (`namespace/name`), in order.
    pub ended: Vec<String>,
}

/// The runner; it stops when dropped.
pub struct FakeBuilds {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<Mutex<Stats>>,
}

type Decide = dyn Fn(&Job) -> Outcome + Send + Sync;

impl FakeBuilds {
    /// Starts ending every build Job `hold` after it appears, as `decide` says.
    pub fn start(
        client: kube::Client,
        hold: Duration,
        decide: impl Fn(&Job) -> Outcome + Send + Sync + 'static,
    ) -> FakeBuilds {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Mutex::new(Stats::default()));
        let decide: Arc<Decide> = Arc::new(decide);
        let thread = {
            let (stop, stats) = (stop.clone(), stats.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(run(client, hold, decide, stop, stats));
            })
        };
        FakeBuilds {
            stop,
            thread: Some(thread),
            stats,
        }
    }

    /// What it saw so far.
    pub fn stats(&self) -> Stats {
        self.stats.lock().unwrap().clone()
    }
}

impl Drop for FakeBuilds {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn is_active(job: &Job) -> bool {
    job.status
        .as_ref()
        .is_none_or(|s| s.succeeded.unwrap_or(0) == 0 && s.failed.unwrap_or(0) == 0)
}

async fn run(
    client: kube::Client,
    hold: Duration,
    decide: Arc<Decide>,
    stop: Arc<AtomicBool>,
    stats: Arc<Mutex<Stats>>,
) {
    let jobs: Api<Job> = Api::all(client.clone());
    let mut seen: BTreeMap<String, Instant> = BTreeMap::new();
    let mut done: HashSet<String> = HashSet::new();
    while !stop.load(Ordering::Relaxed) {
        let Ok(list) = jobs.list(&ListParams::default()).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let active: Vec<&Job> = list.items.iter().filter(|j| is_active(j)).collect();
        {
            let mut s = stats.lock().unwrap();
            s.max_active = s.max_active.max(active.len());
        }
        for job in active {
            let key = format!(
                "{}/{}",
                job.metadata.namespace.as_deref().unwrap_or_default(),
                job.metadata.name.as_deref().unwrap_or_default()
            );
            let uid = job.metadata.uid.clone().unwrap_or_default();
            if done.contains(&uid) {
                continue;
            }
            let since = *seen.entry(uid.clone()).or_insert_with(Instant::now);
            if since.elapsed() < hold {
                continue;
            }
            let outcome = decide(job);
            if end(&client, job, &outcome).await {
                done.insert(uid);
                stats.lock().unwrap().ended.push(key);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The value after `flag` in the Job's build container's args.
pub fn job_arg(job: &Job, flag: &str) -> Option<String> {
    let pod = job.spec.as_ref()?.template.spec.as_ref()?;
    let args = pod.containers.first()?.args.as_ref()?;
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

async fn end(client: &kube::Client, job: &Job, outcome: &Outcome) -> bool {
    let ns = job.metadata.namespace.clone().unwrap_or_default();
    let name = job.metadata.name.clone().unwrap_or_default();
    let image = job_arg(job, "--image").unwrap_or_default();
    let repository = image
        .rsplit_once(':')
        .map_or(image.as_str(), |(r, _)| r)
        .to_string();
    let (code, message) = match outcome {
        Outcome::Push {
            layout,
            tag,
            digest,
        } => {
            let status = std::process::Command::new("skopeo")
                .args([
                    "copy",
                    "--quiet",
                    "--dest-tls-verify=false",
                    "--preserve-digests",
                ])
                .arg(format!("oci:{}:{tag}", layout.display()))
                .arg(format!("docker://{image}"))
                .status();
            if !status.is_ok_and(|s| s.success()) {
                return false;
            }
            (0, format!("{repository}@{digest}"))
        }
        Outcome::Report(digest) => (0, format!("{repository}@{digest}")),
        Outcome::Fail(message) => (1, message.clone()),
    };
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": format!("{name}-pod"),
            "namespace": ns,
            "labels": {"job-name": name, "batch.kubernetes.io/job-name": name},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job.metadata.uid, "controller": true}],
        },
        "spec": {"containers": [{"name": "build", "image": "x"}]},
    }))
    .expect("a Pod");
    if pods.create(&PostParams::default(), &pod).await.is_err() {
        return false;
    }
    let terminated = json!({"exitCode": code, "reason": if code == 0 {"Completed"} else {"Error"}, "message": message, "startedAt": now, "finishedAt": now});
    let pod_status = json!({"status": {"phase": if code == 0 {"Succeeded"} else {"Failed"},
        "containerStatuses": [{"name": "build", "image": "x", "imageID": "", "ready": false, "restartCount": 0, "state": {"terminated": terminated}}]}});
    let _ = pods
        .patch_status(
            &format!("{name}-pod"),
            &PatchParams::default(),
            &Patch::Merge(&pod_status),
        )
        .await;
    let condition = if code == 0 { "Complete" } else { "Failed" };
    let counts = if code == 0 {
        json!({"succeeded": 1})
    } else {
        json!({"failed": 1})
    };
    let mut status = json!({"status": {"startTime": now, "conditions": [{"type": condition, "status": "True", "lastTransitionTime": now, "reason": if code == 0 {"Completed"} else {"BackoffLimitExceeded"}}]}});
    for (k, v) in counts.as_object().expect("object") {
        status["status"][k] = v.clone();
    }
    if code == 0 {
        status["status"]["completionTime"] = json!(now);
    }
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    jobs.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .is_ok()
}

/// A stand-in for the Deployment controller: marks every Deployment's current generation
/// rolled out and available, as the real one does once its Pods are ready. Stops on drop.
pub struct FakeRollouts {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeRollouts {
    /// Starts marking Deployments available.
    pub fn start(client: kube::Client) -> FakeRollouts {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async move {
                    let api: Api<k8s_openapi::api::apps::v1::Deployment> = Api::all(client.clone());
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok(list) = api.list(&ListParams::default()).await {
                            for d in list.items {
                                let generation = d.metadata.generation.unwrap_or(1);
                                let observed =
                                    d.status.as_ref().and_then(|s| s.observed_generation);
                                if observed == Some(generation) {
                                    continue;
                                }
                                let replicas =
                                    d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                                let ns = d.metadata.namespace.clone().unwrap_or_default();
                                let name = d.metadata.name.clone().unwrap_or_default();
                                let _ = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(
                                    client.clone(),
                                    &ns,
                                )
                                .patch_status(
                                    &name,
                                    &PatchParams::default(),
                                    &Patch::Merge(&available(generation, replicas)),
                                )
                                .await;
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                });
            })
        };
        FakeRollouts {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for FakeRollouts {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The status of a Deployment whose `generation` is rolled out with `replicas` ready.
pub fn available(generation: i64, replicas: i32) -> serde_json::Value {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    json!({"status": {
    "observedGeneration": generation, "replicas": replicas, "updatedReplicas": replicas,
    "readyReplicas": replicas, "availableReplicas": replicas,
    "conditions": [
        {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable", "lastUpdateTime": now, "lastTransitionTime": now},
        {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable", "lastUpdateTime": now, "lastTransitionTime": now}
    ]}})
}
