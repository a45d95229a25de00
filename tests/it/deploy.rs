//! `deploy/` is what users apply: the CRD must be what `kiln crd` prints, every built-in object
//! must validate against the Kubernetes 1.33 schema (strictly), the example Functions against
//! the CRD, and the flags the Deployments pass must be flags kiln takes.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

fn documents(file: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(file).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde_json::to_value(serde_yaml::Value::deserialize(d).unwrap()).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

use serde::Deserialize;

fn kustomization_resources() -> Vec<PathBuf> {
    let k = &documents(&deploy().join("kustomization.yaml"))[0];
    k["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| deploy().join(r.as_str().unwrap()))
        .collect()
}

#[test]
fn the_crd_in_deploy_is_the_one_kiln_prints() {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("crd")
        .output()
        .unwrap();
    assert!(out.status.success());
    let printed = String::from_utf8(out.stdout).unwrap();
    let file = std::fs::read_to_string(deploy().join("crd.yaml")).unwrap();
    assert_eq!(
        file.trim_end(),
        printed.trim_end(),
        "deploy/crd.yaml is stale: regenerate it with `kiln crd > deploy/crd.yaml`"
    );
}

#[test]
fn every_object_in_deploy_validates_against_the_kubernetes_schema() {
    let mut docs = Vec::new();
    for file in kustomization_resources() {
        docs.extend(documents(&file));
    }
    // cert-manager's kinds have no schema in kubernetes-validate; they are the only others.
    let (builtin, other): (Vec<Value>, Vec<Value>) = docs.into_iter().partition(|d| {
        !d["apiVersion"]
            .as_str()
            .unwrap()
            .starts_with("cert-manager.io/")
    });
    assert_eq!(other.len(), 2, "the cert-manager Issuer and Certificate");
    assert!(
        builtin
            .iter()
            .any(|d| d["kind"] == "CustomResourceDefinition")
    );
    common::k8s_validate::validate_k8s(&builtin).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn the_example_functions_validate_against_the_crd() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/kyma");
    let mut functions = Vec::new();
    for entry in std::fs::read_dir(examples).unwrap() {
        functions.extend(documents(&entry.unwrap().path()));
    }
    assert!(functions.len() >= 2);
    common::crd_schema::validate(&deploy().join("crd.yaml"), &functions)
        .unwrap_or_else(|e| panic!("{e}"));
}

/// The args of the first container of Deployment `name` in `file`, with `$(KILN_REGISTRY)`
/// replaced.
fn container_args(file: &str, name: &str) -> Vec<String> {
    let docs = documents(&deploy().join(file));
    let d = docs
        .iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == name)
        .unwrap();
    d["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            a.as_str()
                .unwrap()
                .replace("$(KILN_REGISTRY)", "registry.example.com/fns")
        })
        .collect()
}

#[test]
fn the_deployments_pass_flags_kiln_accepts() {
    // Every flag parses; the controller then stops at the missing API server (exit 2).
    let auth = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(auth.path(), r#"{"auths":{}}"#).unwrap();
    let mut args: Vec<String> = container_args("controller.yaml", "kiln-controller")
        .into_iter()
        .map(|a| match a.strip_prefix("--registry-auth=") {
            Some(_) => format!("--registry-auth={}", auth.path().display()),
            None => a,
        })
        .collect();
    args.extend(["--kubeconfig".into(), "/nonexistent/kubeconfig".into()]);
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(&args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--kubeconfig"),
        "the flags parsed, the kubeconfig is what failed: {stderr}"
    );
    // The webhook stops at the missing certificate.
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(container_args("webhook.yaml", "kiln-webhook"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("tls.crt") || stderr.contains("certificate"),
        "{stderr}"
    );
}
