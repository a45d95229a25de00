//! The admission webhook for Functions: AdmissionReview v1 over HTTPS. `POST /mutate` returns
//! the defaulting patch ([`crate::controller::defaults`]) and the validator's warnings;
//! `POST /validate` allows or denies with the validator's messages
//! ([`crate::controller::validate`]); `GET /healthz` and `GET /readyz` answer `ok`. The
//! serving certificate is reloaded when its files change, so cert-manager can rotate it
//! without a restart. One log line per review; graceful shutdown when `shutdown` resolves.

mod review;
mod server;
mod shape;
mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use review::{Endpoint, Record, Reviewer};
pub use server::serve;
pub use tls::{CertFiles, fingerprint};

use super::defaults::DefaultProfiles;

/// Request bodies above this are refused (413); etcd's object limit is about 1.5 MiB.
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// How the webhook serves.
#[derive(Clone, Debug)]
pub struct Options {
    /// Address and port to listen on.
    pub address: SocketAddr,
    /// PEM certificate chain, leaf first.
    pub tls_cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub tls_key: PathBuf,
    /// How often the certificate files are checked for changes.
    pub reload_interval: Duration,
    /// The controller's default profiles, whose limits complete explicit requests.
    pub profiles: DefaultProfiles,
    /// The Secrets the controller keeps (push and pull), which no Function may read.
    pub managed_secrets: Vec<String>,
}

/// What went wrong serving or reviewing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A certificate or key file could not be read.
    #[error("reading {}", path.display())]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file is not PEM, or holds no usable key.
    #[error("parsing {} as PEM", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// The certificate file holds no certificate.
    #[error("{} holds no PEM CERTIFICATE block", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// The key is not usable, or does not belong to the certificate.
    #[error("loading the key {} for the certificate {}", key.display(), cert.display())]
    KeyPair {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// Why.
        #[source]
        source: rustls::Error,
    },
    /// The key is another certificate's (caught mid-rotation, or the wrong files).
    #[error(
        "the key {} does not belong to the certificate {}; give the key the certificate was \
         issued for",
        key.display(),
        cert.display()
    )]
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
    /// The TLS configuration could not be built.
    #[error("configuring TLS")]
    Tls(#[source] rustls::Error),
    /// The address could not be bound.
    #[error("listening on {address}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The server failed.
    #[error("serving admission reviews")]
    Serve(#[source] std::io::Error),
    /// The body is not JSON of an AdmissionReview.
    #[error("malformed AdmissionReview")]
    MalformedReview {
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// The body is another kind or version.
    #[error(
        "expected an admission.k8s.io/v1 AdmissionReview, got {kind:?} of apiVersion \
         {api_version:?}; set admissionReviewVersions: [v1] in the webhook configuration"
    )]
    WrongReviewVersion {
        /// `apiVersion` sent.
        api_version: String,
        /// `kind` sent.
        kind: String,
    },
    /// The review has no `request`.
    #[error("the AdmissionReview has no request")]
    NoRequest,
}

impl Error {
    /// Whether the user must change the input (files, flags) rather than retry.
    pub fn is_input_error(&self) -> bool {
        matches!(
            self,
            Error::ReadFile { .. }
                | Error::Pem { .. }
                | Error::NoCertificate { .. }
                | Error::KeyPair { .. }
                | Error::KeyMismatch { .. }
        )
    }
}

/// `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
