//! The OCI 1.1 referrers API: whether a registry serves it (asked once a day), and the
//! manifests it lists as referring to an image, every page of the listing; where it is not
//! served, the referrers tag schema's index (`sha256-<hex>`).

use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::{Method, StatusCode};

use super::client::Client;
use super::error::{Error, Result};
use super::manifests::{MANIFEST_LIMIT, accept_header, media_type_only};
use super::reference::Reference;
use super::scope::Scope;
use super::session::Registry;
use super::transport::{Call, header, read_capped, status_error};
use tracing::debug;

use crate::oci::{Descriptor, Digest, MediaType};

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
