//! `kbind-syncer`'s flags (INTERFACES.md); the shared ones are `kbind_shared::cli`.

use std::time::Duration;

use clap::Parser;
use kbind_shared::cli::{CommonArgs, parse_bytes, parse_duration};

/// kbind's syncer.
#[derive(Parser, Debug)]
#[command(name = "kbind-syncer", version, about)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,

    /// How long a silent replica keeps its work
    #[arg(long, env = "KBIND_MEMBERSHIP_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub membership_lease_duration: Duration,

    /// Backstop full resync per API
    #[arg(long, env = "KBIND_RESYNC_INTERVAL", default_value = "10m", value_parser = parse_duration)]
    pub resync_interval: Duration,

    /// Concurrent object syncs per replica
    #[arg(long, env = "KBIND_WORKERS", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    pub workers: u16,

    /// The largest provider status copied to a consumer object (bytes; Ki, Mi suffixes): a larger
    /// one is not copied (nor held in memory), and the object says why in a Warning Event
    #[arg(long, env = "KBIND_MAX_STATUS_BYTES", default_value = "256Ki", value_parser = parse_bytes)]
    pub max_status_bytes: u64,

    /// The least time between two status writes to one consumer object: a provider that changes
    /// a status faster is copied at this pace, its latest status always last (at most 60s)
    #[arg(long, env = "KBIND_STATUS_MIN_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub status_min_interval: Duration,

    /// The most objects one `relatedResources` entry copies; the rest are named on the binding
    #[arg(long, env = "KBIND_RELATED_COPIES_PER_ENTRY", default_value_t = 500)]
    pub related_copies_per_entry: usize,

    /// The most payload bytes one `relatedResources` entry copies, all its copies together
    /// (Ki, Mi suffixes)
    #[arg(long, env = "KBIND_RELATED_BYTES_PER_ENTRY", default_value = "16Mi", value_parser = parse_bytes)]
    pub related_bytes_per_entry: u64,

    /// The most Bindings served in one namespace, the oldest first (both programs must agree:
    /// the chart sets one value); the rest bind nothing and say `TooManyBindings`.
    /// ClusterBindings are not counted
    #[arg(
        long,
        env = "KBIND_MAX_BINDINGS_PER_NAMESPACE",
        default_value_t = kbind_shared::binding_cap::DEFAULT_MAX_PER_NAMESPACE
    )]
    pub max_bindings_per_namespace: u32,
}
