//! Reaching the instances of a CRD: which version they are served at and the `Api` for one
//! namespace or all of them. Both programs use these for bound APIs and related resources.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionVersion,
};
use kube::api::{ApiResource, DynamicObject};
use kube::{Api, Client};

/// SCH-2 version selection: the first storage version, else the first served one.
pub fn storage_version(
    versions: &[CustomResourceDefinitionVersion],
) -> Option<&CustomResourceDefinitionVersion> {
    versions
        .iter()
        .find(|v| v.storage)
        .or_else(|| versions.iter().find(|v| v.served))
}

/// The API of a CRD's instances, at [`storage_version`]; `None` for a CRD without one.
pub fn instance_resource(crd: &CustomResourceDefinition) -> Option<ApiResource> {
    let version = storage_version(&crd.spec.versions)?;
    Some(ApiResource {
        group: crd.spec.group.clone(),
        version: version.name.clone(),
        api_version: format!("{}/{}", crd.spec.group, version.name),
        kind: crd.spec.names.kind.clone(),
        plural: crd.spec.names.plural.clone(),
    })
}

/// Objects of `resource` in `namespace`, or in every namespace (and cluster-scoped) for `None`.
pub fn scoped(
    client: &Client,
    namespace: Option<&str>,
    resource: &ApiResource,
) -> Api<DynamicObject> {
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    }
}

/// A CRD version with only its name and flags set (no schema): how tests and hand-written CRDs
/// name versions.
pub fn bare_version(name: &str, served: bool, storage: bool) -> CustomResourceDefinitionVersion {
    CustomResourceDefinitionVersion {
        name: name.into(),
        served,
        storage,
        ..Default::default()
    }
}

/// Each version's name and whether it is served and stored, in order: how a CRD's versions are
/// compared and reported.
pub fn version_flags(versions: &[CustomResourceDefinitionVersion]) -> Vec<(&str, bool, bool)> {
    versions
        .iter()
        .map(|v| (v.name.as_str(), v.served, v.storage))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use bare_version as version;

    #[test]
    fn the_storage_version_else_the_first_served_one() {
        let v =
            |vs: &[CustomResourceDefinitionVersion]| storage_version(vs).map(|v| v.name.clone());
        assert_eq!(
            v(&[version("v1", true, false), version("v2", true, true)]).as_deref(),
            Some("v2")
        );
        assert_eq!(
            v(&[version("v1", false, false), version("v2", true, false)]).as_deref(),
            Some("v2")
        );
        assert_eq!(v(&[version("v1", false, false)]), None);
        assert_eq!(v(&[]), None);
    }
}
