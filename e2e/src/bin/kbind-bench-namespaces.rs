//! Benchmark of where the syncer reads (#54), on two real clusters. Prints figures; asserts
//! nothing about time.
//!
//! An API only Bindings list is watched in their namespaces only, one watch per namespace on
//! each cluster; one a ClusterBinding lists, with one watch per cluster. For each size K of
//! `--namespaces` and each mode (`per-namespace`: a Binding in each of K namespaces;
//! `cluster-wide`: the same namespaces and Widgets under one ClusterBinding, on fresh clusters),
//! with `--objects` Widgets per namespace synced, it measures: the syncer's memory and open
//! sockets, its CPU at rest, the Widget watches both API servers hold, how long a restarted syncer
//! takes to sync a change made while it was down (both sides listed again), and, per namespace,
//! how long a new namespace's first Widget takes to reach the provider after its Binding is Ready.

use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::fixtures::*;
use kbind_e2e::kbind::apiserver_watches;
use kbind_e2e::measure::{cpu_seconds, rss_mib};
use kbind_shared::api::{ClusterBinding, ClusterBindingSpec};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

#[derive(Parser)]
#[command(name = "kbind-bench-namespaces")]
struct Args {
    /// Namespace counts, each on fresh clusters.
    #[arg(long, value_delimiter = ',', default_value = "1,300")]
    namespaces: Vec<usize>,
    /// Widgets per namespace.
    #[arg(long, default_value_t = 3)]
    objects: usize,
    /// Seconds of rest over which the syncer's CPU is measured.
    #[arg(long, default_value_t = 20)]
    window: u64,
}

const API: &str = "widgets.example.org";

fn namespace(i: usize) -> String {
    format!("ns-{i:03}")
}

/// The syncer's open sockets (one per TLS connection to an API server, and its listeners).
fn sockets(pid: Option<u32>) -> usize {
    let Some(pid) = pid else { return 0 };
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.filter_map(Result::ok)
                .filter(|fd| {
                    std::fs::read_link(fd.path())
                        .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"))
                })
                .count()
        })
        .unwrap_or_default()
}

async fn widget_watches(client: &Client) -> u64 {
    apiserver_watches(client)
        .await
        .map(|w| w.get("example.org/widgets").copied().unwrap_or_default())
        .unwrap_or_default()
}

async fn provider_widgets(provider: &Client) -> usize {
    let api: Api<kube::api::DynamicObject> = Api::all_with(provider.clone(), &widget_resource());
    api.list_metadata(&ListParams::default())
        .await
        .map(|l| l.items.len())
        .unwrap_or_default()
}

/// Waits until the provider holds `n` Widgets; how long that took.
async fn all_synced(provider: &Client, n: usize) -> Duration {
    let started = Instant::now();
    while provider_widgets(provider).await < n {
        assert!(
            started.elapsed() < Duration::from_secs(1800),
            "{n} Widgets synced within 30 min"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    started.elapsed()
}

/// One size in one mode, on fresh clusters: prints its table row.
async fn run(k: usize, per_namespace: bool, args: &Args) {
    let test = format!(
        "bench_namespaces_{k}_{}",
        if per_namespace { "ns" } else { "cluster" }
    );
    let mut s = SyncEnv::start_full(
        &test,
        &[0, 1],
        None,
        &[],
        &["--discovery-interval=30s", "--binding-resync-interval=30s"],
    )
    .await;
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    for i in 0..k {
        ensure_namespace(&s.consumer, &namespace(i))
            .await
            .expect("namespace");
    }
    let mut per_namespace_first = Vec::new();
    if per_namespace {
        // The first Binding installs the CRD; each next one is a namespace more to read.
        for i in 0..k {
            let ns = namespace(i);
            bind_in(&s.consumer, &ns, "widgets", "provider", &[API]).await;
            let started = Instant::now();
            create_widget_and_wait_upstream(&s.consumer, &s.provider, &ns, "w0", 1).await;
            per_namespace_first.push(started.elapsed().as_secs_f64() * 1000.0);
        }
    } else {
        let all: Api<ClusterBinding> = Api::all(s.consumer.clone());
        all.create(
            &PostParams::default(),
            &ClusterBinding::new(
                "widgets",
                ClusterBindingSpec::from(binding_spec("provider", &[API])),
            ),
        )
        .await
        .expect("a ClusterBinding");
        wait_binding(&all, "widgets", "Ready=True").await;
        for i in 0..k {
            create_widget_and_wait_upstream(&s.consumer, &s.provider, &namespace(i), "w0", 1).await;
        }
    }
    let consumer = s.consumer.clone();
    futures::stream::iter((0..k).flat_map(|i| (1..args.objects).map(move |j| (i, j))))
        .map(|(i, j)| {
            let api = widgets(&consumer, &namespace(i));
            async move {
                api.create(&PostParams::default(), &widget(&format!("w{j}"), 1))
                    .await
                    .expect("a Widget")
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    all_synced(&s.provider, k * args.objects).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let pid = s.env.process_ref(s.syncer.index).pid();
    let (rss, open) = (rss_mib(pid), sockets(pid));
    let watches = [
        widget_watches(&s.consumer).await,
        widget_watches(&s.provider).await,
    ];
    let cpu = cpu_seconds(pid);
    tokio::time::sleep(Duration::from_secs(args.window)).await;
    let at_rest = (cpu_seconds(pid) - cpu) / args.window as f64;

    // A restart: a change made while the syncer is down, synced once both sides listed again.
    let last = namespace(k - 1);
    s.env.process(s.syncer.index).kill();
    let patch = json!({ "spec": { "size": 7 } });
    widgets(&s.consumer, &last)
        .patch("w0", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("change w0");
    let started = Instant::now();
    s.restart_syncer(&format!("syncer-restart-{k}"), &[]).await;
    wait_size(
        &widgets(&s.provider, &last),
        "w0",
        7,
        "the change after a restart",
    )
    .await;
    let restart = started.elapsed();
    let pid = s.env.process_ref(s.syncer.index).pid();
    let restart_cpu = cpu_seconds(pid);

    per_namespace_first.sort_by(f64::total_cmp);
    let first = if per_namespace_first.is_empty() {
        "—".to_owned()
    } else {
        format!(
            "p50 {:.0} ms, max {:.0} ms",
            per_namespace_first[per_namespace_first.len() / 2],
            per_namespace_first.last().copied().unwrap_or_default()
        )
    };
    println!(
        "| {k} | {} | {rss:.1} MiB | {open} | {:.1} ms/s | {} / {} | {:.2} s ({restart_cpu:.2} CPU-s) | {first} |",
        if per_namespace {
            "per namespace"
        } else {
            "cluster-wide"
        },
        at_rest * 1000.0,
        watches[0],
        watches[1],
        restart.as_secs_f64(),
    );
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    println!(
        "| namespaces | reads | syncer RSS | syncer sockets | syncer CPU at rest | Widget watches (consumer / provider API server) | restart → change synced | a new namespace: Binding Ready → first Widget on the provider |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---|");
    for &k in &args.namespaces {
        for per_namespace in [true, false] {
            run(k.max(1), per_namespace, &args).await;
        }
    }
}
