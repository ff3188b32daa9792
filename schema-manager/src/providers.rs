//! Provider credentials: reading the Connection's Secret (CONN-3) and keeping one verified
//! provider client per Connection, replaced when a rotated credential is verified (LIM-1).

use kbind_shared::sync::Locked;
use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Secret;
use kbind_shared::api::KubeconfigSecretRef;
use kbind_shared::credential::{ProviderCredential, SecretPolicy};
use kbind_shared::kubeconfig::InlineKubeconfig;
use kbind_shared::metrics::Metrics;
use kube::{Api, Client};

/// A provider client and the credential it was built from.
#[derive(Clone)]
pub struct Provider {
    /// Client for the provider.
    pub client: Client,
    /// The validated kubeconfig (server, default namespace).
    pub kubeconfig: InlineKubeconfig,
    /// `sha256:<hex>` of the kubeconfig bytes.
    pub digest: String,
}

/// Why reading something from a provider failed: RBAC said no, or anything else (retried).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// RBAC denied it.
    #[error("{0}")]
    Forbidden(String),
    /// Anything else.
    #[error("{0}")]
    Failed(String),
}

impl ProviderError {
    /// Classifies a failed request for `what` (the message names it and never carries a URL).
    pub fn from_kube(what: &str, e: kube::Error) -> Self {
        match e {
            kube::Error::Api(s) if s.is_forbidden() => Self::Forbidden(format!(
                "{what} was denied by RBAC: {}",
                kbind_shared::redact::remote(&s.message)
            )),
            e => Self::Failed(format!(
                "{what} failed: {}",
                kbind_shared::identity::describe_error(&e)
            )),
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        match self {
            Self::Forbidden(m) | Self::Failed(m) => m,
        }
    }
}

/// Reads the Secret a Connection references and returns its validated credential.
pub async fn read_credential(
    consumer: &Client,
    reference: &KubeconfigSecretRef,
    policy: &SecretPolicy,
) -> Result<ProviderCredential, String> {
    read_credential_cached(consumer, reference, policy, None).await
}

/// [`read_credential`], from `cached` when a watch of the Secret has it (`Some(None)`: it does
/// not exist), else from the API.
pub async fn read_credential_cached(
    consumer: &Client,
    reference: &KubeconfigSecretRef,
    policy: &SecretPolicy,
    cached: Option<Option<std::sync::Arc<Secret>>>,
) -> Result<ProviderCredential, String> {
    kbind_shared::credential::check_secret_namespace(reference, &policy.namespaces)?;
    if let Some(secret) = cached {
        return ProviderCredential::from_secret(secret.as_deref(), reference, policy.transport);
    }
    let secrets: Api<Secret> = Api::namespaced(consumer.clone(), &reference.namespace);
    let secret = secrets.get_opt(&reference.name).await.map_err(|e| {
        format!(
            "cannot read Secret {}/{}: {}",
            reference.namespace,
            reference.name,
            kbind_shared::identity::describe_error(&e)
        )
    })?;
    ProviderCredential::from_secret(secret.as_ref(), reference, policy.transport)
}

/// One provider client per Connection, holding only credentials whose cluster identity was
/// verified (see `kbind_shared::credential`): nothing but the Connection reconcile, right after
/// it checked the identity, puts a client here.
#[derive(Default)]
pub struct Providers {
    by_connection: Mutex<HashMap<String, Provider>>,
}

impl Providers {
    /// A client for `credential`: the verified one if it was built from the same credential,
    /// else a new one that is *not* kept until [`Providers::verified`] says so.
    pub async fn build(
        &self,
        connection: &str,
        credential: ProviderCredential,
        metrics: &Metrics,
    ) -> Result<Provider, String> {
        if let Some(existing) = self.by_connection.locked().get(connection)
            && existing.digest == credential.digest
        {
            return Ok(existing.clone());
        }
        let client = credential
            .kubeconfig
            .counted_client(connection, Some(&metrics.api_requests_total))
            .await
            .map_err(|e| e.to_string())?;
        Ok(Provider {
            client,
            kubeconfig: credential.kubeconfig,
            digest: credential.digest,
        })
    }

    /// Keeps `provider` as the Connection's client: its cluster identity matched the pin.
    pub fn verified(&self, connection: &str, provider: &Provider) {
        let previous = self
            .by_connection
            .locked()
            .insert(connection.to_owned(), provider.clone());
        if previous.is_some_and(|p| p.digest != provider.digest) {
            tracing::info!(
                connection,
                "provider credentials changed and were verified; using the new client"
            );
        }
    }

    /// The verified provider client of a Connection: the kept one, else one built from its Secret
    /// now if that credential is the one `status.verifiedCredential` records.
    pub async fn for_connection(
        &self,
        consumer: &Client,
        connection: &kbind_shared::api::Connection,
        policy: &SecretPolicy,
        metrics: &Metrics,
    ) -> Result<Provider, String> {
        let name = kube::ResourceExt::name_any(connection);
        let reference = &connection.spec.kubeconfig_secret_ref;
        kbind_shared::credential::check_secret_namespace(reference, &policy.namespaces)?;
        if let Some(existing) = self.by_connection.locked().get(&name) {
            return Ok(existing.clone());
        }
        let credential = read_credential(consumer, reference, policy).await?;
        if !credential.is_verified(connection.status.as_ref()) {
            return Err(format!(
                "the credential in Secret {}/{} has not been verified against the provider's pinned cluster identity yet",
                reference.namespace, reference.name
            ));
        }
        let provider = self.build(&name, credential, metrics).await?;
        self.verified(&name, &provider);
        Ok(provider)
    }

    /// Forgets the client of a deleted Connection.
    pub fn forget(&self, connection: &str) {
        self.by_connection.locked().remove(connection);
    }
}
