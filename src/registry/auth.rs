//! The distribution token protocol
//! (<https://distribution.github.io/distribution/spec/auth/token/>): one Bearer token per
//! registry that carries *every* scope the build needs (`repository:TARGET:pull,push` plus
//! `repository:SOURCE:pull` for each cross-repository mount source), fetched with a `GET` and
//! Basic credentials (or anonymously), or with the OAuth2 refresh-token `POST` for identity
//! tokens.

use std::time::{Duration, Instant};

use base64::Engine as _;
use reqwest::header::{CONTENT_TYPE, HeaderValue};
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use tracing::debug;
use url::Url;

use super::challenge::BearerChallenge;
use super::credential::Credential;
use super::error::{Error, Result};
use super::failure::is_retryable_status;
use super::scope::ScopeSet;
use super::transport::{error_body, read_capped};
use crate::redact::redact_url;

/// Token lifetime the spec tells clients to assume when the server does not say.
const DEFAULT_TOKEN_SECONDS: u64 = 60;
const CLIENT_ID: &str = "kiln";
/// The most a token response may be: a JSON object with a token (a JWT of a few kB) or two.
const TOKEN_LIMIT: u64 = 1 << 20;

/// A Bearer token with the scopes it was requested for.
#[derive(Clone, Debug)]
pub(crate) struct Token {
    /// `Authorization: Bearer …`, marked sensitive.
    pub header: HeaderValue,
    /// The scopes asked for when it was issued.
    pub scopes: ScopeSet,
    refresh_at: Instant,
}

impl Token {
    /// Whether the token is still comfortably inside its lifetime.
    pub fn is_fresh(&self) -> bool {
        Instant::now() < self.refresh_at
    }
}

#[derive(Deserialize)]
struct TokenResponse {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
    #[serde(default)]
    expires_in: Option<u64>,
}

/// Everything needed to ask a token service for a token.
pub(crate) struct TokenRequest<'a> {
    /// The HTTP client.
    pub http: &'a super::http::Http,
    /// Per-request timeout.
    pub timeout: Duration,
    /// The registry name, for errors.
    pub registry: &'a str,
    /// The challenge naming realm and service.
    pub challenge: &'a BearerChallenge,
    /// Every scope the token must carry.
    pub scopes: &'a ScopeSet,
    /// The credential to present, if any.
    pub credential: Option<&'a Credential>,
}

/// Fetches one token carrying all of `req.scopes`, in one attempt: the request that needed
/// it is retried as a whole.
pub(crate) async fn fetch_token(req: &TokenRequest<'_>) -> Result<Token> {
    let realm = Url::parse(&req.challenge.realm).map_err(|_| Error::Protocol {
        method: Method::GET,
        url: "<token realm>".into(),
        problem: "the Bearer challenge realm is not a URL",
    })?;
    let scopes = req.scopes.to_strings();
    let http = req.http.client_for(&realm)?;
    let (method, url, builder) = build_token_request(http, req, &realm, &scopes);
    let result = builder.timeout(req.timeout).send().await;
    let resp = match result {
        Ok(r) => r,
        Err(e) => return Err(Error::transport(&method, &url, e)),
    };
    let status = resp.status();
    debug!(method = %method, url = %redact_url(&url), status = status.as_u16(), "token request");
    if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
        let errors = error_body(resp).await;
        return Err(Error::Unauthorized {
            registry: req.registry.to_string(),
            method,
            url: redact_url(&url),
            status: status.as_u16(),
            errors,
            had_credentials: req.credential.is_some(),
        });
    }
    if !status.is_success() {
        let errors = if is_retryable_status(status.as_u16()) {
            Vec::new()
        } else {
            error_body(resp).await
        };
        let url = redact_url(&url);
        return Err(Error::Status {
            method,
            url,
            status: status.as_u16(),
            errors,
            retry_after: None,
        });
    }
    // The realm may be any host the registry names: say which.
    let what = format!(
        "the token response of {} (the registry's token realm)",
        redact_url(&url)
    );
    let body = read_capped(resp, TOKEN_LIMIT, &what, (&method, &url)).await?;
    token_from_body(&body, req.scopes).ok_or_else(|| Error::Protocol {
        method,
        url: redact_url(&url),
        problem: "the token response has neither a usable `token` nor `access_token`",
    })
}

fn build_token_request(
    http: &reqwest::Client,
    req: &TokenRequest<'_>,
    realm: &Url,
    scopes: &[String],
) -> (Method, Url, reqwest::RequestBuilder) {
    if let Some(Credential::IdentityToken(refresh)) = req.credential {
        let mut form = url::form_urlencoded::Serializer::new(String::new());
        form.append_pair("grant_type", "refresh_token");
        form.append_pair("client_id", CLIENT_ID);
        if let Some(service) = &req.challenge.service {
            form.append_pair("service", service);
        }
        form.append_pair("scope", &scopes.join(" "));
        form.append_pair("refresh_token", refresh);
        let builder = http
            .post(realm.clone())
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(form.finish());
        return (Method::POST, realm.clone(), builder);
    }
    let mut url = realm.clone();
    {
        let mut q = url.query_pairs_mut();
        if let Some(service) = &req.challenge.service {
            q.append_pair("service", service);
        }
        for scope in scopes {
            q.append_pair("scope", scope);
        }
    }
    let mut builder = http.get(url.clone());
    if let Some(Credential::Basic { username, password }) = req.credential {
        builder = builder.header(
            reqwest::header::AUTHORIZATION,
            basic_header(username, password),
        );
    }
    (Method::GET, url, builder)
}

fn token_from_body(body: &[u8], scopes: &ScopeSet) -> Option<Token> {
    let parsed: TokenResponse = serde_json::from_slice(body).ok()?;
    let token = parsed
        .token
        .filter(|t| !t.is_empty())
        .or(parsed.access_token)?;
    let mut header = HeaderValue::from_str(&format!("Bearer {token}")).ok()?;
    header.set_sensitive(true);
    let lifetime = parsed.expires_in.unwrap_or(DEFAULT_TOKEN_SECONDS).max(1);
    // Refresh after three quarters of the lifetime, so a token does not expire mid-request.
    let refresh_at = Instant::now() + Duration::from_secs(lifetime) * 3 / 4;
    Some(Token {
        header,
        scopes: scopes.clone(),
        refresh_at,
    })
}

/// `Authorization: Basic base64(user:pass)`, marked sensitive.
pub(crate) fn basic_header(username: &str, password: &str) -> HeaderValue {
    let encoded =
        base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"));
    let mut value = HeaderValue::from_str(&format!("Basic {encoded}"))
        .expect("base64 output is always a valid header value");
    value.set_sensitive(true);
    value
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn token_bodies_accept_token_or_access_token() {
        let set = ScopeSet::default();
        let t = token_from_body(br#"{"token":"abc","expires_in":300}"#, &set).unwrap();
        assert_eq!(t.header.to_str().unwrap(), "Bearer abc");
        assert!(t.header.is_sensitive() && t.is_fresh());
        let t = token_from_body(br#"{"access_token":"xyz"}"#, &set).unwrap();
        assert_eq!(t.header.to_str().unwrap(), "Bearer xyz");
        let t = token_from_body(br#"{"token":"","access_token":"fallback"}"#, &set).unwrap();
        assert_eq!(t.header.to_str().unwrap(), "Bearer fallback");
        assert!(token_from_body(br#"{"expires_in":1}"#, &set).is_none());
        assert!(token_from_body(b"<html>", &set).is_none());
    }

    #[test]
    fn basic_headers_are_encoded_and_sensitive() {
        let h = basic_header("user", "pa:ss");
        assert_eq!(h.to_str().unwrap(), "Basic dXNlcjpwYTpzcw==");
        assert!(h.is_sensitive());
    }
}
