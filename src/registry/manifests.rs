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
use super::session::Registry;
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
    /// Whether `repo`'s registry serves the OCI 1.1 referrers API. Asked with `GET
    /// /v2/<name>/referrers/<digest>` (for a manifest that is in the repository), which such
    /// a registry answers with an image index, empty when nothing refers to it; one without
    /// the API answers otherwise (distribution 2.8: 404, no such route). The answer is kept
    /// for a day, across runs when the client has a cache directory.
    ///
    /// # Errors
    /// Any other answer, and the usual request errors (nothing is kept then).
    pub async fn serves_referrers(&self, repo: &Reference, digest: &Digest) -> Result<bool> {
        let reg = self.inner.registry(&repo.registry)?;
        if let Some(known) = reg.serves_referrers() {
            return Ok(known);
        }
        // One question per registry, however many pushes wait for its answer.
        let _asking = reg.referrers_probe.lock().await;
        if let Some(known) = reg.serves_referrers() {
            return Ok(known);
        }
        let call = referrers_call(&reg, repo, digest, None);
        // Asked once, not retried. The registry's own answer is kept for the day: an image
        // index (of that media type) is yes, any other (a 404 for no such route, another
        // status, a document of another kind) no. What is not its answer about the API is
        // kept for nothing, and is the caller's error: a failed connection, a busy registry
        // (408, 429, 5xx: `send_once` makes them errors), a refused identity, a token service
        // or credential helper failing.
        let resp = match self.inner.send_once(&reg, &call).await {
            Ok(resp) => resp,
            Err(e @ (Error::NotFound { .. } | Error::Status { .. })) if !e.is_retryable() => {
                debug!(error = %e, "asking for referrers");
                reg.note_referrers(false);
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        let indexed = header(&resp, &CONTENT_TYPE)
            .is_some_and(|t| MediaType::from(media_type_only(t)) == MediaType::OciIndex);
        let serves = resp.status() == StatusCode::OK
            && indexed
            && read_index(&call, resp, repo, digest)
                .await
                .is_ok_and(|index| index.media_type == Some(MediaType::OciIndex));
        debug!(registry = %reg.name, serves, "the referrers API");
        reg.note_referrers(serves);
        Ok(serves)
    }

    /// The manifests the referrers API lists as referring to `digest` in `repo`, of
    /// `artifact_type` (asked of the registry as a filter, and checked here too, since a
    /// registry may ignore the filter), every page of the listing the registry's `Link`
    /// headers name, up to [`MAX_REFERRER_PAGES`], or until `at_most` are listed. Where the
    /// registry does not serve the API ([`Client::serves_referrers`]), the referrers tag
    /// schema's index instead (the tag
    /// `sha256-<hex>`, which OCI 1.1 clients such as cosign's OCI 1.1 mode keep up to date
    /// there): empty when there is none.
    ///
    /// # Errors
    /// The usual request errors; an answer that is not an image index, and a next page on
    /// another registry or listing, are protocol errors.
    pub async fn referrers(
        &self,
        repo: &Reference,
        digest: &Digest,
        artifact_type: &str,
        at_most: usize,
    ) -> Result<Vec<Descriptor>> {
        let of_type = |index: crate::oci::Index| {
            index
                .manifests
                .into_iter()
                .filter(|d| d.artifact_type.as_deref() == Some(artifact_type))
        };
        if !self.serves_referrers(repo, digest).await? {
            let tag = format!("{}-{}", digest.algorithm(), digest.hex());
            let tagged = repo.repository_only().with_tag(&tag)?;
            return match self.get_manifest(&tagged, &[MediaType::OciIndex]).await {
                Ok(doc) if doc.media_type == MediaType::OciIndex => {
                    Ok(of_type(doc.parse().map_err(|_| Error::Protocol {
                        method: Method::GET,
                        url: tagged.to_string(),
                        problem: "the referrers tag is not an image index",
                    })?)
                    .collect())
                }
                Ok(_) | Err(Error::NotFound { .. }) => Ok(Vec::new()),
                Err(e) => Err(e),
            };
        }
        let reg = self.inner.registry(&repo.registry)?;
        let mut call = referrers_call(&reg, repo, digest, Some(artifact_type));
        let mut listed = Vec::new();
        for page in 1.. {
            let resp = self.inner.send(&reg, &call).await?;
            if resp.status() != StatusCode::OK {
                return Err(status_error(&call, resp).await);
            }
            let next = next_page(&call, &resp)?;
            listed.extend(of_type(read_index(&call, resp, repo, digest).await?));
            match next {
                None => break,
                Some(_) if listed.len() >= at_most => break,
                Some(_) if page == MAX_REFERRER_PAGES => {
                    tracing::warn!(
                        repository = %repo, %digest,
                        "the referrers listing has more than {MAX_REFERRER_PAGES} pages: \
                         the rest is not read",
                    );
                    break;
                }
                Some(url) => call.url = url,
            }
        }
        Ok(listed)
    }

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

/// `GET /v2/<name>/referrers/<digest>`, with the `artifactType` filter when given.
fn referrers_call(
    reg: &Registry,
    repo: &Reference,
    digest: &Digest,
    artifact_type: Option<&str>,
) -> Call {
    let mut url = reg.url(&format!("/v2/{}/referrers/{digest}", repo.repository));
    if let Some(t) = artifact_type {
        url.query_pairs_mut().append_pair("artifactType", t);
    }
    // What a referrers answer is (OCI distribution spec 1.1).
    Call::new(Method::GET, url, vec![Scope::pull(&repo.repository)])
        .header(ACCEPT, accept_header(&[MediaType::OciIndex]))
}

/// At most this many pages of a referrers listing are read.
pub const MAX_REFERRER_PAGES: usize = 16;

/// The next page of the referrers listing `call` asked for, from the answer's `Link` header
/// (`<URL>; rel="next"`, distribution spec 1.1): the same listing (path) on the same registry
/// (origin), only its query may change. A next page anywhere else is refused: the registry's
/// credentials go with the request.
fn next_page(call: &Call, resp: &reqwest::Response) -> Result<Option<url::Url>> {
    let protocol = |problem| Error::Protocol {
        method: call.method.clone(),
        url: call.shown_url(),
        problem,
    };
    let Some(target) = resp
        .headers()
        .get_all(reqwest::header::LINK)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(next_link)
    else {
        return Ok(None);
    };
    same_listing(&call.url, target).map(Some).ok_or_else(|| {
        protocol("the referrers answer's next page (Link) is not this listing on this registry")
    })
}

/// `target` resolved against `listing`, if it is the same listing on the same registry.
fn same_listing(listing: &url::Url, target: &str) -> Option<url::Url> {
    listing
        .join(target)
        .ok()
        .filter(|url| url.origin() == listing.origin() && url.path() == listing.path())
        // Nothing the request would send beyond what it asked for (userinfo becomes a Basic
        // `Authorization` header, and shows in logs).
        .filter(|url| url.username().is_empty() && url.password().is_none())
        .filter(|url| url.fragment().is_none())
}

/// The target of the `rel="next"` link in a `Link` header value (RFC 8288: comma-separated
/// `<URI>; param=value` links, `rel` a space-separated list of relation types; a quoted value
/// may hold commas, semicolons and angle brackets).
fn next_link(value: &str) -> Option<&str> {
    split_outside(value, b',').into_iter().find_map(|link| {
        let mut parts = split_outside(link, b';').into_iter();
        let target = parts.next()?.trim().strip_prefix('<')?.strip_suffix('>')?;
        let next = parts.any(|param| {
            param.split_once('=').is_some_and(|(name, v)| {
                name.trim().eq_ignore_ascii_case("rel")
                    && v.trim()
                        .trim_matches('"')
                        .split_ascii_whitespace()
                        .any(|r| r.eq_ignore_ascii_case("next"))
            })
        });
        next.then_some(target)
    })
}

/// `value` split at each `sep` outside a quoted string (`"…"`, with `\` escapes) and outside
/// `<…>`.
fn split_outside(value: &str, sep: u8) -> Vec<&str> {
    let (mut parts, mut start) = (Vec::new(), 0);
    let (mut quoted, mut angled, mut escaped) = (false, false, false);
    for (i, b) in value.bytes().enumerate() {
        if escaped {
            escaped = false;
            continue;
        }
        match b {
            b'\\' if quoted => escaped = true,
            b'"' if !angled => quoted = !quoted,
            b'<' if !quoted => angled = true,
            b'>' if !quoted => angled = false,
            _ if b == sep && !quoted && !angled => {
                parts.push(&value[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&value[start..]);
    parts
}

/// The image index a referrers answer holds.
async fn read_index(
    call: &Call,
    resp: reqwest::Response,
    repo: &Reference,
    digest: &Digest,
) -> Result<crate::oci::Index> {
    let what = format!("the referrers of {repo}@{digest}");
    let bytes = read_capped(resp, MANIFEST_LIMIT, &what, (&call.method, &call.url)).await?;
    serde_json::from_slice(&bytes).map_err(|_| Error::Protocol {
        method: Method::GET,
        url: call.shown_url(),
        problem: "the referrers answer is not an image index",
    })
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

fn accept_header(accept: &[MediaType]) -> HeaderValue {
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
fn media_type_only(content_type: &str) -> &str {
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
    fn the_next_page_is_the_next_link_of_the_same_listing() {
        let next = r#"</v2/fns/a/referrers/sha256:1?n=1&last=x>; rel="next""#;
        assert_eq!(
            next_link(next),
            Some("/v2/fns/a/referrers/sha256:1?n=1&last=x")
        );
        let both = r#"<https://r/prev?a,b>; rel=prev; title="x", <p2>; rel="last next""#;
        assert_eq!(next_link(both), Some("p2"));
        assert_eq!(next_link(r#"<p>; rel="prev""#), None);
        assert_eq!(next_link(r#"<p; rel="next""#), None);
        assert_eq!(next_link("garbage"), None);
        // Quoted values are values, whatever they hold.
        assert_eq!(next_link(r#"<p1>; rel=prev; title="x, rel=next""#), None);
        assert_eq!(next_link(r#"<p1>; anchor="<x>"; rel="next""#), Some("p1"));
        assert_eq!(
            next_link(r#"<p1>; title="a \"quoted\", rel=next"; rel=prev, <p2>; rel=next"#),
            Some("p2")
        );

        let listing: url::Url = "https://reg.example/v2/fns/a/referrers/sha256:1?artifactType=t"
            .parse()
            .unwrap();
        let on = |target: &str| same_listing(&listing, target).map(|u| u.to_string());
        assert_eq!(
            on("/v2/fns/a/referrers/sha256:1?n=1&last=x").as_deref(),
            Some("https://reg.example/v2/fns/a/referrers/sha256:1?n=1&last=x")
        );
        assert_eq!(
            on("?last=x").as_deref(),
            Some("https://reg.example/v2/fns/a/referrers/sha256:1?last=x")
        );
        for elsewhere in [
            "https://evil.example/v2/fns/a/referrers/sha256:1?last=x",
            "http://reg.example/v2/fns/a/referrers/sha256:1?last=x",
            "https://reg.example:444/v2/fns/a/referrers/sha256:1",
            "/v2/fns/b/referrers/sha256:1?last=x",
            "/token?scope=x",
            "//evil.example/v2/fns/a/referrers/sha256:1",
            "https://user:pass@reg.example/v2/fns/a/referrers/sha256:1",
            "/v2/fns/a/referrers/sha256:1?last=x#frag",
        ] {
            assert_eq!(on(elsewhere), None, "{elsewhere}");
        }
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
