//! A client for someone else's HTTP service — an identity provider, a provider's gateway: HTTPS
//! with the system's roots (and a CA file when given), every answer bounded in size and time.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// The client.
pub type Client =
    hyper_util::client::legacy::Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A client trusting the system's roots and the PEM certificates in `ca_file`; with
/// `plain_http`, `http://` is spoken too (the caller decides where that is allowed).
pub fn client(ca_file: Option<&Path>, plain_http: bool) -> Result<Client, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = ca_file {
        use rustls::pki_types::pem::PemObject;
        let certs = rustls::pki_types::CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("read {}: {e}", path.display()))?;
        for cert in certs {
            roots
                .add(cert.map_err(|e| format!("read {}: {e}", path.display()))?)
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let builder = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls);
    let connector = if plain_http {
        builder.https_or_http().enable_http1().build()
    } else {
        builder.https_only().enable_http1().build()
    };
    Ok(hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(connector))
}

/// One exchange, named `what` in errors (never the URL: it may hold a token): its status code
/// and body, at most `max_bytes`, within `timeout`.
pub async fn send(
    client: &Client,
    request: hyper::Request<Full<Bytes>>,
    what: &str,
    max_bytes: usize,
    timeout: Duration,
) -> Result<(u16, Bytes), String> {
    let exchange = async {
        let response = client
            .request(request)
            .await
            .map_err(|e| format!("{what}: {}", root_cause(&e)))?;
        let code = response.status().as_u16();
        let body = Limited::new(response.into_body(), max_bytes)
            .collect()
            .await
            .map_err(|e| {
                format!("{what}: the answer is larger than {max_bytes} bytes or broke off: {e}")
            })?
            .to_bytes();
        Ok::<_, String>((code, body))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("{what}: no answer within {}s", timeout.as_secs()))?
}

/// An error's root cause (DNS, refused, TLS), not its outermost "client error".
fn root_cause(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text = cause.to_string();
        source = cause.source();
    }
    text
}
