//! `kbind-syncer`: one of N active replicas that find managed CRDs by their markers and run
//! spec up, status down and deletion for the share of the work assigned to them.
#![forbid(unsafe_code)]

mod context;
mod credentials;
mod managed;
mod membership;
mod namespaces;
mod related;
mod worker;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use kbind_shared::cli::{CommonArgs, parse_duration};
use kbind_shared::metrics::Metrics;
use kbind_shared::process::{self, Readiness};
use tokio_util::sync::CancellationToken;

/// kbind's syncer.
#[derive(Parser, Debug)]
#[command(name = "kbind-syncer", version, about)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    /// This replica's member name (its membership Lease) [default: $POD_NAME, else the hostname]
    #[arg(long, env = "KBIND_IDENTITY")]
    identity: Option<String>,

    /// How long a silent replica keeps its work
    #[arg(long, env = "KBIND_MEMBERSHIP_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    membership_lease_duration: Duration,

    /// Backstop full resync per API
    #[arg(long, env = "KBIND_RESYNC_INTERVAL", default_value = "10m", value_parser = parse_duration)]
    resync_interval: Duration,

    /// Concurrent object syncs per replica
    #[arg(long, env = "KBIND_WORKERS", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    workers: u16,
}

impl Args {
    fn identity(&self) -> Result<String, String> {
        if let Some(identity) = self.identity.clone().filter(|i| !i.is_empty()) {
            return Ok(identity);
        }
        if let Ok(pod) = std::env::var("POD_NAME").map(|p| p.trim().to_owned())
            && !pod.is_empty()
        {
            return Ok(pod);
        }
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .or_else(|_| std::fs::read_to_string("/etc/hostname"))
            .map(|h| h.trim().to_owned())
            .ok()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| "cannot determine --identity: set --identity or $POD_NAME".to_owned())
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) =
        kbind_shared::telemetry::init_logging(args.common.log_format, &args.common.log_level)
    {
        eprintln!("kbind-syncer: {e}");
        return ExitCode::FAILURE;
    }
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kbind-syncer: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let identity = args.identity()?;
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
        %identity,
        namespace = %args.common.namespace(),
        membership_lease_duration = ?args.membership_lease_duration,
        resync_interval = ?args.resync_interval,
        workers = args.workers,
        "kbind-syncer started"
    );
    let reporter = kube::runtime::events::Reporter {
        controller: kbind_shared::keys::EVENT_COMPONENT.into(),
        instance: Some(identity.clone()),
    };
    let membership = Arc::new(membership::Membership::new(
        client.clone(),
        &args.common.namespace(),
        identity.clone(),
        args.membership_lease_duration,
    ));
    // Caches first (not ready until they have listed; SIGTERM still ends the wait), then join the
    // membership: a replica that cannot run work yet does not take any.
    let start = context::Context::start(
        client,
        metrics,
        reporter,
        args.resync_interval,
        args.workers,
        membership.clone(),
        args.common.provider_secret_namespaces(),
    );
    let ctx = tokio::select! {
        ctx = start => Arc::new(ctx),
        _ = shutdown.cancelled() => {
            tracing::info!("kbind-syncer stopped before its caches were ready");
            return Ok(());
        }
    };
    membership.resume_incarnation().await;
    let renewing = CancellationToken::new();
    let renewer = tokio::spawn({
        let (membership, renewing) = (membership.clone(), renewing.clone());
        async move { membership.run(renewing).await }
    });
    readiness.set(true);
    managed::run(ctx, shutdown.clone()).await;
    readiness.set(false);
    // In-flight writes are done (the workers stopped): hand the work back and leave.
    renewing.cancel();
    let _ = renewer.await;
    membership.release().await;
    tracing::info!("kbind-syncer stopped");
    Ok(())
}
