//! Per-namespace plumbing. The build namespace gets copies of the push Secret, the cache
//! signing Secret and the CA ConfigMap from the controller's namespace, which its build Jobs
//! mount. The cache signing Secret (an Ed25519 key that signs the shared dependency cache's
//! entries, [`crate::signing`]) is made by the controller the first time it is needed, unless
//! the operator made one. A Function's
//! namespace gets, only when the registry needs credentials to pull, a copy of the pull-only
//! Secret and the Function ServiceAccount carrying it as `imagePullSecrets` (Kyma kept a
//! `serverless-function` ServiceAccount the same way, serverless@legacy
//! `internal/controllers/kubernetes`); push credentials never go there. A copy labelled
//! `serverless.kyma-project.io/managed-by: user` is left alone (Kyma's rule). Each namespace
//! is checked at most every few minutes, and written only when a copy differs.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, LocalObjectReference, Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;

use super::apply;
use super::context::Context;
use super::error::{Error, Result};
use super::names;

/// The value of [`names::MANAGED_BY`] that keeps the controller off a copy.
const MANAGED_BY_USER: &str = "user";

/// Makes sure the build namespace has the push Secret (and the CA ConfigMap, if configured).
///
/// # Errors
/// The originals are missing, or an API request failed.
pub async fn ensure_build_namespace(ctx: &Context) -> Result<()> {
    let namespace = ctx.config.build_namespace.as_str();
    if ctx.plumbing.fresh(namespace) {
        return Ok(());
    }
    // The key is made in the controller's namespace, also when builds run there.
    if ctx.config.cache_repo.is_some() {
        ensure_cache_signing_secret(ctx).await?;
    }
    if namespace == ctx.config.namespace {
        ctx.plumbing.mark(namespace);
        return Ok(());
    }
    copy_secret(
        ctx,
        &ctx.config.registry_secret,
        namespace,
        "build Jobs push with it",
    )
    .await?;
    if ctx.config.cache_repo.is_some() {
        copy_secret(
            ctx,
            &ctx.config.cache_signing_secret,
            namespace,
            "build Jobs sign their dependency cache entries with it",
        )
        .await?;
    }
    if let Some(secret) = &ctx.config.image_signing_secret {
        copy_secret(
            ctx,
            secret,
            namespace,
            "build Jobs sign the images they push with it",
        )
        .await?;
    }
    if let Some(cm) = &ctx.config.ca_bundle_configmap {
        copy_config_map(ctx, namespace, cm).await?;
    }
    ctx.plumbing.mark(namespace);
    Ok(())
}

/// The key of the cache signing Secret that holds the private key (PEM PKCS#8).
pub const CACHE_SIGNING_KEY: &str = "signing.pem";
/// The key of the cache signing Secret that holds its public key (PEM), which is all the
/// lookup stage mounts.
pub const CACHE_PUBLIC_KEY: &str = "public.pem";

/// Makes sure the controller's namespace has the cache signing Secret, creating it with a
/// new key when it does not. Two controllers racing both create; the second is refused
/// (409) and reads the first's.
async fn ensure_cache_signing_secret(ctx: &Context) -> Result<()> {
    let (namespace, name) = (&ctx.config.namespace, &ctx.config.cache_signing_secret);
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let reading = || Error::kube(format!("reading Secret {namespace}/{name}"));
    if api.get_opt(name).await.map_err(reading())?.is_some() {
        return Ok(());
    }
    let pem = crate::signing::SigningKey::generate_pem()
        .map_err(|e| Error::Missing(format!("the cache signing key: {e}")))?;
    let key = crate::signing::SigningKey::from_pem(&pem)
        .map_err(|e| Error::Missing(format!("the cache signing key: {e}")))?;
    let bytes = |s: String| k8s_openapi::ByteString(s.into_bytes());
    let secret = Secret {
        metadata: copy_meta(name, namespace),
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([
            (CACHE_SIGNING_KEY.to_string(), bytes(pem)),
            (CACHE_PUBLIC_KEY.to_string(), bytes(key.public().to_pem())),
        ])),
        ..Secret::default()
    };
    match api.create(&kube::api::PostParams::default(), &secret).await {
        Ok(_) => {
            tracing::info!(
                secret = %format!("{namespace}/{name}"),
                key = %key.public().id(),
                "made the dependency cache signing key",
            );
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(Error::kube(format!("creating Secret {namespace}/{name}"))(
            e,
        )),
    }
}

/// Makes sure a Function's namespace has the pull Secret and the Function ServiceAccount
/// carrying it, when the registry needs one; otherwise it is left alone.
///
/// # Errors
/// The pull Secret is missing, or an API request failed.
pub async fn ensure_function_namespace(ctx: &Context, namespace: &str) -> Result<()> {
    let (Some(pull), Some(account)) = (
        &ctx.config.pull_secret,
        ctx.config.function_service_account(),
    ) else {
        return Ok(());
    };
    if namespace == ctx.config.namespace || ctx.plumbing.fresh(namespace) {
        return Ok(());
    }
    copy_secret(ctx, pull, namespace, "Function Pods pull with it").await?;
    let mut sa = ServiceAccount {
        metadata: copy_meta(account, namespace),
        image_pull_secrets: Some(vec![LocalObjectReference { name: pull.clone() }]),
        // Pods that need a token ask for one themselves.
        automount_service_account_token: Some(false),
        ..ServiceAccount::default()
    };
    super::render::stamp(&mut sa, |s| &mut s.metadata);
    let api: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), namespace);
    let live = api.get_opt(account).await.map_err(Error::kube(format!(
        "reading ServiceAccount {namespace}/{account}"
    )))?;
    if !managed_by_user(live.as_ref().map(|l| &l.metadata)) {
        apply::apply(&api, "ServiceAccount", &sa, live.as_ref(), &ctx.verified).await?;
    }
    ctx.plumbing.mark(namespace);
    Ok(())
}

fn managed_by_user(meta: Option<&ObjectMeta>) -> bool {
    meta.and_then(|m| m.labels.as_ref())
        .and_then(|l| l.get(names::MANAGED_BY))
        .is_some_and(|v| v == MANAGED_BY_USER)
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

async fn copy_secret(ctx: &Context, name: &str, namespace: &str, why: &str) -> Result<()> {
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
                "the Secret {}/{name} does not exist: {why}",
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
    if !managed_by_user(live.as_ref().map(|l| &l.metadata)) {
        apply::apply(&to, "Secret", &copy, live.as_ref(), &ctx.verified).await?;
    }
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
