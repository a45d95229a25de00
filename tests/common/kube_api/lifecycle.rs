//! What kube-apiserver's built-in admission and the controller manager do around
//! namespaces and ServiceAccounts, which controllers and kubelets rely on:
//! - a namespaced object can only be created in a Namespace that exists and is not being
//!   deleted (NamespaceLifecycle);
//! - a new Namespace gets its `default` ServiceAccount and the `kube-root-ca.crt` ConfigMap
//!   (the ServiceAccount and root-CA-publisher controllers, at once rather than shortly after);
//! - a Pod without `serviceAccountName` runs as `default`, its ServiceAccount must exist, and
//!   unless it or its ServiceAccount opts out it gets the projected `kube-api-access-…`
//!   volume (token, `ca.crt`, namespace) mounted in every container (the ServiceAccount
//!   admission plugin);
//! - `POST …/serviceaccounts/NAME/token` (TokenRequest) answers the ServiceAccount's token;
//! - PodSecurity admission refuses Pods that break their namespace's `enforce` level
//!   (`pod_security/`), and Namespaces with invalid `pod-security.kubernetes.io/*` labels.

use axum::http::StatusCode;
use serde_json::{Value, json};

use super::auth::Tokens;
use super::error::{Error, Result};
use super::kinds::{Kind, Route};
use super::meta;
use super::pod_security;
use super::server::Answer;
use super::store::Store;
use super::write::{Target, Write};

/// Where the projected token volume is mounted.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The ConfigMap holding the cluster CA in every namespace.
pub const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";

impl Store {
    /// NamespaceLifecycle: `namespace` must exist and not be terminating.
    pub(super) fn check_namespace(&self, namespace: &str) -> Result<()> {
        let kind = self.kinds.by_name("Namespace");
        match self.get(kind, None, namespace) {
            None => Err(Error::NotFound {
                kind,
                name: namespace.to_string(),
            }),
            Some(ns) if ns.pointer("/metadata/deletionTimestamp").is_some() => Err(Error::Status {
                code: 403,
                reason: "Forbidden",
                message: format!(
                    "unable to create new content in namespace {namespace} because it is \
                         being terminated"
                ),
                details: None,
            }),
            Some(_) => Ok(()),
        }
    }

    /// A Namespace was created: its `default` ServiceAccount and root CA ConfigMap.
    pub(super) fn namespace_created(&mut self, namespace: &str) {
        let seeds = [
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": "default", "namespace": namespace}}),
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": ROOT_CA_CONFIG_MAP, "namespace": namespace},
                   "data": {"ca.crt": self.root_ca}}),
        ];
        for seed in seeds {
            let kind = self
                .kinds
                .by_type("v1", seed["kind"].as_str().unwrap_or_default())
                .expect("core kinds are served");
            // The namespace exists (just created) and the objects are valid.
            let _ = self.create(kind, Some(namespace), seed, Write::to(Target::Seed));
        }
    }

    /// Creates Namespace `name` unless it exists (test seeding).
    pub fn ensure_namespace(&mut self, name: &str) {
        let kind = self.kinds.by_name("Namespace");
        if self.get(kind, None, name).is_none() {
            let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
            // A valid name (tests pass DNS labels); a failure shows at the object's create.
            let _ = self.create(kind, None, ns, Write::to(Target::Seed));
        }
    }

    /// The ServiceAccount admission plugin on a Pod create.
    pub(super) fn admit_pod_service_account(&self, namespace: &str, pod: &mut Value) -> Result<()> {
        let spec = &mut pod["spec"];
        let account = spec["serviceAccountName"]
            .as_str()
            .filter(|s| !s.is_empty())
            .unwrap_or("default")
            .to_string();
        spec["serviceAccountName"] = json!(account);
        let sa_kind = self.kinds.by_name("ServiceAccount");
        let Some(sa) = self.get(sa_kind, Some(namespace), &account) else {
            let name = meta::name_of(pod).to_string();
            return Err(super::auth::forbidden(
                "pods",
                "",
                "pods",
                &name,
                &format!(
                    "error looking up service account {namespace}/{account}: serviceaccount \
                     {account:?} not found"
                ),
            ));
        };
        // The plugin gives a Pod without imagePullSecrets its ServiceAccount's.
        let own_pull_secrets = spec["imagePullSecrets"]
            .as_array()
            .is_some_and(|a| !a.is_empty());
        if !own_pull_secrets
            && let Some(secrets) = sa["imagePullSecrets"].as_array().filter(|a| !a.is_empty())
        {
            spec["imagePullSecrets"] = json!(secrets);
        }
        let automount = spec["automountServiceAccountToken"]
            .as_bool()
            .or_else(|| sa["automountServiceAccountToken"].as_bool())
            .unwrap_or(true);
        if !automount {
            return Ok(());
        }
        let volume = format!("kube-api-access-{}", &meta::name_suffix()[..5]);
        let projected = json!({"name": volume, "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {
                "name": ROOT_CA_CONFIG_MAP,
                "items": [{"key": "ca.crt", "path": "ca.crt"}]
            }},
            {"downwardAPI": {"items": [{"path": "namespace",
                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
        ]}});
        push(&mut spec["volumes"], projected);
        let mount = json!({"name": volume, "mountPath": SERVICE_ACCOUNT_DIR, "readOnly": true});
        for list in ["initContainers", "containers"] {
            for container in spec[list].as_array_mut().into_iter().flatten() {
                let taken = container["volumeMounts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|m| m["mountPath"] == SERVICE_ACCOUNT_DIR);
                if !taken {
                    push(&mut container["volumeMounts"], mount.clone());
                }
            }
        }
        Ok(())
    }
}

fn push(list: &mut Value, item: Value) {
    match list.as_array_mut() {
        Some(items) => items.push(item),
        None => *list = json!([item]),
    }
}

/// Whether `kind` is the core `kind`.
pub fn is_core(kind: &Kind, name: &str) -> bool {
    kind.group.is_empty() && kind.kind == name
}

/// `POST …/serviceaccounts/NAME/token`: a TokenRequest answered with the ServiceAccount's
/// token.
pub(super) fn token_request(
    store: &Store,
    tokens: &Tokens,
    route: &Route,
    body: &[u8],
) -> Result<Answer> {
    let namespace = route.namespace.clone().unwrap_or_default();
    let name = route.name.clone().unwrap_or_default();
    if store.get(route.kind, Some(&namespace), &name).is_none() {
        return Err(Error::NotFound {
            kind: route.kind,
            name,
        });
    }
    let mut request = super::patch::parse_json(body).unwrap_or_else(|_| json!({}));
    let seconds = request["spec"]["expirationSeconds"]
        .as_i64()
        .unwrap_or(3600);
    request["apiVersion"] = json!("authentication.k8s.io/v1");
    request["kind"] = json!("TokenRequest");
    request["metadata"] = json!({"name": name, "namespace": namespace,
        "creationTimestamp": meta::now()});
    request["status"] = json!({
        "token": tokens.service_account_token(&namespace, &name),
        "expirationTimestamp": meta::in_seconds(seconds),
    });
    Ok((StatusCode::CREATED, request))
}

impl Store {
    /// PodSecurity admission of a Pod create (or an update that changes its containers or
    /// images) in `namespace`: refused by the namespace's `enforce` level, as kube-apiserver
    /// does. Workloads (Deployments, Jobs) are not refused, only their Pods.
    pub(super) fn admit_pod_security(
        &self,
        namespace: &str,
        pod: &Value,
        old: Option<&Value>,
    ) -> Result<()> {
        if let Some(old) = old
            && !significant_change(old, pod)
        {
            return Ok(());
        }
        let ns_kind = self.kinds.by_name("Namespace");
        let labels = self
            .get(ns_kind, None, namespace)
            .map(|ns| ns["metadata"]["labels"].clone())
            .unwrap_or(Value::Null);
        // Namespace validation refuses bad labels; an unreadable one is treated as the
        // strictest level, as kube-apiserver does for enforce.
        let enforce = pod_security::Policy::from_labels(&labels)
            .map_or(pod_security::Level::Restricted, |p| p.enforce);
        let failures = pod_security::check(enforce, &pod["metadata"], &pod["spec"]);
        if failures.is_empty() {
            return Ok(());
        }
        Err(super::auth::forbidden(
            "pods",
            "",
            "pods",
            meta::name_of(pod),
            &pod_security::forbidden_detail(enforce, &failures),
        ))
    }
}

/// Whether a Pod update changes what PodSecurity judges: the containers or their images.
fn significant_change(old: &Value, new: &Value) -> bool {
    let images = |pod: &Value| -> Vec<(String, String)> {
        ["initContainers", "containers", "ephemeralContainers"]
            .iter()
            .flat_map(|list| pod["spec"][list].as_array().cloned().unwrap_or_default())
            .map(|c| {
                let text = |k: &str| c[k].as_str().unwrap_or_default().to_string();
                (text("name"), text("image"))
            })
            .collect()
    };
    images(old) != images(new)
}
