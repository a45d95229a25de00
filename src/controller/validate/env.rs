//! `spec.env`: names valid (`IsEnvVarName`), unique and not reserved by the runtime (Kyma's
//! list and the names the runtime contract fixes, such as `FUNC_NAME`); a
//! `valueFrom` with exactly one source, and that source complete, as the API server will
//! demand of the Deployment the controller renders from it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, FileKeySelector};

use super::{Verdict, config_map_key, dns1123_subdomain, env_var_name};
use crate::controller::crd::{CONTRACT_ENV, RESERVED_ENV};

/// `fieldRef` paths the downward API serves as env values.
const FIELD_PATHS: [&str; 9] = [
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
];

/// `resourceFieldRef` resources (plus `requests.hugepages-*` / `limits.hugepages-*`).
const RESOURCES: [&str; 6] = [
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.ephemeral-storage",
];

pub(super) fn check(env: &[EnvVar], verdict: &mut Verdict) {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, var) in env.iter().enumerate() {
        let field = format!("spec.env[{i}]");
        let name = var.name.as_str();
        if name.is_empty() {
            verdict.error(format!("{field}.name"), "a name is required");
        } else if let Err(e) = env_var_name(name) {
            verdict.error(
                format!("{field}.name"),
                format!("{name:?} is not a valid environment variable name ({e})"),
            );
        } else if RESERVED_ENV.contains(&name) || CONTRACT_ENV.contains(&name) {
            let mut reserved: Vec<&str> = RESERVED_ENV.to_vec();
            reserved.extend(CONTRACT_ENV.iter().filter(|n| !RESERVED_ENV.contains(n)));
            verdict.error(
                format!("{field}.name"),
                format!(
                    "{name:?} is reserved: the runtime sets it ({}); choose another name",
                    reserved.join(", ")
                ),
            );
        }
        match seen.get(name) {
            Some(first) if !name.is_empty() => verdict.error(
                format!("{field}.name"),
                format!("{name:?} is already set by spec.env[{first}]; remove one of them"),
            ),
            _ => {
                seen.entry(name).or_insert(i);
            }
        }
        if let Some(from) = &var.value_from {
            if var.value.as_deref().is_some_and(|v| !v.is_empty()) {
                verdict.error(
                    format!("{field}.valueFrom"),
                    "may not be set together with value; keep one of them",
                );
            }
            check_source(&format!("{field}.valueFrom"), from, verdict);
        }
    }
}

fn check_source(field: &str, from: &EnvVarSource, verdict: &mut Verdict) {
    let set = [
        from.config_map_key_ref.is_some(),
        from.secret_key_ref.is_some(),
        from.field_ref.is_some(),
        from.resource_field_ref.is_some(),
        from.file_key_ref.is_some(),
    ]
    .into_iter()
    .filter(|s| *s)
    .count();
    if set != 1 {
        verdict.error(
            field,
            format!(
                "must have exactly one of configMapKeyRef, secretKeyRef, fieldRef, \
                 resourceFieldRef and fileKeyRef (it has {set})"
            ),
        );
        return;
    }
    if let Some(r) = &from.file_key_ref {
        check_file_key_ref(&format!("{field}.fileKeyRef"), r, verdict);
    }
    if let Some(r) = &from.config_map_key_ref {
        check_key_ref(
            &format!("{field}.configMapKeyRef"),
            &r.name,
            &r.key,
            verdict,
        );
    }
    if let Some(r) = &from.secret_key_ref {
        check_key_ref(&format!("{field}.secretKeyRef"), &r.name, &r.key, verdict);
    }
    if let Some(r) = &from.field_ref {
        let path = r.field_path.as_str();
        let subscripted = ["metadata.labels['", "metadata.annotations['"]
            .iter()
            .any(|p| path.starts_with(p) && path.ends_with("']") && path.len() > p.len() + 2);
        if !(FIELD_PATHS.contains(&path) || subscripted) {
            verdict.error(
                format!("{field}.fieldRef.fieldPath"),
                format!(
                    "{path:?} is not a field the downward API provides as env; use one of {}, \
                     metadata.labels['KEY'] or metadata.annotations['KEY']",
                    FIELD_PATHS.join(", ")
                ),
            );
        }
        if let Some(v) = r
            .api_version
            .as_deref()
            .filter(|v| !v.is_empty() && *v != "v1")
        {
            verdict.error(
                format!("{field}.fieldRef.apiVersion"),
                format!("{v:?} is not supported; use v1 or leave it out"),
            );
        }
    }
    if let Some(r) = &from.resource_field_ref {
        let resource = r.resource.as_str();
        let hugepages = ["requests.hugepages-", "limits.hugepages-"]
            .iter()
            .any(|p| resource.len() > p.len() && resource.starts_with(p));
        if !(RESOURCES.contains(&resource) || hugepages) {
            verdict.error(
                format!("{field}.resourceFieldRef.resource"),
                format!(
                    "{resource:?} is not supported; use one of {}",
                    RESOURCES.join(", ")
                ),
            );
        }
    }
}

/// The emptyDir volume of a Function's Pod, the only one an env file can be in.
const ENV_FILE_VOLUME: &str = "tmp";

/// `fileKeyRef` (Kubernetes' EnvFiles): a key of an env file in one of the Pod's emptyDir
/// volumes. kiln passes it through, as Kyma does, and checks what the API server would.
fn check_file_key_ref(field: &str, r: &FileKeySelector, verdict: &mut Verdict) {
    if r.volume_name != ENV_FILE_VOLUME {
        verdict.error(
            format!("{field}.volumeName"),
            format!(
                "{:?} is not an emptyDir volume of the Function's Pod: env files can only be \
                 read from {ENV_FILE_VOLUME:?} (mounted at /tmp)",
                r.volume_name
            ),
        );
    }
    let path = std::path::Path::new(&r.path);
    let escapes = path
        .components()
        .any(|c| !matches!(c, std::path::Component::Normal(_)));
    if r.path.is_empty() || escapes {
        verdict.error(
            format!("{field}.path"),
            format!(
                "{:?} must be a relative path inside the volume, without '..'",
                r.path
            ),
        );
    }
    let printable = r.key.chars().all(|c| c.is_ascii_graphic() && c != '=');
    if r.key.is_empty() || r.key.len() > 128 || !printable {
        verdict.error(
            format!("{field}.key"),
            format!(
                "{:?} must be 1 to 128 printable ASCII characters other than '='",
                r.key
            ),
        );
    }
}

fn check_key_ref(field: &str, name: &str, key: &str, verdict: &mut Verdict) {
    if name.is_empty() {
        verdict.error(format!("{field}.name"), "a name is required");
    } else if let Err(e) = dns1123_subdomain(name) {
        verdict.error(
            format!("{field}.name"),
            format!("{name:?} is not a valid object name ({e})"),
        );
    }
    if key.is_empty() {
        verdict.error(format!("{field}.key"), "a key is required");
    } else if let Err(e) = config_map_key(key) {
        verdict.error(
            format!("{field}.key"),
            format!("{key:?} is not a valid key ({e})"),
        );
    }
}
