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

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{Value, json};

use super::error::{Error, Result};
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
    let operation = if pending.old.is_some() {
        "UPDATE"
    } else {
        "CREATE"
    };
    let dry_run = call.query.dry_run();
    let mut warnings = Vec::new();
    let mutating: Vec<&Hook> = hooks.iter().filter(|h| h.mutating).collect();
    let mut reinvoke = Vec::new();
    for (i, hook) in mutating.iter().enumerate() {
        if !object_matches(hook, &pending.object, pending.old.as_ref()) {
            continue;
        }
        let before = pending.object.clone();
        pending.object = call_hook(
            shared,
            hook,
            call,
            &pending,
            operation,
            dry_run,
            &mut warnings,
        )
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
        if let Some(object) = call_hook(
            shared,
            hook,
            call,
            &pending,
            operation,
            dry_run,
            &mut warnings,
        )
        .await?
        {
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
            call_hook(
                shared,
                hook,
                call,
                &pending,
                operation,
                dry_run,
                &mut warnings,
            )
            .await?;
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

/// The endpoint a Service's port routes to: a Ready Pod's IP and the target port.
fn endpoint(
    store: &Store,
    namespace: &str,
    name: &str,
    port: i64,
) -> std::result::Result<SocketAddr, String> {
    let svc_kind = store.kinds.by_name("Service");
    let Some(service) = store.get(svc_kind, Some(namespace), name) else {
        return Err(format!("service \"{name}\" not found"));
    };
    let target = service["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["port"].as_i64() == Some(port))
        .map(|p| p["targetPort"].clone())
        .unwrap_or(json!(port));
    let selector = service["spec"]["selector"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let pod_kind = store.kinds.by_name("Pod");
    for pod in store.list(pod_kind, Some(namespace), &Default::default()) {
        let labels = &pod["metadata"]["labels"];
        let selected = !selector.is_empty() && selector.iter().all(|(k, v)| &labels[k] == v);
        let ready = pod["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        let Some(ip) = pod["status"]["podIP"]
            .as_str()
            .filter(|_| selected && ready)
        else {
            continue;
        };
        let container_port = match &target {
            Value::String(port_name) => pod["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
                .find(|p| p["name"] == *port_name)
                .and_then(|p| p["containerPort"].as_i64()),
            other => other.as_i64(),
        };
        if let (Ok(ip), Some(port)) = (
            ip.parse(),
            container_port.and_then(|p| u16::try_from(p).ok()),
        ) {
            return Ok(SocketAddr::new(ip, port));
        }
    }
    Err(format!("no endpoints available for service \"{name}\""))
}

/// The AdmissionReview a webhook gets.
fn review(hook_call: &Call<'_>, p: &Pending, operation: &str, dry_run: bool, uid: &str) -> Value {
    let kind = p.route.kind;
    let gvk = json!({"group": kind.group, "version": kind.version, "kind": kind.kind});
    let gvr = json!({"group": kind.group, "version": kind.version, "resource": kind.plural});
    let mut request = json!({
        "uid": uid, "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
        "name": meta::name_of(&p.object), "operation": operation,
        "userInfo": {"username": hook_call.user.name, "groups": hook_call.user.groups},
        "object": p.object, "oldObject": p.old.clone().unwrap_or(Value::Null), "dryRun": dry_run,
        "options": {"kind": if operation == "CREATE" { "CreateOptions" } else { "UpdateOptions" },
                    "apiVersion": "meta.k8s.io/v1"},
    });
    if let Some(ns) = p.route.namespace.as_deref().filter(|_| kind.namespaced) {
        request["namespace"] = json!(ns);
    }
    if let Some(sub) = &p.route.subresource {
        request["subResource"] = json!(sub);
        request["requestSubResource"] = json!(sub);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// Calls one webhook; a mutating one's patched object when it patched.
async fn call_hook(
    shared: &Shared,
    hook: &Hook,
    call: &Call<'_>,
    p: &Pending,
    operation: &str,
    dry_run: bool,
    warnings: &mut Vec<String>,
) -> Result<Option<Value>> {
    let spec = &hook.spec;
    let name = hook.name();
    if dry_run && !matches!(spec["sideEffects"].as_str(), Some("None" | "NoneOnDryRun")) {
        return Err(Error::Status {
            code: 400,
            reason: "BadRequest",
            message: format!("admission webhook {name:?} does not support dry run"),
            details: None,
        });
    }
    let uid = meta::new_uid();
    let body = review(call, p, operation, dry_run, &uid);
    let answer = match post(shared, spec, &body).await {
        Ok(answer) => answer,
        Err(failure) => {
            if spec["failurePolicy"] == "Ignore" {
                return Ok(None);
            }
            let message =
                format!("failed calling webhook {name:?}: failed to call webhook: {failure}");
            return Err(Error::Status {
                code: 500,
                reason: "InternalError",
                message: format!("Internal error occurred: {message}"),
                details: Some(json!({"causes": [{"message": message}]})),
            });
        }
    };
    let response = &answer["response"];
    let invalid = |what: &str| -> Result<Option<Value>> {
        if spec["failurePolicy"] == "Ignore" {
            return Ok(None);
        }
        let message =
            format!("failed calling webhook {name:?}: received invalid webhook response: {what}");
        Err(Error::Status {
            code: 500,
            reason: "InternalError",
            message: format!("Internal error occurred: {message}"),
            details: None,
        })
    };
    if !response.is_object() {
        return invalid("webhook response was absent");
    }
    if response["uid"] != uid.as_str() {
        return invalid(&format!(
            "expected response.uid={uid:?}, got {:?}",
            response["uid"].as_str().unwrap_or_default()
        ));
    }
    for w in response["warnings"].as_array().into_iter().flatten() {
        if let Some(w) = w.as_str() {
            warnings.push(w.to_string());
        }
    }
    if response["allowed"] != true {
        let status = &response["status"];
        let denied = format!("admission webhook {name:?} denied the request");
        let message = match (status["message"].as_str(), status["reason"].as_str()) {
            (Some(m), _) if !m.is_empty() => format!("{denied}: {m}"),
            (_, Some(r)) if !r.is_empty() => format!("{denied}: {r}"),
            _ => format!("{denied} without explanation"),
        };
        let code = status["code"]
            .as_u64()
            .and_then(|c| u16::try_from(c).ok())
            .filter(|c| *c >= 400)
            .unwrap_or(400);
        return Err(Error::Status {
            code,
            reason: super::error::reason_for(code),
            message,
            details: status.get("details").cloned(),
        });
    }
    let Some(patch) = response["patch"].as_str() else {
        return Ok(None);
    };
    if !hook.mutating {
        return invalid("validating webhook may not return response.patch");
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .map_err(|_| Error::Internal {
            message: format!("webhook {name:?}: received undecodable patch in webhook response"),
        })?;
    let patch: json_patch::Patch = serde_json::from_slice(&bytes).map_err(|_| Error::Internal {
        message: format!("webhook {name:?}: received undecodable patch in webhook response"),
    })?;
    let mut object = p.object.clone();
    json_patch::patch(&mut object, &patch).map_err(|e| Error::Internal {
        message: format!("applying the patch of admission webhook {name:?}: {e}"),
    })?;
    Ok(Some(object))
}

/// POSTs a review to a webhook's service as kube-apiserver does; the answer, or why the
/// call failed (`Post "URL": …`).
async fn post(shared: &Shared, spec: &Value, body: &Value) -> std::result::Result<Value, String> {
    let timeout = spec["timeoutSeconds"].as_u64().unwrap_or(10).clamp(1, 30);
    let service = &spec["clientConfig"]["service"];
    let (namespace, name) = (
        service["namespace"].as_str().unwrap_or_default(),
        service["name"].as_str().unwrap_or_default(),
    );
    let port = service["port"].as_i64().unwrap_or(443);
    let path = service["path"].as_str().unwrap_or_default();
    let host = format!("{name}.{namespace}.svc");
    let url = format!("https://{host}:{port}{path}?timeout={timeout}s");
    let fail = |why: String| format!("Post {url:?}: {why}");
    let versions = spec["admissionReviewVersions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !versions.iter().any(|v| v == "v1") {
        return Err("webhook does not accept known AdmissionReview versions (v1, v1beta1)".into());
    }
    let address = {
        let store = shared.store();
        endpoint(&store, namespace, name, port).map_err(fail)?
    };
    let ca = spec["clientConfig"]["caBundle"]
        .as_str()
        .unwrap_or_default();
    let ca = base64::engine::general_purpose::STANDARD
        .decode(ca)
        .map_err(|e| fail(format!("the caBundle is not base64: {e}")))?;
    // The caBundle is all it trusts.
    let roots = reqwest::Certificate::from_pem_bundle(&ca).unwrap_or_default();
    let client = reqwest::Client::builder()
        .tls_certs_only(roots)
        .resolve(&host, address)
        .timeout(Duration::from_secs(timeout))
        .http1_only()
        .build()
        .map_err(|e| fail(e.to_string()))?;
    let response = client
        .post(&url)
        .json(body)
        .send()
        .await
        .map_err(|e| fail(chain(&e)))?;
    let status = response.status();
    if !status.is_success() {
        return Err(fail(format!(
            "the server responded with status {}",
            status.as_u16()
        )));
    }
    response.json().await.map_err(|e| fail(chain(&e)))
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
