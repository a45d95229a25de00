//! A reconcile's working copy of the Function's status: conditions set along the way (each
//! change remembered for its Event), written once at the end as a JSON patch of exactly what
//! changed — nothing at all when nothing did.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use serde_json::Value;

use super::conditions::{self, Change, Kind, State};
use super::crd::{Function, FunctionStatus};
use super::error::{Error, Result};

/// The status being worked on.
pub struct Working {
    /// The new status.
    pub status: FunctionStatus,
    before: Option<FunctionStatus>,
    changes: Vec<Change>,
    now: String,
}

impl Working {
    /// Starts from `f`'s current status.
    pub fn new(f: &Function) -> Working {
        Working {
            status: f.status.clone().unwrap_or_default(),
            before: f.status.clone(),
            changes: Vec::new(),
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

    /// The condition `kind` now.
    pub fn condition(&self, kind: Kind) -> Option<&super::crd::Condition> {
        conditions::get(&self.status, kind)
    }

    /// Writes the status if it changed, then one Event per changed condition (Warning when
    /// it turned False). Returns whether anything was written.
    ///
    /// # Errors
    /// The status write failed (the Events are best effort).
    pub async fn write(
        self,
        client: &kube::Client,
        recorder: &Recorder,
        f: &Function,
    ) -> Result<bool> {
        if self.before.as_ref() == Some(&self.status) {
            return Ok(false);
        }
        let (ns, name) = (f.namespace_or_default(), f.name_or_empty());
        let api: Api<Function> = Api::namespaced(client.clone(), ns);
        let new = serde_json::to_value(&self.status).unwrap_or(Value::Null);
        let ops = match &self.before {
            None => json_patch::Patch(vec![json_patch::PatchOperation::Add(
                json_patch::AddOperation {
                    path: "/status".parse().expect("a valid JSON pointer"),
                    value: new,
                },
            )]),
            Some(before) => {
                let old = serde_json::to_value(before).unwrap_or(Value::Null);
                let mut ops = json_patch::diff(&old, &new);
                for op in &mut ops.0 {
                    prefix(op);
                }
                ops
            }
        };
        api.patch_status(name, &PatchParams::default(), &Patch::Json::<()>(ops))
            .await
            .map_err(Error::kube(format!(
                "writing the status of Function {ns}/{name}"
            )))?;
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
        Ok(true)
    }
}

/// Moves a JSON patch operation from the status object to `/status/…` of the Function.
fn prefix(op: &mut json_patch::PatchOperation) {
    use json_patch::PatchOperation as Op;
    let path = match op {
        Op::Add(o) => &mut o.path,
        Op::Remove(o) => &mut o.path,
        Op::Replace(o) => &mut o.path,
        Op::Move(o) => &mut o.path,
        Op::Copy(o) => &mut o.path,
        Op::Test(o) => &mut o.path,
    };
    let joined = format!("/status{path}");
    *path = joined
        .parse()
        .expect("prefixing a valid pointer keeps it valid");
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
