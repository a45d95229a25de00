//! End to end, installed as the README tells a user to: the runtime images and the kiln image
//! made by `kiln base build` into a real registry, then the real `kubectl` against the strict
//! in-memory API server (with cert-manager's part played by a stand-in): a namespace, the
//! registry Secret, a CA bundle, and `kubectl apply --server-side -k deploy/` with deploy/ as
//! written (only the kiln image, the registry and the CA bundle set, as the README says). The
//! test kubelet then runs the controller's and the webhook's Deployments from those objects,
//! pods, probes, ServiceAccount tokens and certificates included, and the build Jobs and
//! Functions the controller makes, in a namespace PodSecurity holds to `restricted`, until the
//! Kyma Functions applied with kubectl answer over HTTP. Then a rollout restart of the
//! controller, its leader killed, a base patch that moves a fleet of 20 Functions onto new
//! Node.js and Python bases (rebased without a Job where safe), and the RBAC it used compared
//! with deploy/rbac.yaml.

#![allow(clippy::unwrap_used)]

use crate::common;
use crate::kubelet;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::cert_manager::CertManager;
use common::git::{GIT_PASSWORD, GIT_USER, GitServer, GitServerKind, Repo};
use common::kiln::host_ca_bundle;
use common::kube_api::KubeApi;
use common::kubectl::{Kubectl, deploy_with_image};
use common::registry::{Registry, RegistryKind};
use common::sshd::SshServer;
use kubelet::{Config, TestKubelet};
use serde_json::{Value, json};

/// A registry password that must never be readable by install scripts.
const PUSH_TOKEN: &str = "kiln-e2e-push-token-5b1f0c9e";
/// A string only the Function's own source holds: the scan's positive control.
const CANARY: &str = "kiln-scan-canary-7f3a90d1";
const SYSTEM: &str = "kiln-system";
/// kiln's build namespace (deploy/namespace.yaml).
const BUILDS: &str = "kiln-builds";
/// The platforms the `yaml` Function is built for.
const BOTH: &str = "linux/amd64,linux/arm64";

/// `kiln base build RUNTIME` into `reg` (README: `$REG/kiln/RUNTIME:latest` and the builder),
/// with a stripped copy of this kiln inside, and the kiln image too when `kiln_image` names it.
/// python313's are built for linux/amd64 and linux/arm64 (indexes; the arm64 builder without
/// a kiln), for the Function built for both.
fn runtime_images(
    reg: &str,
    host: &str,
    runtime: &str,
    kiln_image: Option<&str>,
    lock: Option<&Path>,
    work: &Path,
) {
    let binary = work.join("kiln");
    if !binary.exists() {
        common::run(Command::new("strip").args([
            "-o",
            binary.to_str().unwrap(),
            env!("CARGO_BIN_EXE_kiln"),
        ]));
    }
    let mut command = Command::new(env!("CARGO_BIN_EXE_kiln"));
    command
        .env("KILN_CACHE_DIR", common::kiln::shared_download_cache())
        .args(["base", "build", runtime])
        .args(["--image", &format!("{reg}/kiln/{runtime}:latest")])
        .args([
            "--builder-image",
            &format!("{reg}/kiln/{runtime}-builder:latest"),
        ])
        .args(["--insecure-registry", host])
        .arg("--kiln-binary")
        .arg(&binary);
    if runtime == "python313" {
        command.args(["--platform", BOTH]);
    }
    if let Some(image) = kiln_image {
        command.args(["--kiln-image", image]);
    }
    if let Some(lock) = lock {
        command.arg("--lock").arg(lock);
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "kiln base build {runtime}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `METHOD /` with a text body: (status, body).
fn http(port: u16, method: &str, body: &str) -> (u16, String) {
    let text = [("Content-Type", "text/plain")];
    common::http::request(port, method, "/", &text, body.as_bytes())
}

fn b64(s: &str) -> String {
    common::base64(s.as_bytes())
}

/// A Function whose npm `preinstall` script searches every file it can read, and every
/// process's environment and command line, for the push credentials, the service-account
/// token and the git password, and leaves its report in node_modules, which the running
/// Function returns. Its handler is at `dir`/handler.js in the build; returns (source,
/// package.json).
fn scanner(sa_token: &str, dir: &str) -> (String, String) {
    let source = format!(
        "// {CANARY}
const fs = require('fs'), path = require('path');
function scan(needles) {{
  const report = {{ files: 0, found: needles.map(() => []) }};
  const check = (where, data) => {{ report.files++; needles.forEach((n, i) => {{ if \
      (data.includes(n)) report.found[i].push(where); }}); }};
  const walk = (dir, depth) => {{
    if (depth > 40) return;
    let entries; try {{ entries = fs.readdirSync(dir, {{ withFileTypes: true }}); }} catch (e) {{ \
        return; }}
    for (const e of entries) {{
      const p = path.join(dir, e.name);
      if (p === '/proc' || p === '/sys') continue;
      try {{
        if (e.isDirectory()) walk(p, depth + 1);
        else if (fs.statSync(p).isFile() && fs.statSync(p).size < (8 << 20)) check(p, \
            fs.readFileSync(p, 'latin1'));
      }} catch (e) {{}}
    }}
  }};
  walk('/', 0);
  for (const pid of fs.readdirSync('/proc').filter(x => /^\\d+$/.test(x)))
    for (const f of [
        'environ',
        'cmdline'
    ]) {{ try {{ check(`/proc/${{pid}}/${{f}}`, fs.readFileSync(`/proc/${{pid}}/${{f}}`, \
        'latin1')); }} catch (e) {{}} }}
  return report;
}}
if (process.argv[2] === 'scan') {{
  const needles = process.argv.slice(3).map(b => Buffer.from(b, 'base64').toString());
  fs.mkdirSync('node_modules/.kiln-scan', {{ recursive: true }});
  fs.writeFileSync('node_modules/.kiln-scan/report.json', JSON.stringify(scan(needles)));
}}
module.exports = {{ main: () => require('./node_modules/.kiln-scan/report.json') }};
"
    );
    // The token in clear and as the Basic auth string a docker config carries.
    let auth = common::base64(format!("robot:{PUSH_TOKEN}").as_bytes());
    let script = format!(
        "node {dir}/handler.js scan {} {} {} {} {}",
        b64(PUSH_TOKEN),
        b64(&auth),
        b64(sa_token),
        b64(CANARY),
        b64(GIT_PASSWORD),
    );
    let deps = json!({
        "name": "scan",
        "version": "1.0.0",
        "scripts": {"preinstall": script},
        "dependencies": {"lodash": "4.17.21"}
    });
    (source, deps.to_string())
}

/// Asserts that a scan read the file system, found none of the secrets, and found the
/// canary in the Function's source at `handler`.
fn assert_clean_scan(report: &serde_json::Value, handler: &str) {
    assert!(
        report["files"].as_u64().unwrap() > 100,
        "the scan read the file system: {report}"
    );
    for (needle, what) in [
        (0, "the push password"),
        (1, "the push credentials"),
        (2, "a service-account token"),
        (4, "the git password"),
    ] {
        assert_eq!(
            report["found"][needle],
            json!([]),
            "{what} readable by the install: {report}"
        );
    }
    let canary = report["found"][3].as_array().unwrap();
    assert!(
        canary.iter().any(|p| p == handler),
        "the scan works: {report}"
    );
}

/// The scanner as an inline Kyma Function.
fn scanning_function(sa_token: &str) -> String {
    let (source, deps) = scanner(sa_token, "/workspace/src");
    function_yaml("scan", "nodejs22", &source, &deps)
}

/// The scanner as a Kyma Function from `server`'s repository `fns`, with the Secret
/// `git-creds` (the caller creates it) for the repository's credentials.
fn git_scanning_function(server: &GitServer, work: &Path, sa_token: &str) -> String {
    let (source, deps) = scanner(sa_token, "/workspace/git/function");
    let repo = Repo::init(&work.join("git-src"));
    repo.write("fn/handler.js", source.as_bytes());
    repo.write("fn/package.json", deps.as_bytes());
    repo.commit("scan");
    let branch = repo
        .git(&["rev-parse", "--abbrev-ref", "HEAD"])
        .trim()
        .to_string();
    repo.publish(&server.root(), "fns");
    let doc = json!({
        "apiVersion": "serverless.kyma-project.io/v1alpha2", "kind": "Function",
        "metadata": {"name": "git-scan"},
        "spec": {"runtime": "nodejs22", "source": {"gitRepository": {
            "url": server.url("fns"), "baseDir": "/fn", "reference": branch,
            "auth": {"type": "basic", "secretName": "git-creds"}}}},
    });
    serde_yaml::to_string(&doc).unwrap()
}

fn function_yaml(name: &str, runtime: &str, source: &str, dependencies: &str) -> String {
    let doc = json!({
        "apiVersion": "serverless.kyma-project.io/v1alpha2", "kind": "Function",
        "metadata": {"name": name},
        "spec": {"runtime": runtime, "source": {"inline": {
            "source": source,
            "dependencies": dependencies
        }},
                 "env": [{"name": "GREETING", "value": "hello"}]},
    });
    serde_yaml::to_string(&doc).unwrap()
}

/// The `words` Function; `comment` goes into its source (a new comment, a new build).
fn node_words(comment: &str) -> String {
    function_yaml(
        "words",
        "nodejs22",
        &format!(
            "// {comment}\nconst _ = require('lodash');\nmodule.exports = {{ main: (event, \
                context) => ({{ words: _.words(event.data), name: context['function-name'], \
                greeting: process.env.GREETING }}) }};\n"
        ),
        WORDS_DEPENDENCIES,
    )
}

const WORDS_DEPENDENCIES: &str =
    r#"{"name": "words", "version": "1.0.0", "dependencies": {"lodash": "4.17.21"}}"#;

/// Polls `check` every 200 ms until it gives a value; panics after `timeout` with `context()`.
fn wait<T>(
    what: &str,
    timeout: Duration,
    context: impl Fn() -> String,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}\n{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A condition of Function `team/name`: (status, reason, message).
fn condition(api: &KubeApi, name: &str, kind: &str) -> Option<(String, String, String)> {
    let f = api.get("Function", "team", name)?;
    let c = f["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)?
        .clone();
    let text = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    Some((text("status"), text("reason"), text("message")))
}

/// What the cluster looks like, for a failed wait: Functions, Deployments, Pods with their
/// container states, and the logs of kiln's own pods.
fn story(api: &KubeApi, kubelet: &TestKubelet) -> String {
    let mut out = String::new();
    for f in api.list("Function") {
        out += &format!(
            "Function {}: {}\n",
            f["metadata"]["name"], f["status"]["conditions"]
        );
    }
    for d in api.list("Deployment") {
        out += &format!(
            "Deployment {}/{}: {}\n",
            d["metadata"]["namespace"], d["metadata"]["name"], d["status"]
        );
    }
    for pod in kubelet.pods() {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let status = pod.status.clone().unwrap_or_default();
        out += &format!(
            "Pod {ns}/{name}: {:?} {:?}\n",
            status.phase,
            status.container_statuses.map(|c| c
                .into_iter()
                .map(|c| (c.name, c.ready, c.state))
                .collect::<Vec<_>>())
        );
        if ns == SYSTEM {
            out += &kubelet
                .all_logs(&ns, Some(&pod))
                .chars()
                .rev()
                .take(8000)
                .collect::<String>()
                .chars()
                .rev()
                .collect::<String>();
            out += "\n";
        }
    }
    out
}

/// The objects of `kind` the controller keeps in the build namespace for Function
/// `team/name` (its record of built images aside).
fn build_objects(api: &KubeApi, kind: &str, name: &str) -> Vec<Value> {
    api.list(kind)
        .into_iter()
        .filter(|o| o["metadata"]["namespace"] == BUILDS)
        .filter(|o| {
            let labels = &o["metadata"]["labels"];
            labels["serverless.kyma-project.io/function-namespace"] == "team"
                && labels["serverless.kyma-project.io/function-name"] == name
                && labels["serverless.kyma-project.io/resource"] == "build"
        })
        .collect()
}

/// `kubectl create secret docker-registry NAME` in kiln's namespace.
/// The dependency cache entries (manifests) in `repo`.
fn cache_entries(registry: &Registry, repo: &str) -> Vec<Value> {
    let get = |path: &str| {
        common::run_with_input(
            std::process::Command::new("curl").args([
                "-sf",
                "-H",
                "Accept: application/vnd.oci.image.manifest.v1+json",
                &format!("{}/v2/{repo}/{path}", registry.url()),
            ]),
            b"",
        )
    };
    let tags: Value = serde_json::from_str(&get("tags/list")).unwrap();
    tags["tags"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .filter(|t| t.starts_with("deps-"))
        .map(|t| serde_json::from_str(&get(&format!("manifests/{t}"))).unwrap())
        .collect()
}

fn registry_secret(kubectl: &Kubectl, name: &str, host: &str, user: &str, password: &str) {
    kubectl.ok(&[
        "-n",
        SYSTEM,
        "create",
        "secret",
        "docker-registry",
        name,
        &format!("--docker-server={host}"),
        &format!("--docker-username={user}"),
        &format!("--docker-password={password}"),
    ]);
}

/// Sets `key=value` in the deploy/ copy's config.env, as the README says to.
fn configure(deploy: &Path, key: &str, value: &str) {
    let path = deploy.join("config.env");
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<String> = text
        .lines()
        .map(|l| match l.split_once('=') {
            Some((k, _)) if k == key => format!("{key}={value}"),
            _ => l.to_string(),
        })
        .collect();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
}

/// `kubectl rollout status` of a Deployment in kiln's namespace, which must finish.
fn rollout_status(kubectl: &Kubectl, deployment: &str, context: &dyn Fn() -> String) {
    let target = format!("deployment/{deployment}");
    let args = ["-n", SYSTEM, "rollout", "status", &target, "--timeout=120s"];
    let out = kubectl.command(&args).output().unwrap();
    assert!(
        out.status.success(),
        "{deployment}: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        context()
    );
}

/// The holder of the controller's Lease.
fn leader(api: &KubeApi) -> Option<String> {
    let lease = api.get("Lease", SYSTEM, "kiln-controller")?;
    lease["spec"]["holderIdentity"].as_str().map(str::to_string)
}

/// The Ready controller Pods' names.
fn ready_controllers(kubelet: &TestKubelet) -> Vec<String> {
    kubelet
        .replica_pods(
            kubelet::replica::Kind::Deployment,
            SYSTEM,
            "kiln-controller",
        )
        .into_iter()
        .filter(|p| {
            p.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
        })
        .filter_map(|p| p.metadata.name)
        .collect()
}

#[test]
fn kiln_installed_from_deploy_with_kubectl_builds_and_runs_kyma_functions() {
    // A cluster with cert-manager, a registry, a kubelet whose container runtime pulls from
    // the registry over plain HTTP.
    let api = crate::kubectl::cluster_with_cert_manager();
    let registry = Registry::start(RegistryKind::Plain);
    let host = registry.host();
    let reg = format!("{host}/kiln-functions");
    let work = tempfile::tempdir().unwrap();
    let mut config = Config::new(
        env!("CARGO_BIN_EXE_kiln"),
        work.path().join("kubelet-cache"),
        work.path().join("kubelet"),
    );
    config.run_args = vec!["--insecure-registry".into(), host.clone()];
    config.api = Some(("127.0.0.1".into(), api.https_port()));
    let kubelet = TestKubelet::new(config);
    let _running = kubelet.spawn(api.client());
    let _cert_manager = CertManager::start(api.client());
    let context = || story(&api, &kubelet);

    // README, "Run it in a cluster", step 1 and 2: the runtime images, and the kiln image.
    let kiln_image = format!("{reg}/kiln/kiln:e2e");
    runtime_images(
        &reg,
        &host,
        "nodejs22",
        Some(&kiln_image),
        None,
        work.path(),
    );
    runtime_images(&reg, &host, "python313", None, None, work.path());

    // Step 3: the namespace, the push credentials, the CA bundle the builds trust (this
    // machine reaches the package registries through a TLS-inspecting proxy; the git
    // server has its own CA), then deploy/.
    let kubectl = Kubectl::admin(&api, work.path());
    kubectl.ok(&["create", "namespace", SYSTEM]);
    registry_secret(&kubectl, "kiln-registry", &host, "robot", PUSH_TOKEN);
    let git = GitServer::start(GitServerKind::BasicTls);
    let ca = std::fs::read_to_string(host_ca_bundle()).unwrap()
        + &std::fs::read_to_string(git.ca_pem()).unwrap();
    let ca_file = work.path().join("ca.crt");
    std::fs::write(&ca_file, ca).unwrap();
    kubectl.ok(&[
        "-n",
        SYSTEM,
        "create",
        "configmap",
        "kiln-ca",
        &format!("--from-file=ca.crt={}", ca_file.display()),
    ]);
    // The pull-only Secret Function namespaces get (this registry would let anyone pull; the
    // copy and the ServiceAccount carrying it are what is checked here, and
    // tenancy::a_tenant_gets_only_the_pull_secret_and_cannot_push_with_it checks that such a
    // Secret cannot push).
    registry_secret(&kubectl, "kiln-pull", &host, "puller", "pull-only");
    // The image signing key, as `cosign generate-key-pair k8s://kiln-system/kiln-image-signing`
    // stores it (a key without a password here), and deploys that need its provenance.
    let keys = work.path().join("keys");
    std::fs::create_dir(&keys).unwrap();
    let script = common::kiln::fixtures().join("cosign/check.py");
    let made = Command::new("python3")
        .arg(script)
        .args(["keys", keys.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(made.success());
    kubectl.ok(&[
        "-n",
        SYSTEM,
        "create",
        "secret",
        "generic",
        "kiln-image-signing",
        &format!("--from-file=cosign.key={}", keys.join("a.key").display()),
        &format!("--from-file=cosign.pub={}", keys.join("a.pub").display()),
        "--from-literal=cosign.password=",
    ]);
    let deploy = deploy_with_image(work.path(), &kiln_image);
    configure(&deploy, "registry", &reg);
    configure(&deploy, "pull-secret", "kiln-pull");
    configure(&deploy, "insecure-registry", &host);
    configure(&deploy, "ca-bundle-configmap", "kiln-ca");
    configure(&deploy, "image-signing-secret", "kiln-image-signing");
    configure(&deploy, "require-provenance", "true");
    kubectl.ok(&["apply", "--server-side", "-k", deploy.to_str().unwrap()]);
    for deployment in ["kiln-webhook", "kiln-controller"] {
        rollout_status(&kubectl, deployment, &context);
    }
    // Both controller replicas are Ready; one leads.
    let ready = wait(
        "two Ready controllers, one leading",
        Duration::from_secs(60),
        context,
        || {
            let ready = ready_controllers(&kubelet);
            (ready.len() == 2 && leader(&api).is_some_and(|l| ready.contains(&l))).then_some(ready)
        },
    );
    assert_eq!(ready.len(), 2);

    // Step 4: a namespace for Functions, held to PodSecurity's restricted level, and Kyma
    // Functions applied with kubectl, as written for Kyma.
    kubectl.ok(&["create", "namespace", "team"]);
    kubectl.ok(&[
        "label",
        "namespace",
        "team",
        "pod-security.kubernetes.io/enforce=restricted",
    ]);
    kubectl.ok(&[
        "-n",
        "team",
        "create",
        "secret",
        "generic",
        "git-creds",
        &format!("--from-literal=username={GIT_USER}"),
        &format!("--from-literal=password={GIT_PASSWORD}"),
    ]);
    // The token a build Pod would get, were it mounted: builds run in kiln-builds.
    let sa_token = api.service_account_token(BUILDS, "default");
    let node = node_words("words");
    // Built for both platforms (PyYAML's wheels for each, installed by kiln itself): the
    // build Job pushes an index, the Deployment pulls it and the kubelet runs amd64's.
    let mut python: Value = serde_yaml::from_str(&function_yaml(
        "yaml",
        "python312",
        "import yaml\n\ndef main(event, context):\n    return yaml.safe_dump({'parsed': \
            yaml.safe_load(event['data'])})\n",
        "PyYAML==6.0.2\n",
    ))
    .unwrap();
    python["metadata"]["annotations"] = json!({"kiln.io/platforms": BOTH});
    let python = serde_yaml::to_string(&python).unwrap();
    let broken = function_yaml(
        "broken",
        "nodejs22",
        "module.exports = { main: () => 'never' };\n",
        r#"{"dependencies": {"kiln-no-such-package-0f2e9c": "1.0.0"}}"#,
    );
    // Kyma's `auth.type: key`: a repository behind a loopback sshd, its host key pinned. The
    // controller resolves the reference with the kiln image's ssh, the build Job fetches with
    // the builder image's.
    let sshd = SshServer::start();
    let ssh_repo = Repo::init(&work.path().join("ssh-src"));
    ssh_repo.write(
        "fn/handler.js",
        b"module.exports = { main: () => 'fetched over ssh' };\n",
    );
    ssh_repo.commit("ssh");
    ssh_repo.publish(work.path(), "ssh-fns");
    let key_file = work.path().join("ssh-key");
    std::fs::write(&key_file, sshd.key()).unwrap();
    kubectl.ok(&[
        "-n",
        "team",
        "create",
        "secret",
        "generic",
        "git-key",
        &format!("--from-file=key={}", key_file.display()),
        &format!("--from-literal=knownHosts={}", sshd.known_hosts()),
    ]);
    let over_ssh = serde_yaml::to_string(&json!({
        "apiVersion": "serverless.kyma-project.io/v1alpha2", "kind": "Function",
        "metadata": {"name": "over-ssh"},
        "spec": {"runtime": "nodejs22", "source": {"gitRepository": {
            "url": sshd.url(&work.path().join("ssh-fns.git")), "baseDir": "/fn",
            "reference": "HEAD", "auth": {"type": "key", "secretName": "git-key"}}}},
    }))
    .unwrap();
    let manifests = [
        node,
        python,
        broken,
        scanning_function(&sa_token),
        git_scanning_function(&git, work.path(), &sa_token),
        over_ssh,
    ]
    .join("---\n");
    kubectl.ok_with_input(&["-n", "team", "apply", "-f", "-"], &manifests);
    for example in ["hello-node", "hardened"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples/kyma")
            .join(format!("{example}.yaml"));
        kubectl.ok(&["-n", "team", "apply", "-f", path.to_str().unwrap()]);
    }
    // What restricted PodSecurity would refuse in the Function's Pods is refused at once.
    let mut privileged: Value = serde_yaml::from_str(&function_yaml(
        "privileged",
        "nodejs22",
        "module.exports = { main: () => 'root' };\n",
        "",
    ))
    .unwrap();
    privileged["spec"]["containerSecurityContext"] = json!({"privileged": true});
    let privileged_file = work.path().join("privileged.json");
    std::fs::write(&privileged_file, privileged.to_string()).unwrap();
    let refused = kubectl.run(&[
        "-n",
        "team",
        "apply",
        "-f",
        privileged_file.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success()
            && stderr.contains(r#"The Function "privileged" is invalid"#)
            && stderr.contains("spec.containerSecurityContext.privileged"),
        "{stderr}"
    );
    for name in [
        "words",
        "yaml",
        "scan",
        "git-scan",
        "hello-node",
        "hardened",
        "over-ssh",
    ] {
        wait(
            &format!("{name} Running"),
            Duration::from_secs(300),
            context,
            || condition(&api, name, "Running").filter(|(s, _, _)| s == "True"),
        );
    }
    let table = kubectl.ok(&["-n", "team", "get", "functions"]);
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()[..6]
                == ["words", "True", "True", "True", "nodejs22", "nodejs22"]),
        "{table}"
    );
    // Kyma's python312 runs on kiln's python313, and says so: the table, an Event.
    assert!(
        table.lines().next().unwrap().contains("BUILT AS"),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()[..6]
                == ["yaml", "True", "True", "True", "python312", "python313"]),
        "{table}"
    );
    let substituted: Vec<Value> = api
        .list("Event.events.k8s.io")
        .into_iter()
        .filter(|e| e["regarding"]["name"] == "yaml" && e["reason"] == "RuntimeSubstituted")
        .collect();
    assert_eq!(substituted.len(), 1, "{substituted:?}");
    assert!(
        substituted[0]["note"]
            .as_str()
            .unwrap()
            .contains("runtime python312 is built as python313 (CPython 3.13)"),
        "{substituted:?}"
    );
    let status = api.get("Function", "team", "words").unwrap()["status"].clone();
    assert!(status["digest"].as_str().unwrap().starts_with("sha256:"));
    // Deployed because its build signed it with a provenance of this build (the controller
    // checked; so does `kiln verify`, with the public key alone).
    let verified = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["verify", status["image"].as_str().unwrap(), "--key"])
        .arg(keys.join("a.pub"))
        .args(["--insecure-registry", &host])
        .output()
        .unwrap();
    assert!(
        verified.status.success(),
        "{}",
        String::from_utf8_lossy(&verified.stderr)
    );
    assert_eq!(
        api.get("Function", "team", "yaml").unwrap()["status"]["runtime"],
        "python313",
        "Kyma's python312 builds on python313"
    );
    // The webhook defaulted the Functions on their way in (kiln's mutating rules ran).
    let webhook_logs: String = kubelet
        .replica_pods(kubelet::replica::Kind::Deployment, SYSTEM, "kiln-webhook")
        .iter()
        .map(|p| kubelet.logs(SYSTEM, p.metadata.name.as_deref().unwrap(), "webhook"))
        .collect();
    assert!(webhook_logs.contains("admission review"), "{webhook_logs}");

    let port = kubelet.port("team", "words").expect("the Function runs");
    let (code, body) = http(port, "POST", "kiln builds functions");
    assert_eq!(code, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        answer,
        json!({"words": ["kiln", "builds", "functions"], "name": "words", "greeting": "hello"})
    );
    let (code, body) = http(kubelet.port("team", "hello-node").unwrap(), "GET", "");
    assert_eq!(
        (code, body.as_str()),
        (200, r#"{"greeting":"Hello from hello-node"}"#)
    );
    assert!(
        api.get("HorizontalPodAutoscaler", "team", "hello-node")
            .is_some()
    );
    let (code, body) = http(kubelet.port("team", "yaml").unwrap(), "POST", "a: [1, 2]");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("parsed:") && body.contains("- 1"), "{body}");
    let yaml_image = api.get("Function", "team", "yaml").unwrap()["status"]["image"]
        .as_str()
        .unwrap()
        .to_string();
    let index: Value = serde_json::from_str(&common::run(
        Command::new("skopeo")
            .args(["inspect", "--raw", "--tls-verify=false"])
            .arg(format!("docker://{yaml_image}")),
    ))
    .unwrap();
    let platforms: Vec<String> = index["manifests"]
        .as_array()
        .unwrap_or(&vec![])
        .iter()
        .map(|m| {
            let part = |k: &str| m["platform"][k].as_str().unwrap_or_default().to_string();
            format!("{}/{}", part("os"), part("architecture"))
        })
        .collect();
    assert_eq!(platforms.join(","), BOTH, "{index:#}");
    // The install scripts ran, read everything they could, and found no push credentials,
    // no ServiceAccount token and no git password: only the canary in their own source.
    let scan_report = |name: &str| {
        let (code, body) = http(kubelet.port("team", name).unwrap(), "GET", "");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str::<Value>(&body).unwrap()
    };
    assert_clean_scan(&scan_report("scan"), "/workspace/src/handler.js");
    assert_clean_scan(
        &scan_report("git-scan"),
        "/workspace/git/function/handler.js",
    );
    let (code, body) = http(kubelet.port("team", "over-ssh").unwrap(), "GET", "");
    assert_eq!((code, body.as_str()), (200, "fetched over ssh"));
    let (_, _, message) = condition(&api, "over-ssh", "ConfigurationReady").unwrap();
    assert!(
        !message.contains("not verified"),
        "knownHosts pinned it: {message}"
    );
    let git_status = &api.get("Function", "team", "git-scan").unwrap()["status"];
    assert_eq!(git_status["gitRepository"]["url"], git.url("fns").as_str());
    assert_eq!(git_status["gitRepository"]["baseDir"], "/fn");
    assert_eq!(
        git_status["gitRepository"]["commit"], git_status["commit"],
        "{git_status}"
    );

    // Today's Kyma fields reach the Pod: the security contexts over kiln's restricted
    // defaults (runAsUser from the container's, runAsGroup from the Pod's), and an optional
    // env file that is not there leaves its variable unset.
    let (code, body) = http(kubelet.port("team", "hardened").unwrap(), "GET", "");
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"uid": 3000, "gid": 2000, "rootWritable": false, "fromFile": null})
    );

    // Tenants apart: the Function namespace holds no push credentials, only the pull Secret
    // on the ServiceAccount its Pods run as, and those Pods have no API token.
    assert!(api.get("Secret", "team", "kiln-registry").is_none());
    assert!(api.get("Secret", BUILDS, "kiln-registry").is_some());
    // The fresh cluster's first builds filled the shared dependency cache, each entry signed
    // with the key the controller made for it, which no tenant namespace holds.
    let signing = api
        .get("Secret", SYSTEM, "kiln-cache-signing")
        .expect("the cache signing Secret the controller made");
    assert!(api.get("Secret", BUILDS, "kiln-cache-signing").is_some());
    assert!(api.get("Secret", "team", "kiln-cache-signing").is_none());
    let public = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        signing["data"]["public.pem"].as_str().unwrap(),
    )
    .unwrap();
    let public = String::from_utf8(public).unwrap();
    let key_id = kiln::signing::PublicKey::from_pem(&public).unwrap().id();
    let entries = cache_entries(&registry, "kiln-functions/kiln-cache");
    assert!(entries.len() >= 3, "{entries:?}");
    for entry in &entries {
        assert_eq!(
            entry["annotations"]["dev.kiln.dependencies.signer"], key_id,
            "{entry}"
        );
    }
    let pull = api
        .get("Secret", "team", "kiln-pull")
        .expect("the pull Secret");
    assert_eq!(pull["type"], "kubernetes.io/dockerconfigjson");
    let account = api
        .get("ServiceAccount", "team", "serverless-function")
        .expect("the Functions' ServiceAccount");
    assert_eq!(account["imagePullSecrets"], json!([{"name": "kiln-pull"}]));
    let team_pods: Vec<_> = kubelet
        .pods()
        .into_iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some("team"))
        .collect();
    assert!(team_pods.len() >= 6, "{}", team_pods.len());
    for pod in &team_pods {
        let spec = pod.spec.clone().unwrap();
        assert_eq!(
            spec.service_account_name.as_deref(),
            Some("serverless-function")
        );
        let volumes = spec.volumes.unwrap_or_default();
        assert!(
            !volumes.iter().any(|v| v.projected.is_some()),
            "a token in {:?}: {volumes:?}",
            pod.metadata.name
        );
    }
    // Builds ran in kiln's namespace, never in the tenant's.
    let is_build = |p: &k8s_openapi::api::core::v1::Pod| {
        p.metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key("job-name"))
    };
    assert!(!team_pods.iter().any(is_build));
    assert!(
        kubelet
            .pods()
            .iter()
            .any(|p| is_build(p) && p.metadata.namespace.as_deref() == Some(BUILDS))
    );
    wait(
        "broken's build to fail",
        Duration::from_secs(300),
        context,
        || {
            condition(&api, "broken", "BuildReady")
                .filter(|(s, r, _)| s == "False" && r == "JobFailed")
        },
    );
    let (_, _, message) = condition(&api, "broken", "BuildReady").unwrap();
    assert!(
        message.contains("404") && message.contains("kiln-no-such-package-0f2e9c"),
        "npm's error in the condition: {message}"
    );

    // A rollout restart of the controller completes: the standby being Ready lets the surge
    // pod in and the old ones out.
    let before: BTreeSet<String> = ready_controllers(&kubelet).into_iter().collect();
    kubectl.ok(&[
        "-n",
        SYSTEM,
        "rollout",
        "restart",
        "deployment/kiln-controller",
    ]);
    rollout_status(&kubectl, "kiln-controller", &context);
    let after = wait(
        "two new Ready controllers, one leading",
        Duration::from_secs(90),
        context,
        || {
            let ready: BTreeSet<String> = ready_controllers(&kubelet).into_iter().collect();
            (ready.len() == 2
                && ready.is_disjoint(&before)
                && leader(&api).is_some_and(|l| ready.contains(&l)))
            .then_some(ready)
        },
    );
    assert_eq!(after.len(), 2);

    // The leader is killed: the standby takes the Lease within its duration (deploy/: 15 s),
    // and a Function applied meanwhile is built once.
    let old_leader = leader(&api).unwrap();
    kubectl.ok(&["-n", SYSTEM, "delete", "pod", &old_leader, "--wait=false"]);
    let killed = Instant::now();
    kubectl.ok_with_input(
        &["-n", "team", "apply", "-f", "-"],
        &function_yaml(
            "shout",
            "nodejs22",
            "const _ = require('lodash');\nmodule.exports = { main: (event) => \
                _.toUpper(event.data) };\n",
            WORDS_DEPENDENCIES,
        ),
    );
    let new_leader = wait(
        "another replica to lead",
        Duration::from_secs(60),
        context,
        || leader(&api).filter(|l| *l != old_leader),
    );
    assert!(
        killed.elapsed() < Duration::from_secs(15 + 5),
        "{new_leader} took over after {:?}",
        killed.elapsed()
    );
    wait("shout Running", Duration::from_secs(300), context, || {
        condition(&api, "shout", "Running").filter(|(s, _, _)| s == "True")
    });
    let (code, body) = http(kubelet.port("team", "shout").unwrap(), "POST", "kiln");
    assert_eq!((code, body.as_str()), (200, "KILN"));
    // Built once: one build Pod ran for it, across the change of leader.
    let builds: Vec<String> = kubelet
        .pods()
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .filter(|n| n.starts_with("shout-build-"))
        .collect();
    assert_eq!(builds.len(), 1, "built once: {builds:?}");

    // Scaling bounds make an HPA, and removing them deletes it; a source change builds again
    // and removes the superseded build's Job and ConfigMap.
    kubectl.ok(&[
        "-n",
        "team",
        "patch",
        "function",
        "words",
        "--type=merge",
        "-p",
        r#"{"spec": {"scaleConfig": {"minReplicas": 1, "maxReplicas": 2}}}"#,
    ]);
    wait("the HPA", Duration::from_secs(60), context, || {
        api.get("HorizontalPodAutoscaler", "team", "words")
    });
    kubectl.ok(&[
        "-n",
        "team",
        "patch",
        "function",
        "words",
        "--type=json",
        "-p",
        r#"[{"op": "remove", "path": "/spec/scaleConfig"}]"#,
    ]);
    wait("the HPA gone", Duration::from_secs(60), context, || {
        api.get("HorizontalPodAutoscaler", "team", "words")
            .is_none()
            .then_some(())
    });
    let first_key = api.get("Function", "team", "words").unwrap()["status"]["buildKey"].clone();
    let mut changed: Value = serde_yaml::from_str(&node_words("words loud")).unwrap();
    changed["metadata"]["namespace"] = json!("team");
    kubectl.ok_with_input(&["-n", "team", "apply", "-f", "-"], &changed.to_string());
    wait("words rebuilt", Duration::from_secs(300), context, || {
        let f = api.get("Function", "team", "words")?;
        (f["status"]["buildKey"] != first_key
            && condition(&api, "words", "Running").is_some_and(|(s, _, _)| s == "True"))
        .then_some(())
    });
    wait(
        "one build's ConfigMap left",
        Duration::from_secs(60),
        context,
        || (build_objects(&api, "ConfigMap", "words").len() == 1).then_some(()),
    );

    // A deleted Function's builds go with it: Job, ConfigMap and git credentials' copy.
    assert_eq!(build_objects(&api, "Secret", "git-scan").len(), 1);
    kubectl.ok(&["-n", "team", "delete", "function", "git-scan"]);
    wait(
        "git-scan's builds swept",
        // Sweeps run every 5 s; the Job goes once the test kubelet has stopped its Pod,
        // which on a loaded 2-core machine took over a minute once, and over two (a full
        // suite beside it, 2026-11-29).
        Duration::from_secs(240),
        context,
        || {
            ["Job", "ConfigMap", "Secret"]
                .iter()
                .all(|kind| build_objects(&api, kind, "git-scan").is_empty())
                .then_some(())
        },
    );

    fleet_moves_to_new_bases(&Cluster {
        api: &api,
        kubelet: &kubelet,
        kubectl: &kubectl,
        reg: &reg,
        host: &host,
        work: work.path(),
    });

    // The RBAC the controller used, as the API server audited it, is what deploy/rbac.yaml
    // grants: no more, no less.
    crate::controller_rbac::assert_rbac_is_what_was_used(&api);
}

/// The installed cluster, for the steps after installation.
struct Cluster<'a> {
    api: &'a KubeApi,
    kubelet: &'a TestKubelet,
    kubectl: &'a Kubectl,
    reg: &'a str,
    host: &'a str,
    work: &'a Path,
}

/// A security patch reaches the fleet (issue 33): 20 Functions run, Node.js and Python, with
/// and without dependencies (PyYAML's compiled extension among them); then both runtimes' base
/// and builder images are built again under the same tags, Node.js 22.23.5 in place of
/// 22.23.3 and bottle 0.13.3 in the Python base. The controller rebases every Function whose
/// dependencies a build would not change with no Job, and builds the others with one; every
/// one then answers over HTTP from its new base. Provenance is still required: the controller
/// signs what it rebases, so the rebased Functions carry a signature and a provenance by the
/// platform's key, which `kiln verify` checks. A rollout restart of the controller has it
/// look the tags up again at once rather than after its 5-minute cache.
fn fleet_moves_to_new_bases(c: &Cluster) {
    let context = || story(c.api, c.kubelet);
    let plain_node: Vec<String> = (1..=7).map(|i| format!("fleet-node-{i}")).collect();
    let plain_python: Vec<String> = (1..=6).map(|i| format!("fleet-py-{i}")).collect();
    let manifests: Vec<String> = plain_node
        .iter()
        .map(|name| {
            let source =
                format!("module.exports = {{ main: () => '{name} ' + process.version }};\n");
            function_yaml(name, "nodejs22", &source, "")
        })
        .chain(plain_python.iter().map(|name| {
            let source = format!(
                "import bottle\n\ndef main(event, context):\n    return '{name} bottle ' + \
                 bottle.__version__\n"
            );
            function_yaml(name, "python313", &source, "")
        }))
        .collect();
    c.kubectl.ok_with_input(
        &["-n", "team", "apply", "-f", "-"],
        &manifests.join("---\n"),
    );
    // Rebased: no dependencies, or none a build would install differently. Rebuilt: npm or
    // pip installed them in the builder image, which the new base pairs with another of.
    let rebased: Vec<String> = ["hardened", "over-ssh"]
        .iter()
        .map(|s| s.to_string())
        .chain(plain_node.iter().cloned())
        .chain(plain_python.iter().cloned())
        .collect();
    let rebuilt: Vec<String> = ["words", "yaml", "scan", "hello-node", "shout"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(rebased.len() + rebuilt.len(), 20);
    let running =
        |name: &str| condition(c.api, name, "Running").is_some_and(|(s, _, _)| s == "True");
    for name in plain_node.iter().chain(&plain_python) {
        wait(
            &format!("{name} Running"),
            Duration::from_secs(300),
            context,
            || running(name).then_some(()),
        );
    }
    let get = |name: &str| {
        let port = c.kubelet.port("team", name).expect("the Function runs");
        let (code, body) = http(port, "GET", "");
        assert_eq!(code, 200, "{name}: {body}");
        body
    };
    assert_eq!(get("fleet-node-1"), "fleet-node-1 v22.23.3");
    assert_eq!(get("fleet-py-1"), "fleet-py-1 bottle 0.13.4");
    let image = |name: &str| -> String {
        c.api.get("Function", "team", name).unwrap()["status"]["image"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let jobs = |name: &str| -> BTreeSet<String> {
        build_objects(c.api, "Job", name)
            .iter()
            .map(|j| j["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    let before: Vec<(String, String, BTreeSet<String>)> = rebased
        .iter()
        .chain(&rebuilt)
        .map(|name| (name.clone(), image(name), jobs(name)))
        .collect();

    // The patch: both runtimes' images again, under the same tags.
    let python_lock = common::base_change::bottle_lock(c.work, "0.13.3");
    let node_lock = common::base_change::node_lock(c.work, "22.23.5");
    runtime_images(c.reg, c.host, "nodejs22", None, Some(&node_lock), c.work);
    runtime_images(c.reg, c.host, "python313", None, Some(&python_lock), c.work);
    c.kubectl.ok(&[
        "-n",
        SYSTEM,
        "rollout",
        "restart",
        "deployment/kiln-controller",
    ]);
    rollout_status(c.kubectl, "kiln-controller", &context);

    let events = |name: &str, reason: &str| -> usize {
        c.api
            .list("Event.events.k8s.io")
            .iter()
            .filter(|e| e["regarding"]["name"] == name && e["reason"] == reason)
            .count()
    };
    for (name, old_image, _) in &before {
        wait(
            &format!("{name} on the new base"),
            Duration::from_secs(600),
            context,
            || (image(name) != *old_image && running(name)).then_some(()),
        );
    }
    for (name, _, old_jobs) in &before {
        let new_jobs: Vec<String> = jobs(name).difference(old_jobs).cloned().collect();
        if rebased.contains(name) {
            assert!(
                new_jobs.is_empty(),
                "{name} rebased with a Job: {new_jobs:?}"
            );
            assert!(events(name, "ImageRebased") >= 1, "{name}\n{}", context());
        } else {
            // One, unless the controller that ran before the restart saw the new base before
            // the new builder (its cache of the tags can run out while they move).
            assert!(!new_jobs.is_empty(), "{name} was not rebuilt by a Job");
            assert!(
                events(name, "RebuildForNewBase") >= 1,
                "{name}\n{}",
                context()
            );
        }
    }
    // Signed by the controller's key, as a build Job signs.
    let public = c.work.join("keys/a.pub");
    for name in ["fleet-node-1", "fleet-py-1"] {
        let verify = common::kiln::Kiln::new().run(&[
            "verify",
            &image(name),
            "--key",
            public.to_str().unwrap(),
            "--insecure-registry",
            c.host,
        ]);
        assert_eq!(verify.code, 0, "{name}: {}", verify.stderr);
    }
    // Every one answers, from its new base.
    for name in &plain_node {
        assert_eq!(get(name), format!("{name} v22.23.5"));
    }
    for name in &plain_python {
        assert_eq!(get(name), format!("{name} bottle 0.13.3"));
    }
    let port = |name: &str| c.kubelet.port("team", name).expect("the Function runs");
    let (code, body) = http(port("words"), "POST", "a new base");
    assert_eq!(
        (code, body.contains(r#"["a","new","base"]"#)),
        (200, true),
        "{body}"
    );
    let (code, body) = http(port("yaml"), "POST", "a: [1, 2]");
    assert_eq!((code, body.contains("- 1")), (200, true), "{body}");
    assert_eq!(
        http(port("shout"), "POST", "kiln"),
        (200, "KILN".to_string())
    );
    assert_eq!(http(port("over-ssh"), "GET", "").0, 200);
    for name in ["scan", "hello-node", "hardened"] {
        assert_eq!(http(port(name), "GET", "").0, 200, "{name}");
    }
}
