//! `kiln webhook` as deploy/webhook.yaml registers it, called by the in-memory API server the
//! way kube-apiserver calls admission webhooks: through the Service to a Ready Pod, over TLS
//! trusting only the caBundle, with the rules, selectors, timeout and failure policy
//! registered. Creates and updates of Functions are defaulted and validated by kiln's own
//! webhook; a webhook that is down or untrusted fails the request closed.

use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::harness::{Pki, Webhook};
use crate::common::kube_api::KubeApi;

const SYSTEM: &str = "kiln-system";

fn documents(file: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(file).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// deploy/webhook.yaml's Service and webhook configurations, the latter with `ca_pem` as the
/// caBundle cert-manager's CA injector would write; and a Ready Pod of the webhook's
/// Deployment whose `https` port is `port` on 127.0.0.1.
fn register(api: &KubeApi, ca_pem: &str, port: u16) {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/webhook.yaml");
    let bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    for mut doc in documents(&deploy) {
        match doc["kind"].as_str().unwrap() {
            "MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration" => {
                for hook in doc["webhooks"].as_array_mut().unwrap() {
                    hook["clientConfig"]["caBundle"] = json!(bundle);
                }
                api.insert(doc);
            }
            "Service" => {
                api.insert(doc);
            }
            _ => {}
        }
    }
    api.insert(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "kiln-webhook-abc12", "namespace": SYSTEM,
                     "labels": {"app.kubernetes.io/name": "kiln-webhook"}},
        "spec": {"containers": [{"name": "webhook", "image": "kiln",
                                 "ports": [{"name": "https", "containerPort": port}]}]},
        "status": {"podIP": "127.0.0.1", "phase": "Running",
                   "conditions": [{"type": "Ready", "status": "True"}]}}));
}

fn function(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({"apiVersion": "serverless.kyma-project.io/v1alpha2",
        "kind": "Function", "metadata": {"name": name}, "spec": spec}))
    .unwrap()
}

fn functions(api: &KubeApi) -> Api<DynamicObject> {
    let resource = kube::api::ApiResource {
        group: "serverless.kyma-project.io".into(),
        version: "v1alpha2".into(),
        api_version: "serverless.kyma-project.io/v1alpha2".into(),
        kind: "Function".into(),
        plural: "functions".into(),
    };
    Api::namespaced_with(api.client(), "team", &resource)
}

fn refusal(err: kube::Error) -> (u16, String) {
    match err {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// `kiln webhook` serving a certificate for its Service's names, and an API server with a
/// `team` namespace where deploy/'s configurations call it, trusting the webhook's CA.
async fn registered() -> (Pki, Webhook, KubeApi) {
    let pki = Pki::new();
    let dns = [
        "kiln-webhook.kiln-system.svc",
        "kiln-webhook.kiln-system.svc.cluster.local",
    ];
    let (cert, key) = pki.leaf_for_dns("svc", &dns);
    let (hook, _, _) = Webhook::start(&pki, &cert, &key).await;
    let api = KubeApi::start();
    api.insert(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}}));
    register(
        &api,
        &std::fs::read_to_string(pki.path("ca.pem")).unwrap(),
        hook.port,
    );
    (pki, hook, api)
}

#[tokio::test]
async fn functions_are_defaulted_and_validated_by_kiln_webhook_as_deploy_registers_it() {
    let (_pki, mut hook, api) = registered().await;
    let fns = functions(&api);
    let pp = PostParams::default();

    // Mutating: blank Node.js dependencies become `{}`, as Kyma's defaulting does.
    let spec = json!({"runtime": "nodejs22", "source": {"inline": {
        "source": "module.exports = { main: () => 'hi' }", "dependencies": "  "}}});
    fns.create(&pp, &function("hello", spec)).await.unwrap();
    let stored = api.get("Function", "team", "hello").unwrap();
    assert_eq!(stored["spec"]["source"]["inline"]["dependencies"], "{}");
    assert!(
        hook.log().contains("\"endpoint\":\"Mutate\""),
        "the API server called the webhook: {}",
        hook.log()
    );
    // Validating: an unknown runtime is denied with the webhook's message and code.
    let bad = json!({"runtime": "ruby3", "source": {"inline": {"source": "x"}}});
    let err = fns.create(&pp, &function("bad", bad)).await.unwrap_err();
    let (code, message) = refusal(err);
    assert_eq!(code, 422);
    assert!(
        message.starts_with(
            "admission webhook \"validation.functions.serverless.kyma-project.io\" denied the \
             request: "
        ) && message.contains("spec.runtime"),
        "{message}"
    );
    assert!(api.get("Function", "team", "bad").is_none());
    // Updates go through it too, server-side apply included.
    let mut apply = json!({"apiVersion": "serverless.kyma-project.io/v1alpha2", "kind": "Function",
        "metadata": {"name": "hello"}, "spec": {"runtime": "ruby3"}});
    let err = fns
        .patch(
            "hello",
            &PatchParams::apply("someone").force(),
            &Patch::Apply(&apply),
        )
        .await
        .unwrap_err();
    assert!(refusal(err).1.contains("denied the request"));
    apply["spec"]["runtime"] = json!("nodejs24");
    fns.patch(
        "hello",
        &PatchParams::apply("someone").force(),
        &Patch::Apply(&apply),
    )
    .await
    .unwrap();
    // Other kinds, and the status subresource, are not the webhook's business.
    let cms: Api<ConfigMap> = Api::namespaced(api.client(), "team");
    cms.create(
        &pp,
        &serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap(),
    )
    .await
    .unwrap();

    // With the webhook down, failurePolicy Fail refuses every Function write.
    hook.stop();
    let spec = json!({"runtime": "nodejs22", "source": {"inline": {"source": "x"}}});
    let started = Instant::now();
    let err = fns
        .create(&pp, &function("late", spec.clone()))
        .await
        .unwrap_err();
    let (code, message) = refusal(err);
    assert_eq!(code, 500);
    assert!(
        message.starts_with(
            "Internal error occurred: failed calling webhook \
             \"defaulting.functions.serverless.kyma-project.io\": failed to call webhook: Post \
             \"https://kiln-webhook.kiln-system.svc:443/mutate?timeout=10s\": "
        ),
        "{message}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(api.get("Function", "team", "late").is_none());
}

#[tokio::test]
async fn a_webhook_the_ca_bundle_does_not_vouch_for_fails_closed() {
    let pki = Pki::new();
    let (cert, key) = pki.leaf_for_dns("svc", &["kiln-webhook.kiln-system.svc"]);
    let (_hook, _, _) = Webhook::start(&pki, &cert, &key).await;
    let api = KubeApi::start();
    api.insert(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}}));
    // The caBundle is another CA's (the in-memory API server's own), not the one that signed
    // the webhook's certificate.
    register(&api, api.ca_pem(), _hook.port);
    let spec = json!({"runtime": "nodejs22", "source": {"inline": {"source": "x"}}});
    let err = functions(&api)
        .create(&PostParams::default(), &function("hello", spec))
        .await
        .unwrap_err();
    let (code, message) = refusal(err);
    assert_eq!(code, 500);
    assert!(message.contains("failed calling webhook"), "{message}");
    assert!(api.get("Function", "team", "hello").is_none());
}

#[tokio::test]
async fn a_webhook_that_does_not_answer_in_its_timeout_fails_the_request_after_it() {
    // Accepts connections and never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let _hold = std::thread::spawn(move || {
        let _conns: Vec<_> = listener.incoming().take(4).collect();
    });
    let api = KubeApi::start();
    api.insert(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}}));
    register(&api, api.ca_pem(), port);
    let mut config = api
        .get("MutatingWebhookConfiguration", "", "kiln-functions")
        .unwrap();
    config["webhooks"][0]["timeoutSeconds"] = json!(1);
    api.insert(config);
    let spec = json!({"runtime": "nodejs22", "source": {"inline": {"source": "x"}}});
    let started = Instant::now();
    let err = functions(&api)
        .create(&PostParams::default(), &function("hello", spec))
        .await
        .unwrap_err();
    let took = started.elapsed();
    let (code, message) = refusal(err);
    assert_eq!(code, 500);
    assert!(message.contains("/mutate?timeout=1s\""), "{message}");
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(5),
        "{took:?}"
    );
}

#[tokio::test]
async fn only_functions_the_selectors_pick_are_sent_to_the_webhook() {
    let (_pki, _hook, api) = registered().await;
    let mut config = api
        .get("ValidatingWebhookConfiguration", "", "kiln-functions")
        .unwrap();
    config["webhooks"][0]["namespaceSelector"] = json!({"matchLabels": {"webhooks": "on"}});
    config["webhooks"][0]["objectSelector"] =
        json!({"matchExpressions": [{"key": "skip-validation", "operator": "DoesNotExist"}]});
    api.insert(config);
    let fns = functions(&api);
    let pp = PostParams::default();
    let bad = json!({"runtime": "ruby3", "source": {"inline": {"source": "x"}}});
    // The namespace does not have the label: not sent, admitted.
    fns.create(&pp, &function("one", bad.clone()))
        .await
        .unwrap();
    let mut ns = api.get("Namespace", "", "team").unwrap();
    ns["metadata"]["labels"]["webhooks"] = json!("on");
    api.insert(ns);
    let err = fns
        .create(&pp, &function("two", bad.clone()))
        .await
        .unwrap_err();
    assert!(refusal(err).1.contains("denied the request"));
    // The object opts out by its label.
    let mut skipped = function("three", bad);
    skipped.metadata.labels = Some([("skip-validation".to_string(), "yes".to_string())].into());
    fns.create(&pp, &skipped).await.unwrap();
}

#[tokio::test]
async fn a_dry_run_is_sent_to_webhooks_without_side_effects_and_stores_nothing() {
    let (_pki, _hook, api) = registered().await;
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let bad = json!({"runtime": "ruby3", "source": {"inline": {"source": "x"}}});
    let err = functions(&api)
        .create(&dry, &function("bad", bad))
        .await
        .unwrap_err();
    assert!(
        refusal(err).1.contains("denied the request"),
        "validated on a dry run too"
    );
    let good =
        json!({"runtime": "nodejs22", "source": {"inline": {"source": "x", "dependencies": " "}}});
    let answer = functions(&api)
        .create(&dry, &function("good", good))
        .await
        .unwrap();
    assert_eq!(
        answer.data["spec"]["source"]["inline"]["dependencies"],
        "{}"
    );
    assert!(
        api.get("Function", "team", "good").is_none(),
        "a dry run stores nothing"
    );
    // A webhook with side effects cannot even be registered (admissionregistration/v1).
    let mut config = api
        .get("MutatingWebhookConfiguration", "", "kiln-functions")
        .unwrap();
    config["webhooks"][0]["sideEffects"] = json!("Some");
    config["webhooks"][0]["timeoutSeconds"] = json!(60);
    let configs = Api::<DynamicObject>::all_with(
        api.client(),
        &kube::api::ApiResource {
            group: "admissionregistration.k8s.io".into(),
            version: "v1".into(),
            api_version: "admissionregistration.k8s.io/v1".into(),
            kind: "MutatingWebhookConfiguration".into(),
            plural: "mutatingwebhookconfigurations".into(),
        },
    );
    let config: DynamicObject = serde_json::from_value(config).unwrap();
    let err = configs
        .replace("kiln-functions", &PostParams::default(), &config)
        .await
        .unwrap_err();
    let (code, message) = refusal(err);
    assert_eq!(code, 422);
    assert!(
        message.contains("webhooks[0].sideEffects: Unsupported value: \"Some\"")
            && message.contains("webhooks[0].timeoutSeconds: Invalid value: 60"),
        "{message}"
    );
}

/// A mutating webhook configuration `name` (webhooks are called in configuration-name order)
/// calling `path` on the `kubernetes` Service in `default` (a name the in-memory API server's
/// own certificate carries, so a test server can serve it), for ConfigMaps.
fn config_map_hook(name: &str, path: &str, reinvocation: &str, failure: &str, ca: &str) -> Value {
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{"name": format!("{name}.example.com"), "admissionReviewVersions": ["v1"],
            "sideEffects": "None", "failurePolicy": failure, "reinvocationPolicy": reinvocation,
            "clientConfig": {"service": {
                "name": "kubernetes",
                "namespace": "default",
                "path": path
            },
                             "caBundle": base64::engine::general_purpose::STANDARD.encode(ca)},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["configmaps"]}]}]})
}

/// Serves two mutating webhooks over TLS with the API server's certificate: `/a` records in
/// annotation `a-saw-b` whether annotation `b` is there; `/b` adds `b`.
async fn serve_a_and_b(api: &KubeApi) -> u16 {
    use axum::routing::post;
    async fn review(body: axum::Json<Value>, add: fn(&Value) -> Value) -> axum::Json<Value> {
        let request = &body.0["request"];
        let patch =
            base64::engine::general_purpose::STANDARD.encode(add(&request["object"]).to_string());
        axum::Json(
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": request["uid"], "allowed": true, "patchType": "JSONPatch",
                         "patch": patch}}),
        )
    }
    fn a(object: &Value) -> Value {
        let saw = object["metadata"]["annotations"]["b"]
            .is_string()
            .to_string();
        let mut ops = Vec::new();
        if object["metadata"]["annotations"].is_null() {
            ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": {}}));
        }
        ops.push(json!({"op": "add", "path": "/metadata/annotations/a-saw-b", "value": saw}));
        Value::Array(ops)
    }
    fn b(object: &Value) -> Value {
        let mut ops = Vec::new();
        if object["metadata"]["annotations"].is_null() {
            ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": {}}));
        }
        ops.push(json!({"op": "add", "path": "/metadata/annotations/b", "value": "1"}));
        Value::Array(ops)
    }
    let app = axum::Router::new()
        .route("/a", post(|body| review(body, a)))
        .route("/b", post(|body| review(body, b)));
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = tcp.local_addr().unwrap().port();
    let listener =
        crate::common::kube_api::tls::TlsListener::new(tcp, crate::common::kube_api::pki::pki());
    tokio::spawn(async move { axum::serve(listener, app).await });
    // The `kubernetes` Service's endpoint: a Ready Pod on 127.0.0.1.
    api.insert(json!({"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": "kubernetes",
        "namespace": "default"
    },
        "spec": {"selector": {"app": "hooks"}, "ports": [{"port": 443, "targetPort": port}]}}));
    api.insert(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "hooks",
        "namespace": "default",
        "labels": {"app": "hooks"}
    },
        "spec": {"containers": [{
            "name": "hooks",
            "image": "x",
            "ports": [{"containerPort": port}]
        }]},
        "status": {"podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}}));
    port
}

#[tokio::test]
async fn a_webhook_reinvoked_if_needed_sees_what_a_later_one_changed_and_ignore_fails_open() {
    let api = KubeApi::start();
    serve_a_and_b(&api).await;
    let ca = api.ca_pem().to_string();
    let cms: Api<ConfigMap> = Api::namespaced(api.client(), "default");
    let create = |name: &str| {
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        let cms = cms.clone();
        async move { cms.create(&PostParams::default(), &cm).await }
    };
    let annotation = |name: &str, key: &str| {
        api.get("ConfigMap", "default", name).unwrap()["metadata"]["annotations"][key].clone()
    };
    // `a` runs before `b` (configurations by name); without reinvocation it never sees `b`.
    api.insert(config_map_hook("a", "/a", "Never", "Fail", &ca));
    api.insert(config_map_hook("b", "/b", "Never", "Fail", &ca));
    create("once").await.unwrap();
    assert_eq!(annotation("once", "a-saw-b"), "false");
    assert_eq!(annotation("once", "b"), "1");
    // IfNeeded: `b` changed the object after `a` ran, so `a` runs once more.
    api.insert(config_map_hook("a", "/a", "IfNeeded", "Fail", &ca));
    create("twice").await.unwrap();
    assert_eq!(annotation("twice", "a-saw-b"), "true");
    // failurePolicy Ignore: a webhook that cannot be called is passed over.
    let mut broken = config_map_hook("c", "/a", "Never", "Ignore", &ca);
    broken["webhooks"][0]["clientConfig"]["service"]["name"] = json!("nowhere");
    api.insert(broken);
    create("ignored").await.unwrap();
    let mut failing = config_map_hook("d", "/a", "Never", "Fail", &ca);
    failing["webhooks"][0]["clientConfig"]["service"]["name"] = json!("nowhere");
    api.insert(failing);
    let err = create("refused").await.unwrap_err();
    let (code, message) = refusal(err);
    assert_eq!(code, 500);
    assert!(
        message.contains("service \"nowhere\" not found"),
        "{message}"
    );
}
