//! Namespaces the syncer creates on a target cluster before writing into them.

use k8s_openapi::api::core::v1::Namespace;
use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};

/// Creates `namespace` unless a GET finds it already there (LIM-26: no create call for a
/// namespace that exists). Credentials that may not read namespaces may still create them, so a
/// Forbidden GET means "try to create"; a concurrent create (AlreadyExists) is success. Whether
/// this call created it.
pub async fn create_if_missing(
    client: &Client,
    namespace: &Namespace,
) -> Result<bool, kube::Error> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let exists = match namespaces.get_opt(&namespace.name_any()).await {
        Ok(found) => found.is_some(),
        Err(kube::Error::Api(s)) if s.is_forbidden() => false,
        Err(e) => return Err(e),
    };
    if exists {
        return Ok(false);
    }
    match namespaces.create(&PostParams::default(), namespace).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(false),
        Err(e) => Err(e),
    }
}
