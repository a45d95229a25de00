//! The schema knowledge server-side apply needs, for built-in kinds (the list-type and
//! struct-type markers of k8s.io/api) and for custom resources (their CRD's structural schema).
//! Everything a table does not name is atomic, as in structured-merge-diff.

use serde_json::Value;

use super::{ListType, Schema};

fn map(keys: &[&str]) -> ListType {
    ListType::Map(keys.iter().map(|k| (*k).to_owned()).collect())
}

/// ObjectMeta's lists, the same in every kind.
fn meta_list_type(path: &[&str]) -> Option<ListType> {
    match path {
        ["metadata", "ownerReferences"] => Some(map(&["uid"])),
        ["metadata", "finalizers"] => Some(ListType::Set),
        _ => None,
    }
}

/// Where a kind keeps its pod spec.
fn pod_spec_prefix(kind: &str) -> Option<&'static [&'static str]> {
    match kind {
        "Pod" => Some(&["spec"]),
        "Deployment"
        | "ReplicaSet"
        | "StatefulSet"
        | "DaemonSet"
        | "Job"
        | "ReplicationController" => Some(&["spec", "template", "spec"]),
        "CronJob" => Some(&["spec", "jobTemplate", "spec", "template", "spec"]),
        "PodTemplate" => Some(&["template", "spec"]),
        _ => None,
    }
}

/// PodSpec's lists, by path relative to the pod spec.
fn pod_spec_list_type(rest: &[&str]) -> Option<ListType> {
    const CONTAINERS: [&str; 3] = ["containers", "initContainers", "ephemeralContainers"];
    match rest {
        [c] if CONTAINERS.contains(c) => Some(map(&["name"])),
        [c, "env"] if CONTAINERS.contains(c) => Some(map(&["name"])),
        [c, "ports"] if CONTAINERS.contains(c) => Some(map(&["containerPort", "protocol"])),
        [c, "volumeMounts"] if CONTAINERS.contains(c) => Some(map(&["mountPath"])),
        [c, "volumeDevices"] if CONTAINERS.contains(c) => Some(map(&["devicePath"])),
        ["volumes" | "imagePullSecrets" | "schedulingGates" | "resourceClaims"] => {
            Some(map(&["name"]))
        }
        ["hostAliases"] => Some(map(&["ip"])),
        ["topologySpreadConstraints"] => Some(map(&["topologyKey", "whenUnsatisfiable"])),
        _ => None,
    }
}

/// Kinds whose `status.conditions` is a map keyed by `type` (Job's is atomic).
const KEYED_CONDITIONS: [&str; 12] = [
    "Deployment",
    "ReplicaSet",
    "StatefulSet",
    "DaemonSet",
    "Pod",
    "HorizontalPodAutoscaler",
    "Namespace",
    "Node",
    "PersistentVolumeClaim",
    "Service",
    "PodDisruptionBudget",
    "CustomResourceDefinition",
];

/// Struct fields whose types are `+structType=atomic` wherever they appear (LabelSelector,
/// key and field selectors, object references, NodeSelector).
const ATOMIC_FIELDS: [&str; 12] = [
    "labelSelector",
    "namespaceSelector",
    "objectSelector",
    "podSelector",
    "configMapKeyRef",
    "secretKeyRef",
    "fieldRef",
    "resourceFieldRef",
    "roleRef",
    "involvedObject",
    "imagePullSecrets",
    "requiredDuringSchedulingIgnoredDuringExecution",
];

/// Built-in kinds' list types as k8s.io/api declares them, keyed by the object's kind name.
///
/// Pod specs are found at `spec` (Pod), `spec.template.spec` (Deployment, ReplicaSet,
/// StatefulSet, DaemonSet, Job) and `spec.jobTemplate.spec.template.spec` (CronJob).
/// Everything not in the table is atomic (the SMD default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Builtin {
    kind: String,
}

impl Builtin {
    /// The schema of built-in kind `kind` (e.g. "Deployment").
    pub fn new(kind: &str) -> Self {
        Self {
            kind: kind.to_owned(),
        }
    }
}

impl Schema for Builtin {
    fn list_type(&self, path: &[&str]) -> ListType {
        if let Some(list) = meta_list_type(path) {
            return list;
        }
        let kind = self.kind.as_str();
        let in_pod_spec = pod_spec_prefix(kind)
            .and_then(|prefix| path.strip_prefix(prefix))
            .and_then(pod_spec_list_type);
        if let Some(list) = in_pod_spec {
            return list;
        }
        match (kind, path) {
            (_, ["status", "conditions"]) if KEYED_CONDITIONS.contains(&kind) => map(&["type"]),
            ("Pod", ["status", "podIPs"]) => map(&["ip"]),
            ("Node", ["status", "addresses"]) => map(&["type"]),
            ("Service", ["spec", "ports"]) => map(&["port", "protocol"]),
            ("ServiceAccount", ["secrets"]) => map(&["name"]),
            ("MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration", ["webhooks"]) => {
                map(&["name"])
            }
            _ => ListType::Atomic,
        }
    }

    fn is_atomic(&self, path: &[&str]) -> bool {
        const LABEL_SELECTED: [&str; 7] = [
            "Deployment",
            "ReplicaSet",
            "StatefulSet",
            "DaemonSet",
            "Job",
            "PodDisruptionBudget",
            "PersistentVolumeClaim",
        ];
        match path {
            ["metadata", "ownerReferences"] => true,
            ["spec", "selector"] => LABEL_SELECTED.contains(&self.kind.as_str()),
            ["secrets"] => self.kind == "ServiceAccount",
            [.., last] => ATOMIC_FIELDS.contains(last),
            [] => false,
        }
    }

    fn key_default(&self, path: &[&str], key: &str) -> Option<Value> {
        // Container and Service ports: `+default="TCP"`.
        (key == "protocol" && path.last() == Some(&"ports")).then(|| Value::from("TCP"))
    }

    fn is_map(&self, path: &[&str]) -> bool {
        matches!(
            (self.kind.as_str(), path),
            (_, [.., "metadata", "labels" | "annotations"])
                | ("ConfigMap", ["data" | "binaryData"])
                | ("Secret", ["data" | "stringData"])
                | ("Service", ["spec", "selector"])
                | (
                    _,
                    [.., "nodeSelector" | "limits" | "requests" | "matchLabels"]
                )
        )
    }
}

/// A CRD's structural schema (the `openAPIV3Schema` of the served version).
///
/// List types come from `x-kubernetes-list-type` / `x-kubernetes-list-map-keys` (lists without
/// a list type are atomic), atomic objects from `x-kubernetes-map-type: atomic`, key defaults
/// from the key property's `default`, maps from `additionalProperties`. `metadata` follows
/// ObjectMeta as in built-in kinds.
#[derive(Debug, Clone, PartialEq)]
pub struct CrdSchema {
    schema: std::sync::Arc<Value>,
}

impl CrdSchema {
    /// Wraps a version's `schema.openAPIV3Schema`.
    pub fn new(openapi_v3_schema: impl Into<std::sync::Arc<Value>>) -> Self {
        Self {
            schema: openapi_v3_schema.into(),
        }
    }

    /// The schema node at `path`; list items are stepped through before each field.
    fn node(&self, path: &[&str]) -> Option<&Value> {
        let mut node: &Value = &self.schema;
        for field in path {
            node = items(node);
            node = match node.pointer(&format!("/properties/{}", escape(field))) {
                Some(property) => property,
                None => node.get("additionalProperties").filter(|a| a.is_object())?,
            };
        }
        Some(node)
    }
}

/// The item schema of a list node (through nested lists), or the node itself.
fn items(mut node: &Value) -> &Value {
    while let Some(item) = node.get("items") {
        node = item;
    }
    node
}

/// JSON-pointer escaping of one segment.
fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

impl Schema for CrdSchema {
    fn list_type(&self, path: &[&str]) -> ListType {
        if let Some(list) = meta_list_type(path) {
            return list;
        }
        let Some(node) = self.node(path) else {
            return ListType::Atomic;
        };
        match node.get("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("set") => ListType::Set,
            Some("map") => {
                let keys = node
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array);
                let keys = keys.into_iter().flatten().filter_map(Value::as_str);
                ListType::Map(keys.map(str::to_owned).collect())
            }
            _ => ListType::Atomic,
        }
    }

    fn is_atomic(&self, path: &[&str]) -> bool {
        if path == ["metadata", "ownerReferences"] {
            return true;
        }
        let node = self.node(path).map(items);
        node.and_then(|n| n.get("x-kubernetes-map-type"))
            .and_then(Value::as_str)
            == Some("atomic")
    }

    fn key_default(&self, path: &[&str], key: &str) -> Option<Value> {
        let node = items(self.node(path)?);
        node.pointer(&format!("/properties/{}/default", escape(key)))
            .cloned()
    }

    fn is_map(&self, path: &[&str]) -> bool {
        if matches!(path, ["metadata", "labels" | "annotations"]) {
            return true;
        }
        let node = self.node(path).map(items);
        let extra = node.and_then(|n| n.get("additionalProperties"));
        extra.is_some_and(|a| a.is_object() || a == &Value::Bool(true))
    }
}
