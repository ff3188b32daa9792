//! Cluster identity (REFERENCE-BEHAVIOUR §5, ID-1 … ID-3): the kcp `LogicalCluster` named
//! `cluster` if there is one, else the UID of the `kube-system` Namespace. A Forbidden read is
//! reported, never skipped.

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};

/// Why a cluster's identity could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// RBAC denied the read of an identity source.
    #[error("reading the cluster identity ({source_name}) was denied by RBAC: {message}")]
    Forbidden {
        /// Which source was denied.
        source_name: &'static str,
        /// The API server's message.
        message: String,
    },
    /// Neither source gave a UID.
    #[error(
        "cannot determine the cluster identity: {}",
        undetermined(logical_cluster, namespace)
    )]
    Undetermined {
        /// Why the LogicalCluster gave nothing.
        logical_cluster: String,
        /// Why the Namespace gave nothing.
        namespace: String,
    },
}

/// The outcome of reading one identity source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The object exists; its UID (possibly empty).
    Found(String),
    /// RBAC denied the read.
    Forbidden(String),
    /// Not found, no such kind, or any other failure.
    Unavailable(String),
}

impl Lookup {
    fn from_result<K: kube::Resource>(result: kube::Result<K>) -> Self {
        match result {
            Ok(obj) => Lookup::Found(obj.meta().uid.clone().unwrap_or_default()),
            Err(kube::Error::Api(status)) if status.is_forbidden() => {
                Lookup::Forbidden(status.message.clone())
            }
            Err(e) => Lookup::Unavailable(describe_error(&e)),
        }
    }
}

/// A short, actionable description of a request failure: the API server's message and code, or
/// the root cause of a transport failure (refused connection, untrusted certificate, …). Remote
/// text is capped and never carries URL userinfo ([`crate::redact::remote`]).
pub fn describe_error(error: &kube::Error) -> String {
    if let kube::Error::Api(status) = error {
        return format!(
            "{} (HTTP {})",
            crate::redact::remote(&status.message),
            status.code
        );
    }
    let mut messages: Vec<String> = Vec::new();
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = current {
        let text = e.to_string();
        if !messages.iter().any(|m| m.contains(&text)) {
            messages.push(text);
        }
        current = e.source();
    }
    // The outermost wrapper and the root cause say the most.
    let text = match messages.as_slice() {
        [] => String::from("unknown error"),
        [only] => only.clone(),
        [first, .., last] => format!("{first}: {last}"),
    };
    crate::redact::remote(&text)
}

/// What ID-1 decides after the LogicalCluster read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirstStep {
    /// The identity is settled (found or Forbidden).
    Done(Result<String, IdentityError>),
    /// Fall through to the `kube-system` Namespace.
    ReadNamespace,
}

/// ID-1 steps 1–2: a LogicalCluster with a UID wins; Forbidden stops; anything else falls through.
pub fn after_logical_cluster(logical: &Lookup) -> FirstStep {
    match logical {
        Lookup::Found(uid) if !uid.is_empty() => FirstStep::Done(Ok(uid.clone())),
        Lookup::Forbidden(message) => FirstStep::Done(Err(IdentityError::Forbidden {
            source_name: "LogicalCluster cluster",
            message: message.clone(),
        })),
        _ => FirstStep::ReadNamespace,
    }
}

/// ID-1 steps 3–5: the Namespace's UID, Forbidden, or an error naming both failures.
pub fn after_namespace(logical: &Lookup, namespace: Lookup) -> Result<String, IdentityError> {
    match namespace {
        Lookup::Found(uid) if !uid.is_empty() => Ok(uid),
        Lookup::Forbidden(message) => Err(IdentityError::Forbidden {
            source_name: "Namespace kube-system",
            message,
        }),
        other => Err(IdentityError::Undetermined {
            logical_cluster: describe(logical),
            namespace: describe(&other),
        }),
    }
}

fn undetermined(logical_cluster: &str, namespace: &str) -> String {
    if logical_cluster == namespace {
        namespace.to_owned()
    } else {
        format!("LogicalCluster: {logical_cluster}; Namespace kube-system: {namespace}")
    }
}

fn describe(lookup: &Lookup) -> String {
    match lookup {
        Lookup::Found(_) => "has no UID".to_owned(),
        Lookup::Forbidden(m) | Lookup::Unavailable(m) => m.clone(),
    }
}

/// Which object gave a cluster's identity (ID-1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// kcp's `LogicalCluster` named `cluster`.
    LogicalCluster,
    /// The `kube-system` Namespace.
    Namespace,
}

impl Source {
    /// The source's resource, and the name of the object in it.
    pub fn object(self) -> (ApiResource, &'static str) {
        match self {
            Source::LogicalCluster => (logical_clusters(), "cluster"),
            Source::Namespace => (ApiResource::erase::<Namespace>(&()), "kube-system"),
        }
    }
}

fn logical_clusters() -> ApiResource {
    let gvk = GroupVersionKind::gvk("core.kcp.io", "v1alpha1", "LogicalCluster");
    ApiResource::from_gvk_with_plural(&gvk, "logicalclusters")
}

/// Reads the identity of the cluster `client` talks to (ID-1).
pub async fn cluster_identity(client: &Client) -> Result<String, IdentityError> {
    cluster_identity_and_source(client)
        .await
        .map(|(uid, _)| uid)
}

/// [`cluster_identity`], and which object gave it.
pub async fn cluster_identity_and_source(
    client: &Client,
) -> Result<(String, Source), IdentityError> {
    let logical_clusters: Api<DynamicObject> = Api::all_with(client.clone(), &logical_clusters());
    let logical = Lookup::from_result(logical_clusters.get("cluster").await);
    match after_logical_cluster(&logical) {
        FirstStep::Done(result) => result.map(|uid| (uid, Source::LogicalCluster)),
        FirstStep::ReadNamespace => {
            let namespaces: Api<Namespace> = Api::all(client.clone());
            after_namespace(
                &logical,
                Lookup::from_result(namespaces.get("kube-system").await),
            )
            .map(|uid| (uid, Source::Namespace))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(logical: Lookup, namespace: Lookup) -> Result<String, IdentityError> {
        match after_logical_cluster(&logical) {
            FirstStep::Done(result) => result,
            FirstStep::ReadNamespace => after_namespace(&logical, namespace),
        }
    }

    #[test]
    fn logical_cluster_wins_over_namespace() {
        // ID-2
        let uid = identity(
            Lookup::Found("lc-uid".into()),
            Lookup::Found("ns-uid".into()),
        );
        assert_eq!(uid.unwrap(), "lc-uid");
    }

    #[test]
    fn namespace_is_used_when_there_is_no_logical_cluster() {
        let uid = identity(
            Lookup::Unavailable("the server could not find the requested resource".into()),
            Lookup::Found("ns-uid".into()),
        );
        assert_eq!(uid.unwrap(), "ns-uid");
        // A LogicalCluster without a UID falls through too.
        assert_eq!(
            identity(Lookup::Found(String::new()), Lookup::Found("ns-uid".into())).unwrap(),
            "ns-uid"
        );
    }

    #[test]
    fn forbidden_logical_cluster_does_not_fall_through() {
        // ID-1 step 2
        let err = identity(
            Lookup::Forbidden("no".into()),
            Lookup::Found("ns-uid".into()),
        )
        .unwrap_err();
        assert!(matches!(
            err,
            IdentityError::Forbidden {
                source_name: "LogicalCluster cluster",
                ..
            }
        ));
    }

    #[test]
    fn forbidden_namespace_is_reported() {
        let err = identity(
            Lookup::Unavailable("404".into()),
            Lookup::Forbidden("denied".into()),
        )
        .unwrap_err();
        assert!(matches!(
            err,
            IdentityError::Forbidden {
                source_name: "Namespace kube-system",
                ..
            }
        ));
        assert!(err.to_string().contains("denied by RBAC"));
    }

    #[test]
    fn no_source_names_both_failures() {
        let err = identity(
            Lookup::Unavailable("lc gone".into()),
            Lookup::Unavailable("ns gone".into()),
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("lc gone") && text.contains("ns gone"),
            "{text}"
        );
    }
}
