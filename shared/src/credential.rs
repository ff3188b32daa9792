//! A Connection's provider credential as read from its Secret (CONN-3) — one parser and one set of
//! messages for both programs — and the rule that decides whether kbind may use it.
//!
//! kbind writes to a provider only with a credential whose cluster identity was checked against
//! the Connection's pinned `remoteClusterUID`. The schema manager checks it and records the
//! credential's digest in `status.verifiedCredential`; the syncer uses a credential only while its
//! digest matches. A Secret swapped to another cluster is therefore never used, not even in the
//! moment before the schema manager reports `ClusterIdentityChanged`; a rotation to another
//! credential for the same cluster applies as soon as it is verified.

use k8s_openapi::api::core::v1::Secret;
use sha2::{Digest, Sha256};

use crate::api::{ConnectionStatus, KubeconfigSecretRef};
use crate::kubeconfig::{InlineKubeconfig, Transport};

/// Where provider Secrets may live and whether insecure transport is allowed: the operator's
/// choice (`--provider-secret-namespaces`, `--allow-insecure-providers`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SecretPolicy {
    /// Namespaces kbind reads provider kubeconfig Secrets from.
    pub namespaces: Vec<String>,
    /// Whether `insecure-skip-tls-verify` and `http://` servers are accepted.
    pub transport: Transport,
}

/// A parsed provider kubeconfig and the digest of the bytes it came from.
#[derive(Clone, Debug)]
pub struct ProviderCredential {
    /// The validated kubeconfig.
    pub kubeconfig: InlineKubeconfig,
    /// `sha256:<hex>` of the Secret's kubeconfig bytes.
    pub digest: String,
}

impl ProviderCredential {
    /// The credential in `secret` (the one `reference` names), or what is wrong with it: a message
    /// naming the Secret and the problem, never its contents.
    pub fn from_secret(
        secret: Option<&Secret>,
        reference: &KubeconfigSecretRef,
        transport: Transport,
    ) -> Result<Self, String> {
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
        let kubeconfig = InlineKubeconfig::parse_with(&data.0, transport)
            .map_err(|e| format!("Secret {namespace}/{name} key `{key}`: {e}"))?;
        Ok(Self {
            kubeconfig,
            digest: digest(&data.0),
        })
    }

    /// Whether this credential is the one whose cluster identity was verified for the Connection
    /// with `status` (so kbind may write with it).
    pub fn is_verified(&self, status: Option<&ConnectionStatus>) -> bool {
        status.is_some_and(|s| {
            !s.remote_cluster_uid.is_empty() && s.verified_credential == self.digest
        })
    }
}

/// Whether kbind may read the Secret `reference` names: only in the namespaces the operator
/// allowed (`--provider-secret-namespaces`), enforced here and not only by RBAC, so a Connection
/// cannot point kbind at any Secret its ServiceAccount happens to be able to read.
pub fn check_secret_namespace(
    reference: &KubeconfigSecretRef,
    allowed: &[String],
) -> Result<(), String> {
    if allowed.contains(&reference.namespace) {
        return Ok(());
    }
    Err(format!(
        "Secret {}/{} is in a namespace kbind does not read provider credentials from (allowed: {}); move the Secret there, or allow its namespace (--provider-secret-namespaces, chart value providerSecretNamespaces)",
        reference.namespace,
        reference.name,
        allowed.join(", ")
    ))
}

/// `sha256:<hex>` of kubeconfig bytes. A digest of a credential reveals nothing usable about it.
pub fn digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let mut text = String::with_capacity(7 + 64);
    text.push_str("sha256:");
    for byte in hash {
        text.push_str(&format!("{byte:02x}"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    const KUBECONFIG: &str = "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {cluster: p, user: u}\nclusters:\n- name: p\n  cluster: {server: 'https://127.0.0.1:6443'}\nusers:\n- name: u\n  user: {token: abc}\n";

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

    fn error(secret: Option<&Secret>) -> String {
        ProviderCredential::from_secret(secret, &reference(), Transport::Secure).unwrap_err()
    }

    #[test]
    fn each_fault_is_named_without_the_contents() {
        assert_eq!(error(None), "Secret kbind/p not found");
        assert_eq!(
            error(Some(&secret(&[("config", b"x")]))),
            "Secret kbind/p has no key `kubeconfig`"
        );
        assert_eq!(
            error(Some(&secret(&[("kubeconfig", b"")]))),
            "Secret kbind/p key `kubeconfig` is empty"
        );
        let bad = error(Some(&secret(&[("kubeconfig", b"token: hunter2: [")])));
        assert!(
            bad.starts_with("Secret kbind/p key `kubeconfig`: "),
            "{bad}"
        );
        assert!(!bad.contains("hunter2"), "{bad}");
    }

    #[test]
    fn secrets_only_in_allowed_namespaces() {
        let allowed = ["kbind".to_owned(), "team-creds".to_owned()];
        assert!(check_secret_namespace(&reference(), &allowed).is_ok());
        let elsewhere = KubeconfigSecretRef {
            namespace: "kube-system".into(),
            ..reference()
        };
        assert_eq!(
            check_secret_namespace(&elsewhere, &allowed).unwrap_err(),
            "Secret kube-system/p is in a namespace kbind does not read provider credentials from (allowed: kbind, team-creds); move the Secret there, or allow its namespace (--provider-secret-namespaces, chart value providerSecretNamespaces)"
        );
        assert!(check_secret_namespace(&reference(), &[]).is_err());
    }

    #[test]
    fn verified_only_when_the_digest_matches_a_pinned_identity() {
        let credential = ProviderCredential::from_secret(
            Some(&secret(&[("kubeconfig", KUBECONFIG.as_bytes())])),
            &reference(),
            Transport::Secure,
        )
        .unwrap();
        assert_eq!(credential.digest, digest(KUBECONFIG.as_bytes()));
        assert!(credential.digest.starts_with("sha256:") && credential.digest.len() == 71);
        let status = |uid: &str, verified: &str| ConnectionStatus {
            remote_cluster_uid: uid.into(),
            verified_credential: verified.into(),
            ..Default::default()
        };
        let cases = [
            (None, false),
            (Some(status("", "")), false),
            (Some(status("uid", "")), false),
            (Some(status("uid", "sha256:other")), false),
            (Some(status("", &credential.digest)), false),
            (Some(status("uid", &credential.digest)), true),
        ];
        for (status, want) in cases {
            assert_eq!(credential.is_verified(status.as_ref()), want, "{status:?}");
        }
    }
}
