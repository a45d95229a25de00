//! The HTTPS listener: rustls with the server's certificate (`pki.rs`), HTTP/1.1, each
//! handshake in its own task. In-cluster clients (`KUBERNETES_SERVICE_HOST`) need HTTPS.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::pki::Pki;

/// Accepts connections whose TLS handshake completed.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Serves TLS with `pki`'s serving certificate on `tcp` (call inside a tokio runtime).
    pub fn new(tcp: TcpListener, pki: &Pki) -> TlsListener {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&pki.cert)
            .expect("the serving certificate")
            .collect::<Result<_, _>>()
            .expect("the serving certificate parses");
        let key = PrivateKeyDer::from_pem_file(&pki.key).expect("the serving key");
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("the serving certificate and key match");
        // axum serves HTTP/1.1 here; a client offered h2 would fail.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let local = tcp.local_addr().expect("the listener's address");
        let (tx, ready) = mpsc::channel(64);
        tokio::spawn(async move {
            while !tx.is_closed() {
                let Ok((stream, peer)) = tcp.accept().await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let handshake = acceptor.accept(stream);
                    if let Ok(Ok(tls)) =
                        tokio::time::timeout(Duration::from_secs(10), handshake).await
                    {
                        let _closed = tx.send((tls, peer)).await;
                    }
                });
            }
        });
        TlsListener { ready, local }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}
