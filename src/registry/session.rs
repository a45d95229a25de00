//! Per-registry state: how the registry authenticates (learnt once from a `GET /v2/` probe or
//! a 401 challenge), the credential found for it, the current token and the scopes it must
//! carry, and what the registry is known to refuse. Shared by all concurrent requests; the
//! async mutex makes concurrent requests wait for a single probe or token fetch.

use std::sync::atomic::{AtomicBool, Ordering};

use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode};
use tokio::sync::Mutex;
use tracing::debug;
use url::Url;

use super::auth::{Scope, ScopeSet, Token, TokenRequest, basic_header, fetch_token};
use super::challenge::{self, BearerChallenge, Challenge};
use super::credentials::Credential;
use super::error::Result;
use super::failure::is_retryable_status;
use super::transport::{Call, Inner, status_error};

/// How a registry wants to be authenticated.
#[derive(Clone, Debug)]
enum Scheme {
    /// Not probed yet.
    Unprobed,
    /// No authentication asked for.
    Anonymous,
    /// HTTP Basic on every request.
    Basic,
    /// Bearer tokens from a token service.
    Bearer(BearerChallenge),
}

#[derive(Debug)]
struct AuthState {
    scheme: Scheme,
    /// `None` until looked up; then the lookup result.
    credential: Option<Option<Credential>>,
    /// Every scope asked for so far: each new token carries all of them.
    wanted: ScopeSet,
    token: Option<Token>,
}

/// One registry's shared state.
#[derive(Debug)]
pub(crate) struct Registry {
    /// The registry as named in references (for credentials and messages).
    pub name: String,
    /// `host[:port]` of its API.
    pub host: String,
    /// `scheme://host[:port]/`.
    pub base: Url,
    /// Set once the registry answered a single-request `POST ?digest=` with 202 (distribution
    /// 2.8 does: it ignores the body and opens a session), so later blobs skip that attempt.
    pub monolithic_refused: AtomicBool,
    /// Set once Basic credentials were checked with `GET /v2/`, so later
    /// [`super::Client::authorize`] calls send nothing.
    pub basic_verified: AtomicBool,
    auth: Mutex<AuthState>,
}

impl Registry {
    pub fn new(name: String, host: String, base: Url) -> Registry {
        let auth = AuthState {
            scheme: Scheme::Unprobed,
            credential: None,
            wanted: ScopeSet::default(),
            token: None,
        };
        Registry {
            name,
            host,
            base,
            monolithic_refused: AtomicBool::new(false),
            basic_verified: AtomicBool::new(false),
            auth: Mutex::new(auth),
        }
    }

    /// A URL on this registry (`path` starts with `/v2/`).
    pub fn url(&self, path: &str) -> Url {
        let mut url = self.base.clone();
        url.set_path(path);
        url
    }

    /// Whether the single-request monolithic upload is known not to work here.
    pub fn refuses_monolithic(&self) -> bool {
        self.monolithic_refused.load(Ordering::Relaxed)
    }

    /// Whether the registry uses Basic auth (known after the probe).
    pub async fn is_basic(&self) -> bool {
        matches!(self.auth.lock().await.scheme, Scheme::Basic)
    }

    /// Whether a user credential was found for this registry.
    pub async fn has_credentials(&self) -> bool {
        matches!(self.auth.lock().await.credential, Some(Some(_)))
    }

    /// The `Authorization` value for a request needing `scopes`: probes the registry on first
    /// use and fetches a token (carrying every scope wanted so far) when the current one does
    /// not cover `scopes` or is about to expire.
    pub async fn authorization(&self, cx: &Inner, scopes: &[Scope]) -> Result<Option<HeaderValue>> {
        let mut st = self.auth.lock().await;
        if matches!(st.scheme, Scheme::Unprobed) {
            st.scheme = self.probe(cx).await?;
        }
        match st.scheme.clone() {
            Scheme::Unprobed | Scheme::Anonymous => Ok(None),
            Scheme::Basic => match self.credential(cx, &mut st).await? {
                Some(Credential::Basic { username, password }) => {
                    Ok(Some(basic_header(&username, &password)))
                }
                _ => Ok(None),
            },
            Scheme::Bearer(challenge) => {
                for scope in scopes {
                    st.wanted.insert(scope);
                }
                let usable = st
                    .token
                    .as_ref()
                    .is_some_and(|t| t.is_fresh() && t.scopes.covers_all(scopes));
                if !usable {
                    let credential = self.credential(cx, &mut st).await?;
                    let request = TokenRequest {
                        http: &cx.http,
                        timeout: cx.timeout,
                        registry: &self.name,
                        challenge: &challenge,
                        scopes: &st.wanted,
                        credential: credential.as_ref(),
                    };
                    let token = fetch_token(&request).await?;
                    debug!(registry = %self.name, scopes = ?st.wanted.to_strings(), "got registry token");
                    st.token = Some(token);
                }
                Ok(st.token.as_ref().map(|t| t.header.clone()))
            }
        }
    }

    /// Handles a 401: learns the scheme and scopes from its challenge, then returns the header
    /// to retry with, or `None` when retrying could not help (no challenge, or the same
    /// credentials or token would be sent again).
    pub async fn reauthorize(
        &self,
        cx: &Inner,
        scopes: &[Scope],
        headers: &HeaderMap,
        sent: Option<&HeaderValue>,
    ) -> Result<Option<HeaderValue>> {
        let Some(challenge) = challenge::from_headers(headers) else {
            return Ok(None);
        };
        let mut needed = scopes.to_vec();
        {
            let mut st = self.auth.lock().await;
            match challenge {
                Challenge::Basic => st.scheme = Scheme::Basic,
                Challenge::Bearer(bearer) => {
                    needed.extend(bearer.scopes.iter().filter_map(|s| Scope::parse(s)));
                    let invalid = bearer.error.as_deref() == Some("invalid_token");
                    let stale = st
                        .token
                        .as_ref()
                        .is_some_and(|t| Some(&t.header) == sent && (invalid || !t.is_fresh()));
                    if stale {
                        st.token = None;
                    }
                    st.scheme = Scheme::Bearer(bearer);
                }
            }
        }
        let header = self.authorization(cx, &needed).await?;
        Ok(header.filter(|h| Some(h) != sent))
    }

    /// `GET /v2/` without credentials: 200 means anonymous, 401 names the scheme. Tried
    /// once: the request that needed it is retried as a whole.
    async fn probe(&self, cx: &Inner) -> Result<Scheme> {
        let call = Call::new(Method::GET, self.url("/v2/"), Vec::new());
        let resp = cx.exchange(&call, None).await?;
        if is_retryable_status(resp.status().as_u16()) {
            return Err(status_error(&call, resp).await);
        }
        let scheme = if resp.status() == StatusCode::UNAUTHORIZED {
            match challenge::from_headers(resp.headers()) {
                Some(Challenge::Basic) => Scheme::Basic,
                Some(Challenge::Bearer(b)) => Scheme::Bearer(b),
                None => Scheme::Anonymous,
            }
        } else {
            Scheme::Anonymous
        };
        debug!(registry = %self.name, scheme = ?scheme_name(&scheme), "probed registry");
        Ok(scheme)
    }

    async fn credential(&self, cx: &Inner, st: &mut AuthState) -> Result<Option<Credential>> {
        if st.credential.is_none() {
            st.credential = Some(cx.credentials.lookup(&self.name).await?);
        }
        Ok(st.credential.clone().flatten())
    }
}

fn scheme_name(scheme: &Scheme) -> &'static str {
    match scheme {
        Scheme::Unprobed => "unprobed",
        Scheme::Anonymous => "anonymous",
        Scheme::Basic => "basic",
        Scheme::Bearer(_) => "bearer",
    }
}
