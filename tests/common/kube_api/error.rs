//! The fake API server's one error type, and its rendering as a Kubernetes `Status` object
//! with the HTTP code, `reason` and `details` kube-apiserver would send (kube-client turns
//! these into `kube::Error::Api`). Messages follow kube-apiserver's wording.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::kinds::Kind;

/// One field error in an Invalid (422) answer: `details.causes[]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Cause {
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueNotSupported`, …
    pub reason: &'static str,
    /// The field path, e.g. `spec.source`.
    pub field: String,
    /// What is wrong, e.g. `Required value` or `Invalid value: "object": <rule message>`.
    pub message: String,
}

impl Cause {
    /// A cause with `reason` at `field`.
    pub fn new(reason: &'static str, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            reason,
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Everything a request can fail with.
#[derive(Debug)]
pub enum Error {
    /// A path that names no known resource.
    UnknownPath {
        /// The request path.
        path: String,
    },
    /// The object does not exist.
    NotFound {
        /// Its kind.
        kind: &'static Kind,
        /// Its name.
        name: String,
    },
    /// A create of a name that exists.
    AlreadyExists {
        /// Its kind.
        kind: &'static Kind,
        /// Its name.
        name: String,
    },
    /// A write carrying a stale `resourceVersion` (or a failed precondition).
    Conflict {
        /// Its kind.
        kind: &'static Kind,
        /// Its name.
        name: String,
    },
    /// The object fails validation.
    Invalid {
        /// Its kind.
        kind: &'static Kind,
        /// Its name.
        name: String,
        /// The field errors.
        causes: Vec<Cause>,
    },
    /// A malformed request (body, selector, mismatched name or namespace…).
    BadRequest {
        /// kube-apiserver's message.
        message: String,
    },
    /// A verb the resource does not support.
    MethodNotAllowed {
        /// The HTTP method.
        method: String,
    },
    /// A PATCH with a content type that is no patch kind.
    UnsupportedMediaType {
        /// The content type sent.
        content_type: String,
    },
    /// The server itself failed (e.g. it could not load a CRD).
    Internal {
        /// What went wrong.
        message: String,
    },
    /// Any other Status: 401, 403, an admission webhook's answer…
    Status {
        /// The HTTP code.
        code: u16,
        /// The `reason`.
        reason: &'static str,
        /// The `message`.
        message: String,
        /// The `details`, if any.
        details: Option<Value>,
    },
    /// A failure injected by a test (`KubeApi::fail_next`).
    Injected {
        /// The HTTP status to answer.
        code: u16,
    },
}

/// The `reason` kube-apiserver sends with an HTTP status code.
pub fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        504 => "Timeout",
        503 => "ServiceUnavailable",
        _ => "InternalError",
    }
}

impl Error {
    /// The HTTP status code.
    pub fn code(&self) -> u16 {
        match self {
            Self::UnknownPath { .. } | Self::NotFound { .. } => 404,
            Self::AlreadyExists { .. } | Self::Conflict { .. } => 409,
            Self::Invalid { .. } => 422,
            Self::BadRequest { .. } => 400,
            Self::MethodNotAllowed { .. } => 405,
            Self::UnsupportedMediaType { .. } => 415,
            Self::Internal { .. } => 500,
            Self::Status { code, .. } | Self::Injected { code } => *code,
        }
    }

    /// The `Status` object kube-apiserver would answer.
    pub fn to_status(&self) -> Value {
        let code = self.code();
        let (reason, message, details) = match self {
            Self::UnknownPath { .. } => (
                "NotFound",
                "the server could not find the requested resource".to_string(),
                None,
            ),
            Self::NotFound { kind, name } => (
                "NotFound",
                format!("{} \"{name}\" not found", kind.qualified_plural()),
                Some(details(kind.plural, kind, name, &[])),
            ),
            Self::AlreadyExists { kind, name } => (
                "AlreadyExists",
                format!("{} \"{name}\" already exists", kind.qualified_plural()),
                Some(details(kind.plural, kind, name, &[])),
            ),
            Self::Conflict { kind, name } => (
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": the object has been \
                     modified; please apply your changes to the latest version and try again",
                    kind.qualified_plural()
                ),
                Some(details(kind.plural, kind, name, &[])),
            ),
            Self::Invalid { kind, name, causes } => (
                "Invalid",
                invalid_message(kind, name, causes),
                Some(details(kind.kind, kind, name, causes)),
            ),
            Self::BadRequest { message } => ("BadRequest", message.clone(), None),
            Self::MethodNotAllowed { method } => (
                "MethodNotAllowed",
                format!(
                    "the server does not allow this method on the requested resource: {method}"
                ),
                None,
            ),
            Self::UnsupportedMediaType { content_type } => (
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format - accepted media types \
                     include: application/json-patch+json, application/merge-patch+json, \
                     application/apply-patch+yaml, application/strategic-merge-patch+json \
                     (got {content_type:?})"
                ),
                None,
            ),
            Self::Internal { message } => ("InternalError", message.clone(), None),
            Self::Status {
                reason,
                message,
                details,
                ..
            } => (*reason, message.clone(), details.clone()),
            Self::Injected { code } => (
                reason_for(*code),
                format!("injected failure ({code})"),
                None,
            ),
        };
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        });
        if let Some(details) = details {
            status["details"] = details;
        }
        status
    }
}

/// `Function.serverless.kyma-project.io "x" is invalid: spec.a: …` (one cause) or
/// `… is invalid: [spec.a: …, spec.b: …]`, as kube-apiserver's `NewInvalid`.
fn invalid_message(kind: &Kind, name: &str, causes: &[Cause]) -> String {
    let parts: Vec<String> = causes
        .iter()
        .map(|c| format!("{}: {}", c.field, c.message))
        .collect();
    let list = match parts.as_slice() {
        [one] => one.clone(),
        _ => format!("[{}]", parts.join(", ")),
    };
    format!("{} \"{name}\" is invalid: {list}", kind.qualified_kind())
}

/// `details`: `kind` is the resource (plural) for NotFound/AlreadyExists/Conflict and the kind
/// for Invalid, as kube-apiserver's `NewNotFound` and `NewInvalid` fill it.
fn details(kind_name: &str, kind: &Kind, name: &str, causes: &[Cause]) -> Value {
    let mut details = json!({ "name": name, "kind": kind_name });
    if !kind.group.is_empty() {
        details["group"] = json!(kind.group);
    }
    if !causes.is_empty() {
        details["causes"] = causes
            .iter()
            .map(|c| json!({ "reason": c.reason, "message": c.message, "field": c.field }))
            .collect();
    }
    details
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (code, axum::Json(self.to_status())).into_response()
    }
}

/// The harness's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
