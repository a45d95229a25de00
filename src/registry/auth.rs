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
/// The longest a token is kept, whatever its service says.
const MAX_TOKEN_SECONDS: u64 = 24 * 60 * 60;
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
    /// Whether the registry is reached over TLS: its credentials then never go to a realm
    /// in the clear.
    pub registry_tls: bool,
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
    if req.credential.is_some() && req.registry_tls && realm.scheme() != "https" {
        return Err(Error::Protocol {
            method: Method::GET,
            url: redact_url(&realm),
            problem: "the registry (over TLS) names a token realm without TLS: its credentials \
                      would cross the network in the clear, so kiln does not send them",
        });
    }
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
        // A body reqwest cannot send twice: a 307/308 (to any host) is answered back, not
        // followed with the refresh token.
        let form = bytes::Bytes::from(form.finish());
        let length = form.len();
        let once = futures_util::stream::once(async move { Ok::<_, std::io::Error>(form) });
        let builder = http
            .post(realm.clone())
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            // Sized, not chunked: token services read a plain form.
            .header(reqwest::header::CONTENT_LENGTH, length)
            .body(reqwest::Body::wrap_stream(once));
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
    // A day at most: the token service's number is not to be trusted with arithmetic (a
    // lifetime near u64::MAX overflowed the sum below and panicked).
    let lifetime = parsed
        .expires_in
        .unwrap_or(DEFAULT_TOKEN_SECONDS)
        .clamp(1, MAX_TOKEN_SECONDS);
    // Refresh after three quarters of the lifetime, so a token does not expire mid-request.
    let refresh_at = Instant::now() + Duration::from_secs(lifetime * 3 / 4);
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

    /// A token service that answers the refresh-token POST with a redirect to another host:
    /// the form (with the refresh token) is not sent there. And a registry over TLS that
    /// names a realm without TLS gets no credentials at all.
    #[tokio::test]
    async fn a_refresh_token_follows_no_redirect_and_never_goes_in_the_clear() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let other = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let other_port = other.local_addr().unwrap().port();
        let reached = tokio::spawn(async move {
            let (mut s, _) = other.accept().await.unwrap();
            let mut buf = vec![0; 4096];
            let n = s.read(&mut buf).await.unwrap_or(0);
            String::from_utf8_lossy(&buf[..n]).into_owned()
        });
        let realm = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let realm_port = realm.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = realm.accept().await.unwrap();
            let mut buf = vec![0; 4096];
            let _ = s.read(&mut buf).await;
            let answer = format!(
                "HTTP/1.1 307 Temporary Redirect\r\nLocation: http://127.0.0.1:{other_port}/t\r\n\
                 Content-Length: 0\r\nConnection: close\r\n\r\n"
            );
            s.write_all(answer.as_bytes()).await.unwrap();
        });
        let http =
            super::super::http::Http::new("t".into(), Duration::from_secs(5), Vec::new()).unwrap();
        let challenge = BearerChallenge {
            realm: format!("http://127.0.0.1:{realm_port}/token"),
            service: None,
            scopes: Vec::new(),
            error: None,
        };
        let refresh = Credential::IdentityToken("refresh-secret-123".into());
        let scopes = ScopeSet::default();
        let request = |registry_tls| TokenRequest {
            http: &http,
            timeout: Duration::from_secs(5),
            registry: "reg.example",
            registry_tls,
            challenge: &challenge,
            scopes: &scopes,
            credential: Some(&refresh),
        };
        let err = fetch_token(&request(false)).await.unwrap_err();
        assert!(err.to_string().contains("307"), "{err}");
        let seen = tokio::time::timeout(Duration::from_millis(300), reached).await;
        assert!(seen.is_err(), "the redirect was followed: {seen:?}");
        let err = fetch_token(&request(true)).await.unwrap_err();
        assert!(err.to_string().contains("without TLS"), "{err}");
    }

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
        // A lifetime no arithmetic survives is a day.
        let t = token_from_body(br#"{"token":"t","expires_in":18446744073709551615}"#, &set);
        let left = t.unwrap().refresh_at - Instant::now();
        assert!(
            left <= Duration::from_secs(MAX_TOKEN_SECONDS * 3 / 4),
            "{left:?}"
        );
    }

    #[test]
    fn basic_headers_are_encoded_and_sensitive() {
        let h = basic_header("user", "pa:ss");
        assert_eq!(h.to_str().unwrap(), "Basic dXNlcjpwYTpzcw==");
        assert!(h.is_sensitive());
    }
}
