//! A TCP port forward whose target can be switched: the address a credential names stays the
//! same while the server behind it becomes another one (a load balancer or DNS name moved to
//! another cluster). Bytes pass through untouched — TLS ends at the real API servers.

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A running forward from a local port to a switchable local target port; it stops when dropped.
pub struct Forward {
    port: u16,
    target: Arc<AtomicU16>,
    cut: tokio::sync::watch::Sender<u64>,
    accept: JoinHandle<()>,
}

impl Forward {
    /// Forwards a free local port to `127.0.0.1:<target>`.
    pub async fn start(target: u16) -> Result<Self, String> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(|e| format!("forward: bind: {e}"))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("forward: {e}"))?
            .port();
        let target = Arc::new(AtomicU16::new(target));
        let (cut, _) = tokio::sync::watch::channel(0u64);
        let accept = {
            let target = target.clone();
            let cut = cut.clone();
            tokio::spawn(async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    let to = target.load(Ordering::SeqCst);
                    let mut cut = cut.subscribe();
                    tokio::spawn(async move {
                        let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", to)).await else {
                            return;
                        };
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                            _ = cut.changed() => {}
                        }
                    });
                }
            })
        };
        Ok(Self {
            port,
            target,
            cut,
            accept,
        })
    }

    /// The local port to connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `https://127.0.0.1:<port>`: the address for a kubeconfig.
    pub fn server(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// Sends new connections to `target` and closes the open ones (their server is gone).
    pub fn switch(&self, target: u16) {
        self.target.store(target, Ordering::SeqCst);
        self.cut.send_modify(|n| *n += 1);
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut.send_modify(|n| *n += 1);
    }
}

/// The port of an `https://host:port` address.
pub fn port_of(server: &str) -> Option<u16> {
    server
        .rsplit(':')
        .next()?
        .trim_end_matches('/')
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn echo_server(reply: &'static [u8]) -> u16 {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 16];
                    while let Ok(n) = stream.read(&mut buf).await {
                        if n == 0 || stream.write_all(reply).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        port
    }

    async fn ask(stream: &mut TcpStream) -> Option<Vec<u8>> {
        stream.write_all(b"?").await.ok()?;
        let mut buf = [0u8; 1];
        match stream.read(&mut buf).await {
            Ok(1) => Some(buf.to_vec()),
            _ => None,
        }
    }

    #[tokio::test]
    async fn a_switch_closes_open_connections_and_sends_new_ones_to_the_new_target() {
        let (a, b) = (echo_server(b"a").await, echo_server(b"b").await);
        let forward = Forward::start(a).await.unwrap();
        let mut first = TcpStream::connect(("127.0.0.1", forward.port()))
            .await
            .unwrap();
        assert_eq!(ask(&mut first).await, Some(b"a".to_vec()));
        forward.switch(b);
        let mut buf = [0u8; 1];
        let closed = first.read(&mut buf).await;
        assert!(
            matches!(closed, Ok(0) | Err(_)),
            "the open connection is closed: {closed:?}"
        );
        let mut second = TcpStream::connect(("127.0.0.1", forward.port()))
            .await
            .unwrap();
        assert_eq!(ask(&mut second).await, Some(b"b".to_vec()));
        assert_eq!(port_of("https://127.0.0.1:6443"), Some(6443));
        assert_eq!(port_of(&forward.server()), Some(forward.port()));
    }
}
