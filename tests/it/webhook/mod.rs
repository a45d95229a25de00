//! `kiln webhook` black-box: the real binary serving AdmissionReview v1 over real TLS (a CA
//! and leaf certificates made by openssl), called with reqwest trusting only that CA. Each
//! defaulting rule's patch is decoded and applied, each validation rule's verdict and message
//! checked, and a rotated certificate must be presented without a restart.

#![allow(clippy::unwrap_used)]

mod admission;
mod harness;
mod hostile;

use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

use harness::{Pki, Webhook, raw_exchange, replace_file};

async fn started() -> (Pki, Webhook) {
    let pki = Pki::new();
    let (cert, key) = pki.leaf("a", "webhook-a", false);
    let (hook, _, _) = Webhook::start(&pki, &cert, &key).await;
    (pki, hook)
}

fn function(spec: Value) -> Value {
    json!({"apiVersion": "serverless.kyma-project.io/v1alpha2", "kind": "Function",
           "metadata": {"name": "hello", "namespace": "team"}, "spec": spec})
}

fn node_spec() -> Value {
    json!({"runtime": "nodejs22", "replicas": 1,
           "source": {"inline": {"source": "module.exports = { main: () => 'hi' }"}}})
}

fn review(operation: &str, object: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": format!("uid-{}", object["metadata"]["name"].as_str().unwrap_or("x")),
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
            "requestKind": {
                "group": "serverless.kyma-project.io",
                "version": "v1alpha2",
                "kind": "Function"
            },
            "name": object["metadata"]["name"], "namespace": "team", "operation": operation,
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
            "object": object, "oldObject": null, "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    })
}

/// The Function `spec` after applying the patch /mutate answers.
async fn mutated(hook: &Webhook, spec: Value) -> (Value, Value) {
    let mut object = function(spec);
    let response = hook
        .review("/mutate", &review("CREATE", object.clone()))
        .await;
    assert_eq!(response["allowed"], true);
    if let Some(patch) = response["patch"].as_str() {
        assert_eq!(response["patchType"], "JSONPatch");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(patch)
            .unwrap();
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
        json_patch::patch(&mut object, &patch).unwrap();
    }
    (object["spec"].clone(), response)
}

#[tokio::test]
async fn mutate_returns_each_defaulting_rule_as_a_json_patch() {
    let (_pki, hook) = started().await;
    let mut spec = node_spec();
    spec.as_object_mut().unwrap().remove("replicas");
    assert_eq!(mutated(&hook, spec.clone()).await.0["replicas"], 1);
    spec["scaleConfig"] = json!({"minReplicas": 2, "maxReplicas": 4});
    assert_eq!(mutated(&hook, spec).await.0["replicas"], 2);

    let mut spec = node_spec();
    spec["source"]["inline"]["dependencies"] = json!("   ");
    assert_eq!(
        mutated(&hook, spec).await.0["source"]["inline"]["dependencies"],
        "{}"
    );

    let mut spec = node_spec();
    spec["resourceConfiguration"] =
        json!({"function": {"resources": {"limits": {"cpu": "300m", "memory": "256Mi"}}}});
    let (out, _) = mutated(&hook, spec).await;
    let r = &out["resourceConfiguration"]["function"]["resources"];
    assert_eq!(r["requests"], json!({"cpu": "300m", "memory": "256Mi"}));

    let mut spec = node_spec();
    spec["resourceConfiguration"] =
        json!({"build": {"resources": {"requests": {"cpu": "2", "memory": "300Mi"}}}});
    let (out, _) = mutated(&hook, spec).await;
    // The default build profile (normal) limits 1100m / 1100Mi; the larger value wins.
    let r = &out["resourceConfiguration"]["build"]["resources"];
    assert_eq!(r["limits"], json!({"cpu": "2", "memory": "1100Mi"}));

    let (out, response) = mutated(&hook, node_spec()).await;
    assert_eq!(out, node_spec(), "nothing to default");
    assert!(response.get("patch").is_none(), "{response}");
}

/// Edits of a valid Function, each breaking one rule: (edit, field, words in the message).
fn broken() -> Vec<(Value, &'static str, &'static str)> {
    vec![
        (
            json!({"metadata": {"name": "Hello_1"}}),
            "metadata.name",
            "is not a valid Function name",
        ),
        (
            json!({"spec": {"runtime": "ruby3"}}),
            "spec.runtime",
            "nodejs22, nodejs24, nodejs26, python313",
        ),
        (
            json!({"spec": {"runtimeImageOverride": "UPPER CASE"}}),
            "spec.runtimeImageOverride",
            "invalid",
        ),
        (
            json!({"spec": {"resourceConfiguration": {"function": {
                "resources": {"requests": {"cpu": "5m"}}}}}}),
            "spec.resourceConfiguration.function.resources.requests.cpu",
            "below the minimum cpu for a Function (10m)",
        ),
        (
            json!({"spec": {"resourceConfiguration": {"build": {
                "resources": {"limits": {"memory": "100Mi"}}}}}}),
            "spec.resourceConfiguration.build.resources.limits.memory",
            "below the minimum memory for a build (200Mi)",
        ),
        (
            json!({"spec": {"resourceConfiguration": {"function": {"resources": {
                "requests": {"memory": "1Gi"},
                "limits": {"memory": "512Mi"}
            }}}}}),
            "spec.resourceConfiguration.function.resources.requests.memory",
            "exceeds limits.memory (512Mi)",
        ),
        (
            json!({"spec": {"resourceConfiguration": {"function": {"profile": "XXL"}}}}),
            "spec.resourceConfiguration.function.profile",
            "use one of XS, S, M, L, XL",
        ),
        (
            json!({"spec": {"env": [{"name": "OK"}, {"name": "ALSO_OK"}, {"name": "1BAD"}]}}),
            "spec.env[2].name",
            "\"1BAD\" is not a valid environment variable name",
        ),
        (
            json!({"spec": {"env": [{"name": "A"}, {"name": "A"}]}}),
            "spec.env[1].name",
            "already set by spec.env[0]",
        ),
        (
            json!({"spec": {"env": [{"name": "PYTHONPATH", "value": "/x"}]}}),
            "spec.env[0].name",
            "reserved",
        ),
        (
            json!({"spec": {"env": [{"name": "A", "valueFrom": {}}]}}),
            "spec.env[0].valueFrom",
            "exactly one of",
        ),
        (
            json!({"spec": {"secretMounts": [{"secretName": "Creds", "mountPath": "/creds"}]}}),
            "spec.secretMounts[0].secretName",
            "not a valid Secret name",
        ),
        (
            json!({"spec": {"secretMounts": [
                {"secretName": "a", "mountPath": "/s"},
                {"secretName": "b", "mountPath": "/s/"}
            ]}}),
            "spec.secretMounts[1].mountPath",
            "already used by spec.secretMounts[0]",
        ),
        (
            json!({"spec": {"secretMounts": [{"secretName": "a", "mountPath": "/tmp"}]}}),
            "spec.secretMounts[0].mountPath",
            "would hide /tmp",
        ),
        (
            json!({"spec": {"secretMounts": [{
                "secretName": "a",
                "mountPath": "/usr/src/app/function/s"
            }]}}),
            "spec.secretMounts[0].mountPath",
            "is inside /usr/src/app/function",
        ),
        (
            json!({"spec": {"source": {"inline": {"dependencies": "[1, 2]"}}}}),
            "spec.source.inline.dependencies",
            "package.json line 1: must be a JSON object",
        ),
        (
            json!({"spec": {
                "runtime": "python313",
                "source": {"inline": {"dependencies": "flask==\n"}}
            }}),
            "spec.source.inline.dependencies",
            "requirements.txt line 1",
        ),
        (
            json!({"spec": {"labels": {"bad key": "v"}}}),
            "spec.labels[bad key]",
            "not a valid qualified name",
        ),
        (
            json!({"spec": {"labels": {"app": "-v-"}}}),
            "spec.labels[app]",
            "not a valid label value",
        ),
        (
            json!({"spec": {"annotations": {"serverless.kyma-project.io/x": "v"}}}),
            "spec.annotations[serverless.kyma-project.io/x]",
            "reserved",
        ),
        (
            json!({"spec": {"source": {
                "inline": null,
                "gitRepository": {
                    "url": "git@github.com:o/r.git",
                    "baseDir": "/",
                    "reference": "main"
                }
            }}}),
            "spec.source.gitRepository.url",
            "is an SSH URL, which needs auth.type: key",
        ),
        (
            json!({"spec": {"source": {
                "inline": null,
                "gitRepository": {
                    "url": "https://github.com/o/r.git",
                    "baseDir": "/",
                    "reference": "main",
                    "auth": {"type": "key", "secretName": "k"}
                }
            }}}),
            "spec.source.gitRepository.url",
            "auth.type: key authenticates over SSH only",
        ),
        (
            json!({"spec": {"source": {
                "inline": null,
                "gitRepository": {
                    "url": "https://github.com/o/r.git",
                    "baseDir": " ",
                    "reference": "main"
                }
            }}}),
            "spec.source.gitRepository.baseDir",
            "is blank",
        ),
        (
            json!({"spec": {"scaleConfig": {"minReplicas": 5, "maxReplicas": 2}}}),
            "spec.scaleConfig",
            "minReplicas (5) exceeds maxReplicas (2)",
        ),
        (
            json!({"spec": {"template": {"labels": {"a": "b"}}}}),
            "spec.template",
            "no longer supported",
        ),
    ]
}

#[tokio::test]
async fn validate_denies_each_broken_rule_naming_the_field() {
    let (_pki, hook) = started().await;
    let response = hook
        .review("/validate", &review("CREATE", function(node_spec())))
        .await;
    assert_eq!(response["allowed"], true, "{response}");
    for (edit, field, words) in broken() {
        let mut object = function(node_spec());
        json_patch::merge(&mut object, &edit);
        let response = hook.review("/validate", &review("CREATE", object)).await;
        assert_eq!(response["allowed"], false, "{edit}: {response}");
        let status = &response["status"];
        assert_eq!(
            (status["code"].as_i64(), status["reason"].as_str()),
            (Some(422), Some("Invalid"))
        );
        let message = status["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("{field}: ")) && message.contains(words),
            "{edit}: {message}"
        );
        let causes = status["details"]["causes"].as_array().unwrap();
        assert!(
            causes.iter().any(|c| c["field"] == field),
            "{edit}: {causes:?}"
        );
    }
}

#[tokio::test]
async fn a_kyma_runtime_name_is_admitted_with_a_warning_from_both_endpoints() {
    let (_pki, hook) = started().await;
    let mut spec = node_spec();
    spec["runtime"] = json!("nodejs20");
    for path in ["/mutate", "/validate"] {
        let response = hook
            .review(path, &review("CREATE", function(spec.clone())))
            .await;
        assert_eq!(response["allowed"], true);
        let warning = response["warnings"][0].as_str().unwrap_or_default();
        assert!(
            warning.contains("runtime nodejs20 is built as nodejs22"),
            "{path}: {response}"
        );
    }
}

#[tokio::test]
async fn bad_requests_get_clear_errors_and_other_requests_pass_untouched() {
    let (pki, mut hook) = started().await;
    let r = hook
        .client
        .post(hook.url("/validate"))
        .body("{\"apiVersion\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(
        r.text()
            .await
            .unwrap()
            .starts_with("malformed AdmissionReview: ")
    );
    let v1beta1 =
        json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}});
    let r = hook
        .client
        .post(hook.url("/mutate"))
        .json(&v1beta1)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("admissionReviewVersions: [v1]")
    );
    // A body above 3 MiB is refused from its Content-Length, before it is sent.
    let head = "POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
                Content-Length: 4194304\r\nConnection: close\r\n\r\n";
    let answer = raw_exchange(&pki, hook.port, head.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    assert!(
        answer.contains("exceeds the limit of 3145728 bytes"),
        "{answer}"
    );
    assert_eq!(
        hook.client
            .get(hook.url("/healthz"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
        "ok"
    );

    let mut delete = review("DELETE", function(json!({"runtime": "cobol"})));
    delete["request"]["oldObject"] = delete["request"]["object"].take();
    let response = hook.review("/validate", &delete).await;
    assert_eq!(response, json!({"uid": "uid-hello", "allowed": true}));

    // One JSON log line per review, with the Function's namespace and name.
    let broken = function(json!({"runtime": "cobol", "source": {"inline": {"source": "x"}}}));
    assert_eq!(
        hook.review("/validate", &review("CREATE", broken)).await["allowed"],
        false
    );
    let status = hook.stop();
    assert!(
        status.success(),
        "graceful shutdown exits 0: {status}\n{}",
        hook.log()
    );
    let log = hook.log();
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let denied = lines
        .iter()
        .find(|l| l["fields"]["verdict"] == "denied")
        .unwrap_or_else(|| panic!("no review line:\n{log}"));
    let f = &denied["fields"];
    assert_eq!(
        (
            f["namespace"].as_str(),
            f["name"].as_str(),
            f["operation"].as_str()
        ),
        (Some("team"), Some("hello"), Some("CREATE"))
    );
    assert!(f["message"].as_str().unwrap().contains("spec.runtime"));
    assert!(log.contains("shutting down"), "{log}");
}

#[tokio::test]
async fn a_rotated_certificate_is_presented_without_a_restart() {
    let pki = Pki::new();
    let (cert_a, key_a) = pki.leaf("a", "webhook-a", false);
    let (cert_b, key_b) = pki.leaf("b", "webhook-b", true);
    let (cert_c, _) = pki.leaf("c", "webhook-c", false);
    let (hook, tls_cert, tls_key) = Webhook::start(&pki, &cert_a, &key_a).await;
    let pid = hook.child.id();
    assert_eq!(hook.presented().await, pki.der(&cert_a));
    assert_ne!(pki.der(&cert_a), pki.der(&cert_b));

    // A broken pair (C's certificate with B's key) is refused and A kept.
    replace_file(&key_b, &tls_key);
    replace_file(&cert_c, &tls_cert);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(hook.presented().await, pki.der(&cert_a), "{}", hook.log());
    assert!(
        hook.log().contains("keeping the current certificate"),
        "{}",
        hook.log()
    );

    replace_file(&cert_b, &tls_cert);
    let deadline = Instant::now() + Duration::from_secs(10);
    while hook.presented().await != pki.der(&cert_b) {
        assert!(
            Instant::now() < deadline,
            "B not presented within 10 s:\n{}",
            hook.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(hook.child.id(), pid);
    let response = hook
        .review("/validate", &review("CREATE", function(node_spec())))
        .await;
    assert_eq!(response["allowed"], true);
    assert!(hook.log().contains("reloaded the serving certificate"));
}
