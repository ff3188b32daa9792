//! One-time pickups: a bind's answer is a URL that yields the bundle once, within its lifetime
//! ([`TTL`] unless the gateway is told otherwise), and never again. The bundle itself is never
//! stored: a pickup records only what was asked for and by whom ([`Record`], kept as a
//! [`super::records`] record), and the credential is minted when the pickup is taken.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How long a pickup may be taken, by default.
pub const TTL: Duration = Duration::from_secs(300);
/// Pickups a caller may hold at once: a caller's binds cost the provider's store a bounded
/// number of records.
pub const PER_CALLER: usize = 5;

/// What a pickup records: what the caller asked for, and who it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The caller (the Grant's consumer identity).
    pub identity: String,
    /// The Export.
    pub export: String,
    /// The caller's cluster name, if it gave one.
    pub cluster_name: Option<String>,
    /// The Binding's namespace (else a ClusterBinding).
    pub namespace: Option<String>,
    /// The Connection's name.
    pub connection: Option<String>,
    /// The Secret's namespace on the consumer.
    pub secret_namespace: String,
    /// The Grant issued for it.
    pub grant: String,
}
