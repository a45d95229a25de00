//! Classifying failures for [`super::Error`]: the OCI error envelope, the kind of a transport
//! failure and the advice attached to it, and the text shown for them. It names no other file
//! of the registry client: the error type builds on it.

use std::fmt;

use serde::Deserialize;
use url::Url;

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

/// What kind of network failure a [`super::Error::Transport`] was.
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

pub(crate) fn codes(errors: &[ErrorInfo]) -> String {
    let mut out = String::new();
    for (i, e) in errors.iter().enumerate() {
        out.push_str(if i == 0 { ": " } else { "; " });
        out.push_str(&printable(&e.code));
        if !e.message.is_empty() {
            out.push_str(&format!(" ({})", printable(&e.message)));
        }
    }
    out
}

/// A registry's text as kiln prints it: control characters (a terminal's escape sequences,
/// line breaks that would fake log lines) shown escaped.
fn printable(text: &str) -> String {
    text.chars()
        .flat_map(|c| match c.is_control() {
            true => c.escape_default().collect::<Vec<_>>(),
            false => vec![c],
        })
        .collect()
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

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(kind_text(*self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registrys_error_text_cannot_drive_the_terminal_or_fake_a_line() {
        let errors = [ErrorInfo {
            code: "DENIED\u{1b}[2J".into(),
            message: "no\nkiln: build succeeded".into(),
            detail: None,
        }];
        let shown = codes(&errors);
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert_eq!(shown, ": DENIED\\u{1b}[2J (no\\nkiln: build succeeded)");
    }
}
