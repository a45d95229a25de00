//! The HTTPS server: rustls (aws-lc-rs) with the reloading certificate, axum routes served
//! by hyper connection by connection, one log line per review, and graceful shutdown. What
//! bounds a hostile client: at most [`tls::MAX_CONNECTIONS`] connections, a request head
//! within [`HEADER_TIMEOUT`], a whole request within [`REQUEST_TIMEOUT`], a body of at most
//! [`MAX_BODY_BYTES`] that must fit a [`BODY_BUDGET`] with the others in flight, and a review
//! parsed only once its JSON is known to be small in every dimension (`review.rs`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use rustls::ServerConfig;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::review::{Endpoint, Record, Reviewer};
use super::tls::{self, CertFiles, TlsListener, error_chain};
use super::{Error, MAX_BODY_BYTES, Options, Result};
use crate::runtime::Catalog;

/// Serves until `shutdown` resolves, then lets in-flight reviews finish.
///
/// # Errors
/// When the certificate does not load ([`Error::is_input_error`]), the address cannot be
/// bound, or the server fails.
pub async fn serve(
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let files = CertFiles::new(options.tls_cert, options.tls_key);
    let (resolver, watcher) =
        tls::load_and_watch(files, provider.clone(), options.reload_interval).await?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(Error::Tls)?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    // No session resumption: a resumed session skips the certificate, so after a rotation
    // a client could go on resuming the old one. Full handshakes cost the webhook's one
    // client (the API server) next to nothing.
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    let tcp = TcpListener::bind(options.address)
        .await
        .map_err(|source| Error::Bind {
            address: options.address,
            source,
        })?;
    let mut listener =
        TlsListener::new(tcp, TlsAcceptor::from(Arc::new(config))).map_err(Error::Serve)?;
    let address = listener.local_addr();
    tracing::info!(
        %address,
        "serving admission reviews on https://{address}: POST /mutate, POST /validate",
    );
    let reviewer = Arc::new(
        Reviewer::new(Catalog::embedded(), options.profiles)
            .with_managed_secrets(options.managed_secrets),
    );
    let budgets = Budgets {
        small: Arc::new(BodyBudget::new(BODY_BUDGET)),
        large: Arc::new(BodyBudget::new(BODY_BUDGET)),
    };
    let app = router(reviewer, budgets);
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                connections.spawn(serve_connection(accepted, app.clone(), stopping.clone()));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    let _ = stop.send(true);
    while connections.join_next().await.is_some() {}
    watcher.abort();
    tracing::info!("stopped serving admission reviews");
    Ok(())
}

/// How long a client may take to send a request's head, from the connection's start or the
/// previous answer (hyper's header read timeout).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request may take from its head to the answer, the body's reading included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes of request bodies held at once, across connections: a review's body is reserved
/// (by its Content-Length) before it is read, so slow bodies cannot add up past it. Large
/// bodies (over [`LARGE_BODY`]) have a budget of their own, so that a few slow large ones
/// leave room for the small reviews nearly every Function makes.
const BODY_BUDGET: usize = 2 * MAX_BODY_BYTES;

/// Where a large body begins: a Function with a large inline source.
const LARGE_BODY: usize = 256 * 1024;

/// Serves one connection: HTTP/1.1 with the header timeout, until the client closes it, an
/// error, or shutdown (which lets a request in flight finish). Its slot goes with it.
async fn serve_connection(
    accepted: tls::Accepted,
    app: Router,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    let tls::Accepted { stream, peer, slot } = accepted;
    let _slot = slot;
    let service = hyper_util::service::TowerToHyperService::new(app);
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    tokio::pin!(connection);
    let outcome = tokio::select! {
        outcome = connection.as_mut() => outcome,
        _ = stopping.changed() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = outcome {
        tracing::debug!(%peer, "connection ended: {e}");
    }
}

/// The budgets of bodies in flight: small and large ones apart.
#[derive(Clone)]
struct Budgets {
    small: Arc<BodyBudget>,
    large: Arc<BodyBudget>,
}

/// Request body bytes reserved by reviews in flight, up to a total.
struct BodyBudget {
    total: usize,
    used: std::sync::atomic::AtomicUsize,
}

impl Budgets {
    fn for_size(&self, bytes: usize) -> &Arc<BodyBudget> {
        if bytes > LARGE_BODY {
            &self.large
        } else {
            &self.small
        }
    }
}

impl BodyBudget {
    fn new(total: usize) -> BodyBudget {
        BodyBudget {
            total,
            used: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// `bytes` of the budget until the guard is dropped; `None` when they are not free.
    fn reserve(self: &Arc<Self>, bytes: usize) -> Option<Reserved> {
        use std::sync::atomic::Ordering;
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used + bytes <= self.total).then_some(used + bytes)
            })
            .ok()?;
        Some(Reserved {
            budget: Arc::clone(self),
            bytes,
        })
    }
}

struct Reserved {
    budget: Arc<BodyBudget>,
    bytes: usize,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering;
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

fn router(reviewer: Arc<Reviewer>, budgets: Budgets) -> Router {
    Router::new()
        .route(
            "/mutate",
            post(|State(r), body| handle(r, Endpoint::Mutate, body)),
        )
        .route(
            "/validate",
            post(|State(r), body| handle(r, Endpoint::Validate, body)),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(budgets, admit_body))
        .with_state(reviewer)
}

/// Before a byte of the body is read: a POST must say its length (411), at most
/// [`MAX_BODY_BYTES`] (413), and those bytes must fit the budget of bodies in flight (503,
/// which the API server retries). The whole request, body included, then has
/// [`REQUEST_TIMEOUT`] (408).
async fn admit_body(State(budgets): State<Budgets>, request: Request, next: Next) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let reserved = match (request.method() == axum::http::Method::POST, declared) {
        (false, _) => None,
        (true, None) => {
            let text = "a review must say its Content-Length\n";
            return (StatusCode::LENGTH_REQUIRED, text).into_response();
        }
        (true, Some(n)) if n > MAX_BODY_BYTES as u64 => {
            let text = format!(
                "the request body ({n} bytes) exceeds the limit of {MAX_BODY_BYTES} bytes\n"
            );
            return (StatusCode::PAYLOAD_TOO_LARGE, text).into_response();
        }
        (true, Some(n)) => match budgets.for_size(n as usize).reserve(n as usize) {
            Some(reserved) => Some(reserved),
            None => {
                tracing::warn!("refusing a review: the bodies in flight fill the budget");
                let text = "too many reviews in flight; retry\n";
                return (StatusCode::SERVICE_UNAVAILABLE, text).into_response();
            }
        },
    };
    let answer = tokio::time::timeout(REQUEST_TIMEOUT, next.run(request)).await;
    drop(reserved);
    match answer {
        Ok(response) => response,
        Err(_) => {
            let text = format!(
                "the request took over {}s, its body included\n",
                REQUEST_TIMEOUT.as_secs()
            );
            (StatusCode::REQUEST_TIMEOUT, text).into_response()
        }
    }
}

async fn handle(reviewer: Arc<Reviewer>, endpoint: Endpoint, body: Bytes) -> Response {
    match reviewer.review(endpoint, &body) {
        Ok((review, record)) => {
            log(endpoint, &record);
            axum::Json(review).into_response()
        }
        Err(e) => {
            let problem = error_chain(&e);
            tracing::warn!(?endpoint, "rejected a request: {problem}");
            (StatusCode::BAD_REQUEST, format!("{problem}\n")).into_response()
        }
    }
}

fn log(endpoint: Endpoint, r: &Record) {
    let verdict = match (r.allowed, endpoint) {
        (false, _) => "denied",
        (true, Endpoint::Mutate) if r.patched > 0 => "patched",
        (true, _) => "allowed",
    };
    tracing::info!(
        endpoint = ?endpoint,
        kind = %r.kind,
        namespace = %r.namespace,
        name = %r.name,
        operation = %r.operation,
        verdict,
        patch_ops = r.patched,
        warnings = r.warnings,
        message = r.message.as_deref().unwrap_or_default(),
        "admission review: {verdict} {} {}/{}",
        r.operation,
        r.namespace,
        r.name
    );
}
