//! Each defaulting rule: the patch applied to a Function gives the expected spec.

use serde_json::{Value, json};

use super::*;

fn function(spec: Value) -> Value {
    json!({
        "apiVersion": "serverless.kyma-project.io/v1alpha2",
        "kind": "Function",
        "metadata": {"name": "hello", "namespace": "team"},
        "spec": spec,
    })
}

/// The Function after its defaults are applied, and the number of operations.
fn defaulted(spec: Value) -> (Value, usize) {
    let mut object = function(spec);
    let patch = defaults(&object, &Catalog::embedded(), &DefaultProfiles::default());
    json_patch::patch(&mut object, &patch).expect("the patch applies");
    (object["spec"].clone(), patch.0.len())
}

fn inline_node() -> Value {
    json!({"runtime": "nodejs22", "replicas": 1,
           "source": {"inline": {"source": "module.exports = {}"}}})
}

#[test]
fn a_complete_function_gets_no_patch() {
    let (spec, ops) = defaulted(inline_node());
    assert_eq!((spec, ops), (inline_node(), 0));
}

#[test]
fn absent_replicas_default_to_min_replicas_or_one() {
    let mut spec = inline_node();
    spec.as_object_mut().unwrap().remove("replicas");
    let (out, _) = defaulted(spec.clone());
    assert_eq!(out["replicas"], 1);
    spec["scaleConfig"] = json!({"minReplicas": 3, "maxReplicas": 5});
    let (out, ops) = defaulted(spec);
    assert_eq!((out["replicas"].clone(), ops), (json!(3), 1));
}

#[test]
fn replicas_outside_the_scale_bounds_are_clamped_into_them() {
    let mut spec = inline_node();
    spec["scaleConfig"] = json!({"minReplicas": 2, "maxReplicas": 4});
    assert_eq!(defaulted(spec.clone()).0["replicas"], 2);
    spec["replicas"] = json!(9);
    assert_eq!(defaulted(spec.clone()).0["replicas"], 4);
    spec["replicas"] = json!(3);
    assert_eq!(defaulted(spec).1, 0, "inside the bounds: untouched");
}

#[test]
fn blank_node_dependencies_become_an_empty_object() {
    for blank in ["", "  \n"] {
        let mut spec = inline_node();
        spec["source"]["inline"]["dependencies"] = json!(blank);
        let (out, ops) = defaulted(spec);
        assert_eq!(
            (out["source"]["inline"]["dependencies"].clone(), ops),
            (json!("{}"), 1)
        );
    }
    // A Kyma runtime name maps to Node.js too.
    let mut spec = inline_node();
    spec["runtime"] = json!("nodejs20");
    spec["source"]["inline"]["dependencies"] = json!("");
    assert_eq!(defaulted(spec).0["source"]["inline"]["dependencies"], "{}");
}

#[test]
fn absent_node_dependencies_and_blank_python_requirements_stay_as_they_are() {
    assert_eq!(defaulted(inline_node()).1, 0);
    let spec = json!({"runtime": "python313", "replicas": 1,
    "source": {"inline": {
        "source": "def main(e, c): pass",
        "dependencies": ""
    }}});
    assert_eq!(defaulted(spec).1, 0);
}

fn with_resources(kind: &str, resources: Value) -> Value {
    let mut spec = inline_node();
    spec["resourceConfiguration"] = json!({kind: {"resources": resources}});
    spec
}

#[test]
fn limits_without_requests_become_the_requests() {
    let (out, _) = defaulted(with_resources(
        "function",
        json!({"limits": {"cpu": "300m", "memory": "256Mi"}}),
    ));
    assert_eq!(
        out["resourceConfiguration"]["function"]["resources"],
        json!({"limits": {"cpu": "300m", "memory": "256Mi"},
               "requests": {"cpu": "300m", "memory": "256Mi"}})
    );
    // Only the missing one is added.
    let (out, ops) = defaulted(with_resources(
        "build",
        json!({"requests": {"cpu": "300m"}, "limits": {"cpu": "1", "memory": "1Gi"}}),
    ));
    let r = &out["resourceConfiguration"]["build"]["resources"];
    assert_eq!(
        (r["requests"].clone(), ops),
        (json!({"cpu": "300m", "memory": "1Gi"}), 1)
    );
}

#[test]
fn requests_without_limits_get_the_larger_of_request_and_default_profile_limit() {
    // Default Function profile L: limits 800m / 1024Mi.
    let (out, _) = defaulted(with_resources(
        "function",
        json!({"requests": {"cpu": "100m", "memory": "2Gi", "ephemeral-storage": "1Gi"}}),
    ));
    assert_eq!(
        out["resourceConfiguration"]["function"]["resources"]["limits"],
        json!({"cpu": "800m", "memory": "2Gi"})
    );
    // Default build profile normal: limits 1100m / 1100Mi.
    let (out, _) = defaulted(with_resources("build", json!({"requests": {"cpu": "2"}})));
    assert_eq!(
        out["resourceConfiguration"]["build"]["resources"]["limits"],
        json!({"cpu": "2"})
    );
    // Another default profile gives other limits.
    let profiles = DefaultProfiles {
        function: presets::find(&FUNCTION_PRESETS, "XS").unwrap(),
        ..DefaultProfiles::default()
    };
    let mut object = function(with_resources(
        "function",
        json!({"requests": {"memory": "64Mi"}}),
    ));
    let patch = defaults(&object, &Catalog::embedded(), &profiles);
    json_patch::patch(&mut object, &patch).unwrap();
    assert_eq!(
        object["spec"]["resourceConfiguration"]["function"]["resources"]["limits"],
        json!({"memory": "256Mi"})
    );
}

#[test]
fn no_profile_and_no_resources_means_no_patch() {
    let mut spec = inline_node();
    spec["resourceConfiguration"] = json!({"function": {"profile": "S"}});
    assert_eq!(defaulted(spec).1, 0);
    let mut spec = inline_node();
    spec["resourceConfiguration"] = json!({});
    assert_eq!(defaulted(spec).1, 0);
}

#[test]
fn a_malformed_object_gets_no_patch() {
    let catalog = Catalog::embedded();
    for object in [json!({}), json!({"spec": "x"}), json!([1])] {
        assert!(
            defaults(&object, &catalog, &DefaultProfiles::default())
                .0
                .is_empty()
        );
    }
    let spec = with_resources("function", json!({"requests": "lots"}));
    assert_eq!(defaulted(spec).1, 0);
}
