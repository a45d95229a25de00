//! A container's environment and command line as the kubelet makes them: `env` in order, each
//! `value` expanded against the variables defined before it, `valueFrom` ConfigMap and Secret
//! keys (with `optional`) and field references; then `$(VAR)` in `command` and `args` expanded
//! against the whole list. Service environment variables are not added, but for the API
//! server's (`plan.rs`).

use std::collections::BTreeMap;

use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, FileKeySelector};

use super::volumes::{ConfigError, Objects};

/// The pod fields `fieldRef` can name.
#[derive(Clone, Debug, Default)]
pub struct PodFields {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// `spec.serviceAccountName`.
    pub service_account: String,
    /// `spec.nodeName`.
    pub node_name: String,
    /// `status.podIP`.
    pub ip: String,
}

impl PodFields {
    /// The value of `path` (one [`super::spec::field_ref_supported`] accepts); the host's IP
    /// is 127.0.0.1, the pod's its own loopback address.
    pub fn get(&self, path: &str) -> String {
        let indexed = |prefix: &str, map: &BTreeMap<String, String>| {
            let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
            Some(map.get(key).cloned().unwrap_or_default())
        };
        match path {
            "metadata.name" => self.name.clone(),
            "metadata.namespace" => self.namespace.clone(),
            "metadata.uid" => self.uid.clone(),
            "spec.nodeName" => self.node_name.clone(),
            "spec.serviceAccountName" => self.service_account.clone(),
            "status.podIP" => self.ip.clone(),
            "status.hostIP" => "127.0.0.1".into(),
            _ => indexed("metadata.labels['", &self.labels)
                .or_else(|| indexed("metadata.annotations['", &self.annotations))
                .unwrap_or_default(),
        }
    }
}

/// Expands `$(NAME)` in `input` with `vars` the way Kubernetes does: `$$` is a literal `$`,
/// an unknown or unclosed reference stays as written, any other `$x` is kept.
pub fn expand(input: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(tail) = after.strip_prefix('(') {
            match tail.find(')') {
                Some(end) => {
                    let name = &tail[..end];
                    match vars.get(name) {
                        Some(value) => out.push_str(value),
                        None => out.push_str(&format!("$({name})")),
                    }
                    rest = &tail[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = tail;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

fn config_error(message: String) -> ConfigError {
    ConfigError {
        reason: "CreateContainerConfigError",
        message,
    }
}

/// `container`'s environment, in order, with `overrides` replacing the value of a variable of
/// that name where it is defined (or appended at the end when it is not): the test kubelet's
/// port mapping (`FUNC_PORT`) takes effect before any `$(FUNC_PORT)` is expanded.
///
/// # Errors
/// A referenced ConfigMap, Secret or key that does not exist and is not optional (the
/// kubelet's CreateContainerConfigError messages).
pub fn resolve(
    container: &Container,
    pod: &PodFields,
    objects: &Objects,
    empty_dir: &dyn Fn(&str) -> Option<PathBuf>,
    overrides: &[(String, String)],
) -> Result<Vec<(String, String)>, ConfigError> {
    let mut env: Vec<(String, String)> = Vec::new();
    let mut defined: BTreeMap<String, String> = BTreeMap::new();
    let ns = &pod.namespace;
    for var in container.env.iter().flatten() {
        let value = if let Some((_, value)) = overrides.iter().find(|(k, _)| *k == var.name) {
            Some(value.clone())
        } else if let Some(from) = &var.value_from {
            if let Some(r) = &from.config_map_key_ref {
                let optional = r.optional == Some(true);
                match objects.config_map(ns, &r.name) {
                    None if optional => None,
                    None => return Err(config_error(format!("configmap {:?} not found", r.name))),
                    Some(data) => match data.get(&r.key) {
                        Some(v) => Some(String::from_utf8_lossy(v).into_owned()),
                        None if optional => None,
                        None => {
                            let m =
                                format!("couldn't find key {} in ConfigMap {ns}/{}", r.key, r.name);
                            return Err(config_error(m));
                        }
                    },
                }
            } else if let Some(r) = &from.secret_key_ref {
                let optional = r.optional == Some(true);
                match objects.secret(ns, &r.name) {
                    None if optional => None,
                    None => return Err(config_error(format!("secret {:?} not found", r.name))),
                    Some(data) => match data.get(&r.key) {
                        Some(v) => Some(String::from_utf8_lossy(v).into_owned()),
                        None if optional => None,
                        None => {
                            let m =
                                format!("couldn't find key {} in Secret {ns}/{}", r.key, r.name);
                            return Err(config_error(m));
                        }
                    },
                }
            } else if let Some(r) = &from.file_key_ref {
                file_key(r, empty_dir)?
            } else {
                from.field_ref.as_ref().map(|r| pod.get(&r.field_path))
            }
        } else {
            Some(expand(var.value.as_deref().unwrap_or(""), &defined))
        };
        // An optional reference that is missing defines nothing.
        let Some(value) = value else { continue };
        defined.insert(var.name.clone(), value.clone());
        match env.iter_mut().find(|(k, _)| *k == var.name) {
            Some(entry) => entry.1 = value,
            None => env.push((var.name.clone(), value)),
        }
    }
    for (key, value) in overrides {
        if !env.iter().any(|(k, _)| k == key) {
            env.push((key.clone(), value.clone()));
        }
    }
    Ok(env)
}

/// The value of `fileKeyRef` (EnvFiles): key `r.key` of the `KEY=VALUE` env file at `r.path`
/// in emptyDir `r.volumeName`, read when the container starts (after the init containers
/// that write it). A file or key that is missing defines nothing when `optional`, and is a
/// CreateContainerConfigError otherwise.
fn file_key(
    r: &FileKeySelector,
    empty_dir: &dyn Fn(&str) -> Option<PathBuf>,
) -> Result<Option<String>, ConfigError> {
    let optional = r.optional == Some(true);
    let Some(dir) = empty_dir(&r.volume_name) else {
        return Err(config_error(format!(
            "fileKeyRef: volume {:?} is not an emptyDir volume of the pod",
            r.volume_name
        )));
    };
    let text = match std::fs::read_to_string(dir.join(&r.path)) {
        Ok(text) => text,
        Err(_) if optional => return Ok(None),
        Err(e) => {
            return Err(config_error(format!(
                "couldn't read env file {:?} in volume {:?}: {e}",
                r.path, r.volume_name
            )));
        }
    };
    let value = text
        .lines()
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| k.trim() == r.key)
        .map(|(_, v)| v.trim().to_string());
    match value {
        Some(v) => Ok(Some(v)),
        None if optional => Ok(None),
        None => Err(config_error(format!(
            "couldn't find key {} in env file {:?}",
            r.key, r.path
        ))),
    }
}

/// `command` and `args` with `$(VAR)` expanded against `env`; `None` where the container does
/// not set them (the image's Entrypoint or Cmd then stays).
pub fn command_line(
    container: &Container,
    env: &[(String, String)],
) -> (Option<Vec<String>>, Option<Vec<String>>) {
    let vars: BTreeMap<String, String> = env.iter().cloned().collect();
    let expand_all = |list: &Option<Vec<String>>| {
        list.as_ref()
            .filter(|l| !l.is_empty())
            .map(|l| l.iter().map(|s| expand(s, &vars)).collect())
    };
    (expand_all(&container.command), expand_all(&container.args))
}
