//! The garbage collection of the build namespace. What the controller keeps there for a
//! Function (build Jobs, source ConfigMaps, Secret copies, the record of built images) can
//! carry no owner reference to it — owner references cannot cross namespaces — so when a
//! Function is deleted, the garbage collector does not take these with it. Every few seconds
//! this deletes those whose Function, named by their labels, no longer exists, by the watch
//! caches: a sweep that finds nothing costs no request. A record of built images outlives
//! its Function by [`RECORD_TTL`] after its latest build, so that a Function deleted and
//! created again (a GitOps sync, a namespace restored) runs its image without a rebuild.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::reflector::Store;

use super::apply;
use super::context::Context;
use super::crd::Function;
use super::records;
use super::stores::function_of;

/// How often the build namespace is swept.
pub const EVERY: Duration = Duration::from_secs(5);

/// How long after its latest build the record of a deleted Function is kept.
pub const RECORD_TTL: Duration = Duration::from_secs(24 * 3600);

/// Sweeps until the task is aborted.
pub async fn run(ctx: Arc<Context>, functions: Store<Function>) {
    ctx.stores.wait_ready().await;
    if functions.wait_until_ready().await.is_err() {
        return;
    }
    loop {
        if let Err(e) = sweep(&ctx, &functions).await {
            tracing::warn!(error = %e.chain(), "sweeping the build namespace");
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// An object whose Function is gone: its name, and the Function's namespace and name.
struct Orphan {
    name: String,
    namespace: String,
    function: String,
}

fn orphans<K>(
    all: Vec<Arc<K>>,
    live: &HashSet<(String, String)>,
    meta: impl Fn(&K) -> &ObjectMeta,
) -> Vec<Orphan> {
    all.iter()
        .filter_map(|o| {
            let m = meta(o);
            let (namespace, function) = function_of(m)?;
            let gone = !live.contains(&(namespace.to_string(), function.to_string()));
            gone.then(|| Orphan {
                name: m.name.clone().unwrap_or_default(),
                namespace: namespace.into(),
                function: function.into(),
            })
        })
        .collect()
}

async fn sweep(ctx: &Context, functions: &Store<Function>) -> super::error::Result<()> {
    let live: HashSet<(String, String)> = functions
        .state()
        .iter()
        .map(|f| {
            (
                f.namespace_or_default().to_string(),
                f.name_or_empty().to_string(),
            )
        })
        .collect();
    let ns = ctx.config.build_namespace.as_str();
    let client = &ctx.client;
    for o in orphans(ctx.stores.jobs.state(), &live, |j| &j.metadata) {
        tracing::info!(
            namespace = %o.namespace,
            function = %o.function,
            job = %o.name,
            "deleting the build Job of a deleted Function",
        );
        apply::delete(&Api::<Job>::namespaced(client.clone(), ns), "Job", &o.name).await?;
    }
    let now = u64::try_from(k8s_openapi::jiff::Timestamp::now().as_second()).unwrap_or(0);
    let expired = ctx.stores.config_maps.state().into_iter().filter(|cm| {
        !records::is_record(cm)
            || records::latest(cm).is_none_or(|at| at + RECORD_TTL.as_secs() < now)
    });
    for o in orphans(expired.collect(), &live, |c| &c.metadata) {
        let api = Api::<ConfigMap>::namespaced(client.clone(), ns);
        apply::delete(&api, "ConfigMap", &o.name).await?;
    }
    for o in orphans(ctx.stores.secrets.state(), &live, |s| &s.metadata) {
        let api = Api::<Secret>::namespaced(client.clone(), ns);
        apply::delete(&api, "Secret", &o.name).await?;
    }
    Ok(())
}
