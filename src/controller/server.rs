//! The controller's HTTP endpoints for Prometheus and the kubelet: `GET /metrics`,
//! `GET /healthz` (the process serves) and `GET /readyz` (this replica can serve its role:
//! the leader reconciles, a standby reaches the API server and can take over). Leadership is
//! not readiness: a Deployment of two replicas must become Available with one standby, or
//! its rollouts stall (a surge Pod could never be Ready while the old leader holds the
//! Lease). Which replica leads is the `kiln_leader` gauge.

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
    /// Whether this replica can serve its role (it reached the API server on its last try).
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
    match (s.ready.load(Ordering::Relaxed), s.metrics.leading()) {
        (true, true) => (StatusCode::OK, "ok: leading"),
        (true, false) => (StatusCode::OK, "ok: standby"),
        (false, _) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the API server is not reachable",
        ),
    }
}
