//! HTTPS for a server bound beyond loopback: a certificate chain and key
//! from PEM files ([`load`]), and a listener whose handshakes run on their
//! own tasks with a deadline, so a client that never finishes one holds up
//! no one else.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::server::TlsStream;

/// How long a client has to finish its handshake.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);

/// A certificate or key that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("TLS: `{}`: {reason}", file.display())]
pub struct TlsError {
    /// The file.
    pub file: PathBuf,
    /// What is wrong.
    pub reason: String,
}

/// The server's TLS configuration from a PEM certificate chain and a PEM
/// private key.
pub fn load(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect())
        .map_err(|e| TlsError {
            file: cert.to_owned(),
            reason: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError {
            file: cert.to_owned(),
            reason: "no certificate in the file".into(),
        });
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError {
        file: key.to_owned(),
        reason: e.to_string(),
    })?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key_der))
        .map_err(|e| TlsError {
            file: key.to_owned(),
            reason: e.to_string(),
        })?;
    Ok(Arc::new(config))
}

/// A TCP listener that hands out connections once their TLS handshake is
/// done.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<tokio::net::TcpStream>, SocketAddr)>,
}

impl TlsListener {
    /// Accepts on `listener` with `config`.
    pub fn new(listener: TcpListener, config: Arc<ServerConfig>) -> TlsListener {
        let (tx, ready) = mpsc::channel(64);
        let acceptor = TlsAcceptor::from(config);
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if tx.is_closed() {
                    break;
                }
                let acceptor = acceptor.clone();
                let handed = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_DEADLINE, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = handed.send((stream, peer)).await;
                        }
                        Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        TlsListener { ready }
    }
}

impl crate::connections::Accept for TlsListener {
    type Io = TlsStream<tokio::net::TcpStream>;

    async fn next(&mut self) -> std::io::Result<(Self::Io, SocketAddr)> {
        match self.ready.recv().await {
            Some(ready) => Ok(ready),
            // The accept loop only ends once this listener is dropped.
            None => std::future::pending().await,
        }
    }
}
