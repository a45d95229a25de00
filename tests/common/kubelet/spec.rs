//! What the test kubelet refuses: [`Unsupported`], and the checks on pod-spec values it
//! cannot honour (restart policy, securityContext, probes, field references, volume names),
//! after the field allowlist of `allowlist.rs`. Anything it refuses names the field, so a
//! renderer change can never pass unnoticed.

use k8s_openapi::api::core::v1::{Container, PodSpec};

pub use super::allowlist::{check_deployment_spec, check_job_spec, check_knative_spec};

/// A field (or value) the test kubelet does not implement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported {
    /// The JSON path of the field, e.g. `spec.template.spec.containers[0].workingDir`.
    pub field: String,
    /// Why, or what is supported instead.
    pub reason: String,
}

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the test kubelet does not implement {}: {}",
            self.field, self.reason
        )
    }
}

impl std::error::Error for Unsupported {}

pub(crate) fn unsupported(field: impl Into<String>, reason: impl Into<String>) -> Unsupported {
    Unsupported {
        field: field.into(),
        reason: reason.into(),
    }
}

/// The kind of workload a pod spec belongs to; it decides the restart policy and probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// A batch/v1 Job: restartPolicy Never, no probes.
    Job,
    /// A Deployment or Knative Service replica: restartPolicy Always.
    Replica,
}

/// The labels of the test kubelet's one node, as a kubelet sets them: this machine's
/// platform and the node's name.
pub fn node_labels() -> std::collections::BTreeMap<String, String> {
    let platform = kiln::oci::Platform::host();
    std::collections::BTreeMap::from([
        ("kubernetes.io/os".to_string(), platform.os),
        ("kubernetes.io/arch".to_string(), platform.architecture),
        (
            "kubernetes.io/hostname".to_string(),
            super::pod::NODE_NAME.to_string(),
        ),
    ])
}

/// Checks the values of a pod spec at `path` that the shape cannot: restart policy, what the
/// security context asks for, probes, field references, volume names.
pub fn check_pod_spec(spec: &PodSpec, workload: Workload, path: &str) -> Result<(), Unsupported> {
    let policy = spec.restart_policy.as_deref();
    match (workload, policy) {
        (Workload::Job, Some("Never")) | (Workload::Replica, None | Some("Always")) => {}
        _ => {
            let want = if workload == Workload::Job {
                "Never"
            } else {
                "Always"
            };
            return Err(unsupported(
                format!("{path}.restartPolicy"),
                format!("only {want}"),
            ));
        }
    }
    if spec.enable_service_links == Some(true) {
        let reason = "Service environment variables are never injected; set false or leave it out";
        return Err(unsupported(format!("{path}.enableServiceLinks"), reason));
    }
    if spec
        .scheduler_name
        .as_deref()
        .is_some_and(|s| s != "default-scheduler")
    {
        return Err(unsupported(
            format!("{path}.schedulerName"),
            "only default-scheduler",
        ));
    }
    if let Some(selector) = &spec.node_selector {
        let node = node_labels();
        if let Some((key, value)) = selector.iter().find(|(k, v)| node.get(*k) != Some(*v)) {
            // A scheduler would leave the pod Pending for good: the test kubelet, one node,
            // says so at once.
            return Err(unsupported(
                format!("{path}.nodeSelector"),
                format!(
                    "only its one node's labels ({node:?}); {key}={value} would leave the pod \
                     Pending"
                ),
            ));
        }
    }
    if let Some(ctx) = &spec.security_context {
        check_seccomp(
            ctx.seccomp_profile.as_ref(),
            &format!("{path}.securityContext"),
        )?;
    }
    let volumes: Vec<&str> = spec
        .volumes
        .iter()
        .flatten()
        .map(|v| v.name.as_str())
        .collect();
    if spec.containers.is_empty() {
        return Err(unsupported(
            format!("{path}.containers"),
            "at least one container",
        ));
    }
    if spec.containers.len() != 1 {
        return Err(unsupported(
            format!("{path}.containers"),
            "exactly one container",
        ));
    }
    if workload == Workload::Replica && spec.init_containers.as_ref().is_some_and(|i| !i.is_empty())
    {
        let reason = "init containers are run for Jobs only";
        return Err(unsupported(format!("{path}.initContainers"), reason));
    }
    let lists = [
        ("initContainers", &spec.init_containers),
        ("containers", &Some(spec.containers.clone())),
    ];
    for (list, containers) in lists {
        for (i, c) in containers.iter().flatten().enumerate() {
            let here = format!("{path}.{list}[{i}]");
            let probes_allowed = workload == Workload::Replica && list == "containers";
            check_container(c, &volumes, probes_allowed, &here)?;
            check_ids(spec, c, &here, path)?;
        }
    }
    Ok(())
}

fn check_seccomp(
    profile: Option<&k8s_openapi::api::core::v1::SeccompProfile>,
    path: &str,
) -> Result<(), Unsupported> {
    match profile.map(|p| p.type_.as_str()) {
        None | Some("RuntimeDefault" | "Unconfined") => Ok(()),
        Some(_) => Err(unsupported(
            format!("{path}.seccompProfile.type"),
            "only RuntimeDefault (accepted, not enforced) or Unconfined",
        )),
    }
}

/// The ids a container runs as, from its own securityContext or the pod's:
/// `(runAsUser, runAsGroup, runAsNonRoot)`.
pub fn effective_ids(pod: &PodSpec, c: &Container) -> (Option<i64>, Option<i64>, bool) {
    let p = pod.security_context.clone().unwrap_or_default();
    let s = c.security_context.clone().unwrap_or_default();
    (
        s.run_as_user.or(p.run_as_user),
        s.run_as_group.or(p.run_as_group),
        s.run_as_non_root.or(p.run_as_non_root).unwrap_or(false),
    )
}

fn check_ids(pod: &PodSpec, c: &Container, path: &str, pod_path: &str) -> Result<(), Unsupported> {
    // Name the securityContext the field is set in: the container's, else the pod's.
    let own = c.security_context.clone().unwrap_or_default();
    let here = |set_here: bool| {
        let at = if set_here { path } else { pod_path };
        format!("{at}.securityContext")
    };
    match effective_ids(pod, c) {
        (None, _, true) => Err(unsupported(
            format!("{}.runAsNonRoot", here(own.run_as_non_root.is_some())),
            "needs runAsUser: the test kubelet does not read the image's User to verify it",
        )),
        (None, Some(_), _) => Err(unsupported(
            format!("{}.runAsGroup", here(own.run_as_group.is_some())),
            "only together with runAsUser (kiln run --user UID:GID)",
        )),
        _ => Ok(()),
    }
}

/// The field paths `fieldRef` may name.
pub fn field_ref_supported(path: &str) -> bool {
    matches!(
        path,
        "metadata.name"
            | "metadata.namespace"
            | "metadata.uid"
            | "spec.nodeName"
            | "spec.serviceAccountName"
            | "status.podIP"
            | "status.hostIP"
    ) || (path.starts_with("metadata.labels['") || path.starts_with("metadata.annotations['"))
        && path.ends_with("']")
}

fn check_container(
    c: &Container,
    volumes: &[&str],
    probes_allowed: bool,
    path: &str,
) -> Result<(), Unsupported> {
    let sc = c.security_context.clone().unwrap_or_default();
    let ctx = format!("{path}.securityContext");
    if sc.read_only_root_filesystem != Some(true) {
        let reason = "must be true: kiln run's root filesystem is always read-only";
        return Err(unsupported(format!("{ctx}.readOnlyRootFilesystem"), reason));
    }
    if sc.privileged == Some(true) {
        return Err(unsupported(
            format!("{ctx}.privileged"),
            "kiln run never runs privileged",
        ));
    }
    if sc.allow_privilege_escalation == Some(true) {
        let reason = "kiln run always sets no_new_privs";
        return Err(unsupported(
            format!("{ctx}.allowPrivilegeEscalation"),
            reason,
        ));
    }
    let caps = sc.capabilities.unwrap_or_default();
    if caps.add.is_some_and(|a| !a.is_empty()) {
        let reason = "kiln run drops every capability";
        return Err(unsupported(format!("{ctx}.capabilities.add"), reason));
    }
    check_seccomp(sc.seccomp_profile.as_ref(), &ctx)?;
    for (i, var) in c.env.iter().flatten().enumerate() {
        let field = var.value_from.as_ref().and_then(|f| f.field_ref.as_ref());
        if let Some(r) = field.filter(|r| !field_ref_supported(&r.field_path)) {
            let here = format!("{path}.env[{i}].valueFrom.fieldRef.fieldPath");
            return Err(unsupported(
                here,
                format!("{:?} is not implemented", r.field_path),
            ));
        }
    }
    for (i, m) in c.volume_mounts.iter().flatten().enumerate() {
        if !volumes.contains(&m.name.as_str()) {
            let here = format!("{path}.volumeMounts[{i}].name");
            return Err(unsupported(
                here,
                format!("no volume {:?} in the pod", m.name),
            ));
        }
    }
    let probes = [
        ("startupProbe", &c.startup_probe),
        ("readinessProbe", &c.readiness_probe),
        ("livenessProbe", &c.liveness_probe),
    ];
    for (name, probe) in probes {
        let Some(probe) = probe else { continue };
        let here = format!("{path}.{name}");
        if !probes_allowed {
            return Err(unsupported(
                here,
                "probes are run for Deployment containers only",
            ));
        }
        let Some(get) = &probe.http_get else {
            return Err(unsupported(here, "only httpGet probes"));
        };
        if get
            .scheme
            .as_deref()
            .is_some_and(|s| s != "HTTP" && s != "HTTPS")
        {
            return Err(unsupported(
                format!("{here}.httpGet.scheme"),
                "only HTTP and HTTPS",
            ));
        }
        if super::replica::probe_port(c, &get.port).is_none() {
            let reason = "a port number or the name of one of the container's ports";
            return Err(unsupported(format!("{here}.httpGet.port"), reason));
        }
    }
    Ok(())
}
