//! `kubectl kbind grant <export> --consumer <identity>`, run **on a provider** by its admin: the
//! Grant recorded (or found: the same consumer, cluster and Export always get the same Grant and
//! boundary), the issuer's provisioning waited for, a credential minted for the boundary's
//! ServiceAccount, and the one-apply bundle printed — a Secret with the kubeconfig, the
//! Connection, and a ClusterBinding (or, with `--namespace`, a Binding) carrying the Export's
//! defaults. Nothing is written on the consumer; the bundle is the consumer admin's to apply.

use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kbind_provider::issuer::{plan, rbac};
use kbind_shared::api::catalog::{Export, ExportSpec};
use kbind_shared::api::iam::{CredentialMode, Grant};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

/// The plugin's field manager on the provider.
const FIELD_MANAGER: &str = "kubectl-kbind";
/// The Secret holding a long-lived credential's token, in the boundary.
pub const TOKEN_SECRET: &str = "kbind-consumer-token";
/// How long the issuer may take.
const WAIT: Duration = Duration::from_secs(30);

/// What the admin asked for.
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
/// (YAML, several documents) and a note for the admin (stderr).
pub async fn run(
    provider: &Client,
    config: &kube::Config,
    request: &Request,
) -> Result<(String, Option<String>), String> {
    let export = Api::<Export>::all(provider.clone())
        .get_opt(&request.export)
        .await
        .map_err(|e| format!("read Export {}: {e}", request.export))?
        .ok_or_else(|| format!("no Export {} on this provider", request.export))?;
    // No Grant is recorded for what is not offered (the issuer would refuse it).
    plan::offered(&request.export, Some(&export)).map_err(|(_, message)| message)?;
    let boundary = rbac::boundary(
        &request.identity,
        request.cluster_name.as_deref(),
        &request.export,
    );
    let grants = Api::<Grant>::all(provider.clone());
    let mode = if request.long_lived {
        CredentialMode::LongLived
    } else {
        CredentialMode::Bound
    };
    let body = json!({
        "apiVersion": "iam.kbind.io/v1alpha1",
        "kind": "Grant",
        "metadata": { "name": boundary },
        "spec": {
            "export": request.export,
            "consumer": { "identity": request.identity, "clusterName": request.cluster_name },
            "credential": { "mode": mode, "expirationSeconds": request.expiration_seconds },
        },
    });
    grants
        .patch(
            &boundary,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|e| format!("record Grant {boundary}: {e}"))?;
    let grant = issued(&grants, &boundary).await?;
    let token = match mode {
        CredentialMode::Bound => {
            bound_token(provider, &boundary, request.expiration_seconds).await?
        }
        CredentialMode::LongLived => long_lived_token(provider, &grant, &boundary).await?,
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
    let bundle = bundle(&Bundle {
        connection: &connection,
        secret_namespace: &request.secret_namespace,
        kubeconfig: &kubeconfig,
        export: &export.spec,
        namespace: request.namespace.as_deref(),
        boundary: &boundary,
    })?;
    let note = (mode == CredentialMode::Bound).then(|| {
        format!(
            "note: the credential is a token that expires {}s after it was issued; kbind on the consumer renews it in process before then (--token-renewal-at). --long-lived issues one that lasts until the Grant is revoked",
            request.expiration_seconds
        )
    });
    Ok((bundle, note))
}

/// Calls `look` every 200 ms until it answers, for at most [`WAIT`]; `waiting_for` says what
/// did not come.
async fn poll<T, F, Fut>(waiting_for: &str, mut look: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, String>>,
{
    let started = std::time::Instant::now();
    loop {
        if let Some(found) = look().await? {
            return Ok(found);
        }
        if started.elapsed() > WAIT {
            return Err(format!("{waiting_for} within {}s", WAIT.as_secs()));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the Grant's status describes its generation; its `Issued` condition then decides.
async fn issued(grants: &Api<Grant>, name: &str) -> Result<Grant, String> {
    let waiting_for =
        format!("Grant {name} was not looked at: is kbind-issuer running on this provider?");
    let grant = poll(&waiting_for, || async {
        let grant = grants
            .get(name)
            .await
            .map_err(|e| format!("read Grant {name}: {e}"))?;
        let status = grant.status.as_ref();
        let current = status.and_then(|s| s.observed_generation) == grant.metadata.generation;
        let said = status
            .and_then(|s| kbind_shared::conditions::find(&s.conditions, plan::types::ISSUED))
            .filter(|_| current)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
        Ok(said.map(|said| (grant, said)))
    })
    .await?;
    match grant {
        (grant, (status, _, _)) if status == "True" => Ok(grant),
        (_, (_, reason, message)) => {
            Err(format!("Grant {name} is not issued ({reason}): {message}"))
        }
    }
}

async fn bound_token(provider: &Client, boundary: &str, seconds: i64) -> Result<String, String> {
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
        .map_err(|e| format!("token for {boundary}/{}: {e}", rbac::SERVICE_ACCOUNT))?
        .status
        .and_then(|s| s.token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| "the TokenRequest returned no token".to_owned())
}

/// The token of the boundary's long-lived token Secret, created (owned by the Grant, so revoking
/// by deletion collects it) when absent.
async fn long_lived_token(
    provider: &Client,
    grant: &Grant,
    boundary: &str,
) -> Result<String, String> {
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
    .map_err(|e| e.to_string())?;
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(format!("create {boundary}/{TOKEN_SECRET}: {e}")),
    }
    let waiting_for = format!(
        "{boundary}/{TOKEN_SECRET} got no token: is the provider's token controller running?"
    );
    poll(&waiting_for, || async {
        let secret = secrets
            .get(TOKEN_SECRET)
            .await
            .map_err(|e| format!("read {boundary}/{TOKEN_SECRET}: {e}"))?;
        secret
            .data
            .as_ref()
            .and_then(|d| d.get("token"))
            .map(|t| String::from_utf8(t.0.clone()).map_err(|e| e.to_string()))
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
    let mut out = String::new();
    for document in [secret, connection, binding] {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&document).map_err(|e| e.to_string())?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

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
