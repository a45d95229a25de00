//! Server-side apply, simplified but honest about it:
//! - the applied configuration is deep-merged into the live object (objects merge key by key;
//!   **lists are atomic** and replaced whole; a `null` removes the field);
//! - each manager's set of leaf field paths is kept in `metadata.managedFields` in the
//!   Kubernetes shape (`manager`, `operation: Apply`, `apiVersion`, `time`,
//!   `fieldsType: FieldsV1`, `fieldsV1` as an `f:` trie, `subresource` for `/status`);
//! - on re-apply, a field the manager owned before and omits now is removed unless another
//!   manager owns it too; other managers' fields are kept;
//! - applying the value a field already has shares its ownership with the managers that own
//!   it; **conflicts are never reported**: changing another manager's field behaves as
//!   `force=true` and takes it from them.
//!
//! Not modelled: ownership of fields written by PUT/merge/JSON patches (`operation: Update`
//! entries), list items keyed by merge keys (`k:`/`v:` paths), and the `.` self-ownership
//! marker. Pure functions.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::meta;

/// A field path: the object keys from the root to a leaf.
pub type FieldPath = Vec<String>;

/// Where an apply writes: the main resource or its `status` subresource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The main resource; `.status` is ignored when the kind has a status subresource.
    Main {
        /// Whether the kind has a status subresource.
        status_subresource: bool,
    },
    /// The `/status` subresource: only `.status` is applied.
    Status,
}

impl Scope {
    fn subresource(self) -> Option<&'static str> {
        match self {
            Self::Status => Some("status"),
            Self::Main { .. } => None,
        }
    }

    /// Whether a top-level field takes part in this apply.
    fn includes(self, top: &str) -> bool {
        match self {
            Self::Status => top == "status",
            Self::Main { status_subresource } => !(status_subresource && top == "status"),
        }
    }
}

/// Metadata fields that are identity or server-owned: never merged, never owned.
const NOT_APPLIED_META: [&str; 8] = [
    "name",
    "namespace",
    "generateName",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
];

/// The part of an applied configuration that is applied: no `apiVersion`/`kind`, no identity
/// or system metadata, only the fields of `scope`.
fn applicable(applied: &Value, scope: Scope) -> Map<String, Value> {
    let mut out = Map::new();
    for (key, value) in applied.as_object().into_iter().flatten() {
        if key == "apiVersion" || key == "kind" || !scope.includes(key) {
            continue;
        }
        if key == "metadata" {
            let mut meta = value.as_object().cloned().unwrap_or_default();
            meta.retain(|k, _| !NOT_APPLIED_META.contains(&k.as_str()));
            meta.remove("deletionTimestamp");
            if !meta.is_empty() {
                out.insert(key.clone(), Value::Object(meta));
            }
            continue;
        }
        out.insert(key.clone(), value.clone());
    }
    out
}

/// The leaf paths of a value: keys of non-empty objects are descended into; anything else
/// (scalars, lists, empty objects) is a leaf. `null`s are no leaves: they remove.
fn leaves(map: &Map<String, Value>, prefix: &mut FieldPath, out: &mut BTreeSet<FieldPath>) {
    for (key, value) in map {
        prefix.push(key.clone());
        match value {
            Value::Null => {}
            Value::Object(child) if !child.is_empty() => leaves(child, prefix, out),
            _ => {
                out.insert(prefix.clone());
            }
        }
        prefix.pop();
    }
}

/// `fieldsV1` trie of a set of paths: `{"f:data": {"f:a": {}}}`.
pub fn to_fields_v1(paths: &BTreeSet<FieldPath>) -> Value {
    let mut root = Map::new();
    for path in paths {
        let mut node = &mut root;
        for key in path {
            let entry = node
                .entry(format!("f:{key}"))
                .or_insert_with(|| Value::Object(Map::new()));
            node = match entry {
                Value::Object(map) => map,
                _ => unreachable!("trie nodes are objects"),
            };
        }
    }
    Value::Object(root)
}

/// Paths of a `fieldsV1` trie; `k:`/`v:`/`i:` list-item keys (which we never write) and `.`
/// are skipped, a node with no `f:` children is a leaf.
pub fn from_fields_v1(trie: &Value) -> BTreeSet<FieldPath> {
    fn walk(node: &Map<String, Value>, prefix: &mut FieldPath, out: &mut BTreeSet<FieldPath>) {
        for (key, child) in node {
            let Some(field) = key.strip_prefix("f:") else {
                continue;
            };
            prefix.push(field.to_string());
            match child.as_object() {
                Some(map) if map.keys().any(|k| k.starts_with("f:")) => walk(map, prefix, out),
                _ => {
                    out.insert(prefix.clone());
                }
            }
            prefix.pop();
        }
    }
    let mut out = BTreeSet::new();
    if let Some(map) = trie.as_object() {
        walk(map, &mut Vec::new(), &mut out);
    }
    out
}

fn value_at<'a>(obj: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(obj, |v, key| v.get(key))
}

fn is_entry(entry: &Value, manager: &str, scope: Scope) -> bool {
    entry["manager"] == manager
        && entry["operation"] == "Apply"
        && entry.get("subresource").and_then(Value::as_str) == scope.subresource()
}

/// Removes the value at `path`, then every parent left empty that no manager owns.
fn remove_path(obj: &mut Value, path: &[String], owned: &BTreeSet<FieldPath>) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = &mut *obj;
    for key in parents {
        match node.get_mut(key) {
            Some(child) => node = child,
            None => return,
        }
    }
    if let Some(map) = node.as_object_mut() {
        map.remove(last);
        if map.is_empty() && !parents.is_empty() && !owned.contains(parents) {
            remove_path(obj, parents, owned);
        }
    }
}

/// Deep merge for apply: objects merge, `null` removes, anything else replaces.
fn merge(target: &mut Value, patch: &Map<String, Value>) {
    if !target.is_object() {
        *target = json!({});
    }
    let Some(map) = target.as_object_mut() else {
        return;
    };
    for (key, value) in patch {
        match value {
            Value::Null => {
                map.remove(key);
            }
            Value::Object(child) => merge(map.entry(key.clone()).or_insert(Value::Null), child),
            _ => {
                map.insert(key.clone(), value.clone());
            }
        }
    }
}

/// Applies `applied` for `manager` onto `live` (a skeleton with only `apiVersion`, `kind` and
/// the name when the object does not exist yet), returning the new object with its
/// `managedFields` updated. Identity, system fields and preconditions are the caller's.
pub fn apply(
    live: &Value,
    applied: &Value,
    manager: &str,
    scope: Scope,
    api_version: &str,
) -> Value {
    let patch = applicable(applied, scope);
    let mut new_paths = BTreeSet::new();
    leaves(&patch, &mut Vec::new(), &mut new_paths);

    let mut obj = live.clone();
    let mut entries: Vec<Value> = obj
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    // The manager keeps its place in the list, so a re-apply that changes nothing leaves
    // managedFields as it was (and the write is a no-op).
    let position = entries.iter().position(|e| is_entry(e, manager, scope));
    let old_paths = position
        .map(|i| from_fields_v1(&entries[i]["fieldsV1"]))
        .unwrap_or_default();

    // Applying the value a field already has shares its ownership; changing it takes the
    // field from the other managers (force semantics: no conflict is reported).
    let applied_root = Value::Object(patch.clone());
    let changed = |path: &FieldPath| value_at(&applied_root, path) != value_at(live, path);
    for (_, entry) in entries
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| Some(*i) != position)
    {
        let mut theirs = from_fields_v1(&entry["fieldsV1"]);
        let before = theirs.len();
        theirs.retain(|p| !(new_paths.contains(p) && changed(p)));
        if theirs.len() != before {
            entry["fieldsV1"] = to_fields_v1(&theirs);
        }
    }
    let others: BTreeSet<FieldPath> = entries
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != position)
        .flat_map(|(_, e)| from_fields_v1(&e["fieldsV1"]))
        .collect();
    for path in old_paths.difference(&new_paths) {
        if !others.contains(path) {
            remove_path(&mut obj, path, &others);
        }
    }
    merge(&mut obj, &patch);

    let mut entry = json!({
        "manager": manager,
        "operation": "Apply",
        "apiVersion": api_version,
        "time": meta::now(),
        "fieldsType": "FieldsV1",
        "fieldsV1": to_fields_v1(&new_paths),
    });
    if let Some(sub) = scope.subresource() {
        entry["subresource"] = json!(sub);
    }
    match position {
        Some(i) => entries[i] = entry,
        None => entries.push(entry),
    }
    // A manager that owns nothing (any more) has no entry, as in kube-apiserver.
    entries.retain(|e| !from_fields_v1(&e["fieldsV1"]).is_empty());
    let metadata = meta::metadata_mut(&mut obj);
    if entries.is_empty() {
        metadata.remove("managedFields");
    } else {
        metadata.insert("managedFields".to_string(), Value::Array(entries));
    }
    obj
}
