//! A real CNCF distribution registry (`/usr/bin/docker-registry`) per test, on 127.0.0.1.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::{base64, free_port, harness_dir, require_tool, run};

/// User name accepted by the `BasicTls` registry and the token server.
pub const USER: &str = "testuser";
/// Password accepted by the `BasicTls` registry and the token server.
pub const PASSWORD: &str = "testpass";
/// A user the token server gives pull access only.
pub const PULL_USER: &str = "puller";
/// The pull-only user's password.
pub const PULL_PASSWORD: &str = "pullpass";
/// `service` of the token-auth registry (the JWT audience).
pub const TOKEN_SERVICE: &str = "kiln-test-registry";
/// `issuer` of the token-auth registry.
pub const TOKEN_ISSUER: &str = "kiln-test-issuer";

const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How a test registry is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistryKind {
    /// Plain HTTP, anonymous access.
    Plain,
    /// HTTPS (test CA + leaf certificate) with htpasswd basic auth.
    BasicTls,
    /// Plain HTTP with Bearer-token auth from `tokensrv.py`.
    Token,
}

/// A running registry; the process (and any token server) is killed on drop.
pub struct Registry {
    kind: RegistryKind,
    port: u16,
    dir: TempDir,
    child: Option<Child>,
    token_server: Option<Child>,
    ca_pem: Option<PathBuf>,
    data: PathBuf,
}

/// Makes a test CA and a server certificate for 127.0.0.1 and localhost signed by it, with
/// openssl (TEST-ENV.md §1): `dir/ca.pem`, `dir/cert.pem`, `dir/key.pem`. Returns the CA.
pub fn make_test_tls(dir: &Path) -> PathBuf {
    require_tool("openssl", "openssl");
    fs::create_dir_all(dir).expect("mkdir tls");
    let openssl = |args: &str| {
        run(Command::new("openssl")
            .args(args.split(' '))
            .current_dir(dir));
    };
    openssl(concat!(
        "req -x509 -newkey rsa:2048 -nodes -days 30 -keyout ca.key -out ca.pem",
        " -subj /CN=kiln-test-ca"
    ));
    openssl("req -newkey rsa:2048 -nodes -keyout key.pem -out srv.csr -subj /CN=127.0.0.1");
    fs::write(
        dir.join("srv.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write srv.ext");
    openssl(concat!(
        "x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30",
        " -extfile srv.ext -out cert.pem"
    ));
    dir.join("ca.pem")
}

impl Registry {
    /// Starts a registry of the given kind and waits until `GET /v2/` answers (200 or 401).
    pub fn start(kind: RegistryKind) -> Registry {
        Registry::start_with(kind, None)
    }

    /// A `Token` registry whose token server issues tokens that live `ttl_secs` seconds.
    pub fn start_token_ttl(ttl_secs: u32) -> Registry {
        Registry::start_with(RegistryKind::Token, Some(ttl_secs))
    }

    fn start_with(kind: RegistryKind, token_ttl: Option<u32>) -> Registry {
        require_tool("docker-registry", "docker-registry");
        require_tool("curl", "curl");
        let dir = tempfile::Builder::new()
            .prefix("kiln-registry-")
            .tempdir()
            .expect("tempdir");
        let data = dir.path().join("data");
        let mut reg = Registry {
            kind,
            port: 0,
            dir,
            child: None,
            token_server: None,
            ca_pem: None,
            data,
        };
        for sub in ["data", "certs", "docker"] {
            fs::create_dir_all(reg.dir.path().join(sub)).expect("mkdir");
        }
        let mut extra = String::new();
        if kind == RegistryKind::BasicTls {
            let tls = reg.make_tls();
            extra.push_str(&format!(
                "  tls:\n    certificate: '{}'\n    key: '{}'\n",
                tls.join("cert.pem").display(),
                tls.join("key.pem").display()
            ));
            let htpasswd = reg.make_htpasswd();
            extra.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: basic-realm\n    path: '{}'\n",
                htpasswd.display()
            ));
        }
        if kind == RegistryKind::Token {
            let (tport, cert) = reg.start_token_server(token_ttl);
            extra.push_str(&format!(
                "auth:\n  token:\n    realm: 'http://127.0.0.1:{tport}/token'\n    \
                 service: {TOKEN_SERVICE}\n    issuer: {TOKEN_ISSUER}\n    \
                 rootcertbundle: '{}'\n",
                cert.display()
            ));
        }
        for attempt in 0..5 {
            reg.port = free_port();
            let config = reg.dir.path().join("config.yml");
            fs::write(&config, reg.config_yaml(&extra)).expect("write config.yml");
            reg.spawn();
            match reg.wait_ready() {
                Ok(()) => {
                    reg.write_docker_config();
                    return reg;
                }
                Err(e) if attempt < 4 && reg.log().contains("address already in use") => {
                    eprintln!("registry port {} taken, retrying: {e}", reg.port);
                    reg.kill_registry();
                }
                Err(e) => panic!("{e}\n--- registry log ---\n{}", reg.log()),
            }
        }
        unreachable!("registry start loop always returns or panics")
    }

    fn spawn(&mut self) {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("open registry log");
        let child = Command::new("/usr/bin/docker-registry")
            .arg("serve")
            .arg(self.dir.path().join("config.yml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("spawn docker-registry");
        self.child = Some(child);
    }

    /// The registry's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("registry child").id()
    }

    /// Kills the registry process (SIGKILL: no graceful shutdown) and starts it again on the
    /// same port and storage.
    pub fn restart(&mut self) {
        self.kill_registry();
        for _ in 0..50 {
            self.spawn();
            match self.wait_ready() {
                Ok(()) => return,
                // The old socket may linger for a moment.
                Err(_) if self.log().contains("address already in use") => {
                    self.kill_registry();
                    sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("{e}\n--- registry log ---\n{}", self.log()),
            }
        }
        panic!("the registry did not come back on port {}", self.port);
    }

    /// For a `Plain` registry: `None` when `repo:tag` does not exist, else the digests of the
    /// blobs its manifest lists (config and layers) that the registry cannot serve. Read
    /// straight from the registry, so a fault-injecting proxy does not hide anything.
    pub fn missing_blobs(&self, repo: &str, tag: &str) -> Option<Vec<String>> {
        let out = run(Command::new("curl")
            .args(["-s", "-w", "\n%{http_code}", "-H"])
            .arg(
                "Accept: application/vnd.oci.image.manifest.v1+json, \
                 application/vnd.docker.distribution.manifest.v2+json",
            )
            .arg(format!("{}/v2/{repo}/manifests/{tag}", self.url())));
        let (body, status) = out.trim_end().rsplit_once('\n').expect("curl -w status");
        match status {
            "404" => return None,
            "200" => {}
            other => panic!("GET manifest {repo}:{tag} returned {other}: {body}"),
        }
        let manifest: serde_json::Value = serde_json::from_str(body).expect("manifest JSON");
        let mut digests = vec![
            manifest["config"]["digest"]
                .as_str()
                .expect("config")
                .to_string(),
        ];
        for layer in manifest["layers"].as_array().expect("layers") {
            digests.push(layer["digest"].as_str().expect("digest").to_string());
        }
        Some(
            digests
                .into_iter()
                .filter(|d| self.get_status(&format!("/v2/{repo}/blobs/{d}"), false) != 200)
                .collect(),
        )
    }

    /// Upload sessions the registry holds open for `repo`: the directories of its `_uploads`
    /// that still have their `startedat` file (a cancelled session loses it and its data; the
    /// registry leaves only the empty hash state behind).
    pub fn open_uploads(&self, repo: &str) -> Vec<String> {
        let dir = self
            .storage_root()
            .join("docker/registry/v2/repositories")
            .join(repo)
            .join("_uploads");
        fs::read_dir(dir)
            .map(|d| {
                d.filter_map(|e| {
                    let e = e.ok()?;
                    e.path()
                        .join("startedat")
                        .exists()
                        .then(|| e.file_name().to_string_lossy().into_owned())
                })
                .collect()
            })
            .unwrap_or_default()
    }

    fn config_yaml(&self, extra: &str) -> String {
        format!(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\n\
             storage:\n  filesystem:\n    rootdirectory: '{}'\n  delete:\n    enabled: true\n\
             http:\n  addr: 127.0.0.1:{}\n  secret: kiln-test-secret-{}\n{extra}",
            self.storage_root().display(),
            self.port,
            self.port
        )
    }

    fn make_tls(&mut self) -> PathBuf {
        let tls = self.dir.path().join("tls");
        let ca = make_test_tls(&tls);
        fs::copy(&ca, self.cert_dir().join("ca.crt")).expect("copy ca.crt");
        self.ca_pem = Some(ca);
        tls
    }

    fn make_htpasswd(&self) -> PathBuf {
        require_tool("htpasswd", "apache2-utils");
        let path = self.dir.path().join("htpasswd");
        run(Command::new("htpasswd")
            .arg("-Bbc")
            .arg(&path)
            .arg(USER)
            .arg(PASSWORD));
        path
    }

    /// Starts tokensrv.py, returning its port and the signing certificate (rootcertbundle).
    fn start_token_server(&mut self, ttl: Option<u32>) -> (u16, PathBuf) {
        require_tool("python3", "python3-cryptography");
        let state = self.dir.path().join("token");
        fs::create_dir_all(&state).expect("mkdir token");
        let log = File::create(state.join("tokensrv.log")).expect("create tokensrv.log");
        let mut cmd = Command::new("python3");
        if let Some(ttl) = ttl {
            cmd.env("KILN_TOKEN_TTL", ttl.to_string());
        }
        let child = cmd
            .arg(harness_dir().join("tokensrv.py"))
            .arg(&state)
            .args([TOKEN_ISSUER, USER, PASSWORD, PULL_USER, PULL_PASSWORD])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("spawn tokensrv.py");
        self.token_server = Some(child);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(port) = fs::read_to_string(state.join("port")) {
                let port = port.trim().parse().expect("token server port");
                return (port, state.join("signcert.pem"));
            }
            let exited = self
                .token_server
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() || Instant::now() > deadline {
                panic!(
                    "token server did not start ({exited:?})\n{}",
                    fs::read_to_string(state.join("tokensrv.log")).unwrap_or_default()
                );
            }
            sleep(Duration::from_millis(20));
        }
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let status = self.get_status("/v2/", false);
            if status == 200 || status == 401 {
                return Ok(());
            }
            let child = self.child.as_mut().expect("registry child");
            if let Ok(Some(exit)) = child.try_wait() {
                return Err(format!("docker-registry exited early with {exit}"));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "docker-registry on port {} did not answer GET /v2/ within {READY_TIMEOUT:?} \
                     (last HTTP status {status})",
                    self.port
                ));
            }
            sleep(Duration::from_millis(50));
        }
    }

    /// HTTP status of `GET <url()><path>` via curl (0 if no answer). With `basic_auth`, sends
    /// the test credentials as Basic auth (meaningful for `BasicTls` only).
    pub fn get_status(&self, path: &str, basic_auth: bool) -> u16 {
        let mut cmd = Command::new("curl");
        cmd.args("-s -o /dev/null -w %{http_code} --max-time 5".split(' '));
        if let Some(ca) = &self.ca_pem {
            cmd.arg("--cacert").arg(ca);
        }
        if basic_auth {
            cmd.arg("-u").arg(format!("{USER}:{PASSWORD}"));
        }
        cmd.arg(format!("{}{path}", self.url()));
        let out = cmd.stdin(Stdio::null()).output().expect("run curl");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or(0)
    }

    fn kill_registry(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn write_docker_config(&self) {
        let auths = match self.credentials() {
            Some((u, p)) => format!(
                "{{\"{}\": {{\"auth\": \"{}\"}}}}",
                self.host(),
                base64(format!("{u}:{p}").as_bytes())
            ),
            None => "{}".to_string(),
        };
        let config = format!("{{\"auths\": {auths}}}\n");
        fs::write(self.dir.path().join("docker/config.json"), config).expect("write config.json");
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("registry.log")
    }

    /// A directory holding `ca.crt` (the test CA, for `BasicTls`), for `--cert-dir` flags.
    pub fn cert_dir(&self) -> PathBuf {
        self.dir.path().join("certs")
    }

    /// The kind this registry was started as.
    pub fn kind(&self) -> RegistryKind {
        self.kind
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The port the registry listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT` or `https://…` for `BasicTls`.
    pub fn url(&self) -> String {
        let scheme = if self.kind == RegistryKind::BasicTls {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.host())
    }

    /// `127.0.0.1:PORT/<repo_and_tag>`.
    pub fn reference(&self, repo_and_tag: &str) -> String {
        format!("{}/{repo_and_tag}", self.host())
    }

    /// PEM of the test CA that signed the registry certificate (`BasicTls` only).
    pub fn ca_pem(&self) -> Option<&Path> {
        self.ca_pem.as_deref()
    }

    /// `(user, password)` for `BasicTls` and `Token`, `None` for `Plain`.
    pub fn credentials(&self) -> Option<(&'static str, &'static str)> {
        match self.kind {
            RegistryKind::Plain => None,
            RegistryKind::BasicTls | RegistryKind::Token => Some((USER, PASSWORD)),
        }
    }

    /// The registry's filesystem storage root.
    pub fn storage_root(&self) -> &Path {
        &self.data
    }

    /// Every blob digest (`sha256:<hex>`) present in the registry's storage: layers, configs,
    /// and also manifests and indexes (distribution stores those as blobs too).
    pub fn stored_blobs(&self) -> BTreeSet<String> {
        let root = self.storage_root().join("docker/registry/v2/blobs/sha256");
        let mut out = BTreeSet::new();
        let Ok(prefixes) = fs::read_dir(&root) else {
            return out;
        };
        for prefix in prefixes.flatten() {
            let Ok(blobs) = fs::read_dir(prefix.path()) else {
                continue;
            };
            for blob in blobs.flatten() {
                if blob.path().join("data").is_file() {
                    out.insert(format!("sha256:{}", blob.file_name().to_string_lossy()));
                }
            }
        }
        out
    }

    /// The registry's stdout+stderr (application and access log) so far, followed by the
    /// token server's log if any.
    pub fn log(&self) -> String {
        let mut log = fs::read_to_string(self.log_path()).unwrap_or_default();
        if let Ok(t) = fs::read_to_string(self.dir.path().join("token/tokensrv.log")) {
            log.push_str("\n--- token server log ---\n");
            log.push_str(&t);
        }
        log
    }

    /// Requests seen by the registry, as `"METHOD /path STATUS"` lines parsed from its access
    /// log (the line may appear a few milliseconds after the client got its response).
    pub fn access_log(&self) -> Vec<String> {
        let log = fs::read_to_string(self.log_path()).unwrap_or_default();
        log.lines()
            .filter_map(|line| {
                let (_, rest) = line.split_once("] \"")?;
                let (request, rest) = rest.split_once("\" ")?;
                let mut req = request.split(' ');
                let (method, path) = (req.next()?, req.next()?);
                let status = rest.split(' ').next()?;
                Some(format!("{method} {path} {status}"))
            })
            .collect()
    }

    /// The access log up to now, complete: a marker request is sent and the log is read
    /// until the marker's line is there (the registry writes a line a few milliseconds after
    /// its response), so no request made before this call is missing. The marker is not
    /// returned.
    pub fn settled_access_log(&self) -> Vec<String> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_nanos();
        let marker = format!("/v2/kiln-log-marker-{nanos}/tags/list");
        assert_ne!(
            self.get_status(&marker, false),
            0,
            "the registry did not answer"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.access_log();
            if let Some(at) = log.iter().position(|l| l.contains(&marker)) {
                return log[..at].to_vec();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the marker request never reached the access log: {log:?}"
            );
            sleep(Duration::from_millis(10));
        }
    }

    /// The requests logged after the first `before` lines of the settled access log (a
    /// length [`Registry::settled_access_log`] returned), the harness's markers left out.
    pub fn access_log_since(&self, before: usize) -> Vec<String> {
        self.settled_access_log()[before..]
            .iter()
            .filter(|l| !l.contains("kiln-log-marker"))
            .cloned()
            .collect()
    }

    /// A directory holding a docker `config.json` with `auths` for this host (base64
    /// `user:pass`), or `{"auths": {}}` for `Plain`. Use as `DOCKER_CONFIG`.
    pub fn docker_config_dir(&self) -> PathBuf {
        self.dir.path().join("docker")
    }

    /// Scopes of every request the token server received (one entry per request, scopes
    /// joined by a space; empty when none), in order. Empty for non-`Token` registries.
    pub fn token_requests(&self) -> Vec<String> {
        self.token_log().into_iter().map(|(_, s)| s).collect()
    }

    /// Like [`Registry::token_requests`], but only the requests that got a token (HTTP 200).
    pub fn token_grants(&self) -> Vec<String> {
        self.token_log()
            .into_iter()
            .filter(|(st, _)| *st == 200)
            .map(|(_, s)| s)
            .collect()
    }

    /// The grant of every token request, in order: `basic`, `password`, `refresh_token` or
    /// `none`.
    pub fn token_grant_types(&self) -> Vec<String> {
        let text = fs::read_to_string(self.dir.path().join("token/grants.log")).unwrap_or_default();
        text.lines().map(str::to_string).collect()
    }

    /// The refresh token (docker config `identitytoken`) the token server accepts.
    pub fn refresh_token(&self) -> String {
        format!("refresh-{PASSWORD}")
    }

    fn token_log(&self) -> Vec<(u16, String)> {
        let path = self.dir.path().join("token/requests.log");
        let text = fs::read_to_string(path).unwrap_or_default();
        text.lines()
            .filter_map(|l| {
                let (status, scopes) = l.split_once('\t')?;
                Some((status.parse().ok()?, scopes.to_string()))
            })
            .collect()
    }

    /// The token endpoint (`http://127.0.0.1:TPORT/token`), for `Token` registries.
    pub fn token_realm(&self) -> Option<String> {
        let port = fs::read_to_string(self.dir.path().join("token/port")).ok()?;
        Some(format!("http://127.0.0.1:{}/token", port.trim()))
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.kill_registry();
        if let Some(mut child) = self.token_server.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The access-log lines of requests that change the registry.
pub fn writes(log: &[String]) -> Vec<&String> {
    log.iter()
        .filter(|l| {
            ["PUT ", "POST ", "PATCH ", "DELETE "]
                .iter()
                .any(|m| l.starts_with(m))
        })
        .collect()
}

/// `PUT http://HOST/v2/REPO/manifests/REFERENCE` of `bytes` as `media_type`, as any client of
/// a plain-HTTP registry may; asserts the registry took it (201).
pub fn put_manifest(host: &str, repo: &str, reference: &str, media_type: &str, bytes: &[u8]) {
    let file = tempfile::NamedTempFile::new().expect("a scratch file");
    fs::write(file.path(), bytes).expect("writing the manifest");
    let status = super::run_bytes(
        Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PUT"])
            .args(["-H", &format!("Content-Type: {media_type}")])
            .arg("--data-binary")
            .arg(format!("@{}", file.path().display()))
            .arg(format!("http://{host}/v2/{repo}/manifests/{reference}")),
    );
    assert_eq!(
        String::from_utf8_lossy(&status),
        "201",
        "PUT {repo}:{reference}"
    );
}
