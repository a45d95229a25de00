//! Writing what the renderers made: server-side apply with one field manager, skipped when the
//! live object already carries the applied-hash of what would be written (so an unchanged
//! Function costs no write), creates for immutable objects, and deletes.

use std::fmt::Debug;

use kube::Resource;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, PropagationPolicy};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::error::{Error, Result};
use super::names::FIELD_MANAGER;
use super::render::applied_hash;

/// What a write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The object did not exist.
    Created,
    /// The object changed.
    Updated,
    /// The object was already as rendered: nothing was sent.
    Unchanged,
}

/// Applies `desired` unless `live` already carries its applied-hash.
///
/// # Errors
/// The API request failed.
pub async fn apply<K>(api: &Api<K>, kind: &str, desired: &K, live: Option<&K>) -> Result<Outcome>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
{
    let name = desired.meta().name.clone().unwrap_or_default();
    if let Some(live) = live
        && applied_hash(live.meta()).is_some()
        && applied_hash(live.meta()) == applied_hash(desired.meta())
    {
        return Ok(Outcome::Unchanged);
    }
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(&name, &params, &Patch::Apply(desired))
        .await
        .map_err(Error::kube(format!("applying {kind} {name}")))?;
    Ok(if live.is_some() {
        Outcome::Updated
    } else {
        Outcome::Created
    })
}

/// Creates `object`; one that already exists (a retry, a cache that lags) is fine.
///
/// # Errors
/// The API request failed otherwise.
pub async fn create<K>(api: &Api<K>, kind: &str, object: &K) -> Result<()>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
{
    let name = object.meta().name.clone().unwrap_or_default();
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(Error::kube(format!("creating {kind} {name}"))(e)),
    }
}

/// Deletes `name` and, in the background, what it owns (a Job's Pods); gone already is fine.
///
/// # Errors
/// The API request failed otherwise.
pub async fn delete<K>(api: &Api<K>, kind: &str, name: &str) -> Result<()>
where
    K: Resource + Clone + Debug + DeserializeOwned,
{
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!("deleting {kind} {name}"))(e)),
    }
}
