//! The HTTPS server: rustls (aws-lc-rs) with the reloading certificate, axum routes, a body
//! cap, one log line per review, and graceful shutdown.

use std::future::Future;
use std::sync::Arc;

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
    let listener =
        TlsListener::new(tcp, TlsAcceptor::from(Arc::new(config))).map_err(Error::Serve)?;
    let address = axum::serve::Listener::local_addr(&listener).map_err(Error::Serve)?;
    tracing::info!(
        %address,
        "serving admission reviews on https://{address}: POST /mutate, POST /validate",
    );
    let reviewer = Arc::new(
        Reviewer::new(Catalog::embedded(), options.profiles)
            .with_managed_secrets(options.managed_secrets),
    );
    let outcome = axum::serve(listener, router(reviewer))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(Error::Serve);
    watcher.abort();
    tracing::info!("stopped serving admission reviews");
    outcome
}

fn router(reviewer: Arc<Reviewer>) -> Router {
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
        .layer(axum::middleware::from_fn(refuse_oversized))
        .with_state(reviewer)
}

/// Answers 413 from the Content-Length alone, before reading a byte of the body (the body
/// limit above still caps a body sent without one).
async fn refuse_oversized(request: Request, next: Next) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(n) if n > MAX_BODY_BYTES as u64 => (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body ({n} bytes) exceeds the limit of {MAX_BODY_BYTES} bytes\n"),
        )
            .into_response(),
        _ => next.run(request).await,
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
