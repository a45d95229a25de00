//! PodSecurity admission for the in-memory API server: the `baseline` and `restricted` checks of
//! k8s.io/pod-security-admission v0.36.2 at policy version `latest`, and the namespace labels
//! that select them.
//!
//! What it models:
//! - [`Policy::from_labels`] resolves the `pod-security.kubernetes.io/*` namespace labels the way
//!   `api.PolicyToEvaluate` does (defaults privileged:latest, warn follows a stricter enforce)
//!   and renders invalid labels with kube-apiserver's field-error wording.
//! - [`check`] runs the checks of one level, in the registry's order (baseline check IDs sorted,
//!   then restricted ones, minus the baseline checks that restricted overrides), over a pod spec
//!   given as JSON, and renders each failure as `reason (detail)` with upstream's exact
//!   pluralization, quoting and sorting.
//! - [`forbidden_detail`] and [`warning`] wrap those failures into the enforce and warn texts.
//!
//! What it does not model:
//! - Policy versions other than `latest`: `*-version` labels are validated but not used, so a
//!   namespace pinned to `v1.20` is still evaluated with the latest checks.
//! - The audit mode (its label is validated, its level is not returned), exemptions (users,
//!   namespaces, runtime classes), the "significant change" filter for pod updates, and the
//!   namespace-update dry run over existing pods. The caller decides when to call [`check`].
//! - Decoding errors: the input is assumed to be a well-formed Pod spec. A field of the wrong
//!   JSON type is treated as if it were unset (upstream would have failed decoding earlier).

mod host;
mod message;
mod pod;
mod profiles;
mod security_context;
#[cfg(test)]
mod tests;
mod volumes;

use std::fmt;

use serde_json::Value;

use host::{
    host_namespaces, host_ports, host_probes_and_host_lifecycle, privileged, sysctls,
    windows_host_process,
};
use message::{Violation, go_quote};
use pod::Pod;
use profiles::{
    app_armor_profile, se_linux_options, seccomp_profile_baseline, seccomp_profile_restricted,
};
use security_context::{
    allow_privilege_escalation, capabilities_baseline, capabilities_restricted,
    proc_mount_baseline, proc_mount_restricted, run_as_non_root, run_as_user,
};
use volumes::{host_path_volumes, restricted_volumes};

/// A PodSecurity level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// No restrictions.
    Privileged,
    /// Prevents known privilege escalations.
    Baseline,
    /// Current pod-hardening best practice; includes every baseline check.
    Restricted,
}

impl Level {
    /// The name used in namespace labels and messages: `privileged`, `baseline` or `restricted`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }

    /// Parses a label value. Matching is exact and case-sensitive, as upstream's `ParseLevel`.
    #[must_use]
    pub fn parse(value: &str) -> Option<Level> {
        match value {
            "privileged" => Some(Level::Privileged),
            "baseline" => Some(Level::Baseline),
            "restricted" => Some(Level::Restricted),
            _ => None,
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Namespace label selecting the enforce level.
pub const ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";
/// Namespace label selecting the enforce policy version.
pub const ENFORCE_VERSION_LABEL: &str = "pod-security.kubernetes.io/enforce-version";
/// Namespace label selecting the audit level.
pub const AUDIT_LABEL: &str = "pod-security.kubernetes.io/audit";
/// Namespace label selecting the audit policy version.
pub const AUDIT_VERSION_LABEL: &str = "pod-security.kubernetes.io/audit-version";
/// Namespace label selecting the warn level.
pub const WARN_LABEL: &str = "pod-security.kubernetes.io/warn";
/// Namespace label selecting the warn policy version.
pub const WARN_VERSION_LABEL: &str = "pod-security.kubernetes.io/warn-version";

const LEVEL_ERROR: &str = "must be one of privileged, baseline, restricted";
const VERSION_ERROR: &str = "must be \"latest\" or \"v1.x\"";

/// The policy of a namespace, from its labels (pod-security.kubernetes.io/enforce,
/// enforce-version, warn, warn-version, audit...): enforce and warn levels (warn defaults to
/// enforce when stricter and unset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Policy {
    /// Level whose failures refuse a pod.
    pub enforce: Level,
    /// Level whose failures become a warning on an allowed request.
    pub warn: Level,
}

impl Default for Policy {
    /// kube-apiserver's default admission configuration: privileged for every mode.
    fn default() -> Self {
        Policy {
            enforce: Level::Privileged,
            warn: Level::Privileged,
        }
    }
}

impl Policy {
    /// From a Namespace object's `metadata.labels` (JSON object or null). Errors name the label
    /// and the bad value exactly as kube-apiserver's Namespace validation does:
    /// `metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: "foo": must be one of
    /// privileged, baseline, restricted`.
    ///
    /// Several bad labels give `[first, second]`, as an aggregated field error list renders, so
    /// the caller can always write `Namespace "NAME" is invalid: {err}`. Anything but an object
    /// counts as no labels; a label value that is not a string is judged by its JSON text, and
    /// `null` as the empty string (what Go's decoder leaves in a `map[string]string`).
    ///
    /// # Errors
    ///
    /// Any `pod-security.kubernetes.io/*` level or version label with an invalid value; upstream
    /// refuses such a Namespace on create (and on an update that changes the errors).
    pub fn from_labels(labels: &Value) -> Result<Policy, String> {
        let Some(labels) = labels.as_object() else {
            return Ok(Policy::default());
        };
        let label = |key: &str| labels.get(key).map(label_text);
        let mut policy = Policy::default();
        let mut errors = Vec::new();

        // Upstream only lets warn follow enforce when enforce parsed, so that a typo does not
        // also start producing warnings at the fail-closed level.
        let mut has_enforce_level = false;
        if let Some(value) = label(ENFORCE_LABEL) {
            match Level::parse(&value) {
                Some(level) => {
                    policy.enforce = level;
                    has_enforce_level = true;
                }
                None => {
                    // Fail closed, as upstream does, even though the Err below hides it.
                    policy.enforce = Level::Restricted;
                    errors.push(invalid_label(ENFORCE_LABEL, &value, LEVEL_ERROR));
                }
            }
        }
        if let Some(value) = label(ENFORCE_VERSION_LABEL) {
            check_version(ENFORCE_VERSION_LABEL, &value, &mut errors);
        }
        // The audit level is not returned, but a bad value must still be refused.
        if let Some(value) = label(AUDIT_LABEL)
            && Level::parse(&value).is_none()
        {
            errors.push(invalid_label(AUDIT_LABEL, &value, LEVEL_ERROR));
        }
        if let Some(value) = label(AUDIT_VERSION_LABEL) {
            check_version(AUDIT_VERSION_LABEL, &value, &mut errors);
        }
        let has_warn_level = labels.contains_key(WARN_LABEL);
        if let Some(value) = label(WARN_LABEL) {
            match Level::parse(&value) {
                Some(level) => policy.warn = level,
                None => {
                    // Fail open for warn, as upstream does.
                    policy.warn = Level::Privileged;
                    errors.push(invalid_label(WARN_LABEL, &value, LEVEL_ERROR));
                }
            }
        }
        if let Some(value) = label(WARN_VERSION_LABEL) {
            check_version(WARN_VERSION_LABEL, &value, &mut errors);
        }

        if !has_warn_level && has_enforce_level && policy.enforce > policy.warn {
            policy.warn = policy.enforce;
        }

        if errors.is_empty() {
            Ok(policy)
        } else {
            Err(aggregate(errors))
        }
    }
}

/// A label value as Go would see it after decoding into `map[string]string`.
fn label_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Validates a `*-version` label: `latest` or `v1.N` with no leading zero (upstream's regexp
/// `^v1\.([0-9]|[1-9][0-9]*)$`, then `strconv.Atoi`, which refuses values beyond int64).
fn check_version(label: &str, value: &str, errors: &mut Vec<String>) {
    if value == "latest" {
        return;
    }
    let valid = value.strip_prefix("v1.").is_some_and(|minor| {
        !minor.is_empty()
            && minor.bytes().all(|b| b.is_ascii_digit())
            && (minor.len() == 1 || !minor.starts_with('0'))
            && minor.parse::<i64>().is_ok()
    });
    if !valid {
        errors.push(invalid_label(label, value, VERSION_ERROR));
    }
}

/// `field.Invalid(field.NewPath("metadata", "labels").Key(label), value, detail).Error()`.
fn invalid_label(label: &str, value: &str, detail: &str) -> String {
    format!(
        "metadata.labels[{label}]: Invalid value: {}: {detail}",
        go_quote(value)
    )
}

/// `errs.ToAggregate().Error()`: duplicates dropped, one message bare, several bracketed.
fn aggregate(errors: Vec<String>) -> String {
    let mut unique: Vec<String> = Vec::with_capacity(errors.len());
    for error in errors {
        if !unique.contains(&error) {
            unique.push(error);
        }
    }
    if unique.len() == 1 {
        unique.concat()
    } else {
        format!("[{}]", unique.join(", "))
    }
}

/// The failing checks of a pod spec (JSON `spec` of a Pod, or `spec.template.spec` of a workload,
/// plus the pod's metadata for AppArmor annotations) at `level`, in the admission's order, each
/// rendered `reason (detail)`; empty when it passes.
#[must_use]
pub fn check(level: Level, metadata: &Value, pod_spec: &Value) -> Vec<String> {
    let checks: &[CheckFn] = match level {
        Level::Privileged => return Vec::new(),
        Level::Baseline => BASELINE_CHECKS,
        Level::Restricted => RESTRICTED_CHECKS,
    };
    let pod = Pod::new(metadata, pod_spec);
    checks
        .iter()
        .filter_map(|check| check(&pod))
        .map(Violation::render)
        .collect()
}

/// The Forbidden message of a Pod refused at `level` (version latest):
/// `violates PodSecurity "restricted:latest": a (b), c (d)` (the caller wraps it as
/// `pods "NAME" is forbidden: ...`).
#[must_use]
pub fn forbidden_detail(level: Level, failures: &[String]) -> String {
    format!(
        "violates PodSecurity \"{level}:latest\": {}",
        failures.join(", ")
    )
}

/// The warning text for a workload (Deployment, Job…) whose pod template would violate `level`:
/// `would violate PodSecurity "restricted:latest": ...`. Upstream uses the same text for a pod
/// that is allowed by enforce but fails the (stricter) warn level.
#[must_use]
pub fn warning(level: Level, failures: &[String]) -> String {
    format!(
        "would violate PodSecurity \"{level}:latest\": {}",
        failures.join(", ")
    )
}

type CheckFn = fn(&Pod<'_>) -> Option<Violation>;

/// Baseline at `latest`: every baseline check, sorted by check ID (Go byte order, hence
/// `seLinuxOptions` before `seccompProfile_baseline`).
const BASELINE_CHECKS: &[CheckFn] = &[
    app_armor_profile,              // appArmorProfile
    capabilities_baseline,          // capabilities_baseline
    host_namespaces,                // hostNamespaces
    host_path_volumes,              // hostPathVolumes
    host_ports,                     // hostPorts
    host_probes_and_host_lifecycle, // hostProbesAndHostLifecycle
    privileged,                     // privileged
    proc_mount_baseline,            // procMount
    se_linux_options,               // seLinuxOptions
    seccomp_profile_baseline,       // seccompProfile_baseline
    sysctls,                        // sysctls
    windows_host_process,           // windowsHostProcess
];

/// Restricted at `latest`: the baseline checks that no restricted check overrides, then the
/// restricted checks sorted by ID. Overridden: capabilities_baseline, hostPathVolumes, procMount,
/// seccompProfile_baseline.
const RESTRICTED_CHECKS: &[CheckFn] = &[
    app_armor_profile,
    host_namespaces,
    host_ports,
    host_probes_and_host_lifecycle,
    privileged,
    se_linux_options,
    sysctls,
    windows_host_process,
    allow_privilege_escalation,
    capabilities_restricted,
    proc_mount_restricted,
    restricted_volumes,
    run_as_non_root,
    run_as_user,
    seccomp_profile_restricted,
];
