//! A test kubelet: it runs the pods of Jobs, Deployments and Knative Services for real, each
//! container as a `kiln run` process (rootless sandbox, read-only root, host network), and
//! keeps what a kubelet and the Job/Deployment controllers would write: Pod objects with
//! container statuses, Job status, Deployment and Knative Service status.
//!
//! The core (this module and its children) needs no API server: tests hand it objects with
//! [`TestKubelet::start_job`], [`TestKubelet::apply_deployment`] and read the results back.
//! [`TestKubelet::sync`] (in `api.rs`) is a thin layer that lists objects through a
//! `kube::Client`, feeds them to the core and writes Pods and statuses back.
//!
//! With an API server ([`TestKubelet::spawn`]), every pod's object is created through it
//! before the pod runs, as the Job and ReplicaSet controllers do: admission (ServiceAccounts,
//! PodSecurity, webhooks) may refuse it (the pod waits, the Deployment reports
//! `ReplicaFailure`) or change it, and the pod runs the spec as admitted, its projected
//! ServiceAccount token issued by the API server. Deleting a Pod object stops the pod.
//!
//! It implements a subset of the API exactly and FAILS LOUDLY on anything else
//! ([`spec::Unsupported`] names the field): `allowlist.rs` lists the fields, `spec.rs` the
//! values it refuses; [`job::check`], [`replica::check_deployment`] and
//! [`replica::check_knative_service`] check an object without running it. A ConfigMap or
//! Secret that is missing leaves the containers waiting (CreateContainerConfigError for env,
//! ContainerCreating with the FailedMount message for volumes), retried until it appears.
//! `testbed.rs` sets up a registry with a busybox image and a kubelet. Deviations it cannot
//! avoid, all documented where they happen:
//! - every pod shares the host network, but has its own loopback IP (127.0.X.Y, its
//!   `status.podIP`, what probes and Services reach): kiln's own servers listen on it
//!   (`KILN_LISTEN_IP`), and a Function's port 8080 is also mapped to a free host port by
//!   setting `FUNC_PORT` (and `PORT` for Knative), which [`TestKubelet::port`] gives;
//! - a Deployment runs `spec.replicas` pods and rolls a new template out as its ReplicaSets
//!   would (`maxSurge` rounded up, `maxUnavailable` down, 25 % each by default); a Knative
//!   Service runs one pod per revision;
//! - `resources` are recorded, not enforced (kiln run sets no cgroup limits); seccomp
//!   `RuntimeDefault` is accepted but kiln run applies no seccomp filter; capabilities are
//!   always all dropped and `no_new_privs` always set (so `drop: [ALL]` and
//!   `allowPrivilegeEscalation: false` are honoured); `readOnlyRootFilesystem` must be true;
//! - `runAsUser` without `runAsGroup` runs with gid = uid (containerd would take the image's
//!   passwd group); file ownership of volumes is not simulated (see `volumes.rs`);
//! - probes run every min(periodSeconds, 200 ms) and change state after failing for the
//!   kubelet's time budget ((failureThreshold − 1) × periodSeconds), see `runner.rs`;
//! - an image kiln cannot pull shows as the container failing (exit 1 or 2, kiln's error in
//!   its log), not as ErrImagePull; Services are routed by the API server itself (to a Ready
//!   pod's IP), and the TTL controller is not simulated.
//!
//! `tests/it/main.rs` declares it next to `common`; test modules `use crate::kubelet`.

#![allow(dead_code)]

pub mod allowlist;
pub mod api;
pub mod container;
pub mod env;
pub mod job;
mod job_run;
pub mod plan;
pub mod pod;
pub mod replica;
mod rollout;
mod runner;
pub mod spec;
pub mod testbed;
pub mod volumes;
pub mod workload_status;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

pub use volumes::Objects;

/// (namespace, name).
pub type Key = (String, String);

/// How the kubelet runs containers.
#[derive(Clone, Debug)]
pub struct Config {
    /// The kiln binary (`env!("CARGO_BIN_EXE_kiln")`).
    pub kiln: PathBuf,
    /// kiln's cache directory (unpacked images are shared by every pod).
    pub cache_dir: PathBuf,
    /// Extra `kiln run` arguments for every container, e.g. `--insecure-registry
    /// 127.0.0.1:PORT`, `--registry-auth FILE` (pulls).
    pub run_args: Vec<String>,
    /// Where pods' volumes, logs and termination files go.
    pub scratch: PathBuf,
    /// How many Job pods run at once; the rest stay Pending (Unschedulable).
    pub max_jobs: usize,
    /// `KILN_SANDBOX` for kiln (`bwrap`, `builtin`), or kiln's own choice.
    pub sandbox: Option<String>,
    /// The API server in-cluster clients reach (`KUBERNETES_SERVICE_HOST`/`_PORT`), if any.
    pub api: Option<(String, u16)>,
}

/// A pod the API server admitted: the spec it stored (ServiceAccount admission adds the
/// token volume) and its ServiceAccount's token, when the spec mounts one.
#[derive(Clone, Debug)]
pub struct Admitted {
    /// The stored spec.
    pub spec: k8s_openapi::api::core::v1::PodSpec,
    /// The token a projected `serviceAccountToken` source gets.
    pub token: Option<String>,
}

/// Creates a pod's object through the API server, as the Job and ReplicaSet controllers do
/// before a kubelet ever sees it: admission may refuse it (the error's message) or change it.
pub type Admission = Arc<dyn Fn(&Pod) -> Result<Admitted, String> + Send + Sync>;

impl Config {
    /// A config with no extra arguments, at most 5 Jobs at once, kiln's choice of sandbox.
    pub fn new(
        kiln: impl Into<PathBuf>,
        cache_dir: impl Into<PathBuf>,
        scratch: impl Into<PathBuf>,
    ) -> Config {
        Config {
            kiln: kiln.into(),
            cache_dir: cache_dir.into(),
            run_args: Vec::new(),
            scratch: scratch.into(),
            max_jobs: 5,
            sandbox: None,
            api: None,
        }
    }
}

/// The kubelet's shared state; pod threads update it, the API layer reads it.
pub(crate) struct Core {
    pub(crate) config: Config,
    pub(crate) token: String,
    state: Mutex<State>,
    slots: Condvar,
    shutdown: AtomicBool,
    /// Set once an API layer runs: every pod is created through it before it runs.
    pub(crate) admission: Mutex<Option<Admission>>,
    next_ip: AtomicU32,
}

/// Everything the kubelet tracks.
#[derive(Default)]
pub(crate) struct State {
    pub(crate) objects: Objects,
    pub(crate) pods: BTreeMap<Key, pod::PodRecord>,
    pub(crate) jobs: BTreeMap<Key, job::JobRecord>,
    pub(crate) workloads: BTreeMap<(replica::Kind, Key), replica::WorkloadRecord>,
    running_jobs: usize,
    threads: Vec<JoinHandle<()>>,
    pub(crate) failures: Vec<String>,
    /// Pods created through the API, with the status last written.
    pub(crate) written: BTreeMap<Key, serde_json::Value>,
}

impl Core {
    /// A new pod IP: 127.0.X.Y, never 127.0.0.1 (the host's), unique while the kubelet runs.
    pub(crate) fn pod_ip(&self) -> String {
        loop {
            let n = self.next_ip.fetch_add(1, Ordering::SeqCst) + 256;
            let [_, b, c, d] = n.to_be_bytes();
            if d != 0 && d != 255 {
                return format!("127.{b}.{c}.{d}");
            }
        }
    }

    /// The admission hook, if an API layer set one.
    pub(crate) fn admission(&self) -> Option<Admission> {
        self.admission
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn shutting_down(&self) -> bool {
        self.shutdown.load(Ordering::SeqCst)
    }

    /// Changes pod `key` (if it is still tracked) and records the change.
    pub(crate) fn update_pod(&self, key: &Key, change: impl FnOnce(&mut pod::PodRecord)) {
        if let Some(pod) = self.lock().pods.get_mut(key) {
            change(pod);
            pod.touch();
        }
    }

    /// Runs `work` on a new thread the kubelet joins when it is dropped.
    pub(crate) fn spawn(self: &Arc<Self>, work: impl FnOnce(Arc<Core>) + Send + 'static) {
        let core = Arc::clone(self);
        let handle = std::thread::spawn(move || work(core));
        self.lock().threads.push(handle);
    }

    /// Waits for a free Job slot; `None` when `give_up` says so first.
    pub(crate) fn acquire_slot(&self, give_up: impl Fn() -> bool) -> Option<SlotGuard<'_>> {
        let mut state = self.lock();
        loop {
            if give_up() || self.shutting_down() {
                return None;
            }
            if state.running_jobs < self.config.max_jobs {
                state.running_jobs += 1;
                return Some(SlotGuard { core: self });
            }
            let (next, _) = self
                .slots
                .wait_timeout(state, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner());
            state = next;
        }
    }
}

/// A running Job's slot, given back on drop.
pub(crate) struct SlotGuard<'a> {
    core: &'a Core,
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.core.lock().running_jobs -= 1;
        self.core.slots.notify_all();
    }
}

/// `n` random characters from the alphabet Kubernetes uses for generated names.
pub fn random_suffix(n: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut bytes = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("reading /dev/urandom");
    bytes
        .iter()
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect()
}

/// The test kubelet. Dropping it stops every container it started.
pub struct TestKubelet {
    pub(crate) core: Arc<Core>,
    /// Only the kubelet [`TestKubelet::new`] made stops the pods on drop.
    pub(crate) owner: bool,
}

impl TestKubelet {
    /// A kubelet with `config`; creates its scratch directory.
    pub fn new(config: Config) -> TestKubelet {
        std::fs::create_dir_all(&config.scratch).expect("creating the kubelet's scratch dir");
        let core = Core {
            config,
            token: format!("kiln-test-sa-token-{}", random_suffix(32)),
            state: Mutex::new(State::default()),
            slots: Condvar::new(),
            shutdown: AtomicBool::new(false),
            admission: Mutex::new(None),
            next_ip: AtomicU32::new(0),
        };
        let core = Arc::new(core);
        core.spawn(|core| replica::keep_rolling(&core));
        TestKubelet { core, owner: true }
    }

    /// The fake service-account token bound into pods that do not opt out.
    pub fn service_account_token(&self) -> &str {
        &self.core.token
    }

    /// Replaces the ConfigMaps and Secrets pods may use (pods starting later see them).
    pub fn set_objects(&self, objects: Objects) {
        self.core.lock().objects = objects;
    }

    /// Every pod the kubelet tracks, as Pod objects.
    pub fn pods(&self) -> Vec<Pod> {
        self.core
            .lock()
            .pods
            .values()
            .filter(|p| !p.deleted)
            .map(|p| p.to_pod())
            .collect()
    }

    /// One pod.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        let key = (namespace.to_string(), name.to_string());
        self.core.lock().pods.get(&key).map(|p| p.to_pod())
    }

    /// What a container wrote to stdout and stderr (kiln's own errors included), for
    /// diagnostics; empty when it never ran.
    pub fn logs(&self, namespace: &str, pod: &str, container: &str) -> String {
        let path = plan::log_file(&self.core.config.scratch, namespace, pod, container);
        std::fs::read_to_string(path).unwrap_or_default()
    }

    /// Every object the kubelet refused as unsupported so far (also printed to stderr).
    pub fn failures(&self) -> Vec<String> {
        self.core.lock().failures.clone()
    }

    /// Polls `check` every 50 ms until it gives a value or `timeout` passes.
    pub fn wait_for<T>(
        &self,
        timeout: Duration,
        mut check: impl FnMut(&TestKubelet) -> Option<T>,
    ) -> Option<T> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(value) = check(self) {
                return Some(value);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for TestKubelet {
    fn drop(&mut self) {
        if !self.owner {
            return;
        }
        self.core.shutdown.store(true, Ordering::SeqCst);
        self.core.slots.notify_all();
        let threads = std::mem::take(&mut self.core.lock().threads);
        for thread in threads {
            let _ = thread.join();
        }
    }
}
