//! Server-side apply field ownership as kube-apiserver computes it with structured-merge-diff:
//! - the applied configuration is merged into the live object by schema: atomic lists, maps and
//!   structs are replaced whole, `set` lists are unions, `map` lists merge item by item by key,
//!   other objects key by key; a `null` removes the field;
//! - each manager's fields are kept in `metadata.managedFields` (`fieldsV1` with `f:`, `k:`,
//!   `v:` and `.`): Apply entries own exactly their last applied configuration, Update entries
//!   (POST, PUT, patches) the fields they added or changed;
//! - changing a field another manager owns is a conflict unless forced; applying the value it
//!   already has shares it; a re-apply removes the fields the applier no longer sends unless
//!   another manager owns them.
//!
//! Not modelled: version conversion, the ten-Update-entry cap ("ancient-changes"), `scale`
//! subresource entries, typed zero values (a built-in's new `spec` gets "." in Update entries,
//! as for custom resources), and apply errors other than conflicts: lists with duplicate keys
//! or keyless items are treated as atomic instead of rejected.

use std::collections::BTreeMap;

use serde_json::{Value, json};

mod fieldset;
mod managers;
mod merge;
mod schema;
#[cfg(test)]
mod tests;
mod view;

pub use schema::{Builtin, CrdSchema};

use fieldset::{Set, path_string};
use managers::{Entry, now, read_entries, write_entries};
use merge::{Ctx, Diff, prune};
use view::{join, strip_meta, view};

/// Where a write goes: the main resource or its `status` subresource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The main resource; `.status` is ignored when the kind has a status subresource.
    Main {
        /// Whether the kind has a status subresource.
        status_subresource: bool,
    },
    /// The `/status` subresource: only `.status` is written and owned.
    Status,
}

impl Scope {
    fn subresource(self) -> Option<&'static str> {
        match self {
            Self::Status => Some("status"),
            Self::Main { .. } => None,
        }
    }

    /// Whether a top-level field takes part in a write (the complement are the reset fields).
    fn includes(self, top: &str) -> bool {
        top != "apiVersion"
            && top != "kind"
            && match self {
                Self::Status => top == "status",
                Self::Main { status_subresource } => !(status_subresource && top == "status"),
            }
    }
}

/// How a list is merged (`x-kubernetes-list-type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListType {
    /// Replaced whole and owned as one field.
    Atomic,
    /// Scalar items merged as a union; each item is owned (`v:<json>`).
    Set,
    /// Object items merged by these key fields; each item is owned (`k:{...}`).
    Map(Vec<String>),
}

/// Schema knowledge SSA needs: list types and atomic maps/structs at a path.
///
/// Paths are field names from the object root; list items are skipped, so the path of
/// `spec.template.spec.containers[*].env` is `["spec","template","spec","containers","env"]`,
/// and the objects inside a list are asked about with the list's own path.
pub trait Schema {
    /// The type of the list at `path`.
    fn list_type(&self, path: &[&str]) -> ListType;
    /// Whether the object or map at `path` is atomic (replaced whole, owned as one field: e.g.
    /// metav1.LabelSelector `spec.selector`, `x-kubernetes-map-type: atomic`). Default false.
    fn is_atomic(&self, _path: &[&str]) -> bool {
        false
    }
    /// The default value of list-map key `key` for items of the list at `path` (e.g. ports'
    /// protocol defaults to "TCP"), if any.
    fn key_default(&self, _path: &[&str], _key: &str) -> Option<Value> {
        None
    }
    /// Whether the object at `path` is a map whose keys are data (labels, `additionalProperties`)
    /// rather than declared fields: its entries are owned as members even when they are
    /// non-empty objects. Default false.
    fn is_map(&self, _path: &[&str]) -> bool {
        false
    }
}

/// One field another manager owns that an apply would change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The owner's manager name.
    pub manager: String,
    /// The owner's operation: "Apply" or "Update".
    pub operation: String,
    /// The owner's apiVersion (printed for Update owners only, as kube-apiserver does).
    pub api_version: String,
    /// The owner's subresource, e.g. `status`.
    pub subresource: Option<String>,
    /// SMD path string, e.g. `.spec.template.spec.containers[name="app"].image`.
    pub path: String,
}

impl Conflict {
    /// apimachinery's manager identifier (the JSON of the entry without time and fields; no
    /// apiVersion for Apply), which orders the managers of a conflict message.
    fn identifier(&self) -> String {
        let mut id = format!(
            "{{\"manager\":{},\"operation\":{}",
            json!(self.manager),
            json!(self.operation)
        );
        if self.operation != "Apply" {
            id.push_str(&format!(",\"apiVersion\":{}", json!(self.api_version)));
        }
        if let Some(sub) = &self.subresource {
            id.push_str(&format!(",\"subresource\":{}", json!(sub)));
        }
        id + "}"
    }

    /// apimachinery's `printManager`: `"mgr"`, `"mgr" with subresource "status"`,
    /// `"mgr" using apps/v1` for Update owners.
    fn owner(&self) -> String {
        let mut out = json!(self.manager).to_string();
        if let Some(sub) = &self.subresource {
            out.push_str(&format!(" with subresource {}", json!(sub)));
        }
        if self.operation == "Update" {
            out.push_str(&format!(" using {}", self.api_version));
        }
        out
    }
}

/// Conflicts, rendered as kube-apiserver's 409 `Conflict` status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflicts(pub Vec<Conflict>);

impl Conflicts {
    /// The status message: `Apply failed with 1 conflict: conflict with "mgr" using apps/v1:
    /// .spec.replicas`, or for N conflicts one `conflicts with <owner>:` line per manager
    /// (sorted) followed by its `- <path>` lines.
    pub fn message(&self) -> String {
        if let [one] = self.0.as_slice() {
            return format!(
                "Apply failed with 1 conflict: conflict with {}: {}",
                one.owner(),
                one.path
            );
        }
        let mut by_manager: BTreeMap<String, (String, Vec<&str>)> = BTreeMap::new();
        for c in &self.0 {
            let slot = by_manager
                .entry(c.identifier())
                .or_insert_with(|| (c.owner(), Vec::new()));
            slot.1.push(&c.path);
        }
        let mut lines = Vec::new();
        for (owner, paths) in by_manager.into_values() {
            lines.push(format!("conflicts with {owner}:"));
            lines.extend(paths.into_iter().map(|p| format!("- {p}")));
        }
        format!(
            "Apply failed with {} conflicts: {}",
            self.0.len(),
            lines.join("\n")
        )
    }

    /// The status causes (reason `FieldManagerConflict`): `(message, field)` pairs such as
    /// `("conflict with \"mgr\" using apps/v1", ".spec.replicas")`.
    pub fn causes(&self) -> Vec<(String, String)> {
        self.0
            .iter()
            .map(|c| (format!("conflict with {}", c.owner()), c.path.clone()))
            .collect()
    }
}

impl std::fmt::Display for Conflicts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for Conflicts {}

/// Server-side apply of `applied` (the request body, parsed) by `manager` onto `live` (a
/// skeleton with only apiVersion/kind/metadata.name when the object does not exist).
///
/// managedFields are read from `live` and written to the result. With `force`, conflicting
/// fields are taken from their owners. Identity and system metadata are never merged or owned,
/// apiVersion/kind are not owned; [`Scope`] decides whether `.status` or everything else is
/// applied. A no-op apply returns `live` unchanged.
///
/// # Errors
/// The fields other managers own that this apply would change, when not forced.
pub fn apply(
    live: &Value,
    applied: &Value,
    manager: &str,
    scope: Scope,
    api_version: &str,
    force: bool,
    schema: &dyn Schema,
) -> Result<Value, Conflicts> {
    // An empty manager name is recorded as "unknown", as apimachinery does.
    let manager = Some(manager).filter(|m| !m.is_empty()).unwrap_or("unknown");
    let mut ctx = Ctx::new(schema);
    let live_view = view(live, scope);
    let mut config = view(applied, scope);
    let mut nulls = Set::default();
    ctx.strip_nulls(&mut config, &mut nulls);

    let original = read_entries(live);
    let mut entries = original.clone();
    if entries.is_empty() && live_view.as_object().is_some_and(|m| !m.is_empty()) {
        // An object written before field management: apimachinery attributes its fields to an
        // Update manager so that conflicts name someone.
        let mut diff = Diff::default();
        ctx.compare(Some(&json!({})), Some(&live_view), &mut diff);
        let version = live
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or(api_version);
        let set = strip_meta(diff.added.union(&diff.modified));
        entries.push(Entry::new("before-first-apply", false, version, None, set));
    }

    let sub = scope.subresource().map(str::to_owned);
    let is_mine = |e: &Entry| e.apply && e.manager == manager && e.subresource == sub;
    let previous = original.iter().find(|e| is_mine(e)).cloned();
    let me = match entries.iter().position(is_mine) {
        Some(i) => i,
        None => {
            entries.push(Entry::new(
                manager,
                true,
                api_version,
                sub.clone(),
                Set::default(),
            ));
            entries.len() - 1
        }
    };
    let mut new_set = Set::default();
    ctx.field_set(&config, &mut new_set);
    let last = std::mem::replace(&mut entries[me].set, strip_meta(new_set));
    entries[me].api_version = api_version.to_owned();

    let merged = ctx
        .merge(Some(&live_view), Some(&config))
        .unwrap_or_else(|| json!({}));
    let mut merged = ctx.remove(&merged, &nulls).unwrap_or_else(|| json!({}));
    if !last.is_empty() {
        merged = prune(&mut ctx, &merged, &entries, &last);
    }

    // Other managers conflict on the fields this apply adds or changes (and on the leaves it
    // nulls), and lose the ones it removes.
    let mut diff = Diff::default();
    ctx.compare(Some(&live_view), Some(&merged), &mut diff);
    let mut live_set = Set::default();
    ctx.field_set(&live_view, &mut live_set);
    let changed = diff
        .modified
        .union(&diff.added)
        .union(&nulls.intersection(&live_set));
    let mut conflicts = Vec::new();
    for (_, entry) in entries.iter_mut().enumerate().filter(|(i, _)| *i != me) {
        let taken = entry.set.intersection(&changed);
        conflicts.extend(taken.paths().iter().map(|path| Conflict {
            manager: entry.manager.clone(),
            operation: entry.operation().to_owned(),
            api_version: entry.api_version.clone(),
            subresource: entry.subresource.clone(),
            path: path_string(path),
        }));
        entry.set = entry.set.difference(&taken).difference(&diff.removed);
    }
    if !force && !conflicts.is_empty() {
        conflicts.sort_by_cached_key(Conflict::identifier);
        return Err(Conflicts(conflicts));
    }

    let changed_object = merged != live_view;
    let unchanged_entry = previous
        .as_ref()
        .is_some_and(|p| p.set == entries[me].set && p.api_version == api_version);
    entries[me].time = match &previous {
        Some(p) if unchanged_entry && !changed_object => p.time.clone(),
        _ => Some(now()),
    };
    entries.retain(|e| !e.set.is_empty());
    if !changed_object && entries == original {
        return Ok(live.clone());
    }
    let mut out = join(live, &merged, scope);
    write_entries(&mut out, entries);
    Ok(out)
}

/// Records an Update (POST create, PUT, JSON/merge/strategic patch) by `manager` that turned
/// `old` (None for a create) into `new`; returns `new` with managedFields set.
///
/// The manager's `operation: Update` entry (one per manager, apiVersion and subresource) gains
/// exactly the fields it added or changed, and every other manager loses the fields this
/// write changed or removed. managedFields sent in `new` replace the live ones (as a client
/// may do; `[{}]` resets them), except on a subresource. Never conflicts.
pub fn update(
    old: Option<&Value>,
    new: &Value,
    manager: &str,
    scope: Scope,
    api_version: &str,
    schema: &dyn Schema,
) -> Value {
    // An empty manager name is recorded as "unknown", as apimachinery does.
    let manager = Some(manager).filter(|m| !m.is_empty()).unwrap_or("unknown");
    let mut ctx = Ctx::new(schema);
    let old_view = old.map_or_else(|| json!({}), |o| view(o, scope));
    let new_view = view(new, scope);
    let sent = new
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array);
    let mut entries = match sent {
        _ if scope == Scope::Status => old.map(read_entries).unwrap_or_default(),
        Some(sent) if sent.as_slice() == [json!({})] => Vec::new(),
        Some(sent) if !sent.is_empty() => read_entries(new),
        _ => old.map(read_entries).unwrap_or_default(),
    };
    let mut diff = Diff::default();
    ctx.compare(Some(&old_view), Some(&new_view), &mut diff);
    let changed = strip_meta(diff.added.union(&diff.modified));
    for entry in &mut entries {
        entry.set = entry.set.difference(&changed).difference(&diff.removed);
    }
    if !changed.is_empty() {
        let sub = scope.subresource().map(str::to_owned);
        let mine = entries.iter_mut().find(|e| {
            !e.apply && e.manager == manager && e.api_version == api_version && e.subresource == sub
        });
        match mine {
            Some(entry) => {
                entry.set = entry.set.union(&changed);
                entry.time = Some(now());
            }
            None => entries.push(Entry::new(manager, false, api_version, sub, changed)),
        }
    }
    let mut out = new.clone();
    write_entries(&mut out, entries);
    out
}

/// The owned paths of a `fieldsV1` trie as SMD path strings (`.spec.replicas`,
/// `.metadata.finalizers[="x"]`), in SMD's order.
pub fn from_fields_v1(trie: &Value) -> Vec<String> {
    Set::from_fields_v1(trie)
        .paths()
        .iter()
        .map(|p| path_string(p))
        .collect()
}
