//! The controller's HTTP endpoints for Prometheus and the kubelet: `GET /metrics`,
//! `GET /healthz` (the process serves) and `GET /readyz` (it leads and its caches are
//! filled).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use super::metrics::Metrics;

/// What the endpoints show.
#[derive(Clone)]
pub struct Shared {
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// Whether this replica reconciles.
    pub ready: Arc<AtomicBool>,
    /// How many build Jobs run now.
    pub running: Arc<dyn Fn() -> usize + Send + Sync>,
}

/// Serves the endpoints on `address` until the process ends.
///
/// # Errors
/// The address cannot be bound.
pub async fn serve(address: SocketAddr, shared: Shared) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .with_state(shared);
    let listener = tokio::net::TcpListener::bind(address).await?;
    tracing::info!(%address, "serving /metrics, /healthz and /readyz");
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the metrics server stopped");
        }
    });
    Ok(())
}

async fn metrics(State(s): State<Shared>) -> ([(&'static str, &'static str); 1], String) {
    (
        [("content-type", "text/plain; version=0.0.4")],
        s.metrics.render((s.running)()),
    )
}

async fn ready(State(s): State<Shared>) -> (StatusCode, &'static str) {
    if s.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not leading")
    }
}
