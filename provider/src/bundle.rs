//! A consumer's bundle, issued **on a provider** — by its admin (`kubectl kbind grant`) or by the
//! gateway for a caller it authenticated (`kbind-gateway`): the Grant recorded (or found: the same
//! consumer, cluster and Export always get the same Grant and boundary), the issuer's provisioning
//! waited for, a credential minted for the boundary's ServiceAccount, and the one-apply bundle
//! made — a Secret with the kubeconfig, the Connection, and a ClusterBinding (or, with a
//! namespace, a Binding) carrying the Export's defaults. Nothing is written on the consumer; the
//! bundle is the consumer admin's to apply.

use std::time::Duration;

use crate::issuer::{plan, rbac};
use base64::Engine;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kbind_shared::api::catalog::{Export, ExportSpec};
use kbind_shared::api::iam::{CredentialMode, Grant};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

/// The Secret holding a long-lived credential's token, in the boundary.
pub const TOKEN_SECRET: &str = "kbind-consumer-token";
/// How long the issuer may take.
const WAIT: Duration = Duration::from_secs(30);

/// Why no bundle was issued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The provider has no such Export.
    #[error("{0}")]
    NoExport(String),
    /// The Export is not offered, or the issuer refused the Grant (its `Issued` condition).
    #[error("{0}")]
    NotIssued(String),
    /// The provider or its issuer did not answer as it should.
    #[error("{0}")]
    Unavailable(String),
}

/// What was asked for.
#[derive(Debug, Clone)]
pub struct Request {
    /// The Export.
    pub export: String,
    /// The consumer's identity.
    pub identity: String,
    /// Which of its clusters.
    pub cluster_name: Option<String>,
    /// A Binding in this consumer namespace instead of a ClusterBinding.
    pub namespace: Option<String>,
    /// The Connection's name on the consumer (default: the Export's).
    pub connection: Option<String>,
    /// Where on the consumer the kubeconfig Secret goes.
    pub secret_namespace: String,
    /// A never-expiring credential instead of a renewed short-lived one.
    pub long_lived: bool,
    /// A short-lived token's lifetime.
    pub expiration_seconds: i64,
    /// The provider's address as consumers reach it (default: the kubeconfig's).
    pub server: Option<String>,
}

/// Records the Grant, waits for it to be issued, mints the credential and returns the bundle
/// (YAML, several documents) and a note for the admin (stderr). `manager`: the field manager the
/// Grant is recorded with.
pub async fn run(
    provider: &Client,
    config: &kube::Config,
    request: &Request,
    manager: &str,
) -> Result<(String, Option<String>), Refusal> {
    let grant = record(provider, request, manager).await?;
    let documents = assemble(provider, config, request, &grant).await?;
    let note = (!request.long_lived).then(|| {
        format!(
            "note: the credential is a token that expires {}s after it was issued; kbind on the consumer renews it in process before then (--token-renewal-at). --long-lived issues one that lasts until the Grant is revoked",
            request.expiration_seconds
        )
    });
    Ok((yaml(&documents)?, note))
}

/// The Export `name`, if it is offered.
async fn offered_export(provider: &Client, name: &str) -> Result<Export, Refusal> {
    let export = Api::<Export>::all(provider.clone())
        .get_opt(name)
        .await
        .map_err(|e| Refusal::Unavailable(format!("read Export {name}: {e}")))?
        .ok_or_else(|| Refusal::NoExport(format!("no Export {name} on this provider")))?;
    plan::offered(name, Some(&export)).map_err(|(_, message)| Refusal::NotIssued(message))?;
    Ok(export)
}

/// Records the request's Grant (named after its boundary; `manager` is the field manager) and
/// waits until the issuer has issued it. An Export that is not offered gets no Grant.
pub async fn record(provider: &Client, request: &Request, manager: &str) -> Result<Grant, Refusal> {
    offered_export(provider, &request.export).await?;
    let boundary = rbac::boundary(
        &request.identity,
        request.cluster_name.as_deref(),
        &request.export,
    );
    let grants = Api::<Grant>::all(provider.clone());
    let body = json!({
        "apiVersion": "iam.kbind.io/v1alpha1",
        "kind": "Grant",
        "metadata": { "name": boundary },
        "spec": {
            "export": request.export,
            "consumer": { "identity": request.identity, "clusterName": request.cluster_name },
            "credential": { "mode": mode(request), "expirationSeconds": request.expiration_seconds },
        },
    });
    grants
        .patch(
            &boundary,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|e| Refusal::Unavailable(format!("record Grant {boundary}: {e}")))?;
    issued(&grants, &boundary).await
}

fn mode(request: &Request) -> CredentialMode {
    if request.long_lived {
        CredentialMode::LongLived
    } else {
        CredentialMode::Bound
    }
}

/// The bundle's documents for the request's issued `grant`: a credential minted now, the
/// Export's defaults as they are now.
pub async fn assemble(
    provider: &Client,
    config: &kube::Config,
    request: &Request,
    grant: &Grant,
) -> Result<Vec<Value>, Refusal> {
    let export = offered_export(provider, &request.export).await?;
    let boundary = grant.name_any();
    let token = match mode(request) {
        CredentialMode::Bound => {
            bound_token(provider, &boundary, request.expiration_seconds).await?
        }
        CredentialMode::LongLived => long_lived_token(provider, grant, &boundary).await?,
    };
    let server = match &request.server {
        Some(server) => server.clone(),
        None => config
            .cluster_url
            .to_string()
            .trim_end_matches('/')
            .to_owned(),
    };
    let ca = config.root_cert.as_deref().map(pem).unwrap_or_default();
    let kubeconfig = kubeconfig(&server, &ca, &token, &boundary);
    let connection = request.connection.clone().unwrap_or(request.export.clone());
    documents(&Bundle {
        connection: &connection,
        secret_namespace: &request.secret_namespace,
        kubeconfig: &kubeconfig,
        export: &export.spec,
        namespace: request.namespace.as_deref(),
        boundary: &boundary,
    })
    .map_err(Refusal::Unavailable)
}

/// The issued Grant `name`, if it is issued and not revoked (a pickup's second look).
pub async fn still_issued(provider: &Client, name: &str) -> Result<Grant, Refusal> {
    let grant = Api::<Grant>::all(provider.clone())
        .get_opt(name)
        .await
        .map_err(|e| Refusal::Unavailable(format!("read Grant {name}: {e}")))?
        .ok_or_else(|| Refusal::NotIssued(format!("Grant {name} is gone")))?;
    if grant.spec.revoked {
        return Err(Refusal::NotIssued(format!("Grant {name} is revoked")));
    }
    match said(&grant) {
        Some((status, _, _)) if status == "True" => Ok(grant),
        Some((_, reason, message)) => Err(Refusal::NotIssued(format!(
            "Grant {name} is not issued ({reason}): {message}"
        ))),
        None => Err(Refusal::NotIssued(format!(
            "Grant {name} is not issued yet"
        ))),
    }
}

/// The Grant's `Issued` condition (status, reason, message), if its status describes its
/// generation.
fn said(grant: &Grant) -> Option<(String, String, String)> {
    let status = grant.status.as_ref();
    let current = status.and_then(|s| s.observed_generation) == grant.metadata.generation;
    status
        .and_then(|s| kbind_shared::conditions::find(&s.conditions, plan::types::ISSUED))
        .filter(|_| current)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Calls `look` every 200 ms until it answers, for at most [`WAIT`]; `waiting_for` says what
/// did not come.
async fn poll<T, F, Fut>(waiting_for: &str, mut look: F) -> Result<T, Refusal>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, Refusal>>,
{
    let started = std::time::Instant::now();
    loop {
        if let Some(found) = look().await? {
            return Ok(found);
        }
        if started.elapsed() > WAIT {
            return Err(Refusal::Unavailable(format!(
                "{waiting_for} within {}s",
                WAIT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the Grant's status describes its generation; its `Issued` condition then decides.
async fn issued(grants: &Api<Grant>, name: &str) -> Result<Grant, Refusal> {
    let waiting_for =
        format!("Grant {name} was not looked at: is kbind-issuer running on this provider?");
    let (grant, (status, reason, message)) = poll(&waiting_for, || async {
        let grant = grants
            .get(name)
            .await
            .map_err(|e| Refusal::Unavailable(format!("read Grant {name}: {e}")))?;
        Ok(said(&grant).map(|said| (grant, said)))
    })
    .await?;
    if status == "True" {
        Ok(grant)
    } else {
        Err(Refusal::NotIssued(format!(
            "Grant {name} is not issued ({reason}): {message}"
        )))
    }
}

async fn bound_token(provider: &Client, boundary: &str, seconds: i64) -> Result<String, Refusal> {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(seconds),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    Api::<ServiceAccount>::namespaced(provider.clone(), boundary)
        .create_token_request(rbac::SERVICE_ACCOUNT, &PostParams::default(), &request)
        .await
        .map_err(|e| {
            Refusal::Unavailable(format!(
                "token for {boundary}/{}: {e}",
                rbac::SERVICE_ACCOUNT
            ))
        })?
        .status
        .and_then(|s| s.token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Refusal::Unavailable("the TokenRequest returned no token".to_owned()))
}

/// The token of the boundary's long-lived token Secret, created (owned by the Grant, so revoking
/// by deletion collects it) when absent.
async fn long_lived_token(
    provider: &Client,
    grant: &Grant,
    boundary: &str,
) -> Result<String, Refusal> {
    let unavailable = Refusal::Unavailable;
    let secrets = Api::<Secret>::namespaced(provider.clone(), boundary);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {
            "name": TOKEN_SECRET,
            "annotations": { "kubernetes.io/service-account.name": rbac::SERVICE_ACCOUNT },
            "labels": { plan::BOUNDARY_LABEL: boundary },
            "ownerReferences": [{
                "apiVersion": "iam.kbind.io/v1alpha1",
                "kind": "Grant",
                "name": grant.name_any(),
                "uid": grant.uid().unwrap_or_default(),
            }],
        },
        "type": "kubernetes.io/service-account-token",
    }))
    .map_err(|e| unavailable(e.to_string()))?;
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => {
            return Err(unavailable(format!(
                "create {boundary}/{TOKEN_SECRET}: {e}"
            )));
        }
    }
    let waiting_for = format!(
        "{boundary}/{TOKEN_SECRET} got no token: is the provider's token controller running?"
    );
    poll(&waiting_for, || async {
        let secret = secrets
            .get(TOKEN_SECRET)
            .await
            .map_err(|e| unavailable(format!("read {boundary}/{TOKEN_SECRET}: {e}")))?;
        secret
            .data
            .as_ref()
            .and_then(|d| d.get("token"))
            .map(|t| String::from_utf8(t.0.clone()).map_err(|e| unavailable(e.to_string())))
            .transpose()
    })
    .await
}

/// DER certificates as PEM.
fn pem(certs: &[Vec<u8>]) -> String {
    let mut out = String::new();
    for der in certs {
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        for line in b64.as_bytes().chunks(64) {
            out.push_str(&String::from_utf8_lossy(line));
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
    out
}

/// A self-contained kubeconfig: the server, its CA (PEM; none: the system's roots), the token,
/// and the boundary as its namespace (where kbind keeps the heartbeat Lease).
pub fn kubeconfig(server: &str, ca_pem: &str, token: &str, boundary: &str) -> String {
    let mut cluster = json!({ "server": server });
    if !ca_pem.is_empty() {
        cluster["certificate-authority-data"] =
            json!(base64::engine::general_purpose::STANDARD.encode(ca_pem));
    }
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "provider", "cluster": cluster }],
        "users": [{ "name": "kbind", "user": { "token": token } }],
        "contexts": [{ "name": "provider", "context": { "cluster": "provider", "user": "kbind", "namespace": boundary } }],
        "current-context": "provider",
    });
    serde_yaml::to_string(&config).unwrap_or_default()
}

/// What a bundle is made of.
pub struct Bundle<'a> {
    /// The Connection's name.
    pub connection: &'a str,
    /// The Secret's namespace on the consumer.
    pub secret_namespace: &'a str,
    /// The kubeconfig.
    pub kubeconfig: &'a str,
    /// The Export: its APIs and defaults.
    pub export: &'a ExportSpec,
    /// A Binding in this namespace, else a ClusterBinding.
    pub namespace: Option<&'a str>,
    /// The Grant's boundary: the Connection's copies live in its namespaces (#51).
    pub boundary: &'a str,
}

/// The bundle as YAML documents: Secret, Connection, binding.
pub fn bundle(b: &Bundle<'_>) -> Result<String, String> {
    yaml(&documents(b)?).map_err(|e| e.to_string())
}

/// Documents as one YAML stream (`kubectl apply -f` takes it as it is).
pub fn yaml(documents: &[Value]) -> Result<String, Refusal> {
    let mut out = String::new();
    for document in documents {
        out.push_str("---\n");
        out.push_str(
            &serde_yaml::to_string(document).map_err(|e| Refusal::Unavailable(e.to_string()))?,
        );
    }
    Ok(out)
}

/// Documents as one JSON `List` (`kubectl apply -f` takes it as it is).
pub fn json_list(documents: &[Value]) -> String {
    json!({ "apiVersion": "v1", "kind": "List", "items": documents }).to_string()
}

/// The bundle's documents: Secret, Connection, binding.
pub fn documents(b: &Bundle<'_>) -> Result<Vec<Value>, String> {
    let secret_name = format!("{}-kubeconfig", b.connection);
    let secret = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": { "name": secret_name, "namespace": b.secret_namespace },
        "type": "Opaque",
        "stringData": { "kubeconfig": b.kubeconfig },
    });
    let connection = json!({
        "apiVersion": "core.kbind.io/v1alpha1",
        "kind": "Connection",
        "metadata": { "name": b.connection },
        "spec": {
            "kubeconfigSecretRef": { "namespace": b.secret_namespace, "name": secret_name, "key": "kubeconfig" },
            "boundary": b.boundary,
        },
    });
    let mut spec = json!({
        "connectionRef": { "name": b.connection },
        "apis": b.export.apis.iter().map(|a| json!({ "name": a.name })).collect::<Vec<_>>(),
    });
    if let Some(defaults) = &b.export.defaults {
        if let Some(policy) = &defaults.conflict_policy {
            spec["conflictPolicy"] = serde_json::to_value(policy).map_err(|e| e.to_string())?;
        }
        if !defaults.related_resources.is_empty() {
            spec["relatedResources"] =
                serde_json::to_value(&defaults.related_resources).map_err(|e| e.to_string())?;
        }
    }
    let binding = match b.namespace {
        Some(namespace) => json!({
            "apiVersion": "core.kbind.io/v1alpha1",
            "kind": "Binding",
            "metadata": { "name": b.connection, "namespace": namespace },
            "spec": spec,
        }),
        None => json!({
            "apiVersion": "core.kbind.io/v1alpha1",
            "kind": "ClusterBinding",
            "metadata": { "name": b.connection },
            "spec": spec,
        }),
    };
    Ok(vec![secret, connection, binding])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The documents of a bundle, parsed.
    fn documents(bundle: &str) -> Vec<Value> {
        use serde::Deserialize;
        serde_yaml::Deserializer::from_str(bundle)
            .filter_map(|d| Value::deserialize(d).ok())
            .filter(|v| !v.is_null())
            .collect()
    }
    use kbind_shared::api::catalog::ExportDefaults;
    use kbind_shared::api::{
        ApiRef, ConflictPolicy, RelatedDirection, RelatedResource, RelatedResourceKind,
    };

    fn export() -> ExportSpec {
        ExportSpec {
            title: "Widgets".into(),
            description: None,
            docs: None,
            apis: vec![ApiRef {
                name: "widgets.example.org".into(),
            }],
            defaults: Some(ExportDefaults {
                conflict_policy: Some(ConflictPolicy::Adopt),
                related_resources: vec![RelatedResource {
                    group: String::new(),
                    resource: RelatedResourceKind::Secrets,
                    direction: RelatedDirection::FromProvider,
                    selector: None,
                    namespaces: Vec::new(),
                }],
            }),
        }
    }

    #[test]
    fn a_bundle_is_a_secret_a_connection_and_a_binding_with_the_exports_defaults() {
        let spec = export();
        let text = bundle(&Bundle {
            connection: "widgets",
            secret_namespace: "kbind",
            kubeconfig: "KUBECONFIG",
            export: &spec,
            namespace: None,
            boundary: "kbind-0123456789",
        })
        .unwrap();
        let docs = documents(&text);
        let kinds: Vec<&str> = docs
            .iter()
            .map(|d| d["kind"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(kinds, ["Secret", "Connection", "ClusterBinding"]);
        assert_eq!(docs[0]["stringData"]["kubeconfig"], "KUBECONFIG");
        assert_eq!(docs[0]["metadata"]["namespace"], "kbind");
        assert_eq!(
            docs[1]["spec"]["kubeconfigSecretRef"]["name"],
            "widgets-kubeconfig"
        );
        assert_eq!(docs[1]["spec"]["boundary"], "kbind-0123456789");
        assert_eq!(docs[2]["spec"]["connectionRef"]["name"], "widgets");
        assert_eq!(docs[2]["spec"]["apis"][0]["name"], "widgets.example.org");
        assert_eq!(docs[2]["spec"]["conflictPolicy"], "Adopt");
        assert_eq!(
            docs[2]["spec"]["relatedResources"][0]["resource"],
            "secrets"
        );
        // Every document parses as kbind's types.
        serde_json::from_value::<kbind_shared::api::Connection>(docs[1].clone()).unwrap();
        serde_json::from_value::<kbind_shared::api::ClusterBinding>(docs[2].clone()).unwrap();

        let text = bundle(&Bundle {
            namespace: Some("team-a"),
            ..Bundle {
                connection: "widgets",
                secret_namespace: "kbind",
                kubeconfig: "K",
                export: &spec,
                namespace: None,
                boundary: "kbind-0123456789",
            }
        })
        .unwrap();
        let binding = &documents(&text)[2];
        assert_eq!(binding["kind"], "Binding");
        assert_eq!(binding["metadata"]["namespace"], "team-a");
        serde_json::from_value::<kbind_shared::api::Binding>(binding.clone()).unwrap();
    }

    #[test]
    fn the_kubeconfig_is_self_contained_and_kbind_reads_it() {
        let ca = pem(&[b"not really DER".to_vec()]);
        assert!(ca.starts_with("-----BEGIN CERTIFICATE-----\n"), "{ca}");
        let text = kubeconfig("https://provider:6443", &ca, "TOKEN", "kbind-0123456789");
        let parsed = kbind_shared::kubeconfig::InlineKubeconfig::parse(text.as_bytes()).unwrap();
        assert_eq!(parsed.server(), "https://provider:6443");
        assert_eq!(parsed.namespace(), Some("kbind-0123456789"));
    }
}
