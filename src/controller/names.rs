//! Names and labels of what the controller creates for a Function: Kyma's label keys and
//! values (so `kubectl -l` selectors from Kyma's docs keep working), deterministic object
//! names (so a create that races a retry is a harmless 409), and the owner reference that
//! lets Kubernetes garbage-collect everything with the Function. Pure.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::crd::{API_VERSION, Function};

/// `serverless.kyma-project.io/function-name`.
pub const FUNCTION_NAME: &str = "serverless.kyma-project.io/function-name";
/// `serverless.kyma-project.io/managed-by`.
pub const MANAGED_BY: &str = "serverless.kyma-project.io/managed-by";
/// `serverless.kyma-project.io/function-namespace`: on what the controller keeps for a
/// Function in the build namespace, where no owner reference can name it.
pub const FUNCTION_NAMESPACE: &str = "serverless.kyma-project.io/function-namespace";
/// `serverless.kyma-project.io/uuid`: the Function's UID.
pub const UUID: &str = "serverless.kyma-project.io/uuid";
/// `serverless.kyma-project.io/resource`: `deployment` on runtime Pods, `build` on build Jobs
/// and what they mount, `images` on a Function's record of built images.
pub const RESOURCE: &str = "serverless.kyma-project.io/resource";
/// The build key (its first 32 hex digits: label values are at most 63 characters).
pub const BUILD_KEY: &str = "serverless.kyma-project.io/build-key";
/// Digest of what the controller last applied to an object: equal means nothing to write.
pub const APPLIED_HASH: &str = "serverless.kyma-project.io/applied-hash";
/// The value of [`MANAGED_BY`] (Kyma's).
pub const CONTROLLER: &str = "function-controller";
/// The field manager of every server-side apply.
pub const FIELD_MANAGER: &str = "kiln-controller";
/// `app.kubernetes.io/name`: `kubectl logs -l app.kubernetes.io/name=<function>`.
pub const APP_NAME: &str = "app.kubernetes.io/name";
/// The Function annotation that gives its Pods a ServiceAccount token (`"true"`); without
/// it they have none.
pub const AUTOMOUNT_TOKEN: &str = "kiln.io/automount-service-account-token";
/// The Function annotation that names the platforms it is built for, comma-separated
/// (`linux/amd64,linux/arm64`), over the controller's `--platforms` and the Nodes'.
pub const PLATFORMS: &str = "kiln.io/platforms";

/// The labels every child carries: Kyma's internal labels.
pub fn internal_labels(f: &Function) -> BTreeMap<String, String> {
    BTreeMap::from([
        (FUNCTION_NAME.to_string(), f.name_or_empty().to_string()),
        (MANAGED_BY.to_string(), CONTROLLER.to_string()),
        (UUID.to_string(), f.metadata.uid.clone().unwrap_or_default()),
    ])
}

/// The Function's own `metadata.labels` with the internal labels over them (Kyma's merge:
/// a user cannot take over an internal label).
pub fn object_labels(f: &Function) -> BTreeMap<String, String> {
    let mut labels = f.metadata.labels.clone().unwrap_or_default();
    labels.extend(internal_labels(f));
    labels
}

/// The runtime Pods' selector: the internal labels plus `resource=deployment`. Immutable on
/// a Deployment, published as `status.podSelector`.
pub fn selector_labels(f: &Function) -> BTreeMap<String, String> {
    let mut labels = internal_labels(f);
    labels.insert(RESOURCE.into(), "deployment".into());
    labels
}

/// A label selector string (`k=v,k=v`) for labels.
pub fn selector_string(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The labels of what the controller keeps for `f` in the build namespace: the internal
/// labels, the Function's namespace, and `resource`. No owner reference can cross
/// namespaces, so the controller deletes these itself: with their build key, or once the
/// Function's UID is gone.
pub fn build_labels(f: &Function, resource: &str) -> BTreeMap<String, String> {
    let mut labels = internal_labels(f);
    labels.insert(FUNCTION_NAMESPACE.into(), f.namespace_or_default().into());
    labels.insert(RESOURCE.into(), resource.into());
    labels
}

/// The name of `f`'s record of built images in the build namespace: `<namespace>.<name>`
/// (a namespace and a Function name are DNS labels, so this is unique and a valid name).
pub fn records_name(f: &Function) -> String {
    format!("{}.{}", f.namespace_or_default(), f.name_or_empty())
}

/// The owner reference to the Function, on every child: deleting the Function deletes them.
pub fn owner_reference(f: &Function) -> OwnerReference {
    OwnerReference {
        api_version: API_VERSION.into(),
        kind: "Function".into(),
        name: f.name_or_empty().into(),
        uid: f.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The name of a build's ConfigMap, Job and Secret copies in the build namespace:
/// `<function>-build-<20 hex>`, cut to fit a label value (the Job's name becomes its Pods'
/// `job-name` label). The hex is of the Function's namespace, name and build key together:
/// every tenant's builds share one namespace, and a name from the Function's name and a few
/// digits of its key alone let another namespace's Function of the same name, its source
/// tuned until its key began alike (about 2^40 tries for 10 digits), take over the victim's
/// build objects. 80 bits of a hash over all three leave no such search.
pub fn build_name(f: &Function, key: &str) -> String {
    use sha2::Digest as _;
    const HEX: usize = 20;
    const SUFFIX: usize = "-build-".len() + HEX;
    let name = f.name_or_empty();
    let head = &name[..name.len().min(63 - SUFFIX)];
    let mut hash = sha2::Sha256::new();
    for part in [f.namespace_or_default(), name, key] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    let hex: String = hash.finalize()[..HEX / 2]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{}-build-{hex}", head.trim_end_matches('-'))
}

/// The label value for a build key.
pub fn key_label(key: &str) -> String {
    key[..key.len().min(32)].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn function(name: &str) -> Function {
        let mut f = Function::new(name, Default::default());
        f.metadata.namespace = Some("team".into());
        f.metadata.uid = Some("u-1".into());
        f.metadata.labels = Some(BTreeMap::from([
            ("app".to_string(), "x".to_string()),
            (MANAGED_BY.to_string(), "someone-else".to_string()),
        ]));
        f
    }

    #[test]
    fn internal_labels_win_over_the_functions_own() {
        let labels = object_labels(&function("hello"));
        assert_eq!(labels[MANAGED_BY], CONTROLLER);
        assert_eq!(labels["app"], "x");
        assert_eq!(labels[UUID], "u-1");
        let selector = selector_string(&selector_labels(&function("hello")));
        assert_eq!(
            selector,
            "serverless.kyma-project.io/function-name=hello,serverless.kyma-project.io/managed-by=\
                function-controller,serverless.kyma-project.io/resource=deployment,\
                serverless.kyma-project.io/uuid=u-1"
        );
    }

    #[test]
    fn build_names_fit_a_label_value_for_the_longest_function_name() {
        let key = "a".repeat(64);
        let name = build_name(&function("hello"), &key);
        assert!(
            name.starts_with("hello-build-") && name.len() == 32,
            "{name}"
        );
        // Another namespace's Function of the same name and key has builds of its own.
        let mut other = function("hello");
        other.metadata.namespace = Some("rival".into());
        assert_ne!(build_name(&other, &key), name);
        // Every digit of the key counts, not the first few.
        let mut near = key.clone();
        near.replace_range(63.., "b");
        assert_ne!(build_name(&function("hello"), &near), name);
        let long = format!("{}-x", "f".repeat(58));
        let name = build_name(&function(&long), &key);
        assert!(name.len() <= 63, "{name}");
        assert!(!name.contains("--"), "{name}");
        assert_eq!(key_label(&key).len(), 32);
    }
}
