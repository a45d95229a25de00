//! The fake API server's certificates, made once per test process with the `openssl` CLI
//! (EC P-256 keys: fast): a cluster CA, and a serving certificate for `127.0.0.1`,
//! `localhost` and `kubernetes.default.svc` that it signs. In-cluster clients (the test
//! kubelet's Pods) trust the CA through `kube-root-ca.crt`, as in a cluster.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The CA and the serving certificate, as PEM files.
#[derive(Debug)]
pub struct Pki {
    /// The CA certificate.
    pub ca_pem: String,
    /// The serving certificate chain (leaf).
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
    _dir: tempfile::TempDir,
}

fn openssl(dir: &Path, args: &str) {
    let out = Command::new("openssl")
        .args(args.split_whitespace())
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("running openssl (Debian package openssl): {e}"));
    assert!(
        out.status.success(),
        "openssl {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The process's PKI, made on first use.
pub fn pki() -> &'static Pki {
    static PKI: OnceLock<Pki> = OnceLock::new();
    PKI.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir for the API server's PKI");
        let d = dir.path();
        openssl(
            d,
            "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
             -keyout ca.key -out ca.pem -subj /CN=kiln-test-kubernetes-ca",
        );
        openssl(
            d,
            "req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout tls.key \
             -out tls.csr -subj /CN=kube-apiserver",
        );
        std::fs::write(
            d.join("tls.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,\
             DNS:kubernetes.default,DNS:kubernetes.default.svc\n\
             basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n\
             extendedKeyUsage=serverAuth\n",
        )
        .expect("writing the certificate extensions");
        openssl(
            d,
            "x509 -req -in tls.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
             -extfile tls.ext -out tls.crt",
        );
        Pki {
            ca_pem: std::fs::read_to_string(d.join("ca.pem")).expect("the CA certificate"),
            cert: d.join("tls.crt"),
            key: d.join("tls.key"),
            _dir: dir,
        }
    })
}
