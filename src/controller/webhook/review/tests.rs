//! Reviews in, responses out, without a socket (tests/it/webhook does the same over TLS).

use base64::Engine;
use serde_json::{Value, json};

use super::*;

fn function(spec: Value) -> Value {
    json!({"apiVersion": "serverless.kyma-project.io/v1alpha2", "kind": "Function",
           "metadata": {"name": "hello"}, "spec": spec})
}

fn node_spec() -> Value {
    json!({"runtime": "nodejs22", "replicas": 1,
           "source": {"inline": {"source": "module.exports = {}"}}})
}

fn review_body(operation: &str, object: Value, old: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {
                "group": "serverless.kyma-project.io",
                "version": "v1alpha2",
                "kind": "Function"
            },
            "resource": {
                "group": "serverless.kyma-project.io",
                "version": "v1alpha2",
                "resource": "functions"
            },
            "name": "", "namespace": "team", "operation": operation,
            "userInfo": {"username": "alice"},
            "object": object, "oldObject": old, "dryRun": false
        }
    }))
    .unwrap()
}

fn reviewer() -> Reviewer {
    Reviewer::new(Catalog::embedded(), DefaultProfiles::default())
}

fn response_of(endpoint: Endpoint, body: &[u8]) -> (Value, Record) {
    let (review, record) = reviewer().review(endpoint, body).unwrap();
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(review["response"]["uid"], "u-1");
    (review["response"].clone(), record)
}

#[test]
fn mutate_answers_a_base64_json_patch_that_defaults_the_function() {
    let mut spec = node_spec();
    spec.as_object_mut().unwrap().remove("replicas");
    spec["source"]["inline"]["dependencies"] = json!(" ");
    let mut object = function(spec);
    let (response, record) = response_of(
        Endpoint::Mutate,
        &review_body("CREATE", object.clone(), Value::Null),
    );
    assert_eq!(
        (response["allowed"].clone(), response["patchType"].clone()),
        (json!(true), json!("JSONPatch"))
    );
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().unwrap())
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
    json_patch::patch(&mut object, &patch).unwrap();
    assert_eq!(object["spec"]["replicas"], 1);
    assert_eq!(object["spec"]["source"]["inline"]["dependencies"], "{}");
    assert_eq!(
        (
            record.patched,
            record.namespace.as_str(),
            record.name.as_str()
        ),
        (2, "team", "hello")
    );
    assert_eq!(record.operation, "CREATE");
}

#[test]
fn mutate_without_anything_to_default_has_no_patch_but_carries_warnings() {
    let mut spec = node_spec();
    spec["runtime"] = json!("nodejs20");
    let (response, _) = response_of(
        Endpoint::Mutate,
        &review_body("CREATE", function(spec), Value::Null),
    );
    assert!(response.get("patch").is_none() && response.get("patchType").is_none());
    assert!(
        response["warnings"][0]
            .as_str()
            .unwrap()
            .contains("nodejs20 is built as nodejs22")
    );
}

#[test]
fn validate_denies_with_422_invalid_and_every_field() {
    let mut spec = node_spec();
    spec["env"] = json!([{"name": "1BAD"}]);
    spec["runtime"] = json!("cobol");
    let (response, record) = response_of(
        Endpoint::Validate,
        &review_body("CREATE", function(spec), Value::Null),
    );
    assert_eq!(response["allowed"], false);
    let status = &response["status"];
    assert_eq!(
        (status["code"].clone(), status["reason"].clone()),
        (json!(422), json!("Invalid"))
    );
    let message = status["message"].as_str().unwrap();
    assert!(
        message.starts_with("Function \"hello\" is invalid: spec.runtime: "),
        "{message}"
    );
    assert!(
        message.contains("; spec.env[0].name: \"1BAD\""),
        "{message}"
    );
    // kubectl names the object from the details: `The Function "hello" is invalid: …`.
    assert_eq!(
        (&status["details"]["name"], &status["details"]["kind"]),
        (&json!("hello"), &json!("Function"))
    );
    let fields: Vec<&str> = status["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["spec.runtime", "spec.env[0].name"]);
    assert!(!record.allowed && record.message.is_some());
}

#[test]
fn validate_allows_a_valid_function_with_its_warnings() {
    let mut spec = node_spec();
    spec["runtime"] = json!("python312");
    spec["source"]["inline"]["source"] = json!("def main(e, c): return 'hi'");
    let (response, _) = response_of(
        Endpoint::Validate,
        &review_body("CREATE", function(spec), Value::Null),
    );
    assert_eq!(response["allowed"], true);
    assert!(response.get("status").is_none());
    assert!(
        response["warnings"][0]
            .as_str()
            .unwrap()
            .contains("python312")
    );
}

#[test]
fn an_update_leaving_an_invalid_spec_unchanged_is_not_blocked() {
    let mut spec = node_spec();
    spec["env"] = json!([{"name": "1BAD"}]);
    let old = function(spec.clone());
    let mut new = old.clone();
    new["metadata"]["labels"] = json!({"touched": "yes"});
    let (response, _) = response_of(
        Endpoint::Validate,
        &review_body("UPDATE", new.clone(), old.clone()),
    );
    assert_eq!(response["allowed"], true);
    assert!(
        response["warnings"][0]
            .as_str()
            .unwrap()
            .starts_with("not blocking: spec.env[0].name")
    );
    // Changing the spec is checked in full.
    new["spec"]["replicas"] = json!(2);
    let (response, _) = response_of(Endpoint::Validate, &review_body("UPDATE", new, old));
    assert_eq!(response["allowed"], false);
}

#[test]
fn a_function_being_deleted_is_not_blocked() {
    let mut object = function(json!({"runtime": "cobol", "source": {}}));
    object["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    let (response, _) = response_of(
        Endpoint::Validate,
        &review_body("UPDATE", object.clone(), object),
    );
    assert_eq!(response["allowed"], true);
}

#[test]
fn other_kinds_subresources_and_deletes_pass_untouched() {
    let invalid = function(json!({"runtime": "cobol", "source": {}}));
    let mut review: Value =
        serde_json::from_slice(&review_body("DELETE", Value::Null, invalid.clone())).unwrap();
    for edit in [
        json!({"operation": "DELETE"}),
        json!({"operation": "CONNECT"}),
        json!({"operation": "UPDATE", "object": invalid, "subResource": "status"}),
        json!({"operation": "CREATE", "kind": {"group": "", "version": "v1", "kind": "Pod"},
               "object": {"kind": "Pod", "metadata": {"name": "p"}}}),
    ] {
        for (k, v) in edit.as_object().unwrap() {
            review["request"][k] = v.clone();
        }
        for endpoint in [Endpoint::Mutate, Endpoint::Validate] {
            let (response, record) = response_of(endpoint, &serde_json::to_vec(&review).unwrap());
            assert_eq!(response, json!({"uid": "u-1", "allowed": true}), "{edit}");
            assert!(record.allowed);
        }
    }
}

#[test]
fn a_malformed_review_is_an_error_saying_what_is_wrong() {
    let r = reviewer();
    let err = r.review(Endpoint::Validate, b"{not json").unwrap_err();
    assert!(matches!(err, Error::MalformedReview { .. }), "{err}");
    let old = json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview",
                     "request": {"uid": "x"}});
    let err = r
        .review(Endpoint::Validate, &serde_json::to_vec(&old).unwrap())
        .unwrap_err();
    assert!(
        err.to_string().contains("admissionReviewVersions: [v1]"),
        "{err}"
    );
    let empty = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"});
    let err = r
        .review(Endpoint::Mutate, &serde_json::to_vec(&empty).unwrap())
        .unwrap_err();
    assert!(matches!(err, Error::NoRequest), "{err}");
}

#[test]
fn a_generated_name_is_logged_by_its_prefix() {
    let mut object = function(node_spec());
    object["metadata"] = json!({"generateName": "fn-"});
    let (_, record) = response_of(
        Endpoint::Mutate,
        &review_body("CREATE", object, Value::Null),
    );
    assert_eq!(record.name, "fn-");
}

#[test]
fn validate_denies_a_function_that_reads_a_secret_the_controller_keeps() {
    let mut spec = node_spec();
    spec["secretMounts"] = json!([{"secretName": "kiln-pull", "mountPath": "/secrets/p"}]);
    let body = review_body("CREATE", function(spec), Value::Null);
    let told = reviewer().with_managed_secrets(vec!["kiln-registry".into(), "kiln-pull".into()]);
    let (review, _) = told.review(Endpoint::Validate, &body).unwrap();
    let response = &review["response"];
    assert_eq!(response["allowed"], false);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("spec.secretMounts[0].secretName: \"kiln-pull\" is a Secret"),
        "{message}"
    );
    // Without the names (a webhook not told them) the same Function passes.
    let (review, _) = reviewer().review(Endpoint::Validate, &body).unwrap();
    assert_eq!(review["response"]["allowed"], true);
}
