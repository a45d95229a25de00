//! `spec.podSecurityContext` and `spec.containerSecurityContext` (Kyma's fields): whatever a
//! Function sets must keep its Pod within the restricted Pod Security Standard, the checks of
//! pod-security-admission's `restricted` and `baseline` levels that these fields can fail.
//! The controller fills the fields a Function leaves out with its own restricted defaults
//! (`render::deployment`), so only what is set is checked here.

use k8s_openapi::api::core::v1::{
    AppArmorProfile, PodSecurityContext, SELinuxOptions, SeccompProfile, SecurityContext,
    WindowsSecurityContextOptions,
};

use super::Verdict;

/// The SELinux types baseline allows.
const SELINUX_TYPES: [&str; 4] = [
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// The sysctls baseline allows (pod-security-admission v0.36, `sysctls` check).
const SAFE_SYSCTLS: [&str; 10] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// What the restricted profile says when a check fails.
const WHY: &str = "the restricted Pod Security Standard forbids it";

pub(super) fn check(
    pod: Option<&PodSecurityContext>,
    container: Option<&SecurityContext>,
    verdict: &mut Verdict,
) {
    if let Some(p) = pod {
        let field = "spec.podSecurityContext";
        check_user(field, p.run_as_non_root, p.run_as_user, verdict);
        check_seccomp(field, p.seccomp_profile.as_ref(), verdict);
        check_selinux(field, p.se_linux_options.as_ref(), verdict);
        check_apparmor(field, p.app_armor_profile.as_ref(), verdict);
        check_windows(field, p.windows_options.as_ref(), verdict);
        for (i, sysctl) in p.sysctls.iter().flatten().enumerate() {
            if !SAFE_SYSCTLS.contains(&sysctl.name.as_str()) {
                verdict.error(
                    format!("{field}.sysctls[{i}].name"),
                    format!(
                        "{:?} is not a safe sysctl and {WHY}; allowed: {}",
                        sysctl.name,
                        SAFE_SYSCTLS.join(", ")
                    ),
                );
            }
        }
    }
    if let Some(c) = container {
        let field = "spec.containerSecurityContext";
        if c.privileged == Some(true) {
            verdict.error(
                format!("{field}.privileged"),
                format!("a privileged container reaches the node, and {WHY}; leave it unset"),
            );
        }
        if c.allow_privilege_escalation == Some(true) {
            verdict.error(
                format!("{field}.allowPrivilegeEscalation"),
                format!("must be false ({WHY} to be true); leave it unset"),
            );
        }
        if let Some(caps) = &c.capabilities {
            if caps
                .drop
                .as_ref()
                .is_some_and(|d| !d.iter().any(|c| c == "ALL"))
            {
                verdict.error(
                    format!("{field}.capabilities.drop"),
                    format!("must include ALL ({WHY} to keep any); leave it unset"),
                );
            }
            for (i, cap) in caps.add.iter().flatten().enumerate() {
                if cap != "NET_BIND_SERVICE" {
                    verdict.error(
                        format!("{field}.capabilities.add[{i}]"),
                        format!("{cap:?} {WHY}: only NET_BIND_SERVICE may be added"),
                    );
                }
            }
        }
        if c.proc_mount.as_deref().is_some_and(|m| m != "Default") {
            verdict.error(
                format!("{field}.procMount"),
                format!("must be Default ({WHY} to unmask /proc)"),
            );
        }
        check_user(field, c.run_as_non_root, c.run_as_user, verdict);
        check_seccomp(field, c.seccomp_profile.as_ref(), verdict);
        check_selinux(field, c.se_linux_options.as_ref(), verdict);
        check_apparmor(field, c.app_armor_profile.as_ref(), verdict);
        check_windows(field, c.windows_options.as_ref(), verdict);
    }
}

fn check_user(field: &str, non_root: Option<bool>, user: Option<i64>, verdict: &mut Verdict) {
    if non_root == Some(false) {
        verdict.error(
            format!("{field}.runAsNonRoot"),
            format!("must be true ({WHY} to be false); leave it unset"),
        );
    }
    if user == Some(0) {
        verdict.error(
            format!("{field}.runAsUser"),
            format!(
                "0 runs the Function as root, and {WHY}; choose another user or leave it unset \
                (10001)"
            ),
        );
    }
}

fn check_seccomp(field: &str, profile: Option<&SeccompProfile>, verdict: &mut Verdict) {
    if let Some(p) = profile
        && !matches!(p.type_.as_str(), "RuntimeDefault" | "Localhost")
    {
        verdict.error(
            format!("{field}.seccompProfile.type"),
            format!(
                "{:?}: {WHY}; use RuntimeDefault or Localhost, or leave it unset (RuntimeDefault)",
                p.type_
            ),
        );
    }
}

fn check_selinux(field: &str, options: Option<&SELinuxOptions>, verdict: &mut Verdict) {
    let Some(o) = options else {
        return;
    };
    if let Some(t) = o
        .type_
        .as_deref()
        .filter(|t| !t.is_empty() && !SELINUX_TYPES.contains(t))
    {
        verdict.error(
            format!("{field}.seLinuxOptions.type"),
            format!("{t:?}: {WHY}; use one of {}", SELINUX_TYPES.join(", ")),
        );
    }
    for (name, value) in [("user", &o.user), ("role", &o.role)] {
        if value.as_deref().is_some_and(|v| !v.is_empty()) {
            verdict.error(
                format!("{field}.seLinuxOptions.{name}"),
                format!("must be empty ({WHY} to set it)"),
            );
        }
    }
}

fn check_apparmor(field: &str, profile: Option<&AppArmorProfile>, verdict: &mut Verdict) {
    if let Some(p) = profile
        && !matches!(p.type_.as_str(), "RuntimeDefault" | "Localhost")
    {
        verdict.error(
            format!("{field}.appArmorProfile.type"),
            format!("{:?}: {WHY}; use RuntimeDefault or Localhost", p.type_),
        );
    }
}

fn check_windows(
    field: &str,
    options: Option<&WindowsSecurityContextOptions>,
    verdict: &mut Verdict,
) {
    if options.and_then(|o| o.host_process) == Some(true) {
        verdict.error(
            format!("{field}.windowsOptions.hostProcess"),
            format!("must not be true ({WHY})"),
        );
    }
}
