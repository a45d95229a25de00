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
    let plan = |c: &Container| plan_container(config, input, &volumes, &fields, objects, c);
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

fn plan_container(
    config: &Config,
    input: &PodInput,
    volumes: &PodVolumes,
    fields: &PodFields,
    objects: &Objects,
    c: &Container,
) -> Result<Plan, ConfigError> {
    let image = c.image.clone().unwrap_or_default();
    let mut args = vec![
        "run".to_string(),
        image.clone(),
        "--cache-dir".into(),
        config.cache_dir.display().to_string(),
    ];
    args.extend(config.run_args.iter().cloned());
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
    env.extend(env::resolve(c, fields, objects, &input.overrides)?);
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
