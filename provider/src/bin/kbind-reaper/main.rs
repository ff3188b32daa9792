//! `kbind-reaper`: the optional provider-side program (#38). It runs **on a provider** (its
//! kubeconfig is the provider's), leader-elected, and for every `ReaperPolicy` reads the consumers'
//! heartbeat Leases, tells live consumers from dead ones by the API server's clock, reports them,
//! and — only when a policy says so, after both graces — orphans or deletes a dead consumer's
//! copies.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use kbind_provider::reaper::sweep::Reaper;
use kbind_shared::api::reaper::ReaperPolicy;
use kbind_shared::cli::{CommonArgs, parse_duration};
use kbind_shared::leader;
use kbind_shared::process;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

const PROGRAM: &str = "kbind-reaper";

/// kbind's provider-side reaper: runs on a PROVIDER cluster, tells live consumers from dead ones
/// by what it observes of their heartbeat Leases, and reports them — or, only where a
/// ReaperPolicy says so and after both graces, orphans or deletes a dead consumer's copies.
#[derive(Parser, Debug)]
#[command(
    name = "kbind-reaper",
    version,
    about,
    mut_arg("kubeconfig", |a| a.help("Kubeconfig of the PROVIDER cluster the reaper runs on [default: in-cluster, else $KUBECONFIG, else ~/.kube/config]")),
    mut_arg("namespace", |a| a.help("The reaper's own namespace: its leader and clock Leases and its record (ConfigMap kbind-reaper-memory) [default: $POD_NAMESPACE, else kbind]")),
    mut_arg("metrics_auth", |a| a.help("Serve `/metrics` only to a bearer token the provider API server authenticates and allows to `get` the non-resource URL `/metrics`")),
    mut_arg("identity", |a| a.help("This process's name: the reaper's leader Lease holder [default: $POD_NAME, else <hostname>-<pid>]")),
    mut_arg("provider_secret_namespaces", |a| a.hide(true)),
    mut_arg("allow_insecure_providers", |a| a.hide(true)),
)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    #[command(flatten)]
    election: leader::ElectionArgs,

    /// The longest time between two sweeps (a sweep also comes at the exact second a consumer's
    /// state changes)
    #[arg(long, env = "KBIND_SWEEP_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    sweep_interval: Duration,

    /// Testing only: pretend the host's clock is off by this much (e.g. `+6h`, `-6h`). No verdict
    /// uses the host's clock, so none changes.
    #[arg(long, env = "KBIND_HOST_CLOCK_OFFSET", hide = true, value_parser = kbind_provider::clock::parse_offset, default_value = "0s")]
    host_clock_offset: jiff::SignedDuration,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let common = args.common.clone();
    process::main(PROGRAM, &common, |started| run(args, started)).await
}

async fn run(args: Args, started: process::Started) -> Result<(), String> {
    let process::Started {
        shutdown,
        metrics,
        client,
        readiness,
    } = started;
    let identity = args.common.identity();
    let namespace = args.common.namespace();
    tracing::info!(%identity, %namespace, leader_elect = args.election.leader_elect, sweep_interval = ?args.sweep_interval, "kbind-reaper started");
    let reaper = Arc::new(Reaper::new(
        client.clone(),
        namespace.clone(),
        identity.clone(),
        metrics.clone(),
        args.host_clock_offset,
    ));
    let interval = args.sweep_interval;
    let lead_client = client.clone();
    let lead = move |stop: tokio_util::sync::CancellationToken| {
        let reaper = reaper.clone();
        let client = lead_client.clone();
        async move { sweep_until(&reaper, &client, interval, &stop).await }
    };
    // A standby is ready: it is healthy and waiting for the Lease.
    let election = args.election.election(PROGRAM, namespace, identity);
    leader::lead_or_run(client, election, metrics, shutdown, &readiness, lead).await?;
    tracing::info!("kbind-reaper stopped");
    Ok(())
}

/// Sweeps every policy, then waits for the soonest next sweep any asked for, until `stop`.
async fn sweep_until(
    reaper: &Reaper,
    client: &kube::Client,
    interval: Duration,
    stop: &tokio_util::sync::CancellationToken,
) {
    let policies: Api<ReaperPolicy> = Api::all(client.clone());
    // A new term as leader: what a previous leader observed is read from its record.
    reaper.forget();
    while !stop.is_cancelled() {
        let mut next = interval;
        match policies.list(&ListParams::default()).await {
            Ok(list) => {
                for policy in &list.items {
                    if stop.is_cancelled() {
                        return;
                    }
                    next = next.min(reaper.sweep(policy, interval).await);
                    tracing::debug!(policy = %policy.name_any(), ?next, "next sweep");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot list ReaperPolicies");
                next = next.min(Duration::from_secs(5));
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(next) => {}
            _ = stop.cancelled() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_speaks_of_the_provider_and_lists_no_consumer_side_flag() {
        use clap::CommandFactory;
        let help = Args::command().render_long_help().to_string();
        assert!(
            help.contains("Kubeconfig of the PROVIDER cluster"),
            "{help}"
        );
        for consumer_side in [
            "consumer cluster",
            "--provider-secret-namespaces",
            "--allow-insecure-providers",
        ] {
            assert!(!help.contains(consumer_side), "{consumer_side}: {help}");
        }
    }

    #[test]
    fn every_default_parses() {
        let args = Args::try_parse_from(["kbind-reaper"]).unwrap();
        assert_eq!(args.host_clock_offset, jiff::SignedDuration::ZERO);
        assert_eq!(args.sweep_interval, Duration::from_secs(30));
        assert!(args.election.leader_elect);
    }
}
