//! A registry that serves the OCI 1.1 referrers API, which Debian's `docker-registry` (2.8)
//! predates: `ferro-oci-server` from crates.io, another project's implementation of the
//! distribution spec v1.1 (its blobs and metadata in memory), served in this process on a
//! free loopback port, plain HTTP.

use std::sync::Arc;

/// The running registry; it stops with the test process.
pub struct ReferrersRegistry {
    port: u16,
}

impl ReferrersRegistry {
    pub fn start() -> ReferrersRegistry {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking socket");
        let port = listener.local_addr().expect("its address").port();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("the listener");
                let store = Arc::new(ferro_blob_store::InMemoryBlobStore::new());
                let app = ferro_oci_server::build_app(store);
                axum::serve(listener, app)
                    .await
                    .expect("the registry serves");
            });
        });
        ReferrersRegistry { port }
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `HOST/repo[:tag]`.
    pub fn reference(&self, repo_and_tag: &str) -> String {
        format!("{}/{repo_and_tag}", self.host())
    }
}
