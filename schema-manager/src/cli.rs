//! `kbind-schema-manager`'s flags (INTERFACES.md); the shared ones are `kbind_shared::cli`.

use std::time::Duration;

use clap::Parser;
use kbind_shared::cli::{CommonArgs, parse_bytes, parse_duration};
use kbind_shared::keys;

use crate::assignment;

/// kbind's schema manager.
#[derive(Parser, Debug)]
#[command(name = "kbind-schema-manager", version, about)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,

    /// Lease-based leader election
    #[arg(long, env = "KBIND_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,

    /// Lease name in --namespace
    #[arg(long, env = "KBIND_LEADER_ELECTION_ID", default_value = keys::DEFAULT_LEADER_ELECTION_ID)]
    pub leader_election_id: String,

    /// How long a silent leader keeps the leader Lease
    #[arg(long, env = "KBIND_LEADER_ELECTION_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_election_lease_duration: Duration,

    /// Connection re-discovery and heartbeat period
    #[arg(long, env = "KBIND_DISCOVERY_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub discovery_interval: Duration,

    /// Backstop resync of bindings
    #[arg(long, env = "KBIND_BINDING_RESYNC_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub binding_resync_interval: Duration,

    /// How long an API must be missing from the provider's exports before autoBind stops binding
    /// it (its CRD and objects are kept even then)
    #[arg(long, env = "KBIND_AUTOBIND_GRACE_PERIOD", default_value = "10m", value_parser = parse_duration)]
    pub autobind_grace_period: Duration,

    /// leaseDurationSeconds of the provider heartbeat Lease
    #[arg(long, env = "KBIND_HEARTBEAT_LEASE_DURATION", default_value = "60s", value_parser = parse_duration)]
    pub heartbeat_lease_duration: Duration,

    /// Split each managed API's sync work into this many namespace buckets, so that one API with
    /// very many objects spreads over several syncer replicas (a consumer CRD's
    /// `core.kbind.io/sync-buckets` annotation overrides it)
    #[arg(long, env = "KBIND_NAMESPACE_BUCKETS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(assignment::MAX_BUCKETS)))]
    pub namespace_buckets: u32,

    /// The largest provider OpenAPI document read (bytes; Ki, Mi, Gi suffixes): a larger one is
    /// reported on the APIs it describes instead of being read
    #[arg(long, env = "KBIND_OPENAPI_DOCUMENT_LIMIT", default_value = "10Mi", value_parser = parse_bytes)]
    pub openapi_document_limit: u64,

    /// Serve bindings' `relatedResources` (the chart sets it from `relatedResources.enabled`);
    /// off, no related work is assigned and such bindings say so
    #[arg(long, env = "KBIND_RELATED_RESOURCES", default_value_t = true, action = clap::ArgAction::Set)]
    pub related_resources: bool,

    /// The most Bindings of one namespace whose related resources are served (the first by
    /// name); the rest say so on their RelatedResourcesSynced condition. ClusterBindings are not
    /// counted
    #[arg(
        long,
        env = "KBIND_MAX_RELATED_BINDINGS_PER_NAMESPACE",
        default_value_t = 16
    )]
    pub max_related_bindings_per_namespace: u32,

    /// The most Bindings served in one namespace, the oldest first (both programs must agree:
    /// the chart sets one value); the rest bind nothing and say `TooManyBindings`.
    /// ClusterBindings are not counted
    #[arg(
        long,
        env = "KBIND_MAX_BINDINGS_PER_NAMESPACE",
        default_value_t = kbind_shared::binding_cap::DEFAULT_MAX_PER_NAMESPACE
    )]
    pub max_bindings_per_namespace: u32,

    /// When a provider credential is a bound ServiceAccount token (it expires), renew it once this
    /// share of its lifetime has passed (0 < share < 1): a new token is requested with the
    /// credential itself and written into the Connection's Secret
    #[arg(long, env = "KBIND_TOKEN_RENEWAL_AT", default_value_t = 0.8, value_parser = parse_share)]
    pub token_renewal_at: f64,
}

/// A share of a lifetime: a number strictly between 0 and 1.
fn parse_share(text: &str) -> Result<f64, String> {
    let share: f64 = text.parse().map_err(|e| format!("{text}: {e}"))?;
    if share > 0.0 && share < 1.0 {
        Ok(share)
    } else {
        Err(format!("{text}: must be between 0 and 1 (exclusive)"))
    }
}
