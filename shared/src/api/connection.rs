//! `Connection`: the provider link (REFERENCE-BEHAVIOUR §3.1).
// Several `printcolumn(...)` entries repeat `type_ = ...`; clippy mistakes them for duplicates.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::binding::ConflictPolicy;
use super::schema;
use crate::keys;

/// A Connection links this (consumer) cluster to one provider cluster: it names the Secret that
/// holds the provider kubeconfig, pins both clusters' identities, lists the APIs the provider
/// exports and chooses how their schemas are installed here.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "core.kbind.io",
    version = "v1alpha1",
    kind = "Connection",
    doc = "A Connection links this consumer cluster to one provider cluster: credentials, pinned cluster identities, the APIs the provider exports, and the schema policy.",
    status = "ConnectionStatus",
    category = "kbind",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Secret",
        type_ = "string",
        json_path = ".spec.kubeconfigSecretRef.name"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = schema::boundary_immutable)]
pub struct ConnectionSpec {
    /// The Secret holding a kubeconfig for the provider cluster. Immutable; the Secret's data may
    /// change (credential rotation). The kubeconfig must be self-contained: inline certificates
    /// and tokens, no file references, no exec or auth-provider plugins.
    #[schemars(transform = schema::immutable_secret_ref)]
    pub kubeconfig_secret_ref: KubeconfigSecretRef,

    /// How the provider's API schemas are discovered and installed on this cluster.
    #[serde(default)]
    pub schema: SchemaPolicy,

    /// When true, kbind maintains a ClusterBinding named after this Connection that lists every
    /// exported API, so newly exported APIs start syncing without another step.
    #[serde(default)]
    pub auto_bind: bool,

    /// Who may use this Connection's credentials, and what may leave this cluster through them.
    #[serde(default, skip_serializing_if = "ConnectionAccess::is_default")]
    pub access: ConnectionAccess,

    /// The provider namespace prefix this Connection's credential is confined to — a Grant's
    /// boundary, set by the bundle `kubectl kbind grant` prints: consumer namespace `N` is
    /// provider namespace `<boundary>-N`, so consumers whose namespaces and objects share names
    /// never meet on the provider. Omitted: names are preserved. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = schema::boundary_name)]
    pub boundary: Option<String>,
}

impl ConnectionSpec {
    /// How this Connection names consumer namespaces on the provider.
    pub fn namespaces(&self) -> crate::boundary::NamespaceMap {
        crate::boundary::NamespaceMap::new(self.boundary.as_deref())
    }

    /// A spec reading the kubeconfig from the Secret `namespace/name` (key `kubeconfig`), with
    /// the default schema policy, no autoBind and the default access.
    pub fn for_secret(namespace: &str, name: &str) -> Self {
        Self {
            kubeconfig_secret_ref: KubeconfigSecretRef {
                namespace: namespace.into(),
                name: name.into(),
                key: default_kubeconfig_key(),
            },
            schema: SchemaPolicy::default(),
            auto_bind: false,
            access: ConnectionAccess::default(),
            boundary: None,
        }
    }
}

/// Who may use a Connection, and what may leave the consumer through it. ClusterBindings (which,
/// like the Connection, only cluster administrators create) may always use it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionAccess {
    /// Namespaces whose Bindings may use this Connection. Omitted: every namespace; an empty
    /// list: none. A Binding elsewhere is reported (`Ready=False`, reason `NotAllowed`) and
    /// nothing of it syncs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = schema::namespace_set)]
    pub binding_namespaces: Option<Vec<String>>,
    /// Whether `relatedResources` entries may copy Secrets from this cluster to the provider
    /// (`FromConsumer`). Default false: no Secret leaves this cluster through the Connection
    /// unless its owner allows it.
    #[serde(default)]
    pub secrets_to_provider: bool,
    /// Whether namespaced Bindings may use `conflictPolicy: Adopt` through this Connection, taking
    /// over provider objects kbind did not create (and later deleting them with this Connection's
    /// credential). Default false: a Binding's `Adopt` acts as `Fail` and such an object is
    /// reported as a conflict. ClusterBindings, made by cluster administrators, may always adopt.
    #[serde(default)]
    pub bindings_may_adopt: bool,
}

impl ConnectionAccess {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Whether a Binding in `namespace` may use the Connection.
    pub fn allows_bindings_in(&self, namespace: &str) -> bool {
        self.binding_namespaces
            .as_ref()
            .is_none_or(|allowed| allowed.iter().any(|n| n == namespace))
    }

    /// The conflict policy a binding that asks for `asked` gets: a namespaced Binding adopts only
    /// where the Connection's owner allows it (`bindingsMayAdopt`), else it fails (a conflict).
    pub fn conflict_policy(&self, namespaced: bool, asked: ConflictPolicy) -> ConflictPolicy {
        match asked {
            ConflictPolicy::Adopt if namespaced && !self.bindings_may_adopt => ConflictPolicy::Fail,
            asked => asked,
        }
    }
}

/// Where the provider kubeconfig lives.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeconfigSecretRef {
    /// Namespace of the Secret. Any namespace kbind may read.
    #[schemars(transform = schema::namespace_name)]
    pub namespace: String,
    /// Name of the Secret.
    #[schemars(transform = schema::object_name)]
    pub name: String,
    /// Data key holding the kubeconfig. Empty means `kubeconfig`.
    #[serde(default = "default_kubeconfig_key")]
    #[schemars(transform = schema::secret_key)]
    pub key: String,
}

fn default_kubeconfig_key() -> String {
    keys::DEFAULT_KUBECONFIG_KEY.to_owned()
}

impl KubeconfigSecretRef {
    /// The data key to read, treating an empty key as the default (API-C3).
    pub fn effective_key(&self) -> &str {
        if self.key.is_empty() {
            keys::DEFAULT_KUBECONFIG_KEY
        } else {
            &self.key
        }
    }
}

/// Schema policy: which source describes the provider's APIs, which schemas are installed, and
/// whether installed schemas follow provider changes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchemaPolicy {
    /// Where exported APIs and their schemas come from.
    #[serde(default)]
    pub source: SchemaSource,
    /// Under the OpenAPI source (chosen, or `Auto` resolved to it): which of the provider's APIs
    /// are exported. `Boundary` (the default): every non-built-in API the credential's discovery
    /// shows (kbind's own `*.kbind.io` groups excepted) — what CRD-less providers depend on.
    /// `Marked`: only APIs the provider marked, a CRD or an APIService labelled
    /// `core.kbind.io/exported=true`.
    #[serde(default, rename = "openAPIExports")]
    pub openapi_exports: OpenApiExports,
    /// Which exported APIs get a CRD on this cluster.
    #[serde(default)]
    pub pull_policy: PullPolicy,
    /// Whether installed CRDs follow later provider schema changes.
    #[serde(default)]
    pub update_policy: UpdatePolicy,
    /// Breaking provider schema changes the user accepts. Under `updatePolicy: Always` a change
    /// that can invalidate existing objects or lose data (a new required field, a removed field, a
    /// type change, a narrowed enum, pattern or bound, a scope change, a version no longer served)
    /// is not applied: the binding reports `SchemaInSync=False` with reason `BreakingChange`,
    /// naming each change, the new schema hash and how many existing objects it would make
    /// invalid. Listing that API and hash here applies it. Compatible changes never wait.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), transform = schema::atomic_list)]
    pub accepted_changes: Vec<AcceptedChange>,
}

/// Consent to one breaking schema change: the API and the schema hash kbind reported for it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AcceptedChange {
    /// The API, `<plural>.<group>`.
    #[schemars(transform = schema::api_name)]
    pub api: String,
    /// The schema hash named in the binding's `SchemaInSync` message (`sha256:<64 hex>`).
    #[schemars(transform = schema::schema_hash)]
    pub schema_hash: String,
}

/// Where exported APIs and their schemas come from.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum SchemaSource {
    /// Try labelled provider CRDs first; a successful list with no exports falls through to
    /// OpenAPI. A failed list is an error, not a fall-through.
    #[default]
    Auto,
    /// Provider CRDs labelled `core.kbind.io/exported=true`.
    #[serde(rename = "CRD")]
    Crd,
    /// Non-built-in APIs found through the provider's `/openapi/v3`, synthesized into CRDs.
    #[serde(rename = "OpenAPI")]
    OpenApi,
}

/// Which APIs the OpenAPI source exports.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum OpenApiExports {
    /// Every non-built-in API the provider credential's discovery shows.
    #[default]
    Boundary,
    /// Only APIs the provider labelled `core.kbind.io/exported=true` (a CRD, or an APIService).
    Marked,
}

/// Which exported APIs get a CRD on this cluster.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum PullPolicy {
    /// Only APIs named by a Binding or ClusterBinding.
    #[default]
    Bound,
    /// Every exported API, bound or not.
    All,
    /// None: CRDs are supplied by someone else.
    None,
}

/// Whether installed CRDs follow later provider schema changes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum UpdatePolicy {
    /// Follow every provider schema change.
    #[default]
    Always,
    /// Install once, never update.
    Once,
}

/// What kbind observed about the Connection.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = schema::pinned_uids_immutable)]
pub struct ConnectionStatus {
    /// The provider cluster's identity, pinned on first successful connection.
    #[serde(
        default,
        skip_serializing_if = "String::is_empty",
        rename = "remoteClusterUID"
    )]
    pub remote_cluster_uid: String,
    /// This cluster's identity, pinned on first successful connection.
    #[serde(
        default,
        skip_serializing_if = "String::is_empty",
        rename = "localClusterUID"
    )]
    pub local_cluster_uid: String,
    /// `sha256:<hex>` of the kubeconfig bytes whose cluster identity kbind last checked against
    /// `remoteClusterUID`. kbind's programs write to the provider only with a credential whose
    /// digest matches: a Secret swapped to another cluster is never used, not even briefly.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub verified_credential: String,
    /// The schema source in use: `CRD` or `OpenAPI` (what `Auto` resolved to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_schema_source: Option<ActiveSchemaSource>,
    /// The APIs the provider exports.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        rename = "exportedAPIs"
    )]
    #[schemars(transform = schema::atomic_list)]
    pub exported_apis: Vec<ExportedApi>,
    /// APIs the autoBind ClusterBinding still lists although the provider stopped exporting
    /// them, with when that was first seen: each is dropped only after the schema manager's
    /// `--autobind-grace-period` (kept here so that a restart does not reset the clock).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::atomic_list)]
    pub missing_exports: Vec<MissingExport>,
    /// Which `spec.schema.acceptedChanges` entry is served, since when: an entry whose schema was
    /// served and no longer is (the provider moved on) is pruned from the spec, so that a provider
    /// returning to an old schema must be accepted again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::atomic_list)]
    pub applied_changes: Vec<AppliedChange>,
    /// Ready, SecretValid, Connected, PermissionDenied, SchemaInSync.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::list_map_by_type)]
    pub conditions: Vec<Condition>,
}

impl ConnectionStatus {
    /// The names (`<plural>.<group>`) of the exported APIs, in status order.
    pub fn exported_names(&self) -> Vec<&str> {
        self.exported_apis.iter().map(|a| a.name.as_str()).collect()
    }
}

/// An accepted breaking change that is served.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppliedChange {
    /// `<plural>.<group>`.
    pub api: String,
    /// The accepted schema hash the consumer CRD serves.
    pub schema_hash: String,
    /// When kbind first saw it served.
    pub since: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
}

/// An API autoBind still binds although the provider no longer exports it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MissingExport {
    /// `<plural>.<group>`.
    pub name: String,
    /// When its absence was first seen.
    pub since: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
}

/// The schema source in use.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum ActiveSchemaSource {
    /// Labelled provider CRDs.
    #[serde(rename = "CRD")]
    Crd,
    /// The provider's OpenAPI v3 document.
    #[serde(rename = "OpenAPI")]
    OpenApi,
}

/// One API the provider exports.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExportedApi {
    /// `<plural>.<group>`, the name bindings use.
    pub name: String,
    /// API group.
    pub group: String,
    /// Plural resource name.
    pub resource: String,
    /// Whether instances live in namespaces.
    pub scope: ApiScope,
    /// Served versions.
    #[schemars(transform = schema::set_list)]
    pub versions: Vec<String>,
    /// Served versions the consumer does not serve, and why: kbind converts between versions with
    /// conversion `None` only, so it serves the versions whose schema is identical to the storage
    /// version's (lossless) and leaves out the others.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), transform = schema::atomic_list)]
    pub omitted_versions: Vec<OmittedVersion>,
}

/// A provider version the consumer does not serve.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OmittedVersion {
    /// The version, e.g. `v1beta1`.
    pub name: String,
    /// Why it is not served.
    pub reason: String,
}

/// Whether instances of an API live in namespaces.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum ApiScope {
    /// Instances live in namespaces.
    Namespaced,
    /// Instances are cluster-scoped.
    Cluster,
}
