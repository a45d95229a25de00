//! Offline validation of Kubernetes objects against the Kubernetes OpenAPI schema of one
//! release, with PyPI `kubernetes-validate` (pinned in `.ci/run`) in `--strict` mode, which
//! also rejects fields the schema does not have.
//!
//! What the tool can and cannot check (probed with 1.37.0): built-in kinds (`v1`, `apps/v1`,
//! `batch/v1`, `*.k8s.io/*`, including `apiextensions.k8s.io/v1` CustomResourceDefinitions)
//! are validated; custom resources (a Kyma `Function`, a Knative `serving.knative.dev/v1`
//! Service) have no schema in it, so it only prints `WARN … Couldn't find schema for kind …`
//! and exits 0. [`validate_k8s`] therefore skips custom resources explicitly (see
//! [`is_custom_resource`]; validate those against their own CRD schema) and treats any warning
//! about a built-in kind (say, a misspelt `kind: Deploymnt`) as a failure.

use std::path::Path;
use std::process::Command;

use serde::Deserialize;

use super::{tool_exists, try_run_with_input};

/// The Kubernetes release whose schema objects are checked against (k8s-openapi's `v1_34`).
pub const KUBERNETES_VERSION: &str = "1.34.0";
/// The validator program and the PyPI release `.ci/run` installs.
pub const VALIDATOR: &str = "kubernetes-validate";
const VALIDATOR_PIN: &str = "kubernetes-validate==1.37.0";

/// Whether `doc` is a custom resource: its `apiVersion` has a group that is neither a
/// built-in one without dots (`apps`, `batch`, `autoscaling`, …) nor one under `k8s.io`.
pub fn is_custom_resource(doc: &serde_json::Value) -> bool {
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    match api_version.split_once('/') {
        None => false,
        Some((group, _)) => group.contains('.') && !group.ends_with(".k8s.io"),
    }
}

/// Validates every built-in object of `docs` against the Kubernetes [`KUBERNETES_VERSION`]
/// schema, strictly (unknown fields are errors), skipping custom resources. `Err` carries the
/// validator's report and the documents.
pub fn validate_k8s(docs: &[serde_json::Value]) -> Result<(), String> {
    assert!(
        tool_exists(VALIDATOR),
        "required tool `{VALIDATOR}` is not installed; install it with \
         `python3 -m pip install {VALIDATOR_PIN}`"
    );
    let built_in: Vec<&serde_json::Value> =
        docs.iter().filter(|d| !is_custom_resource(d)).collect();
    if built_in.is_empty() {
        return Ok(());
    }
    // JSON is YAML whose strings are all quoted: an RFC 3339 string such as
    // `creationTimestamp` stays a string instead of becoming a YAML timestamp.
    let mut yaml = String::new();
    for doc in &built_in {
        yaml.push_str("---\n");
        yaml.push_str(&serde_json::to_string_pretty(doc).map_err(|e| e.to_string())?);
        yaml.push('\n');
    }
    // The validator's own entry point, as its console script calls it, after keeping
    // jsonschema from importing rfc3987_syntax: that builds a grammar for about 3 s of CPU
    // per run, for the `iri` format, which no Kubernetes schema uses.
    let mut cmd = Command::new("python3");
    cmd.args([
        "-c",
        "import sys; sys.modules.setdefault('rfc3987_syntax', None); \
         from kubernetes_validate.__main__ import main; sys.exit(main())",
    ]);
    cmd.args(["--strict", "-k", KUBERNETES_VERSION, "-"]);
    let report = match try_run_with_input(&mut cmd, Some(yaml.as_bytes())) {
        Ok(stdout) => String::from_utf8_lossy(&stdout).into_owned(),
        Err(failure) => return Err(format!("{failure}\n--- documents ---\n{yaml}")),
    };
    // Exit 0 with a warning means a kind the schema does not know: not validated at all.
    let warnings: Vec<&str> = report.lines().filter(|l| l.starts_with("WARN")).collect();
    if !warnings.is_empty() {
        return Err(format!(
            "{VALIDATOR} could not validate every built-in object:\n{}\n--- documents ---\n{yaml}",
            warnings.join("\n")
        ));
    }
    Ok(())
}

/// [`validate_k8s`] for the YAML documents of `file` (empty documents skipped).
pub fn validate_file(file: &Path) -> Result<(), String> {
    let text =
        std::fs::read_to_string(file).map_err(|e| format!("reading {}: {e}", file.display()))?;
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_json::Value::deserialize(doc)
            .map_err(|e| format!("parsing {}: {e}", file.display()))?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    validate_k8s(&docs)
}
