//! The offline Kubernetes schema check (`kubernetes-validate --strict`, Kubernetes 1.33)
//! accepts a correct Deployment, rejects a wrong type and an unknown field, refuses a kind
//! it has no schema for, and skips custom resources explicitly.

#![allow(clippy::unwrap_used)]

use crate::common;

use common::k8s_validate::{is_custom_resource, validate_file, validate_k8s};
use serde_json::{Value, json};

fn deployment() -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "hello", "namespace": "fns",
                     "creationTimestamp": "2026-01-02T03:04:05Z"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "hello"}},
            "template": {
                "metadata": {"labels": {"app": "hello"}},
                "spec": {"containers": [{
                    "name": "function", "image": "registry.example.com/fns-hello@sha256:0123",
                    "ports": [{"containerPort": 8080, "name": "http"}],
                    "securityContext": {"readOnlyRootFilesystem": true, "runAsUser": 10001},
                }]},
            },
        },
    })
}

#[test]
fn a_correct_deployment_and_config_map_pass() {
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "src"}, "data": {"source": "x"}});
    validate_k8s(&[deployment(), cm]).unwrap();
}

#[test]
fn a_wrong_type_is_rejected_with_the_field() {
    let mut d = deployment();
    d["spec"]["replicas"] = json!("one");
    let err = validate_k8s(&[d]).unwrap_err();
    assert!(
        err.contains("spec.replicas") && err.contains("is not of type 'integer'"),
        "{err}"
    );
}

#[test]
fn an_unknown_field_is_rejected_in_strict_mode() {
    let mut d = deployment();
    d["spec"]["template"]["spec"]["containers"][0]["bogus"] = json!(1);
    let err = validate_k8s(&[d]).unwrap_err();
    assert!(err.contains("'bogus' was unexpected"), "{err}");
}

#[test]
fn a_built_in_group_with_a_kind_the_schema_lacks_is_an_error_not_a_pass() {
    let mut d = deployment();
    d["kind"] = json!("Deploymnt");
    let err = validate_k8s(&[d]).unwrap_err();
    assert!(
        err.contains("Couldn't find schema for kind Deploymnt"),
        "{err}"
    );
}

#[test]
fn custom_resources_are_skipped_explicitly() {
    let function = json!({"apiVersion": "serverless.kyma-project.io/v1alpha2", "kind": "Function",
                          "metadata": {"name": "f"}, "spec": {"bogus": 1}});
    let ksvc = json!({"apiVersion": "serving.knative.dev/v1", "kind": "Service",
                      "metadata": {"name": "f"}, "spec": {"bogus": 1}});
    assert!(is_custom_resource(&function) && is_custom_resource(&ksvc));
    let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition"});
    assert!(!is_custom_resource(&crd) && !is_custom_resource(&deployment()));
    assert!(!is_custom_resource(
        &json!({"apiVersion": "autoscaling/v2"})
    ));
    validate_k8s(&[function, ksvc.clone()]).unwrap();
    // Skipping them does not skip the built-in objects beside them.
    let mut d = deployment();
    d["spec"]["replicas"] = json!("one");
    assert!(validate_k8s(&[ksvc, d]).is_err());
}

#[test]
fn a_yaml_file_is_validated_document_by_document() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("objects.yaml");
    let mut bad = deployment();
    bad["spec"]["template"]["spec"]["containers"][0]["bogus"] = json!(1);
    let yaml = |docs: &[Value]| {
        docs.iter()
            .map(|d| serde_yaml::to_string(d).unwrap())
            .collect::<Vec<_>>()
            .join("---\n")
    };
    std::fs::write(&file, format!("---\n{}", yaml(&[deployment()]))).unwrap();
    validate_file(&file).unwrap();
    std::fs::write(&file, yaml(&[deployment(), bad])).unwrap();
    assert!(
        validate_file(&file)
            .unwrap_err()
            .contains("'bogus' was unexpected")
    );
}
