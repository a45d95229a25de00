//! [`Client`]: a cheap-to-clone handle on one HTTP connection pool plus per-registry
//! authentication state. Its methods take `&self`, so a build can push blobs concurrently
//! (`buffer_unordered`). The manifest, blob and upload methods live in `manifests.rs`,
//! `blobs.rs` and `upload.rs`.

use std::sync::Arc;
use std::time::Duration;

use reqwest::{Certificate, Method};

use super::credentials::CredentialStore;
use super::documents::DocumentCache;
use super::error::{Error, Result};
use super::policy::UploadPolicy;
use super::retry::{RetryPolicy, retry};
use super::scope::Scope;
use super::transport::{Call, Inner, status_error};

/// How to reach registries.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// `host[:port]` of registries spoken to over plain HTTP; all others use verified TLS.
    pub insecure_hosts: Vec<String>,
    /// PEM bundles of extra CAs trusted on top of the platform's roots.
    pub extra_ca_pem: Vec<Vec<u8>>,
    /// Where credentials come from.
    pub credentials: CredentialStore,
    /// The `User-Agent` header.
    pub user_agent: String,
    /// Retries of retryable failures, per request.
    pub retry: RetryPolicy,
    /// Connect timeout and total time allowed for each request without a large body (large
    /// transfers get more time in proportion to their size and a stall detector instead).
    pub request_timeout: Duration,
    /// Thresholds of the blob upload strategies.
    pub upload: UploadPolicy,
    /// A directory the client keeps what it learnt across runs: manifests, indexes and
    /// configs by digest in `documents/` (a tag is then read with a `HEAD`, and the document
    /// taken from here when already fetched or pushed), and in `registries/` what each
    /// registry is known to refuse. `None` keeps nothing.
    pub cache_dir: Option<std::path::PathBuf>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            insecure_hosts: Vec::new(),
            extra_ca_pem: Vec::new(),
            credentials: CredentialStore::default(),
            user_agent: concat!("kiln/", env!("CARGO_PKG_VERSION")).to_string(),
            retry: RetryPolicy::default(),
            request_timeout: Duration::from_secs(60),
            upload: UploadPolicy::default(),
            cache_dir: None,
        }
    }
}

/// An async OCI distribution client. Cloning shares the connection pool and auth state.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}

impl Client {
    /// Builds a client. TLS is verified with the platform verifier plus `extra_ca_pem`.
    ///
    /// # Errors
    /// [`Error::ExtraCa`] for a bundle without valid certificates, [`Error::HttpClient`] when
    /// the TLS stack cannot be set up.
    pub fn new(config: ClientConfig) -> Result<Client> {
        let mut certs = Vec::new();
        for (index, pem) in config.extra_ca_pem.iter().enumerate() {
            let bundle = Certificate::from_pem_bundle(pem).map_err(|source| Error::ExtraCa {
                index,
                source: Some(source),
            })?;
            if bundle.is_empty() {
                return Err(Error::ExtraCa {
                    index,
                    source: None,
                });
            }
            certs.extend(bundle);
        }
        let http = super::http::Http::new(
            config.user_agent.clone(),
            config.request_timeout.min(Duration::from_secs(30)),
            certs,
        )?;
        let mut inner = Inner::new(
            http,
            config.retry,
            config.request_timeout,
            config.credentials,
            config.upload,
            config.insecure_hosts,
        );
        if let Some(dir) = config.cache_dir {
            inner.documents = Some(DocumentCache::new(dir.join("documents")));
            inner.facts_dir = Some(dir.join("registries"));
        }
        Ok(Client {
            inner: Arc::new(inner),
        })
    }

    /// Adds `scopes` on `registry` to those every token for it carries, sending nothing: the
    /// first token (fetched when the registry's first 401 names the scheme) has them all.
    ///
    /// # Errors
    /// An invalid registry name.
    pub async fn want_scopes(&self, registry: &str, scopes: &[Scope]) -> Result<()> {
        self.inner.registry(registry)?.want(scopes).await;
        Ok(())
    }

    /// The requests and bytes this client (and its clones) sent so far.
    pub fn traffic(&self) -> super::Traffic {
        self.inner.stats.snapshot()
    }

    /// Establishes authorization for `scopes` on `registry` (as named in references) up front:
    /// learns the scheme (a `GET /v2/` probe, unless a request already told it), and for
    /// token auth fetches ONE token carrying every scope asked for so far (for a push:
    /// `Scope::push(target)` plus `Scope::pull(source)` per cross-repository mount source).
    /// Basic credentials are checked with `GET /v2/` (once).
    ///
    /// # Errors
    /// [`Error::Unauthorized`] when the credentials are rejected; transport errors.
    pub async fn authorize(&self, registry: &str, scopes: &[Scope]) -> Result<()> {
        let reg = self.inner.registry(registry)?;
        retry(&self.inner.retry, "authorizing", || async {
            reg.ensure_known(&self.inner).await?;
            reg.authorization(&self.inner, scopes).await
        })
        .await?;
        let verified = &reg.basic_verified;
        if reg.is_basic().await && !verified.load(std::sync::atomic::Ordering::Relaxed) {
            let call = Call::new(Method::GET, reg.url("/v2/"), scopes.to_vec());
            let resp = self.inner.send(&reg, &call).await?;
            if !resp.status().is_success() {
                return Err(status_error(&call, resp).await);
            }
            verified.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }
}
