//! Checks on the process privileges set in container security contexts: capabilities,
//! privilege escalation, `/proc` masking and running as root.

use std::collections::BTreeSet;

use serde_json::Value;

use super::message::{Violation, containers_phrase, join_quote, sorted};
use super::pod::{Pod, field, is_zero, items, text};

/// Capabilities a baseline container may add: the container runtime's default set.
const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

pub(super) fn capabilities_baseline(pod: &Pod<'_>) -> Option<Violation> {
    let mut bad_containers = Vec::new();
    let mut forbidden = BTreeSet::new();
    for c in &pod.containers {
        let Some(capabilities) = c.context("capabilities") else {
            continue;
        };
        let mut valid = true;
        for cap in items(field(capabilities, "add")) {
            let cap = text(Some(cap));
            if !BASELINE_CAPABILITIES.contains(&cap) {
                valid = false;
                forbidden.insert(cap);
            }
        }
        if !valid {
            bad_containers.push(c.name);
        }
    }
    if bad_containers.is_empty() {
        return None;
    }
    Violation::new(
        "non-default capabilities",
        format!(
            "{} must not include {} in securityContext.capabilities.add",
            containers_phrase(&bad_containers),
            join_quote(&sorted(forbidden))
        ),
    )
}

pub(super) fn capabilities_restricted(pod: &Pod<'_>) -> Option<Violation> {
    // Capabilities are a Linux notion; pod validation refuses them on Windows pods.
    if pod.is_windows() {
        return None;
    }
    let mut missing_drop_all = Vec::new();
    let mut adding_forbidden = Vec::new();
    let mut forbidden = BTreeSet::new();
    for c in &pod.containers {
        let Some(capabilities) = c.context("capabilities") else {
            missing_drop_all.push(c.name);
            continue;
        };
        if !items(field(capabilities, "drop"))
            .iter()
            .any(|d| d.as_str() == Some("ALL"))
        {
            missing_drop_all.push(c.name);
        }
        let mut added_forbidden = false;
        for cap in items(field(capabilities, "add")) {
            let cap = text(Some(cap));
            if cap != "NET_BIND_SERVICE" {
                added_forbidden = true;
                forbidden.insert(cap);
            }
        }
        if added_forbidden {
            adding_forbidden.push(c.name);
        }
    }
    let mut details = Vec::new();
    if !missing_drop_all.is_empty() {
        details.push(format!(
            "{} must set securityContext.capabilities.drop=[\"ALL\"]",
            containers_phrase(&missing_drop_all)
        ));
    }
    if !adding_forbidden.is_empty() {
        details.push(format!(
            "{} must not include {} in securityContext.capabilities.add",
            containers_phrase(&adding_forbidden),
            join_quote(&sorted(forbidden))
        ));
    }
    if details.is_empty() {
        return None;
    }
    Violation::new("unrestricted capabilities", details.join("; "))
}

pub(super) fn allow_privilege_escalation(pod: &Pod<'_>) -> Option<Violation> {
    // Pod validation refuses the field on Windows pods, so it cannot be required there.
    if pod.is_windows() {
        return None;
    }
    // Unset counts as true: the runtime's default allows escalation.
    let bad: Vec<&str> = pod
        .containers
        .iter()
        .filter(|c| {
            !matches!(
                c.context("allowPrivilegeEscalation"),
                Some(Value::Bool(false))
            )
        })
        .map(|c| c.name)
        .collect();
    if bad.is_empty() {
        return None;
    }
    Violation::new(
        "allowPrivilegeEscalation != false",
        format!(
            "{} must set securityContext.allowPrivilegeEscalation=false",
            containers_phrase(&bad)
        ),
    )
}

/// Any procMount but `Default` unmasks /proc.
fn proc_mount(pod: &Pod<'_>) -> Option<Violation> {
    let mut bad_containers = Vec::new();
    let mut types = BTreeSet::new();
    for c in &pod.containers {
        let Some(value) = c.context("procMount") else {
            continue;
        };
        let value = text(Some(value));
        if value != "Default" {
            bad_containers.push(c.name);
            types.insert(value);
        }
    }
    if bad_containers.is_empty() {
        return None;
    }
    Violation::new(
        "procMount",
        format!(
            "{} must not set securityContext.procMount to {}",
            containers_phrase(&bad_containers),
            join_quote(&sorted(types))
        ),
    )
}

/// Baseline tolerates an unmasked /proc inside a user namespace (1.35+).
pub(super) fn proc_mount_baseline(pod: &Pod<'_>) -> Option<Violation> {
    if pod.in_user_namespace() {
        return None;
    }
    proc_mount(pod)
}

/// Restricted keeps refusing an unmasked /proc even in a user namespace.
pub(super) fn proc_mount_restricted(pod: &Pod<'_>) -> Option<Violation> {
    proc_mount(pod)
}

pub(super) fn run_as_non_root(pod: &Pod<'_>) -> Option<Violation> {
    // In a user namespace, root in the container is not root on the host (1.35+).
    if pod.in_user_namespace() {
        return None;
    }
    let mut setters = Vec::new();
    let mut pod_non_root = false;
    if let Some(Value::Bool(value)) = pod.pod_context("runAsNonRoot") {
        if *value {
            pod_non_root = true;
        } else {
            setters.push("pod".to_owned());
        }
    }
    let mut explicitly_bad = Vec::new();
    let mut implicitly_bad = Vec::new();
    for c in &pod.containers {
        match c.context("runAsNonRoot") {
            Some(Value::Bool(false)) => explicitly_bad.push(c.name),
            Some(Value::Bool(true)) => {}
            // Unset (or not a bool) inherits the pod level.
            _ if pod_non_root => {}
            _ => implicitly_bad.push(c.name),
        }
    }
    if !explicitly_bad.is_empty() {
        setters.push(containers_phrase(&explicitly_bad));
    }
    // An explicit false is reported on its own: asking to set true would not be the whole fix.
    if !setters.is_empty() {
        return Violation::new(
            "runAsNonRoot != true",
            format!(
                "{} must not set securityContext.runAsNonRoot=false",
                setters.join(" and ")
            ),
        );
    }
    if implicitly_bad.is_empty() {
        return None;
    }
    Violation::new(
        "runAsNonRoot != true",
        format!(
            "pod or {} must set securityContext.runAsNonRoot=true",
            containers_phrase(&implicitly_bad)
        ),
    )
}

pub(super) fn run_as_user(pod: &Pod<'_>) -> Option<Violation> {
    if pod.in_user_namespace() {
        return None;
    }
    let mut setters = Vec::new();
    if is_zero(pod.pod_context("runAsUser")) {
        setters.push("pod".to_owned());
    }
    let bad: Vec<&str> = pod
        .containers
        .iter()
        .filter(|c| is_zero(c.context("runAsUser")))
        .map(|c| c.name)
        .collect();
    if !bad.is_empty() {
        setters.push(containers_phrase(&bad));
    }
    if setters.is_empty() {
        return None;
    }
    Violation::new(
        "runAsUser=0",
        format!("{} must not set runAsUser=0", setters.join(" and ")),
    )
}
