//! `Grant` (`iam.kbind.io/v1alpha1`), on the **provider**: "consumer X was issued credentials
//! for Export Z" — the anchor the issuer provisions from, revocation acts on and the reaper reads.
//! Cluster-scoped; readable and writable by the provider's admins only.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::schema;

/// The API group of Grants.
pub const IAM_GROUP: &str = "iam.kbind.io";

/// One consumer's credentials for one offering.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "iam.kbind.io",
    version = "v1alpha1",
    kind = "Grant",
    doc = "A consumer's credentials for one Export of this provider: what the issuer provisions, revocation acts on and the reaper reads.",
    status = "GrantStatus",
    category = "kbind",
    printcolumn(name = "Export", type_ = "string", json_path = ".spec.export"),
    printcolumn(
        name = "Consumer",
        type_ = "string",
        json_path = ".spec.consumer.identity"
    ),
    printcolumn(name = "Boundary", type_ = "string", json_path = ".status.boundary"),
    printcolumn(
        name = "Issued",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Issued\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = schema::grant_target_immutable)]
pub struct GrantSpec {
    /// The Export the credentials are for.
    #[schemars(transform = schema::object_name)]
    pub export: String,

    /// Who receives them.
    pub consumer: GrantConsumer,

    /// How the credential is issued.
    #[serde(default)]
    pub credential: CredentialPolicy,

    /// Revoked: every credential of this Grant stops working; nothing is deleted on either side.
    #[serde(default)]
    pub revoked: bool,
}

/// The consumer a Grant is for.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrantConsumer {
    /// A stable identity (e.g. `<oidc issuer>#<subject>`, or a name the admin chooses): the same
    /// identity, cluster name and Export get the same boundary on every re-grant.
    #[schemars(length(min = 1, max = 1024))]
    pub identity: String,
    /// Which of the identity's consumer clusters, when it has several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub cluster_name: Option<String>,
}

/// How a Grant's credential is issued.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialPolicy {
    /// `Bound`: a ServiceAccount token from the TokenRequest API, renewed by kbind on the consumer
    /// before it expires; `LongLived`: a Secret-based token that never expires (air-gapped
    /// GitOps; revocation is its only end).
    #[serde(default)]
    pub mode: CredentialMode,
    /// A `Bound` token's lifetime in seconds (at least 600, the API server's minimum; at most a
    /// day).
    #[serde(default = "default_expiration")]
    #[schemars(range(min = 600, max = 86400))]
    pub expiration_seconds: i64,
}

impl Default for CredentialPolicy {
    fn default() -> Self {
        Self {
            mode: CredentialMode::default(),
            expiration_seconds: default_expiration(),
        }
    }
}

fn default_expiration() -> i64 {
    3600
}

/// A credential's kind.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum CredentialMode {
    /// Short-lived, renewed in process by kbind on the consumer.
    #[default]
    Bound,
    /// Never expires.
    LongLived,
}

/// What the issuer provisioned for a Grant.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrantStatus {
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The provider namespace the consumer's credentials are scoped to (its heartbeat Lease lives
    /// there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boundary: Option<String>,
    /// The ServiceAccount in the boundary whose tokens are the consumer's credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
    /// `Issued`: whether the credential is provisioned and may act (and why not).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::list_map_by_type)]
    pub conditions: Vec<Condition>,
}
