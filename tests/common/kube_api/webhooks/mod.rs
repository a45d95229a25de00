//! Admission webhooks as kube-apiserver calls them, from the Mutating and Validating
//! WebhookConfigurations stored: rules (operations, groups, versions, resources with
//! subresources, scope), `namespaceSelector` (the namespace's labels), `objectSelector` (the
//! new or the old object's labels), `admissionReviewVersions` (v1), `sideEffects` with dry
//! runs, `timeoutSeconds` (the `?timeout=` parameter and the deadline), `failurePolicy`, the
//! `caBundle` (the only CA trusted; the certificate must name `SERVICE.NAMESPACE.svc`), and
//! `reinvocationPolicy: IfNeeded` (one more round when a later webhook changed the object).
//! A Service reference is resolved to a Ready Pod behind it (its IP and target port), as
//! kube-proxy would route it. Mutations are base64 JSON patches. Denials and call failures
//! come back with kube-apiserver's messages.
//!
//! A write with webhooks runs in phases: the object after the write but before validation
//! goes to the mutating webhooks, the mutated object is validated, then the validating
//! webhooks see it, then it is stored if nobody changed the stored object meanwhile (else the
//! whole request runs again, as kube-apiserver's GuaranteedUpdate does). Not modelled: DELETE
//! and CONNECT operations, `matchConditions`, `matchPolicy` (one version per group is
//! served, so Equivalent and Exact agree), URL client configs without a Service.

mod call;

use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::error::{Cause, Error, Result};
use super::kinds::{Kind, Route};
use super::meta;
use super::selector::LabelSelector;
use super::server::{Call, Phase, Shared, execute, prepare};
use super::store::{Key, Store};
use super::write::{Target, Write};

/// One webhook of a configuration.
#[derive(Debug, Clone)]
struct Hook {
    mutating: bool,
    config: String,
    spec: Value,
}

impl Hook {
    /// The webhook's name.
    fn name(&self) -> &str {
        self.spec["name"].as_str().unwrap_or_default()
    }

    /// Whether its rules match a request of `operation` on `kind`/`subresource`.
    fn matches_rules(&self, operation: &str, kind: &Kind, subresource: Option<&str>) -> bool {
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        };
        self.spec["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|rule| {
                let any = |field: &str, value: &str| {
                    strings(&rule[field]).iter().any(|r| r == "*" || r == value)
                };
                let resource = strings(&rule["resources"]).iter().any(|r| {
                    let (res, sub) = r.split_once('/').unwrap_or((r, ""));
                    (res == "*" || res == kind.plural)
                        && (sub == "*" || sub == subresource.unwrap_or_default())
                });
                let scope = match rule["scope"].as_str().unwrap_or("*") {
                    "Namespaced" => kind.namespaced,
                    "Cluster" => !kind.namespaced,
                    _ => true,
                };
                any("operations", operation)
                    && any("apiGroups", kind.group)
                    && any("apiVersions", kind.version)
                    && resource
                    && scope
            })
    }

    fn selector(&self, field: &str) -> LabelSelector {
        LabelSelector::from_json(&self.spec[field]).unwrap_or_default()
    }
}

/// What admissionregistration/v1 validation refuses in a Mutating or Validating
/// WebhookConfiguration: a webhook without a name, `sideEffects` other than `None` and
/// `NoneOnDryRun`, no `admissionReviewVersions`, `timeoutSeconds` outside 1–30, a
/// `failurePolicy`, `matchPolicy` or `reinvocationPolicy` it does not know.
pub(super) fn validate_configuration(config: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    for (i, hook) in config["webhooks"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let at = |field: &str| format!("webhooks[{i}].{field}");
        let text = |field: &str| hook[field].as_str().map(str::to_string);
        if text("name").is_none_or(|n| n.is_empty()) {
            causes.push(Cause::new(
                "FieldValueRequired",
                at("name"),
                "Required value",
            ));
        }
        let supported = |field: &str, values: &[&str], required: bool| -> Option<Cause> {
            match text(field) {
                None if required => {
                    let list: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
                    let message =
                        format!("Required value: must specify one of {}", list.join(", "));
                    Some(Cause::new("FieldValueRequired", at(field), message))
                }
                Some(v) if !values.contains(&v.as_str()) => {
                    let list: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
                    let message = format!(
                        "Unsupported value: {v:?}: supported values: {}",
                        list.join(", ")
                    );
                    Some(Cause::new("FieldValueNotSupported", at(field), message))
                }
                _ => None,
            }
        };
        causes.extend(supported("sideEffects", &["None", "NoneOnDryRun"], true));
        causes.extend(supported("failurePolicy", &["Ignore", "Fail"], false));
        causes.extend(supported("matchPolicy", &["Exact", "Equivalent"], false));
        causes.extend(supported(
            "reinvocationPolicy",
            &["Never", "IfNeeded"],
            false,
        ));
        if hook["admissionReviewVersions"]
            .as_array()
            .is_none_or(Vec::is_empty)
        {
            causes.push(Cause::new(
                "FieldValueRequired",
                at("admissionReviewVersions"),
                "Required value: must specify one of v1, v1beta1",
            ));
        }
        if let Some(t) = hook["timeoutSeconds"]
            .as_i64()
            .filter(|t| !(1..=30).contains(t))
        {
            causes.push(Cause::new(
                "FieldValueInvalid",
                at("timeoutSeconds"),
                format!("Invalid value: {t}: the timeout value must be between 1 and 30 seconds"),
            ));
        }
    }
    causes
}

/// The webhooks whose rules and namespace selector match, in kube-apiserver's order
/// (configurations by name, webhooks as listed): mutating ones first.
fn candidates(store: &Store, route: &Route, operation: &str) -> Vec<Hook> {
    let mut hooks = Vec::new();
    for (kind_name, mutating) in [
        ("MutatingWebhookConfiguration", true),
        ("ValidatingWebhookConfiguration", false),
    ] {
        let kind = store.kinds.by_name(kind_name);
        for config in store.list(kind, None, &Default::default()) {
            let name = meta::name_of(&config).to_string();
            for spec in config["webhooks"].as_array().into_iter().flatten() {
                hooks.push(Hook {
                    mutating,
                    config: name.clone(),
                    spec: spec.clone(),
                });
            }
        }
    }
    hooks.retain(|h| {
        h.matches_rules(operation, route.kind, route.subresource.as_deref())
            && namespace_matches(store, h, route)
    });
    hooks
}

fn namespace_matches(store: &Store, hook: &Hook, route: &Route) -> bool {
    let Some(namespace) = route.namespace.as_deref().filter(|_| route.kind.namespaced) else {
        return true;
    };
    let ns_kind = store.kinds.by_name("Namespace");
    let labels = store
        .get(ns_kind, None, namespace)
        .cloned()
        .unwrap_or(Value::Null);
    hook.selector("namespaceSelector").matches(&labels)
}

fn object_matches(hook: &Hook, object: &Value, old: Option<&Value>) -> bool {
    let selector = hook.selector("objectSelector");
    selector.matches(object) || old.is_some_and(|o| selector.matches(o))
}

/// Whether a request is a write webhooks may see; its operation if so.
fn operation(method: &Method) -> Option<&'static str> {
    match method.as_str() {
        "POST" => Some("CREATE"),
        "PUT" | "PATCH" => Some("UPDATE"),
        _ => None,
    }
}

/// Runs a write through the webhooks that match it (or straight through when none does).
///
/// # Errors
/// What the write or the webhooks refuse.
pub(super) async fn admitted(shared: &Shared, call: &Call<'_>) -> Result<Option<(Response, bool)>> {
    let Some(op) = operation(call.method) else {
        return Ok(None);
    };
    let hooks = {
        let store = shared.store();
        let Ok((route, _)) = super::kinds::parse_route(&store.kinds, call.path) else {
            return Ok(None);
        };
        if route.subresource.as_deref() == Some("token") {
            return Ok(None);
        }
        // An apply of an object that does not exist is a CREATE.
        let mut hooks = candidates(&store, &route, op);
        if op == "UPDATE"
            && route.name.as_deref().is_some_and(|n| {
                store
                    .get(route.kind, route.namespace.as_deref(), n)
                    .is_none()
            })
        {
            hooks = candidates(&store, &route, "CREATE");
        }
        hooks
    };
    if hooks.is_empty() {
        return Ok(None);
    }
    for _attempt in 0..5 {
        if let Some(done) = attempt(shared, call, &hooks).await? {
            return Ok(Some(done));
        }
    }
    Err(Error::Status {
        code: 409,
        reason: "Conflict",
        message: "the object kept changing while admission webhooks ran; try again".into(),
        details: None,
    })
}

/// What a write looks like between its phases.
struct Pending {
    route: Route,
    old: Option<Value>,
    object: Value,
    status: StatusCode,
}

/// One round of webhook calls for a request.
struct Round<'a> {
    shared: &'a Shared,
    call: &'a Call<'a>,
    /// `CREATE` or `UPDATE`.
    operation: &'static str,
    dry_run: bool,
}

/// One pass of the phases; `None` when the stored object changed meanwhile.
async fn attempt(
    shared: &Shared,
    call: &Call<'_>,
    hooks: &[Hook],
) -> Result<Option<(Response, bool)>> {
    let query = call.query.in_phase(Phase::Mutate);
    let phase_call = Call {
        query: &query,
        ..*call
    };
    let mut pending = {
        let mut store = shared.store();
        let (route, _) = prepare(&store, &shared.audit, call)?;
        let old = route.name.as_deref().and_then(|n| {
            store
                .get(route.kind, route.namespace.as_deref(), n)
                .cloned()
        });
        let (status, object) = execute(
            &mut store,
            &shared.audit,
            &shared.tokens,
            &route,
            &phase_call,
        )?;
        Pending {
            route,
            old,
            object,
            status,
        }
    };
    let round = Round {
        shared,
        call,
        operation: if pending.old.is_some() {
            "UPDATE"
        } else {
            "CREATE"
        },
        dry_run: call.query.dry_run(),
    };
    let dry_run = round.dry_run;
    let mut warnings = Vec::new();
    let mutating: Vec<&Hook> = hooks.iter().filter(|h| h.mutating).collect();
    let mut reinvoke = Vec::new();
    for (i, hook) in mutating.iter().enumerate() {
        if !object_matches(hook, &pending.object, pending.old.as_ref()) {
            continue;
        }
        let before = pending.object.clone();
        pending.object = round
            .call(hook, &pending, &mut warnings)
            .await?
            .unwrap_or(before.clone());
        // A change by this webhook makes the earlier IfNeeded ones run once more.
        if pending.object != before {
            reinvoke.extend(
                mutating[..i]
                    .iter()
                    .filter(|h| h.spec["reinvocationPolicy"] == "IfNeeded"),
            );
        }
    }
    reinvoke.dedup_by_key(|h: &mut &Hook| h.name().to_string());
    for hook in reinvoke {
        if let Some(object) = round.call(hook, &pending, &mut warnings).await? {
            pending.object = object;
        }
    }
    // The mutated object, validated.
    let validated = {
        let mut store = shared.store();
        match store_object(&mut store, &pending, call.query, true) {
            Err(Error::Conflict { .. }) if !sent_rv(call) => return Ok(None),
            other => other?,
        }
    };
    pending.object = validated;
    for hook in hooks.iter().filter(|h| !h.mutating) {
        if object_matches(hook, &pending.object, pending.old.as_ref()) {
            round.call(hook, &pending, &mut warnings).await?;
        }
    }
    let mut store = shared.store();
    let before = store.rv();
    let stored = match store_object(&mut store, &pending, call.query, dry_run) {
        Err(Error::Conflict { .. }) if !sent_rv(call) => return Ok(None),
        other => other?,
    };
    let changed = store.rv() != before;
    let mut response = (pending.status, axum::Json(stored)).into_response();
    for warning in warnings {
        if let Ok(value) = HeaderValue::from_str(&format!("299 - {warning:?}")) {
            response.headers_mut().append("Warning", value);
        }
    }
    Ok(Some((response, changed)))
}

fn sent_rv(call: &Call<'_>) -> bool {
    super::patch::parse_apply(call.body)
        .ok()
        .and_then(|b| meta::meta_str(&b, "resourceVersion").map(str::to_string))
        .is_some()
}

/// Writes (or, with `dry_run`, checks) the object a webhook pass produced, with the stored
/// resourceVersion it started from as its precondition.
fn store_object(
    store: &mut Store,
    p: &Pending,
    query: &super::server::Query,
    dry_run: bool,
) -> Result<Value> {
    let target = if p.route.subresource.as_deref() == Some("status") {
        Target::Status
    } else {
        Target::Main
    };
    let how = Write {
        dry_run,
        managed_fields: true,
        ..query.write(target)
    };
    let how = Write { dry_run, ..how };
    match &p.old {
        None => {
            let name = meta::name_of(&p.object).to_string();
            if store
                .get(p.route.kind, p.route.namespace.as_deref(), &name)
                .is_some()
            {
                return Err(Error::AlreadyExists {
                    kind: p.route.kind,
                    name,
                });
            }
            store.create(
                p.route.kind,
                p.route.namespace.as_deref(),
                p.object.clone(),
                how,
            )
        }
        Some(old) => {
            let mut object = p.object.clone();
            let rv = meta::meta_str(old, "resourceVersion")
                .unwrap_or_default()
                .to_string();
            meta::metadata_mut(&mut object).insert("resourceVersion".into(), json!(rv));
            let key = Key::new(
                p.route.kind,
                p.route.namespace.as_deref(),
                meta::name_of(old),
            );
            Ok(store.update(p.route.kind, &key, object, how)?.0)
        }
    }
}
