//! Classifying failures for [`Error`]: the OCI error envelope, the kind of a transport
//! failure and the advice attached to it, and the text shown for them.

use std::fmt;

use reqwest::Method;
use serde::Deserialize;
use url::Url;

use super::error::Error;
use crate::redact::redact_url;

/// One entry of the OCI distribution error envelope `{"errors":[{code,message,detail}]}`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct ErrorInfo {
    /// Machine-readable code such as `MANIFEST_UNKNOWN` or `DENIED`.
    pub code: String,
    /// Human-readable message.
    #[serde(default)]
    pub message: String,
    /// Unstructured extra data (never shown in `Display`).
    #[serde(default)]
    pub detail: Option<serde_json::Value>,
}

/// What kind of network failure a [`Error::Transport`] was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportKind {
    /// Nothing listens on the port.
    Refused,
    /// Connecting or waiting for the response took too long.
    Timeout,
    /// The connection broke while in use.
    Reset,
    /// The TLS handshake failed (plain-HTTP server or untrusted certificate).
    Tls,
    /// Anything else (DNS, unreachable network, invalid response).
    Other,
}

/// Advice attached to a transport error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hint {
    /// No advice.
    None,
    /// TLS was tried against what looks like a plain-HTTP registry.
    InsecureRegistry,
    /// The certificate is not trusted: a private CA is needed.
    RegistryCa,
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

/// Whether an HTTP status is worth retrying.
pub(crate) fn is_retryable_status(status: u16) -> bool {
    matches!(status, 408 | 429) || ((500..=599).contains(&status) && !matches!(status, 501 | 505))
}

/// Parses an OCI error envelope; anything else yields no entries.
pub(crate) fn parse_envelope(body: &[u8]) -> Vec<ErrorInfo> {
    #[derive(Deserialize)]
    struct Envelope {
        #[serde(default)]
        errors: Vec<ErrorInfo>,
    }
    serde_json::from_slice::<Envelope>(body)
        .map(|e| e.errors)
        .unwrap_or_default()
}

/// `host[:port]` of a URL.
pub(crate) fn host_port(url: &Url) -> String {
    let host = url.host_str().unwrap_or("");
    match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
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

pub(crate) fn codes(errors: &[ErrorInfo]) -> String {
    let mut out = String::new();
    for (i, e) in errors.iter().enumerate() {
        out.push_str(if i == 0 { ": " } else { "; " });
        out.push_str(&e.code);
        if !e.message.is_empty() {
            out.push_str(&format!(" ({})", e.message));
        }
    }
    out
}

pub(crate) fn kind_text(kind: TransportKind) -> &'static str {
    match kind {
        TransportKind::Refused => "connection refused",
        TransportKind::Timeout => "timed out (--registry-timeout sets the limit)",
        TransportKind::Reset => "connection lost",
        TransportKind::Tls => "TLS handshake failed",
        TransportKind::Other => "connection failed",
    }
}

pub(crate) fn hint_text(hint: Hint, host: &str) -> String {
    match hint {
        Hint::None => String::new(),
        Hint::InsecureRegistry => {
            format!("; if {host} serves plain HTTP, pass --insecure-registry {host}")
        }
        Hint::RegistryCa => {
            format!("; if {host} uses a private CA, pass its certificate with --registry-ca")
        }
    }
}

pub(crate) fn unauthorized(err: &Error) -> String {
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

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(kind_text(*self))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

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
