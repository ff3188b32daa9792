//! The gateway's TLS: a key pair read from files (a Secret's mount) and read again when they
//! change — a rotated certificate is served without a restart — and a listener that completes
//! handshakes off the accept loop, each bounded in time, so a slow or silent client delays no one.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::crypto::ring::{default_provider, sign};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

/// How long a client may take to complete its handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);
/// Handshakes in progress at most.
const HANDSHAKES: usize = 256;
/// How often the files are looked at.
const RELOAD: Duration = Duration::from_secs(30);

/// The key pair at `cert` and `key` (PEM), as rustls serves it.
pub fn load(cert: &Path, key: &Path) -> Result<CertifiedKey, String> {
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("cannot read the certificate {}: {e}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("cannot read the certificate {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("no certificate in {}", cert.display()));
    }
    let der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("cannot read the private key {}: {e}", key.display()))?;
    let signing = sign::any_supported_type(&der)
        .map_err(|e| format!("cannot use the private key {}: {e}", key.display()))?;
    Ok(CertifiedKey::new(chain, signing))
}

/// The current key pair, swapped when its files change.
#[derive(Debug)]
struct Current(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.0
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        )
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// A TLS listener for `axum::serve`.
pub struct Listener {
    accepted: tokio::sync::mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl Listener {
    /// Listens on `address` with the key pair at `cert`/`key` (failing at once if it cannot be
    /// read), reloading it when the files change, until `stop`.
    pub async fn bind(
        address: SocketAddr,
        cert: PathBuf,
        key: PathBuf,
        stop: CancellationToken,
    ) -> Result<Self, String> {
        let current = Arc::new(Current(RwLock::new(Arc::new(load(&cert, &key)?))));
        let config = ServerConfig::builder_with_provider(Arc::new(default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        let mut config = config;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let tcp = TcpListener::bind(address)
            .await
            .map_err(|e| format!("cannot listen on {address}: {e}"))?;
        let local = tcp.local_addr().map_err(|e| e.to_string())?;
        tokio::spawn(reload(current, cert, key, stop.clone()));
        let (sender, accepted) = tokio::sync::mpsc::channel(64);
        let handshakes = Arc::new(tokio::sync::Semaphore::new(HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = tcp.accept() => accepted,
                    _ = stop.cancelled() => return,
                };
                let Ok((stream, peer)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let Ok(permit) = handshakes.clone().try_acquire_owned() else {
                    // Too many handshakes at once: this connection is dropped.
                    continue;
                };
                let (acceptor, sender) = (acceptor.clone(), sender.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    if let Ok(Ok(tls)) =
                        tokio::time::timeout(HANDSHAKE, acceptor.accept(stream)).await
                    {
                        let _ = sender.send((tls, peer)).await;
                    }
                });
            }
        });
        Ok(Self { accepted, local })
    }
}

async fn reload(current: Arc<Current>, cert: PathBuf, key: PathBuf, stop: CancellationToken) {
    let mut seen = (modified(&cert), modified(&key));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(RELOAD) => {}
            _ = stop.cancelled() => return,
        }
        let now = (modified(&cert), modified(&key));
        if now == seen {
            continue;
        }
        match load(&cert, &key) {
            Ok(pair) => {
                *current
                    .0
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(pair);
                seen = now;
                tracing::info!(cert = %cert.display(), "serving the renewed TLS certificate");
            }
            // A half-written pair (the files are replaced one by one): looked at again soon.
            Err(error) => tracing::warn!(%error, "cannot read the renewed TLS certificate yet"),
        }
    }
}

impl axum::serve::Listener for Listener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(accepted) => accepted,
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
