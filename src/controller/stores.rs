//! The watch caches of everything the controller creates, filtered to its own label: in the
//! build namespace, ConfigMaps, Jobs and Secrets; everywhere, Deployments, Services, HPAs
//! and Knative Services. Reconciles read children
//! from here, not from the API server: a steady-state resync costs no requests. The same
//! watch streams wake the owning Function's reconcile when a child changes.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::batch::v1::Job;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::watch;

use super::crd::Function;
use super::names;

/// The label selector of every watch: objects the controller manages.
pub fn managed_selector() -> String {
    format!("{}={}", names::MANAGED_BY, names::CONTROLLER)
}

/// The Knative Service API resource.
pub fn knative_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("serving.knative.dev", "v1", "Service"),
        "services",
    )
}

/// The caches.
#[derive(Clone)]
pub struct Stores {
    /// ConfigMaps in the build namespace: build sources, the records of built images.
    pub config_maps: Store<ConfigMap>,
    /// Build Jobs (in the build namespace).
    pub jobs: Store<Job>,
    /// Secrets in the build namespace: the build's copies of tenants' Secrets.
    pub secrets: Store<Secret>,
    /// Deployments.
    pub deployments: Store<Deployment>,
    /// Services.
    pub services: Store<Service>,
    /// HPAs.
    pub hpas: Store<HorizontalPodAutoscaler>,
    /// Knative Services (only with `--serving knative`).
    pub knative: Option<Store<DynamicObject>>,
    ready: watch::Receiver<bool>,
}

impl Stores {
    /// The caches, and a task (on the current Tokio runtime) that tells when all of them
    /// have listed once.
    pub fn new(
        config_maps: Store<ConfigMap>,
        jobs: Store<Job>,
        secrets: Store<Secret>,
        deployments: Store<Deployment>,
        services: Store<Service>,
        hpas: Store<HorizontalPodAutoscaler>,
        knative: Option<Store<DynamicObject>>,
    ) -> Stores {
        let (tell, ready) = watch::channel(false);
        let stores = Stores {
            config_maps,
            jobs,
            secrets,
            deployments,
            services,
            hpas,
            knative,
            ready,
        };
        let caches = stores.clone();
        // kube's `Store::wait_until_ready` wakes only the last task that polled it (one
        // oneshot receiver behind a mutex): reconciles waiting on it side by side would stay
        // asleep for good, and kube never reconciles an object again while its reconcile
        // hangs. So this one task waits on every cache and tells every reconcile at once.
        tokio::spawn(async move {
            // An error means the writer was dropped: the controller is shutting down.
            let _ = caches.config_maps.wait_until_ready().await;
            let _ = caches.jobs.wait_until_ready().await;
            let _ = caches.secrets.wait_until_ready().await;
            let _ = caches.deployments.wait_until_ready().await;
            let _ = caches.services.wait_until_ready().await;
            let _ = caches.hpas.wait_until_ready().await;
            if let Some(k) = &caches.knative {
                let _ = k.wait_until_ready().await;
            }
            let _ = tell.send(true);
        });
        stores
    }

    /// Waits until every cache has listed once.
    pub async fn wait_ready(&self) {
        let mut ready = self.ready.clone();
        // An error means the task ended without telling: the runtime is shutting down.
        let _ = ready.wait_for(|r| *r).await;
    }

    /// The build Jobs of Function `f` (any build key).
    pub fn jobs_of(&self, f: &Function) -> Vec<Arc<Job>> {
        of_function(self.jobs.state(), f, |j| &j.metadata)
    }

    /// The build ConfigMaps of Function `f` (its record too).
    pub fn config_maps_of(&self, f: &Function) -> Vec<Arc<ConfigMap>> {
        of_function(self.config_maps.state(), f, |c| &c.metadata)
    }

    /// The build Secret copies of Function `f`.
    pub fn secrets_of(&self, f: &Function) -> Vec<Arc<Secret>> {
        of_function(self.secrets.state(), f, |s| &s.metadata)
    }
}

/// A namespaced object reference.
pub fn object_ref<K: kube::Resource<DynamicType = ()>>(
    namespace: &str,
    name: &str,
) -> ObjectRef<K> {
    ObjectRef::new(name).within(namespace)
}

/// The Function a build-namespace object was made for, by its labels: `(namespace, name)`.
pub fn function_of(meta: &ObjectMeta) -> Option<(&str, &str)> {
    let labels = meta.labels.as_ref()?;
    Some((
        labels.get(names::FUNCTION_NAMESPACE)?.as_str(),
        labels.get(names::FUNCTION_NAME)?.as_str(),
    ))
}

/// What the build namespace holds for the Function named as `f` (whichever UID it had).
fn of_function<K>(all: Vec<Arc<K>>, f: &Function, meta: impl Fn(&K) -> &ObjectMeta) -> Vec<Arc<K>> {
    let id = (f.namespace_or_default(), f.name_or_empty());
    all.into_iter()
        .filter(|o| function_of(meta(o)) == Some(id))
        .collect()
}
