//! `kbind-schema-manager`: the leader-elected process that owns Connections, identity pinning,
//! discovery, schema installation, binding reconcile and cleanup, and assigning sync work.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

mod assignment;
mod binding;
mod connection;
mod context;
mod discovery;
mod leader;
mod openapi;
mod providers;
mod schema;

use std::sync::Arc;

use clap::Parser;
use kbind_shared::cli::{CommonArgs, parse_duration};
use kbind_shared::keys;
use kbind_shared::metrics::Metrics;
use kbind_shared::process::{self, Readiness};

/// kbind's schema manager.
#[derive(Parser, Debug)]
#[command(name = "kbind-schema-manager", version, about)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    /// Lease-based leader election
    #[arg(long, env = "KBIND_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,

    /// Lease name in --namespace
    #[arg(long, env = "KBIND_LEADER_ELECTION_ID", default_value = keys::DEFAULT_LEADER_ELECTION_ID)]
    leader_election_id: String,

    /// How long a silent leader keeps the leader Lease
    #[arg(long, env = "KBIND_LEADER_ELECTION_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    leader_election_lease_duration: Duration,

    /// Connection re-discovery and heartbeat period
    #[arg(long, env = "KBIND_DISCOVERY_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    discovery_interval: Duration,

    /// Backstop resync of bindings
    #[arg(long, env = "KBIND_BINDING_RESYNC_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    binding_resync_interval: Duration,

    /// How long an API must be missing from the provider's exports before autoBind stops binding
    /// it (its CRD and objects are kept even then)
    #[arg(long, env = "KBIND_AUTOBIND_GRACE_PERIOD", default_value = "10m", value_parser = parse_duration)]
    autobind_grace_period: Duration,

    /// leaseDurationSeconds of the provider heartbeat Lease
    #[arg(long, env = "KBIND_HEARTBEAT_LEASE_DURATION", default_value = "60s", value_parser = parse_duration)]
    heartbeat_lease_duration: Duration,

    /// Split each managed API's sync work into this many namespace buckets, so that one API with
    /// very many objects spreads over several syncer replicas (a consumer CRD's
    /// `core.kbind.io/sync-buckets` annotation overrides it)
    #[arg(long, env = "KBIND_NAMESPACE_BUCKETS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(assignment::MAX_BUCKETS)))]
    namespace_buckets: u32,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) =
        kbind_shared::telemetry::init_logging(args.common.log_format, &args.common.log_level)
    {
        eprintln!("kbind-schema-manager: {e}");
        return ExitCode::FAILURE;
    }
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kbind-schema-manager: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let shutdown = process::shutdown_on_signals();
    let metrics = Metrics::new();
    let client = process::consumer_client(&args.common, &metrics).await?;
    process::wait_for_apiserver(&client, Duration::from_secs(30)).await?;

    let readiness = Readiness::default();
    process::serve_endpoints(
        args.common.metrics_bind_address,
        args.common.health_probe_bind_address,
        metrics.clone(),
        readiness.clone(),
        shutdown.clone(),
    )
    .await?;

    tracing::info!(
        namespace = %args.common.namespace(),
        leader_elect = args.leader_elect,
        leader_election_id = %args.leader_election_id,
        discovery_interval = ?args.discovery_interval,
        binding_resync_interval = ?args.binding_resync_interval,
        heartbeat_lease_duration = ?args.heartbeat_lease_duration,
        namespace_buckets = args.namespace_buckets,
        "kbind-schema-manager started"
    );
    let ctx = Arc::new(context::Context::new(
        client.clone(),
        metrics.clone(),
        kube::runtime::events::Reporter {
            controller: "kbind-schema-manager".into(),
            instance: Some(holder_identity()),
        },
        context::Settings {
            discovery_interval: args.discovery_interval,
            binding_resync_interval: args.binding_resync_interval,
            heartbeat_lease_duration: args.heartbeat_lease_duration,
            namespace_buckets: args.namespace_buckets,
            provider_secret_namespaces: args.common.provider_secret_namespaces(),
            autobind_grace_period: args.autobind_grace_period,
        },
        args.common.namespace(),
    ));
    let lead = move |stop: tokio_util::sync::CancellationToken| {
        let ctx = ctx.clone();
        async move {
            futures::future::join3(
                connection::run(ctx.clone(), stop.clone()),
                binding::run(ctx.clone(), stop.clone()),
                assignment::run(ctx, stop),
            )
            .await;
        }
    };
    // A standby is ready: it is healthy and waiting for the Lease.
    readiness.set(true);
    if args.leader_elect {
        let election = leader::Election {
            namespace: args.common.namespace(),
            lease_name: args.leader_election_id.clone(),
            holder: holder_identity(),
            lease_duration: args.leader_election_lease_duration,
        };
        leader::run(client, election, metrics, shutdown.clone(), lead).await;
    } else {
        metrics.leader.set(1.0);
        lead(shutdown.clone()).await;
    }
    readiness.set(false);
    tracing::info!("kbind-schema-manager stopped");
    Ok(())
}

/// This process in the leader Lease: `$POD_NAME`, else `<hostname>-<pid>`.
fn holder_identity() -> String {
    if let Ok(pod) = std::env::var("POD_NAME")
        && !pod.is_empty()
    {
        return pod;
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "kbind".into());
    format!("{host}-{}", std::process::id())
}
