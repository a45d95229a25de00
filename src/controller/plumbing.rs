//! Per-namespace plumbing (Kyma kept the same, serverless@legacy `internal/controllers/
//! kubernetes`): a build Job runs in its Function's namespace and mounts the registry Secret
//! and the CA ConfigMap from there, so the controller keeps copies of the ones in its own
//! namespace wherever it builds. Checked at most every few minutes per namespace, and written
//! only when the copy differs.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;

use super::apply;
use super::error::{Error, Result};
use super::names;
use super::reconcile::Context;

/// How long a namespace's copies are trusted without a look.
const FRESH: Duration = Duration::from_secs(300);

/// Namespaces whose copies were checked, and when.
#[derive(Default)]
pub struct Checked(Mutex<HashMap<String, Instant>>);

/// Makes sure `namespace` has the registry Secret (and the CA ConfigMap, if configured).
///
/// # Errors
/// The originals are missing, or an API request failed.
pub async fn ensure(ctx: &Context, namespace: &str) -> Result<()> {
    if namespace == ctx.config.namespace {
        return Ok(());
    }
    {
        let checked = ctx.plumbing.0.lock().unwrap_or_else(|e| e.into_inner());
        if checked
            .get(namespace)
            .is_some_and(|at| at.elapsed() < FRESH)
        {
            return Ok(());
        }
    }
    copy_secret(ctx, namespace).await?;
    if let Some(cm) = &ctx.config.ca_bundle_configmap {
        copy_config_map(ctx, namespace, cm).await?;
    }
    let mut checked = ctx.plumbing.0.lock().unwrap_or_else(|e| e.into_inner());
    checked.insert(namespace.to_string(), Instant::now());
    Ok(())
}

fn copy_meta(name: &str, namespace: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(namespace.into()),
        labels: Some(BTreeMap::from([(
            names::MANAGED_BY.to_string(),
            names::CONTROLLER.to_string(),
        )])),
        ..ObjectMeta::default()
    }
}

async fn copy_secret(ctx: &Context, namespace: &str) -> Result<()> {
    let name = &ctx.config.registry_secret;
    let from: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.config.namespace);
    let original = from
        .get_opt(name)
        .await
        .map_err(Error::kube(format!(
            "reading Secret {}/{name}",
            ctx.config.namespace
        )))?
        .ok_or_else(|| {
            Error::Missing(format!(
                "the registry Secret {}/{name} does not exist: build Jobs push with it",
                ctx.config.namespace
            ))
        })?;
    let mut copy = Secret {
        metadata: copy_meta(name, namespace),
        type_: original.type_.clone(),
        data: original.data.clone(),
        ..Secret::default()
    };
    super::render::stamp(&mut copy, |s| &mut s.metadata);
    let to: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let live = to
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("reading Secret {namespace}/{name}")))?;
    apply::apply(&to, "Secret", &copy, live.as_ref(), &ctx.verified).await?;
    Ok(())
}

async fn copy_config_map(ctx: &Context, namespace: &str, name: &str) -> Result<()> {
    let original =
        super::lookup::ca_bundle_config_map(&ctx.client, &ctx.config.namespace, name).await?;
    let mut copy = ConfigMap {
        metadata: copy_meta(name, namespace),
        data: original.data.clone(),
        ..ConfigMap::default()
    };
    super::render::stamp(&mut copy, |c| &mut c.metadata);
    let to: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), namespace);
    let live = to
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("reading ConfigMap {namespace}/{name}")))?;
    apply::apply(&to, "ConfigMap", &copy, live.as_ref(), &ctx.verified).await?;
    Ok(())
}
