//! The CRDs checked in under `deploy/crds/` are exactly what the API types generate.

use std::path::PathBuf;

#[test]
fn checked_in_crds_match_the_api_types() {
    for (dir, file, crd) in kbind_shared::api::checked_in_crds() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(dir)
            .join(file);
        let checked_in =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            checked_in == kbind_shared::api::crd_yaml(&crd),
            "{} is stale: run `cargo run -p kbind-shared --bin kbind-crdgen` and commit the result",
            path.display()
        );
    }
}

#[test]
fn crds_have_status_subresource_category_and_no_short_names() {
    for (_, crd) in kbind_shared::api::crds() {
        assert_eq!(crd.spec.group, "core.kbind.io");
        assert_eq!(
            crd.spec.names.categories.as_deref(),
            Some(&["kbind".to_owned()][..])
        );
        assert!(crd.spec.names.short_names.is_none());
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        assert!(
            version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
    }
}

/// Each of `crds` is cluster-scoped in `group`, with a status subresource.
fn cluster_scoped_with_status(
    crds: Vec<(
        &str,
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    )>,
    group: &str,
) {
    for (_, crd) in crds {
        assert_eq!(crd.spec.group, group);
        assert_eq!(crd.spec.scope, "Cluster");
        let version = &crd.spec.versions[0];
        assert!(
            version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
    }
}

#[test]
fn the_reapers_crd_is_cluster_scoped_in_its_own_group() {
    cluster_scoped_with_status(
        kbind_shared::api::reaper_crds(),
        kbind_shared::api::reaper::REAPER_GROUP,
    );
}

#[test]
fn the_catalogs_and_the_grants_crds_are_cluster_scoped_in_their_own_groups() {
    let (catalog, grants): (Vec<_>, Vec<_>) = kbind_shared::api::issuer_crds()
        .into_iter()
        .partition(|(file, _)| file.starts_with("catalog."));
    assert_eq!((catalog.len(), grants.len()), (2, 1));
    cluster_scoped_with_status(catalog, kbind_shared::api::catalog::CATALOG_GROUP);
    cluster_scoped_with_status(grants, kbind_shared::api::iam::IAM_GROUP);
}
