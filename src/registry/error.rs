//! Registry errors: structured, redacted and retry-aware (after go-containerregistry's
//! `transport/error.go`). Every variant carries data, never credentials: URLs are redacted
//! before they get here and `Authorization` headers are never captured.

use std::path::PathBuf;
use std::time::Duration;

use reqwest::Method;
use url::Url;

pub use super::failure::{ErrorInfo, Hint, TransportKind};
use super::failure::{codes, hint_text, host_port, is_retryable_status, kind_text};
use crate::oci::Digest;
use crate::redact::redact_url;

/// `Result` with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong talking to a registry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A malformed image reference.
    #[error("invalid image reference {input:?}: {problem}")]
    InvalidReference {
        /// The text given.
        input: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A request the registry redirected was refused by the host it went to; no registry
    /// credential is sent there.
    #[error(
        "{method} {url} was redirected to {host}, which answered {status}; kiln sends the \
         registry's credentials only to the registry itself, so the registry's storage must \
         accept its redirect without them"
    )]
    RedirectRefused {
        /// Request method.
        method: Method,
        /// Redacted request URL.
        url: String,
        /// `host[:port]` of the host that refused.
        host: String,
        /// Its status (401 or 403).
        status: u16,
    },
    /// An unexpected HTTP status.
    #[error("{method} {url} returned {status}{}", codes(.errors))]
    Status {
        /// Request method.
        method: Method,
        /// Redacted request URL.
        url: String,
        /// HTTP status code.
        status: u16,
        /// The parsed OCI error envelope (empty when the body had none).
        errors: Vec<ErrorInfo>,
        /// How long the registry asked to wait (`Retry-After` in seconds), if it did.
        retry_after: Option<std::time::Duration>,
    },
    /// A manifest, blob or repository that does not exist.
    #[error("{what} not found ({method} {url} returned 404{})", codes(.errors))]
    NotFound {
        /// What was looked for (`manifest <reference>`, `blob <digest> in <repo>`).
        what: String,
        /// Request method.
        method: Method,
        /// Redacted request URL.
        url: String,
        /// The parsed OCI error envelope.
        errors: Vec<ErrorInfo>,
    },
    /// The registry (or its token service) refused our identity or its permissions.
    #[error("{}", unauthorized(self))]
    Unauthorized {
        /// The registry, as named in the reference.
        registry: String,
        /// Request method.
        method: Method,
        /// Redacted request URL.
        url: String,
        /// 401 or 403.
        status: u16,
        /// The parsed OCI error envelope.
        errors: Vec<ErrorInfo>,
        /// Whether any credentials were sent.
        had_credentials: bool,
    },
    /// Content whose bytes do not hash to the digest that names them.
    #[error("{what} failed verification: expected digest {expected}, got {actual}")]
    DigestMismatch {
        /// What was verified.
        what: String,
        /// The digest it should have.
        expected: Digest,
        /// The digest of the bytes received or held.
        actual: Digest,
    },
    /// Content of the wrong length.
    #[error("{what} has the wrong size: expected {expected} bytes, got {actual}")]
    SizeMismatch {
        /// What was measured.
        what: String,
        /// The size it should have.
        expected: u64,
        /// The size seen (possibly a lower bound when reading stopped early).
        actual: u64,
    },
    /// A response body above the limit kiln accepts for it.
    #[error("{what} is larger than the {limit}-byte limit")]
    TooLarge {
        /// What was being read.
        what: String,
        /// The limit in bytes.
        limit: u64,
    },
    /// The request did not get an HTTP response.
    #[error("cannot reach {host} ({method} {url}): \
        {}{}", kind_text(*.kind), hint_text(*.hint, .host))]
    Transport {
        /// `host[:port]` that was contacted.
        host: String,
        /// Request method.
        method: Method,
        /// Redacted request URL.
        url: String,
        /// The kind of failure.
        kind: TransportKind,
        /// Advice for the user.
        hint: Hint,
        /// The underlying error (its URL removed).
        #[source]
        source: reqwest::Error,
    },
    /// A response body stopped arriving.
    #[error("{method} {url} stalled: no data for {after:?}")]
    Stalled {
        /// Request method.
        method: Method,
        /// Redacted request URL.
        url: String,
        /// How long nothing arrived.
        after: Duration,
    },
    /// A response that breaks the distribution protocol.
    #[error("{method} {url}: {problem}")]
    Protocol {
        /// Request method.
        method: Method,
        /// Redacted request URL.
        url: String,
        /// What is wrong.
        problem: &'static str,
    },
    /// A docker credential helper failed.
    #[error("getting credentials for {registry} from docker-credential-{helper}: {problem}")]
    CredentialHelper {
        /// Helper name (the part after `docker-credential-`).
        helper: String,
        /// The registry asked about.
        registry: String,
        /// What went wrong (exit status and the first line of its error output).
        problem: String,
    },
    /// A docker config or `.dockerconfigjson` file could not be read.
    #[error("reading credentials file {path}")]
    CredentialsRead {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A docker config or `.dockerconfigjson` file is not valid.
    #[error(
        "parsing credentials file {path}: {kind} at line {line}, column {column} (a docker \
         config.json: {{\"auths\": {{\"HOST\": {{\"auth\": \"base64(user:password)\"}}}}}})"
    )]
    CredentialsParse {
        /// The file.
        path: PathBuf,
        /// Where the fault is.
        line: usize,
        /// Where on the line.
        column: usize,
        /// What kind of fault (never the value: it may be a secret).
        kind: &'static str,
    },
    /// An `auths` entry that cannot be decoded.
    #[error("decoding the auth entry for {key} in {path}: {problem}")]
    CredentialsEntry {
        /// The file.
        path: PathBuf,
        /// The `auths` key.
        key: String,
        /// What is wrong.
        problem: &'static str,
    },
    /// An extra CA bundle without usable certificates.
    #[error("loading extra CA certificate bundle #{index}")]
    ExtraCa {
        /// Position of the bundle in `ClientConfig::extra_ca_pem`.
        index: usize,
        /// The parse error, if any (`None` when the bundle held no certificate).
        #[source]
        source: Option<reqwest::Error>,
    },
    /// The HTTP client could not be built.
    #[error("building the HTTP client")]
    HttpClient {
        /// The builder error.
        #[source]
        source: reqwest::Error,
    },
    /// The TLS client (built on the first https request) could not be built.
    #[error("setting up TLS (the platform's trusted certificates and --registry-ca)")]
    TlsSetup {
        /// The builder error.
        #[source]
        source: std::sync::Arc<reqwest::Error>,
    },
    /// Local file I/O around a transfer.
    #[error(transparent)]
    Io(#[from] crate::io_error::IoError),
}

impl Error {
    /// Whether repeating the request may succeed: connection resets, timeouts, stalls, 408, 429
    /// and 5xx (except 501 and 505). Never authentication, validation or digest errors.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Status { status, .. } if is_retryable_status(*status) => true,
            // A manifest naming a blob the registry does not see yet (see `put_manifest`).
            Error::Status { .. } => self.is_blob_unknown(),
            Error::Transport { kind, .. } => {
                matches!(kind, TransportKind::Timeout | TransportKind::Reset)
            }
            Error::Stalled { .. } => true,
            _ => false,
        }
    }

    /// Whether a manifest was refused for naming a blob the repository does not have.
    pub fn is_blob_unknown(&self) -> bool {
        matches!(
            self,
            Error::Status {
                errors,
                ..
            } if errors.iter().any(|e| e.code == "MANIFEST_BLOB_UNKNOWN"),
        )
    }

    /// The wait the registry asked for with `Retry-After`, if any.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Error::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The HTTP status, for variants that have one.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Status { status, .. } | Error::Unauthorized { status, .. } => Some(*status),
            Error::NotFound { .. } => Some(404),
            _ => None,
        }
    }

    /// The OCI error codes the registry returned, if any.
    pub fn codes(&self) -> Vec<&str> {
        match self {
            Error::Status { errors, .. }
            | Error::NotFound { errors, .. }
            | Error::Unauthorized { errors, .. } => {
                errors.iter().map(|e| e.code.as_str()).collect()
            }
            _ => Vec::new(),
        }
    }
}

impl Error {
    /// Builds a [`Error::Transport`] from a reqwest error, classifying it and stripping the
    /// URL reqwest would otherwise print.
    pub(crate) fn transport(method: &Method, url: &Url, err: reqwest::Error) -> Error {
        let host = host_port(url);
        let chain = error_chain(&err);
        let https = url.scheme() == "https";
        let tls_words = [
            "tls",
            "handshake",
            "corrupt message",
            "invalidcontenttype",
            "certificate",
        ];
        let kind = if err.is_timeout() {
            TransportKind::Timeout
        } else if chain.contains("connection refused") {
            TransportKind::Refused
        } else if https && tls_words.iter().any(|w| chain.contains(w)) {
            TransportKind::Tls
        } else if err.is_connect() {
            TransportKind::Other
        } else {
            // The request was sent, then the connection failed (reset, closed, broken pipe).
            TransportKind::Reset
        };
        let hint = match kind {
            TransportKind::Tls if chain.contains("certificate") => Hint::RegistryCa,
            TransportKind::Tls => Hint::InsecureRegistry,
            _ => Hint::None,
        };
        Error::Transport {
            host,
            method: method.clone(),
            url: redact_url(url),
            kind,
            hint,
            source: err.without_url(),
        }
    }
}

fn unauthorized(err: &Error) -> String {
    let Error::Unauthorized {
        registry,
        method,
        url,
        status,
        errors,
        had_credentials,
    } = err
    else {
        return String::new();
    };
    let what = format!("{method} {url} returned {status}{}", codes(errors));
    if *had_credentials {
        format!(
            "access to {registry} was refused ({what}); check the credentials and permissions \
             given with --registry-auth or by docker login {registry}"
        )
    } else {
        format!(
            "access to {registry} needs credentials ({what}); none were found: pass \
             --registry-auth or run docker login {registry}"
        )
    }
}

fn error_chain(err: &reqwest::Error) -> String {
    let mut text = String::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        text.push_str(&e.to_string().to_lowercase());
        text.push_str(" | ");
        cur = e.source();
    }
    text
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::registry::failure::parse_envelope;

    fn status(code: u16) -> Error {
        Error::Status {
            method: Method::GET,
            url: "u".into(),
            status: code,
            errors: vec![],
            retry_after: None,
        }
    }

    #[test]
    fn server_errors_and_throttling_are_retryable_but_client_errors_are_not() {
        for code in [408, 429, 500, 502, 503, 504] {
            assert!(status(code).is_retryable(), "{code}");
        }
        for code in [400, 401, 403, 404, 405, 413, 416, 501, 505] {
            assert!(!status(code).is_retryable(), "{code}");
        }
        let denied = Error::Unauthorized {
            registry: "r".into(),
            method: Method::GET,
            url: "u".into(),
            status: 401,
            errors: vec![],
            had_credentials: true,
        };
        assert!(!denied.is_retryable());
        let d = Digest::of(b"a");
        let mismatch = Error::DigestMismatch {
            what: "x".into(),
            expected: d.clone(),
            actual: d.clone(),
        };
        assert!(!mismatch.is_retryable());
        let stalled = Error::Stalled {
            method: Method::GET,
            url: "u".into(),
            after: Duration::ZERO,
        };
        assert!(stalled.is_retryable());
    }

    #[test]
    fn unauthorized_says_what_to_do() {
        let e = Error::Unauthorized {
            registry: "reg.example".into(),
            method: Method::GET,
            url: "https://reg.example/v2/".into(),
            status: 401,
            errors: vec![],
            had_credentials: false,
        };
        let text = e.to_string();
        assert!(text.contains("--registry-auth") && text.contains("docker login reg.example"));
    }

    #[test]
    fn envelope_codes_are_parsed_and_shown() {
        let body = b"{\"errors\":[{\"code\":\"MANIFEST_UNKNOWN\",\"message\":\"manifest \
            unknown\",\"detail\":{\"Tag\":\"v1\"}},{\"code\":\"DENIED\"}]}";
        let errors = parse_envelope(body);
        assert_eq!(errors.len(), 2);
        let e = Error::NotFound {
            what: "manifest r/a:v1".into(),
            method: Method::GET,
            url: "http://r/v2/a/manifests/v1".into(),
            errors,
        };
        assert_eq!(
            e.to_string(),
            "manifest r/a:v1 not found (GET http://r/v2/a/manifests/v1 returned 404: \
             MANIFEST_UNKNOWN (manifest unknown); DENIED)"
        );
        assert_eq!(e.codes(), ["MANIFEST_UNKNOWN", "DENIED"]);
        assert!(parse_envelope(b"<html>").is_empty());
    }
}
