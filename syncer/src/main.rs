//! `kbind-syncer`: one of N active replicas that find managed CRDs by their markers and run
//! spec up, status down and deletion for the share of the work assigned to them.
#![forbid(unsafe_code)]

mod bindings;
mod cli;
mod context;
mod credentials;
mod managed;
mod membership;
mod namespaces;
mod related;
mod worker;

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use kbind_shared::process;
use tokio_util::sync::CancellationToken;

/// jemalloc, not the C library's allocator: a bulk of new objects replaces every cached object
/// several times while its watch events and writes come and go, and glibc's heap kept the pages
/// that churn left behind (10,000 objects: 44.5 MiB after the bulk against 31.4 MiB for the same
/// objects after a restart; 3.1 KiB per object). jemalloc gives them back: 33.5 MiB, 1.9 KiB per
/// object (`kbind-bench`, docs/operations.md, "Sizing"; mimalloc was tried too and kept them).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let args = cli::Args::parse();
    let common = args.common.clone();
    process::main("kbind-syncer", &common, |started| run(args, started)).await
}

async fn run(args: cli::Args, started: process::Started) -> Result<(), String> {
    let process::Started {
        shutdown,
        metrics,
        client,
        readiness,
    } = started;
    let identity = args.common.identity();

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
        membership.clone(),
        context::Settings {
            resync_interval: args.resync_interval,
            workers: args.workers,
            provider_secrets: args.common.provider_secrets(),
            limits: context::Limits {
                max_status_bytes: usize::try_from(args.max_status_bytes).unwrap_or(usize::MAX),
                status_min_interval: args
                    .status_min_interval
                    .min(std::time::Duration::from_secs(60)),
                related: related::plan::CopyLimits {
                    copies_per_entry: args.related_copies_per_entry,
                    bytes_per_entry: usize::try_from(args.related_bytes_per_entry)
                        .unwrap_or(usize::MAX),
                },
            },
            max_bindings_per_namespace: args.max_bindings_per_namespace,
        },
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
