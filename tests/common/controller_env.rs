//! A `kiln controller` process against the in-memory API server and a real registry: what
//! the controller tests and the reconcile benchmark start from. The controller finds the API
//! through a kubeconfig, as in a cluster; its stderr goes to a file that failures print.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::images;
use super::kube_api::KubeApi;
use super::registry::{Registry, RegistryKind};

/// The controller's namespace in the tests.
pub const SYSTEM: &str = "kiln-system";
/// Where build Jobs run (deploy/'s and the controller's default).
pub const BUILDS: &str = "kiln-builds";

/// A small image in the registry, used as base and builder where nothing really builds.
#[derive(Clone, Debug)]
pub struct Tiny {
    /// Its OCI layout (tag `base`).
    pub layout: PathBuf,
    /// Its manifest digest.
    pub digest: String,
    /// Its registry reference.
    pub reference: String,
}

/// The environment; everything stops when it is dropped.
pub struct ControllerEnv {
    /// The API server.
    pub api: KubeApi,
    /// The registry build Jobs push to.
    pub registry: Registry,
    /// The small image.
    pub tiny: Tiny,
    /// Where the controller serves /metrics.
    pub metrics_port: u16,
    /// The controller's stderr.
    pub log: PathBuf,
    /// The kubeconfig the controller uses.
    pub kubeconfig: PathBuf,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl ControllerEnv {
    /// Starts the registry, the API server and `kiln controller` with `extra` flags after the
    /// defaults (every runtime on the small image, push to `<registry>/functions`, no leader
    /// election, 1 s build retries).
    pub fn start(extra: &[&str]) -> ControllerEnv {
        Self::start_with(RegistryKind::Plain, extra)
    }

    /// Like [`ControllerEnv::start`] with a registry of `kind` (plain HTTP, anonymous or with
    /// token auth): the controller and the push Secret `kiln-registry` then hold the
    /// registry's full credentials.
    pub fn start_with(kind: RegistryKind, extra: &[&str]) -> ControllerEnv {
        assert_ne!(
            kind,
            RegistryKind::BasicTls,
            "the controller tests talk plain HTTP"
        );
        let registry = Registry::start(kind);
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = images::make_layout(dir.path());
        let digest = images::tagged_digest(&layout, "base");
        let reference = registry.reference("kiln/tiny:base");
        registry.skopeo_copy_from_layout(&layout, "base", &reference, None);
        let tiny = Tiny {
            layout,
            digest,
            reference,
        };
        let knative =
            std::fs::read_to_string(super::kiln::fixtures().join("knative/service-crd.yaml"))
                .expect("Knative Serving's Service CRD");
        let api = KubeApi::with_options(super::kube_api::Options {
            crds: vec![
                super::kube_api::CrdSource::KilnBinary(env!("CARGO_BIN_EXE_kiln").into()),
                super::kube_api::CrdSource::Yaml(knative),
            ],
            ..Default::default()
        });
        Self::seed(&api, &registry);
        // The controller is who deploy/ makes it: its ServiceAccount, with deploy/rbac.yaml's
        // permissions and no more.
        let kubeconfig = dir.path().join("kubeconfig");
        let token = api.service_account_token(SYSTEM, "kiln-controller");
        std::fs::write(&kubeconfig, api.kubeconfig_with_token(&token)).expect("kubeconfig");
        let metrics_port = super::free_port();
        let log = dir.path().join("controller.log");
        let mut env = ControllerEnv {
            api,
            registry,
            tiny,
            metrics_port,
            log,
            kubeconfig,
            child: None,
            _dir: dir,
        };
        env.spawn(extra);
        env
    }

    fn seed(api: &KubeApi, registry: &Registry) {
        api.insert(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": BUILDS}}));
        for object in rbac_objects() {
            api.insert(object);
        }
        let config = super::base64(&docker_config(registry, registry.credentials()));
        api.insert(json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
            "metadata": {"name": "kiln-registry", "namespace": SYSTEM},
            "data": {".dockerconfigjson": config},
        }));
    }

    /// The controller's arguments: the defaults, then `extra`.
    pub fn args(&self, extra: &[&str]) -> Vec<String> {
        self.args_serving(self.metrics_port, extra)
    }

    fn args_serving(&self, metrics_port: u16, extra: &[&str]) -> Vec<String> {
        let host = self.registry.host();
        let mut args: Vec<String> = vec![
            "controller".into(),
            "--kubeconfig".into(),
            self.kubeconfig.display().to_string(),
            "--registry".into(),
            format!("{host}/functions"),
            "--insecure-registry".into(),
            host,
            "--namespace".into(),
            SYSTEM.into(),
            "--metrics-address".into(),
            format!("127.0.0.1:{metrics_port}"),
            "--build-retry-base".into(),
            "1".into(),
            "--build-retry-max".into(),
            "4".into(),
            "--log-format".into(),
            "json".into(),
        ];
        if self.registry.credentials().is_some() {
            let config = self.registry.docker_config_dir().join("config.json");
            args.extend(["--registry-auth".into(), config.display().to_string()]);
        }
        if !extra.contains(&"--leader-lease") {
            args.push("--no-leader-election".into());
        }
        for runtime in ["nodejs22", "nodejs24", "nodejs26", "python313"] {
            args.push(format!("--base-image={runtime}={}", self.tiny.reference));
            args.push(format!("--builder-image={runtime}={}", self.tiny.reference));
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    fn command(&self, metrics_port: u16, extra: &[&str], pod: &str, log: &Path) -> Command {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("controller log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_kiln"));
        command
            .args(self.args_serving(metrics_port, extra))
            .env_remove("KUBECONFIG")
            .env("POD_NAME", pod)
            .env("RUST_LOG", "kiln=debug,info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        command
    }

    /// Starts (or restarts) the controller process (Pod name `controller-a`).
    pub fn spawn(&mut self, extra: &[&str]) {
        self.stop();
        let child = self
            .command(self.metrics_port, extra, "controller-a", &self.log)
            .spawn()
            .expect("start kiln controller");
        self.child = Some(child);
    }

    /// Starts a second controller process (Pod name `controller-b`, its own metrics port and
    /// log), e.g. a standby replica competing for the leader Lease.
    pub fn spawn_second(&self, extra: &[&str]) -> SecondController {
        let metrics_port = super::free_port();
        let log = self._dir.path().join("controller-b.log");
        let child = self
            .command(metrics_port, extra, "controller-b", &log)
            .spawn()
            .expect("start a second kiln controller");
        SecondController {
            child,
            metrics_port,
            log,
        }
    }

    /// Sends the controller SIGHUP: it reconciles every Function once.
    pub fn hangup(&self) {
        let pid = self.child.as_ref().expect("a running controller").id();
        super::run(Command::new("kill").args(["-HUP", &pid.to_string()]));
    }

    /// Stops the controller process.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The end of the controller's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    /// Creates a Function from YAML in `namespace`.
    pub fn create_function(&self, namespace: &str, yaml: &str) -> Value {
        let mut f: Value = serde_yaml::from_str(yaml).expect("Function YAML");
        f["metadata"]["namespace"] = json!(namespace);
        self.api.insert(f)
    }

    /// A Function.
    pub fn function(&self, namespace: &str, name: &str) -> Value {
        self.api
            .get("Function", namespace, name)
            .unwrap_or(Value::Null)
    }

    /// How many Functions are Running=True.
    pub fn running(&self) -> usize {
        self.api
            .list("Function")
            .iter()
            .filter(|f| {
                f["status"]["conditions"].as_array().is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == "Running" && c["status"] == "True")
                })
            })
            .count()
    }

    /// A condition of a Function: (status, reason, message).
    pub fn condition(
        &self,
        namespace: &str,
        name: &str,
        kind: &str,
    ) -> Option<(String, String, String)> {
        let f = self.function(namespace, name);
        let conditions = f["status"]["conditions"].as_array()?.clone();
        let c = conditions.into_iter().find(|c| c["type"] == kind)?;
        let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
        Some((s("status"), s("reason"), s("message")))
    }

    /// Polls `check` every 50 ms until it holds; panics after `timeout` with the story.
    pub fn wait(&self, what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if check() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let summary: Vec<String> = self
            .api
            .list("Function")
            .iter()
            .take(20)
            .map(|f| {
                let conditions: Vec<String> = f["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| {
                        let text = |k: &str| c[k].as_str().unwrap_or_default().to_string();
                        let message: String = text("message").chars().take(600).collect();
                        format!(
                            "  {}={} {}: {message}",
                            text("type"),
                            text("status"),
                            text("reason")
                        )
                    })
                    .collect();
                let id = |k: &str| f["metadata"][k].as_str().unwrap_or_default().to_string();
                format!(
                    "{}/{}\n{}",
                    id("namespace"),
                    id("name"),
                    conditions.join("\n")
                )
            })
            .collect();
        panic!(
            "timed out after {timeout:?} waiting for {what}\nfunctions:\n{}\ncontroller log:\n{}",
            summary.join("\n"),
            self.log_tail()
        );
    }

    /// Waits until condition `kind` of the Function has `status` (and `reason`, if given).
    pub fn wait_condition(
        &self,
        namespace: &str,
        name: &str,
        kind: &str,
        status: &str,
        reason: Option<&str>,
    ) {
        let what = format!("{namespace}/{name} {kind}={status} {reason:?}");
        self.wait(&what, Duration::from_secs(60), || {
            self.condition(namespace, name, kind)
                .is_some_and(|(s, r, _)| s == status && reason.is_none_or(|want| r == want))
        });
    }

    /// The objects of `kind` owned by Function `namespace/name`.
    pub fn owned(&self, kind: &str, namespace: &str, name: &str) -> Vec<Value> {
        let uid = self.function(namespace, name)["metadata"]["uid"].clone();
        self.api
            .list(kind)
            .into_iter()
            .filter(|o| o["metadata"]["namespace"] == namespace)
            .filter(|o| {
                o["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|rs| rs.iter().any(|r| r["uid"] == uid))
            })
            .collect()
    }

    /// What a build of Function `namespace/name` keeps in the build namespace, of `kind`
    /// (Jobs, source ConfigMaps, Secret copies), by the labels that name the Function.
    pub fn build_objects(&self, kind: &str, namespace: &str, name: &str) -> Vec<Value> {
        self.api
            .list(kind)
            .into_iter()
            .filter(|o| o["metadata"]["namespace"] == BUILDS)
            .filter(|o| {
                let labels = &o["metadata"]["labels"];
                labels["serverless.kyma-project.io/function-namespace"] == namespace
                    && labels["serverless.kyma-project.io/function-name"] == name
                    && labels["serverless.kyma-project.io/resource"] == "build"
            })
            .collect()
    }

    /// The controller's /metrics text.
    pub fn metrics(&self) -> String {
        scrape(self.metrics_port)
    }

    /// A counter or gauge from /metrics (the sum of its series).
    pub fn metric(&self, name: &str) -> f64 {
        metric_in(&self.metrics(), name)
    }
}

/// A second controller process; killed on drop.
pub struct SecondController {
    child: Child,
    /// Where it serves /metrics.
    pub metrics_port: u16,
    /// Its stderr.
    pub log: PathBuf,
}

impl SecondController {
    /// A counter or gauge from its /metrics.
    pub fn metric(&self, name: &str) -> f64 {
        metric_in(&scrape(self.metrics_port), name)
    }

    /// The HTTP status of its `GET /readyz` (0 when it does not answer).
    pub fn readyz(&self) -> u16 {
        let response = http_get(self.metrics_port, "/readyz");
        response
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or(0)
    }

    /// Its log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for SecondController {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn scrape(port: u16) -> String {
    http_get(port, "/metrics")
}

fn http_get(port: u16, path: &str) -> String {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let _ = s.write_all(request.as_bytes());
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

fn metric_in(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

impl Drop for ControllerEnv {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A `.dockerconfigjson` for `registry` with `credentials` (`{"auths":{}}` without).
pub fn docker_config(registry: &Registry, credentials: Option<(&str, &str)>) -> Vec<u8> {
    let auths = credentials.map_or(json!({}), |(user, password)| {
        let auth = super::base64(format!("{user}:{password}").as_bytes());
        json!({ registry.host(): {"auth": auth} })
    });
    json!({ "auths": auths }).to_string().into_bytes()
}

/// The objects of deploy/rbac.yaml: the controller's ServiceAccount, roles and bindings.
pub fn rbac_objects() -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/rbac.yaml");
    let text = std::fs::read_to_string(&path).expect("deploy/rbac.yaml");
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("deploy/rbac.yaml parses"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// A Node.js inline Function's manifest.
pub fn node_function(name: &str, source: &str, dependencies: Option<&str>) -> String {
    let deps = dependencies.map_or(String::new(), |d| {
        format!(
            "      dependencies: {}\n",
            serde_json::to_string(d).expect("JSON string")
        )
    });
    format!(
        "apiVersion: serverless.kyma-project.io/v1alpha2\nkind: Function\nmetadata:\n  name: \
            {name}\nspec:\n  runtime: nodejs22\n  source:\n    inline:\n      source: {}\n{deps}",
        serde_json::to_string(source).expect("JSON string")
    )
}

/// Writes `docs` to a file and returns its path (for validators that read files). Each
/// document is written as JSON (which is YAML), so timestamps stay strings.
pub fn write_yaml(dir: &Path, name: &str, docs: &[Value]) -> PathBuf {
    let path = dir.join(name);
    let text: Vec<String> = docs
        .iter()
        .map(|d| serde_json::to_string_pretty(d).expect("JSON") + "\n")
        .collect();
    std::fs::write(&path, text.join("---\n")).expect("write YAML");
    path
}
