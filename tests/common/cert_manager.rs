//! What cert-manager does for deploy/, done by a test thread against the API server (as a
//! controller would, through a `kube::Client`): every `Certificate` whose Issuer is
//! `selfSigned` gets its Secret (`kubernetes.io/tls`: `tls.crt`, `tls.key`, and `ca.crt` =
//! the certificate itself, as cert-manager's SelfSigned issuer writes it) issued with openssl
//! for its `dnsNames`, and is marked Ready; and the CA injector copies a Certificate's CA into
//! every webhook configuration annotated `cert-manager.io/inject-ca-from: NS/NAME`.
//! Not modelled: renewal, other issuer kinds, Certificate spec changes after issuance.

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use base64::Engine;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

const MANAGER: &str = "cert-manager";

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// The running stand-in; it stops when dropped.
pub struct CertManager {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl CertManager {
    /// Starts issuing and injecting every 200 ms through `client`.
    pub fn start(client: kube::Client) -> CertManager {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the cert-manager stand-in");
            let mut issued = BTreeSet::new();
            while !flag.load(Ordering::SeqCst) {
                if let Err(e) = runtime.block_on(pass(&client, &mut issued)) {
                    eprintln!("cert-manager stand-in: {e}");
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        CertManager {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for CertManager {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn pass(client: &kube::Client, issued: &mut BTreeSet<String>) -> Result<(), String> {
    let certificates = resource("cert-manager.io", "v1", "Certificate", "certificates");
    let issuers = resource("cert-manager.io", "v1", "Issuer", "issuers");
    let secrets = resource("", "v1", "Secret", "secrets");
    let all = Api::<DynamicObject>::all_with(client.clone(), &certificates);
    let list = match all.list(&ListParams::default()).await {
        Ok(list) => list,
        // cert-manager's CRDs are not installed here: nothing to do.
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(e.to_string()),
    };
    let apply = PatchParams::apply(MANAGER).force();
    for cert in list {
        let ns = cert.metadata.namespace.clone().unwrap_or_default();
        let name = cert.metadata.name.clone().unwrap_or_default();
        let spec = &cert.data["spec"];
        let secret_name = spec["secretName"].as_str().unwrap_or_default().to_string();
        let id = format!("{ns}/{name}");
        if issued.contains(&id) {
            continue;
        }
        let issuer_name = spec["issuerRef"]["name"].as_str().unwrap_or_default();
        let issuer = Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &issuers)
            .get_opt(issuer_name)
            .await
            .map_err(|e| e.to_string())?;
        let Some(issuer) = issuer.filter(|i| i.data["spec"]["selfSigned"].is_object()) else {
            continue;
        };
        let _ = issuer;
        let dns: Vec<String> = spec["dnsNames"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d.as_str().map(str::to_string))
            .collect();
        let (crt, key) = self_signed(&dns)?;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": secret_name, "namespace": ns, "annotations": {
                "cert-manager.io/certificate-name": name, "cert-manager.io/\
                    issuer-name": issuer_name,
                "cert-manager.io/issuer-kind": "Issuer"}},
            "data": {"tls.crt": b64(&crt), "tls.key": b64(&key), "ca.crt": b64(&crt)}});
        Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &secrets)
            .patch(&secret_name, &apply, &Patch::Apply(&secret))
            .await
            .map_err(|e| format!("writing Secret {ns}/{secret_name}: {e}"))?;
        let status = json!({"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
            "metadata": {"name": name, "namespace": ns},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Ready",
                "message": "Certificate is up to date and has not expired"}]}});
        Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &certificates)
            .patch_status(&name, &apply, &Patch::Apply(&status))
            .await
            .map_err(|e| format!("writing the status of Certificate {id}: {e}"))?;
        issued.insert(id);
    }
    inject(client, &apply).await
}

/// The CA injector: `caBundle` of every webhook of an annotated configuration.
async fn inject(client: &kube::Client, apply: &PatchParams) -> Result<(), String> {
    let secrets = resource("", "v1", "Secret", "secrets");
    let certificates = resource("cert-manager.io", "v1", "Certificate", "certificates");
    for (kind, plural) in [
        (
            "MutatingWebhookConfiguration",
            "mutatingwebhookconfigurations",
        ),
        (
            "ValidatingWebhookConfiguration",
            "validatingwebhookconfigurations",
        ),
    ] {
        let configs = resource("admissionregistration.k8s.io", "v1", kind, plural);
        let api = Api::<DynamicObject>::all_with(client.clone(), &configs);
        for config in api
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
        {
            let annotations = config.metadata.annotations.clone().unwrap_or_default();
            let Some((ns, cert)) = annotations
                .get("cert-manager.io/inject-ca-from")
                .and_then(|v| v.split_once('/'))
            else {
                continue;
            };
            let certificate =
                Api::<DynamicObject>::namespaced_with(client.clone(), ns, &certificates)
                    .get_opt(cert)
                    .await
                    .map_err(|e| e.to_string())?;
            let Some(secret_name) = certificate
                .as_ref()
                .and_then(|c| c.data["spec"]["secretName"].as_str().map(str::to_string))
            else {
                continue;
            };
            let secret = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &secrets)
                .get_opt(&secret_name)
                .await
                .map_err(|e| e.to_string())?;
            let Some(ca) =
                secret.and_then(|s| s.data["data"]["ca.crt"].as_str().map(str::to_string))
            else {
                continue;
            };
            let name = config.metadata.name.clone().unwrap_or_default();
            let hooks: Vec<Value> = config.data["webhooks"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|w| json!({"name": w["name"], "clientConfig": {"caBundle": ca}}))
                .collect();
            let current: Vec<&Value> = config.data["webhooks"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|w| &w["clientConfig"]["caBundle"])
                .collect();
            if current.iter().all(|c| c.as_str() == Some(ca.as_str())) {
                continue;
            }
            let patch = json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                "metadata": {"name": name}, "webhooks": hooks});
            api.patch(&name, apply, &Patch::Apply(&patch))
                .await
                .map_err(|e| format!("injecting the CA into {kind} {name}: {e}"))?;
        }
    }
    Ok(())
}

/// A self-signed serving certificate for `dns` (EC P-256): (certificate PEM, key PEM).
fn self_signed(dns: &[String]) -> Result<(String, String), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let sans: Vec<String> = dns.iter().map(|d| format!("DNS:{d}")).collect();
    let subject = format!("/CN={}", dns.first().map_or("cert", String::as_str));
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args([
            "-nodes", "-days", "90", "-keyout", "tls.key", "-out", "tls.crt", "-subj",
        ])
        .arg(&subject)
        .arg("-addext")
        .arg(format!("subjectAltName={}", sans.join(",")))
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .args([
            "-addext",
            "keyUsage=critical,digitalSignature,keyEncipherment",
        ])
        .args(["-addext", "extendedKeyUsage=serverAuth"])
        .current_dir(dir.path())
        .output()
        .map_err(|e| format!("running openssl: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).map_err(|e| e.to_string());
    Ok((read("tls.crt")?, read("tls.key")?))
}
