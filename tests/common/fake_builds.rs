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

use futures_util::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
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
        /// `USER:PASSWORD` to push with, if the registry wants credentials.
        creds: Option<String>,
    },
    /// Push as `push` does, then sign the image and attach an SLSA provenance, as `kiln build
    /// --sign-key` would, with the P-256 key in the PEM file `key`; the provenance says the
    /// build pushed to `pushed_as`, or to the Job's `--image` when `None`.
    Signed {
        /// The push ([`Outcome::Push`]).
        push: Box<Outcome>,
        /// The signing key.
        key: PathBuf,
        /// The reference the provenance names, if not the Job's.
        pushed_as: Option<String>,
    },
    /// Run this command with `{image}` replaced by the Job's `--image` (a real `kiln build`,
    /// say), and report the `repo@digest` its stdout ends with.
    Exec(Vec<String>),
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
    held: Arc<AtomicBool>,
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
        let held = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Mutex::new(Stats::default()));
        let decide: Arc<Decide> = Arc::new(decide);
        let thread = {
            let (stop, held, stats) = (stop.clone(), held.clone(), stats.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                let local = tokio::task::LocalSet::new();
                local.block_on(&rt, run(client, hold, decide, stop, held, stats));
            })
        };
        FakeBuilds {
            stop,
            held,
            thread: Some(thread),
            stats,
        }
    }

    /// Ends no build until [`FakeBuilds::release`]: for tests that look at builds while they
    /// run, whatever the machine's speed.
    pub fn hold(&self) {
        self.held.store(true, Ordering::SeqCst);
    }

    /// Ends builds again (each once its `hold` has passed).
    pub fn release(&self) {
        self.held.store(false, Ordering::SeqCst);
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
    held: Arc<AtomicBool>,
    stats: Arc<Mutex<Stats>>,
) {
    // Driven by a watch, not by listing every Job again and again: hundreds of Jobs stay
    // cheap, so tests with many Functions measure the controller and not this stand-in.
    let mut events = watcher(Api::<Job>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .boxed();
    // Active Jobs by uid: when first seen, the latest version, and `namespace/name`.
    let mut active: BTreeMap<String, (Instant, Job, String)> = BTreeMap::new();
    let mut done: HashSet<String> = HashSet::new();
    // Jobs being ended, side by side (an `Exec` build takes a while): uid, `namespace/name`,
    // and whether it ended.
    let mut ending: tokio::task::JoinSet<(String, String, bool)> = tokio::task::JoinSet::new();
    let mut in_flight: HashSet<String> = HashSet::new();
    while !stop.load(Ordering::Relaxed) {
        while let Some(Ok((uid, key, ended))) = ending.try_join_next() {
            in_flight.remove(&uid);
            if ended {
                // The watch may have seen the Job end (and dropped it) first.
                active.remove(&uid);
                stats.lock().unwrap().ended.push(key);
                done.insert(uid);
            }
        }
        let next = tokio::time::timeout(Duration::from_millis(20), events.next()).await;
        match next {
            Ok(Some(Ok(Event::Apply(job) | Event::InitApply(job)))) => {
                let uid = job.metadata.uid.clone().unwrap_or_default();
                if is_active(&job) && !done.contains(&uid) {
                    let key = format!(
                        "{}/{}",
                        job.metadata.namespace.as_deref().unwrap_or_default(),
                        job.metadata.name.as_deref().unwrap_or_default()
                    );
                    let since = active.get(&uid).map_or_else(Instant::now, |a| a.0);
                    active.insert(uid, (since, job, key));
                } else {
                    active.remove(&uid);
                }
                let mut s = stats.lock().unwrap();
                s.max_active = s.max_active.max(active.len());
            }
            Ok(Some(Ok(Event::Delete(job)))) => {
                active.remove(job.metadata.uid.as_deref().unwrap_or_default());
            }
            Ok(Some(Ok(Event::Init | Event::InitDone) | Err(_))) | Err(_) => {}
            Ok(None) => break,
        }
        if held.load(Ordering::SeqCst) {
            continue;
        }
        let due: Vec<String> = active
            .iter()
            .filter(|(uid, (since, _, _))| since.elapsed() >= hold && !in_flight.contains(*uid))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in due {
            let (_, job, key) = &active[&uid];
            let outcome = decide(job);
            let (client, job, key) = (client.clone(), job.clone(), key.clone());
            in_flight.insert(uid.clone());
            // Run on this thread (a current-thread runtime): `end`'s future need not be Send.
            ending.spawn_local(async move {
                let ended = end(&client, &job, &outcome).await;
                (uid, key, ended)
            });
        }
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

/// Signs `repository@digest` with the key in `key` and attaches a provenance saying the
/// build pushed to `pushed_as`, through kiln's own cosign code (checked against Python's
/// `cryptography` and the in-toto models in tests/sign.rs).
async fn sign(repository: &str, digest: &str, key: &std::path::Path, pushed_as: &str) -> bool {
    use kiln::cosign::{SignKey, prepare};
    use kiln::oci::Digest;
    use kiln::provenance::{Build, Inputs, now, statement};
    let key = SignKey::from_pem(&std::fs::read_to_string(key).unwrap()).unwrap();
    let image: kiln::registry::Reference = format!("{repository}@{digest}").parse().unwrap();
    let digest: Digest = digest.parse().unwrap();
    let host = repository.split('/').next().unwrap().to_string();
    let client = kiln::registry::Client::new(kiln::registry::ClientConfig {
        insecure_hosts: vec![host],
        ..kiln::registry::ClientConfig::default()
    })
    .unwrap();
    // An index: each platform's image is signed with its provenance, then the index.
    let doc = client
        .get_manifest(&image, &kiln::registry::DEFAULT_MANIFEST_TYPES)
        .await
        .unwrap();
    let mut images = vec![digest.clone()];
    if doc.media_type.is_index() {
        let index: kiln::oci::Index = doc.parse().unwrap();
        images = index.manifests.into_iter().map(|d| d.digest).collect();
    }
    for digest in &images {
        let inputs = Inputs {
            base_name: "fake".into(),
            base_digest: digest.clone(),
            source_diff_id: digest.clone(),
            dependency_files: Vec::new(),
            dependency_key: None,
            builder: None,
            git: None,
        };
        let statement = statement(&Build {
            repository: &image.repository_path(),
            digest,
            build_key: digest,
            inputs: &inputs,
            external: json!({"image": pushed_as}),
            started: now(),
            finished: now(),
        });
        let statement = serde_json::to_vec(&statement).unwrap();
        let statements = kiln::cosign::Statements {
            provenance: &statement,
            sbom: None,
        };
        let one = image.with_digest(digest.clone());
        let pushed = match prepare(&client, &one, digest, &key, &statements, false).await {
            Ok(prepared) => prepared.push(&client).await.is_ok(),
            Err(_) => false,
        };
        if !pushed {
            return false;
        }
    }
    images[0] == digest
        || kiln::cosign::sign(&client, &image, &digest, &key)
            .await
            .is_ok()
}

/// Copies `tag` of the OCI layout `layout` to `image` with skopeo.
fn skopeo_push(layout: &std::path::Path, tag: &str, creds: Option<&str>, image: &str) -> bool {
    let mut skopeo = std::process::Command::new("skopeo");
    skopeo.args([
        "copy",
        "--quiet",
        "--dest-tls-verify=false",
        "--preserve-digests",
        // An image index with every platform's image.
        "--all",
    ]);
    if let Some(creds) = creds {
        skopeo.args(["--dest-creds", creds]);
    }
    skopeo
        .arg(format!("oci:{}:{tag}", layout.display()))
        .arg(format!("docker://{image}"))
        .status()
        .is_ok_and(|s| s.success())
}

async fn end(client: &kube::Client, job: &Job, outcome: &Outcome) -> bool {
    let image = job_arg(job, "--image").unwrap_or_default();
    let repository = image
        .rsplit_once(':')
        .map_or(image.as_str(), |(r, _)| r)
        .to_string();
    let ns = job.metadata.namespace.clone().unwrap_or_default();
    let name = job.metadata.name.clone().unwrap_or_default();
    let (code, message) = match outcome {
        Outcome::Push {
            layout,
            tag,
            digest,
            creds,
        } => {
            if !skopeo_push(layout, tag, creds.as_deref(), &image) {
                return false;
            }
            (0, format!("{repository}@{digest}"))
        }
        Outcome::Signed {
            push,
            key,
            pushed_as,
        } => {
            let Outcome::Push {
                layout,
                tag,
                digest,
                creds,
            } = push.as_ref()
            else {
                panic!("Outcome::Signed signs a push");
            };
            // Signed before the Job ends, as kiln build does: the controller looks at once.
            let pushed_as = pushed_as.as_deref().unwrap_or(&image);
            if !skopeo_push(layout, tag, creds.as_deref(), &image)
                || !sign(&repository, digest, key, pushed_as).await
            {
                return false;
            }
            (0, format!("{repository}@{digest}"))
        }
        Outcome::Exec(argv) => {
            let argv: Vec<String> = argv.iter().map(|a| a.replace("{image}", &image)).collect();
            let Ok(out) = tokio::process::Command::new(&argv[0])
                .args(&argv[1..])
                .output()
                .await
            else {
                return false;
            };
            let stdout = String::from_utf8_lossy(&out.stdout);
            let Some(digest) = stdout.trim().rsplit_once('@').map(|(_, d)| d.to_string()) else {
                let stderr = String::from_utf8_lossy(&out.stderr);
                panic!("{argv:?} printed no reference:\n{stderr}");
            };
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
            "ownerReferences": [{
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": name,
                "uid": job.metadata.uid,
                "controller": true
            }],
        },
        "spec": {"containers": [{"name": "build", "image": "x"}]},
    }))
    .expect("a Pod");
    if pods.create(&PostParams::default(), &pod).await.is_err() {
        return false;
    }
    let terminated = json!({
        "exitCode": code,
        "reason": if code == 0 {"Completed"} else {"Error"},
        "message": message,
        "startedAt": now,
        "finishedAt": now
    });
    let pod_status = json!({"status": {"phase": if code == 0 {"Succeeded"} else {"Failed"},
    "containerStatuses": [{
        "name": "build",
        "image": "x",
        "imageID": "",
        "ready": false,
        "restartCount": 0,
        "state": {"terminated": terminated}
    }]}});
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
    let mut status = json!({"status": {
        "startTime": now,
        "conditions": [{
            "type": condition,
            "status": "True",
            "lastTransitionTime": now,
            "reason": if code == 0 {"Completed"} else {"BackoffLimitExceeded"}
        }]
    }});
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
        Self::start_after(client, Duration::ZERO)
    }

    /// Starts marking each new generation of a Deployment available `after` it appears (the
    /// time its Pods take to start and become ready).
    pub fn start_after(client: kube::Client, after: Duration) -> FakeRollouts {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(roll_out(client, stop, after));
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

async fn roll_out(client: kube::Client, stop: Arc<AtomicBool>, after: Duration) {
    use k8s_openapi::api::apps::v1::Deployment;
    let mut events = watcher(
        Api::<Deployment>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .applied_objects()
    .boxed();
    while !stop.load(Ordering::Relaxed) {
        let d = match tokio::time::timeout(Duration::from_millis(50), events.next()).await {
            Ok(Some(Ok(d))) => d,
            Ok(None) => break,
            Ok(Some(Err(_))) | Err(_) => continue,
        };
        let generation = d.metadata.generation.unwrap_or(1);
        if d.status.as_ref().and_then(|s| s.observed_generation) == Some(generation) {
            continue;
        }
        let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let ns = d.metadata.namespace.clone().unwrap_or_default();
        let name = d.metadata.name.clone().unwrap_or_default();
        let client = client.clone();
        let patch = async move {
            tokio::time::sleep(after).await;
            let _ = Api::<Deployment>::namespaced(client, &ns)
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(&available(generation, replicas)),
                )
                .await;
        };
        if after.is_zero() {
            patch.await;
        } else {
            tokio::spawn(patch);
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
        {
            "type": "Available",
            "status": "True",
            "reason": "MinimumReplicasAvailable",
            "lastUpdateTime": now,
            "lastTransitionTime": now
        },
        {
            "type": "Progressing",
            "status": "True",
            "reason": "NewReplicaSetAvailable",
            "lastUpdateTime": now,
            "lastTransitionTime": now
        }
    ]}})
}
