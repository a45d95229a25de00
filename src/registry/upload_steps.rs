//! The upload itself, one attempt per [`Upload::run`]: the single-request `POST ?digest=`
//! (remembered per registry once refused), `POST` + `PUT <Location>&digest=` streaming the
//! body with a `Content-Length`, or chunked `PATCH`es with `Content-Range` then an empty `PUT`.
//! `Location` may be relative or absolute and may carry its own query. Also what a blob's bytes
//! come from ([`BlobSource`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use bytes::Bytes;
use reqwest::header::{CONTENT_RANGE, CONTENT_TYPE, HeaderName, HeaderValue, RANGE};
use reqwest::{Method, StatusCode};
use tracing::{debug, warn};
use url::Url;

use super::client::Client;
use super::error::{Error, Result};
use super::manifests::DOCKER_CONTENT_DIGEST;
use super::reference::Reference;
use super::scope::Scope;
use super::session::Registry;
use super::transport::{Call, Payload, header, location, status_error, transfer_timeout};
use crate::oci::{Descriptor, Digest};

const OCTET_STREAM: HeaderValue = HeaderValue::from_static("application/octet-stream");
const CHUNK_MIN_LENGTH: HeaderName = HeaderName::from_static("oci-chunk-min-length");

/// Where a blob's bytes come from.
#[derive(Clone, Debug)]
pub enum BlobSource {
    /// A file, streamed (never read whole into memory).
    File(PathBuf),
    /// Bytes in memory (configs, small layers).
    Bytes(Bytes),
}

/// An upload session URL plus the registry's minimum chunk length, if it sent one.
#[derive(Clone)]
pub(crate) struct Session {
    pub url: Url,
    pub min_chunk: u64,
}

/// One blob upload; [`Upload::run`] is one attempt.
pub(crate) struct Upload<'a> {
    pub client: &'a Client,
    pub reg: &'a Registry,
    pub repo: &'a Reference,
    pub descriptor: &'a Descriptor,
    pub source: &'a BlobSource,
    pub sent: &'a Arc<AtomicU64>,
    /// The session this attempt has open, cancelled when the attempt fails.
    pub open: std::sync::Mutex<Option<Url>>,
}

impl Upload<'_> {
    /// One attempt. When it fails with a session open, the session is cancelled (a `DELETE`,
    /// retried, then given up on quietly): the next attempt opens its own, and an abandoned one
    /// would sit in the registry's storage until its purge.
    pub async fn run(&self, session: Option<Session>) -> Result<()> {
        if let Some(s) = &session {
            self.remember(&s.url);
        }
        let result = self.attempt(session).await;
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let (Err(_), Some(url)) = (&result, open) {
            let call = Call::new(Method::DELETE, url, self.scopes());
            // Retried like any request (a cancel is idempotent): at 20 % injected failures a
            // single try left one session in five behind.
            match self.client.inner.send(self.reg, &call).await {
                Ok(resp) => debug!(
                    status = resp.status().as_u16(),
                    "cancelled the failed upload's session"
                ),
                Err(e) => debug!(error = %e, "cancelling the failed upload's session"),
            }
        }
        result
    }

    fn remember(&self, url: &Url) {
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = Some(url.clone());
    }

    async fn attempt(&self, session: Option<Session>) -> Result<()> {
        let policy = &self.client.inner.upload;
        let size = self.descriptor.size;
        let session = match session {
            Some(s) => s,
            None if size <= policy.monolithic_max && !self.reg.refuses_monolithic() => {
                match self.post_whole().await {
                    Ok(None) => return Ok(()),
                    Ok(Some(s)) => s,
                    // Too large for a proxy in front of the registry, say: no session was
                    // opened, so open one and send chunks.
                    Err(e) if matches!(e.status(), Some(413 | 416)) => {
                        warn!(
                            digest = %self.descriptor.digest,
                            error = %e,
                            "single-request upload refused; uploading in chunks",
                        );
                        self.reg.refuse_monolithic();
                        let session = self.start().await?;
                        return self.chunked(session).await;
                    }
                    Err(e) => return Err(e),
                }
            }
            None => self.start().await?,
        };
        if size > policy.chunked_threshold {
            return self.chunked(session).await;
        }
        match self.put_whole(session.clone()).await {
            // The body was refused, not stored: the session is as it was; send chunks in it.
            Err(e) if matches!(e.status(), Some(413 | 416)) => {
                warn!(
                    digest = %self.descriptor.digest,
                    error = %e,
                    "single PUT refused; uploading in chunks",
                );
                self.chunked(session).await
            }
            other => other,
        }
    }

    /// The single-request upload. `None` when stored; a session when the registry ignored
    /// the body and opened one (remembered, so later blobs skip this attempt).
    async fn post_whole(&self) -> Result<Option<Session>> {
        let mut url = self.reg.url(&uploads_path(self.repo));
        url.query_pairs_mut()
            .append_pair("digest", &self.descriptor.digest.to_string());
        let call = self.body_call(Method::POST, url, self.payload(0, self.descriptor.size));
        let resp = match self.client.inner.send_once(self.reg, &call).await {
            Ok(resp) => resp,
            Err(e @ Error::Transport { .. }) => {
                // A server that does not read the body may close the connection under us.
                self.reg.refuse_monolithic();
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        match resp.status() {
            StatusCode::CREATED => self.check_digest(&resp).map(|()| None),
            StatusCode::ACCEPTED => {
                self.reg.refuse_monolithic();
                debug!(
                    registry = %self.reg.name,
                    "registry ignores single-request uploads; using POST + PUT",
                );
                let url = location(&call, &resp)?;
                self.remember(&url);
                Ok(Some(Session {
                    url,
                    min_chunk: min_chunk(&resp),
                }))
            }
            _ => Err(status_error(&call, resp).await),
        }
    }

    /// `POST` without a body: opens an upload session.
    async fn start(&self) -> Result<Session> {
        let url = self.reg.url(&uploads_path(self.repo));
        let call = Call::new(Method::POST, url, self.scopes());
        let resp = self.client.inner.send_once(self.reg, &call).await?;
        if resp.status() != StatusCode::ACCEPTED {
            return Err(status_error(&call, resp).await);
        }
        let url = location(&call, &resp)?;
        self.remember(&url);
        Ok(Session {
            url,
            min_chunk: min_chunk(&resp),
        })
    }

    /// `PUT <session>&digest=` with the whole body.
    async fn put_whole(&self, session: Session) -> Result<()> {
        let call = self.body_call(
            Method::PUT,
            with_digest(session.url, &self.descriptor.digest),
            self.payload(0, self.descriptor.size),
        );
        self.finish(&call).await
    }

    /// `PATCH` chunks with `Content-Range`, then an empty `PUT <session>&digest=`.
    async fn chunked(&self, session: Session) -> Result<()> {
        let size = self.descriptor.size;
        let chunk = self
            .client
            .inner
            .upload
            .chunk_size
            .max(session.min_chunk)
            .max(1);
        let mut url = session.url;
        let mut offset = 0;
        while offset < size {
            let len = chunk.min(size - offset);
            let end = offset + len - 1;
            let range =
                HeaderValue::from_str(&format!("{offset}-{end}")).expect("digits and a dash");
            let call = self
                .body_call(Method::PATCH, url, self.payload(offset, len))
                .header(CONTENT_RANGE, range);
            let resp = self.client.inner.send_once(self.reg, &call).await?;
            if resp.status() != StatusCode::ACCEPTED {
                return Err(status_error(&call, resp).await);
            }
            let acked =
                header(&resp, &RANGE).and_then(|r| r.rsplit('-').next()?.parse::<u64>().ok());
            if acked.is_some_and(|a| a != end) {
                let problem = "the registry acknowledged a different range than was sent";
                return Err(Error::Protocol {
                    method: Method::PATCH,
                    url: call.shown_url(),
                    problem,
                });
            }
            url = location(&call, &resp)?;
            self.remember(&url);
            offset += len;
        }
        let call = Call::new(
            Method::PUT,
            with_digest(url, &self.descriptor.digest),
            self.scopes(),
        );
        self.finish(&call).await
    }

    async fn finish(&self, call: &Call) -> Result<()> {
        let resp = self.client.inner.send_once(self.reg, call).await?;
        if resp.status() != StatusCode::CREATED {
            return Err(status_error(call, resp).await);
        }
        self.check_digest(&resp)
    }

    fn check_digest(&self, resp: &reqwest::Response) -> Result<()> {
        let reported = header(resp, &DOCKER_CONTENT_DIGEST).and_then(|d| d.parse::<Digest>().ok());
        match reported {
            Some(actual) if actual != self.descriptor.digest => Err(Error::DigestMismatch {
                what: format!("blob pushed to {}", self.repo.repository_path()),
                expected: self.descriptor.digest.clone(),
                actual,
            }),
            _ => Ok(()),
        }
    }

    fn scopes(&self) -> Vec<Scope> {
        vec![Scope::push(&self.repo.repository)]
    }

    fn body_call(&self, method: Method, url: Url, payload: Payload) -> Call {
        let len = match &payload {
            Payload::Bytes(b) => b.len() as u64,
            Payload::File { len, .. } => *len,
            Payload::Empty => 0,
        };
        let mut call = Call::new(method, url, self.scopes())
            .header(CONTENT_TYPE, OCTET_STREAM)
            .payload(payload, Some(self.sent.clone()));
        call.timeout = Some(transfer_timeout(self.client.inner.transport.timeout, len));
        call
    }

    fn payload(&self, offset: u64, len: u64) -> Payload {
        match self.source {
            BlobSource::Bytes(b) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX).min(b.len());
                let end = usize::try_from(offset + len)
                    .unwrap_or(usize::MAX)
                    .min(b.len());
                Payload::Bytes(b.slice(start..end))
            }
            BlobSource::File(path) => Payload::File {
                path: path.clone(),
                offset,
                len,
            },
        }
    }
}

/// The session URL with `digest=` appended to whatever query it already has.
fn with_digest(mut url: Url, digest: &Digest) -> Url {
    url.query_pairs_mut()
        .append_pair("digest", &digest.to_string());
    url
}

pub(crate) fn min_chunk(resp: &reqwest::Response) -> u64 {
    header(resp, &CHUNK_MIN_LENGTH)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The path that opens an upload session in `repo`.
pub(crate) fn uploads_path(repo: &Reference) -> String {
    format!("/v2/{}/blobs/uploads/", repo.repository)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn digest_is_appended_to_relative_and_absolute_locations_with_queries() {
        let d = Digest::of(b"z");
        let base = Url::parse("http://r:5000/v2/a/blobs/uploads/").unwrap();
        let rel = base
            .join("/v2/a/blobs/uploads/u1?_state=abc%3D%3D")
            .unwrap();
        let out = with_digest(rel, &d);
        assert_eq!(out.path(), "/v2/a/blobs/uploads/u1");
        assert_eq!(
            out.query(),
            Some(format!("_state=abc%3D%3D&digest=sha256%3A{}", d.hex()).as_str())
        );
        let abs = base.join("https://upload.example/session/9").unwrap();
        let out = with_digest(abs, &d);
        assert_eq!(
            out.as_str(),
            format!(
                "https://upload.example/session/9?digest=sha256%3A{}",
                d.hex()
            )
        );
    }
}
