//! A registry that serves the OCI 1.1 referrers API, which Debian's `docker-registry` (2.8)
//! predates: `ferro-oci-server` from crates.io, another project's implementation of the
//! distribution spec v1.1 (its blobs and metadata in memory), served in this process on a
//! free loopback port, plain HTTP.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, Method, Response};
use axum::middleware::Next;

/// The running registry; it stops with the test process.
pub struct ReferrersRegistry {
    port: u16,
    later_pages: Arc<AtomicUsize>,
}

impl ReferrersRegistry {
    pub fn start() -> ReferrersRegistry {
        ReferrersRegistry::serve(None)
    }

    /// A registry whose referrers listings come in pages of `per_page` manifests, each page
    /// naming the next in a `Link` header (`rel="next"`), as the distribution spec lets a
    /// registry page them (ferro-oci-server answers in one page). The listing is ordered by
    /// manifest size, smallest first, so that a referrer that gathers more (a signature
    /// manifest after a second key signed) comes on a later page.
    pub fn start_paged(per_page: usize) -> ReferrersRegistry {
        ReferrersRegistry::serve(Some(per_page))
    }

    fn serve(per_page: Option<usize>) -> ReferrersRegistry {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking socket");
        let port = listener.local_addr().expect("its address").port();
        let later_pages = Arc::new(AtomicUsize::new(0));
        let counted = later_pages.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("the listener");
                let store = Arc::new(ferro_blob_store::InMemoryBlobStore::new());
                let mut app = ferro_oci_server::build_app(store);
                if let Some(per_page) = per_page {
                    app = app.layer(axum::middleware::from_fn(move |req, next| {
                        paged(req, next, per_page, counted.clone())
                    }));
                }
                axum::serve(listener, app)
                    .await
                    .expect("the registry serves");
            });
        });
        ReferrersRegistry { port, later_pages }
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `HOST/repo[:tag]`.
    pub fn reference(&self, repo_and_tag: &str) -> String {
        format!("{}/{repo_and_tag}", self.host())
    }

    /// How many pages after a listing's first were asked for ([`ReferrersRegistry::start_paged`]).
    pub fn later_pages(&self) -> usize {
        self.later_pages.load(Ordering::Relaxed)
    }
}

/// The page a referrers listing's `page` query parameter (from 0; this fixture's own cursor)
/// asks for: the registry's whole answer, ordered by size, cut to `per_page` manifests, with a
/// `Link` to the next page while one is left.
async fn paged(
    req: Request,
    next: Next,
    per_page: usize,
    later: Arc<AtomicUsize>,
) -> Response<Body> {
    if req.method() != Method::GET || !req.uri().path().contains("/referrers/") {
        return next.run(req).await;
    }
    let path = req.uri().path().to_string();
    let mut page = 0;
    let mut kept = Vec::new();
    for pair in req
        .uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        match pair.strip_prefix("page=") {
            Some(n) => page = n.parse().expect("a page number"),
            None => kept.push(pair.to_string()),
        }
    }
    if page > 0 {
        later.fetch_add(1, Ordering::Relaxed);
    }
    let query = kept.join("&");
    let (mut parts, body) = req.into_parts();
    parts.uri = match query.is_empty() {
        true => path.clone(),
        false => format!("{path}?{query}"),
    }
    .parse()
    .expect("a URI");
    let answer = next.run(Request::from_parts(parts, body)).await;
    let (mut parts, body) = answer.into_parts();
    let bytes = axum::body::to_bytes(body, 4 << 20)
        .await
        .expect("the listing");
    let Ok(mut index) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    let Some(all) = index["manifests"].as_array_mut() else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    all.sort_by_key(|m| m["size"].as_u64());
    let left = all.len().saturating_sub((page + 1) * per_page);
    let this: Vec<serde_json::Value> = all
        .iter()
        .skip(page * per_page)
        .take(per_page)
        .cloned()
        .collect();
    *all = this;
    let bytes = serde_json::to_vec(&index).expect("the page");
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    if left > 0 {
        let sep = if query.is_empty() { "" } else { "&" };
        let link = format!("<{path}?{query}{sep}page={}>; rel=\"next\"", page + 1);
        parts.headers.insert(
            axum::http::header::LINK,
            HeaderValue::from_str(&link).expect("a Link header"),
        );
    }
    Response::from_parts(parts, Body::from(bytes))
}
