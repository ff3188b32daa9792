//! `ClusterBinding` and `Binding`: which exported APIs to sync (REFERENCE-BEHAVIOUR §3.2).
//! Both kinds share [`BindingSpec`] and [`BindingStatus`]; only their scope differs.
// Several `printcolumn(...)` entries repeat `type_ = ...`; clippy mistakes them for duplicates.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::schema;

/// Activates synchronization of the listed APIs in this Binding's namespace only. Cluster-scoped
/// APIs cannot be bound by a Binding; use a ClusterBinding.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "core.kbind.io",
    version = "v1alpha1",
    kind = "Binding",
    doc = "A Binding activates synchronization of the listed exported APIs in its own namespace.",
    namespaced,
    status = "BindingStatus",
    category = "kbind",
    printcolumn(
        name = "Connection",
        type_ = "string",
        json_path = ".spec.connectionRef.name"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct BindingSpec {
    /// The Connection (cluster-scoped) whose provider serves the APIs.
    pub connection_ref: ConnectionRef,

    /// The APIs to sync, each named `<plural>.<group>` exactly as the provider exports it
    /// (for example `widgets.example.org`). Names are unique.
    #[schemars(length(min = 1, max = 1024), transform = schema::list_map_by_name)]
    pub apis: Vec<ApiRef>,

    /// What to do when a provider object with the same namespace and name exists without kbind's
    /// ownership markers: `Fail` reports a conflict and leaves it alone, `Adopt` takes it over.
    /// An object owned by another consumer is never taken.
    #[serde(default)]
    pub conflict_policy: ConflictPolicy,

    /// Secrets and ConfigMaps copied alongside the bound APIs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), transform = schema::atomic_list)]
    pub related_resources: Vec<RelatedResource>,

    /// `true` pauses everything the binding covers — its objects and their related Secrets and
    /// ConfigMaps: kbind writes nothing for them on either cluster until it is `false` again
    /// (deleting an object still runs its deletion). Each object's delivery record says
    /// `Paused`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,

    /// Which Events the provider records about an object's provider copy kbind copies onto the
    /// consumer object (`kubectl describe` shows them). Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_events: Option<ProviderEvents>,

    /// Which instances this binding routes (a label selector over consumer objects; absent: every
    /// instance in its scope — the default route). When several Connections serve one API, each
    /// instance goes to the one route its labels choose: a binding with a selector beats one
    /// without, and exactly one must win. A binding of a Connection other than the one serving
    /// the consumer CRD is admitted only with a selector. An instance stays on the route it was
    /// first synced to (its `core.kbind.io/route` annotation) until the user changes that.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_selector: Option<LabelSelector>,

    /// Observe-first import: provider objects of the listed APIs in this binding's scope that
    /// carry no consumer's markers get a consumer copy, labelled `core.kbind.io/imported`, whose
    /// delivery state is `Observed` — spec and status mirrored from the provider, nothing written
    /// to the provider. Annotating a copy `core.kbind.io/claim: "true"` takes it over: one
    /// provider write adds kbind's markers, and from then on it syncs as any object. Absent: no
    /// import.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub import: Option<Import>,
}

/// Observe-first import's settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Import {
    /// At most this many objects of each listed API are imported (the first by namespace and
    /// name); a Warning Event on the binding says how many more there are.
    #[serde(default = "Import::default_limit")]
    #[schemars(range(min = 1, max = 10000))]
    pub limit: u32,
}

impl Import {
    /// The limit when none is given.
    pub const DEFAULT_LIMIT: u32 = 1000;

    fn default_limit() -> u32 {
        Self::DEFAULT_LIMIT
    }
}

impl Default for Import {
    fn default() -> Self {
        Self {
            limit: Self::DEFAULT_LIMIT,
        }
    }
}

/// Provider Events copied onto consumer objects: the types and reasons wanted. Each is copied
/// once with its reason, its message capped, its source naming the Connection; a chatty
/// provider is rate-limited per object.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderEvents {
    /// The Event types to copy (default: `Warning` only).
    #[serde(default = "ProviderEvents::warnings")]
    #[schemars(length(min = 1, max = 2), transform = schema::atomic_list)]
    pub types: Vec<ProviderEventType>,
    /// Copy only Events with one of these reasons (exact, case-sensitive); empty: any reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 128)), transform = schema::atomic_list)]
    pub reasons: Vec<String>,
}

impl ProviderEvents {
    fn warnings() -> Vec<ProviderEventType> {
        vec![ProviderEventType::Warning]
    }

    /// Whether an Event of `type_` with `reason` is wanted.
    pub fn wants(&self, type_: &str, reason: &str) -> bool {
        self.types.iter().any(|t| t.as_str() == type_)
            && (self.reasons.is_empty() || self.reasons.iter().any(|r| r == reason))
    }
}

/// An Event type.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum ProviderEventType {
    /// Something went wrong.
    Warning,
    /// Informational.
    Normal,
}

impl ProviderEventType {
    /// As an Event's `type` says it.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderEventType::Warning => "Warning",
            ProviderEventType::Normal => "Normal",
        }
    }
}

impl BindingSpec {
    /// A spec binding `apis` through `connection`, with the default conflict policy and no related
    /// resources.
    pub fn new(connection: &str, apis: &[&str]) -> Self {
        Self {
            connection_ref: ConnectionRef {
                name: connection.to_owned(),
            },
            apis: apis
                .iter()
                .map(|a| ApiRef {
                    name: (*a).to_owned(),
                })
                .collect(),
            conflict_policy: ConflictPolicy::default(),
            related_resources: Vec::new(),
            suspend: false,
            provider_events: None,
            object_selector: None,
            import: None,
        }
    }
}

/// Activates synchronization of the listed APIs in every namespace (or cluster-wide for
/// cluster-scoped APIs).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "core.kbind.io",
    version = "v1alpha1",
    kind = "ClusterBinding",
    doc = "A ClusterBinding activates synchronization of the listed exported APIs in every namespace, or cluster-wide for cluster-scoped APIs.",
    status = "BindingStatus",
    category = "kbind",
    printcolumn(
        name = "Connection",
        type_ = "string",
        json_path = ".spec.connectionRef.name"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct ClusterBindingSpec {
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub binding: BindingSpec,
}

impl std::ops::Deref for ClusterBindingSpec {
    type Target = BindingSpec;
    fn deref(&self) -> &BindingSpec {
        &self.binding
    }
}

impl From<BindingSpec> for ClusterBindingSpec {
    fn from(binding: BindingSpec) -> Self {
        Self { binding }
    }
}

/// Names a Connection.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct ConnectionRef {
    /// Name of the Connection.
    #[schemars(transform = schema::object_name)]
    pub name: String,
}

/// One API to sync.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct ApiRef {
    /// `<plural>.<group>`, for example `widgets.example.org`.
    #[schemars(transform = schema::api_name)]
    pub name: String,
}

/// What to do with a provider object that exists without kbind's ownership markers.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum ConflictPolicy {
    /// Report the conflict and leave the provider object alone.
    #[default]
    Fail,
    /// Take over the unmarked provider object.
    Adopt,
}

/// Secrets or ConfigMaps to copy between the clusters.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RelatedResource {
    /// API group; only the core group (`""`) is supported.
    #[serde(default)]
    pub group: String,
    /// `secrets` or `configmaps`.
    pub resource: RelatedResourceKind,
    /// Which side is the source.
    pub direction: RelatedDirection,
    /// Which objects to copy. Label selector and names must both match when both are given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<RelatedSelector>,
    /// ClusterBinding only: copy only objects in these namespaces. A `FromProvider` entry of a
    /// ClusterBinding writes into a consumer namespace only when it is listed here or holds at
    /// least one object of the binding's bound APIs (the provider does not choose where its
    /// objects land). Ignored in a Binding, whose scope is its own namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::object_name_set)]
    pub namespaces: Vec<String>,
}

/// A kind of related object.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RelatedResourceKind {
    /// Secrets.
    Secrets,
    /// ConfigMaps.
    Configmaps,
}

/// Which side is the source of related objects.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum RelatedDirection {
    /// Copy from the provider to the consumer.
    FromProvider,
    /// Copy from the consumer to the provider.
    FromConsumer,
}

/// Selects related objects by labels and/or exact names.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RelatedSelector {
    /// Standard label selector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = schema::atomic_map)]
    pub label_selector: Option<LabelSelector>,
    /// Exact object names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::object_name_set)]
    pub names: Vec<String>,
}

/// What kbind observed about a binding.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BindingStatus {
    /// The bound APIs, sorted by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty", rename = "boundAPIs")]
    #[schemars(transform = schema::atomic_list)]
    pub bound_apis: Vec<BoundApi>,
    /// One entry per API this binding lists or still releases, sorted by name: whether it is
    /// bound (its instances sync), why not, and the Connection whose provider holds its copies.
    /// An API removed from `spec.apis` or moved to another Connection keeps its entry until its
    /// provider copies are drained. Each API is judged on its own: one bad API never stops the
    /// others (the `Ready` condition summarizes).
    #[serde(default, skip_serializing_if = "Vec::is_empty", rename = "apis")]
    #[schemars(transform = schema::atomic_list)]
    pub apis: Vec<ApiStatus>,
    /// Related Secrets/ConfigMaps whose target exists and is not kbind's copy (left alone
    /// under conflictPolicy Fail; see the RelatedResourcesSynced condition).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub related_conflict_count: i32,
    /// Ready, Synced, Conflicts, PermissionDenied, SchemaInSync, RelatedResourcesSynced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::list_map_by_type)]
    pub conditions: Vec<Condition>,
}

/// One bound API.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BoundApi {
    /// `<plural>.<group>`.
    pub name: String,
    /// The consumer CRD's schema hash.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub crd_hash: String,
    /// Instances with a recorded conflict.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub conflict_count: i32,
    /// Instances kbind leaves alone: those with the `core.kbind.io/paused` annotation, or every
    /// one the binding covers while it is suspended.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub paused_count: i32,
}

/// The state of one API of a binding.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiStatus {
    /// `<plural>.<group>`.
    pub name: String,
    /// The Connection through which this binding bound the API: its provider holds the copies.
    pub connection: String,
    /// Whether the API is bound here: installed, established, and its instances in this binding's
    /// scope sync.
    pub bound: bool,
    /// A CamelCase reason (`AsExpected` when bound).
    pub reason: String,
    /// What is wrong or under way, for a person.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Set when this binding's Connection is an extra route for an API whose consumer CRD
    /// another Connection serves (the binding selects objects): that Connection, and whether
    /// this route's schema agrees with the served one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<RouteStatus>,
}

/// One binding's route for an API served by another Connection.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteStatus {
    /// The Connection whose schema the consumer CRD serves.
    pub served_by: String,
    /// Whether this route's provider schema agrees with the served one: objects routed here
    /// are held (`SchemaMismatch`) while it does not.
    pub schema_agrees: bool,
    /// The breaking differences, when it does not agree.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub schema_message: String,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}
