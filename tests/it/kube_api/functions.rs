//! The CRDs the server enforces: Kyma Functions validated against their schema and CEL
//! rules, with a scale subresource over `spec.replicas`, and Knative Services against Knative
//! Serving's published CRD.

use crate::common;

use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::{function_api, kyma_function};
use common::kube_api::KubeApi;
use common::kube_client::{code_reason, status};

/// Creates a Function changed by `edit` and returns the 422's causes (field, message).
async fn rejected(
    functions: &Api<DynamicObject>,
    edit: impl FnOnce(&mut Value),
) -> Vec<(String, String)> {
    let mut function = kyma_function("bad");
    edit(&mut function);
    let object: DynamicObject = serde_json::from_value(function).unwrap();
    let err = functions
        .create(&PostParams::default(), &object)
        .await
        .unwrap_err();
    let (code, reason, message, causes) = status(err);
    assert_eq!((code, reason.as_str()), (422, "Invalid"), "{message}");
    assert!(
        message.starts_with("Function.serverless.kyma-project.io \"bad\" is invalid: "),
        "{message}"
    );
    causes
}

#[tokio::test]
async fn functions_are_validated_against_the_crd_schema_and_its_cel_rules() {
    let api = KubeApi::start();
    let (functions, _) = function_api(api.client());
    let valid: DynamicObject = serde_json::from_value(kyma_function("hello")).unwrap();
    let created = functions
        .create(&PostParams::default(), &valid)
        .await
        .unwrap();
    assert_eq!(
        created.data["spec"]["replicas"], 1,
        "the CRD default is applied"
    );

    let causes = rejected(&functions, |f| {
        f["spec"]["source"]["gitRepository"] =
            json!({"url": "https://git.example/r", "baseDir": "/", "reference": "main"});
    })
    .await;
    assert_eq!(
        causes,
        [(
            "spec.source".to_string(),
            "Invalid value: \"object\": spec.source needs exactly one of inline and gitRepository"
                .to_string()
        )]
    );
    let causes = rejected(&functions, |f| {
        f["spec"]["scaleConfig"] = json!({"minReplicas": 4, "maxReplicas": 2})
    })
    .await;
    assert_eq!(
        causes,
        [(
            "spec.scaleConfig".to_string(),
            "Invalid value: \"object\": minReplicas must not exceed maxReplicas".to_string()
        )]
    );
    let causes = rejected(&functions, |f| {
        f["spec"]["env"] = json!([{"name": "FUNC_PORT", "value": "1"}])
    })
    .await;
    assert_eq!(causes[0].0, "spec.env");
    assert!(
        causes[0].1.contains(
            "FUNC_RUNTIME, FUNC_HANDLER, FUNC_PORT, MOD_NAME, NODE_PATH and PYTHONPATH are reserved"
        ),
        "{causes:?}"
    );
    let causes = rejected(&functions, |f| {
        f["spec"]["labels"] = json!({"serverless.kyma-project.io/x": "y"})
    })
    .await;
    assert_eq!(causes[0].0, "spec.labels");
    assert!(
        causes[0]
            .1
            .ends_with("labels with the prefix serverless.kyma-project.io/ are reserved"),
        "{causes:?}"
    );
    let causes = rejected(&functions, |f| {
        f["spec"]["resourceConfiguration"]["function"]["profile"] = json!("XXL")
    })
    .await;
    assert_eq!(
        causes,
        [(
            "spec.resourceConfiguration.function.profile".to_string(),
            "Unsupported value: \"XXL\": supported values: \"XS\", \"S\", \"M\", \"L\", \"XL\""
                .to_string()
        )]
    );
    // Structural rules: required fields, types, minimum.
    let causes = rejected(&functions, |f| {
        f["spec"].as_object_mut().unwrap().remove("runtime");
        f["spec"]["replicas"] = json!("two");
        f["spec"]["scaleConfig"]["minReplicas"] = json!(0);
    })
    .await;
    let fields: Vec<&str> = causes.iter().map(|(f, _)| f.as_str()).collect();
    assert!(
        fields.contains(&"spec.runtime")
            && fields.contains(&"spec.replicas")
            && fields.contains(&"spec.scaleConfig.minReplicas"),
        "{causes:?}"
    );

    // Updates are validated too, and unknown fields are pruned as kube-apiserver does.
    let bad_update = json!({"spec": {"scaleConfig": {"minReplicas": 9}}, "unknownField": 1});
    let err = functions
        .patch("hello", &PatchParams::default(), &Patch::Merge(&bad_update))
        .await
        .unwrap_err();
    assert_eq!(code_reason(err).0, 422);
    let pruned = json!({"spec": {"bogus": true}});
    let patched = functions
        .patch("hello", &PatchParams::default(), &Patch::Merge(&pruned))
        .await
        .unwrap();
    assert!(patched.data["spec"].get("bogus").is_none());
}

#[tokio::test]
async fn functions_have_a_scale_subresource_over_spec_replicas() {
    let api = KubeApi::start();
    let (functions, _) = function_api(api.client());
    let valid: DynamicObject = serde_json::from_value(kyma_function("s")).unwrap();
    functions
        .create(&PostParams::default(), &valid)
        .await
        .unwrap();
    let status = json!({"status": {"replicas": 1, "podSelector": "app=s"}});
    functions
        .patch_status("s", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let scale = functions.get_scale("s").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(1));
    assert_eq!(
        scale.status.as_ref().unwrap().selector.as_deref(),
        Some("app=s")
    );
    let up = json!({"spec": {"replicas": 3}});
    functions
        .patch_scale("s", &PatchParams::default(), &Patch::Merge(&up))
        .await
        .unwrap();
    assert_eq!(
        api.get("Function", "default", "s").unwrap()["spec"]["replicas"],
        3
    );
}

#[tokio::test]
async fn knative_services_are_validated_against_knative_servings_published_crd() {
    use common::kube_api::{CrdSource, Options};
    let crd = std::fs::read_to_string(common::kiln::fixtures().join("knative/service-crd.yaml"));
    let options = Options {
        crds: vec![CrdSource::Yaml(crd.unwrap())],
        ..Options::default()
    };
    let api = KubeApi::with_options(options);
    let gvk = GroupVersionKind::gvk("serving.knative.dev", "v1", "Service");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "services");
    let ksvcs: Api<DynamicObject> = Api::namespaced_with(api.client(), "default", &ar);
    let ksvc = |port: Value| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "serving.knative.dev/v1", "kind": "Service",
            "metadata": {"name": "hello"},
            "spec": {"template": {"spec": {"containers": [{
                "image": "registry.example/hello@sha256:0000",
                "ports": [{"containerPort": port, "name": "http1"}],
            }]}}},
        }))
        .unwrap()
    };
    let err = ksvcs
        .create(&PostParams::default(), &ksvc(json!("8080")))
        .await
        .unwrap_err();
    let (code, _, message, causes) = status(err);
    assert_eq!(code, 422, "{message}");
    let field = "spec.template.spec.containers[0].ports[0].containerPort";
    assert!(causes.iter().any(|(f, _)| f == field), "{causes:?}");
    let created = ksvcs
        .create(&PostParams::default(), &ksvc(json!(8080)))
        .await
        .unwrap();
    assert_eq!(
        created.data["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"],
        8080
    );
}
