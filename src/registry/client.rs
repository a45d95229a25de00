//! [`Client`]: a cheap-to-clone handle on one HTTP connection pool plus per-registry
//! authentication state, and the pipeline every request goes through ([`Inner::send`]):
//! authorization header, re-authorization on a 401 challenge, retry of retryable failures.
//! Its methods take `&self`, so a build can push blobs concurrently (`buffer_unordered`). The
//! manifest, blob and upload methods live in `manifests.rs`, `blobs.rs` and `upload.rs`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::{Certificate, Method, Response, StatusCode};
use url::Url;

use super::credentials::CredentialStore;
use super::documents::DocumentCache;
use super::error::{Error, Result};
use super::failure::{host_port, is_retryable_status};
use super::http::Http;
use super::policy::UploadPolicy;
use super::reference::api_host;
use super::retry::{RetryPolicy, retry};
use super::scope::Scope;
use super::session::Registry;
use super::transport::{Call, Transport, error_body, status_error};

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
    /// Without `cache_dir`: how many bytes of manifests, indexes and configs (and the small
    /// JSON documents pushed, such as signatures) to keep in memory by digest, the least
    /// recently used dropped first. For a long-running process that reads again what it read
    /// or wrote before (the controller rebasing an image it rebased). 0 keeps nothing.
    pub memory_documents: usize,
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
            memory_documents: 0,
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
        let http = Http::new(
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
        } else if config.memory_documents > 0 {
            inner.documents = Some(DocumentCache::in_memory(config.memory_documents));
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
        self.inner.transport.stats.snapshot()
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
            reg.ensure_known(&self.inner.transport).await?;
            reg.authorization(&self.inner.transport, scopes).await
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

/// Shared state behind a [`Client`].
pub(crate) struct Inner {
    /// The HTTP clients, timeout, counters and credential sources every request uses.
    pub transport: Transport,
    pub retry: RetryPolicy,
    pub upload: UploadPolicy,
    /// Manifests, indexes and configs by digest, in a directory or in memory.
    pub documents: Option<DocumentCache>,
    /// Where what each registry is known to refuse is kept across runs.
    pub facts_dir: Option<PathBuf>,
    insecure_hosts: Vec<String>,
    registries: Mutex<HashMap<String, Arc<Registry>>>,
    /// Blob pushes under way (`Client::push_once`).
    pub pushes: Mutex<HashMap<PushKey, PushSlot>>,
}

/// A blob push's registry, repository and digest.
pub(crate) type PushKey = (String, String, crate::oci::Digest);
/// Held while a blob is pushed; `true` once it was.
pub(crate) type PushSlot = Arc<tokio::sync::Mutex<bool>>;

impl Inner {
    pub fn new(
        http: Http,
        retry: RetryPolicy,
        timeout: Duration,
        credentials: CredentialStore,
        upload: UploadPolicy,
        insecure_hosts: Vec<String>,
    ) -> Inner {
        let insecure_hosts = insecure_hosts
            .iter()
            .map(|h| h.to_ascii_lowercase())
            .collect();
        let registries = Mutex::new(HashMap::new());
        let transport = Transport {
            http,
            timeout,
            credentials,
            stats: Arc::default(),
        };
        Inner {
            transport,
            retry,
            upload,
            documents: None,
            facts_dir: None,
            insecure_hosts,
            registries,
            pushes: Mutex::default(),
        }
    }

    /// The state of registry `name` (as named in references), created on first use.
    pub fn registry(&self, name: &str) -> Result<Arc<Registry>> {
        // Every way in (a parsed reference, or a name given as it is) is checked here: a name
        // that is no host[:port] (`https://reg`, a userinfo) could parse as one host and key
        // another's credentials.
        super::reference::check_registry(name).map_err(|problem| Error::InvalidReference {
            input: name.to_string(),
            problem,
        })?;
        let host = api_host(name).to_ascii_lowercase();
        let mut map = self.registries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(reg) = map.get(&host) {
            return Ok(reg.clone());
        }
        let insecure = self
            .insecure_hosts
            .iter()
            .any(|h| *h == host || *h == name.to_ascii_lowercase());
        let scheme = if insecure { "http" } else { "https" };
        let base =
            Url::parse(&format!("{scheme}://{host}/")).map_err(|_| Error::InvalidReference {
                input: name.to_string(),
                problem: "the registry is not a valid host[:port]",
            })?;
        let facts = self
            .facts_dir
            .as_ref()
            .map(|dir| dir.join(facts_file(&host)));
        let reg = Arc::new(Registry::new(name.to_string(), base, facts));
        map.insert(host, reg.clone());
        Ok(reg)
    }

    /// Sends `call` with authorization, re-authorization and retries. Returns any response
    /// that is not 401/403 and not retryable; those become errors.
    pub async fn send(&self, reg: &Registry, call: &Call) -> Result<Response> {
        retry(&self.retry, call.method.as_str(), || {
            self.send_once(reg, call)
        })
        .await
    }

    /// Like [`Inner::send`] without retrying (for callers that retry a larger unit).
    pub async fn send_once(&self, reg: &Registry, call: &Call) -> Result<Response> {
        let same_origin = reg.is_origin(&call.url);
        let auth = if same_origin {
            reg.authorization(&self.transport, &call.scopes).await?
        } else {
            None
        };
        let mut resp = self.transport.exchange(call, auth.as_ref()).await?;
        // A redirect (registries send blobs to storage) may end on another host: its answer
        // is not the registry's. reqwest drops the Authorization header across origins; a
        // 401 from there must not be taken as the registry's challenge either, or kiln would
        // fetch a token from a realm the other host names, with the registry's credentials.
        let answered_by_registry = same_origin && reg.is_origin(resp.url());
        let status = resp.status().as_u16();
        if same_origin && !answered_by_registry && (status == 401 || status == 403) {
            return Err(Error::RedirectRefused {
                method: call.method.clone(),
                url: call.shown_url(),
                host: host_port(resp.url()),
                status,
            });
        }
        if resp.status() == StatusCode::UNAUTHORIZED && answered_by_registry {
            // Once only: a new token with the union of scopes, or newly learnt Basic auth.
            let retry_with = reg
                .reauthorize(&self.transport, &call.scopes, resp.headers(), auth.as_ref())
                .await?;
            if let Some(header) = retry_with {
                resp = self.transport.exchange(call, Some(&header)).await?;
            }
        }
        let status = resp.status().as_u16();
        if answered_by_registry && auth.is_none() && status != 401 {
            reg.answered_anonymously().await;
        }
        if same_origin && (status == 401 || status == 403) {
            let errors = error_body(resp).await;
            return Err(Error::Unauthorized {
                registry: reg.name.clone(),
                method: call.method.clone(),
                url: call.shown_url(),
                status,
                errors,
                had_credentials: reg.has_credentials().await,
            });
        }
        if is_retryable_status(status) {
            return Err(status_error(call, resp).await);
        }
        Ok(resp)
    }
}

/// The file of what a registry is known to refuse: its `host[:port]` with `:` as `_`.
fn facts_file(host: &str) -> String {
    let safe: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{safe}.json")
}
