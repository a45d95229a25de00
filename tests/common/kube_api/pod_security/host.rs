//! Checks on what a pod shares with its node: host namespaces, host ports, probe and lifecycle
//! hosts, privileged containers, unsafe sysctls and Windows host processes.

use std::collections::BTreeSet;

use serde_json::Value;

use super::message::{Violation, containers_phrase, join_quote, pluralize, sorted};
use super::pod::{Pod, field, is_true, items, path, text};

pub(super) fn host_namespaces(pod: &Pod<'_>) -> Option<Violation> {
    let used: Vec<&str> = [
        ("hostNetwork", "hostNetwork=true"),
        ("hostPID", "hostPID=true"),
        ("hostIPC", "hostIPC=true"),
    ]
    .into_iter()
    .filter(|(key, _)| is_true(field(pod.spec, key)))
    .map(|(_, rendered)| rendered)
    .collect();
    if used.is_empty() {
        return None;
    }
    Violation::new("host namespaces", used.join(", "))
}

pub(super) fn host_ports(pod: &Pod<'_>) -> Option<Violation> {
    let mut bad_containers = Vec::new();
    // Upstream keeps the ports as strings in a sorted set, so "443" sorts before "80".
    let mut ports: BTreeSet<String> = BTreeSet::new();
    for c in &pod.containers {
        let mut valid = true;
        for port in items(field(c.value, "ports")) {
            let host_port = field(port, "hostPort").and_then(Value::as_i64).unwrap_or(0);
            if host_port != 0 {
                valid = false;
                ports.insert(host_port.to_string());
            }
        }
        if !valid {
            bad_containers.push(c.name);
        }
    }
    if bad_containers.is_empty() {
        return None;
    }
    let ports: Vec<String> = ports.into_iter().collect();
    Violation::new(
        "hostPort",
        format!(
            "{} {} {} {}",
            containers_phrase(&bad_containers),
            pluralize("uses", "use", bad_containers.len()),
            pluralize("hostPort", "hostPorts", ports.len()),
            ports.join(", ")
        ),
    )
}

pub(super) fn host_probes_and_host_lifecycle(pod: &Pod<'_>) -> Option<Violation> {
    fn hosts<'a>(handler: Option<&'a Value>, out: &mut Vec<&'a str>) {
        let Some(handler) = handler else { return };
        for kind in ["httpGet", "tcpSocket"] {
            let host = text(path(handler, &[kind, "host"]));
            if !host.is_empty() {
                out.push(host);
            }
        }
    }
    // Unlike the other checks, both lists are sets: sorted and deduplicated.
    let mut bad_containers = BTreeSet::new();
    let mut forbidden = BTreeSet::new();
    for c in &pod.containers {
        let mut found = Vec::new();
        for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
            hosts(field(c.value, probe), &mut found);
        }
        if let Some(lifecycle) = field(c.value, "lifecycle") {
            hosts(field(lifecycle, "postStart"), &mut found);
            hosts(field(lifecycle, "preStop"), &mut found);
        }
        if !found.is_empty() {
            bad_containers.insert(c.name);
            forbidden.extend(found);
        }
    }
    if bad_containers.is_empty() {
        return None;
    }
    let count = bad_containers.len();
    let hosts = sorted(forbidden);
    Violation::new(
        "probe or lifecycle host",
        format!(
            "{} {} {} {}",
            containers_phrase(&sorted(bad_containers)),
            pluralize("uses", "use", count),
            pluralize(
                "probe or lifecycle host",
                "probe or lifecycle hosts",
                hosts.len()
            ),
            join_quote(&hosts)
        ),
    )
}

pub(super) fn privileged(pod: &Pod<'_>) -> Option<Violation> {
    let bad: Vec<&str> = pod
        .containers
        .iter()
        .filter(|c| is_true(c.context("privileged")))
        .map(|c| c.name)
        .collect();
    if bad.is_empty() {
        return None;
    }
    Violation::new(
        "privileged",
        format!(
            "{} must not set securityContext.privileged=true",
            containers_phrase(&bad)
        ),
    )
}

/// Only the pod-level `spec.securityContext.sysctls` exist; the allowed set is 1.32's.
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

pub(super) fn sysctls(pod: &Pod<'_>) -> Option<Violation> {
    // Spec order, not deduplicated, not quoted: exactly as upstream.
    let forbidden: Vec<&str> = items(pod.pod_context("sysctls"))
        .iter()
        .map(|s| text(field(s, "name")))
        .filter(|name| !SAFE_SYSCTLS.contains(name))
        .collect();
    if forbidden.is_empty() {
        return None;
    }
    Violation::new("forbidden sysctls", forbidden.join(", "))
}

pub(super) fn windows_host_process(pod: &Pod<'_>) -> Option<Violation> {
    let bad: Vec<&str> = pod
        .containers
        .iter()
        .filter(|c| {
            is_true(
                c.context("windowsOptions")
                    .and_then(|w| field(w, "hostProcess")),
            )
        })
        .map(|c| c.name)
        .collect();
    let mut setters = Vec::new();
    if is_true(
        pod.pod_context("windowsOptions")
            .and_then(|w| field(w, "hostProcess")),
    ) {
        setters.push("pod".to_owned());
    }
    if !bad.is_empty() {
        setters.push(containers_phrase(&bad));
    }
    if setters.is_empty() {
        return None;
    }
    Violation::new(
        "hostProcess",
        format!(
            "{} must not set securityContext.windowsOptions.hostProcess=true",
            setters.join(" and ")
        ),
    )
}
