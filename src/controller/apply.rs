//! Writing what the renderers made: server-side apply with one field manager, skipped when the
//! live object already carries the applied-hash of what would be written *and* still holds
//! every value kiln sets (so an unchanged Function costs no write, and a hand edit of a field
//! kiln owns is reverted by the next pass), creates for immutable objects, and deletes.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Mutex;

use kube::Resource;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, PropagationPolicy};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

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

/// Live objects found to hold what kiln applies, by kind, namespace and name: their
/// resourceVersion and applied-hash then. An object unchanged since (same resourceVersion)
/// that kiln would render the same (same hash) still holds it, so steady-state passes skip
/// the comparison. Deleted objects (a build's, a deleted Function's) are not taken out one by
/// one; the whole map is dropped when it reaches [`Verified::MAX`] entries, which costs one
/// comparison per object on the next pass.
#[derive(Default)]
pub struct Verified(Mutex<HashMap<String, (String, String)>>);

impl Verified {
    fn key<K: Resource>(kind: &str, object: &K) -> String {
        let meta = object.meta();
        format!(
            "{kind}/{}/{}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        )
    }

    /// At most this many entries are kept.
    pub const MAX: usize = 1 << 16;

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, String)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn insert(&self, key: String, seen: (String, String)) {
        let mut map = self.lock();
        if map.len() >= Self::MAX && !map.contains_key(&key) {
            map.clear();
        }
        map.insert(key, seen);
    }
}

/// Applies `desired` unless `live` already carries its applied-hash and every value it
/// sets ([`holds`]).
///
/// # Errors
/// The API request failed.
pub async fn apply<K>(
    api: &Api<K>,
    kind: &str,
    desired: &K,
    live: Option<&K>,
    verified: &Verified,
) -> Result<Outcome>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
{
    let name = desired.meta().name.clone().unwrap_or_default();
    if let Some(live) = live
        && let Some(hash) = applied_hash(live.meta())
        && Some(hash) == applied_hash(desired.meta())
    {
        let key = Verified::key(kind, live);
        let version = live.meta().resource_version.clone().unwrap_or_default();
        let seen = (version, hash.to_string());
        if verified.lock().get(&key) == Some(&seen) {
            return Ok(Outcome::Unchanged);
        }
        let (want, have) = (serde_json::to_value(desired), serde_json::to_value(live));
        if let (Ok(want), Ok(have)) = (&want, &have)
            && holds(have, want)
        {
            verified.insert(key, seen);
            return Ok(Outcome::Unchanged);
        }
        tracing::info!(kind, name = %name, "reverting a change made to the object");
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

/// Whether `live` holds every value `desired` sets: objects key by key (fields only `live`
/// has — server defaults, other managers' fields, status — do not count); lists of objects
/// item by item, matched by their merge key (`name`, `mountPath`, `containerPort`, `port`,
/// `uid`, `type`: the `x-kubernetes-list-map-keys` of the lists kiln writes), other lists
/// whole and in order; empty lists and objects as absent (the API server omits them); and
/// resource quantities by value (`0.5` is `500m`; the API server writes them canonically).
/// What another field manager added (a map-list item, a field) is not drift: server-side
/// apply would leave it too, so applying again would change nothing.
pub fn holds(live: &Value, desired: &Value) -> bool {
    holds_at(live, desired, [None, None])
}

/// `holds` at a place whose last two object keys are `at` (parent last).
fn holds_at(live: &Value, desired: &Value, at: [Option<&str>; 2]) -> bool {
    match (desired, live) {
        (Value::Object(want), Value::Object(have)) => want.iter().all(|(k, v)| match have.get(k) {
            Some(h) => holds_at(h, v, [at[1], Some(k)]),
            None => is_empty(v) || is_zero(v),
        }),
        (Value::Object(_) | Value::Array(_), Value::Null) => is_empty(desired),
        (Value::Array(want), Value::Array(have)) => match want.first().and_then(merge_key) {
            Some(key) => want.iter().all(|w| {
                have.iter()
                    .find(|h| w.get(key).is_some() && h.get(key) == w.get(key))
                    .is_some_and(|h| holds_at(h, w, [None, None]))
            }),
            None => {
                want.len() == have.len()
                    && want
                        .iter()
                        .zip(have)
                        .all(|(w, h)| holds_at(h, w, [None, None]))
            }
        },
        (Value::String(want), Value::String(have)) => want == have || same_quantity(at, want, have),
        _ => desired == live,
    }
}

/// The merge key of a list whose first item is `item`, if it is a keyed list of objects.
fn merge_key(item: &Value) -> Option<&'static str> {
    const KEYS: [&str; 6] = ["name", "mountPath", "containerPort", "port", "uid", "type"];
    let object = item.as_object()?;
    KEYS.into_iter().find(|k| object.contains_key(*k))
}

/// `""`, `false` or `0`: what the API server omits for an `omitempty` field of a built-in
/// kind (an env var's empty `value`, say), so a live object without it holds it.
fn is_zero(v: &Value) -> bool {
    match v {
        Value::String(s) => s.is_empty(),
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        _ => false,
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.values().all(is_empty),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// Two amounts of a resource under `limits` or `requests` that are the same quantity.
fn same_quantity(at: [Option<&str>; 2], want: &str, have: &str) -> bool {
    matches!(at[0], Some("limits" | "requests"))
        && match (
            super::quantity::Quantity::parse(want),
            super::quantity::Quantity::parse(have),
        ) {
            (Ok(w), Ok(h)) => w.nanos() == h.nanos(),
            _ => false,
        }
}

#[cfg(test)]
mod tests {
    use super::{Verified, holds};
    use serde_json::json;

    #[test]
    fn the_verified_map_is_bounded() {
        let verified = Verified::default();
        let seen = || ("1".to_string(), "h".to_string());
        for i in 0..Verified::MAX {
            verified.insert(format!("Job/b/{i}"), seen());
        }
        verified.insert("Job/b/0".into(), seen());
        assert_eq!(verified.lock().len(), Verified::MAX);
        verified.insert("Job/b/new".into(), seen());
        assert_eq!(verified.lock().len(), 1);
    }

    #[test]
    fn a_live_object_holds_what_was_applied_whatever_the_server_added() {
        let desired = json!({
            "metadata": {"labels": {"app": "a"}, "annotations": {}},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [
                {"name": "f", "image": "r@sha256:1", "env": [], "args": ["a"],
                 "resources": {"limits": {"cpu": "0.5", "memory": "128Mi"}}},
            ]}}},
        });
        let live = json!({
            "metadata": {"labels": {"app": "a", "extra": "x"}, "uid": "u"},
            "spec": {"replicas": 2, "strategy": {"type": "RollingUpdate"},
                     "template": {"spec": {"containers": [
                {"name": "sidecar", "image": "s"},
                {"name": "f", "image": "r@sha256:1", "imagePullPolicy": "IfNotPresent",
                 "args": ["a"],
                 "resources": {"limits": {"cpu": "500m", "memory": "128Mi"}}},
            ]}}},
            "status": {"replicas": 2},
        });
        assert!(holds(&live, &desired));
        for (pointer, edit) in [
            ("/spec/replicas", json!(5)),
            ("/metadata/labels/app", json!("b")),
            (
                "/spec/template/spec/containers/1/image",
                json!("evil@sha256:2"),
            ),
            (
                "/spec/template/spec/containers/1/resources/limits/cpu",
                json!("1"),
            ),
            ("/spec/template/spec/containers/1/args", json!(["a", "b"])),
            ("/spec/template/spec/containers/1/name", json!("renamed")),
        ] {
            let mut edited = live.clone();
            *edited.pointer_mut(pointer).unwrap() = edit;
            assert!(!holds(&edited, &desired), "{pointer} changed by hand");
        }
        // What the API server omits (`omitempty`): an empty env value, a false flag.
        let omitted = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "f", "env": [{"name": "EMPTY", "value": ""}], "stdin": false}]}}}});
        let stored = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "f", "env": [{"name": "EMPTY"}]}]}}}});
        assert!(holds(&stored, &omitted));
        let mut removed = live.clone();
        removed["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .remove("app");
        assert!(
            !holds(&removed, &desired),
            "a label kiln sets removed by hand"
        );
        // Another manager's container is theirs: applying again would keep it.
        assert_eq!(
            live["spec"]["template"]["spec"]["containers"][0]["name"],
            "sidecar"
        );
        assert!(
            !holds(
                &json!({"metadata": {"labels": {"cpu": "1.0"}}}),
                &json!({"metadata": {"labels": {"cpu": "1"}}})
            ),
            "only resource amounts compare as quantities"
        );
    }
}
