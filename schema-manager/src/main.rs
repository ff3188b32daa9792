//! `kbind-schema-manager`: the leader-elected process that owns Connections, identity pinning,
//! discovery, schema installation, binding reconcile and cleanup, and assigning sync work.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use kbind_schema_manager::{assignment, binding, cli, connection, context};
use kbind_shared::leader;
use kbind_shared::process;

const PROGRAM: &str = "kbind-schema-manager";

#[tokio::main]
async fn main() -> ExitCode {
    let args = cli::Args::parse();
    let common = args.common.clone();
    process::main(PROGRAM, &common, |started| run(args, started)).await
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
            controller: PROGRAM.into(),
            instance: Some(identity.clone()),
        },
        context::Settings {
            discovery_interval: args.discovery_interval,
            binding_resync_interval: args.binding_resync_interval,
            heartbeat_lease_duration: args.heartbeat_lease_duration,
            namespace_buckets: args.namespace_buckets,
            provider_secrets: args.common.provider_secrets(),
            openapi_document_limit: args.openapi_document_limit,
            autobind_grace_period: args.autobind_grace_period,
            related_resources: args.related_resources,
            max_related_bindings_per_namespace: args.max_related_bindings_per_namespace,
            max_bindings_per_namespace: args.max_bindings_per_namespace,
            token_renewal_at: args.token_renewal_at,
        },
        args.common.namespace(),
    ));
    let lead = move |stop: tokio_util::sync::CancellationToken| {
        let ctx = ctx.clone();
        async move {
            // When the term ends — gracefully, or aborted on a lost Lease — this replica forgets
            // every provider client: a standby holds no provider credential in use and watches
            // no provider.
            let _forget = ForgetProviders(ctx.clone());
            // This term's caches, one watch per kind, listed before any reconcile reads them.
            let caches = kbind_schema_manager::caches::TermCaches::start(
                &ctx.client,
                &ctx.namespace,
                &ctx.changes,
                &stop,
            );
            tokio::select! {
                _ = caches.ready() => {}
                _ = stop.cancelled() => return,
            }
            ctx.set_term_caches(Some(caches.clone()));
            futures::future::join3(
                connection::run(ctx.clone(), caches.clone(), stop.clone()),
                binding::run(ctx.clone(), caches.clone(), stop.clone()),
                assignment::run(ctx, caches, stop),
            )
            .await;
        }
    };
    // A standby is ready: it is healthy and waiting for the Lease.
    let election = args.leader_elect.then(|| leader::Election {
        namespace: args.common.namespace(),
        lease_name: args.leader_election_id.clone(),
        holder: identity,
        lease_duration: args.leader_election_lease_duration,
    });
    leader::lead_or_run(client, election, metrics, shutdown, &readiness, lead).await?;
    tracing::info!("kbind-schema-manager stopped");
    Ok(())
}

/// Forgets every provider client when dropped (held by a leadership term's work).
struct ForgetProviders(Arc<context::Context>);

impl Drop for ForgetProviders {
    fn drop(&mut self) {
        let kept = self.0.providers.len();
        self.0.providers.forget_all();
        self.0.forget_running_units();
        self.0.set_term_caches(None);
        tracing::info!(kept, "leadership term ended; provider clients forgotten");
    }
}
