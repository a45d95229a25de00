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

/// The labels of the build Pods the controller renders (through kiln's own renderer).
fn build_pod_labels() -> Vec<(String, String)> {
    use kiln::controller::{config, crd, plan, render};
    let mut f = crd::Function::new(
        "hello",
        crd::FunctionSpec {
            runtime: "nodejs22".into(),
            source: crd::Source {
                inline: Some(crd::InlineSource {
                    source: "module.exports = { main: () => 'hi' }".into(),
                    dependencies: None,
                }),
                git_repository: None,
            },
            ..crd::FunctionSpec::default()
        },
    );
    f.metadata.namespace = Some("team".into());
    f.metadata.uid = Some("u-1".into());
    f.metadata.labels = Some([("kiln.io/registry".to_string(), "true".to_string())].into());
    let digest = |c: char| {
        format!("sha256:{}", c.to_string().repeat(64))
            .parse()
            .unwrap()
    };
    let catalog = kiln::runtime::Catalog::embedded();
    let lookups = plan::Lookups {
        base: ("reg/kiln/nodejs22".into(), digest('b')),
        builder: ("reg/kiln/nodejs22-builder".into(), digest('c')),
        commit: None,
        git_note: None,
        registry_config: None,
        platforms: vec![kiln::oci::Platform::linux_amd64()],
    };
    let config = config::Config::new("reg/functions".into(), Default::default());
    let plan = plan::plan(&f, catalog.get("nodejs22").unwrap(), &config, &lookups);
    let job = render::job::job(&f, &plan, &config);
    assert_eq!(job.metadata.namespace.as_deref(), Some("kiln-builds"));
    let labels = job.spec.unwrap().template.metadata.unwrap().labels.unwrap();
    labels.into_iter().collect()
}

#[test]
fn network_policies_let_build_pods_reach_dns_and_registries_and_nothing_else_in_the_cluster() {
    use common::netpol::{Cluster, Peer};
    let policies: Vec<Value> = documents(&deploy().join("network-policy.yaml"));
    assert!(kustomization_resources().contains(&deploy().join("network-policy.yaml")));
    let cluster = Cluster::new(
        policies,
        &[
            ("kiln-builds", &[]),
            ("kiln-system", &[]),
            ("kube-system", &[]),
            ("team", &[]),
            ("registry", &[]),
        ],
    );
    let labels = build_pod_labels();
    assert!(
        !labels.iter().any(|(k, _)| k == "kiln.io/registry"),
        "a Function's own labels could make a policy select its build"
    );
    let owned: Vec<(&str, &str)> = labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let build = Peer::pod("kiln-builds", &owned, "10.244.2.9");
    let dns = Peer::pod("kube-system", &[("k8s-app", "kube-dns")], "10.244.0.5");
    let registry = Peer::pod("registry", &[("kiln.io/registry", "true")], "10.244.3.4");
    let function = Peer::pod("team", &[("app.kubernetes.io/name", "hello")], "10.244.1.7");
    let webhook = Peer::pod(
        "kiln-system",
        &[("app.kubernetes.io/name", "kiln-webhook")],
        "10.244.0.8",
    );
    let controller = Peer::pod(
        "kiln-system",
        &[("app.kubernetes.io/name", "kiln-controller")],
        "10.244.0.9",
    );
    let npm = Peer::external("104.16.3.35");
    let api_server = Peer::external("10.0.0.1");
    let metadata = Peer::external("169.254.169.254");
    let allowed = [
        (&build, &dns, 53, "UDP", "cluster DNS"),
        (&build, &dns, 53, "TCP", "cluster DNS over TCP"),
        (&build, &npm, 443, "TCP", "a package registry"),
        (
            &build,
            &registry,
            5000,
            "TCP",
            "an in-cluster registry, by its label",
        ),
        (
            &function,
            &npm,
            443,
            "TCP",
            "Function Pods: no policy, as on Kyma",
        ),
        (
            &function,
            &api_server,
            443,
            "TCP",
            "Function Pods: no policy",
        ),
        (&api_server, &webhook, 8443, "TCP", "admission requests"),
        (&function, &controller, 8080, "TCP", "metrics"),
        (
            &controller,
            &api_server,
            443,
            "TCP",
            "the controller's egress is open",
        ),
    ];
    for (from, to, port, protocol, what) in allowed {
        assert!(cluster.allows(from, to, port, protocol), "refused: {what}");
    }
    let refused = [
        (&build, &api_server, 443, "TCP", "the API server"),
        (&build, &metadata, 80, "TCP", "the cloud metadata service"),
        (&build, &function, 8080, "TCP", "a tenant's Function"),
        (&build, &controller, 8080, "TCP", "the controller"),
        (&build, &npm, 22, "TCP", "the internet beyond HTTP(S)"),
        (&function, &build, 8080, "TCP", "anything into a build Pod"),
        (
            &function,
            &webhook,
            9443,
            "TCP",
            "the webhook beyond its port",
        ),
        (
            &function,
            &controller,
            8443,
            "TCP",
            "the controller beyond metrics",
        ),
    ];
    for (from, to, port, protocol, what) in refused {
        assert!(!cluster.allows(from, to, port, protocol), "allowed: {what}");
    }
}

/// The CI examples (examples/ci/) validate against the schemas their projects publish, kept
/// in tests/fixtures/ci-schemas/: Tekton's and Shipwright's CRDs (strictly: a field they do not
/// declare is an error), GitHub's workflow schema (SchemaStore's) and GitLab's CI schema.
/// Each check also refuses the same file with one field misspelt.
#[test]
fn the_ci_examples_validate_against_their_projects_schemas() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (examples, schemas) = (
        root.join("examples/ci"),
        root.join("tests/fixtures/ci-schemas"),
    );
    let crd = |schema: &str, doc: &Value| {
        common::crd_schema::validate(&schemas.join(schema), std::slice::from_ref(doc))
    };
    let json_schema =
        |schema: &str, doc: &Value| common::schema::check_json_schema(&schemas.join(schema), doc);
    type Check<'a> = &'a dyn Fn(&str, &Value) -> Result<(), String>;
    let cases: [(&str, &str, Check, &str, &str); 4] = [
        (
            "tekton-task.yaml",
            "tekton-task-crd.yaml",
            &crd,
            "/spec/steps/0/image",
            "imag",
        ),
        (
            "shipwright-strategy.yaml",
            "shipwright-clusterbuildstrategies-crd.yaml",
            &crd,
            "/spec/steps/0/workingDir",
            "workdir",
        ),
        (
            "github-actions.yml",
            "github-workflow.json",
            &json_schema,
            "/jobs/build/runs-on",
            "runs_on",
        ),
        (
            "gitlab-ci.yml",
            "gitlab-ci.json",
            &json_schema,
            "/function/script",
            "scripts",
        ),
    ];
    for (file, schema, check, field, misspelt) in cases {
        let mut docs = documents(&examples.join(file));
        assert_eq!(docs.len(), 1, "{file}");
        let doc = docs.remove(0);
        check(schema, &doc).unwrap_or_else(|e| panic!("{file}: {e}"));
        // The same document with the field renamed: its schema must refuse it.
        let (parent, name) = field.rsplit_once('/').unwrap();
        let mut bad = doc.clone();
        let object = bad.pointer_mut(parent).unwrap().as_object_mut().unwrap();
        let value = object
            .remove(name)
            .unwrap_or_else(|| panic!("{file} has {field}"));
        object.insert(misspelt.into(), value);
        assert!(
            check(schema, &bad).is_err(),
            "{file} with {misspelt} passed"
        );
    }
}
