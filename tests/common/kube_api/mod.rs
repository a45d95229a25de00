//! A stateful in-memory Kubernetes API server for tests, served over real HTTP and HTTPS on
//! free 127.0.0.1 ports, so a `kube::Client` built from a kubeconfig (the controller's own, in
//! a `kiln controller` process, or the test's), an in-cluster client in a Pod the test
//! kubelet runs, and the real `kubectl` talk to it as to a cluster, watches included.
//!
//! It is meant to be as strict as kube-apiserver where controllers meet it:
//! - every request is authenticated (bearer tokens) and authorized by RBAC over the Roles,
//!   ClusterRoles and bindings it holds, with the real verb mapping (`auth.rs`); an apply
//!   that creates is authorized as `create` too;
//! - namespaced objects need their Namespace; Pods need their ServiceAccount and get the
//!   projected token volume (`lifecycle.rs`);
//! - CustomResourceDefinitions define kinds while it runs, validated by their schema and CEL
//!   rules (`schema.rs`);
//! - objects are kept as JSON with uid, creationTimestamp, one global resourceVersion,
//!   generation, generateName, AlreadyExists/NotFound/Conflict/Invalid `Status` answers,
//!   no-op writes that keep the resourceVersion, the status and scale subresources,
//!   finalizers, owner-reference garbage collection, label and field selectors,
//!   merge/strategic/JSON patches, server-side apply (`apply.rs`), watches with bookmarks and
//!   410 Gone.
//!
//! Tests also get a request log, an audit log of who did what, fault injection and direct
//! access to the objects. Built-in kinds are listed in `kinds.rs`.
//!
//! Not modelled: defaulting and validation of built-in kinds beyond names and labels (a
//! Deployment is stored as sent, with no defaults); other controllers (nothing runs Pods or
//! Jobs but the test kubelet; Pods are deleted at once rather than gracefully); namespace
//! deletion emptying the namespace; paging (LIST answers everything in one page) and reads at
//! an old resourceVersion; `generation` is kept on every kind. The simplifications of
//! server-side apply are listed in `apply.rs`, those of CRD validation in `schema.rs`.

pub mod apply;
pub mod auth;
pub mod discovery;
pub mod error;
pub mod events;
pub mod gc;
pub mod kinds;
pub mod lifecycle;
pub mod meta;
pub mod observe;
pub mod patch;
pub mod patching;
pub mod pki;
pub mod pod_security;
pub mod protobuf;
pub mod schema;
pub mod selector;
pub mod server;
pub mod store;
pub mod table;
pub mod tls;
pub mod watch;
pub mod webhooks;
pub mod write;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::Value;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

pub use auth::AuditEntry;
pub use observe::Request;
pub use store::CrdSource;

use observe::Observer;
use server::Shared;
use store::{Key, Store};

/// How to start a [`KubeApi`].
#[derive(Debug, Clone)]
pub struct Options {
    /// The CRDs installed when it starts (default: `kiln crd`, the Functions'; add Knative
    /// Serving's for its Services; empty: a cluster where only `kubectl apply` adds them).
    pub crds: Vec<CrdSource>,
    /// How often a watch that allows bookmarks gets one (kube-apiserver: about a minute).
    pub bookmark_interval: Duration,
    /// How many events watches can resume from; older resourceVersions get 410 Gone.
    pub history_limit: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            crds: vec![CrdSource::KilnBinary(PathBuf::from(env!(
                "CARGO_BIN_EXE_kiln"
            )))],
            bookmark_interval: Duration::from_millis(500),
            history_limit: 10_000,
        }
    }
}

/// A running fake API server; it stops (and drops every object) when dropped.
pub struct KubeApi {
    shared: Arc<Shared>,
    addr: SocketAddr,
    https: SocketAddr,
    admin_token: String,
    runtime: Handle,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl KubeApi {
    /// Starts a server with the default [`Options`], on its own thread and tokio runtime:
    /// usable from plain `#[test]`s and from async tests alike.
    pub fn start() -> Self {
        Self::with_options(Options::default())
    }

    /// Starts a server with `options`.
    pub fn with_options(options: Options) -> Self {
        let pki = pki::pki();
        let mut store = Store::new(options.history_limit);
        store.root_ca = pki.ca_pem.clone();
        for namespace in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            store.ensure_namespace(namespace);
        }
        for source in &options.crds {
            let yaml = match source {
                CrdSource::Yaml(yaml) => yaml.clone(),
                CrdSource::KilnBinary(bin) => run_kiln_crd(bin),
            };
            for doc in serde_yaml::Deserializer::from_str(&yaml) {
                let crd: Value = serde::Deserialize::deserialize(doc).expect("CRD YAML");
                if !crd.is_null() {
                    store
                        .insert(crd)
                        .unwrap_or_else(|e| panic!("installing a CRD: {}", e.to_status()));
                }
            }
        }
        let shared = Arc::new(Shared {
            store: std::sync::Mutex::new(store),
            observer: Observer::default(),
            bookmark_interval: options.bookmark_interval,
            tokens: auth::Tokens::default(),
            audit: auth::Audit::default(),
        });
        let admin_token = shared.tokens.admin_token();
        let bind = || {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
            listener
                .set_nonblocking(true)
                .expect("non-blocking listener");
            listener
        };
        let (listener, tls_listener) = (bind(), bind());
        let addr = listener.local_addr().expect("listener address");
        let https = tls_listener.local_addr().expect("listener address");
        let (shutdown, stopped) = oneshot::channel::<()>();
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let app = axum::Router::new()
            .fallback(server::handle)
            .with_state(Arc::clone(&shared));
        let thread = std::thread::Builder::new()
            .name(format!("kube-api-{}", addr.port()))
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("tokio runtime for the fake API server");
                let _ = handle_tx.send(runtime.handle().clone());
                runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                    let tls = tokio::net::TcpListener::from_std(tls_listener).expect("listener");
                    let tls = tls::TlsListener::new(tls, pki);
                    // Not a graceful shutdown: open watches would hold it for their timeout.
                    tokio::select! {
                        result = axum::serve(listener, app.clone()) => result.expect("serving"),
                        result = axum::serve(tls, app) => result.expect("serving HTTPS"),
                        _ = stopped => {}
                    }
                });
                runtime.shutdown_timeout(Duration::from_secs(1));
            })
            .expect("spawn the fake API server thread");
        let runtime = handle_rx.recv().expect("the fake API server's runtime");
        Self {
            shared,
            addr,
            https,
            admin_token,
            runtime,
            shutdown: Some(shutdown),
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `https://127.0.0.1:PORT`: what in-cluster clients use (the CA is [`Self::ca_pem`]).
    pub fn https_url(&self) -> String {
        format!("https://{}", self.https)
    }

    /// The HTTPS port (`KUBERNETES_SERVICE_PORT` in Pods).
    pub fn https_port(&self) -> u16 {
        self.https.port()
    }

    /// The cluster CA (PEM).
    pub fn ca_pem(&self) -> &str {
        &pki::pki().ca_pem
    }

    /// The cluster admin's bearer token (`system:masters`).
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// The bearer token of ServiceAccount `namespace/name` (valid while it exists; the same
    /// token every time).
    pub fn service_account_token(&self, namespace: &str, name: &str) -> String {
        self.shared.tokens.service_account_token(namespace, name)
    }

    /// A kubeconfig for this server over plain HTTP, as the admin, namespace `default`.
    pub fn kubeconfig_yaml(&self) -> String {
        self.kubeconfig_with_token(&self.admin_token)
    }

    /// A kubeconfig over plain HTTP authenticating with `token`, namespace `default`.
    pub fn kubeconfig_with_token(&self, token: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             users:\n- name: fake\n  user:\n    token: {token}\ncontexts:\n- name: fake\n  \
             context:\n    cluster: fake\n    user: fake\n    namespace: default\n\
             current-context: fake\n",
            self.url()
        )
    }

    /// Writes [`Self::kubeconfig_yaml`] to `path` (for a process's `KUBECONFIG`).
    pub fn write_kubeconfig(&self, path: &Path) {
        std::fs::write(path, self.kubeconfig_yaml())
            .unwrap_or_else(|e| panic!("writing kubeconfig {}: {e}", path.display()));
    }

    /// A `kube::Client` for this server as the admin (default namespace `default`). Works
    /// inside a tokio runtime and outside one (then its background task runs on the
    /// server's runtime).
    pub fn client(&self) -> kube::Client {
        self.client_with_token(&self.admin_token)
    }

    /// A `kube::Client` authenticating with `token`.
    pub fn client_with_token(&self, token: &str) -> kube::Client {
        let url = self.url().parse().expect("server URL");
        let mut config = kube::Config::new(url);
        config.default_namespace = "default".to_string();
        config.auth_info.token = Some(token.to_string().into());
        let _guard = Handle::try_current().is_err().then(|| self.runtime.enter());
        kube::Client::try_from(config).expect("kube client for the fake API server")
    }

    /// A `kube::Client` built the way a process would: from [`Self::kubeconfig_yaml`].
    pub async fn client_from_kubeconfig(&self) -> kube::Client {
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&self.kubeconfig_yaml())
            .expect("parse the kubeconfig");
        let options = kube::config::KubeConfigOptions::default();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .expect("kube config from the kubeconfig");
        kube::Client::try_from(config).expect("kube client from the kubeconfig")
    }

    /// Every authorized resource request so far: who, and the RBAC attributes.
    pub fn audit(&self) -> Vec<AuditEntry> {
        self.shared.audit.entries()
    }

    /// Runs a future on the server's runtime from synchronous test code.
    ///
    /// # Panics
    /// When called from inside an async context (use `.await` there).
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// An object (`kind` as in [`kinds::by_name`]; `namespace` ignored for cluster-scoped
    /// kinds).
    pub fn get(&self, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let store = self.shared.store();
        let kind = store.kinds.by_name(kind);
        store.get(kind, Some(namespace), name).cloned()
    }

    /// Every object of `kind`, in all namespaces.
    pub fn list(&self, kind: &str) -> Vec<Value> {
        let store = self.shared.store();
        let kind = store.kinds.by_name(kind);
        store.list(kind, None, &selector::Selectors::default())
    }

    /// Seeds an object (created, or overwritten whatever its resourceVersion, status
    /// included; its Namespace created if missing), with the same validation and watch
    /// events as an API write. Seeds skip authorization and admission: they are the test's
    /// own setup.
    ///
    /// # Panics
    /// When the server refuses it, with the `Status` it would have answered.
    pub fn insert(&self, object: Value) -> Value {
        self.shared
            .store()
            .insert(object)
            .unwrap_or_else(|e| panic!("the fake API server refused the object: {}", e.to_status()))
    }

    /// Deletes an object as `DELETE` does (finalizers, garbage collection); `None` if absent.
    pub fn delete(&self, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let mut store = self.shared.store();
        let kind = store.kinds.by_name(kind);
        let key = Key::new(kind, Some(namespace), name);
        store.delete(kind, &key, &gc::DeleteOptions::default()).ok()
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.store().rv()
    }

    /// Every request so far (since the last [`Self::reset_requests`]).
    pub fn requests(&self) -> Vec<Request> {
        self.shared.observer.requests()
    }

    /// The write requests (POST, PUT, PATCH, DELETE) so far.
    pub fn writes(&self) -> Vec<Request> {
        self.requests().into_iter().filter(|r| r.write).collect()
    }

    /// Empties the request log.
    pub fn reset_requests(&self) {
        self.shared.observer.reset();
    }

    /// Makes the next `count` requests with `method` (`*`: any) whose path contains
    /// `path_contains` fail with `status` (a `Status` body with the matching `reason`).
    pub fn fail_next(&self, count: usize, method: &str, path_contains: &str, status: u16) {
        self.shared
            .observer
            .fail_next(count, method, path_contains, status);
    }

    /// Drops the event history: watches from an older resourceVersion get 410 Gone.
    pub fn compact(&self) {
        self.shared.store().compact();
    }

    /// Compacts and ends every open watch with a 410 Gone ERROR event, as an API server
    /// whose history moved on does: kube's watcher then relists.
    pub fn expire_watches(&self) {
        self.shared.store().expire_watches();
    }
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Runs `kiln crd`.
fn run_kiln_crd(bin: &Path) -> String {
    let out = std::process::Command::new(bin)
        .arg("crd")
        .output()
        .unwrap_or_else(|e| panic!("running {} crd: {e}", bin.display()));
    assert!(
        out.status.success(),
        "{} crd failed: {}",
        bin.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("kiln crd prints UTF-8")
}
