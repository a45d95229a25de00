//! End to end, for real: `kiln controller` against the in-memory API server, the runtime
//! images made by `kiln base build` in a real registry, and the test kubelet running what the
//! controller renders with `kiln run` — the build Job's containers (npm and pip really
//! install), then the Deployment — until the Function answers over HTTP.

#![allow(clippy::unwrap_used)]

use crate::common;
use crate::kubelet;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::controller_env::{ControllerEnv, SYSTEM};
use common::git::{GIT_PASSWORD, GIT_USER, GitServer, GitServerKind, Repo};
use common::kiln::host_ca_bundle;
use kubelet::{Config, TestKubelet};
use serde_json::json;

/// A registry password that must never be readable by install scripts.
const PUSH_TOKEN: &str = "kiln-e2e-push-token-5b1f0c9e";
/// A string only the Function's own source holds: the scan's positive control.
const CANARY: &str = "kiln-scan-canary-7f3a90d1";

/// Builds `runtime`'s base and builder images into the env's registry with a stripped copy of
/// this kiln inside the builder; returns (base, builder) references.
fn runtime_images(env: &ControllerEnv, runtime: &str, work: &Path) -> (String, String) {
    let binary = work.join("kiln");
    if !binary.exists() {
        common::run(Command::new("strip").args([
            "-o",
            binary.to_str().unwrap(),
            env!("CARGO_BIN_EXE_kiln"),
        ]));
    }
    let base = env.registry.reference(&format!("kiln/{runtime}:1"));
    let builder = env.registry.reference(&format!("kiln/{runtime}-builder:1"));
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .env("KILN_CACHE_DIR", common::kiln::shared_download_cache())
        .args([
            "base",
            "build",
            runtime,
            "--image",
            &base,
            "--builder-image",
            &builder,
        ])
        .args([
            "--insecure-registry",
            &env.registry.host(),
            "--kiln-binary",
            binary.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kiln base build {runtime}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (base, builder)
}

fn http(port: u16, method: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let req = format!(
        "{method} / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (
        status,
        out.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default(),
    )
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
        r#"// {CANARY}
const fs = require('fs'), path = require('path');
function scan(needles) {{
  const report = {{ files: 0, found: needles.map(() => []) }};
  const check = (where, data) => {{ report.files++; needles.forEach((n, i) => {{ if (data.includes(n)) report.found[i].push(where); }}); }};
  const walk = (dir, depth) => {{
    if (depth > 40) return;
    let entries; try {{ entries = fs.readdirSync(dir, {{ withFileTypes: true }}); }} catch (e) {{ return; }}
    for (const e of entries) {{
      const p = path.join(dir, e.name);
      if (p === '/proc' || p === '/sys') continue;
      try {{
        if (e.isDirectory()) walk(p, depth + 1);
        else if (fs.statSync(p).isFile() && fs.statSync(p).size < (8 << 20)) check(p, fs.readFileSync(p, 'latin1'));
      }} catch (e) {{}}
    }}
  }};
  walk('/', 0);
  for (const pid of fs.readdirSync('/proc').filter(x => /^\d+$/.test(x)))
    for (const f of ['environ', 'cmdline']) {{ try {{ check(`/proc/${{pid}}/${{f}}`, fs.readFileSync(`/proc/${{pid}}/${{f}}`, 'latin1')); }} catch (e) {{}} }}
  return report;
}}
if (process.argv[2] === 'scan') {{
  const needles = process.argv.slice(3).map(b => Buffer.from(b, 'base64').toString());
  fs.mkdirSync('node_modules/.kiln-scan', {{ recursive: true }});
  fs.writeFileSync('node_modules/.kiln-scan/report.json', JSON.stringify(scan(needles)));
}}
module.exports = {{ main: () => require('./node_modules/.kiln-scan/report.json') }};
"#
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
    let deps = json!({"name": "scan", "version": "1.0.0", "scripts": {"preinstall": script}, "dependencies": {"lodash": "4.17.21"}});
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
        "spec": {"runtime": runtime, "source": {"inline": {"source": source, "dependencies": dependencies}},
                 "env": [{"name": "GREETING", "value": "hello"}]},
    });
    serde_yaml::to_string(&doc).unwrap()
}

const WORDS_DEPENDENCIES: &str =
    r#"{"name": "words", "version": "1.0.0", "dependencies": {"lodash": "4.17.21"}}"#;

#[test]
fn kyma_functions_go_from_manifest_to_a_running_function_through_real_builds() {
    let mut env = ControllerEnv::start(&[]);
    let work = tempfile::tempdir().unwrap();
    let (node_base, node_builder) = runtime_images(&env, "nodejs22", work.path());
    let (py_base, py_builder) = runtime_images(&env, "python313", work.path());
    // The build Jobs' CA bundle (package registries are reached through a TLS-intercepting
    // proxy on this machine) and push credentials with a password the install must not see.
    // A private git repository over HTTPS, whose server's CA the bundle also carries.
    let git = GitServer::start(GitServerKind::BasicTls);
    let ca = std::fs::read_to_string(host_ca_bundle()).unwrap()
        + &std::fs::read_to_string(git.ca_pem()).unwrap();
    env.api.insert(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kiln-ca", "namespace": SYSTEM}, "data": {"ca.crt": ca}}));
    let auth = json!({"auths": {"push.example.com": {"username": "robot", "password": PUSH_TOKEN,
        "auth": common::base64(format!("robot:{PUSH_TOKEN}").as_bytes())}}});
    env.api.insert(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "git-creds", "namespace": "team"},
        "data": {"username": b64(GIT_USER), "password": b64(GIT_PASSWORD)}}));
    env.api.insert(json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": "kiln-registry", "namespace": SYSTEM}, "data": {".dockerconfigjson": b64(&auth.to_string())}}));
    env.spawn(&[
        "--base-image",
        &format!("nodejs22={node_base}"),
        "--builder-image",
        &format!("nodejs22={node_builder}"),
        "--base-image",
        &format!("python313={py_base}"),
        "--builder-image",
        &format!("python313={py_builder}"),
        "--ca-bundle-configmap",
        "kiln-ca",
    ]);
    let mut config = Config::new(
        env!("CARGO_BIN_EXE_kiln"),
        work.path().join("kubelet-cache"),
        work.path().join("kubelet"),
    );
    config.run_args = vec!["--insecure-registry".into(), env.registry.host()];
    let kubelet = TestKubelet::new(config);
    let _running = kubelet.spawn(env.api.client());

    let node = function_yaml(
        "words",
        "nodejs22",
        "const _ = require('lodash');\nmodule.exports = { main: (event, context) => ({ words: _.words(event.data), name: context['function-name'], greeting: process.env.GREETING }) };\n",
        WORDS_DEPENDENCIES,
    );
    let python = function_yaml(
        "yaml",
        "python312",
        "import yaml\n\ndef main(event, context):\n    return yaml.safe_dump({'parsed': yaml.safe_load(event['data'])})\n",
        "PyYAML==6.0.2\n",
    );
    let broken = function_yaml(
        "broken",
        "nodejs22",
        "module.exports = { main: () => 'never' };\n",
        r#"{"dependencies": {"kiln-no-such-package-0f2e9c": "1.0.0"}}"#,
    );
    for yaml in [
        &node,
        &python,
        &broken,
        &scanning_function(kubelet.service_account_token()),
        &git_scanning_function(&git, work.path(), kubelet.service_account_token()),
    ] {
        env.create_function("team", yaml);
    }
    for name in ["words", "yaml", "scan", "git-scan"] {
        env.wait_condition("team", name, "Running", "True", Some("DeploymentReady"));
    }
    let status = env.function("team", "words")["status"].clone();
    assert!(status["digest"].as_str().unwrap().starts_with("sha256:"));
    assert_eq!(
        env.function("team", "yaml")["status"]["runtime"],
        "python313",
        "Kyma's python312 builds on python313"
    );

    let port = kubelet.port("team", "words").expect("the Function runs");
    let (code, body) = http(port, "POST", "kiln builds functions");
    assert_eq!(code, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        answer,
        json!({"words": ["kiln", "builds", "functions"], "name": "words", "greeting": "hello"})
    );

    // Another Function with the same dependencies, built after the first in a new build Pod
    // with empty caches: its lookup finds the layer the first build stored in the shared
    // cache repository (the controller's default), so its install stage installs nothing.
    env.create_function(
        "team",
        &function_yaml(
            "shout",
            "nodejs22",
            "const _ = require('lodash');\nmodule.exports = { main: (event) => _.toUpper(event.data) };\n",
            WORDS_DEPENDENCIES,
        ),
    );
    env.wait_condition("team", "shout", "Running", "True", Some("DeploymentReady"));
    let (code, body) = http(kubelet.port("team", "shout").unwrap(), "POST", "kiln");
    assert_eq!((code, body.as_str()), (200, "KILN"));
    // The log of `container` in `function`'s build Pod.
    let build_log = |function: &str, container: &str| {
        let pods = work.path().join("kubelet/pods");
        let pod = std::fs::read_dir(&pods)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .find_map(|n| {
                n.strip_prefix("team_")
                    .filter(|p| p.starts_with(&format!("{function}-build-")))
                    .map(str::to_string)
            })
            .unwrap_or_else(|| panic!("no build Pod of {function} in {}", pods.display()));
        kubelet.logs("team", &pod, container)
    };
    let deps_log = |function: &str| (build_log(function, "lookup"), build_log(function, "deps"));
    let (lookup, deps) = deps_log("words");
    assert!(lookup.contains("not in the cache repository"), "{lookup}");
    assert!(deps.contains("installing dependencies"), "{deps}");
    let (lookup, deps) = deps_log("shout");
    assert!(
        lookup.contains("the cache repository has the dependency layer"),
        "{lookup}"
    );
    assert!(
        deps.contains("nothing to install") && !deps.contains("installing dependencies"),
        "{deps}"
    );

    let (code, body) = http(kubelet.port("team", "yaml").unwrap(), "POST", "a: [1, 2]");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("parsed:") && body.contains("- 1"), "{body}");

    // The install scripts ran, read everything they could, and found no push credentials
    // and no service-account token — only the canary in the Function's own source.
    let scan_report = |name: &str| {
        let (code, body) = http(kubelet.port("team", name).unwrap(), "GET", "");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()
    };
    assert_clean_scan(&scan_report("scan"), "/workspace/src/handler.js");
    // From a private repository over HTTPS with a private CA: the `source` container fetched
    // it once with the credentials, and the install, which built what it fetched, saw none.
    assert_clean_scan(
        &scan_report("git-scan"),
        "/workspace/git/function/handler.js",
    );
    let fetch = build_log("git-scan", "source");
    assert!(fetch.contains("fetched the git source"), "{fetch}");

    env.wait_condition("team", "broken", "BuildReady", "False", Some("JobFailed"));
    let (_, _, message) = env.condition("team", "broken", "BuildReady").unwrap();
    assert!(
        message.contains("404") && message.contains("kiln-no-such-package-0f2e9c"),
        "npm's error in the condition: {message}"
    );
}
