//! WATCH: newline-delimited JSON events (`{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR,
//! "object": …}`) streamed over a chunked response. A watch starts after the given
//! resourceVersion from the store's history (older than the history: one ERROR event with a
//! 410 `Expired` Status, as kube-apiserver sends, so kube's watcher relists); without one (or
//! `0`) it first sends the current objects as ADDED; `sendInitialEvents=true` ends those with
//! the `k8s.io/initial-events-end` BOOKMARK. It honours namespace, label and field
//! selectors, `allowWatchBookmarks` (a BOOKMARK every `bookmark_interval`) and
//! `timeoutSeconds` (the stream then ends).

use std::convert::Infallible;
use std::sync::Mutex;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use super::error::{Error, Result};
use super::kinds::Kind;
use super::selector::Selectors;
use super::store::{Event, EventType, Signal, Store};

/// What a watch request asks for.
#[derive(Debug, Clone)]
pub struct WatchRequest {
    /// The kind watched.
    pub kind: &'static Kind,
    /// One namespace, or all.
    pub namespace: Option<String>,
    /// Label and field selectors.
    pub selectors: Selectors,
    /// `resourceVersion` (absent, empty or `0`: start with the current objects).
    pub resource_version: Option<String>,
    /// `allowWatchBookmarks`.
    pub bookmarks: bool,
    /// `sendInitialEvents`.
    pub send_initial_events: bool,
    /// `timeoutSeconds`.
    pub timeout: Duration,
}

impl WatchRequest {
    fn selects(&self, kind: &Kind, namespace: &str, object: &Value) -> bool {
        kind == self.kind
            && self.namespace.as_deref().is_none_or(|ns| ns == namespace)
            && self.selectors.matches(object)
    }

    /// The line a change produces for this watch, if any. A modification that moves an
    /// object into or out of the selection is an ADDED or DELETED, as kube-apiserver does.
    fn render(&self, event: &Event) -> Option<Bytes> {
        let now = self.selects(event.kind, &event.namespace, &event.object);
        let before = event
            .previous
            .as_ref()
            .is_some_and(|p| self.selects(event.kind, &event.namespace, p));
        let event_type = match (event.event_type, before, now) {
            (EventType::Modified, false, true) => EventType::Added,
            (EventType::Modified, true, false) => EventType::Deleted,
            (_, _, true) => event.event_type,
            _ => return None,
        };
        Some(line(event_type.as_str(), &event.object))
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut metadata = json!({ "resourceVersion": rv.to_string() });
        if initial_end {
            metadata["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
        }
        let object = json!({
            "kind": self.kind.kind,
            "apiVersion": self.kind.api_version(),
            "metadata": metadata,
        });
        line("BOOKMARK", &object)
    }
}

/// One line of the watch stream, written from the stored object without copying it (each
/// watcher renders every change it sees; copies were a sixth of the server's time).
fn line(event_type: &str, object: &Value) -> Bytes {
    #[derive(serde::Serialize)]
    struct Line<'a> {
        #[serde(rename = "type")]
        event_type: &'a str,
        object: &'a Value,
    }
    let mut text = serde_json::to_vec(&Line { event_type, object }).unwrap_or_default();
    text.push(b'\n');
    Bytes::from(text)
}

/// The ERROR event for a resourceVersion the history no longer reaches.
fn gone(rv: &str, current: u64) -> Bytes {
    let status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("too old resource version: {rv} ({current})"),
        "reason": "Expired",
        "code": 410,
    });
    line("ERROR", &status)
}

/// Starts a watch: computes its first events under the store lock (subscribing to live ones
/// at the same moment, so none is lost or doubled), then streams from a task.
///
/// # Errors
/// BadRequest for a resourceVersion that is no number.
pub fn start(
    store: &Mutex<Store>,
    req: WatchRequest,
    bookmark_interval: Duration,
) -> Result<Response> {
    let (initial, receiver, start_rv, expired) = {
        let store = store
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let receiver = store.subscribe();
        let current = store.rv();
        let mut lines = Vec::new();
        let mut expired = false;
        let from = req
            .resource_version
            .as_deref()
            .filter(|rv| !rv.is_empty() && *rv != "0");
        match from {
            Some(rv) if !req.send_initial_events => {
                let n: u64 = rv.parse().map_err(|_| Error::BadRequest {
                    message: format!("invalid resourceVersion {rv:?}"),
                })?;
                match store.events_after(n) {
                    Some(events) => lines.extend(events.iter().filter_map(|e| req.render(e))),
                    None => {
                        lines.push(gone(rv, current));
                        expired = true;
                    }
                }
            }
            _ => {
                let namespace = req.namespace.as_deref();
                for object in store.list(req.kind, namespace, &req.selectors) {
                    lines.push(line("ADDED", &object));
                }
                if req.send_initial_events && req.bookmarks {
                    lines.push(req.bookmark(current, true));
                }
            }
        }
        (lines, receiver, current, expired)
    };
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    tokio::spawn(async move {
        for line in initial {
            if tx.send(line).await.is_err() {
                return;
            }
        }
        if !expired {
            follow(&req, receiver, &tx, start_rv, bookmark_interval).await;
        }
    });
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|bytes| (Ok::<_, Infallible>(bytes), rx))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(body))
        .map_err(|e| Error::Internal {
            message: e.to_string(),
        })
}

/// Streams live events until the timeout, an expiry, or the client going away.
async fn follow(
    req: &WatchRequest,
    mut receiver: broadcast::Receiver<Signal>,
    tx: &mpsc::Sender<Bytes>,
    mut last_rv: u64,
    bookmark_interval: Duration,
) {
    let deadline = tokio::time::sleep(req.timeout);
    tokio::pin!(deadline);
    let start = tokio::time::Instant::now() + bookmark_interval;
    let mut ticks = tokio::time::interval_at(start, bookmark_interval);
    loop {
        let out = tokio::select! {
            () = &mut deadline => return,
            () = tx.closed() => return,
            _ = ticks.tick(), if req.bookmarks => req.bookmark(last_rv, false),
            signal = receiver.recv() => match signal {
                Ok(Signal::Event(event)) => {
                    if event.rv <= last_rv {
                        continue;
                    }
                    // Every change moves this watch's position, shown or not, so a bookmark
                    // never sends a watcher back to events it skipped.
                    last_rv = event.rv;
                    match req.render(&event) {
                        Some(line) => line,
                        None => continue,
                    }
                }
                // Expired, or this watcher fell too far behind: 410, as for a too-old rv.
                Ok(Signal::Expire) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    let _ = tx.send(gone(&last_rv.to_string(), last_rv)).await;
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
        };
        if tx.send(out).await.is_err() {
            return;
        }
    }
}
