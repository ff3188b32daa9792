//! `kbind-issuer`: the provider side's front door (#51). It runs **on a provider** (its kubeconfig
//! is the provider's), leader-elected, and keeps the catalog true: every `Export` says whether
//! it is offered — each API it names served by a CRD labelled exported — and every `Collection`
//! how many of its Exports are. It never syncs and writes only the catalog's status.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use kbind_shared::cli::CommonArgs;
use kbind_shared::{leader, process};

const PROGRAM: &str = "kbind-issuer";

/// jemalloc, as in the syncer: a burst of Grants replaces cached objects while their watch events
/// and writes come and go, and the C library's heap keeps the pages that churn leaves behind.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// kbind's provider-side issuer: runs on a PROVIDER cluster and keeps its catalog (Exports,
/// Collections) true to what the provider exports.
#[derive(Parser, Debug)]
#[command(
    name = "kbind-issuer",
    version,
    about,
    mut_arg("kubeconfig", |a| a.help("Kubeconfig of the PROVIDER cluster the issuer runs on [default: in-cluster, else $KUBECONFIG, else ~/.kube/config]")),
    mut_arg("namespace", |a| a.help("The issuer's own namespace: its leader Lease [default: $POD_NAMESPACE, else kbind]")),
    mut_arg("metrics_auth", |a| a.help("Serve `/metrics` only to a bearer token the provider API server authenticates and allows to `get` the non-resource URL `/metrics`")),
    mut_arg("identity", |a| a.help("This process's name: the issuer's leader Lease holder [default: $POD_NAME, else <hostname>-<pid>]")),
    mut_arg("provider_secret_namespaces", |a| a.hide(true)),
    mut_arg("allow_insecure_providers", |a| a.hide(true)),
)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    #[command(flatten)]
    election: leader::ElectionArgs,
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
    tracing::info!(%identity, %namespace, leader_elect = args.election.leader_elect, "kbind-issuer started");
    let lead_client = client.clone();
    let lead_metrics = metrics.clone();
    let lead = move |stop: tokio_util::sync::CancellationToken| {
        let client = lead_client.clone();
        let metrics = lead_metrics.clone();
        async move {
            futures::join!(
                kbind_provider::catalog::run(client.clone(), metrics.clone(), stop.clone()),
                kbind_provider::issuer::run(client, metrics, stop),
            );
        }
    };
    // A standby is ready: it is healthy and waiting for the Lease.
    let election = args.election.election(PROGRAM, namespace, identity);
    leader::lead_or_run(client, election, metrics, shutdown, &readiness, lead).await?;
    tracing::info!("kbind-issuer stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
        let args = Args::try_parse_from(["kbind-issuer"]).unwrap();
        assert!(args.election.leader_elect);
        assert_eq!(
            args.election.leader_election_lease_duration,
            Duration::from_secs(15)
        );
    }
}
