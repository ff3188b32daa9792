//! kbind's API, `core.kbind.io/v1alpha1`: Connection, ClusterBinding and Binding
//! (REFERENCE-BEHAVIOUR §3). The CRD manifests under `deploy/crds/` are generated from these
//! types by `cargo run -p kbind-shared --bin kbind-crdgen`.

mod binding;
pub mod catalog;
mod connection;
pub mod iam;
pub mod installed;
pub mod reaper;
pub mod schema;

pub use binding::*;
pub use connection::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// Where the generated CRDs are checked in, relative to the repository root: the plain manifests
/// and the Helm chart's copy.
pub const CRD_DIRS: [&str; 2] = ["deploy/crds", "deploy/charts/kbind/files/crds"];

/// The three CRDs of kbind's API, with the file name each is written to under `deploy/crds/`.
pub fn crds() -> Vec<(&'static str, CustomResourceDefinition)> {
    vec![
        ("core.kbind.io_connections.yaml", Connection::crd()),
        ("core.kbind.io_clusterbindings.yaml", ClusterBinding::crd()),
        ("core.kbind.io_bindings.yaml", Binding::crd()),
    ]
}

/// Where the reaper's CRD is checked in: its own chart, installed on a provider (#38).
pub const REAPER_CRD_DIR: &str = "deploy/charts/kbind-reaper/crds";

/// The reaper's CRD (`reaper.kbind.io`), with its file name under [`REAPER_CRD_DIR`].
pub fn reaper_crds() -> Vec<(&'static str, CustomResourceDefinition)> {
    vec![(
        "reaper.kbind.io_reaperpolicies.yaml",
        reaper::ReaperPolicy::crd(),
    )]
}

/// Where the provider side's own CRDs (the catalog, `catalog.kbind.io`, and Grants,
/// `iam.kbind.io`) are checked in: the issuer's chart, installed on a provider (#51).
pub const ISSUER_CRD_DIR: &str = "deploy/charts/kbind-issuer/crds";

/// The catalog's and the Grants' CRDs, with their file names under [`ISSUER_CRD_DIR`].
pub fn issuer_crds() -> Vec<(&'static str, CustomResourceDefinition)> {
    vec![
        ("catalog.kbind.io_exports.yaml", catalog::Export::crd()),
        (
            "catalog.kbind.io_collections.yaml",
            catalog::Collection::crd(),
        ),
        ("iam.kbind.io_grants.yaml", iam::Grant::crd()),
    ]
}

/// Every checked-in CRD: (directory, file, CRD).
pub fn checked_in_crds() -> Vec<(&'static str, &'static str, CustomResourceDefinition)> {
    let mut all = Vec::new();
    for dir in CRD_DIRS {
        all.extend(crds().into_iter().map(|(file, crd)| (dir, file, crd)));
    }
    all.extend(
        reaper_crds()
            .into_iter()
            .map(|(file, crd)| (REAPER_CRD_DIR, file, crd)),
    );
    all.extend(
        issuer_crds()
            .into_iter()
            .map(|(file, crd)| (ISSUER_CRD_DIR, file, crd)),
    );
    all
}

/// A CRD as the YAML document checked in under `deploy/crds/`.
#[allow(
    clippy::expect_used,
    reason = "build-time generator over our own types; a failure must stop it"
)]
pub fn crd_yaml(crd: &CustomResourceDefinition) -> String {
    let body = serde_yaml::to_string(crd).expect("a CRD always serializes");
    format!(
        "# Generated from shared/src/api by `cargo run -p kbind-shared --bin kbind-crdgen`. Do not edit.\n{body}"
    )
}
