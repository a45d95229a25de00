//! Deletion as kube-apiserver and the garbage collector do it: finalizers hold an object
//! (marked with `deletionTimestamp`) until they are removed; a deleted owner takes its
//! dependents (objects whose `ownerReferences` name its uid) with it, recursively, unless
//! another owner of theirs still exists (then only the dangling reference goes); `Orphan`
//! removes the references instead; a deleted Namespace takes everything in it. Collection
//! happens at once, not in the background; `Foreground` behaves as `Background`.

use serde_json::{Value, json};

use super::error::{Error, Result};
use super::kinds::{Kind, Kinds};
use super::meta;
use super::selector::Selectors;
use super::store::{EventType, Key, Store, owner_uids};
use super::write::{Target, Write};

/// `propagationPolicy` of a delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Propagation {
    /// Dependents are deleted (the default for most kinds).
    #[default]
    Background,
    /// Dependents are deleted (before the owner, in a real cluster; here at once).
    Foreground,
    /// Dependents lose their owner reference and stay.
    Orphan,
}

/// The body of a DELETE (`DeleteOptions`) that matters here.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    /// `propagationPolicy`.
    pub propagation: Propagation,
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub resource_version: Option<String>,
    /// `dryRun: ["All"]`.
    pub dry_run: bool,
}

impl DeleteOptions {
    /// Reads `DeleteOptions` JSON (an empty body is the default).
    ///
    /// # Errors
    /// BadRequest for malformed JSON or an unknown policy.
    pub fn parse(body: &[u8]) -> Result<Self> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self::default());
        }
        let v: Value = serde_json::from_slice(body).map_err(|e| Error::BadRequest {
            message: format!("DeleteOptions: {e}"),
        })?;
        let propagation = match v["propagationPolicy"].as_str() {
            None | Some("Background") => Propagation::Background,
            Some("Foreground") => Propagation::Foreground,
            Some("Orphan") => Propagation::Orphan,
            Some(other) => {
                return Err(Error::BadRequest {
                    message: format!("unknown propagationPolicy {other:?}"),
                });
            }
        };
        let text = |p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_string);
        Ok(Self {
            propagation,
            uid: text("/preconditions/uid"),
            resource_version: text("/preconditions/resourceVersion"),
            dry_run: v["dryRun"].as_array().is_some_and(|a| !a.is_empty()),
        })
    }
}

fn kind_of(kinds: &Kinds, obj: &Value) -> Option<&'static Kind> {
    kinds.by_type(obj["apiVersion"].as_str()?, obj["kind"].as_str()?)
}

impl Store {
    /// Deletes an object, as DELETE does. Returns it as last seen (marked for deletion when
    /// finalizers hold it).
    ///
    /// # Errors
    /// NotFound; Conflict when a precondition fails.
    pub fn delete(
        &mut self,
        kind: &'static Kind,
        key: &Key,
        opts: &DeleteOptions,
    ) -> Result<Value> {
        let old = self
            .objects
            .get(key)
            .cloned()
            .ok_or_else(|| Error::NotFound {
                kind,
                name: key.name.clone(),
            })?;
        let failed = |want: &Option<String>, field: &str| {
            want.as_deref()
                .is_some_and(|w| Some(w) != meta::meta_str(&old, field))
        };
        if failed(&opts.uid, "uid") || failed(&opts.resource_version, "resourceVersion") {
            return Err(Error::Conflict {
                kind,
                name: key.name.clone(),
            });
        }
        if opts.dry_run {
            return Ok(old);
        }
        let has_finalizers = old
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        if has_finalizers {
            if old.pointer("/metadata/deletionTimestamp").is_some() {
                return Ok(old);
            }
            let mut marked = old.clone();
            let generation = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            let metadata = meta::metadata_mut(&mut marked);
            metadata.insert("deletionTimestamp".into(), json!(meta::now()));
            metadata.insert("deletionGracePeriodSeconds".into(), json!(0));
            metadata.insert("generation".into(), json!(generation + 1));
            self.commit(kind, EventType::Modified, &mut marked, Some(&old));
            self.objects.insert(key.clone(), marked.clone());
            return Ok(marked);
        }
        Ok(self.remove_with(kind, key, old, opts.propagation))
    }

    /// Removes an object for good (no finalizers left), then collects its dependents.
    pub(super) fn remove(&mut self, kind: &'static Kind, key: &Key, obj: Value) -> Value {
        self.remove_with(kind, key, obj, Propagation::Background)
    }

    fn remove_with(
        &mut self,
        kind: &'static Kind,
        key: &Key,
        mut obj: Value,
        policy: Propagation,
    ) -> Value {
        self.objects.remove(key);
        self.commit(kind, EventType::Deleted, &mut obj, None);
        let uid = meta::meta_str(&obj, "uid").unwrap_or_default().to_string();
        self.collect_dependents(&uid, policy);
        if kind.kind == "Namespace" && kind.group.is_empty() {
            let inside: Vec<Key> = self
                .objects
                .keys()
                .filter(|k| k.namespace == key.name)
                .cloned()
                .collect();
            for dependent in inside {
                self.delete_stored(&dependent, Propagation::Background);
            }
        }
        obj
    }

    /// Deletes a stored object found by key (its kind read from the object).
    fn delete_stored(&mut self, key: &Key, policy: Propagation) {
        let Some(kind) = self.objects.get(key).and_then(|o| kind_of(&self.kinds, o)) else {
            return;
        };
        let opts = DeleteOptions {
            propagation: policy,
            ..DeleteOptions::default()
        };
        // It exists (just looked it up) and there is no precondition: this cannot fail.
        let _ = self.delete(kind, key, &opts);
    }

    /// The garbage collector's pass for a deleted owner `uid`.
    fn collect_dependents(&mut self, uid: &str, policy: Propagation) {
        for key in self.owned_by(uid) {
            let Some(obj) = self.objects.get(&key).cloned() else {
                continue; // removed earlier in this pass
            };
            let other_owner_alive = owner_uids(&obj).iter().any(|u| u != uid && self.has_uid(u));
            if policy == Propagation::Orphan || other_owner_alive {
                self.drop_owner_reference(&key, obj, uid);
            } else {
                self.delete_stored(&key, Propagation::Background);
            }
        }
    }

    fn drop_owner_reference(&mut self, key: &Key, mut obj: Value, uid: &str) {
        let Some(kind) = kind_of(&self.kinds, &obj) else {
            return;
        };
        if let Some(refs) = obj
            .pointer_mut("/metadata/ownerReferences")
            .and_then(Value::as_array_mut)
        {
            refs.retain(|r| r["uid"] != uid);
        }
        meta::metadata_mut(&mut obj).remove("resourceVersion");
        // The object exists and stays valid without the reference.
        let _ = self.update(kind, key, obj, Write::to(Target::Seed));
    }

    /// Deletes every object of `kind` in `namespace` (or all) matching `selectors`
    /// (`deletecollection`), returning them.
    pub fn delete_collection(
        &mut self,
        kind: &'static Kind,
        namespace: Option<&str>,
        selectors: &Selectors,
        opts: &DeleteOptions,
    ) -> Vec<Value> {
        let keys: Vec<Key> = self
            .list(kind, namespace, selectors)
            .iter()
            .map(|o| Key::new(kind, meta::meta_str(o, "namespace"), meta::name_of(o)))
            .collect();
        keys.iter()
            .filter_map(|k| self.delete(kind, k, opts).ok())
            .collect()
    }
}
