//! A reconcile's working copy of the Function's status: conditions set along the way (each
//! change remembered for its Event), written once at the end — nothing at all when nothing
//! changed. The write is a merge patch of the status subresource with the resourceVersion
//! the pass started from as its precondition: a pass that read a cache older than the last
//! write (its own, a moment ago) gets a conflict instead of patching a status it never saw,
//! which could duplicate conditions or bring back an older state.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use serde_json::Value;

use super::conditions::{self, Change, Kind, State};
use super::crd::{Function, FunctionStatus};
use super::error::{Error, Result};

/// What [`Working::write`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// Nothing changed: nothing was sent.
    Unchanged,
    /// The status was written (and its Events published).
    Written,
    /// The Function changed since the pass read it (its cache was stale): nothing was
    /// written; the pass must run again on the newer Function.
    Stale,
}

/// The status being worked on.
pub struct Working {
    /// The new status.
    pub status: FunctionStatus,
    before: Option<FunctionStatus>,
    changes: Vec<Change>,
    /// Events besides the condition changes: (reason, note).
    notes: Vec<(String, String)>,
    now: String,
}

impl Working {
    /// Starts from `f`'s current status.
    pub fn new(f: &Function) -> Working {
        Working {
            status: f.status.clone().unwrap_or_default(),
            before: f.status.clone(),
            changes: Vec::new(),
            notes: Vec::new(),
            now: k8s_openapi::jiff::Timestamp::now()
                .round(k8s_openapi::jiff::Unit::Second)
                .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now())
                .to_string(),
        }
    }

    /// Sets a condition.
    pub fn set(&mut self, kind: Kind, state: State, reason: &str, message: impl Into<String>) {
        if let Some(change) =
            conditions::set(&mut self.status, kind, state, reason, message, &self.now)
        {
            self.changes.push(change);
        }
    }

    /// Records a Normal Event published with the status write (and only if it writes).
    pub fn note(&mut self, reason: &str, note: impl Into<String>) {
        self.notes.push((reason.to_string(), note.into()));
    }

    /// The runtime the Function was built on before this pass.
    pub fn runtime_before(&self) -> Option<&str> {
        self.before.as_ref()?.runtime.as_deref()
    }

    /// The condition `kind` now.
    pub fn condition(&self, kind: Kind) -> Option<&super::crd::Condition> {
        conditions::get(&self.status, kind)
    }

    /// Writes the status if it changed, then one Event per changed condition (Warning when
    /// it turned False).
    ///
    /// # Errors
    /// The status write failed (the Events are best effort).
    pub async fn write(
        self,
        client: &kube::Client,
        recorder: &Recorder,
        f: &Function,
    ) -> Result<Written> {
        if self.before.as_ref() == Some(&self.status) {
            return Ok(Written::Unchanged);
        }
        let (ns, name) = (f.namespace_or_default(), f.name_or_empty());
        let api: Api<Function> = Api::namespaced(client.clone(), ns);
        let old = serde_json::to_value(&self.before).unwrap_or(Value::Null);
        let new = serde_json::to_value(&self.status).unwrap_or(Value::Null);
        let patch = serde_json::json!({
            "metadata": { "resourceVersion": f.metadata.resource_version },
            "status": merge_patch(&old, &new),
        });
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tracing::debug!("the Function changed since this pass read it; not writing");
                return Ok(Written::Stale);
            }
            Err(e) => {
                return Err(Error::kube(format!(
                    "writing the status of Function {ns}/{name}"
                ))(e));
            }
        }
        let reference: ObjectReference = f.object_ref(&());
        for change in &self.changes {
            // Inside the reconcile span: the line carries the Function's namespace and name.
            tracing::info!(
                condition = %change.kind.as_str(),
                status = ?change.state,
                reason = %change.reason,
                detail = %truncate(&change.message, 1024),
                "condition changed"
            );
            let event = Event {
                type_: if change.state == State::False {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: change.reason.clone(),
                note: Some(truncate(&change.message, 1024)),
                action: change.kind.as_str().into(),
                secondary: None,
            };
            if let Err(e) = recorder.publish(&event, &reference).await {
                tracing::warn!(error = %e, reason = %change.reason, "publishing an Event");
            }
        }
        for (reason, note) in &self.notes {
            let event = Event {
                type_: EventType::Normal,
                reason: reason.clone(),
                note: Some(truncate(note, 1024)),
                action: "Build".into(),
                secondary: None,
            };
            if let Err(e) = recorder.publish(&event, &reference).await {
                tracing::warn!(error = %e, reason = %reason, "publishing an Event");
            }
        }
        Ok(Written::Written)
    }
}

/// A JSON merge patch (RFC 7386) turning `old` into `new`: changed and new keys, `null` for
/// keys that went; lists and values whole.
pub fn merge_patch(old: &Value, new: &Value) -> Value {
    match (old, new) {
        (Value::Object(old), Value::Object(new)) => {
            let mut patch = serde_json::Map::new();
            for (k, v) in new {
                match old.get(k) {
                    Some(o) if o == v => {}
                    Some(o) => {
                        patch.insert(k.clone(), merge_patch(o, v));
                    }
                    None => {
                        patch.insert(k.clone(), v.clone());
                    }
                }
            }
            for k in old.keys().filter(|k| !new.contains_key(*k)) {
                patch.insert(k.clone(), Value::Null);
            }
            Value::Object(patch)
        }
        _ => new.clone(),
    }
}

/// At most `max` bytes of `s`, cut at a character boundary.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::merge_patch;
    use serde_json::json;

    #[test]
    fn a_merge_patch_holds_what_changed_and_nulls_what_went() {
        let old = json!({"a": 1, "b": {"c": 2, "d": 3}, "e": [1], "gone": true});
        let new = json!({"a": 1, "b": {"c": 5, "d": 3}, "e": [1, 2], "f": "new"});
        let patch = merge_patch(&old, &new);
        assert_eq!(
            patch,
            json!({"b": {"c": 5}, "e": [1, 2], "f": "new", "gone": null})
        );
        assert_eq!(merge_patch(&json!(null), &new), new);
    }
}
