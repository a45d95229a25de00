//! Blob pushes, in the order of the push protocol: `HEAD` (exists → done) → cross-repository
//! mount (201 → done; 202 → continue in that session) → upload (see `upload_steps.rs`: a
//! single `POST ?digest=` while the registry is not known to refuse it and the blob is small,
//! else `POST` + `PUT` streaming the body, chunked `PATCH`es only above a large threshold or
//! when the registry rejects the single `PUT`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use reqwest::{Method, StatusCode};
use tracing::debug;

use super::client::Client;
use super::error::{Error, Result};
use super::reference::Reference;
use super::retry::{RetryPolicy, retry};
use super::scope::Scope;
use super::session::Registry;
use super::transport::{Call, location, status_error};
use super::upload_steps::{BlobSource, Session, Upload, min_chunk, uploads_path};
use crate::oci::{Descriptor, Digest, Document, MediaType};

/// What [`Client::push_blob`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlobOutcome {
    /// The repository already had the blob.
    Existed,
    /// The registry linked it from the mount source repository.
    Mounted,
    /// Its bytes were uploaded.
    Uploaded {
        /// Body bytes sent, across all attempts.
        bytes_sent: u64,
    },
}

impl Client {
    /// Pushes one blob to `repo` (its tag and digest are ignored). `mount_from` names a
    /// repository on the same registry that has the blob (a base image), for a
    /// cross-repository mount; with token auth, call [`Client::authorize`] first with
    /// `Scope::push(repo)` and `Scope::pull(source)` so that one token carries both.
    ///
    /// # Errors
    /// [`Error::SizeMismatch`]/[`Error::DigestMismatch`] when the source does not match the
    /// descriptor, [`Error::Protocol`] for a 202 without `Location`, plus request errors.
    pub async fn push_blob(
        &self,
        repo: &Reference,
        descriptor: &Descriptor,
        source: BlobSource,
        mount_from: Option<&str>,
    ) -> Result<BlobOutcome> {
        check_source(&source, descriptor).await?;
        let kept = self.document(descriptor, &source);
        let outcome = self
            .push_once(repo, &descriptor.digest, async {
                if self.blob_exists(repo, &descriptor.digest).await?.is_some() {
                    let repo = repo.repository_path();
                    debug!(digest = %descriptor.digest, repo, "blob exists");
                    return Ok(BlobOutcome::Existed);
                }
                self.upload(repo, descriptor, source, mount_from).await
            })
            .await?;
        self.keep_document(kept);
        Ok(outcome)
    }

    /// Uploads a blob without first asking whether the repository has it: for blobs that are
    /// almost always new (a build's source layer and config), where that `HEAD` is a request
    /// spent for nothing and uploading a blob the registry has is harmless.
    ///
    /// # Errors
    /// As [`Client::push_blob`].
    pub async fn push_new_blob(
        &self,
        repo: &Reference,
        descriptor: &Descriptor,
        source: BlobSource,
    ) -> Result<BlobOutcome> {
        check_source(&source, descriptor).await?;
        let kept = self.document(descriptor, &source);
        let upload = self.upload(repo, descriptor, source, None);
        let outcome = self.push_once(repo, &descriptor.digest, upload).await?;
        self.keep_document(kept);
        Ok(outcome)
    }

    /// A blob pushed from bytes that is a document (a config, or JSON such as a signature
    /// payload or an attestation), for the document cache once it is up, when the cache keeps
    /// what is pushed ([`super::documents::DocumentCache::keeps_pushed`]): what a long-running
    /// process reads back later (the controller, an image it rebased) then costs no request.
    fn document(&self, descriptor: &Descriptor, source: &BlobSource) -> Option<Document> {
        let BlobSource::Bytes(bytes) = source else {
            return None;
        };
        let media_type = &descriptor.media_type;
        let json = matches!(media_type, MediaType::OciConfig | MediaType::DockerConfig)
            || media_type.as_str().ends_with("+json");
        let cache = self.inner.documents.as_ref();
        (json && cache.is_some_and(|c| c.keeps_pushed(descriptor.size))).then(|| Document {
            media_type: media_type.clone(),
            digest: descriptor.digest.clone(),
            bytes: bytes.to_vec(),
        })
    }

    fn keep_document(&self, doc: Option<Document>) {
        if let (Some(cache), Some(doc)) = (&self.inner.documents, doc) {
            cache.put(&doc);
        }
    }

    /// Runs `push` unless a push of the same blob to the same repository by this client is
    /// under way: then waits for it, and when it succeeded the blob is there (`Existed`,
    /// with no request). The platforms of one build push their shared source layer once.
    async fn push_once(
        &self,
        repo: &Reference,
        digest: &Digest,
        push: impl std::future::Future<Output = Result<BlobOutcome>>,
    ) -> Result<BlobOutcome> {
        let key = (
            repo.registry.clone(),
            repo.repository.clone(),
            digest.clone(),
        );
        let slot = {
            let mut pushes = self.inner.pushes.lock().unwrap_or_else(|e| e.into_inner());
            pushes.entry(key.clone()).or_default().clone()
        };
        let mut pushed = slot.lock().await;
        let outcome = if *pushed {
            debug!(%digest, repo = %repo.repository_path(), "pushed a moment ago by this kiln");
            Ok(BlobOutcome::Existed)
        } else {
            let outcome = push.await;
            *pushed = outcome.is_ok();
            outcome
        };
        drop(pushed);
        // Forgotten once nobody waits on it: only pushes at the same time are shared.
        let mut pushes = self.inner.pushes.lock().unwrap_or_else(|e| e.into_inner());
        if pushes
            .get(&key)
            .is_some_and(|s| Arc::ptr_eq(s, &slot) && Arc::strong_count(&slot) == 2)
        {
            pushes.remove(&key);
        }
        outcome
    }

    async fn upload(
        &self,
        repo: &Reference,
        descriptor: &Descriptor,
        source: BlobSource,
        mount_from: Option<&str>,
    ) -> Result<BlobOutcome> {
        let reg = self.inner.registry(&repo.registry)?;
        let mut session = None;
        if let Some(from) = mount_from.filter(|f| *f != repo.repository) {
            match self.mount(&reg, repo, &descriptor.digest, from).await? {
                None => return Ok(BlobOutcome::Mounted),
                Some(s) => session = Some(s),
            }
        }
        let sent = Arc::new(AtomicU64::new(0));
        let upload = Upload {
            client: self,
            reg: &reg,
            repo,
            descriptor,
            source: &source,
            sent: &sent,
            open: std::sync::Mutex::new(None),
        };
        // An upload is two or more requests, each of which may fail: twice the attempts of a
        // single request, in one loop (never a retry inside a retry).
        let policy = RetryPolicy {
            max_retries: self.inner.retry.max_retries.saturating_mul(2),
            ..self.inner.retry.clone()
        };
        retry(&policy, "uploading blob", || {
            let first = session.take();
            upload.run(first)
        })
        .await?;
        let bytes_sent = sent.load(Ordering::Relaxed);
        debug!(digest = %descriptor.digest, bytes_sent, "blob uploaded");
        Ok(BlobOutcome::Uploaded { bytes_sent })
    }

    /// Cross-repository mount of blob `digest` from repository `from` (same registry) into
    /// `repo`: `true` when mounted, `false` when the registry declined (the blob is not in
    /// `from`, or no pull access there). Prefer [`Client::push_blob`] with `mount_from` when
    /// the bytes are at hand: it continues a declined mount in the session already opened.
    ///
    /// # Errors
    /// [`Error::Protocol`] for a 202 without `Location`, plus the usual request errors.
    pub async fn mount_blob(&self, repo: &Reference, digest: &Digest, from: &str) -> Result<bool> {
        let reg = self.inner.registry(&repo.registry)?;
        match self.mount(&reg, repo, digest, from).await? {
            None => Ok(true),
            Some(session) => {
                // The registry opened an upload session we will not use: cancel it rather
                // than leave it to the registry's purge (distribution keeps it a week).
                let call = Call::new(
                    Method::DELETE,
                    session.url,
                    vec![Scope::push(&repo.repository)],
                );
                match self.inner.send(&reg, &call).await {
                    Ok(resp) if resp.status().is_success() => {}
                    Ok(resp) => debug!(
                        status = resp.status().as_u16(),
                        "cancelling the declined mount's session"
                    ),
                    Err(e) => debug!(error = %e, "cancelling the declined mount's session"),
                }
                Ok(false)
            }
        }
    }

    /// `POST ?mount=&from=`: `None` when mounted, else the session the registry opened.
    async fn mount(
        &self,
        reg: &Registry,
        repo: &Reference,
        digest: &Digest,
        from: &str,
    ) -> Result<Option<Session>> {
        let mut url = reg.url(&uploads_path(repo));
        url.query_pairs_mut()
            .append_pair("mount", &digest.to_string())
            .append_pair("from", from);
        let scopes = vec![Scope::push(&repo.repository), Scope::pull(from)];
        let call = Call::new(Method::POST, url, scopes);
        let resp = self.inner.send(reg, &call).await?;
        match resp.status() {
            StatusCode::CREATED => Ok(None),
            StatusCode::ACCEPTED => {
                debug!(%digest, from, "mount declined; uploading in the session opened");
                Ok(Some(Session {
                    url: location(&call, &resp)?,
                    min_chunk: min_chunk(&resp),
                }))
            }
            _ => Err(status_error(&call, resp).await),
        }
    }
}

/// The source must have the descriptor's size (and, for bytes, its digest).
async fn check_source(source: &BlobSource, descriptor: &Descriptor) -> Result<()> {
    let what = || format!("blob source for {}", descriptor.digest);
    let actual = match source {
        BlobSource::Bytes(b) => {
            let digest = Digest::of(b);
            if digest != descriptor.digest {
                return Err(Error::DigestMismatch {
                    what: what(),
                    expected: descriptor.digest.clone(),
                    actual: digest,
                });
            }
            b.len() as u64
        }
        BlobSource::File(path) => {
            let meta = tokio::fs::metadata(path).await;
            meta.map_err(|source| {
                Error::Io(crate::io_error::IoError {
                    action: "reading blob source",
                    path: path.clone(),
                    source,
                })
            })?
            .len()
        }
    };
    if actual != descriptor.size {
        return Err(Error::SizeMismatch {
            what: what(),
            expected: descriptor.size,
            actual,
        });
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::oci::{Document, MediaType};
    use crate::registry::ClientConfig;
    use bytes::Bytes;
    use std::path::Path;

    fn assert_send<T: Send>(_: &T) {}

    /// Callers run these futures on a multi-threaded runtime and inside `buffer_unordered`.
    /// (Here, in the top file of the registry client, where every method of [`Client`] is
    /// defined below.)
    #[test]
    fn client_futures_are_send_and_the_client_is_cheap_to_share() {
        fn assert_sync<T: Send + Sync + Clone>() {}
        assert_sync::<Client>();
        let client = Client::new(ClientConfig::default()).unwrap();
        let r: Reference = "reg.example/a:t".parse().unwrap();
        let d = Descriptor::new(MediaType::OciLayerGzip, Digest::of(b""), 0);
        let doc = Document::new(MediaType::OciManifest, b"{}".to_vec());
        assert_send(&client.authorize("reg.example", &[Scope::push("a")]));
        assert_send(&client.get_manifest(&r, &[]));
        assert_send(&client.head_manifest(&r));
        assert_send(&client.put_manifest(&r, &doc));
        assert_send(&client.blob_exists(&r, &d.digest));
        assert_send(&client.get_blob(&r, &d));
        assert_send(&client.get_blob_to_file(&r, &d, Path::new("x")));
        assert_send(&client.mount_blob(&r, &d.digest, "b"));
        assert_send(&client.push_blob(&r, &d, BlobSource::Bytes(Default::default()), Some("b")));
    }

    #[tokio::test]
    async fn sources_that_do_not_match_the_descriptor_are_refused_before_any_request() {
        let d = Descriptor::new(MediaType::OciLayerGzip, Digest::of(b"abc"), 3);
        check_source(&BlobSource::Bytes(Bytes::from_static(b"abc")), &d)
            .await
            .unwrap();
        let wrong = check_source(&BlobSource::Bytes(Bytes::from_static(b"abd")), &d).await;
        assert!(matches!(wrong, Err(Error::DigestMismatch { .. })));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blob");
        std::fs::write(&path, b"abcd").unwrap();
        let short = check_source(&BlobSource::File(path), &d).await;
        assert!(matches!(
            short,
            Err(Error::SizeMismatch {
                expected: 3,
                actual: 4,
                ..
            })
        ));
    }
}
