//! One test per rule: a valid input passes, an invalid one fails with the field path.

use serde_json::{Value, json};

use super::*;
use crate::controller::crd::Function;
use crate::runtime::Catalog;

fn base() -> Value {
    json!({
        "apiVersion": "serverless.kyma-project.io/v1alpha2",
        "kind": "Function",
        "metadata": {"name": "hello", "namespace": "team"},
        "spec": {
            "runtime": "nodejs22",
            "source": {"inline": {
                "source": "module.exports = { main: () => 'hi' }",
                "dependencies": "{\"dependencies\": {\"lodash\": \"^4\"}}"
            }}
        }
    })
}

/// The verdict on the base Function changed by `edit`.
pub(super) fn verdict(edit: impl FnOnce(&mut Value)) -> Verdict {
    let mut value = base();
    edit(&mut value);
    let function: Function = serde_json::from_value(value).expect("a Function");
    validate(&function, &Catalog::embedded())
}

/// Asserts exactly one error, at `field`, whose message contains `text`; returns it.
#[track_caller]
pub(super) fn only_error(v: &Verdict, field: &str, text: &str) -> String {
    assert_eq!(v.errors.len(), 1, "expected one error at {field}: {v:#?}");
    let e = &v.errors[0];
    assert_eq!(e.field, field, "{v:#?}");
    assert!(e.message.contains(text), "{:?} lacks {text:?}", e.message);
    e.to_string()
}

#[track_caller]
pub(super) fn valid(v: &Verdict) {
    assert!(v.is_valid(), "expected no errors: {v:#?}");
}

#[test]
fn a_valid_function_has_no_errors_and_no_warnings() {
    assert_eq!(verdict(|_| {}), Verdict::default());
}

#[test]
fn the_name_must_be_a_dns1035_label() {
    for bad in ["1hello", "Hello", "hello_world", &"a".repeat(64)] {
        let v = verdict(|f| f["metadata"]["name"] = json!(bad));
        only_error(&v, "metadata.name", "names the Function's Service");
    }
    valid(&verdict(|f| f["metadata"]["name"] = json!("a".repeat(63))));
}

#[test]
fn a_generate_name_prefix_must_start_a_dns1035_label_and_some_name_is_required() {
    let v = verdict(|f| f["metadata"] = json!({"generateName": "fn-", "namespace": "team"}));
    valid(&v);
    let v = verdict(|f| f["metadata"] = json!({"generateName": "9fn-", "namespace": "team"}));
    only_error(&v, "metadata.generateName", "cannot start a Function name");
    let v = verdict(|f| f["metadata"] = json!({"namespace": "team"}));
    only_error(&v, "metadata.name", "needs a name");
}

#[test]
fn the_namespace_and_name_must_make_an_image_repository() {
    let v = verdict(|f| f["metadata"]["namespace"] = json!("Bad_NS"));
    only_error(&v, "metadata.namespace", "not a valid namespace");
}

#[test]
fn an_unknown_runtime_is_an_error_listing_the_supported_ones() {
    let v = verdict(|f| f["spec"]["runtime"] = json!("ruby3"));
    let msg = only_error(&v, "spec.runtime", "\"ruby3\" is not a supported runtime");
    assert!(
        msg.contains("nodejs22, nodejs24, nodejs26, python313, python314")
            && msg.contains("nodejs20 (as nodejs22)")
    );
}

#[test]
fn a_kyma_runtime_name_is_accepted_with_a_warning() {
    let v = verdict(|f| f["spec"]["runtime"] = json!("nodejs20"));
    valid(&v);
    assert_eq!(v.warnings.len(), 1);
    assert!(v.warnings[0].contains("runtime nodejs20 is built as nodejs22"));
}

#[test]
fn the_auto_rebase_annotation_is_true_or_false_and_another_value_is_read_as_false() {
    let annotated = |value: &str| {
        let value = value.to_string();
        verdict(move |f| f["metadata"]["annotations"] = json!({"kiln.io/auto-rebase": value}))
    };
    for odd in ["False", "no", "0", ""] {
        let v = annotated(odd);
        valid(&v);
        assert_eq!(v.warnings.len(), 1, "{v:#?}");
        assert!(v.warnings[0].contains("is read as \"false\""), "{v:#?}");
    }
    for value in ["false", "true"] {
        assert_eq!(annotated(value), Verdict::default());
    }
}

#[test]
fn a_runtime_image_override_must_be_an_image_reference() {
    let v = verdict(|f| f["spec"]["runtimeImageOverride"] = json!("Not An Image"));
    only_error(&v, "spec.runtimeImageOverride", "invalid");
    let v = verdict(|f| f["spec"]["runtimeImageOverride"] = json!("reg.example.com/base:1"));
    valid(&v);
}

fn function_resources(requests: Value, limits: Value) -> impl FnOnce(&mut Value) {
    move |f| {
        f["spec"]["resourceConfiguration"] =
            json!({"function": {"resources": {"requests": requests, "limits": limits}}});
    }
}

#[test]
fn function_resources_must_reach_10m_cpu_and_16mi_memory() {
    let field = "spec.resourceConfiguration.function.resources";
    let v = verdict(function_resources(
        json!({"cpu": "5m", "memory": "16Mi"}),
        json!({"cpu": "0.01", "memory": "16Mi"}),
    ));
    only_error(
        &v,
        &format!("{field}.requests.cpu"),
        "below the minimum cpu for a Function (10m)",
    );
    let v = verdict(function_resources(json!({}), json!({"memory": "16M"})));
    only_error(&v, &format!("{field}.limits.memory"), "16M is below");
    valid(&verdict(function_resources(
        json!({"cpu": "10m", "memory": "16Mi"}),
        json!({"cpu": "1e-2", "memory": "0.015625Gi"}),
    )));
}

#[test]
fn build_resources_must_reach_200m_cpu_and_200mi_memory() {
    let v = verdict(|f| {
        f["spec"]["resourceConfiguration"] = json!({"build": {"resources":
            {"requests": {"cpu": "199m", "memory": "200Mi"}}}});
    });
    only_error(
        &v,
        "spec.resourceConfiguration.build.resources.requests.cpu",
        "minimum cpu for a build (200m)",
    );
}

#[test]
fn a_request_above_its_limit_is_an_error() {
    let v = verdict(function_resources(
        json!({"cpu": "1", "memory": "64Mi"}),
        json!({"cpu": "500m", "memory": "64Mi"}),
    ));
    only_error(
        &v,
        "spec.resourceConfiguration.function.resources.requests.cpu",
        "1 exceeds limits.cpu (500m)",
    );
}

#[test]
fn an_unparseable_quantity_is_an_error() {
    let v = verdict(function_resources(json!({"memory": "lots"}), json!({})));
    only_error(
        &v,
        "spec.resourceConfiguration.function.resources.requests.memory",
        "\"lots\" is not a quantity",
    );
}

#[test]
fn profiles_must_be_known_and_exclusive_with_resources() {
    let v = verdict(|f| {
        f["spec"]["resourceConfiguration"] = json!({"function": {"profile": "XXL"}});
    });
    only_error(
        &v,
        "spec.resourceConfiguration.function.profile",
        "use one of XS, S, M, L, XL",
    );
    let v = verdict(|f| {
        f["spec"]["resourceConfiguration"] = json!({"build": {"profile": "turbo"}});
    });
    only_error(
        &v,
        "spec.resourceConfiguration.build.profile",
        "local-dev, slow, normal, fast",
    );
    let v = verdict(|f| {
        f["spec"]["resourceConfiguration"] = json!({"function": {"profile": "S", "resources": {}}});
    });
    only_error(
        &v,
        "spec.resourceConfiguration.function",
        "both profile and resources",
    );
    let v = verdict(|f| f["spec"]["resourceConfiguration"] = json!({"build": {}}));
    only_error(&v, "spec.resourceConfiguration.build", "needs a profile");
    let v = verdict(|f| {
        f["spec"]["resourceConfiguration"] =
            json!({"function": {"profile": "XS"}, "build": {"profile": "fast"}});
    });
    valid(&v);
}
#[test]
fn scaling_bounds_replicas_and_the_deprecated_template_are_checked() {
    let v = verdict(|f| f["spec"]["scaleConfig"] = json!({"minReplicas": 3, "maxReplicas": 2}));
    only_error(
        &v,
        "spec.scaleConfig",
        "minReplicas (3) exceeds maxReplicas (2)",
    );
    let v = verdict(|f| f["spec"]["scaleConfig"] = json!({"minReplicas": 0, "maxReplicas": 2}));
    only_error(&v, "spec.scaleConfig.minReplicas", "below 1");
    let v = verdict(|f| f["spec"]["replicas"] = json!(-1));
    only_error(&v, "spec.replicas", "negative");
    let v = verdict(|f| f["spec"]["template"] = json!({"labels": {"a": "b"}}));
    only_error(&v, "spec.template", "spec.labels");
    let v = verdict(|f| f["spec"]["template"] = json!({}));
    valid(&v);
    assert!(v.warnings[0].contains("deprecated"));
}

#[test]
fn every_error_is_reported_and_the_message_names_each_field() {
    let v = verdict(|f| {
        f["metadata"]["name"] = json!("Bad");
        f["spec"]["env"] = json!([{"name": "1X"}]);
    });
    assert_eq!(v.errors.len(), 2);
    let msg = v.message();
    assert!(
        msg.contains("metadata.name: ") && msg.contains("; spec.env[0].name: "),
        "{msg}"
    );
}

#[test]
fn the_secrets_the_controller_keeps_may_not_be_mounted_or_read_into_env() {
    let check = |edit: fn(&mut Value)| {
        let mut value = base();
        edit(&mut value);
        let function: Function = serde_json::from_value(value).expect("a Function");
        let mut verdict = Verdict::default();
        check_managed_secrets(&function, &["kiln-registry", "kiln-pull"], &mut verdict);
        verdict
    };
    let v = check(|f| {
        f["spec"]["secretMounts"] = json!([
            {"secretName": "mine", "mountPath": "/secrets/mine"},
            {"secretName": "kiln-pull", "mountPath": "/secrets/pull"}
        ])
    });
    let msg = only_error(
        &v,
        "spec.secretMounts[1].secretName",
        "\"kiln-pull\" is a Secret",
    );
    assert!(msg.contains("use a Secret of your own"), "{msg}");
    let v = check(|f| {
        f["spec"]["env"] = json!([{"name": "AUTH", "valueFrom": {"secretKeyRef": {
            "name": "kiln-registry", "key": ".dockerconfigjson"
        }}}])
    });
    only_error(
        &v,
        "spec.env[0].valueFrom.secretKeyRef.name",
        "keeps for the platform's registry credentials",
    );
    valid(&check(|f| {
        f["spec"]["env"] = json!([{"name": "T", "valueFrom": {"secretKeyRef": {
            "name": "mine", "key": "t"
        }}}])
    }));
}
