//! PATCH bodies by content type: JSON merge patch (RFC 7386), strategic merge patch
//! (**treated as a merge patch**: lists are replaced whole rather than merged by their patch
//! merge key, which is what kube-apiserver does only for types without such keys), JSON
//! patch (RFC 6902), and server-side apply (see `apply.rs`).

use serde_json::Value;

use super::error::Error;

/// The kinds of PATCH, by `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// `application/merge-patch+json`.
    Merge,
    /// `application/strategic-merge-patch+json` (applied as a merge patch).
    Strategic,
    /// `application/json-patch+json`.
    Json,
    /// `application/apply-patch+yaml` (server-side apply).
    Apply,
}

impl PatchKind {
    /// The patch kind of a `Content-Type` header (parameters such as `charset` ignored).
    ///
    /// # Errors
    /// [`Error::UnsupportedMediaType`] for anything else.
    pub fn from_content_type(content_type: &str) -> Result<Self, Error> {
        let mime = content_type.split(';').next().unwrap_or_default().trim();
        match mime {
            "application/merge-patch+json" => Ok(Self::Merge),
            "application/strategic-merge-patch+json" => Ok(Self::Strategic),
            "application/json-patch+json" => Ok(Self::Json),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Ok(Self::Apply),
            _ => Err(Error::UnsupportedMediaType {
                content_type: content_type.to_string(),
            }),
        }
    }
}

/// Parses a JSON request body.
///
/// # Errors
/// [`Error::BadRequest`] when it is not JSON.
pub fn parse_json(body: &[u8]) -> Result<Value, Error> {
    serde_json::from_slice(body).map_err(|e| Error::BadRequest {
        message: format!("the body of the request could not be decoded: {e}"),
    })
}

/// Parses an apply body: YAML, of which JSON is a subset.
///
/// # Errors
/// [`Error::BadRequest`] when it is neither, or not an object.
pub fn parse_apply(body: &[u8]) -> Result<Value, Error> {
    let value: Value = serde_yaml::from_slice(body).map_err(|e| Error::BadRequest {
        message: format!("error decoding YAML: {e}"),
    })?;
    if value.is_object() {
        Ok(value)
    } else {
        Err(Error::BadRequest {
            message: "the apply configuration must be an object".to_string(),
        })
    }
}

/// Applies a merge, strategic or JSON patch to `target`, returning the patched object.
///
/// # Errors
/// [`Error::BadRequest`] for a body that does not decode; a JSON patch whose operation fails
/// (a `test` that does not hold, a path that does not exist) is a 422 Invalid with no causes,
/// as kube-apiserver answers it.
pub fn apply_patch(
    kind: PatchKind,
    target: &Value,
    body: &[u8],
    invalid: impl FnOnce(String) -> Error,
) -> Result<Value, Error> {
    let mut patched = target.clone();
    match kind {
        PatchKind::Merge | PatchKind::Strategic => {
            let patch = parse_json(body)?;
            if !patch.is_object() {
                return Err(Error::BadRequest {
                    message: "a merge patch must be a JSON object".to_string(),
                });
            }
            json_patch::merge(&mut patched, &patch);
        }
        PatchKind::Json => {
            let patch: json_patch::Patch =
                serde_json::from_slice(body).map_err(|e| Error::BadRequest {
                    message: format!("the JSON patch could not be decoded: {e}"),
                })?;
            json_patch::patch(&mut patched, &patch).map_err(|e| invalid(e.to_string()))?;
        }
        PatchKind::Apply => {
            return Err(Error::Internal {
                message: "server-side apply is no plain patch (apply.rs handles it)".into(),
            });
        }
    }
    Ok(patched)
}
