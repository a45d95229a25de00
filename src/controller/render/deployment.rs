//! The Function's Deployment (Kyma's shape, serverless@legacy `buildDeployment`): the image
//! by digest, the runtime env, `/healthz` probes, Pods as user 10001 with a read-only root
//! filesystem and a /tmp emptyDir (or the security contexts the Function sets), no
//! ServiceAccount token unless the Function asks for one, the secret mounts, and resources
//! from the Function profile. Also the runtime container itself, which the Knative renderer reuses.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, EnvVar, HTTPGetAction, PodSecurityContext,
    PodSpec, PodTemplateSpec, Probe, SecretVolumeSource, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{child_meta, restricted_container, runtime_default_seccomp, stamp};
use crate::controller::config::Config;
use crate::controller::crd::{CONTRACT_ENV, Function};
use crate::controller::names;
use crate::controller::plan::Plan;

/// The user and group Function Pods run as (Kyma's).
pub const FUNCTION_UID: i64 = 10001;
/// The port every runtime serves on.
pub const FUNCTION_PORT: i32 = 8080;
/// The runtime container's name.
pub const FUNCTION_CONTAINER: &str = "function";

/// The Deployment running `digest` of `plan`'s image.
pub fn deployment(f: &Function, plan: &Plan, config: &Config, digest: &str) -> Deployment {
    let selector = names::selector_labels(f);
    let mut template_labels = selector.clone();
    template_labels.extend(f.spec.labels.clone());
    template_labels.extend(selector.clone());
    template_labels.insert(names::APP_NAME.into(), f.name_or_empty().into());
    let mut annotations = BTreeMap::from([(
        "proxy.istio.io/config".to_string(),
        r#"{ "holdApplicationUntilProxyStarts": true }"#.to_string(),
    )]);
    annotations.extend(f.spec.annotations.clone());
    let mut d = Deployment {
        metadata: child_meta(f, f.name_or_empty(), names::object_labels(f)),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas(f)),
            revision_history_limit: Some(0),
            selector: LabelSelector {
                match_labels: Some(selector),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(template_labels),
                    annotations: Some(annotations),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    // Knative's webhook refuses a nodeSelector unless a feature flag allows
                    // one: only the Deployment's Pods have it.
                    node_selector: super::node_selector(plan),
                    ..pod_spec(f, plan, config, digest)
                }),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    };
    stamp(&mut d, |d| &mut d.metadata);
    d
}

/// The replicas to run: `spec.replicas` (default 1), kept within `scaleConfig`'s bounds (an
/// HPA moves it between them; with min = max there is no HPA, and the bound is the count).
pub fn replicas(f: &Function) -> i32 {
    let wanted = f.spec.replicas.unwrap_or(1);
    match &f.spec.scale_config {
        Some(s) => wanted.clamp(s.min_replicas, s.max_replicas.max(s.min_replicas)),
        None => wanted,
    }
}

/// The runtime Pod: the function container, /tmp, the secret mounts, user 10001.
pub fn pod_spec(f: &Function, plan: &Plan, config: &Config, digest: &str) -> PodSpec {
    let mut volumes = vec![Volume {
        name: "tmp".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity("100Mi".into())),
            medium: None,
        }),
        ..Volume::default()
    }];
    for (i, m) in f.spec.secret_mounts.iter().enumerate() {
        volumes.push(Volume {
            name: format!("secret-mount-{i}"),
            secret: Some(SecretVolumeSource {
                secret_name: Some(m.secret_name.clone()),
                // Kyma's mode: readable whatever uid the Function runs as.
                default_mode: Some(0o666),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        });
    }
    PodSpec {
        containers: vec![container(f, plan, config, digest)],
        volumes: Some(volumes),
        service_account_name: config.function_service_account().map(str::to_string),
        automount_service_account_token: Some(wants_token(f)),
        security_context: Some(pod_security_context(f)),
        ..PodSpec::default()
    }
}

/// Whether the Function asked for a ServiceAccount token ([`names::AUTOMOUNT_TOKEN`]).
pub fn wants_token(f: &Function) -> bool {
    f.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(names::AUTOMOUNT_TOKEN))
        .is_some_and(|v| v == "true")
}

/// The Pod's security context: `spec.podSecurityContext` with what it leaves out taken from
/// kiln's (user and group 10001, non-root, RuntimeDefault seccomp), as Kyma fills its own.
pub fn pod_security_context(f: &Function) -> PodSecurityContext {
    let mut p = f.spec.pod_security_context.clone().unwrap_or_default();
    p.run_as_user.get_or_insert(FUNCTION_UID);
    p.run_as_group.get_or_insert(FUNCTION_UID);
    p.run_as_non_root.get_or_insert(true);
    p.seccomp_profile
        .get_or_insert_with(runtime_default_seccomp);
    p
}

/// The container's security context: `spec.containerSecurityContext` with what it leaves
/// out taken from kiln's restricted one. The user and group default to the Pod's, so that
/// a Knative Service, which carries only the container's, runs as the same user.
pub fn container_security_context(f: &Function) -> SecurityContext {
    let base = restricted_container();
    let pod = pod_security_context(f);
    let mut c = f
        .spec
        .container_security_context
        .clone()
        .unwrap_or_default();
    c.privileged = c.privileged.or(base.privileged);
    c.allow_privilege_escalation = c
        .allow_privilege_escalation
        .or(base.allow_privilege_escalation);
    c.read_only_root_filesystem = c
        .read_only_root_filesystem
        .or(base.read_only_root_filesystem);
    c.run_as_non_root = c.run_as_non_root.or(base.run_as_non_root);
    if c.capabilities.is_none() {
        c.capabilities = base.capabilities;
    }
    if c.seccomp_profile.is_none() {
        c.seccomp_profile = pod.seccomp_profile;
    }
    c.run_as_user = c.run_as_user.or(pod.run_as_user);
    c.run_as_group = c.run_as_group.or(pod.run_as_group);
    c
}

/// The function container.
pub fn container(f: &Function, plan: &Plan, config: &Config, digest: &str) -> Container {
    let mut mounts = vec![VolumeMount {
        name: "tmp".into(),
        mount_path: "/tmp".into(),
        ..VolumeMount::default()
    }];
    for (i, m) in f.spec.secret_mounts.iter().enumerate() {
        mounts.push(VolumeMount {
            name: format!("secret-mount-{i}"),
            mount_path: m.mount_path.clone(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
    }
    Container {
        name: FUNCTION_CONTAINER.into(),
        image: Some(format!("{}@{digest}", plan.pull_repository)),
        image_pull_policy: Some("IfNotPresent".into()),
        env: Some(env(f, plan, config)),
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: FUNCTION_PORT,
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        }]),
        resources: Some(plan.function_resources.resources.clone()),
        startup_probe: Some(probe(5, None, 30)),
        readiness_probe: Some(probe(5, Some(2), 1)),
        liveness_probe: Some(probe(5, Some(4), 3)),
        security_context: Some(container_security_context(f)),
        volume_mounts: Some(mounts),
        ..Container::default()
    }
}

fn probe(period: i32, timeout: Option<i32>, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some("/healthz".into()),
            port: IntOrString::Int(FUNCTION_PORT),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: timeout,
        failure_threshold: Some(failures),
        ..Probe::default()
    }
}

/// The container env: the runtime's tunable defaults the Function does not set itself, then
/// the Function's env, then what the runtime contract fixes (FUNC_NAME, SERVICE_NAMESPACE,
/// FUNC_RUNTIME, FUNC_HANDLER, MOD_NAME, FUNC_PORT), which no spec may override.
pub fn env(f: &Function, plan: &Plan, config: &Config) -> Vec<EnvVar> {
    let var = |name: &str, value: &str| EnvVar {
        name: name.into(),
        value: Some(value.into()),
        value_from: None,
    };
    let set_by_user = |name: &str| f.spec.env.iter().any(|e| e.name == name);
    let image_env = &plan.runtime.image.env;
    let mut env = Vec::new();
    for name in ["FUNC_TIMEOUT", "REQ_MB_LIMIT", "FUNC_BODY_MB_LIMIT"] {
        if let Some(value) = image_env.get(name).filter(|_| !set_by_user(name)) {
            env.push(var(name, value));
        }
    }
    let optional = [
        ("TRACE_COLLECTOR_ENDPOINT", &config.trace_collector_endpoint),
        ("PUBLISHER_PROXY_ADDRESS", &config.publisher_proxy_address),
    ];
    for (name, value) in optional {
        if let Some(value) = value.as_deref().filter(|_| !set_by_user(name)) {
            env.push(var(name, value));
        }
    }
    env.extend(
        f.spec
            .env
            .iter()
            .filter(|e| !CONTRACT_ENV.contains(&e.name.as_str()))
            .cloned(),
    );
    env.push(var("FUNC_NAME", f.name_or_empty()));
    env.push(var("SERVICE_NAMESPACE", f.namespace_or_default()));
    env.push(var("FUNC_RUNTIME", &plan.runtime.name));
    env.push(var("FUNC_HANDLER", "main"));
    env.push(var("MOD_NAME", "handler"));
    env.push(var("FUNC_PORT", &FUNCTION_PORT.to_string()));
    env
}
