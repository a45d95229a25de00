//! The real `kubectl` (1.37) against the in-memory API server: `apply --server-side -k deploy/`
//! as the README has users run it (discovery, OpenAPI v3 and server-side field validation,
//! field ownership), then `get` (kiln's printer columns), `describe` (with the controller's
//! Events), `scale` and `delete` of a Function, and what a strict server refuses.

#![allow(clippy::unwrap_used)]

use crate::common;

use common::kube_api::{CrdSource, KubeApi, Options};
use common::kubectl::{Kubectl, deploy_with_image};
use serde_json::{Value, json};

/// An API server as a cluster with cert-manager installed and nothing of kiln's.
pub fn cluster_with_cert_manager() -> KubeApi {
    let crds =
        std::fs::read_to_string(common::kiln::fixtures().join("cert-manager/crds.yaml")).unwrap();
    KubeApi::with_options(Options {
        crds: vec![CrdSource::Yaml(crds)],
        ..Options::default()
    })
}

fn hello_function() -> Value {
    json!({"apiVersion": "serverless.kyma-project.io/v1alpha2", "kind": "Function",
        "metadata": {"name": "hello", "namespace": "team"},
        "spec": {"runtime": "nodejs22", "source": {"inline": {
            "source": "module.exports = { main: () => 'hello' }"}}}})
}

#[test]
fn kubectl_applies_deploy_server_side_and_reads_scales_and_deletes_functions() {
    let api = cluster_with_cert_manager();
    let dir = tempfile::tempdir().unwrap();
    let kubectl = Kubectl::admin(&api, dir.path());
    let deploy = deploy_with_image(dir.path(), "registry.example.com/kiln/kiln:test");
    let deploy = deploy.to_str().unwrap();

    let out = kubectl.ok(&["apply", "--server-side", "-k", deploy]);
    for line in [
        "namespace/kiln-system serverside-applied",
        "customresourcedefinition.apiextensions.k8s.io/functions.serverless.kyma-project.io \
            serverside-applied",
        "clusterrole.rbac.authorization.k8s.io/kiln-controller serverside-applied",
        "deployment.apps/kiln-controller serverside-applied",
        "certificate.cert-manager.io/kiln-webhook serverside-applied",
        "validatingwebhookconfiguration.admissionregistration.k8s.io/kiln-functions \
            serverside-applied",
    ] {
        assert!(out.contains(line), "{line} in:\n{out}");
    }
    let controller = api
        .get("Deployment", "kiln-system", "kiln-controller")
        .unwrap();
    assert_eq!(
        controller["spec"]["template"]["spec"]["containers"][0]["image"],
        "registry.example.com/kiln/kiln:test"
    );
    let managers: Vec<&str> = controller["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["manager"].as_str().unwrap())
        .collect();
    assert_eq!(managers, ["kubectl"]);
    // Applying again changes nothing.
    let rv = api.resource_version();
    kubectl.ok(&["apply", "--server-side", "-k", deploy]);
    assert_eq!(api.resource_version(), rv, "a second apply is a no-op");

    // The CRD serves Functions now. kubectl validates server-side (fieldValidation=Strict): a
    // field the CRD does not declare is refused, not silently dropped.
    api.insert(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}}));
    let mut unknown = hello_function();
    unknown["spec"]["notAField"] = json!(true);
    let out = kubectl
        .command(&["apply", "--server-side", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(unknown.to_string().as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "refused: {stderr}");
    assert!(
        stderr.contains("strict decoding error: unknown field \"spec.notAField\""),
        "{stderr}"
    );

    // A Function with status and Events, as the controller leaves it (inserted: the webhook
    // the configurations above call is not running in this test).
    let mut f = hello_function();
    f["status"] = json!({"conditions": [
        {"type": "ConfigurationReady", "status": "True", "reason": "ConfigMapCreated"},
        {"type": "BuildReady", "status": "True", "reason": "JobFinished"},
        {"type": "Running", "status": "Unknown", "reason": "DeploymentWaiting"}],
        "replicas": 1, "podSelector": "serverless.kyma-project.io/function-name=hello",
        "runtime": "nodejs22"});
    let f = api.insert(f);
    api.insert(json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "hello.1", "namespace": "team"},
        "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "kiln-controller",
        "reportingInstance": "kiln-controller-0", "action": "BuildReady", "type": "Normal",
        "reason": "JobFinished", "note": "Job hello-build-x finished",
        "regarding": {"apiVersion": "serverless.kyma-project.io/v1alpha2", "kind": "Function",
                      "name": "hello", "namespace": "team", "uid": f["metadata"]["uid"]}}));

    let table = kubectl.ok(&["get", "functions", "-n", "team"]);
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        [
            "NAME",
            "CONFIGURED",
            "BUILT",
            "RUNNING",
            "RUNTIME",
            "BUILT",
            "AS",
            "VERSION",
            "AGE"
        ],
        "{table}"
    );
    assert_eq!(
        lines[1][..7],
        [
            "hello", "True", "True", "Unknown", "nodejs22", "nodejs22", "1"
        ],
        "{table}"
    );
    assert_eq!(
        kubectl
            .ok(&["get", "fn", "-n", "team", "-o", "name"])
            .trim(),
        "function.serverless.kyma-project.io/hello"
    );
    let yaml = kubectl.ok(&["get", "function", "hello", "-n", "team", "-o", "json"]);
    let got: Value = serde_json::from_str(&yaml).unwrap();
    assert_eq!(got["spec"]["runtime"], "nodejs22");

    let described = kubectl.ok(&["describe", "function", "hello", "-n", "team"]);
    assert!(described.contains("Runtime:   nodejs22"), "{described}");
    let events = described.split("Events:").nth(1).unwrap();
    assert!(
        events.contains("JobFinished")
            && events.contains("kiln-controller")
            && events.contains("Job hello-build-x finished"),
        "the controller's events.k8s.io Event, read as core/v1 by describe:\n{described}"
    );

    let out = kubectl.ok(&["scale", "function", "hello", "-n", "team", "--replicas=3"]);
    assert!(out.contains("scaled"), "{out}");
    assert_eq!(
        api.get("Function", "team", "hello").unwrap()["spec"]["replicas"],
        3
    );

    kubectl.ok(&["delete", "function", "hello", "-n", "team"]);
    assert!(api.get("Function", "team", "hello").is_none());
}

#[test]
fn kubectl_as_a_service_account_is_refused_what_its_roles_do_not_grant() {
    let api = cluster_with_cert_manager();
    let dir = tempfile::tempdir().unwrap();
    let admin = Kubectl::admin(&api, dir.path());
    let deploy = deploy_with_image(dir.path(), "registry.example.com/kiln/kiln:test");
    admin.ok(&["apply", "--server-side", "-k", deploy.to_str().unwrap()]);
    // The webhook's ServiceAccount is granted nothing.
    let token = api.service_account_token("kiln-system", "kiln-webhook");
    std::fs::create_dir_all(dir.path().join("wh")).unwrap();
    let webhook = Kubectl::with_token(&api, &dir.path().join("wh"), &token);
    let out = webhook.run(&["get", "secrets", "-n", "kiln-system"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(
            "Error from server (Forbidden): secrets is forbidden: User \
             \"system:serviceaccount:kiln-system:kiln-webhook\" cannot list resource \"secrets\" \
             in API group \"\" in the namespace \"kiln-system\""
        ),
        "{stderr}"
    );
    let controller_token = api.service_account_token("kiln-system", "kiln-controller");
    std::fs::create_dir_all(dir.path().join("ctl")).unwrap();
    let controller = Kubectl::with_token(&api, &dir.path().join("ctl"), &controller_token);
    controller.ok(&["get", "functions", "-A"]);
    let out = controller.run(&["delete", "namespace", "kiln-system"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot delete resource \"namespaces\""));
}

#[test]
fn kubectl_creates_namespaces_secrets_and_config_maps_sent_as_protobuf() {
    let api = cluster_with_cert_manager();
    let dir = tempfile::tempdir().unwrap();
    let kubectl = Kubectl::admin(&api, dir.path());
    kubectl.ok(&["create", "namespace", "team"]);
    kubectl.ok(&[
        "label",
        "namespace",
        "team",
        "pod-security.kubernetes.io/enforce=restricted",
    ]);
    let ns = api.get("Namespace", "", "team").unwrap();
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    assert!(api.get("ServiceAccount", "team", "default").is_some());
    kubectl.ok(&[
        "-n",
        "team",
        "create",
        "secret",
        "docker-registry",
        "push",
        "--docker-server=registry.example.com",
        "--docker-username=robot",
        "--docker-password=s3cret",
    ]);
    let secret = api.get("Secret", "team", "push").unwrap();
    assert_eq!(secret["type"], "kubernetes.io/dockerconfigjson");
    use base64::Engine;
    let config = base64::engine::general_purpose::STANDARD
        .decode(secret["data"][".dockerconfigjson"].as_str().unwrap())
        .unwrap();
    let config = String::from_utf8(config).unwrap();
    assert!(
        config.contains("registry.example.com") && config.contains("robot"),
        "{config}"
    );
    kubectl.ok(&[
        "-n",
        "team",
        "create",
        "configmap",
        "settings",
        "--from-literal=mode=fast",
    ]);
    assert_eq!(
        api.get("ConfigMap", "team", "settings").unwrap()["data"]["mode"],
        "fast"
    );
    // A Pod is refused by the namespace's PodSecurity level, as on a cluster.
    let out = kubectl.run(&["-n", "team", "run", "bare", "--image=busybox"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("violates PodSecurity \"restricted:latest\""),
        "{stderr}"
    );
}
