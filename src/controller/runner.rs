//! `kiln controller`: wires the watches, caches, leader election and endpoints around the
//! reconcile and runs until SIGTERM (or until leadership is lost, which ends the process so
//! that Kubernetes restarts it as a candidate).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::{Api, DynamicObject};
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;

use super::config::{Config, Serving};
use super::context::Context;
use super::crd::Function;
use super::error::{Error, Result};
use super::leader::Candidate;
use super::lookup::{CommitResolver, Images, NodePlatforms, RegistryConfigs};
use super::metrics::Metrics;
use super::reconcile::{error_policy, reconcile};
use super::server::{self, Shared};
use super::slots::{BuildSlots, StillWaiting, is_active};
use super::stores::{Stores, function_of, knative_resource, managed_selector};
use crate::runtime::Catalog;

/// How the controller process runs.
pub struct Options {
    /// The API client.
    pub client: kube::Client,
    /// The reconcile settings.
    pub config: Config,
    /// The registry client (for "is this image built?" and image digests).
    pub registry: crate::registry::Client,
    /// Resolves git references.
    pub git: Arc<dyn CommitResolver>,
    /// Where /metrics, /healthz and /readyz are served.
    pub metrics_address: SocketAddr,
    /// Leader election: the Lease's name, or `None` to reconcile without one.
    pub lease: Option<String>,
    /// How long the Lease lasts unrenewed.
    pub lease_duration: Duration,
    /// This replica's identity (its Pod's name).
    pub identity: String,
    /// Reconciles running at once.
    pub workers: u16,
    /// Every Function is reconciled again this often.
    pub resync: Option<Duration>,
}

/// Runs the controller until a signal ends it.
///
/// # Errors
/// The endpoints cannot be served, or leadership was lost.
pub async fn run(opts: Options) -> Result<()> {
    let metrics = Arc::new(Metrics::default());
    let ready = Arc::new(AtomicBool::new(false));
    let jobs_for_metrics = serve(&opts, &metrics, &ready).await?;
    let candidate = opts.lease.as_ref().map(|lease| {
        Candidate::new(
            opts.client.clone(),
            &opts.config.namespace,
            lease,
            &opts.identity,
            opts.lease_duration,
        )
    });
    match &candidate {
        Some(c) => c.acquire(&ready).await,
        None => ready.store(true, Ordering::Relaxed),
    }
    metrics.set_leading(true);
    let (mut controller, stores) = watching(&opts, &jobs_for_metrics);
    let (wake, woken) = tokio::sync::mpsc::unbounded_channel();
    let reporter = Reporter {
        controller: "kiln-controller".into(),
        instance: Some(opts.identity.clone()),
    };
    let rollouts = super::rebases::Rollouts::new(
        opts.config.max_rollouts,
        opts.config.max_rollouts_per_namespace,
        Some(wake.clone()),
    );
    let slots = BuildSlots::new(opts.config.max_build_jobs, Some(wake))
        .with_check(still_waiting(controller.store()));
    let ctx = context(
        &opts,
        Recorder::new(opts.client.clone(), reporter),
        (slots, rollouts),
        stores,
        &metrics,
    );
    controller = controller
        .reconcile_on(futures_util::stream::unfold(woken, |mut rx| async move {
            rx.recv().await.map(|r| (r, rx))
        }));
    // Every Function again: every `--resync` interval, whenever SIGHUP arrives, and when a
    // runtime's base or builder image changes (its rebase or rebuild).
    let hangups = hangups().map_err(|e| Error::Missing(format!("listening for SIGHUP: {e}")))?;
    let hangups = futures_util::stream::select(hangups, image_changes(ctx.clone()));
    controller = match opts.resync {
        Some(every) => {
            controller.reconcile_all_on(futures_util::stream::select(ticks(every), hangups))
        }
        None => controller.reconcile_all_on(hangups),
    };
    let sweeper = tokio::spawn(super::sweep::run(ctx.clone(), controller.store()));
    let queue = ctx.clone();
    let controller = controller
        .with_config(controller::Config::default().concurrency(opts.workers))
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(move |result| {
            log_pass(result);
            queue.metrics.set_queued(queue.slots.waiting());
            std::future::ready(())
        });
    let outcome = match &candidate {
        Some(c) => {
            tokio::select! {
                () = controller => Ok(()),
                () = c.keep() => Err(Error::Missing("lost the leader lease; exiting so that \
                    another replica takes over".into())),
            }
        }
        None => {
            controller.await;
            Ok(())
        }
    };
    sweeper.abort();
    outcome
}

/// The controller of Functions, woken by what they own (Deployments, Services, autoscalers
/// and Knative Services, by owner reference) and by their builds' ConfigMaps, Jobs and
/// Secrets in the build namespace (by labels); and the stores those watches fill. The Job
/// store also goes into `jobs_for_metrics`.
fn watching(
    opts: &Options,
    jobs_for_metrics: &Mutex<Option<Store<Job>>>,
) -> (Controller<Function>, Stores) {
    let client = opts.client.clone();
    let builds = opts.config.build_namespace.clone();
    let (config_maps, cm_stream) = cache::<ConfigMap>(&client, Some(&builds));
    let (jobs, job_stream) = cache::<Job>(&client, Some(&builds));
    let (secrets, secret_stream) = cache::<Secret>(&client, Some(&builds));
    let (deployments, deploy_stream) = cache::<Deployment>(&client, None);
    let (services, service_stream) = cache::<Service>(&client, None);
    let (hpas, hpa_stream) = cache::<HorizontalPodAutoscaler>(&client, None);
    *jobs_for_metrics.lock().unwrap_or_else(|e| e.into_inner()) = Some(jobs.clone());
    let knative = (opts.config.serving == Serving::Knative).then(|| knative_cache(&client));
    let stores = Stores::new(
        config_maps,
        jobs,
        secrets,
        deployments,
        services,
        hpas,
        knative.as_ref().map(|(s, _)| s.clone()),
    );
    let mut controller = Controller::new(
        Api::<Function>::all(client.clone()),
        watcher::Config::default(),
    )
    // What the build namespace holds names its Function by labels: no owner reference can
    // cross namespaces.
    .watches_stream(cm_stream, |o| function_ref(&o.metadata))
    .watches_stream(job_stream, |o| function_ref(&o.metadata))
    .watches_stream(secret_stream, |o| function_ref(&o.metadata))
    .owns_stream(deploy_stream)
    .owns_stream(service_stream)
    .owns_stream(hpa_stream);
    if let Some((_, stream)) = knative {
        controller = controller.owns_stream_with(stream, knative_resource());
    }
    (controller, stores)
}

/// Serves metrics and probes; the returned slot is where the Job store goes once it exists
/// (the running-builds gauge reads it).
async fn serve(
    opts: &Options,
    metrics: &Arc<Metrics>,
    ready: &Arc<AtomicBool>,
) -> Result<Arc<Mutex<Option<Store<Job>>>>> {
    let jobs_for_metrics: Arc<Mutex<Option<Store<Job>>>> = Arc::default();
    let running = {
        let jobs = jobs_for_metrics.clone();
        Arc::new(move || {
            let jobs = jobs.lock().unwrap_or_else(|e| e.into_inner());
            jobs.as_ref()
                .map_or(0, |s| s.state().iter().filter(|j| is_active(j)).count())
        })
    };
    let shared = Shared {
        metrics: metrics.clone(),
        ready: ready.clone(),
        running,
    };
    server::serve(opts.metrics_address, shared)
        .await
        .map_err(|e| Error::Missing(format!("serving metrics on {}: {e}", opts.metrics_address)))?;
    Ok(jobs_for_metrics)
}

/// What every reconcile shares.
fn context(
    opts: &Options,
    recorder: Recorder,
    (slots, rollouts): (BuildSlots, super::rebases::Rollouts),
    stores: Stores,
    metrics: &Arc<Metrics>,
) -> Arc<Context> {
    Arc::new(Context {
        recorder,
        images: Images::new(opts.registry.clone(), opts.config.image_cache_ttl),
        nodes: NodePlatforms::new(opts.config.image_cache_ttl),
        registry_configs: RegistryConfigs::new(
            opts.config.package_registry_secret.clone(),
            opts.config.image_cache_ttl,
        ),
        slots,
        rollouts,
        new_bases: Default::default(),
        taken: Default::default(),
        signing_keys: Default::default(),
        written: Default::default(),
        git: opts.git.clone(),
        git_checked: Mutex::default(),
        catalog: Catalog::embedded(),
        plumbing: Default::default(),
        verified: Default::default(),
        metrics: metrics.clone(),
        stores,
        config: opts.config.clone(),
        client: opts.client.clone(),
    })
}

/// Logs what a pass's failure says beyond what `error_policy` logged.
fn log_pass<T>(result: std::result::Result<T, controller::Error<Error, watcher::Error>>) {
    match result {
        // Already logged with the Function by `error_policy`.
        Ok(_) | Err(controller::Error::ReconcilerFailed(..)) => {}
        // A change for a Function deleted meanwhile: nothing to do.
        Err(controller::Error::ObjectNotFound(o)) => tracing::debug!(
            namespace = o.namespace.as_deref().unwrap_or_default(),
            function = %o.name,
            "the Function is gone"
        ),
        Err(e) => tracing::warn!(error = %e, "the controller's queue"),
    }
}

/// The Function a build-namespace object belongs to, by its labels.
fn function_ref(meta: &ObjectMeta) -> Option<reflector::ObjectRef<Function>> {
    let (namespace, name) = function_of(meta)?;
    Some(reflector::ObjectRef::new(name).within(namespace))
}

/// Whether a queued Function still waits, by the Functions' watch cache.
fn still_waiting(functions: Store<Function>) -> StillWaiting {
    Box::new(move |namespace, name, generation| {
        let key = reflector::ObjectRef::new(name).within(namespace);
        functions.get(&key).is_some_and(|f| {
            f.metadata.deletion_timestamp.is_none() && f.metadata.generation == generation
        })
    })
}

/// A watch cache of `K` objects the controller manages (in `namespace`, or everywhere), and
/// the stream that feeds it.
fn cache<K>(
    client: &kube::Client,
    namespace: Option<&str>,
) -> (
    Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let config = watcher::Config::default().labels(&managed_selector());
    let api = match namespace {
        Some(ns) => Api::<K>::namespaced(client.clone(), ns),
        None => Api::<K>::all(client.clone()),
    };
    let stream = watcher(api, config)
        .default_backoff()
        .reflect(writer)
        .touched_objects();
    (reader, stream)
}

type KnativeCache = (
    Store<DynamicObject>,
    futures_util::stream::BoxStream<'static, Result<DynamicObject, watcher::Error>>,
);

fn knative_cache(client: &kube::Client) -> KnativeCache {
    let resource = knative_resource();
    let writer = reflector::store::Writer::new(resource.clone());
    let reader = writer.as_reader();
    let config = watcher::Config::default().labels(&managed_selector());
    let stream = watcher(
        Api::<DynamicObject>::all_with(client.clone(), &resource),
        config,
    )
    .default_backoff()
    .reflect(writer)
    .touched_objects()
    .boxed();
    (reader, stream)
}

fn hangups() -> std::io::Result<impl Stream<Item = ()> + Send + 'static> {
    let signal = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    Ok(futures_util::stream::unfold(signal, |mut s| async move {
        s.recv().await.map(|()| {
            tracing::info!("SIGHUP: reconciling every Function");
            ((), s)
        })
    }))
}

/// Yields when a runtime's base or builder image tag names another digest than the last
/// look, one TTL (`image_cache_ttl`) after another. A lookup that fails changes nothing.
fn image_changes(ctx: Arc<Context>) -> impl Stream<Item = ()> + Send + 'static {
    let every = ctx.config.image_cache_ttl.max(Duration::from_secs(1));
    futures_util::stream::unfold((ctx, None), move |(ctx, mut last)| async move {
        loop {
            tokio::time::sleep(every).await;
            let mut now = BTreeMap::new();
            for images in ctx.config.runtimes.values() {
                for reference in [&images.base, &images.builder] {
                    let known = last
                        .as_ref()
                        .and_then(|l: &BTreeMap<String, _>| l.get(reference));
                    match ctx.images.resolve(reference).await {
                        Ok((_, digest)) => _ = now.insert(reference.clone(), digest),
                        Err(_) => {
                            if let Some(digest) = known.cloned() {
                                now.insert(reference.clone(), digest);
                            }
                        }
                    }
                }
            }
            let changed = last.as_ref().is_some_and(|l| *l != now);
            last = Some(now);
            if changed {
                tracing::info!(
                    "a runtime's base or builder image changed: reconciling every Function"
                );
                return Some(((), (ctx, last)));
            }
        }
    })
}

fn ticks(every: Duration) -> impl Stream<Item = ()> + Send + 'static {
    futures_util::stream::unfold((), move |()| async move {
        tokio::time::sleep(every).await;
        Some(((), ()))
    })
}
