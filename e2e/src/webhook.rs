//! A validating admission webhook for tests: an HTTPS server on 127.0.0.1 with its own
//! self-signed certificate (its PEM goes into the webhook configuration's `caBundle`) that
//! denies every request with the code and message it was made with — what a provider's admission
//! answers when it says no.

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Registers the validating webhook configuration `name` on `client`'s cluster: `operations`
/// on `resource` (e.g. `widgets`, `widgets/status`) of group `example.org`, in the namespaces
/// labelled `selector` (`None`: all), failurePolicy Fail. Served by `hook`; `None`: by a server
/// that is down (127.0.0.1:1), so that every matching write answers 500 — a provider whose
/// admission is broken.
pub async fn register(
    client: &kube::Client,
    name: &str,
    hook: Option<&DenyingWebhook>,
    operations: &[&str],
    resource: &str,
    selector: Option<(&str, &str)>,
) -> Result<(), String> {
    register_in(
        client,
        name,
        hook,
        operations,
        "example.org",
        resource,
        selector,
    )
    .await
}

/// [`register`] for `resource` of API group `group` (e.g. `core.kbind.io`: kbind's own objects).
pub async fn register_in(
    client: &kube::Client,
    name: &str,
    hook: Option<&DenyingWebhook>,
    operations: &[&str],
    group: &str,
    resource: &str,
    selector: Option<(&str, &str)>,
) -> Result<(), String> {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    let client_config = match hook {
        Some(hook) => json!({
            "url": hook.url,
            "caBundle": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &hook.ca_pem),
        }),
        None => json!({ "url": "https://127.0.0.1:1/validate" }),
    };
    let mut webhook = json!({
        "name": format!("{name}.example.org"),
        "clientConfig": client_config,
        "rules": [{ "apiGroups": [group], "apiVersions": ["*"], "operations": operations, "resources": [resource] }],
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": if hook.is_some() { 5 } else { 1 },
    });
    if let Some((key, value)) = selector {
        webhook["namespaceSelector"] = json!({ "matchLabels": { key: value } });
    }
    let configuration: ValidatingWebhookConfiguration =
        serde_json::from_value(json!({ "metadata": { "name": name }, "webhooks": [webhook] }))
            .map_err(|e| e.to_string())?;
    kube::Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&Default::default(), &configuration)
        .await
        .map_err(|e| format!("webhook configuration {name}: {e}"))?;
    Ok(())
}

/// Breaks `client`'s cluster's admission of Widgets: the webhook configuration `down`, served by
/// nobody, so every Widget create or update answers 500 (until [`unregister`]ed); waits a second
/// for the API server to load it.
pub async fn register_down(client: &kube::Client) -> Result<(), String> {
    register(client, "down", None, &["CREATE", "UPDATE"], "widgets", None).await?;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    Ok(())
}

/// Removes the webhook configuration `name` from `client`'s cluster.
pub async fn unregister(client: &kube::Client, name: &str) -> Result<(), String> {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    kube::Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .delete(name, &Default::default())
        .await
        .map(drop)
        .map_err(|e| format!("webhook configuration {name}: {e}"))
}

/// A running denying webhook; stops when dropped.
pub struct DenyingWebhook {
    /// `https://127.0.0.1:<port>/validate`.
    pub url: String,
    /// The server certificate (PEM), for `caBundle`.
    pub ca_pem: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for DenyingWebhook {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DenyingWebhook {
    /// Starts a webhook that denies every review with `code` and `message`.
    pub async fn start(code: u16, message: &str) -> Result<Self, String> {
        Self::listen(Some((code, message.to_owned()))).await
    }

    /// Starts a webhook that accepts each review and never answers it: every write it admits
    /// hangs for the configuration's `timeoutSeconds` (5), then fails — a provider whose writes
    /// hang.
    pub async fn hanging() -> Result<Self, String> {
        Self::listen(None).await
    }

    /// Serves reviews: denied with `answer`, or never answered.
    async fn listen(answer: Option<(u16, String)>) -> Result<Self, String> {
        let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()])
            .map_err(|e| e.to_string())?;
        let ca_pem = certified.cert.pem();
        let key = tokio_rustls::rustls::pki_types::PrivateKeyDer::try_from(
            certified.signing_key.serialize_der(),
        )
        .map_err(|e| e.to_string())?;
        let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(Arc::new(
            tokio_rustls::rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)
        .map_err(|e| e.to_string())?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (acceptor, answer) = (acceptor.clone(), answer.clone());
                tokio::spawn(async move {
                    let Ok(mut stream) = acceptor.accept(stream).await else {
                        return;
                    };
                    match answer {
                        Some((code, message)) => {
                            let _ = serve(stream, code, &message).await;
                        }
                        // Read everything, answer nothing, until the caller gives up.
                        None => while stream.read(&mut [0u8; 8192]).await.is_ok_and(|n| n > 0) {},
                    }
                });
            }
        });
        Ok(Self {
            url: format!("https://127.0.0.1:{port}/validate"),
            ca_pem,
            task,
        })
    }
}

/// Answers HTTP/1.1 requests on one connection until it closes.
async fn serve(
    mut stream: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    code: u16,
    message: &str,
) -> std::io::Result<()> {
    let mut buffer = Vec::new();
    loop {
        // Headers, then a body of Content-Length bytes.
        let head_end = loop {
            if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let mut chunk = [0u8; 8192];
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buffer.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buffer.len() < head_end + length {
            let mut chunk = [0u8; 8192];
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buffer.extend_from_slice(&chunk[..n]);
        }
        let review: Value =
            serde_json::from_slice(&buffer[head_end..head_end + length]).unwrap_or_default();
        buffer.drain(..head_end + length);
        let answer = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {
                "uid": review["request"]["uid"],
                "allowed": false,
                "status": { "code": code, "message": message },
            },
        })
        .to_string();
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{answer}",
            answer.len()
        );
        stream.write_all(response.as_bytes()).await?;
        stream.flush().await?;
    }
}
