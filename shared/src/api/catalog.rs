//! The catalog (`catalog.kbind.io/v1alpha1`), on the **provider**: `Export`, one offering a
//! consumer can bind, and `Collection`, a grouping of offerings for browsing. Presentation and
//! defaults on top of the truth: the exported label on a CRD stays what decides whether an API is
//! exported, and an `Export` naming an API that is not gets a condition and is not offered.
//! Nothing of `core.kbind.io` is needed on a provider; no consumer ever reads these.
// Several `printcolumn(...)` entries repeat `type_ = ...`; clippy mistakes them for duplicates.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ApiRef, ConflictPolicy, RelatedResource, schema};

/// The API group of the catalog.
pub const CATALOG_GROUP: &str = "catalog.kbind.io";

/// The condition saying whether an `Export` is offered (every API it names is exported) or a
/// `Collection` lists only offered Exports.
pub const OFFERED: &str = "Offered";

/// One offering: the APIs a binding to it syncs, what a person choosing it reads, and the
/// defaults its bundle's binding gets. Cluster-scoped.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "catalog.kbind.io",
    version = "v1alpha1",
    kind = "Export",
    doc = "One offering of this provider: the APIs a binding to it syncs, what a person choosing it reads, and the defaults its bundle's binding gets.",
    status = "ExportStatus",
    category = "kbind",
    printcolumn(name = "Title", type_ = "string", json_path = ".spec.title"),
    printcolumn(
        name = "Offered",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Offered\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Offered\")].reason"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ExportSpec {
    /// A short human name, for example `MangoDB`.
    pub title: String,

    /// What the offering is, in a sentence or two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,

    /// Where its documentation is (a URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub docs: Option<String>,

    /// The APIs a binding to this offering syncs, as `<plural>.<group>`; each must be exported
    /// (a CRD labelled `core.kbind.io/exported=true`).
    #[schemars(length(min = 1, max = 64), transform = schema::list_map_by_name)]
    pub apis: Vec<ApiRef>,

    /// Copied into the binding of every bundle issued for this offering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<ExportDefaults>,
}

/// The binding settings a bundle for an offering starts with.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExportDefaults {
    /// What to do with a provider object that exists without kbind's ownership markers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflict_policy: Option<ConflictPolicy>,

    /// Secrets or ConfigMaps copied between the clusters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub related_resources: Vec<RelatedResource>,
}

/// What the provider's catalog controller observed of an `Export`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExportStatus {
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Each named API as the provider serves it, in the order of `spec.apis`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub apis: Vec<ExportedApi>,

    /// `Offered`: True when every named API is exported; False names the first that is not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::list_map_by_type)]
    pub conditions: Vec<Condition>,
}

/// One API of an `Export`, as the provider serves it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExportedApi {
    /// `<plural>.<group>`.
    pub name: String,
    /// Whether the provider exports it (a CRD of that name labelled exported).
    pub exported: bool,
    /// `Namespaced` or `Cluster`, when the provider serves it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

/// A grouping of offerings for browsing. Cluster-scoped.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "catalog.kbind.io",
    version = "v1alpha1",
    kind = "Collection",
    doc = "A grouping of this provider's offerings (Exports) for browsing.",
    status = "CollectionStatus",
    category = "kbind",
    printcolumn(name = "Title", type_ = "string", json_path = ".spec.title"),
    printcolumn(name = "Offered", type_ = "integer", json_path = ".status.offered"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct CollectionSpec {
    /// A short human name, for example `Databases`.
    pub title: String,

    /// What the grouping holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,

    /// The Exports in it, by name.
    #[serde(default)]
    #[schemars(length(max = 1024), transform = schema::list_map_by_name)]
    pub exports: Vec<ExportRef>,
}

/// Names an `Export`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct ExportRef {
    /// Name of the Export.
    #[schemars(transform = schema::object_name)]
    pub name: String,
}

/// What the provider's catalog controller observed of a `Collection`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CollectionStatus {
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// How many of the listed Exports exist and are offered.
    #[serde(default)]
    pub offered: i64,

    /// `Offered`: True when every listed Export exists and is offered; False names the others.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::list_map_by_type)]
    pub conditions: Vec<Condition>,
}
