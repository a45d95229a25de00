//! The part of an object a write sees for its [`Scope`]: without apiVersion/kind, identity
//! metadata or reset fields, and how a new view is put back into the live object.

use serde_json::{Map, Value};

use super::Scope;
use super::fieldset::{Pe, Set};

/// Metadata fields that are identity or server-owned: never merged, never owned.
const NOT_APPLIED_META: [&str; 11] = [
    "name",
    "namespace",
    "generateName",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
    "managedFields",
];

/// `metadata` itself is never owned (apimachinery's stripmeta); the identity fields below it
/// are already outside the view.
pub(super) fn strip_meta(mut set: Set) -> Set {
    set.members.remove(&Pe::Field("metadata".to_owned()));
    set
}

/// The part of an object that SMD sees for `scope`: no apiVersion/kind, no identity metadata,
/// no reset fields.
pub(super) fn view(obj: &Value, scope: Scope) -> Value {
    let mut out = Map::new();
    for (key, value) in obj.as_object().into_iter().flatten() {
        if !scope.includes(key) {
            continue;
        }
        if key == "metadata" {
            let meta: Map<String, Value> = (value.as_object().into_iter().flatten())
                .filter(|(k, _)| !NOT_APPLIED_META.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if !meta.is_empty() {
                out.insert(key.clone(), Value::Object(meta));
            }
            continue;
        }
        out.insert(key.clone(), value.clone());
    }
    Value::Object(out)
}

/// `live` with the part `view` describes replaced by `new_view`, keeping the key order.
pub(super) fn join(live: &Value, new_view: &Value, scope: Scope) -> Value {
    let empty = Map::new();
    let view = new_view.as_object().unwrap_or(&empty);
    let mut out = Map::new();
    for (key, value) in live.as_object().into_iter().flatten() {
        if key == "metadata" && scope.includes(key) {
            let new_meta = view.get(key).and_then(Value::as_object).unwrap_or(&empty);
            let mut meta = Map::new();
            for (k, v) in value.as_object().into_iter().flatten() {
                if NOT_APPLIED_META.contains(&k.as_str()) {
                    meta.insert(k.clone(), v.clone());
                } else if let Some(v) = new_meta.get(k) {
                    meta.insert(k.clone(), v.clone());
                }
            }
            for (k, v) in new_meta {
                meta.entry(k.clone()).or_insert_with(|| v.clone());
            }
            out.insert(key.clone(), Value::Object(meta));
        } else if !scope.includes(key) {
            out.insert(key.clone(), value.clone());
        } else if let Some(v) = view.get(key) {
            out.insert(key.clone(), v.clone());
        }
    }
    for (key, value) in view {
        out.entry(key.clone()).or_insert_with(|| value.clone());
    }
    Value::Object(out)
}
