//! One HTTP exchange with a registry: the request ([`Call`], sendable any number of times),
//! sending it once without auth logic ([`Transport::exchange`]) with a `debug!` line per
//! request (method, redacted URL, status), the traffic counters, and reading answers (capped
//! bodies, error envelopes, status errors, headers). Bodies are re-created for every attempt
//! (files are re-opened), never buffered whole, and never logged. The pipeline around it
//! (authorization, re-authorization on a 401, retry) is `client.rs`'s.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::TryStreamExt;
use reqwest::header::{
    AUTHORIZATION, CONTENT_LENGTH, HeaderMap, HeaderName, HeaderValue, LOCATION,
};
use reqwest::{Body, Method, Response};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio_util::io::ReaderStream;
use tracing::debug;
use url::Url;

use super::credentials::CredentialStore;
use super::error::{Error, ErrorInfo, Result};
use super::failure::parse_envelope;
use super::http::{Http, https_redirect};
use super::scope::Scope;
use crate::redact::redact_url;

/// Error bodies are read up to this size (they are small JSON envelopes).
const ERROR_BODY_LIMIT: usize = 64 * 1024;
const FILE_READ_BUFFER: usize = 256 * 1024;
/// The slowest average rate a large transfer may have before its overall timeout hits.
const MIN_TRANSFER_RATE: u64 = 64 * 1024;

/// Overall time allowed for a request moving `bytes` of body: the request timeout plus what
/// the bytes take at [`MIN_TRANSFER_RATE`]. Stalls are caught sooner by per-chunk timeouts.
pub(crate) fn transfer_timeout(request_timeout: Duration, bytes: u64) -> Duration {
    request_timeout + Duration::from_secs(bytes / MIN_TRANSFER_RATE)
}

/// The next chunk of a response body, failing with [`Error::Stalled`] when none arrives
/// within `stall`.
pub(crate) async fn next_chunk(
    call: &Call,
    resp: &mut Response,
    stall: Duration,
) -> Result<Option<Bytes>> {
    match tokio::time::timeout(stall, resp.chunk()).await {
        Ok(Ok(chunk)) => Ok(chunk),
        Ok(Err(e)) => Err(Error::transport(&call.method, &call.url, e)),
        Err(_) => Err(Error::Stalled {
            method: call.method.clone(),
            url: call.shown_url(),
            after: stall,
        }),
    }
}

/// What a request sends.
#[derive(Clone, Debug)]
pub(crate) enum Payload {
    /// No body (`Content-Length: 0` for methods that carry one).
    Empty,
    /// In-memory bytes.
    Bytes(Bytes),
    /// `len` bytes of a file from `offset`, streamed.
    File {
        path: PathBuf,
        offset: u64,
        len: u64,
    },
}

/// A request description that can be sent any number of times.
#[derive(Clone, Debug)]
pub(crate) struct Call {
    pub method: Method,
    pub url: Url,
    pub headers: HeaderMap,
    pub payload: Payload,
    /// The access this request needs.
    pub scopes: Vec<Scope>,
    /// Total time allowed; the client's request timeout when `None`.
    pub timeout: Option<Duration>,
    /// Incremented with every body byte handed to the connection.
    pub sent: Option<Arc<AtomicU64>>,
}

impl Call {
    pub fn new(method: Method, url: Url, scopes: Vec<Scope>) -> Call {
        Call {
            method,
            url,
            headers: HeaderMap::new(),
            payload: Payload::Empty,
            scopes,
            timeout: None,
            sent: None,
        }
    }

    pub fn header(mut self, name: HeaderName, value: HeaderValue) -> Call {
        self.headers.insert(name, value);
        self
    }

    pub fn payload(mut self, payload: Payload, sent: Option<Arc<AtomicU64>>) -> Call {
        self.payload = payload;
        self.sent = sent;
        self
    }

    /// The URL for errors and logs.
    pub fn shown_url(&self) -> String {
        redact_url(&self.url)
    }
}

/// What a client sent: every HTTP request to a registry or token server (retries included)
/// and the body bytes handed to the connection. For `kiln build --report`.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    requests: AtomicU64,
    bytes_sent: AtomicU64,
}

impl Stats {
    /// Counts one request.
    pub fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn snapshot(&self) -> Traffic {
        Traffic {
            requests: self.requests.load(Ordering::Relaxed),
            bytes_sent: self.bytes_sent.load(Ordering::Relaxed),
        }
    }
}

/// Requests and bytes a client sent so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Traffic {
    /// HTTP requests, retries and token fetches included.
    pub requests: u64,
    /// Request body bytes.
    pub bytes_sent: u64,
}

/// What every request needs below the per-registry state: the HTTP clients, the time allowed
/// per request, the traffic counters, and where credentials come from (for the token fetches
/// a registry's session makes). Shared by all registries of a client.
pub(crate) struct Transport {
    pub http: Http,
    pub timeout: Duration,
    pub credentials: CredentialStore,
    pub stats: Arc<Stats>,
}

impl Transport {
    /// One HTTP exchange, no auth logic. Transport failures become [`Error::Transport`].
    pub async fn exchange(&self, call: &Call, auth: Option<&HeaderValue>) -> Result<Response> {
        let mut req = self
            .http
            .client_for(&call.url)?
            .request(call.method.clone(), call.url.clone())
            .headers(call.headers.clone());
        if let Some(value) = auth {
            req = req.header(AUTHORIZATION, value.clone());
        }
        req = req.timeout(call.timeout.unwrap_or(self.timeout));
        self.stats.request();
        req = match &call.payload {
            Payload::Empty if matches!(call.method, Method::POST | Method::PUT | Method::PATCH) => {
                req.body(Bytes::new())
            }
            Payload::Empty => req,
            Payload::Bytes(bytes) => {
                count(&call.sent, bytes.len() as u64);
                self.stats
                    .bytes_sent
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                req.body(bytes.clone())
            }
            Payload::File { path, offset, len } => {
                let counters = (call.sent.clone(), self.stats.clone());
                let body = file_body(path, *offset, *len, counters).await?;
                req.header(CONTENT_LENGTH, *len).body(body)
            }
        };
        match req.send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                debug!(method = %call.method, url = %call.shown_url(), status, "registry request");
                match https_redirect(&resp) {
                    // A plain-HTTP registry sends a download to https storage: follow it
                    // there, without the registry's Authorization (as reqwest would).
                    Some(next) if matches!(call.method, Method::GET | Method::HEAD) => {
                        self.stats.request();
                        let req = self
                            .http
                            .tls()?
                            .request(call.method.clone(), next.clone())
                            .headers(call.headers.clone())
                            .timeout(call.timeout.unwrap_or(self.timeout));
                        req.send()
                            .await
                            .map_err(|err| Error::transport(&call.method, &next, err))
                    }
                    _ => Ok(resp),
                }
            }
            Err(err) => {
                let err = Error::transport(&call.method, &call.url, err);
                debug!(
                    method = %call.method,
                    url = %call.shown_url(),
                    error = %err,
                    "registry request failed",
                );
                Err(err)
            }
        }
    }
}

fn count(sent: &Option<Arc<AtomicU64>>, n: u64) {
    if let Some(counter) = sent {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// A streaming body over `len` bytes of `path` from `offset`, counting what is read out (into
/// the call's counter and the client's).
async fn file_body(
    path: &PathBuf,
    offset: u64,
    len: u64,
    (sent, stats): (Option<Arc<AtomicU64>>, Arc<Stats>),
) -> Result<Body> {
    let io = |source| {
        Error::Io(crate::io_error::IoError {
            action: "opening blob source",
            path: path.clone(),
            source,
        })
    };
    let mut file = tokio::fs::File::open(path).await.map_err(io)?;
    if offset > 0 {
        file.seek(std::io::SeekFrom::Start(offset))
            .await
            .map_err(io)?;
    }
    let stream =
        ReaderStream::with_capacity(file.take(len), FILE_READ_BUFFER).inspect_ok(move |chunk| {
            count(&sent, chunk.len() as u64);
            stats
                .bytes_sent
                .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        });
    Ok(Body::wrap_stream(stream))
}

/// The body of `resp` (the answer to `method` `url`), at most `limit` bytes: a declared
/// length above it fails before anything is read, a longer body as soon as it passes the
/// limit.
///
/// # Errors
/// [`Error::TooLarge`] naming `what`, and transport errors.
pub(crate) async fn read_capped(
    resp: Response,
    limit: u64,
    what: &str,
    (method, url): (&Method, &Url),
) -> Result<Vec<u8>> {
    crate::capped::read(resp, limit)
        .await
        .map_err(|failure| match failure {
            crate::capped::Failure::TooLarge => Error::TooLarge {
                what: what.to_string(),
                limit,
            },
            crate::capped::Failure::Http(e) => Error::transport(method, url, e),
        })
}

/// Reads an error body (capped) and parses its OCI error envelope.
pub(crate) async fn error_body(mut resp: Response) -> Vec<ErrorInfo> {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        body.extend_from_slice(&chunk);
        if body.len() > ERROR_BODY_LIMIT {
            break;
        }
    }
    parse_envelope(&body)
}

/// [`Error::Status`] for an unexpected response.
pub(crate) async fn status_error(call: &Call, resp: Response) -> Error {
    let status = resp.status().as_u16();
    let retry_after = retry_after(&resp);
    let errors = error_body(resp).await;
    Error::Status {
        method: call.method.clone(),
        url: call.shown_url(),
        status,
        errors,
        retry_after,
    }
}

/// `Retry-After` in seconds (the HTTP-date form is not used by registries and is ignored).
fn retry_after(resp: &Response) -> Option<Duration> {
    header(resp, &reqwest::header::RETRY_AFTER)?
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

/// [`Error::NotFound`] for a 404 response.
pub(crate) async fn not_found(call: &Call, resp: Response, what: String) -> Error {
    let errors = error_body(resp).await;
    Error::NotFound {
        what,
        method: call.method.clone(),
        url: call.shown_url(),
        errors,
    }
}

/// A header as text, if present and printable.
pub(crate) fn header<'r>(resp: &'r Response, name: &HeaderName) -> Option<&'r str> {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

/// The `Location` of a response resolved against the request URL (it may be relative, and may
/// carry its own query such as `_state`).
pub(crate) fn location(call: &Call, resp: &Response) -> Result<Url> {
    let protocol = |problem| Error::Protocol {
        method: call.method.clone(),
        url: call.shown_url(),
        problem,
    };
    let value = header(resp, &LOCATION)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| protocol("the registry answered without a Location header"))?;
    call.url
        .join(value)
        .map_err(|_| protocol("the Location header is not a valid URL"))
}
