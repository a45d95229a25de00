//! The HTTP clients under the registry client. Building a TLS client reads and parses every
//! certificate the platform trusts — about 4 ms here, a quarter of a no-change build — so it
//! is built on the first request that needs TLS. Requests to a plain-HTTP registry (an
//! in-cluster one, `--insecure-registry`) go through a client without roots, which does not
//! follow a redirect to https: the TLS client does (a registry sending a blob to storage).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use reqwest::redirect::Policy;
use reqwest::{Certificate, Client};
use url::Url;

use super::error::{Error, Result};

/// Redirects reqwest follows at most (its own default).
const MAX_REDIRECTS: usize = 10;

/// See the module docs.
pub(crate) struct Http {
    plain: Client,
    tls: OnceLock<std::result::Result<Client, Arc<reqwest::Error>>>,
    user_agent: String,
    connect_timeout: Duration,
    extra_roots: Vec<Certificate>,
}

impl Http {
    /// Clients sending `user_agent`, trusting the platform's roots plus `extra_roots`.
    ///
    /// # Errors
    /// [`Error::HttpClient`] when the plain client cannot be built.
    pub fn new(
        user_agent: String,
        connect_timeout: Duration,
        extra_roots: Vec<Certificate>,
    ) -> Result<Http> {
        let plain = Client::builder()
            .user_agent(user_agent.clone())
            .connect_timeout(connect_timeout)
            // No platform roots are loaded; this client never speaks TLS.
            .tls_certs_only([])
            // A redirect's target does not learn where it came from (an upload URL's
            // `_state`, a signed query).
            .referer(false)
            .redirect(Policy::custom(|attempt| {
                if attempt.url().scheme() != "http" {
                    attempt.stop()
                } else if attempt.previous().len() >= MAX_REDIRECTS {
                    attempt.error("too many redirects")
                } else {
                    attempt.follow()
                }
            }))
            .build()
            .map_err(|source| Error::HttpClient { source })?;
        Ok(Http {
            plain,
            tls: OnceLock::new(),
            user_agent,
            connect_timeout,
            extra_roots,
        })
    }

    /// The client for `url`: the plain one for `http://`, else the TLS one (built now if
    /// this is the first).
    ///
    /// # Errors
    /// [`Error::TlsSetup`] when the TLS client cannot be built.
    pub fn client_for(&self, url: &Url) -> Result<&Client> {
        if url.scheme() == "http" {
            return Ok(&self.plain);
        }
        self.tls()
    }

    /// The TLS client, built on first use.
    ///
    /// # Errors
    /// [`Error::TlsSetup`] when it cannot be built.
    pub fn tls(&self) -> Result<&Client> {
        let built = self.tls.get_or_init(|| {
            Client::builder()
                .user_agent(self.user_agent.clone())
                .connect_timeout(self.connect_timeout)
                .tls_certs_merge(self.extra_roots.clone())
                .referer(false)
                .build()
                .map_err(Arc::new)
        });
        built.as_ref().map_err(|source| Error::TlsSetup {
            source: source.clone(),
        })
    }
}

/// Where a plain-HTTP answer redirects to https, if it does: the TLS client takes it from
/// there.
pub(crate) fn https_redirect(resp: &reqwest::Response) -> Option<Url> {
    if !resp.status().is_redirection() || resp.url().scheme() != "http" {
        return None;
    }
    let location = resp
        .headers()
        .get(reqwest::header::LOCATION)?
        .to_str()
        .ok()?;
    let next = resp.url().join(location).ok()?;
    (next.scheme() == "https").then_some(next)
}
