//! Per-registry state: how the registry authenticates (learnt from the first answer: a 401
//! challenge names the scheme, anything else means anonymous; a `GET /v2/` probe only for
//! [`super::Client::authorize`], so a build's anonymous registry sees only its requests),
//! the credential found for it, the current token and the scopes it must carry, and what the
//! registry is known to refuse. Shared by all concurrent requests; the async mutex makes
//! concurrent requests wait for a single token fetch.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode};
use tokio::sync::Mutex;
use tracing::debug;
use url::Url;

use super::auth::{Token, TokenRequest, basic_header, fetch_token};
use super::challenge::{self, BearerChallenge, Challenge};
use super::credential::Credential;
use super::error::Result;
use super::failure::is_retryable_status;
use super::scope::{Scope, ScopeSet};
use super::transport::{Call, Transport, status_error};

/// What a registry is known to refuse or serve, kept across runs.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Facts {
    #[serde(default)]
    monolithic_refused: bool,
    /// Whether it serves the OCI 1.1 referrers API, and when that was asked (Unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    referrers: Option<(bool, u64)>,
}

/// How long an answer about the referrers API is trusted: a registry may be upgraded.
const REFERRERS_KNOWN_FOR: u64 = 24 * 3600;

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Whether an answer about the referrers API given `at` (Unix seconds) is still trusted: in
/// the last day, and not in the future (another machine's clock, sharing the directory).
fn current(at: u64) -> bool {
    let now = unix_now();
    at <= now && now - at < REFERRERS_KNOWN_FOR
}

fn write_facts(path: &Path, facts: &Facts) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = tempfile::NamedTempFile::new_in(dir)?;
    serde_json::to_writer(&tmp, facts)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// How a registry wants to be authenticated.
#[derive(Clone, Debug)]
enum Scheme {
    /// Not known yet: requests go without credentials until one is answered 401.
    Unknown,
    /// A request without credentials was answered (not 401): none are sent until one is.
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
    /// `scheme://host[:port]/`.
    pub base: Url,
    /// Who its credentials may go to: its scheme, host and port.
    origin: Option<crate::origin::Origin>,
    /// Set once the registry answered a single-request `POST ?digest=` with 202 (distribution
    /// 2.8 does: it ignores the body and opens a session), so later blobs skip that attempt;
    /// kept across runs in `facts` ([`Registry::refuse_monolithic`]).
    monolithic_refused: AtomicBool,
    /// Whether it serves the referrers API, and since when that is known
    /// ([`Registry::serves_referrers`]); kept across runs in `facts`.
    referrers: std::sync::Mutex<Option<(bool, u64)>>,
    /// Held while the referrers API is asked about, so concurrent pushes ask once.
    pub referrers_probe: Mutex<()>,
    /// Where what this registry refuses is kept across runs (`registries/HOST.json` in the
    /// client's cache directory), if anywhere.
    facts: Option<PathBuf>,
    /// Set once Basic credentials were checked with `GET /v2/`, so later
    /// [`super::Client::authorize`] calls send nothing.
    pub basic_verified: AtomicBool,
    auth: Mutex<AuthState>,
}

impl Registry {
    /// Whether `url` is this registry's own (its credentials may go with a request there,
    /// and its answers are the registry's), by the one rule of [`crate::origin`].
    pub fn is_origin(&self, url: &Url) -> bool {
        self.origin.as_ref().is_some_and(|o| o.admits(url))
    }

    pub fn new(name: String, base: Url, facts: Option<PathBuf>) -> Registry {
        let known: Facts = facts
            .as_ref()
            .and_then(|f| std::fs::read(f).ok())
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let auth = AuthState {
            scheme: Scheme::Unknown,
            credential: None,
            wanted: ScopeSet::default(),
            token: None,
        };
        Registry {
            name,
            origin: crate::origin::Origin::of(&base),
            base,
            monolithic_refused: AtomicBool::new(known.monolithic_refused),
            referrers: std::sync::Mutex::new(known.referrers),
            referrers_probe: Mutex::new(()),
            facts,
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

    /// Notes that the single-request upload does not work here, for this run and later ones.
    pub fn refuse_monolithic(&self) {
        if self.monolithic_refused.swap(true, Ordering::Relaxed) {
            return;
        }
        self.keep_facts();
    }

    /// Whether the registry serves the OCI 1.1 referrers API, when that was learnt in the
    /// last day.
    pub fn serves_referrers(&self) -> Option<bool> {
        let known = *self.referrers.lock().unwrap_or_else(|e| e.into_inner());
        known
            .filter(|&(_, at)| current(at))
            .map(|(serves, _)| serves)
    }

    /// Notes whether the registry serves the referrers API, for this run and later ones.
    pub fn note_referrers(&self, serves: bool) {
        *self.referrers.lock().unwrap_or_else(|e| e.into_inner()) = Some((serves, unix_now()));
        self.keep_facts();
    }

    /// Writes what is known, over what the file says (another kiln may have written it since
    /// this one read it): a refusal is kept, and the later referrers answer wins.
    fn keep_facts(&self) {
        let Some(path) = &self.facts else {
            return;
        };
        let on_file: Facts = std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let ours = *self.referrers.lock().unwrap_or_else(|e| e.into_inner());
        // An answer past its day, or from the future (which would outlast every later one), is
        // none.
        let referrers = match (ours, on_file.referrers.filter(|&(_, at)| current(at))) {
            (Some(a), Some(b)) => Some(if a.1 >= b.1 { a } else { b }),
            (a, b) => a.or(b),
        };
        let facts = Facts {
            monolithic_refused: self.monolithic_refused.load(Ordering::Relaxed)
                || on_file.monolithic_refused,
            referrers,
        };
        if let Err(e) = write_facts(path, &facts) {
            debug!(path = %path.display(), error = %e, "not keeping what the registry refuses");
        }
    }

    /// Whether the registry uses Basic auth (known after its first 401).
    pub async fn is_basic(&self) -> bool {
        matches!(self.auth.lock().await.scheme, Scheme::Basic)
    }

    /// Whether a user credential was found for this registry.
    pub async fn has_credentials(&self) -> bool {
        matches!(self.auth.lock().await.credential, Some(Some(_)))
    }

    /// The `Authorization` value for a request needing `scopes`: none while the scheme is
    /// unknown; for token auth, fetches a token (carrying every scope wanted so far) when the
    /// current one does not cover `scopes` or is about to expire.
    pub async fn authorization(
        &self,
        cx: &Transport,
        scopes: &[Scope],
    ) -> Result<Option<HeaderValue>> {
        let mut st = self.auth.lock().await;
        for scope in scopes {
            st.wanted.insert(scope);
        }
        match st.scheme.clone() {
            // The first request goes without credentials; a 401 names the scheme
            // ([`Registry::reauthorize`]) and the token then carries every scope wanted so
            // far. An anonymous registry never sees more than the requests themselves.
            Scheme::Unknown | Scheme::Anonymous => Ok(None),
            Scheme::Basic => match self.credential(cx, &mut st).await? {
                Some(Credential::Basic { username, password }) => {
                    Ok(Some(basic_header(&username, &password)))
                }
                _ => Ok(None),
            },
            Scheme::Bearer(challenge) => {
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
                        registry_tls: self.base.scheme() == "https",
                        challenge: &challenge,
                        scopes: &st.wanted,
                        credential: credential.as_ref(),
                    };
                    cx.stats.request();
                    let token = fetch_token(&request).await?;
                    debug!(
                        registry = %self.name,
                        scopes = ?st.wanted.to_strings(),
                        "got registry token",
                    );
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
        cx: &Transport,
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
                    // What the challenge adds is taken only as far as a request of kiln's
                    // could need it: a repository's pull or push (never `*`, `delete` or the
                    // catalog), for a repository one of them names.
                    needed.extend(
                        bearer
                            .scopes
                            .iter()
                            .filter_map(|s| Scope::parse(s))
                            .filter(|s| s.is_plain_repository_access())
                            .filter(|s| scopes.iter().any(|own| own.name() == s.name())),
                    );
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

    /// Adds `scopes` to those every token carries, without sending anything.
    pub async fn want(&self, scopes: &[Scope]) {
        let mut st = self.auth.lock().await;
        for scope in scopes {
            st.wanted.insert(scope);
        }
    }

    /// Learns the scheme with a `GET /v2/` probe if no request has told it yet (for callers
    /// that want credentials checked before they start).
    pub async fn ensure_known(&self, cx: &Transport) -> Result<()> {
        let mut st = self.auth.lock().await;
        if matches!(st.scheme, Scheme::Unknown) {
            st.scheme = self.probe(cx).await?;
        }
        Ok(())
    }

    /// A request sent without credentials was answered without a challenge: the registry
    /// is anonymous (for now: a later 401 names the scheme).
    pub async fn answered_anonymously(&self) {
        let mut st = self.auth.lock().await;
        if matches!(st.scheme, Scheme::Unknown) {
            st.scheme = Scheme::Anonymous;
        }
    }

    /// `GET /v2/` without credentials: 200 means anonymous, 401 names the scheme. Tried
    /// once: the request that needed it is retried as a whole.
    async fn probe(&self, cx: &Transport) -> Result<Scheme> {
        let call = Call::new(Method::GET, self.url("/v2/"), Vec::new());
        let resp = cx.exchange(&call, None).await?;
        if is_retryable_status(resp.status().as_u16()) {
            return Err(status_error(&call, resp).await);
        }
        // Only the registry's own challenge says how to authenticate to it: one from where a
        // redirect led would have the registry's credentials sent to a token service that
        // host names. (Another host's 200 says nothing either: anonymous until the registry
        // itself asks.)
        let own = self.is_origin(resp.url());
        if !own && resp.status() == StatusCode::UNAUTHORIZED {
            return Err(super::error::Error::RedirectRefused {
                method: call.method.clone(),
                url: call.shown_url(),
                host: super::failure::host_port(resp.url()),
                status: resp.status().as_u16(),
            });
        }
        let scheme = if own && resp.status() == StatusCode::UNAUTHORIZED {
            match challenge::from_headers(resp.headers()) {
                Some(Challenge::Basic) => Scheme::Basic,
                Some(Challenge::Bearer(b)) => Scheme::Bearer(b),
                None => Scheme::Anonymous,
            }
        } else {
            Scheme::Anonymous
        };
        debug!(registry = %self.name, ?scheme, "probed registry");
        Ok(scheme)
    }

    async fn credential(&self, cx: &Transport, st: &mut AuthState) -> Result<Option<Credential>> {
        if st.credential.is_none() {
            st.credential = Some(cx.credentials.lookup(&self.name).await?);
        }
        Ok(st.credential.clone().flatten())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_about_referrers_is_trusted_for_a_day_and_never_from_the_future() {
        let now = unix_now();
        assert!(current(now));
        assert!(current(now - REFERRERS_KNOWN_FOR + 60));
        assert!(!current(now - REFERRERS_KNOWN_FOR));
        // Another machine's clock, an hour ahead, sharing the cache directory.
        assert!(!current(now + 3600));
    }
}
