//! A pod's volumes as host directories, and each container's mounts as `kiln run --volume`
//! binds: ConfigMap and Secret contents written out as files (read-only, as the kubelet mounts
//! them), projected volumes (a ServiceAccount token, ConfigMap and Secret keys, the
//! namespace and other pod fields), one host directory per emptyDir shared by the pod's
//! containers, the kubelet's own service-account token for pods no API server admitted, and
//! one termination-message file per container.
//!
//! Not simulated: file ownership (inside kiln's sandbox every host file belongs to the
//! container's user, so a 0400 Secret file stays readable), updates of mounted ConfigMaps and
//! Secrets after the pod started, emptyDir `medium`/`sizeLimit` (recorded, plain host dirs).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{ConfigMap, Container, KeyToPath, Secret};

/// Where the kubelet mounts the service-account token, namespace and CA.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The default `terminationMessagePath`.
pub const TERMINATION_LOG: &str = "/dev/termination-log";

/// The ConfigMaps and Secrets pods may refer to, by namespace and name.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    config_maps: BTreeMap<(String, String), BTreeMap<String, Vec<u8>>>,
    secrets: BTreeMap<(String, String), BTreeMap<String, Vec<u8>>>,
}

fn key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> (String, String) {
    let ns = meta.namespace.clone().unwrap_or_else(|| "default".into());
    (ns, meta.name.clone().unwrap_or_default())
}

impl Objects {
    /// Adds a ConfigMap: `data` and `binaryData`.
    pub fn add_config_map(&mut self, cm: &ConfigMap) {
        let mut data: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for (k, v) in cm.data.iter().flatten() {
            data.insert(k.clone(), v.clone().into_bytes());
        }
        for (k, v) in cm.binary_data.iter().flatten() {
            data.insert(k.clone(), v.0.clone());
        }
        self.config_maps.insert(key(&cm.metadata), data);
    }

    /// Adds a Secret: `data` (base64-decoded by k8s-openapi) and `stringData`, which wins as
    /// the API server merges it.
    pub fn add_secret(&mut self, secret: &Secret) {
        let mut data: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for (k, v) in secret.data.iter().flatten() {
            data.insert(k.clone(), v.0.clone());
        }
        for (k, v) in secret.string_data.iter().flatten() {
            data.insert(k.clone(), v.clone().into_bytes());
        }
        self.secrets.insert(key(&secret.metadata), data);
    }

    /// A ConfigMap's keys and values.
    pub fn config_map(&self, ns: &str, name: &str) -> Option<&BTreeMap<String, Vec<u8>>> {
        self.config_maps.get(&(ns.to_string(), name.to_string()))
    }

    /// A Secret's keys and values.
    pub fn secret(&self, ns: &str, name: &str) -> Option<&BTreeMap<String, Vec<u8>>> {
        self.secrets.get(&(ns.to_string(), name.to_string()))
    }
}

/// Why a pod's containers cannot be created (yet): the kubelet leaves them waiting with this
/// reason and message and tries again later.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// `CreateContainerConfigError` (env, subPath) or `ContainerCreating` (a volume that
    /// cannot be set up, which the kubelet reports as a FailedMount event).
    pub reason: &'static str,
    /// The kubelet's message.
    pub message: String,
}

/// A host path bound into a container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bind {
    /// The host path.
    pub host: PathBuf,
    /// Where it appears in the container.
    pub dest: String,
    /// Mounted read-only.
    pub read_only: bool,
}

impl Bind {
    /// The `kiln run --volume` value.
    pub fn to_arg(&self) -> String {
        let mode = if self.read_only { ":ro" } else { "" };
        format!("{}:{}{mode}", self.host.display(), self.dest)
    }
}

/// A volume set up on the host.
#[derive(Clone, Debug)]
struct Volume {
    dir: PathBuf,
    /// ConfigMap and Secret volumes are always mounted read-only.
    always_read_only: bool,
    /// emptyDir: a missing subPath is created.
    empty_dir: bool,
}

/// A pod's volumes on the host, under its own directory.
#[derive(Clone, Debug)]
pub struct PodVolumes {
    pod_dir: PathBuf,
    volumes: BTreeMap<String, Volume>,
    service_account: Option<PathBuf>,
}

impl PodVolumes {
    /// The host directory of emptyDir `name`, if the pod has one of that name (where
    /// `fileKeyRef` env files are read from).
    pub fn empty_dir(&self, name: &str) -> Option<&Path> {
        self.volumes
            .get(name)
            .filter(|v| v.empty_dir)
            .map(|v| v.dir.as_path())
    }
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> ConfigError {
    ConfigError {
        reason: "ContainerCreating",
        message: format!("{what} {}: {e}", path.display()),
    }
}

/// The kubelet's messages for an `items` key the object does not have.
const CM_KEY: &str = "configmap references non-existent config key";
const SECRET_KEY: &str = "references non-existent secret key";

/// Writes `data` (all keys, or the `items`) into `dir` with the modes the kubelet uses.
fn write_keys(
    dir: &Path,
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&Vec<KeyToPath>>,
    default_mode: Option<i32>,
    missing_key: &str,
    optional: bool,
) -> Result<(), ConfigError> {
    let all: Vec<KeyToPath> = data
        .keys()
        .map(|k| KeyToPath {
            key: k.clone(),
            path: k.clone(),
            mode: None,
        })
        .collect();
    for item in items.unwrap_or(&all) {
        let Some(bytes) = data.get(&item.key) else {
            if optional {
                continue;
            }
            return Err(ConfigError {
                reason: "ContainerCreating",
                message: format!("{missing_key}: {}", item.key),
            });
        };
        let path = dir.join(&item.path);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(|e| io_error("creating", parent, e))?;
        }
        fs::write(&path, bytes).map_err(|e| io_error("writing", &path, e))?;
        let mode = item.mode.or(default_mode).unwrap_or(0o644) as u32;
        fs::set_permissions(&path, fs::Permissions::from_mode(mode))
            .map_err(|e| io_error("chmod", &path, e))?;
    }
    Ok(())
}

/// Writes a projected volume's sources into `dir`: the ServiceAccount token (the one the API
/// server issued at admission), ConfigMap and Secret keys, and downward-API fields.
fn project(
    dir: &Path,
    projected: &k8s_openapi::api::core::v1::ProjectedVolumeSource,
    input: &super::plan::PodInput,
    objects: &Objects,
) -> Result<(), ConfigError> {
    let namespace = input.namespace.as_str();
    let mode = projected.default_mode;
    for source in projected.sources.iter().flatten() {
        if let Some(token) = &source.service_account_token {
            let Some(value) = &input.sa_token else {
                return Err(ConfigError {
                    reason: "ContainerCreating",
                    message: "no service account token was issued for this pod".into(),
                });
            };
            let data = BTreeMap::from([(token.path.clone(), value.clone().into_bytes())]);
            write_keys(dir, &data, None, mode, SECRET_KEY, false)?;
        }
        if let Some(cm) = &source.config_map {
            let optional = cm.optional == Some(true);
            match objects.config_map(namespace, &cm.name) {
                Some(data) => write_keys(dir, data, cm.items.as_ref(), mode, CM_KEY, optional)?,
                None if optional => {}
                None => {
                    return Err(ConfigError {
                        reason: "ContainerCreating",
                        message: format!("configmap {:?} not found", cm.name),
                    });
                }
            }
        }
        if let Some(secret) = &source.secret {
            let optional = secret.optional == Some(true);
            match objects.secret(namespace, &secret.name) {
                Some(data) => {
                    write_keys(dir, data, secret.items.as_ref(), mode, SECRET_KEY, optional)?;
                }
                None if optional => {}
                None => {
                    return Err(ConfigError {
                        reason: "ContainerCreating",
                        message: format!("secret {:?} not found", secret.name),
                    });
                }
            }
        }
        if let Some(downward) = &source.downward_api {
            let fields = super::env::PodFields {
                name: input.name.clone(),
                namespace: namespace.to_string(),
                uid: input.uid.clone(),
                labels: input.labels.clone(),
                annotations: input.annotations.clone(),
                ip: input.ip.clone(),
                ..Default::default()
            };
            for item in downward.items.iter().flatten() {
                let value = item
                    .field_ref
                    .as_ref()
                    .map(|f| fields.get(&f.field_path))
                    .unwrap_or_default();
                let data = BTreeMap::from([(item.path.clone(), value.into_bytes())]);
                write_keys(dir, &data, None, mode, CM_KEY, false)?;
            }
        }
    }
    Ok(())
}

impl PodVolumes {
    /// Sets up every volume of `input`'s pod under `pod_dir` (created), and the kubelet's own
    /// service-account token files (`fallback_token`) unless the pod opts out.
    ///
    /// # Errors
    /// A ConfigMap or Secret (or key) that does not exist and is not optional.
    pub fn set_up(
        pod_dir: &Path,
        input: &super::plan::PodInput,
        objects: &Objects,
        fallback_token: Option<&str>,
    ) -> Result<PodVolumes, ConfigError> {
        let (namespace, spec) = (input.namespace.as_str(), &input.spec);
        let mut volumes = BTreeMap::new();
        for v in spec.volumes.iter().flatten() {
            let dir = pod_dir.join("volumes").join(&v.name);
            fs::create_dir_all(&dir).map_err(|e| io_error("creating", &dir, e))?;
            let failed = |what: String| ConfigError {
                reason: "ContainerCreating",
                message: format!("MountVolume.SetUp failed for volume {:?} : {what}", v.name),
            };
            let mut volume = Volume {
                dir: dir.clone(),
                always_read_only: true,
                empty_dir: false,
            };
            if let Some(cm) = &v.config_map {
                match objects.config_map(namespace, &cm.name) {
                    Some(data) => write_keys(
                        &dir,
                        data,
                        cm.items.as_ref(),
                        cm.default_mode,
                        CM_KEY,
                        cm.optional == Some(true),
                    )
                    .map_err(|e| failed(e.message))?,
                    None if cm.optional == Some(true) => {}
                    None => return Err(failed(format!("configmap {:?} not found", cm.name))),
                }
            } else if let Some(secret) = &v.secret {
                let name = secret.secret_name.clone().unwrap_or_default();
                match objects.secret(namespace, &name) {
                    Some(data) => write_keys(
                        &dir,
                        data,
                        secret.items.as_ref(),
                        secret.default_mode,
                        SECRET_KEY,
                        secret.optional == Some(true),
                    )
                    .map_err(|e| failed(e.message))?,
                    None if secret.optional == Some(true) => {}
                    None => return Err(failed(format!("secret {name:?} not found"))),
                }
            } else if let Some(projected) = &v.projected {
                project(&dir, projected, input, objects).map_err(|e| failed(e.message))?;
            } else if v.empty_dir.is_some() {
                // The kubelet makes emptyDirs world-writable.
                fs::set_permissions(&dir, fs::Permissions::from_mode(0o777))
                    .map_err(|e| io_error("chmod", &dir, e))?;
                volume.always_read_only = false;
                volume.empty_dir = true;
            }
            volumes.insert(v.name.clone(), volume);
        }
        let service_account = match (spec.automount_service_account_token, fallback_token) {
            (Some(false), _) | (_, None) => None,
            (_, Some(token)) => {
                let dir = pod_dir.join("serviceaccount");
                fs::create_dir_all(&dir).map_err(|e| io_error("creating", &dir, e))?;
                for (file, content) in [("token", token), ("namespace", namespace)] {
                    let path = dir.join(file);
                    fs::write(&path, content).map_err(|e| io_error("writing", &path, e))?;
                }
                Some(dir)
            }
        };
        Ok(PodVolumes {
            pod_dir: pod_dir.to_path_buf(),
            volumes,
            service_account,
        })
    }

    /// The host file that receives `container`'s termination message (created empty).
    fn termination_file(&self, container: &str) -> Result<PathBuf, ConfigError> {
        let dir = self.pod_dir.join("termination");
        fs::create_dir_all(&dir).map_err(|e| io_error("creating", &dir, e))?;
        let path = dir.join(container);
        fs::write(&path, b"").map_err(|e| io_error("creating", &path, e))?;
        Ok(path)
    }

    /// `container`'s binds: its volume mounts, the service-account directory (unless it mounts
    /// something there itself) and its termination-message file, which is also returned.
    ///
    /// # Errors
    /// A `subPath` that names nothing in a ConfigMap or Secret volume.
    pub fn binds(
        &self,
        container: &Container,
        pod: &str,
    ) -> Result<(Vec<Bind>, PathBuf), ConfigError> {
        let mut binds = Vec::new();
        for (i, m) in container.volume_mounts.iter().flatten().enumerate() {
            let Some(volume) = self.volumes.get(&m.name) else {
                // spec::check_pod_spec refused this already.
                continue;
            };
            let mut host = volume.dir.clone();
            if let Some(sub) = m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                host = host.join(sub);
                if volume.empty_dir && !host.exists() {
                    fs::create_dir_all(&host).map_err(|e| io_error("creating", &host, e))?;
                }
                if !host.exists() {
                    return Err(ConfigError {
                        reason: "CreateContainerConfigError",
                        message: format!(
                            "failed to prepare subPath for volumeMount {:?} of container {:?} \
                             in pod {pod:?}: {sub:?} does not exist in volume {:?} \
                             (volumeMounts[{i}])",
                            m.name, container.name, m.name
                        ),
                    });
                }
            }
            let read_only = volume.always_read_only || m.read_only == Some(true);
            binds.push(Bind {
                host,
                dest: m.mount_path.clone(),
                read_only,
            });
        }
        if let Some(dir) = &self.service_account
            && !binds.iter().any(|b| b.dest == SERVICE_ACCOUNT_DIR)
        {
            binds.push(Bind {
                host: dir.clone(),
                dest: SERVICE_ACCOUNT_DIR.into(),
                read_only: true,
            });
        }
        let dest = container.termination_message_path.clone();
        let host = self.termination_file(&container.name)?;
        binds.push(Bind {
            host: host.clone(),
            dest: dest.unwrap_or_else(|| TERMINATION_LOG.into()),
            read_only: false,
        });
        Ok((binds, host))
    }
}
