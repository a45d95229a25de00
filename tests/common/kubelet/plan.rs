//! From a checked pod spec to the `kiln run` command line of each of its containers: volumes
//! set up on the host, environment resolved, `command`/`args` expanded, the user from the
//! securityContext (and `runAsNonRoot` enforced), the kubelet's registry arguments added.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, PodSpec};

use super::Config;
use super::container::Plan;
use super::env::{self, PodFields};
use super::pod::NODE_NAME;
use super::spec::effective_ids;
use super::volumes::{ConfigError, Objects, PodVolumes};

/// A pod to set up: where it lives and what it runs.
#[derive(Clone, Debug)]
pub struct PodInput {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's uid (for `fieldRef`).
    pub uid: String,
    /// The pod's labels.
    pub labels: BTreeMap<String, String>,
    /// The pod's annotations.
    pub annotations: BTreeMap<String, String>,
    /// The pod spec (already checked by [`super::spec::check_pod_spec`]).
    pub spec: PodSpec,
    /// Variables replacing the spec's (the port mapping of replicas).
    pub overrides: Vec<(String, String)>,
    /// The pod's IP (`status.podIP`).
    pub ip: String,
    /// Created through the API server: it mounts what admission gave it, and no token of
    /// the kubelet's own.
    pub admitted: bool,
    /// The ServiceAccount token a projected `serviceAccountToken` source gets.
    pub sa_token: Option<String>,
}

/// The containers of a pod, ready to start.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// Init containers, in order.
    pub init: Vec<Plan>,
    /// Containers.
    pub main: Vec<Plan>,
}

/// The directory of pod `name` in `namespace` under the kubelet's scratch directory.
pub fn pod_dir(scratch: &Path, namespace: &str, name: &str) -> PathBuf {
    scratch.join("pods").join(format!("{namespace}_{name}"))
}

/// The log file of one container.
pub fn log_file(scratch: &Path, namespace: &str, pod: &str, container: &str) -> PathBuf {
    pod_dir(scratch, namespace, pod)
        .join("logs")
        .join(format!("{container}.log"))
}

/// Sets the pod up on the host and plans each container.
///
/// # Errors
/// A missing ConfigMap/Secret (volume or env), a bad subPath, `runAsNonRoot` with uid 0: the
/// containers then wait with the error's reason, as the kubelet's would.
pub fn prepare(
    config: &Config,
    token: &str,
    input: &PodInput,
    objects: &Objects,
) -> Result<Prepared, ConfigError> {
    let dir = pod_dir(&config.scratch, &input.namespace, &input.name);
    // The kubelet's own token only for pods no API server admitted (the core alone).
    let fallback = (!input.admitted).then_some(token);
    let volumes = PodVolumes::set_up(&dir, input, objects, fallback)?;
    let fields = PodFields {
        name: input.name.clone(),
        namespace: input.namespace.clone(),
        uid: input.uid.clone(),
        labels: input.labels.clone(),
        annotations: input.annotations.clone(),
        service_account: service_account(&input.spec),
        node_name: NODE_NAME.into(),
        ip: input.ip.clone(),
    };
    let pull_auth = pull_credentials(config, input, objects, &dir)?;
    let plan = |c: &Container| {
        plan_container(
            config,
            input,
            &volumes,
            &fields,
            objects,
            pull_auth.as_deref(),
            c,
        )
    };
    let init = input.spec.init_containers.iter().flatten().map(plan);
    let init = init.collect::<Result<Vec<_>, _>>()?;
    let main = input.spec.containers.iter().map(plan);
    let main = main.collect::<Result<Vec<_>, _>>()?;
    Ok(Prepared { init, main })
}

/// `serviceAccountName` (or the deprecated `serviceAccount`), `default` when unset.
fn service_account(spec: &PodSpec) -> String {
    spec.service_account_name
        .clone()
        .or_else(|| spec.service_account.clone())
        .unwrap_or_else(|| "default".into())
}

/// The pod's `imagePullSecrets` (the ServiceAccount's, copied in by admission), merged over
/// the node's own `--registry-auth` into one docker config for the pulls: `None` when the
/// pod names none. A Secret that does not exist is skipped, as the kubelet does (the pull
/// then goes without it).
fn pull_credentials(
    config: &Config,
    input: &PodInput,
    objects: &Objects,
    pod_dir: &Path,
) -> Result<Option<PathBuf>, ConfigError> {
    let names: Vec<&str> = input
        .spec
        .image_pull_secrets
        .iter()
        .flatten()
        .map(|r| r.name.as_str())
        .collect();
    if names.is_empty() {
        return Ok(None);
    }
    let node = config
        .run_args
        .iter()
        .position(|a| a == "--registry-auth")
        .and_then(|i| config.run_args.get(i + 1));
    let mut auths = serde_json::Map::new();
    if let Some(file) = node
        && let Ok(text) = std::fs::read_to_string(file)
        && let Ok(v) = serde_json::from_str::<serde_json::Value>(&text)
    {
        auths.extend(v["auths"].as_object().cloned().unwrap_or_default());
    }
    for name in names {
        let Some(data) = objects.secret(&input.namespace, name) else {
            continue;
        };
        let Some(v) = data
            .get(".dockerconfigjson")
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(b).ok())
        else {
            continue;
        };
        auths.extend(v["auths"].as_object().cloned().unwrap_or_default());
    }
    let file = pod_dir.join("pull").join("config.json");
    let written = std::fs::create_dir_all(file.parent().unwrap_or(pod_dir))
        .and_then(|()| std::fs::write(&file, serde_json::json!({"auths": auths}).to_string()));
    written.map_err(|e| ConfigError {
        reason: "ContainerCreating",
        message: format!("writing the pull credentials {}: {e}", file.display()),
    })?;
    Ok(Some(file))
}

fn plan_container(
    config: &Config,
    input: &PodInput,
    volumes: &PodVolumes,
    fields: &PodFields,
    objects: &Objects,
    pull_auth: Option<&Path>,
    c: &Container,
) -> Result<Plan, ConfigError> {
    let image = c.image.clone().unwrap_or_default();
    let mut args = vec![
        "run".to_string(),
        image.clone(),
        "--cache-dir".into(),
        config.cache_dir.display().to_string(),
    ];
    let mut node_args = config.run_args.iter().cloned();
    while let Some(arg) = node_args.next() {
        if arg == "--registry-auth" && pull_auth.is_some() {
            node_args.next();
            continue;
        }
        args.push(arg);
    }
    if let Some(file) = pull_auth {
        args.extend(["--registry-auth".into(), file.display().to_string()]);
    }
    let (uid, gid, non_root) = effective_ids(&input.spec, c);
    if let Some(uid) = uid {
        if non_root && uid == 0 {
            return Err(ConfigError {
                reason: "CreateContainerConfigError",
                message: format!(
                    "container's runAsUser breaks non-root policy (pod: \"{}_{}\", container: {})",
                    input.name, input.namespace, c.name
                ),
            });
        }
        let ids = gid.map_or(uid.to_string(), |gid| format!("{uid}:{gid}"));
        args.extend(["--user".into(), ids]);
    }
    // The container runtime sets HOSTNAME to the pod's host name; the kubelet adds the
    // `kubernetes` Service's variables, which in-cluster clients find the API server by.
    let mut env = vec![("HOSTNAME".to_string(), input.name.clone())];
    if let Some((host, port)) = &config.api {
        env.extend([
            ("KUBERNETES_SERVICE_HOST".to_string(), host.clone()),
            ("KUBERNETES_SERVICE_PORT".to_string(), port.to_string()),
            (
                "KUBERNETES_SERVICE_PORT_HTTPS".to_string(),
                port.to_string(),
            ),
            (
                "KUBERNETES_PORT".to_string(),
                format!("tcp://{host}:{port}"),
            ),
        ]);
    }
    let env_file = |volume: &str| volumes.empty_dir(volume).map(Path::to_path_buf);
    env.extend(env::resolve(
        c,
        fields,
        objects,
        &env_file,
        &input.overrides,
    )?);
    let (command, arguments) = env::command_line(c, &env);
    if let Some(command) = command {
        let json = serde_json::to_string(&command).unwrap_or_default();
        args.extend(["--entrypoint".into(), json]);
    }
    for (k, v) in &env {
        args.extend(["--env".into(), format!("{k}={v}")]);
    }
    let (binds, termination_file) = volumes.binds(c, &input.name)?;
    for bind in &binds {
        args.extend(["--volume".into(), bind.to_arg()]);
    }
    if let Some(arguments) = arguments {
        args.push("--".into());
        args.extend(arguments);
    }
    Ok(Plan {
        name: c.name.clone(),
        image,
        args,
        log: log_file(&config.scratch, &input.namespace, &input.name, &c.name),
        termination_file,
        fallback_to_logs: c.termination_message_policy.as_deref() == Some("FallbackToLogsOnError"),
    })
}
