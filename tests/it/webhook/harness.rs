//! The harness: a test CA issuing leaf certificates (openssl), a running `kiln webhook`
//! process, and a raw TLS exchange for what reqwest cannot send.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{free_port, require_tool, run};

/// A test CA that issues leaf certificates for 127.0.0.1.
pub struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    pub fn new() -> Pki {
        require_tool("openssl", "openssl");
        let pki = Pki {
            dir: tempfile::tempdir().unwrap(),
        };
        pki.openssl(
            "req -x509 -newkey rsa:2048 -nodes -days 30 -keyout ca.key -out ca.pem \
             -subj /CN=kiln-webhook-test-ca",
        );
        fs::write(
            pki.path("leaf.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        pki
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn openssl(&self, args: &str) -> String {
        run(Command::new("openssl")
            .args(args.split_whitespace())
            .current_dir(self.dir.path()))
    }

    /// Issues `<name>.crt` / `<name>.key` with common name `cn` (RSA, or EC when `ec`).
    pub fn leaf(&self, name: &str, cn: &str, ec: bool) -> (PathBuf, PathBuf) {
        let key = if ec {
            "ec -pkeyopt ec_paramgen_curve:P-256"
        } else {
            "rsa:2048"
        };
        self.openssl(&format!(
            "req -newkey {key} -nodes -keyout {name}.key -out {name}.csr -subj /CN={cn}"
        ));
        self.openssl(&format!(
            "x509 -req -in {name}.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
             -extfile leaf.ext -out {name}.crt"
        ));
        (
            self.path(&format!("{name}.crt")),
            self.path(&format!("{name}.key")),
        )
    }

    /// Issues `<name>.crt` / `<name>.key` (EC) for the DNS names `dns` (as cert-manager would
    /// for a webhook Service, `SERVICE.NAMESPACE.svc`) and 127.0.0.1.
    pub fn leaf_for_dns(&self, name: &str, dns: &[&str]) -> (PathBuf, PathBuf) {
        // And 127.0.0.1, which the harness's own readiness probe connects to.
        let mut sans: Vec<String> = dns.iter().map(|d| format!("DNS:{d}")).collect();
        sans.push("IP:127.0.0.1".into());
        fs::write(
            self.path(&format!("{name}.ext")),
            format!(
                "subjectAltName={}\nbasicConstraints=CA:FALSE\n\
                 keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
                sans.join(",")
            ),
        )
        .unwrap();
        self.openssl(&format!(
            "req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout {name}.key \
             -out {name}.csr -subj /CN={}",
            dns[0]
        ));
        self.openssl(&format!(
            "x509 -req -in {name}.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
             -extfile {name}.ext -out {name}.crt"
        ));
        (
            self.path(&format!("{name}.crt")),
            self.path(&format!("{name}.key")),
        )
    }

    /// The DER bytes of a PEM certificate, as openssl converts them.
    pub fn der(&self, cert: &Path) -> Vec<u8> {
        let out = Command::new("openssl")
            .args(["x509", "-outform", "DER", "-in"])
            .arg(cert)
            .output()
            .unwrap();
        assert!(out.status.success());
        out.stdout
    }
}

/// Polls `/readyz` until it answers (or the process exits, or 30 s pass).
async fn wait_ready(child: &mut Child, client: &reqwest::Client, port: u16) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Err(format!("kiln webhook exited early: {status}"));
        }
        let url = format!("https://127.0.0.1:{port}/readyz");
        if let Ok(r) = client.get(url).send().await
            && r.status().is_success()
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err("kiln webhook did not answer /readyz within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Replaces `dest` with `src`'s content atomically, as a Secret volume update does.
pub fn replace_file(src: &Path, dest: &Path) {
    let tmp = dest.with_extension("tmp");
    fs::copy(src, &tmp).unwrap();
    fs::rename(&tmp, dest).unwrap();
}

/// A running `kiln webhook`.
pub struct Webhook {
    pub child: Child,
    pub port: u16,
    log: PathBuf,
    pub client: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Webhook {
    /// Starts kiln on copies of `cert`/`key` (returned: the files it watches).
    pub async fn start(pki: &Pki, cert: &Path, key: &Path) -> (Webhook, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let (tls_cert, tls_key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        fs::copy(cert, &tls_cert).unwrap();
        fs::copy(key, &tls_key).unwrap();
        let ca = reqwest::Certificate::from_pem(&fs::read(pki.path("ca.pem")).unwrap()).unwrap();
        let client = reqwest::Client::builder()
            .tls_certs_only([ca])
            .tls_info(true)
            .pool_max_idle_per_host(0)
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        for attempt in 0.. {
            let port = free_port();
            let log = dir.path().join(format!("webhook-{attempt}.log"));
            let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
                .args(["--log-format", "json", "webhook", "--address", "127.0.0.1"])
                .args(["--port", &port.to_string()])
                .arg("--tls-cert")
                .arg(&tls_cert)
                .arg("--tls-key")
                .arg(&tls_key)
                .env("RUST_LOG", "info")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(fs::File::create(&log).unwrap())
                .spawn()
                .expect("spawn kiln webhook");
            let text = || fs::read_to_string(&log).unwrap_or_default();
            match wait_ready(&mut child, &client, port).await {
                Ok(()) => {
                    let hook = Webhook {
                        child,
                        port,
                        log,
                        client,
                        _dir: dir,
                    };
                    return (hook, tls_cert, tls_key);
                }
                Err(e) if attempt < 3 && text().contains("Address already in use") => {
                    eprintln!("port {port} taken, retrying: {e}");
                    let _ = child.kill();
                    let _ = child.wait();
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("{e}\n--- webhook log ---\n{}", text());
                }
            }
        }
        unreachable!()
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }

    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// POSTs a review; returns its `response`.
    pub async fn review(&self, path: &str, review: &Value) -> Value {
        let r = self
            .client
            .post(self.url(path))
            .json(review)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}: {}", r.text().await.unwrap());
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(body["kind"], "AdmissionReview");
        assert_eq!(body["response"]["uid"], review["request"]["uid"]);
        body["response"].clone()
    }

    /// The DER of the certificate the server presents on a new connection.
    pub async fn presented(&self) -> Vec<u8> {
        let r = self.client.get(self.url("/healthz")).send().await.unwrap();
        let info = r
            .extensions()
            .get::<reqwest::tls::TlsInfo>()
            .expect("TLS info");
        info.peer_certificate()
            .expect("a peer certificate")
            .to_vec()
    }

    /// SIGTERM, then the exit status.
    pub fn stop(&mut self) -> ExitStatus {
        run(Command::new("kill").args(["-TERM", &self.child.id().to_string()]));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "no exit 10 s after SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sends `request` over a TLS connection trusting only the test CA; returns everything the
/// server wrote until it closed the connection.
pub async fn raw_exchange(pki: &Pki, port: u16, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tls = connect(pki, port).await;
    tls.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "no answer within 10 s");
    String::from_utf8_lossy(&answer).into_owned()
}

/// A TLS connection to the webhook on `port`, trusting only the test CA.
pub async fn connect(
    pki: &Pki,
    port: u16,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    let ca = rustls::pki_types::CertificateDer::from_pem_file(pki.path("ca.pem")).unwrap();
    roots.add(ca).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    connector.connect(name, tcp).await.unwrap()
}
