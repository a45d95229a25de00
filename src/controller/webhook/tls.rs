//! The serving certificate, reloaded when its files change (cert-manager rotates them in
//! place): a [`ResolvesServerCert`] whose certified key is swapped under a lock, a poller that
//! re-reads the files, and a TLS listener that handshakes off the accept loop, with a cap on
//! open connections.
//! A new pair that does not load (unparseable, or key and certificate do not match) is logged
//! and the current one kept.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use sha2::{Digest, Sha256};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::{Error, Result};

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the serving certificate and its key are.
#[derive(Clone, Debug)]
pub struct CertFiles {
    cert: PathBuf,
    key: PathBuf,
}

impl CertFiles {
    /// The PEM certificate chain (leaf first) and PEM private key at these paths.
    pub fn new(cert: PathBuf, key: PathBuf) -> CertFiles {
        CertFiles { cert, key }
    }

    /// Both files' bytes.
    async fn read(&self) -> Result<(Vec<u8>, Vec<u8>)> {
        let read = |path: PathBuf| async move {
            tokio::fs::read(&path)
                .await
                .map_err(|source| Error::ReadFile { path, source })
        };
        Ok((
            read(self.cert.clone()).await?,
            read(self.key.clone()).await?,
        ))
    }

    /// Parses a pair read from these files.
    fn parse(&self, cert: &[u8], key: &[u8], provider: &CryptoProvider) -> Result<CertifiedKey> {
        let chain = CertificateDer::pem_slice_iter(cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| Error::Pem {
                path: self.cert.clone(),
                source,
            })?;
        if chain.is_empty() {
            return Err(Error::NoCertificate {
                path: self.cert.clone(),
            });
        }
        let key_der = PrivateKeyDer::from_pem_slice(key).map_err(|source| Error::Pem {
            path: self.key.clone(),
            source,
        })?;
        CertifiedKey::from_der(chain, key_der, provider).map_err(|source| match source {
            rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
                Error::KeyMismatch {
                    cert: self.cert.clone(),
                    key: self.key.clone(),
                }
            }
            source => Error::KeyPair {
                cert: self.cert.clone(),
                key: self.key.clone(),
                source,
            },
        })
    }
}

/// SHA-256 of the leaf certificate, for logs: what `openssl x509 -fingerprint -sha256` shows.
pub fn fingerprint(key: &CertifiedKey) -> String {
    key.cert
        .first()
        .map(|leaf| hex::encode(Sha256::digest(leaf.as_ref())))
        .unwrap_or_default()
}

/// The certificate offered to new handshakes; swapped by [`watch`].
#[derive(Debug)]
pub struct Reloading {
    current: RwLock<Arc<CertifiedKey>>,
}

impl Reloading {
    fn current(&self) -> Arc<CertifiedKey> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn swap(&self, key: CertifiedKey) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(key);
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// Loads the pair and starts the poller that reloads it every `interval` when the files'
/// contents change. Returns the resolver for the TLS config and the poller's task.
///
/// # Errors
/// When the files cannot be read or do not hold a matching certificate and key.
pub async fn load_and_watch(
    files: CertFiles,
    provider: Arc<CryptoProvider>,
    interval: Duration,
) -> Result<(Arc<Reloading>, JoinHandle<()>)> {
    let seen = files.read().await?;
    let key = files.parse(&seen.0, &seen.1, &provider)?;
    tracing::info!(
        cert = %files.cert.display(),
        sha256 = %fingerprint(&key),
        "loaded the serving certificate"
    );
    let resolver = Arc::new(Reloading {
        current: RwLock::new(Arc::new(key)),
    });
    let task = tokio::spawn(watch(files, resolver.clone(), provider, interval, seen));
    Ok((resolver, task))
}

async fn watch(
    files: CertFiles,
    resolver: Arc<Reloading>,
    provider: Arc<CryptoProvider>,
    interval: Duration,
    mut seen: (Vec<u8>, Vec<u8>),
) {
    let mut last_problem = None::<String>;
    loop {
        tokio::time::sleep(interval).await;
        let outcome = match files.read().await {
            Ok(read) if read == seen => continue,
            Ok(read) => {
                let parsed = files.parse(&read.0, &read.1, &provider);
                seen = read;
                parsed
            }
            Err(e) => Err(e),
        };
        match outcome {
            Ok(key) => {
                tracing::info!(
                    cert = %files.cert.display(),
                    sha256 = %fingerprint(&key),
                    "reloaded the serving certificate"
                );
                resolver.swap(key);
                last_problem = None;
            }
            Err(e) => {
                let problem = error_chain(&e);
                if last_problem.as_ref() != Some(&problem) {
                    tracing::warn!("{problem}; keeping the current certificate");
                    last_problem = Some(problem);
                }
            }
        }
    }
}

/// An error and its causes, `a: b: c`.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// An accepted connection whose TLS handshake completed, holding one of the
/// [`MAX_CONNECTIONS`] slots until it is dropped.
pub struct Accepted {
    /// The connection.
    pub stream: TlsStream<TcpStream>,
    /// Who connected.
    pub peer: SocketAddr,
    /// The connection's slot.
    pub slot: OwnedSemaphorePermit,
}

/// Connections open at once (handshaking or served); one more is closed at once. A
/// connection costs a few tens of KiB at most, so these fit well within the webhook's
/// memory, and the header and body timeouts free the slots slow clients take.
pub const MAX_CONNECTIONS: usize = 512;

/// Accepts TCP connections and hands over the ones whose TLS handshake completed; each
/// handshake runs in its own task, so a slow client delays nobody.
pub struct TlsListener {
    ready: mpsc::Receiver<Accepted>,
    local: SocketAddr,
    accepting: JoinHandle<()>,
}

impl TlsListener {
    /// Serves TLS on `tcp` with `acceptor`.
    ///
    /// # Errors
    /// When the socket's address cannot be read.
    pub fn new(tcp: TcpListener, acceptor: TlsAcceptor) -> io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(64);
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let accepting = tokio::spawn(accept_loop(tcp, acceptor, slots, tx));
        Ok(TlsListener {
            ready,
            local,
            accepting,
        })
    }

    /// The next connection whose handshake completed.
    pub async fn accept(&mut self) -> Accepted {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accept loop only ends when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

async fn accept_loop(
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    slots: Arc<Semaphore>,
    tx: mpsc::Sender<Accepted>,
) {
    while !tx.is_closed() {
        let (stream, peer) = match tcp.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!("accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::warn!(%peer, "closing a connection: {MAX_CONNECTIONS} are open");
            continue;
        };
        let (acceptor, tx) = (acceptor.clone(), tx.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => {
                    let _closed = tx.send(Accepted { stream, peer, slot }).await;
                }
                Ok(Err(e)) => tracing::warn!(%peer, "TLS handshake failed: {e}"),
                Err(_) => tracing::warn!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}
