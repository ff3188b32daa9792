//! `ReaperPolicy` (`reaper.kbind.io/v1alpha1`), read on the **provider** by `kbind-reaper` (#38):
//! which consumers' heartbeat Leases to read, when a silent consumer is Stale, and what may be
//! done with a dead consumer's copies. Its own group: nothing of `core.kbind.io` is needed on a
//! provider.
// Several `printcolumn(...)` entries repeat `type_ = ...`; clippy mistakes them for duplicates.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of the reaper's policy.
pub const REAPER_GROUP: &str = "reaper.kbind.io";

/// The label that keeps an object (a copy, a related copy, a namespace) from ever being reaped,
/// whatever its value, unless a policy names another.
pub const DEFAULT_PROTECT_LABEL: &str = "reaper.kbind.io/protect";

/// At most this many consumers are listed in a policy's status (the most urgent first); the
/// counts by state cover them all.
pub const MAX_LISTED_CONSUMERS: usize = 100;

/// How the reaper treats the consumers of a provider: a cluster-scoped object on the provider.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "reaper.kbind.io",
    version = "v1alpha1",
    kind = "ReaperPolicy",
    doc = "How kbind-reaper treats the consumers of this provider: where their heartbeat Leases are, when a silent consumer is Stale, and what may be done with a dead consumer's copies.",
    status = "ReaperPolicyStatus",
    category = "kbind",
    printcolumn(name = "Action", type_ = "string", json_path = ".spec.action"),
    printcolumn(name = "Live", type_ = "integer", json_path = ".status.counts.live"),
    printcolumn(name = "Stale", type_ = "integer", json_path = ".status.counts.stale"),
    printcolumn(
        name = "Reaping",
        type_ = "integer",
        json_path = ".status.counts.reaping"
    ),
    printcolumn(
        name = "NoLease",
        type_ = "integer",
        json_path = ".status.counts.noLease"
    ),
    printcolumn(
        name = "Unaccounted",
        type_ = "integer",
        json_path = ".status.counts.unaccounted"
    ),
    printcolumn(name = "Last sweep", type_ = "date", json_path = ".status.lastSweep")
)]
#[serde(rename_all = "camelCase")]
pub struct ReaperPolicySpec {
    /// Namespaces whose heartbeat Leases (labelled `core.kbind.io/managed=true`) are read: where
    /// consumers' provider kubeconfigs point (their context's namespace, else `kbind`).
    #[serde(default = "default_lease_namespaces")]
    pub lease_namespaces: Vec<String>,

    /// A consumer whose heartbeat the provider's API server has not seen renewed for this long
    /// is Stale (a Go-style duration such as `30m`); at least ten Lease durations.
    #[serde(default = "default_stale_after")]
    pub stale_after: String,

    /// What is done with a Stale consumer's objects once `deleteAfter` has passed too.
    #[serde(default)]
    pub action: ReapAction,

    /// A second grace, counted from when the consumer became Stale, before `action` starts.
    #[serde(default = "default_delete_after")]
    pub delete_after: String,

    /// The APIs whose copies are looked at, as `<plural>.<group>`; empty: every CRD labelled
    /// `core.kbind.io/exported=true`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub apis: Vec<String>,

    /// Include the consumer's related copies (Secrets and ConfigMaps kbind wrote).
    #[serde(default)]
    pub include_related: bool,

    /// Where related copies are looked for (their metadata only); empty: every namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub related_namespaces: Vec<String>,

    /// Include the namespaces kbind created for the consumer: deleted only once nothing is left
    /// in them — by a metadata list of every kind the provider serves — but what Kubernetes puts
    /// in every namespace and the dead heartbeat's own unprotected objects (with `Orphan`: their
    /// markers stripped instead).
    #[serde(default)]
    pub include_namespaces: bool,

    /// At most this many deletes (or orphanings) per minute, over all consumers.
    #[serde(default = "default_deletes_per_minute")]
    pub deletes_per_minute: u32,

    /// Objects (and namespaces) with this label, whatever its value, are never touched.
    #[serde(default = "default_protect_label")]
    pub protect_label: String,

    /// Also read the heartbeats in every Grant's boundary (`iam.kbind.io`, #51): a boundary is
    /// the one place its consumer's Lease can be and only that consumer's credential may write
    /// there, so its liveness cannot be forged by anyone else. A Stale Grant is revoked before
    /// anything of it is orphaned or deleted (action `Revoke`, or first step of `Orphan` and
    /// `Delete`).
    #[serde(default)]
    pub grants: bool,
}

/// What the reaper does with a dead consumer's objects.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum ReapAction {
    /// Only report (the default).
    #[default]
    Report,
    /// Revoke a Stale consumer's Grant (its credential stops working); nothing is orphaned or
    /// deleted. Only consumers with a Grant (`grants: true`).
    Revoke,
    /// Remove kbind's markers from the objects and leave them.
    Orphan,
    /// Delete the objects: normal deletes with UID preconditions; a provider finalizer is waited
    /// for, never removed.
    Delete,
}

fn default_lease_namespaces() -> Vec<String> {
    vec![crate::keys::DEFAULT_NAMESPACE.to_owned()]
}

fn default_stale_after() -> String {
    "30m".into()
}

fn default_delete_after() -> String {
    "24h".into()
}

fn default_deletes_per_minute() -> u32 {
    60
}

fn default_protect_label() -> String {
    DEFAULT_PROTECT_LABEL.into()
}

/// What the reaper saw at its last sweep.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReaperPolicyStatus {
    /// The policy generation the last sweep used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`: the policy is valid and the last sweep read everything it needed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The provider API server's time of the last sweep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sweep: Option<Time>,
    /// Heartbeats (and consumers' objects no heartbeat accounts for) by state, all of them.
    #[serde(default)]
    pub counts: ConsumerCounts,
    /// The heartbeats, the most urgent first (Reaping, Stale, Unaccounted, NoLease, Left, Live,
    /// Reaped), at most 100.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consumers: Vec<ConsumerStatus>,
}

/// How many consumers are in each state.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerCounts {
    /// Renewed within `staleAfter`.
    pub live: u32,
    /// Not renewed for `staleAfter`.
    pub stale: u32,
    /// Their objects are being orphaned or deleted.
    pub reaping: u32,
    /// Nothing of them is left.
    pub reaped: u32,
    /// Objects of a consumer that never had a Lease here: never touched.
    pub no_lease: u32,
    /// Deleted their Connection in an orderly way: never touched.
    pub left: u32,
    /// Their Grant is revoked (by the reaper's `Revoke`, or by anyone): their copies untouched.
    #[serde(default)]
    pub revoked: u32,
    /// Objects no heartbeat the reaper can judge accounts for (written through a Connection
    /// whose Lease is outside `leaseNamespaces`, or by one of several it cannot tell apart):
    /// never touched.
    #[serde(default)]
    pub unaccounted: u32,
}

/// One heartbeat (one Connection of a consumer) as the reaper sees it, or a consumer's objects
/// no heartbeat accounts for (`NoLease`, `Unaccounted`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerStatus {
    /// The consumer cluster's UID (its objects' `core.kbind.io/consumer-cluster-uid`).
    pub uid: String,
    /// `Live`, `Stale`, `Reaping`, `Reaped`, `NoLease`, `Left` or `Unaccounted`.
    pub state: String,
    /// Its Connection's name, from its Lease.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connections: Vec<String>,
    /// Its heartbeat Lease, `<namespace>/<name>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leases: Vec<String>,
    /// The provider API server's time of the sweep at which the reaper last saw its Lease
    /// renewed (changed), or first saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_renewal: Option<Time>,
    /// When its state changes by itself next (Live → Stale, Stale → Reaping), server time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_change: Option<Time>,
    /// Its objects still on the provider, per API (`<plural>.<group>`, `secrets`, `configmaps`,
    /// `namespaces`), and `protected`: those carrying the protect label, never acted on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub objects: Vec<ApiCount>,
}

/// How many objects of one API.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct ApiCount {
    /// The API.
    pub api: String,
    /// How many.
    pub count: u64,
}
