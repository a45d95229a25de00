//! The controller's RBAC, least privilege that works: what deploy/rbac.yaml grants the
//! controller's ServiceAccount, against what the API server audited it doing. Used by the
//! end-to-end test (and the controller tests for the paths it does not take).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use serde_json::Value;

use crate::common::controller_env::rbac_objects;
use crate::common::kube_api::KubeApi;

const USER: &str = "system:serviceaccount:kiln-system:kiln-controller";

/// One permission: where (`*` for a ClusterRole's, or the Role's namespace), API group,
/// resource (`resource/subresource`) and verb.
pub type Permission = (String, String, String, String);

/// What deploy/rbac.yaml grants the controller.
pub fn granted() -> BTreeSet<Permission> {
    let objects = rbac_objects();
    let bound = |kind: &str, name: &str| {
        objects.iter().any(|b| {
            b["roleRef"]["kind"] == kind
                && b["roleRef"]["name"] == name
                && b["subjects"].as_array().unwrap().iter().any(|s| {
                    s["kind"] == "ServiceAccount"
                        && s["name"] == "kiln-controller"
                        && s["namespace"] == "kiln-system"
                })
        })
    };
    let mut out = BTreeSet::new();
    for role in objects
        .iter()
        .filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "Role")
    {
        let kind = role["kind"].as_str().unwrap();
        if !bound(kind, role["metadata"]["name"].as_str().unwrap()) {
            continue;
        }
        let scope = match kind {
            "Role" => role["metadata"]["namespace"].as_str().unwrap().to_string(),
            _ => "*".to_string(),
        };
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap().to_string())
                .collect()
        };
        for rule in role["rules"].as_array().unwrap() {
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        out.insert((scope.clone(), group.clone(), resource.clone(), verb));
                    }
                }
            }
        }
    }
    out
}

/// What the controller did, as the API server authorized it, each mapped to the grant that
/// allowed it.
pub fn used(api: &KubeApi) -> BTreeSet<Permission> {
    let granted = granted();
    let mut out = BTreeSet::new();
    for entry in api.audit().into_iter().filter(|e| e.user == USER) {
        let a = entry.attributes;
        let resource = if a.subresource.is_empty() {
            a.resource.clone()
        } else {
            format!("{}/{}", a.resource, a.subresource)
        };
        let namespaced = (
            a.namespace.clone(),
            a.group.clone(),
            resource.clone(),
            a.verb.clone(),
        );
        let cluster = ("*".to_string(), a.group, resource, a.verb);
        // The API server authorized it, so one of them is granted; a Role's grant is the
        // narrower one.
        out.insert(if granted.contains(&namespaced) {
            namespaced
        } else {
            cluster
        });
    }
    out
}

/// Fails unless every permission deploy/rbac.yaml grants was used, but for
/// `used_elsewhere`. (The audit records only what RBAC allowed, so granting less than the
/// controller needs shows as a 403 that fails the run itself, not here.)
pub fn assert_rbac_is(api: &KubeApi, used_elsewhere: &[Permission]) {
    let (granted, used) = (granted(), used(api));
    let unused: BTreeSet<Permission> = granted
        .difference(&used)
        .filter(|p| !used_elsewhere.contains(p))
        .cloned()
        .collect();
    assert!(
        unused.is_empty(),
        "deploy/rbac.yaml grants what the controller never used: {unused:?}"
    );
}

/// The end-to-end run's check: the permissions it does not exercise are listed here, each
/// with the controller test that does (under the same RBAC, with [`assert_used`]).
pub fn assert_rbac_is_what_was_used(api: &KubeApi) {
    assert_rbac_is(api, &elsewhere());
}

/// Permissions only other controller tests exercise: Knative serving (`--serving knative`).
pub fn elsewhere() -> Vec<Permission> {
    ["list", "watch", "create", "patch"]
        .into_iter()
        .map(|verb| {
            (
                "*".into(),
                "serving.knative.dev".into(),
                "services".into(),
                verb.into(),
            )
        })
        .collect()
}

/// Fails unless the controller used every permission in `permissions`.
pub fn assert_used(api: &KubeApi, permissions: &[Permission]) {
    let used = used(api);
    let missing: Vec<&Permission> = permissions.iter().filter(|p| !used.contains(p)).collect();
    assert!(missing.is_empty(), "not exercised here: {missing:?}");
}
