//! Manifests and indexes: `GET`, `HEAD` and `PUT /v2/<repo>/manifests/<tag|digest>`. Fetched
//! bytes are verified against the reference's digest (or `Docker-Content-Digest`) and kept
//! exactly as received.

use reqwest::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode};

use super::client::Client;
use super::error::{Error, Result};
use super::reference::Reference;
use super::retry::retry;
use super::scope::Scope;
use super::transport::{Call, Payload, header, not_found, read_capped, status_error};
use tracing::debug;

use crate::oci::{Descriptor, Digest, Document, MediaType, sniff_media_type};

/// Largest manifest or index accepted (the distribution default limit is 4 MiB too).
pub const MANIFEST_LIMIT: u64 = 4 * 1024 * 1024;
/// The header registries use to report a content digest.
pub(crate) const DOCKER_CONTENT_DIGEST: HeaderName =
    HeaderName::from_static("docker-content-digest");

/// The media types asked for when the caller passes none: OCI and Docker manifests and indexes.
pub const DEFAULT_MANIFEST_TYPES: [MediaType; 4] = [
    MediaType::OciManifest,
    MediaType::OciIndex,
    MediaType::DockerManifest,
    MediaType::DockerManifestList,
];

impl Client {
    /// Fetches the manifest or index `reference` names (by digest when it has one, else by
    /// tag, else `latest`). `accept` lists the media types wanted; empty means
    /// [`DEFAULT_MANIFEST_TYPES`]. The bytes are verified against the reference's digest, else
    /// against `Docker-Content-Digest` when the registry sends it.
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::DigestMismatch`], [`Error::TooLarge`] (over
    /// [`MANIFEST_LIMIT`]), plus the usual request errors.
    pub async fn get_manifest(
        &self,
        reference: &Reference,
        accept: &[MediaType],
    ) -> Result<Document> {
        let Some(cache) = &self.inner.documents else {
            return self.fetch_manifest(reference, accept).await;
        };
        let pinned = match &reference.digest {
            Some(_) => reference.clone(),
            None if !cache.resolves_tags() => {
                let doc = self.fetch_manifest(reference, accept).await?;
                cache.put(&doc);
                return Ok(doc);
            }
            None => match self.head_accepting(reference, accept).await {
                Ok(Some(found)) => reference.with_digest(found.digest),
                Ok(None) => {
                    return Err(Error::NotFound {
                        what: what(reference),
                        method: Method::HEAD,
                        url: reference.to_string(),
                        errors: Vec::new(),
                    });
                }
                // A registry that refuses HEAD (405, 400, 501): the plain GET. Anything else
                // (already retried) is the answer; a GET would only retry it again.
                Err(Error::Status { status, .. }) if matches!(status, 400 | 405 | 501) => {
                    debug!(reference = %reference, status, "manifest HEAD refused; fetching it");
                    return self.fetch_manifest(reference, accept).await;
                }
                Err(e) => return Err(e),
            },
        };
        let accept = if accept.is_empty() {
            &DEFAULT_MANIFEST_TYPES[..]
        } else {
            accept
        };
        let wanted = |doc: &Document| accept.contains(&doc.media_type);
        if let Some(digest) = &pinned.digest
            && let Some(doc) = cache.get(digest).filter(wanted)
        {
            debug!(reference = %reference, "manifest from the document cache");
            return Ok(doc);
        }
        let doc = self.fetch_manifest(&pinned, accept).await?;
        cache.put(&doc);
        Ok(doc)
    }

    /// [`Client::get_manifest`] without the document cache: always a `GET`.
    async fn fetch_manifest(
        &self,
        reference: &Reference,
        accept: &[MediaType],
    ) -> Result<Document> {
        let reg = self.inner.registry(&reference.registry)?;
        let url = reg.url(&manifest_path(reference));
        let call = Call::new(Method::GET, url, vec![Scope::pull(&reference.repository)])
            .header(ACCEPT, accept_header(accept));
        let resp = self.inner.send(&reg, &call).await?;
        match resp.status() {
            StatusCode::OK => {}
            StatusCode::NOT_FOUND => return Err(not_found(&call, resp, what(reference)).await),
            _ => return Err(status_error(&call, resp).await),
        }
        let content_type = header(&resp, &CONTENT_TYPE).map(str::to_string);
        let header_digest =
            header(&resp, &DOCKER_CONTENT_DIGEST).and_then(|d| d.parse::<Digest>().ok());
        let target = (&call.method, &call.url);
        let bytes = read_capped(resp, MANIFEST_LIMIT, &what(reference), target).await?;
        let actual = Digest::of(&bytes);
        if let Some(expected) = reference.digest.clone().or(header_digest)
            && expected != actual
        {
            return Err(Error::DigestMismatch {
                what: what(reference),
                expected,
                actual,
            });
        }
        let media_type =
            media_type(content_type.as_deref(), &bytes).ok_or_else(|| Error::Protocol {
                method: call.method.clone(),
                url: call.shown_url(),
                problem: "the manifest has no media type (no Content-Type and no mediaType field)",
            })?;
        Ok(Document {
            media_type,
            digest: actual,
            bytes,
        })
    }

    /// The descriptor of the manifest `reference` names, or `None` when it does not exist.
    /// Falls back to a verified `GET` when the registry omits `Docker-Content-Digest`.
    ///
    /// # Errors
    /// [`Error::DigestMismatch`] when the registry reports another digest than the reference
    /// pins, plus the usual request errors.
    pub async fn head_manifest(&self, reference: &Reference) -> Result<Option<Descriptor>> {
        self.head_accepting(reference, &[]).await
    }

    async fn head_accepting(
        &self,
        reference: &Reference,
        accept: &[MediaType],
    ) -> Result<Option<Descriptor>> {
        let reg = self.inner.registry(&reference.registry)?;
        let url = reg.url(&manifest_path(reference));
        let call = Call::new(Method::HEAD, url, vec![Scope::pull(&reference.repository)])
            .header(ACCEPT, accept_header(accept));
        let resp = self.inner.send(&reg, &call).await?;
        match resp.status() {
            StatusCode::OK => {}
            StatusCode::NOT_FOUND => return Ok(None),
            _ => return Err(status_error(&call, resp).await),
        }
        let digest = header(&resp, &DOCKER_CONTENT_DIGEST).and_then(|d| d.parse::<Digest>().ok());
        let size = header(&resp, &CONTENT_LENGTH).and_then(|s| s.parse::<u64>().ok());
        let content_type = header(&resp, &CONTENT_TYPE).map(str::to_string);
        match (digest, size, content_type) {
            (Some(digest), Some(size), Some(ct)) => {
                if let Some(expected) = &reference.digest
                    && *expected != digest
                {
                    let what = what(reference);
                    return Err(Error::DigestMismatch {
                        what,
                        expected: expected.clone(),
                        actual: digest,
                    });
                }
                Ok(Some(Descriptor::new(
                    MediaType::from(media_type_only(&ct)),
                    digest,
                    size,
                )))
            }
            _ => Ok(Some(
                self.fetch_manifest(reference, accept).await?.descriptor(),
            )),
        }
    }

    /// Uploads `doc` under `reference`'s tag (or its digest, or `doc`'s own digest when the
    /// reference has neither) with `Content-Type` = `doc.media_type`. Returns the digest.
    ///
    /// # Errors
    /// [`Error::DigestMismatch`] when the reference pins another digest or the registry reports
    /// another one, plus the usual request errors (manifests referring to missing blobs get
    /// `MANIFEST_BLOB_UNKNOWN` in [`Error::Status`]).
    pub async fn put_manifest(&self, reference: &Reference, doc: &Document) -> Result<Digest> {
        self.put_manifest_with(reference, doc, true).await
    }

    /// [`Client::put_manifest`]; with `wait_for_blobs` false a `MANIFEST_BLOB_UNKNOWN` answer
    /// is returned at once instead of retried (for a caller that skipped blob checks on the
    /// strength of a record, and checks them when the record proves stale).
    ///
    /// # Errors
    /// As [`Client::put_manifest`].
    pub async fn put_manifest_with(
        &self,
        reference: &Reference,
        doc: &Document,
        wait_for_blobs: bool,
    ) -> Result<Digest> {
        let what = || format!("manifest pushed to {reference}");
        if let Some(pinned) = &reference.digest
            && *pinned != doc.digest
        {
            return Err(Error::DigestMismatch {
                what: what(),
                expected: pinned.clone(),
                actual: doc.digest.clone(),
            });
        }
        let target = match (&reference.tag, &reference.digest) {
            (Some(tag), _) => tag.clone(),
            (None, Some(d)) => d.to_string(),
            (None, None) => doc.digest.to_string(),
        };
        let reg = self.inner.registry(&reference.registry)?;
        let url = reg.url(&format!("/v2/{}/manifests/{target}", reference.repository));
        let content_type =
            HeaderValue::from_str(doc.media_type.as_str()).map_err(|_| Error::Protocol {
                method: Method::PUT,
                url: reference.to_string(),
                problem: "the media type is not a valid header value",
            })?;
        let call = Call::new(Method::PUT, url, vec![Scope::push(&reference.repository)])
            .header(CONTENT_TYPE, content_type)
            .payload(Payload::Bytes(doc.bytes.clone().into()), None);
        // A blob just uploaded may not be visible to the manifest check yet: eventually
        // consistent storage, or (seen with distribution) another push of the same blob
        // rewriting its link at that moment. MANIFEST_BLOB_UNKNOWN is then retried.
        let missing = std::sync::Mutex::new(None);
        let resp = retry(&self.inner.retry, "PUT manifest", || async {
            let resp = self.inner.send_once(&reg, &call).await?;
            if resp.status().is_success() {
                return Ok(Some(resp));
            }
            let err = status_error(&call, resp).await;
            if !wait_for_blobs && err.is_blob_unknown() {
                *missing.lock().unwrap_or_else(|e| e.into_inner()) = Some(err);
                return Ok(None);
            }
            Err(err)
        })
        .await?;
        let Some(resp) = resp else {
            let err = missing.into_inner().unwrap_or_else(|e| e.into_inner());
            return Err(err.unwrap_or(Error::Protocol {
                method: Method::PUT,
                url: call.shown_url(),
                problem: "the manifest was refused",
            }));
        };
        if let Some(reported) =
            header(&resp, &DOCKER_CONTENT_DIGEST).and_then(|d| d.parse::<Digest>().ok())
            && reported != doc.digest
        {
            return Err(Error::DigestMismatch {
                what: what(),
                expected: doc.digest.clone(),
                actual: reported,
            });
        }
        if let Some(cache) = &self.inner.documents {
            cache.put(doc);
        }
        Ok(doc.digest.clone())
    }
}

impl Client {
    /// The descriptor of the manifest `reference` pins by digest: from the document cache when
    /// it is there, else with a `HEAD`.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the registry does not have it, plus the usual request errors.
    pub async fn manifest_descriptor(&self, reference: &Reference) -> Result<Descriptor> {
        let manifest = |doc: &Document| doc.media_type.is_manifest() || doc.media_type.is_index();
        if let (Some(cache), Some(digest)) = (&self.inner.documents, &reference.digest)
            && let Some(doc) = cache.get(digest).filter(manifest)
        {
            return Ok(doc.descriptor());
        }
        self.head_manifest(reference)
            .await?
            .ok_or_else(|| Error::NotFound {
                what: what(reference),
                method: Method::HEAD,
                url: reference.to_string(),
                errors: Vec::new(),
            })
    }
}

fn manifest_path(reference: &Reference) -> String {
    format!(
        "/v2/{}/manifests/{}",
        reference.repository,
        reference.manifest_ref()
    )
}

fn what(reference: &Reference) -> String {
    format!("manifest {reference}")
}

pub(super) fn accept_header(accept: &[MediaType]) -> HeaderValue {
    let types: Vec<&str> = if accept.is_empty() {
        DEFAULT_MANIFEST_TYPES
            .iter()
            .map(MediaType::as_str)
            .collect()
    } else {
        accept.iter().map(MediaType::as_str).collect()
    };
    HeaderValue::from_str(&types.join(", "))
        .unwrap_or_else(|_| HeaderValue::from_static("application/vnd.oci.image.manifest.v1+json"))
}

/// `type/subtype` without parameters.
pub(super) fn media_type_only(content_type: &str) -> &str {
    content_type.split(';').next().unwrap_or("").trim()
}

/// The media type from `Content-Type`, or from the bytes when the header is missing or generic.
fn media_type(content_type: Option<&str>, bytes: &[u8]) -> Option<MediaType> {
    let declared = content_type
        .map(media_type_only)
        .filter(|ct| !ct.is_empty());
    match declared {
        Some(ct)
            if !matches!(
                ct,
                "application/json" | "text/plain" | "application/octet-stream"
            ) =>
        {
            Some(MediaType::from(ct))
        }
        _ => sniff_media_type(bytes).or_else(|| declared.map(MediaType::from)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn media_type_comes_from_content_type_or_the_bytes() {
        let oci = br#"{"schemaVersion":2,"config":{},"layers":[]}"#;
        let ct = "application/vnd.docker.distribution.manifest.v2+json; charset=utf-8";
        assert_eq!(media_type(Some(ct), oci), Some(MediaType::DockerManifest));
        assert_eq!(
            media_type(Some("application/json"), oci),
            Some(MediaType::OciManifest)
        );
        assert_eq!(
            media_type(None, br#"{"manifests":[]}"#),
            Some(MediaType::OciIndex)
        );
        assert_eq!(media_type(None, b"garbage"), None);
    }

    #[test]
    fn accept_lists_manifests_and_indexes_of_both_families() {
        let h = accept_header(&[]);
        let text = h.to_str().unwrap();
        for t in DEFAULT_MANIFEST_TYPES {
            assert!(text.contains(t.as_str()), "{text}");
        }
        assert_eq!(
            accept_header(&[MediaType::OciIndex]).to_str().unwrap(),
            MediaType::OciIndex.as_str()
        );
    }
}
