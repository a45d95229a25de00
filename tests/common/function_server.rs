//! A function server of `runtimes/_servers/` (Node.js, or Python on bottle and cheroot) run
//! straight from the host's `node` or `python3` with a fixture Function from
//! `tests/fixtures/servers/`, and the HTTP helpers the runtime-contract tests call it with.
//! The Kyma runtime packages the servers load are installed once, from the base images'
//! locks (with kiln's own installers), into directories shared by every test process.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use reqwest::{Client, Method, StatusCode};
use serde_json::Value;

/// The function servers: the legacy API's two, nodejs26's new `main(req, res)` API and
/// python314's new Flask `main()` API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runtime {
    Node,
    Python,
    Express,
    Flask,
}

impl Runtime {
    /// What the fixture reports as `context.runtime` (`FUNC_RUNTIME`).
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Node => "nodejs20",
            Runtime::Python => "python311",
            Runtime::Express => "nodejs26",
            Runtime::Flask => "python314",
        }
    }

    /// File name of the fixture Function, as it appears in stack traces.
    pub fn handler_file(self) -> &'static str {
        match self {
            Runtime::Node | Runtime::Express => "handler.js",
            Runtime::Python | Runtime::Flask => "handler.py",
        }
    }
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The fixture Functions, `tests/fixtures/servers/{node,python}`.
pub fn fixtures() -> PathBuf {
    repo().join("tests/fixtures/servers")
}

/// A running function server; killed (and reaped) on drop.
pub struct Server {
    child: Child,
    /// The port the server listens on, on 127.0.0.1.
    pub port: u16,
    logs: tempfile::TempDir,
    exit: Option<ExitStatus>,
}

impl Server {
    /// Starts `runtime`'s server with the fixture Function and `env` on top of the defaults,
    /// and waits until it logs the port it listens on.
    pub fn start(runtime: Runtime, env: &[(&str, &str)]) -> Server {
        Server::start_in(runtime, env, None)
    }

    /// [`Server::start`] with `cwd` as the server's working directory (the image's is the
    /// Function's own directory).
    pub fn start_in(runtime: Runtime, env: &[(&str, &str)], cwd: Option<&Path>) -> Server {
        let logs = tempfile::tempdir().unwrap();
        let fixtures = fixtures();
        let servers = repo().join("runtimes/_servers");
        let (program, script) = match runtime {
            Runtime::Node => (interpreter("KILN_TEST_NODE", "node"), "node/server.js"),
            Runtime::Express => (interpreter("KILN_TEST_NODE", "node"), "express/server.js"),
            Runtime::Python => (
                interpreter("KILN_TEST_PYTHON", "python3"),
                "python/server.py",
            ),
            Runtime::Flask => (
                interpreter("KILN_TEST_PYTHON", "python3"),
                "flask/server.py",
            ),
        };
        let mut cmd = Command::new(program);
        cmd.arg(servers.join(script));
        // A clean environment, like the image's: only what the contract defines.
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("FUNC_PORT", "0")
            .env("FUNC_NAME", "fixture")
            .env("SERVICE_NAMESPACE", "tests")
            .env("FUNC_RUNTIME", runtime.name())
            .env("FUNC_HANDLER", "main")
            .env("MOD_NAME", "handler");
        match runtime {
            Runtime::Node => cmd
                .env("NODE_PATH", node_packages())
                .env("HANDLER_PATH", fixtures.join("node/handler.js")),
            // `sdk` as the image has it in /usr/src/app/node_modules.
            Runtime::Express => cmd
                .env(
                    "NODE_PATH",
                    std::env::join_paths([node_packages(), servers.join("express")]).unwrap(),
                )
                .env("HANDLER_PATH", fixtures.join("express/handler.js")),
            Runtime::Python => cmd
                .env("PYTHONPATH", python_packages("python313"))
                .env("FUNCTION_PATH", fixtures.join("python"))
                .env("PYTHONUNBUFFERED", "TRUE")
                .env("PYTHONDONTWRITEBYTECODE", "1"),
            // Kyma's python314 names, as the image sets them.
            Runtime::Flask => cmd
                .env("PYTHONPATH", python_packages("python314"))
                .env("HANDLER_PATH", fixtures.join("flask"))
                .env("PYTHONUNBUFFERED", "TRUE")
                .env("PYTHONDONTWRITEBYTECODE", "1"),
        };
        if let Some(dir) = cwd {
            cmd.current_dir(dir);
        }
        cmd.envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(fs::File::create(logs.path().join("stdout")).unwrap())
            .stderr(fs::File::create(logs.path().join("stderr")).unwrap());
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        let mut server = Server {
            child,
            port: 0,
            logs,
            exit: None,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(port) = listening_port(&server.stdout()) {
                server.port = port;
                return server;
            }
            if let Some(status) = server.child.try_wait().unwrap() {
                panic!(
                    "{runtime:?} server exited ({status}) before listening:\n{}",
                    server.logs()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{runtime:?} server did not start:\n{}",
                server.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// What the server has written to stdout so far.
    pub fn stdout(&self) -> String {
        fs::read_to_string(self.logs.path().join("stdout")).unwrap_or_default()
    }

    /// What the server has written to stderr so far.
    pub fn stderr(&self) -> String {
        fs::read_to_string(self.logs.path().join("stderr")).unwrap_or_default()
    }

    /// Both logs, for failure messages.
    pub fn logs(&self) -> String {
        format!("--- stdout\n{}--- stderr\n{}", self.stdout(), self.stderr())
    }

    /// Sends SIGTERM, as the kubelet does when a Pod stops.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -TERM failed");
    }

    /// The exit status, once the process exits within `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                self.exit = Some(status);
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// Polls `stderr` until it contains `needle` (the server may log just after answering).
    pub async fn stderr_containing(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let stderr = self.stderr();
            if stderr.contains(needle) || Instant::now() > deadline {
                return stderr;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The nodejs22 base image's Kyma runtime packages (the OpenTelemetry SDK for tracing),
/// installed from the same pinned tarballs into a `node_modules` shared by every test, for
/// `NODE_PATH`, as they sit in the image's /usr/src/app/node_modules.
fn node_packages() -> PathBuf {
    let (_, lock) = kiln::base::recipe::embedded("nodejs22").unwrap();
    let key: String = lock
        .first
        .npm_tree
        .iter()
        .map(|p| p.tarball.integrity.clone())
        .collect();
    shared_install("node-packages", &key, move |http, cache, into| {
        let registry: url::Url = "https://registry.npmjs.org/".parse().unwrap();
        Box::pin(async move {
            kiln::base::packages::install_npm(
                &http,
                &registry,
                &cache,
                &lock.first.npm_tree,
                &into,
            )
            .await
            .unwrap();
        })
    })
}

type Install = Box<
    dyn FnOnce(reqwest::Client, PathBuf, PathBuf) -> std::pin::Pin<Box<dyn Future<Output = ()>>>
        + Send,
>;

/// Installs once into a directory named by `prefix` and a hash of `key`, shared by every
/// test process (the first to finish renames its copy into place).
fn shared_install(
    prefix: &str,
    key: &str,
    install: impl FnOnce(
        reqwest::Client,
        PathBuf,
        PathBuf,
    ) -> std::pin::Pin<Box<dyn Future<Output = ()>>>
    + Send
    + 'static,
) -> PathBuf {
    let install: Install = Box::new(install);
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = tmp.join(format!(
        "{prefix}-{}",
        &kiln::oci::Digest::of(key.as_bytes()).hex()[..16]
    ));
    if dir.is_dir() {
        return dir;
    }
    let cache = tmp.join("kiln-test-cache");
    let staging = tempfile::tempdir_in(tmp).unwrap();
    let into = staging.path().to_path_buf();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(install(reqwest::Client::new(), cache, into));
    })
    .join()
    .unwrap();
    let kept = staging.keep();
    if fs::rename(&kept, &dir).is_err() {
        let _ = fs::remove_dir_all(&kept);
    }
    dir
}

/// A Python base image's Kyma runtime packages (cheroot serves both Python servers; bottle or
/// Flask is the framework), installed from the same pinned wheels into a directory shared by
/// every test, for `PYTHONPATH`, as they sit in the image's dist-packages. The host's CPython
/// imports the pure-Python parts; a compiled module built for another version has a
/// pure-Python fallback in every package the servers load.
fn python_packages(runtime: &str) -> PathBuf {
    let (_, lock) = kiln::base::recipe::embedded(runtime).unwrap();
    let key: String = lock.first.wheel.iter().map(|w| w.sha256.clone()).collect();
    shared_install("python-packages", &key, move |http, cache, into| {
        Box::pin(async move {
            kiln::base::packages::install_wheels(&http, &cache, &lock.first.wheel, &into)
                .await
                .unwrap();
        })
    })
}

fn interpreter(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from)
}

/// The port in the start line, "… listening on 0.0.0.0:<port>, …".
fn listening_port(stdout: &str) -> Option<u16> {
    let rest = &stdout[stdout.find("listening on 0.0.0.0:")? + "listening on 0.0.0.0:".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// An HTTP client for the server: no proxy, a 30 s timeout.
pub fn client() -> Client {
    Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Calls `path` with `method` and an optional JSON body; returns status and parsed JSON.
pub async fn call_json(server: &Server, method: Method, path: &str, body: Option<Value>) -> Value {
    let mut req = client().request(method, server.url(path));
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{path}");
    assert_json(&resp);
    resp.json().await.unwrap()
}

/// The value of header `name` (empty when absent).
pub fn header<'a>(resp: &'a reqwest::Response, name: &str) -> &'a str {
    resp.headers().get(name).map_or("", |v| v.to_str().unwrap())
}

/// Asserts the answer is JSON.
pub fn assert_json(resp: &reqwest::Response) {
    let ctype = header(resp, "content-type");
    assert!(
        ctype.starts_with("application/json"),
        "content type {ctype:?}"
    );
}

/// The value of the sample `name` (no labels, or the exact label set) in a metrics page.
pub fn sample(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| {
            line.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no sample {name} in:\n{metrics}"))
}

/// The server's `/metrics` page, asserting it is Prometheus text.
pub async fn metrics(server: &Server) -> String {
    let resp = client().get(server.url("/metrics")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let ctype = header(&resp, "content-type");
    assert!(
        ctype.starts_with("text/plain; version=0.0.4"),
        "content type {ctype:?}"
    );
    resp.text().await.unwrap()
}
