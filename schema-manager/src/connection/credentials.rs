//! Provider credentials: reading the Connection's Secret (CONN-3) and keeping one provider client
//! per Connection, rebuilt whenever the Secret's kubeconfig changes (credential rotation, LIM-1).

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Secret;
use kbind_shared::api::KubeconfigSecretRef;
use kbind_shared::kubeconfig::InlineKubeconfig;
use kbind_shared::metrics::Metrics;
use kube::{Api, Client};
use sha2::{Digest, Sha256};

/// A provider client and what it was built from.
#[derive(Clone)]
pub struct Provider {
    /// Client for the provider.
    pub client: Client,
    /// The validated kubeconfig (server, default namespace).
    pub kubeconfig: InlineKubeconfig,
    fingerprint: [u8; 32],
}

/// The kubeconfig bytes of a Secret, or what is wrong with it (a message naming the Secret and
/// the problem, never its contents).
pub fn kubeconfig_bytes<'s>(
    secret: Option<&'s Secret>,
    reference: &KubeconfigSecretRef,
) -> Result<&'s [u8], String> {
    let (namespace, name, key) = (
        &reference.namespace,
        &reference.name,
        reference.effective_key(),
    );
    let secret = secret.ok_or_else(|| format!("Secret {namespace}/{name} not found"))?;
    let data = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .ok_or_else(|| format!("Secret {namespace}/{name} has no key `{key}`"))?;
    if data.0.is_empty() {
        return Err(format!("Secret {namespace}/{name} key `{key}` is empty"));
    }
    Ok(&data.0)
}

/// Reads the Secret a Connection references and returns its validated kubeconfig.
pub async fn read_kubeconfig(
    consumer: &Client,
    reference: &KubeconfigSecretRef,
) -> Result<(InlineKubeconfig, [u8; 32]), String> {
    let secrets: Api<Secret> = Api::namespaced(consumer.clone(), &reference.namespace);
    let secret = secrets.get_opt(&reference.name).await.map_err(|e| {
        format!(
            "cannot read Secret {}/{}: {e}",
            reference.namespace, reference.name
        )
    })?;
    let bytes = kubeconfig_bytes(secret.as_ref(), reference)?;
    let kubeconfig = InlineKubeconfig::parse(bytes).map_err(|e| {
        format!(
            "Secret {}/{} key `{}`: {e}",
            reference.namespace,
            reference.name,
            reference.effective_key()
        )
    })?;
    Ok((kubeconfig, Sha256::digest(bytes).into()))
}

/// One provider client per Connection.
#[derive(Default)]
pub struct Providers {
    by_connection: Mutex<HashMap<String, Provider>>,
}

impl Providers {
    /// The provider client for `connection`, rebuilt if the kubeconfig changed since last time.
    pub async fn client(
        &self,
        connection: &str,
        kubeconfig: InlineKubeconfig,
        fingerprint: [u8; 32],
        metrics: &Metrics,
    ) -> Result<Provider, String> {
        if let Some(existing) = self
            .by_connection
            .lock()
            .expect("not poisoned")
            .get(connection)
            && existing.fingerprint == fingerprint
        {
            return Ok(existing.clone());
        }
        let client = kubeconfig
            .counted_client(connection, Some(&metrics.api_requests_total))
            .await
            .map_err(|e| e.to_string())?;
        let provider = Provider {
            client,
            kubeconfig,
            fingerprint,
        };
        let previous = self
            .by_connection
            .lock()
            .expect("not poisoned")
            .insert(connection.to_owned(), provider.clone());
        if previous.is_some() {
            tracing::info!(
                connection,
                "provider credentials changed; rebuilt the provider client"
            );
        }
        Ok(provider)
    }

    /// The provider client of a Connection: the cached one, else one built from its Secret now.
    pub async fn for_connection(
        &self,
        consumer: &Client,
        connection: &kbind_shared::api::Connection,
        metrics: &Metrics,
    ) -> Result<Provider, String> {
        let name = kube::ResourceExt::name_any(connection);
        if let Some(existing) = self.by_connection.lock().expect("not poisoned").get(&name) {
            return Ok(existing.clone());
        }
        let (kubeconfig, fingerprint) =
            read_kubeconfig(consumer, &connection.spec.kubeconfig_secret_ref).await?;
        self.client(&name, kubeconfig, fingerprint, metrics).await
    }

    /// Forgets the client of a deleted Connection.
    pub fn forget(&self, connection: &str) {
        self.by_connection
            .lock()
            .expect("not poisoned")
            .remove(connection);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn reference() -> KubeconfigSecretRef {
        KubeconfigSecretRef {
            namespace: "kbind".into(),
            name: "p".into(),
            key: String::new(),
        }
    }

    fn secret(entries: &[(&str, &[u8])]) -> Secret {
        Secret {
            data: Some(
                entries
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), ByteString(v.to_vec())))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn missing_secret_key_or_data_is_named() {
        assert_eq!(
            kubeconfig_bytes(None, &reference()).unwrap_err(),
            "Secret kbind/p not found"
        );
        let other_key = secret(&[("config", b"x")]);
        assert_eq!(
            kubeconfig_bytes(Some(&other_key), &reference()).unwrap_err(),
            "Secret kbind/p has no key `kubeconfig`"
        );
        let empty = secret(&[("kubeconfig", b"")]);
        assert_eq!(
            kubeconfig_bytes(Some(&empty), &reference()).unwrap_err(),
            "Secret kbind/p key `kubeconfig` is empty"
        );
        let ok = secret(&[("kubeconfig", b"apiVersion: v1")]);
        assert_eq!(
            kubeconfig_bytes(Some(&ok), &reference()).unwrap(),
            b"apiVersion: v1"
        );
    }
}
