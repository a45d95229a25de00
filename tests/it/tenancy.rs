//! Tenants apart: push credentials stay in kiln's namespaces, a Function namespace gets at
//! most a pull-only Secret on the ServiceAccount its Pods run as, and the controller deploys
//! only images its own build Jobs reported, whatever a registry's tag says.

use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

use crate::common;
use common::controller_env::{BUILDS, ControllerEnv, SYSTEM, docker_config, node_function};
use common::fake_builds::{FakeBuilds, FakeRollouts, Outcome, job_arg};
use common::registry::{PASSWORD, PULL_PASSWORD, PULL_USER, RegistryKind, USER};

const HELLO: &str = "module.exports = { main: () => 'hello' }";

fn manifest_digest(env: &ControllerEnv, reference: &str) -> String {
    let raw = env.registry.skopeo_inspect_raw(reference);
    common::sha256_digest(&raw)
}

fn deployed_image(env: &ControllerEnv, namespace: &str, name: &str) -> String {
    let d = env
        .api
        .get("Deployment", namespace, name)
        .expect("a Deployment");
    d["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn an_image_planted_under_a_functions_build_key_is_never_deployed_and_the_function_is_built() {
    let env = ControllerEnv::start(&[]);
    let builds = FakeBuilds::start(env.api.client(), Duration::from_millis(100), {
        let outcome = Outcome::Push {
            layout: env.tiny.layout.clone(),
            tag: "base".into(),
            digest: env.tiny.digest.clone(),
            creds: None,
        };
        move |_| outcome.clone()
    });
    let _rollouts = FakeRollouts::start(env.api.client());
    // The Function's build key is its image tag: learn it from a first build held back, as an
    // attacker with push access could compute it from what it knows of the Function.
    builds.hold();
    env.create_function("team", &node_function("hello", HELLO, None));
    env.wait("the build Job", Duration::from_secs(60), || {
        !env.build_objects("Job", "team", "hello").is_empty()
    });
    let job = env.build_objects("Job", "team", "hello").remove(0);
    let tag = job_arg(&serde_json::from_value(job).unwrap(), "--image").unwrap();
    env.api.delete("Function", "team", "hello");
    env.wait("the build swept", Duration::from_secs(20), || {
        env.build_objects("Job", "team", "hello").is_empty()
    });
    // Another image under that tag (the same files as a Docker v2s2 manifest: another
    // digest), pushed before the Function comes back.
    env.registry
        .skopeo_copy_from_layout(&env.tiny.layout, "base", &tag, Some("v2s2"));
    let planted = manifest_digest(&env, &tag);
    assert_ne!(planted, env.tiny.digest);
    builds.release();
    env.create_function("team", &node_function("hello", HELLO, None));
    env.wait_condition("team", "hello", "Running", "True", Some("DeploymentReady"));
    let (status, reason, _) = env.condition("team", "hello", "BuildReady").unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "JobFinished"),
        "built, not found"
    );
    let image = deployed_image(&env, "team", "hello");
    assert!(image.ends_with(&env.tiny.digest), "{image}");
    assert!(!image.contains(&planted), "{image}");
    assert_eq!(
        env.function("team", "hello")["status"]["digest"],
        env.tiny.digest.as_str()
    );
    let record = env
        .api
        .get("ConfigMap", BUILDS, "team.hello")
        .expect("the record");
    let entries: Vec<&Value> = record["data"].as_object().unwrap().values().collect();
    assert_eq!(entries.len(), 1);
    assert!(entries[0].as_str().unwrap().starts_with(&env.tiny.digest));
}

#[test]
fn a_tenant_gets_only_the_pull_secret_and_cannot_push_with_it() {
    let env = ControllerEnv::start_with(RegistryKind::Token, &["--pull-secret", "kiln-pull"]);
    let pull = docker_config(&env.registry, Some((PULL_USER, PULL_PASSWORD)));
    env.api.insert(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": "kiln-pull", "namespace": SYSTEM},
        "data": {".dockerconfigjson": common::base64(&pull)},
    }));
    let _builds = FakeBuilds::start(env.api.client(), Duration::from_millis(100), {
        let outcome = Outcome::Push {
            layout: env.tiny.layout.clone(),
            tag: "base".into(),
            digest: env.tiny.digest.clone(),
            creds: Some(format!("{USER}:{PASSWORD}")),
        };
        move |_| outcome.clone()
    });
    let _rollouts = FakeRollouts::start(env.api.client());
    env.create_function("team", &node_function("hello", HELLO, None));
    env.wait_condition("team", "hello", "Running", "True", Some("DeploymentReady"));

    // The tenant's namespace: the pull Secret and the ServiceAccount carrying it; no push
    // Secret. The build ran in kiln-builds, with the push Secret's copy there.
    assert!(env.api.get("Secret", "team", "kiln-registry").is_none());
    assert!(env.api.get("Secret", BUILDS, "kiln-registry").is_some());
    let secret = env
        .api
        .get("Secret", "team", "kiln-pull")
        .expect("the pull Secret");
    assert_eq!(secret["type"], "kubernetes.io/dockerconfigjson");
    let sa = env
        .api
        .get("ServiceAccount", "team", "serverless-function")
        .expect("the Function ServiceAccount");
    assert_eq!(sa["imagePullSecrets"], json!([{"name": "kiln-pull"}]));
    let d = env.api.get("Deployment", "team", "hello").unwrap();
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "serverless-function");
    assert_eq!(pod["automountServiceAccountToken"], false);

    // What the tenant can do with the Secret it holds: pull its image, and no push.
    let dir = tempfile::tempdir().unwrap();
    let auth = dir.path().join("auth.json");
    let config = secret["data"][".dockerconfigjson"].as_str().unwrap();
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(config)
        .unwrap();
    std::fs::write(&auth, decoded).unwrap();
    let image = deployed_image(&env, "team", "hello");
    let skopeo = |args: &[&str]| {
        std::process::Command::new("skopeo")
            .args(args)
            .args(["--authfile", auth.to_str().unwrap()])
            .output()
            .unwrap()
    };
    let inspect = skopeo(&[
        "inspect",
        "--tls-verify=false",
        "--raw",
        &format!("docker://{image}"),
    ]);
    assert!(inspect.status.success(), "{inspect:?}");
    let target = format!(
        "docker://{}/functions/team/hello:planted",
        env.registry.host()
    );
    let layout = format!("oci:{}:base", env.tiny.layout.display());
    let push = skopeo(&["copy", "--dest-tls-verify=false", &layout, &target]);
    assert!(
        !push.status.success(),
        "a push with the pull Secret went through"
    );
    let stderr = String::from_utf8_lossy(&push.stderr);
    assert!(
        stderr.contains("denied") || stderr.contains("unauthorized"),
        "{stderr}"
    );

    // Nor may a Function read it: the controller refuses a spec that mounts it.
    let reader = format!(
        "{}  secretMounts:\n  - secretName: kiln-pull\n    mountPath: /secrets/pull\n",
        node_function("reader", HELLO, None)
    );
    env.create_function("team", &reader);
    env.wait_condition(
        "team",
        "reader",
        "ConfigurationReady",
        "False",
        Some("InvalidFunctionSpec"),
    );
    let f = env.api.get("Function", "team", "reader").unwrap();
    let message = f["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "ConfigurationReady")
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_string();
    assert!(
        message.contains("spec.secretMounts[0].secretName: \"kiln-pull\" is a Secret"),
        "{message}"
    );
    assert!(env.api.get("Deployment", "team", "reader").is_none());
}
