//! The thin layer between the core and a Kubernetes API server reached with a `kube::Client`:
//! [`TestKubelet::sync`] lists ConfigMaps, Secrets, Jobs, Deployments and Knative Services in
//! every namespace, hands them to the core, then writes back what changed: Pods (`delete`
//! when gone; `patch_status`), and the status subresource of Jobs, Deployments and Knative
//! Services (JSON merge patches, `null` for fields that went away). A steady state writes
//! nothing. [`TestKubelet::spawn`] runs it every 200 ms on a background thread, and makes
//! every pod's object be created through the API before the pod runs (as the Job and
//! ReplicaSet controllers do): admission (ServiceAccounts, PodSecurity, webhooks) may refuse
//! or change it, and the pod runs what was admitted, with its ServiceAccount's token.
//!
//! The client's request buffer runs on the runtime that created the client, so keep that
//! runtime running (a multi-thread `#[tokio::test]`, or a test that awaits).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Client, Resource};
use serde_json::{Value, json};

use super::pod::Admission as PodAdmission;
use super::replica::Kind;
use super::{Admission, Admitted, Key, Objects, TestKubelet};

/// Why a sync failed.
#[derive(Debug)]
pub enum SyncError {
    /// An API request failed.
    Api {
        /// What was being done.
        action: String,
        /// The cause.
        source: kube::Error,
    },
    /// Objects the kubelet does not implement (one line each, naming the field).
    Unsupported(Vec<String>),
}

impl std::fmt::Display for SyncError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SyncError::Api { action, source } => write!(f, "{action}: {source}"),
            SyncError::Unsupported(lines) => write!(f, "{}", lines.join("\n")),
        }
    }
}

impl std::error::Error for SyncError {}

fn api_error(action: impl Into<String>) -> impl FnOnce(kube::Error) -> SyncError {
    let action = action.into();
    move |source| SyncError::Api { action, source }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Registers the kubelet's node, as a kubelet does when it starts: its labels say its
/// platform, what the controller builds Functions for by default.
async fn register_node(client: &Client) -> Result<(), SyncError> {
    use k8s_openapi::api::core::v1::Node;
    let node = Node {
        metadata: kube::api::ObjectMeta {
            name: Some(super::pod::NODE_NAME.into()),
            labels: Some(super::spec::node_labels()),
            ..Default::default()
        },
        ..Node::default()
    };
    let api: Api<Node> = Api::all(client.clone());
    match api.create(&PostParams::default(), &node).await {
        Err(e) if !is_status(&e, 409) => Err(api_error("registering the node")(e)),
        _ => Ok(()),
    }
}

/// The Knative Service resource.
fn knative() -> ApiResource {
    ApiResource {
        group: "serving.knative.dev".into(),
        version: "v1".into(),
        api_version: "serving.knative.dev/v1".into(),
        kind: "Service".into(),
        plural: "services".into(),
    }
}

fn key_of<K: Resource>(object: &K) -> Key {
    let meta = object.meta();
    let ns = meta.namespace.clone().unwrap_or_else(|| "default".into());
    (ns, meta.name.clone().unwrap_or_default())
}

/// A JSON merge patch turning `current` into `desired`: `desired`, plus `null` for every key
/// (in nested objects too) that `current` has and `desired` lacks.
pub fn merge_patch(current: &Value, desired: &Value) -> Value {
    match (current, desired) {
        (Value::Object(old), Value::Object(new)) => {
            let mut patch = serde_json::Map::new();
            for (k, v) in new {
                let inner = old.get(k).map_or_else(|| v.clone(), |o| merge_patch(o, v));
                patch.insert(k.clone(), inner);
            }
            for k in old.keys().filter(|k| !new.contains_key(*k)) {
                patch.insert(k.clone(), Value::Null);
            }
            Value::Object(patch)
        }
        _ => desired.clone(),
    }
}

impl TestKubelet {
    /// One pass: read the API, act, write back what changed; returns the number of writes.
    ///
    /// # Errors
    /// An API request that failed, or objects the kubelet does not implement (after doing
    /// everything else).
    pub async fn sync(&self, client: &Client) -> Result<usize, SyncError> {
        let lp = ListParams::default();
        let mut objects = Objects::default();
        let cms = Api::<ConfigMap>::all(client.clone()).list(&lp).await;
        cms.map_err(api_error("listing ConfigMaps"))?
            .iter()
            .for_each(|c| objects.add_config_map(c));
        let secrets = Api::<Secret>::all(client.clone()).list(&lp).await;
        secrets
            .map_err(api_error("listing Secrets"))?
            .iter()
            .for_each(|s| objects.add_secret(s));
        self.set_objects(objects);
        let mut unsupported = Vec::new();

        // A Pod object deleted through the API (`kubectl delete pod`): the kubelet stops it,
        // and its ReplicaSet replaces it.
        let listing = std::time::Instant::now();
        let listed_pods = Api::<Pod>::all(client.clone()).list(&lp).await;
        let listed_pods: std::collections::BTreeSet<Key> = listed_pods
            .map_err(api_error("listing Pods"))?
            .iter()
            .map(key_of)
            .collect();
        self.stop_pods_deleted_from(&listed_pods, listing);

        let jobs = Api::<Job>::all(client.clone())
            .list(&lp)
            .await
            .map_err(api_error("listing Jobs"))?;
        for job in &jobs {
            if let Err(e) = self.start_job(job) {
                unsupported.push(format!("Job {}/{}: {e}", key_of(job).0, key_of(job).1));
            }
        }
        let listed: Vec<Key> = jobs.iter().map(key_of).collect();
        let known: Vec<Key> = self.core.lock().jobs.keys().cloned().collect();
        for (ns, name) in known.iter().filter(|k| !listed.contains(k)) {
            self.stop_job(ns, name);
        }

        let deployments = Api::<Deployment>::all(client.clone()).list(&lp).await;
        let deployments = deployments.map_err(api_error("listing Deployments"))?;
        for d in &deployments {
            if let Err(e) = self.apply_deployment(d) {
                unsupported.push(format!("Deployment {}/{}: {e}", key_of(d).0, key_of(d).1));
            }
        }
        let services = match Api::<DynamicObject>::all_with(client.clone(), &knative())
            .list(&lp)
            .await
        {
            Ok(list) => list.items,
            // Knative Serving is not installed in this API.
            Err(e) if is_status(&e, 404) => Vec::new(),
            Err(e) => return Err(api_error("listing Knative Services")(e)),
        };
        for s in &services {
            let value = serde_json::to_value(s).unwrap_or_default();
            if let Err(e) = self.apply_knative_service(&value) {
                unsupported.push(format!(
                    "Knative Service {}/{}: {e}",
                    key_of(s).0,
                    key_of(s).1
                ));
            }
        }
        self.forget_workloads(Kind::Deployment, deployments.iter().map(key_of).collect());
        self.forget_workloads(Kind::Knative, services.iter().map(key_of).collect());

        // Job statuses are taken before the Pods are written: a Job is then never written
        // Complete while its Pod still reads Running (a test that waits for the Job reads both).
        let job_statuses = self.job_statuses(&jobs.items);
        let mut writes = self.write_pods(client).await?;
        writes += self.write_job_statuses(client, job_statuses).await?;
        writes += self
            .write_deployment_statuses(client, &deployments.items)
            .await?;
        writes += self.write_knative_statuses(client, &services).await?;
        if unsupported.is_empty() {
            return Ok(writes);
        }
        let mut state = self.core.lock();
        for line in &unsupported {
            if !state.failures.contains(line) {
                eprintln!("test kubelet: {line}");
                state.failures.push(line.clone());
            }
        }
        Err(SyncError::Unsupported(unsupported))
    }

    /// Stops the pods admitted before `listing` began whose objects `listed` lacks.
    fn stop_pods_deleted_from(
        &self,
        listed: &std::collections::BTreeSet<Key>,
        listing: std::time::Instant,
    ) {
        let gone: Vec<Key> = {
            let state = self.core.lock();
            state
                .pods
                .iter()
                .filter(|(k, p)| {
                    matches!(p.admission, PodAdmission::Admitted(at) if at < listing)
                        && !p.deleted
                        && !listed.contains(*k)
                })
                .map(|(k, _)| k.clone())
                .collect()
        };
        for key in gone {
            self.kill_pod(&key);
        }
    }

    fn forget_workloads(&self, kind: Kind, listed: Vec<Key>) {
        let known: Vec<Key> = self
            .core
            .lock()
            .workloads
            .keys()
            .filter(|(k, _)| *k == kind)
            .map(|(_, key)| key.clone())
            .collect();
        for (ns, name) in known.iter().filter(|k| !listed.contains(k)) {
            self.stop_workload(kind, ns, name);
        }
    }

    async fn write_pods(&self, client: &Client) -> Result<usize, SyncError> {
        let pods: Vec<(Key, bool, Pod)> = {
            let state = self.core.lock();
            state
                .pods
                .iter()
                // A pod whose object admission has not let in yet has nothing to write.
                .filter(|(_, p)| !matches!(p.admission, PodAdmission::Pending(_)))
                .map(|(k, p)| (k.clone(), p.deleted, p.to_pod()))
                .collect()
        };
        let mut writes = 0;
        for ((ns, name), deleted, mut pod) in pods {
            let api = Api::<Pod>::namespaced(client.clone(), &ns);
            let key = (ns.clone(), name.clone());
            let written = self.core.lock().written.get(&key).cloned();
            if deleted {
                if written.is_some() {
                    match api.delete(&name, &DeleteParams::default()).await {
                        Ok(_) => writes += 1,
                        Err(e) if is_status(&e, 404) => {}
                        Err(e) => return Err(api_error(format!("deleting Pod {ns}/{name}"))(e)),
                    }
                }
                let mut state = self.core.lock();
                state.written.remove(&key);
                state.pods.remove(&key);
                continue;
            }
            let status = serde_json::to_value(pod.status.take()).unwrap_or_default();
            if written.is_none() {
                // The API server assigns the uid.
                pod.metadata.uid = None;
                match api.create(&PostParams::default(), &pod).await {
                    Ok(_) => writes += 1,
                    Err(e) if is_status(&e, 409) => {}
                    Err(e) => return Err(api_error(format!("creating Pod {ns}/{name}"))(e)),
                }
            }
            let current = written.unwrap_or(Value::Null);
            if current != status {
                let patch = Patch::Merge(json!({"status": merge_patch(&current, &status)}));
                let result = api
                    .patch_status(&name, &PatchParams::default(), &patch)
                    .await;
                result.map_err(api_error(format!("writing the status of Pod {ns}/{name}")))?;
                writes += 1;
            }
            self.core.lock().written.insert(key, status);
        }
        Ok(writes)
    }

    /// Each listed Job with the status it should have now.
    fn job_statuses<'j>(&self, jobs: &'j [Job]) -> Vec<(&'j Job, Value)> {
        jobs.iter()
            .filter_map(|job| {
                let (ns, name) = key_of(job);
                let desired = self.job_status(&ns, &name)?;
                Some((job, serde_json::to_value(desired).unwrap_or_default()))
            })
            .collect()
    }

    async fn write_job_statuses(
        &self,
        client: &Client,
        statuses: Vec<(&Job, Value)>,
    ) -> Result<usize, SyncError> {
        let mut writes = 0;
        for (job, desired) in statuses {
            let (ns, name) = key_of(job);
            let current = serde_json::to_value(&job.status).unwrap_or_default();
            let api = Api::<Job>::namespaced(client.clone(), &ns);
            writes += patch_status(&api, &name, &current, &desired).await?;
        }
        Ok(writes)
    }

    async fn write_deployment_statuses(
        &self,
        client: &Client,
        deployments: &[Deployment],
    ) -> Result<usize, SyncError> {
        let mut writes = 0;
        for d in deployments {
            let (ns, name) = key_of(d);
            let Some(desired) = self.deployment_status(&ns, &name) else {
                continue;
            };
            let current = serde_json::to_value(&d.status).unwrap_or_default();
            let api = Api::<Deployment>::namespaced(client.clone(), &ns);
            writes += patch_status(
                &api,
                &name,
                &current,
                &serde_json::to_value(desired).unwrap_or_default(),
            )
            .await?;
        }
        Ok(writes)
    }

    async fn write_knative_statuses(
        &self,
        client: &Client,
        services: &[DynamicObject],
    ) -> Result<usize, SyncError> {
        let mut writes = 0;
        for s in services {
            let (ns, name) = key_of(s);
            let Some(desired) = self.knative_status(&ns, &name) else {
                continue;
            };
            let current = s.data.get("status").cloned().unwrap_or(Value::Null);
            let api = Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &knative());
            writes += patch_status(&api, &name, &current, &desired).await?;
        }
        Ok(writes)
    }

    /// Runs [`TestKubelet::sync`] every 200 ms on a background thread until the handle is
    /// dropped (or the kubelet is). API errors are printed once each; unsupported objects
    /// make the handle panic when it is dropped.
    pub fn spawn(&self, client: Client) -> KubeletHandle {
        let admitting = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime for the kubelet's pod creations");
        *self
            .core
            .admission
            .lock()
            .unwrap_or_else(|e| e.into_inner()) =
            Some(admission(client.clone(), admitting.handle().clone()));
        let stop = Arc::new(AtomicBool::new(false));
        let errors = Arc::new(Mutex::new(Vec::<String>::new()));
        // A view of the same core: dropping it does not stop the pods.
        let kubelet = TestKubelet {
            core: Arc::clone(&self.core),
            owner: false,
        };
        let (flag, seen) = (Arc::clone(&stop), Arc::clone(&errors));
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            let runtime = runtime.expect("a tokio runtime for the kubelet's sync loop");
            if let Err(e) = runtime.block_on(register_node(&client)) {
                eprintln!("test kubelet: {e}");
                seen.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(e.to_string());
            }
            while !flag.load(Ordering::SeqCst) && !kubelet.core.shutting_down() {
                if let Err(e) = runtime.block_on(kubelet.sync(&client)) {
                    let line = e.to_string();
                    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                    if !seen.contains(&line) {
                        eprintln!("test kubelet sync: {line}");
                        seen.push(line);
                    }
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        KubeletHandle {
            stop,
            thread: Some(thread),
            core: Arc::clone(&self.core),
            _admitting: Some(admitting),
        }
    }
}

/// Creates pods' objects through `client` (on `runtime`), and fetches the ServiceAccount
/// token of those whose admitted spec projects one (TokenRequest, as the kubelet does).
fn admission(client: Client, runtime: tokio::runtime::Handle) -> Admission {
    Arc::new(move |pod: &Pod| {
        let mut pod = pod.clone();
        pod.status = None;
        pod.metadata.uid = None;
        let (ns, name) = key_of(&pod);
        let pods = Api::<Pod>::namespaced(client.clone(), &ns);
        let accounts = Api::<ServiceAccount>::namespaced(client.clone(), &ns);
        runtime.block_on(async move {
            let created = match pods.create(&PostParams::default(), &pod).await {
                Ok(created) => created,
                // Created by an earlier attempt whose answer was lost.
                Err(e) if is_status(&e, 409) => pods.get(&name).await.map_err(|e| e.to_string())?,
                Err(kube::Error::Api(status)) => return Err(status.message),
                Err(e) => return Err(e.to_string()),
            };
            let spec = created.spec.unwrap_or_default();
            let projects_token = spec.volumes.iter().flatten().any(|v| {
                v.projected.as_ref().is_some_and(|p| {
                    p.sources
                        .iter()
                        .flatten()
                        .any(|s| s.service_account_token.is_some())
                })
            });
            let token = if projects_token {
                let account = spec.service_account_name.clone().unwrap_or_default();
                let request = TokenRequest {
                    spec: TokenRequestSpec {
                        expiration_seconds: Some(3607),
                        ..TokenRequestSpec::default()
                    },
                    ..TokenRequest::default()
                };
                let answer = accounts
                    .create_token_request(&account, &PostParams::default(), &request)
                    .await
                    .map_err(|e| format!("requesting a token for {ns}/{account}: {e}"))?;
                answer.status.map(|s| s.token)
            } else {
                None
            };
            Ok(Admitted { spec, token })
        })
    })
}

async fn patch_status<K>(
    api: &Api<K>,
    name: &str,
    current: &Value,
    desired: &Value,
) -> Result<usize, SyncError>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if current == desired {
        return Ok(0);
    }
    let patch = Patch::Merge(json!({"status": merge_patch(current, desired)}));
    let result = api
        .patch_status(name, &PatchParams::default(), &patch)
        .await;
    result.map_err(api_error(format!("writing the status of {name}")))?;
    Ok(1)
}

/// The background sync loop of [`TestKubelet::spawn`]; dropping it stops the loop.
pub struct KubeletHandle {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    core: Arc<super::Core>,
    _admitting: Option<tokio::runtime::Runtime>,
}

impl KubeletHandle {
    /// Objects the kubelet refused as unsupported so far.
    pub fn failures(&self) -> Vec<String> {
        self.core.lock().failures.clone()
    }
}

impl Drop for KubeletHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        *self
            .core
            .admission
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
        if let Some(runtime) = self._admitting.take() {
            runtime.shutdown_background();
        }
        let failures = self.failures();
        if !failures.is_empty() && !std::thread::panicking() {
            panic!(
                "the test kubelet refused objects it does not implement:\n{}",
                failures.join("\n")
            );
        }
    }
}
