//! What the renderers must produce, field by field where it matters (security contexts, the
//! split of credentials between the build's containers, the runtime contract's env).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec};

use super::*;
use crate::controller::config::{Config, RuntimeImages};
use crate::controller::crd::{
    Function, FunctionSpec, GitRepositorySource, InlineSource, RepositoryAuth, ScaleConfig,
    SecretMount, Source,
};
use crate::controller::plan::{self, Lookups, Plan};
use crate::oci::Digest;
use crate::runtime::Catalog;

fn digest(c: char) -> Digest {
    format!("sha256:{}", c.to_string().repeat(64))
        .parse()
        .unwrap()
}

fn function() -> Function {
    let mut f = Function::new(
        "hello",
        FunctionSpec {
            runtime: "nodejs22".into(),
            source: Source {
                inline: Some(InlineSource {
                    source: "module.exports = { main: () => 'hi' }".into(),
                    dependencies: None,
                }),
                git_repository: None,
            },
            env: vec![
                EnvVar {
                    name: "GREETING".into(),
                    value: Some("hi".into()),
                    value_from: None,
                },
                EnvVar {
                    name: "FUNC_TIMEOUT".into(),
                    value: Some("5".into()),
                    value_from: None,
                },
            ],
            replicas: Some(2),
            secret_mounts: vec![SecretMount {
                secret_name: "creds".into(),
                mount_path: "/creds".into(),
            }],
            labels: BTreeMap::from([("team".to_string(), "a".to_string())]),
            ..FunctionSpec::default()
        },
    );
    f.metadata.namespace = Some("team".into());
    f.metadata.uid = Some("uid-1".into());
    f
}

fn config() -> Config {
    let runtimes = BTreeMap::from([(
        "nodejs22".to_string(),
        RuntimeImages {
            base: "reg/kiln/nodejs22:1".into(),
            builder: "reg/kiln/nodejs22-builder:1".into(),
        },
    )]);
    let mut c = Config::new("reg:5000/functions".into(), runtimes);
    c.insecure_registry = true;
    c
}

fn plan_of(f: &Function, config: &Config) -> Plan {
    let catalog = Catalog::embedded();
    let runtime = catalog.get("nodejs22").unwrap();
    let lookups = Lookups {
        base: ("reg/kiln/nodejs22".into(), digest('b')),
        builder: ("reg/kiln/nodejs22-builder".into(), digest('c')),
        commit: None,
        git_note: None,
        registry_config: None,
        platforms: vec![crate::oci::Platform::linux_amd64()],
    };
    plan::plan(f, runtime, config, &lookups)
}

fn args(c: &Container) -> String {
    c.args.clone().unwrap_or_default().join(" ")
}

fn mounts(c: &Container) -> Vec<String> {
    c.volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.clone())
        .collect()
}

fn assert_restricted(c: &Container) {
    let s = c.security_context.as_ref().unwrap();
    assert_eq!(s.privileged, Some(false), "{}", c.name);
    assert_eq!(s.allow_privilege_escalation, Some(false), "{}", c.name);
    assert_eq!(s.read_only_root_filesystem, Some(true), "{}", c.name);
    assert_eq!(s.run_as_non_root, Some(true), "{}", c.name);
    assert_eq!(
        s.capabilities.as_ref().unwrap().drop,
        Some(vec!["ALL".to_string()])
    );
    assert_eq!(s.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
}

mod build_job;

#[test]
fn the_deployment_runs_the_digest_as_user_10001_with_the_runtime_env_last() {
    let (f, config) = (function(), config());
    let plan = plan_of(&f, &config);
    let d = deployment::deployment(&f, &plan, &config, &digest('d').to_string());
    let spec = d.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(2));
    assert_eq!(spec.revision_history_limit, Some(0));
    let selector = spec.selector.match_labels.as_ref().unwrap();
    assert_eq!(
        selector["serverless.kyma-project.io/resource"],
        "deployment"
    );
    let template = spec.template.metadata.as_ref().unwrap();
    let labels = template.labels.as_ref().unwrap();
    assert_eq!(
        (
            labels["team"].as_str(),
            labels["app.kubernetes.io/name"].as_str()
        ),
        ("a", "hello")
    );
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(
        pod.security_context.as_ref().unwrap().run_as_user,
        Some(10001)
    );
    let c = &pod.containers[0];
    assert_restricted(c);
    assert_eq!(
        c.image.as_deref(),
        Some(format!("reg:5000/functions/team/hello@{}", digest('d')).as_str())
    );
    let env: Vec<(String, String)> = c
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect();
    let names: Vec<&str> = env.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "REQ_MB_LIMIT",
            "GREETING",
            "FUNC_TIMEOUT",
            "FUNC_NAME",
            "SERVICE_NAMESPACE",
            "FUNC_RUNTIME",
            "FUNC_HANDLER",
            "MOD_NAME",
            "FUNC_PORT"
        ]
    );
    assert!(
        env.contains(&("FUNC_TIMEOUT".into(), "5".into())),
        "the Function's own value wins"
    );
    assert!(env.contains(&("SERVICE_NAMESPACE".into(), "team".into())));
    assert_eq!(
        c.startup_probe.as_ref().unwrap().failure_threshold,
        Some(30)
    );
    assert_eq!(c.readiness_probe.as_ref().unwrap().timeout_seconds, Some(2));
    assert!(mounts(c).contains(&"/tmp".to_string()) && mounts(c).contains(&"/creds".to_string()));
}

#[test]
fn service_and_hpa_follow_kyma() {
    let (mut f, config) = (function(), config());
    let s = service::service(&f);
    let port = &s.spec.as_ref().unwrap().ports.as_ref().unwrap()[0];
    assert_eq!((port.name.as_deref(), port.port), (Some("http"), 80));
    assert!(hpa::hpa(&f, &config).is_none(), "no scaleConfig, no HPA");
    f.spec.scale_config = Some(ScaleConfig {
        min_replicas: 2,
        max_replicas: 2,
    });
    assert!(hpa::hpa(&f, &config).is_none(), "min = max, no HPA");
    assert_eq!(
        deployment::replicas(&f),
        2,
        "replicas held within scaleConfig"
    );
    f.spec.scale_config = Some(ScaleConfig {
        min_replicas: 1,
        max_replicas: 4,
    });
    let h = hpa::hpa(&f, &config).unwrap();
    let target = &h.spec.as_ref().unwrap().scale_target_ref;
    assert_eq!(
        (target.kind.as_str(), target.name.as_str()),
        ("Function", "hello")
    );
    assert_eq!(h.spec.as_ref().unwrap().max_replicas, 4);
}

#[test]
fn the_knative_service_is_cluster_local_with_the_scale_bounds() {
    let (mut f, config) = (function(), config());
    f.spec.scale_config = Some(ScaleConfig {
        min_replicas: 1,
        max_replicas: 3,
    });
    let plan = plan_of(&f, &config);
    let k = knative::service(&f, &plan, &config, &digest('d').to_string());
    assert_eq!(
        k["metadata"]["labels"]["networking.knative.dev/visibility"],
        "cluster-local"
    );
    let annotations = &k["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(
        (
            annotations["autoscaling.knative.dev/min-scale"].as_str(),
            annotations["autoscaling.knative.dev/max-scale"].as_str()
        ),
        (Some("1"), Some("3"))
    );
    let c = &k["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["securityContext"]["runAsUser"], 10001);
    assert!(
        c["image"]
            .as_str()
            .unwrap()
            .ends_with(&digest('d').to_string())
    );
}

#[test]
fn the_applied_hash_changes_with_the_content_only() {
    let (mut f, config) = (function(), config());
    let plan = plan_of(&f, &config);
    let hash = |f: &Function| {
        applied_hash(&deployment::deployment(f, &plan, &config, &digest('d').to_string()).metadata)
            .unwrap()
            .to_string()
    };
    let before = hash(&f);
    assert_eq!(before, hash(&f));
    f.spec.env[0].value = Some("hello".into());
    assert_ne!(before, hash(&f));
}

#[test]
fn function_pods_get_no_token_unless_asked_and_the_pull_service_account_with_a_pull_secret() {
    let (mut f, mut config) = (function(), config());
    let plan = plan_of(&f, &config);
    let pod = |f: &Function, config: &Config| {
        deployment::deployment(f, &plan, config, &digest('d').to_string())
            .spec
            .unwrap()
            .template
            .spec
            .unwrap()
    };
    let p = pod(&f, &config);
    assert_eq!(p.automount_service_account_token, Some(false));
    assert_eq!(p.service_account_name, None);
    config.pull_secret = Some("kiln-pull".into());
    assert_eq!(
        pod(&f, &config).service_account_name.as_deref(),
        Some("serverless-function")
    );
    f.metadata.annotations = Some(BTreeMap::from([(
        crate::controller::names::AUTOMOUNT_TOKEN.to_string(),
        "true".to_string(),
    )]));
    assert_eq!(pod(&f, &config).automount_service_account_token, Some(true));
}

#[test]
fn the_functions_security_contexts_override_kilns_field_by_field() {
    use k8s_openapi::api::core::v1::{PodSecurityContext, SecurityContext};
    let mut f = function();
    let ps = deployment::pod_security_context(&f);
    assert_eq!(
        (ps.run_as_user, ps.run_as_group),
        (Some(10001), Some(10001))
    );
    f.spec.pod_security_context = Some(PodSecurityContext {
        run_as_user: Some(2000),
        fs_group: Some(3000),
        ..PodSecurityContext::default()
    });
    f.spec.container_security_context = Some(SecurityContext {
        read_only_root_filesystem: Some(false),
        ..SecurityContext::default()
    });
    let ps = deployment::pod_security_context(&f);
    assert_eq!(
        (
            ps.run_as_user,
            ps.run_as_group,
            ps.fs_group,
            ps.run_as_non_root
        ),
        (Some(2000), Some(10001), Some(3000), Some(true))
    );
    assert_eq!(ps.seccomp_profile.unwrap().type_, "RuntimeDefault");
    let cs = deployment::container_security_context(&f);
    assert_eq!(cs.read_only_root_filesystem, Some(false));
    assert_eq!(
        cs.run_as_user,
        Some(2000),
        "the Pod's user, not kiln's default"
    );
    assert_eq!(cs.allow_privilege_escalation, Some(false));
    assert_eq!(cs.privileged, Some(false));
    assert_eq!(cs.capabilities.unwrap().drop, Some(vec!["ALL".to_string()]));
}
