//! Calling one admission webhook as kube-apiserver does: the AdmissionReview it gets, the
//! Service reference resolved to a Ready Pod's IP and target port, TLS trusting only the
//! caBundle and naming `SERVICE.NAMESPACE.svc`, `?timeout=`, and the answer read back (a
//! denial, a JSON patch, warnings) or the failure, with kube-apiserver's messages.

use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};

use super::super::error::{Error, Result};
use super::super::meta;
use super::super::server::{Call, Shared};
use super::super::store::Store;
use super::{Hook, Pending, Round};

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

impl Round<'_> {
    /// Calls one webhook; a mutating one's patched object when it patched.
    pub(super) async fn call(
        &self,
        hook: &Hook,
        p: &Pending,
        warnings: &mut Vec<String>,
    ) -> Result<Option<Value>> {
        call_hook(self, hook, p, warnings).await
    }
}

async fn call_hook(
    round: &Round<'_>,
    hook: &Hook,
    p: &Pending,
    warnings: &mut Vec<String>,
) -> Result<Option<Value>> {
    let (shared, call, operation, dry_run) =
        (round.shared, round.call, round.operation, round.dry_run);
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
            reason: super::super::error::reason_for(code),
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
    // Validation keeps it within 1–30 s.
    let timeout = spec["timeoutSeconds"].as_u64().unwrap_or(10);
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
