//! Checks on the security profiles a pod or its containers select: AppArmor (fields and the
//! deprecated annotations), SELinux options, and seccomp (baseline and restricted).

use std::collections::BTreeSet;

use serde_json::Value;

use super::message::{Violation, containers_phrase, go_quote, join_quote, pluralize, sorted};
use super::pod::{Pod, field, text};

const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

pub(super) fn app_armor_profile(pod: &Pod<'_>) -> Option<Violation> {
    fn allowed_type(t: &str) -> bool {
        matches!(t, "RuntimeDefault" | "Localhost")
    }
    let mut setters: Vec<String> = Vec::new();
    let mut bad_values: BTreeSet<&str> = BTreeSet::new();
    if let Some(profile) = pod.pod_context("appArmorProfile") {
        let t = text(field(profile, "type"));
        if !allowed_type(t) {
            setters.push("pod".to_owned());
            bad_values.insert(t);
        }
    }
    let mut bad_containers = Vec::new();
    for c in &pod.containers {
        if let Some(profile) = c.context("appArmorProfile") {
            let t = text(field(profile, "type"));
            if !allowed_type(t) {
                bad_containers.push(c.name);
                bad_values.insert(t);
            }
        }
    }
    if !bad_containers.is_empty() {
        setters.push(containers_phrase(&bad_containers));
    }
    // The deprecated annotations are still honoured by the kubelet, so they are still checked.
    let mut forbidden_annotations: Vec<String> = field(pod.metadata, "annotations")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter(|(key, _)| key.starts_with(APPARMOR_ANNOTATION_PREFIX))
        .filter_map(|(key, value)| {
            let value = text(Some(value));
            let allowed =
                value.is_empty() || value == "runtime/default" || value.starts_with("localhost/");
            (!allowed).then(|| format!("{key}={}", go_quote(value)))
        })
        .collect();
    let mut bad_list: Vec<String> = bad_values.into_iter().map(str::to_owned).collect();
    if !forbidden_annotations.is_empty() {
        forbidden_annotations.sort();
        setters
            .push(pluralize("annotation", "annotations", forbidden_annotations.len()).to_owned());
        bad_list.extend(forbidden_annotations);
    }
    if setters.is_empty() {
        return None;
    }
    Violation::new(
        pluralize(
            "forbidden AppArmor profile",
            "forbidden AppArmor profiles",
            bad_list.len(),
        ),
        format!(
            "{} must not set AppArmor profile type to {}",
            setters.join(" and "),
            join_quote(&bad_list)
        ),
    )
}

/// SELinux types a baseline pod may use (the 1.31+ set).
const SELINUX_TYPES: &[&str] = &[
    "",
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

pub(super) fn se_linux_options(pod: &Pod<'_>) -> Option<Violation> {
    let mut bad_types = BTreeSet::new();
    let mut set_user = false;
    let mut set_role = false;
    // Every field is inspected (no short-circuit) so the detail lists all problems at once.
    let mut valid = |opts: &Value| -> bool {
        let mut ok = true;
        let t = text(field(opts, "type"));
        if !SELINUX_TYPES.contains(&t) {
            ok = false;
            bad_types.insert(t.to_owned());
        }
        if !text(field(opts, "user")).is_empty() {
            ok = false;
            set_user = true;
        }
        if !text(field(opts, "role")).is_empty() {
            ok = false;
            set_role = true;
        }
        ok
    };
    let mut setters = Vec::new();
    if let Some(opts) = pod.pod_context("seLinuxOptions")
        && !valid(opts)
    {
        setters.push("pod".to_owned());
    }
    let mut bad_containers = Vec::new();
    for c in &pod.containers {
        if let Some(opts) = c.context("seLinuxOptions")
            && !valid(opts)
        {
            bad_containers.push(c.name);
        }
    }
    if !bad_containers.is_empty() {
        setters.push(containers_phrase(&bad_containers));
    }
    if setters.is_empty() {
        return None;
    }
    let mut bad_data = Vec::new();
    if !bad_types.is_empty() {
        let types: Vec<String> = bad_types.into_iter().collect();
        bad_data.push(format!(
            "{} {}",
            pluralize("type", "types", types.len()),
            join_quote(&types)
        ));
    }
    if set_user {
        bad_data.push("user may not be set".to_owned());
    }
    if set_role {
        bad_data.push("role may not be set".to_owned());
    }
    Violation::new(
        "seLinuxOptions",
        format!(
            "{} set forbidden securityContext.seLinuxOptions: {}",
            setters.join(" and "),
            bad_data.join("; ")
        ),
    )
}

fn valid_seccomp(profile: &Value) -> bool {
    matches!(text(field(profile, "type")), "RuntimeDefault" | "Localhost")
}

/// Explicitly bad seccomp types, shared by both seccomp checks: the setters ("pod",
/// `containers "a"`), the bad values, and whether the pod level set a valid profile.
struct SeccompFindings<'a> {
    setters: Vec<String>,
    values: BTreeSet<&'a str>,
    pod_valid: bool,
    /// Containers without a profile of their own.
    unset: Vec<&'a str>,
}

fn seccomp_findings<'a>(pod: &Pod<'a>) -> SeccompFindings<'a> {
    let mut findings = SeccompFindings {
        setters: Vec::new(),
        values: BTreeSet::new(),
        pod_valid: false,
        unset: Vec::new(),
    };
    if let Some(profile) = pod.pod_context("seccompProfile") {
        if valid_seccomp(profile) {
            findings.pod_valid = true;
        } else {
            findings.setters.push("pod".to_owned());
            findings.values.insert(text(field(profile, "type")));
        }
    }
    let mut bad_containers = Vec::new();
    for c in &pod.containers {
        match c.context("seccompProfile") {
            Some(profile) if !valid_seccomp(profile) => {
                bad_containers.push(c.name);
                findings.values.insert(text(field(profile, "type")));
            }
            Some(_) => {}
            None => findings.unset.push(c.name),
        }
    }
    if !bad_containers.is_empty() {
        findings.setters.push(containers_phrase(&bad_containers));
    }
    findings
}

fn seccomp_explicit_violation(findings: SeccompFindings<'_>) -> Option<Violation> {
    Violation::new(
        "seccompProfile",
        format!(
            "{} must not set securityContext.seccompProfile.type to {}",
            findings.setters.join(" and "),
            join_quote(&sorted(findings.values))
        ),
    )
}

/// Baseline: a seccomp profile may be unset, but not Unconfined (field-based check, 1.19+).
pub(super) fn seccomp_profile_baseline(pod: &Pod<'_>) -> Option<Violation> {
    let findings = seccomp_findings(pod);
    if findings.setters.is_empty() {
        return None;
    }
    seccomp_explicit_violation(findings)
}

/// Restricted: a valid profile at pod level, or on every container without one at pod level.
pub(super) fn seccomp_profile_restricted(pod: &Pod<'_>) -> Option<Violation> {
    // Seccomp does not exist on Windows; pod validation refuses the field there.
    if pod.is_windows() {
        return None;
    }
    let findings = seccomp_findings(pod);
    if !findings.setters.is_empty() {
        return seccomp_explicit_violation(findings);
    }
    if findings.pod_valid || findings.unset.is_empty() {
        return None;
    }
    Violation::new(
        "seccompProfile",
        format!(
            "pod or {} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \
             \"Localhost\"",
            containers_phrase(&findings.unset)
        ),
    )
}
