//! `kiln webhook`: flags, their validation into [`webhook::Options`], and serving until
//! SIGTERM or SIGINT.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::anyhow;
use clap::Args;

use super::Failure;
use crate::controller::defaults::DefaultProfiles;
use crate::controller::presets::{self, BUILD_PRESETS, FUNCTION_PRESETS, Preset};
use crate::controller::webhook::{self, Options};

/// How often the certificate files are checked.
const RELOAD_INTERVAL: Duration = Duration::from_secs(2);

/// Flags of `kiln webhook`.
#[derive(Debug, Args)]
#[command(after_help = "\
Endpoints (HTTPS only; AdmissionReview admission.k8s.io/v1 in and out):
  POST /mutate    defaulting: a JSON patch (patchType JSONPatch) plus warnings, e.g. for a
                  Kyma runtime name that kiln builds on another runtime
  POST /validate  allowed, or denied with code 422, reason Invalid and a message naming every
                  field that is wrong
  GET  /healthz, GET /readyz   liveness and readiness

How the API server reaches it: a MutatingWebhookConfiguration and a
ValidatingWebhookConfiguration for functions.serverless.kyma-project.io (operations CREATE
and UPDATE, admissionReviewVersions [v1], sideEffects None) whose clientConfig names a
Service in front of this process (path /mutate or /validate) and carries, in caBundle, the
CA that signed --tls-cert. The certificate must be valid for the Service's DNS name
(SERVICE.NAMESPACE.svc). cert-manager can issue it and inject the caBundle; the files are
re-read every 2 seconds and a rotated certificate is served to new connections without a
restart (a broken new pair is logged and the old one kept).

Other kinds, subresources, DELETE and CONNECT are allowed untouched. An update that leaves
spec unchanged is not blocked by problems the stored Function already had (they come back as
warnings). Hostile clients are bounded: at most 512 connections, a request head within 10 s
and a whole request within 10 s, a Content-Length required and at most 3 MiB, bodies in
flight within a budget (503 past it), and a review refused unparsed when any array or object
has over 10,000 elements or it nests over 64 deep; fields no Function has are denied.
SIGTERM or SIGINT stops accepting connections and lets reviews in flight finish.

Example:
  kiln webhook --tls-cert /tls/tls.crt --tls-key /tls/tls.key --log-format json")]
pub struct WebhookArgs {
    /// PEM certificate chain the server presents, leaf first.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: PathBuf,
    /// PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE")]
    pub tls_key: PathBuf,
    /// Port to listen on.
    #[arg(long, default_value_t = 8443, value_parser = clap::value_parser!(u16).range(1..))]
    pub port: u16,
    /// Address to listen on: all addresses by default; one address, such as the Pod's IP
    /// from the downward API (`status.podIP`), to serve only there.
    #[arg(
        long,
        default_value = "0.0.0.0",
        value_name = "IP",
        env = "KILN_LISTEN_IP"
    )]
    pub address: IpAddr,
    /// Function profile (XS, S, M, L, XL) whose limits complete explicit requests that have
    /// no limits; use the controller's default.
    #[arg(long, default_value = presets::DEFAULT_FUNCTION_PROFILE, value_name = "PROFILE")]
    pub default_function_profile: String,
    /// Build profile (local-dev, slow, normal, fast), likewise for build resources.
    #[arg(long, default_value = presets::DEFAULT_BUILD_PROFILE, value_name = "PROFILE")]
    pub default_build_profile: String,
    /// The controller's push Secret (its --registry-secret): Functions that mount it or read
    /// it into env are refused.
    #[arg(long, default_value = "kiln-registry", value_name = "NAME")]
    pub registry_secret: String,
    /// The controller's pull Secret (its --pull-secret), kept in every Function's namespace:
    /// refused likewise.
    #[arg(long, value_name = "NAME", env = "KILN_PULL_SECRET")]
    pub pull_secret: Option<String>,
    /// The controller's cache signing Secret (its --cache-signing-secret): refused likewise.
    #[arg(long, default_value = "kiln-cache-signing", value_name = "NAME")]
    pub cache_signing_secret: String,
    /// The controller's image signing Secret (its --image-signing-secret), if any: refused
    /// likewise.
    #[arg(long, value_name = "NAME", env = "KILN_IMAGE_SIGNING_SECRET")]
    pub image_signing_secret: Option<String>,
}

/// Serves until SIGTERM or SIGINT.
pub(super) async fn run(args: WebhookArgs) -> Result<String, Failure> {
    let options = validate(args).map_err(Failure::Usage)?;
    match webhook::serve(options, shutdown_signal()).await {
        Ok(()) => Ok(String::new()),
        Err(e) => {
            let input = e.is_input_error();
            let e = anyhow::Error::new(e).context("running the admission webhook");
            Err(if input {
                Failure::Usage(e)
            } else {
                Failure::Build(e)
            })
        }
    }
}

fn validate(args: WebhookArgs) -> anyhow::Result<Options> {
    let profile = |table: &[Preset], name: &str, flag: &str| {
        presets::find(table, name).ok_or_else(|| {
            let known: Vec<&str> = table.iter().map(|p| p.name).collect();
            anyhow!("invalid {flag} {name:?}: use one of {}", known.join(", "))
        })
    };
    Ok(Options {
        address: SocketAddr::new(args.address, args.port),
        tls_cert: args.tls_cert,
        tls_key: args.tls_key,
        reload_interval: RELOAD_INTERVAL,
        profiles: DefaultProfiles {
            function: profile(
                &FUNCTION_PRESETS,
                &args.default_function_profile,
                "--default-function-profile",
            )?,
            build: profile(
                &BUILD_PRESETS,
                &args.default_build_profile,
                "--default-build-profile",
            )?,
        },
        managed_secrets: [args.registry_secret, args.cache_signing_secret]
            .into_iter()
            .chain(args.pull_secret.filter(|s| !s.is_empty()))
            .chain(args.image_signing_secret.filter(|s| !s.is_empty()))
            .collect(),
    })
}

/// Resolves on SIGTERM (Kubernetes stopping the Pod) or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            tracing::warn!("cannot watch SIGTERM ({e}); stopping on SIGINT only");
            let _interrupted = tokio::signal::ctrl_c().await;
        }
    }
    tracing::info!("shutting down: finishing the reviews in flight");
}
