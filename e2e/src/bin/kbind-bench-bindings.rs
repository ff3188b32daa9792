//! Benchmark of a namespace user's flood of Bindings, on two real clusters. Prints figures;
//! asserts nothing about time.
//!
//! A victim namespace has its own Binding and `--victims` synced Widgets. A flood namespace gets
//! 0, then 1,000, then 20,000 Bindings of the same API (the chart's default cap serves 100 per
//! namespace). At each size it measures, over `--window` seconds each: the syncer's CPU at rest,
//! then its CPU while the oldest flood Binding's spec is patched every 100 ms (a served one: the
//! costliest kind of change) and a victim Widget's spec changes every 250 ms — the victim's lag
//! (the consumer's write to the provider copy showing it, seen by a provider watch), p50 and p99.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::fixtures::*;
use kbind_e2e::measure::cpu_seconds;
use kbind_shared::api::Binding;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::json;

#[derive(Parser)]
#[command(name = "kbind-bench-bindings")]
struct Args {
    /// Flood sizes, in order (each adds to the last).
    #[arg(long, value_delimiter = ',', default_value = "0,1000,20000")]
    sizes: Vec<usize>,
    /// Widgets in the victim namespace.
    #[arg(long, default_value_t = 20)]
    victims: usize,
    /// Seconds per measurement window.
    #[arg(long, default_value_t = 30)]
    window: u64,
    /// Keep the clusters' and programs' files (under target/e2e-runs/).
    #[arg(long)]
    keep: bool,
}

const API: &str = "widgets.example.org";

fn flood_binding(i: usize, policy: &str) -> Binding {
    let mut spec = binding_spec("provider", &[API]);
    spec.conflict_policy = serde_json::from_value(json!(policy)).expect("a policy");
    let mut b = Binding::new(&format!("flood-{i:05}"), spec);
    b.metadata.namespace = Some("flood".into());
    b
}

/// Creates Bindings `from..to` in the flood namespace, 16 at a time.
async fn grow(flood: &Api<Binding>, from: usize, to: usize) {
    futures::stream::iter(from..to)
        .map(|i| async move {
            flood
                .create(&PostParams::default(), &flood_binding(i, "Fail"))
                .await
                .expect("create a flood Binding")
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
}

/// Waits until the schema manager reports a `kbind_binding_ready` series for each of `size`
/// flood Bindings (every one reconciled and its status written); how long that took.
async fn settled(s: &SyncEnv, size: usize) -> Duration {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(1800) {
        if let Ok(metrics) = s.manager.metrics().await {
            let answered = metrics
                .lines()
                .filter(|l| {
                    l.starts_with("kbind_binding_ready{") && l.contains("namespace=\"flood\"")
                })
                .count();
            if answered >= size {
                break;
            }
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    started.elapsed()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    // The chart's intervals, not the tests' (a 1 s binding resync re-evaluates every Binding of
    // the flood every second).
    let manager_args = ["--discovery-interval=30s", "--binding-resync-interval=30s"];
    let mut s = SyncEnv::start_full("bench_bindings", &[0, 1], None, &[], &manager_args).await;
    s.restart_syncer("syncer-0-production", &["--membership-lease-duration=15s"])
        .await;
    s.syncer.wait_ready("the syncer", 60).await;
    if args.keep {
        s.env.keep_files();
    }
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    for namespace in ["victim", "flood"] {
        ensure_namespace(&s.consumer, namespace)
            .await
            .expect("namespace");
    }
    let mut own = Binding::new("widgets", binding_spec("provider", &[API]));
    own.metadata.namespace = Some("victim".into());
    let victim_bindings: Api<Binding> = Api::namespaced(s.consumer.clone(), "victim");
    victim_bindings
        .create(&PostParams::default(), &own)
        .await
        .expect("the victim's Binding");
    wait_binding(&victim_bindings, "widgets", "Ready=True").await;
    for i in 0..args.victims {
        create_widget_and_wait_upstream(&s.consumer, &s.provider, "victim", &format!("v{i}"), 1)
            .await;
    }
    // When each (name, size) first showed on the provider.
    let seen: Arc<Mutex<HashMap<(String, i64), Instant>>> = Arc::default();
    let watching = {
        let seen = seen.clone();
        let provider = widgets(&s.provider, "victim");
        tokio::spawn(async move {
            let mut events = watcher::watcher(provider, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(event) = events.next().await {
                let Ok(object) = event else { continue };
                let size = object.data["spec"]["size"].as_i64().unwrap_or_default();
                seen.lock()
                    .expect("not poisoned")
                    .entry((object.name_any(), size))
                    .or_insert_with(Instant::now);
            }
        })
    };
    let syncer_pid = s.env.process_ref(s.syncer.index).pid();
    let flood: Api<Binding> = Api::namespaced(s.consumer.clone(), "flood");
    let victims = widgets(&s.consumer, "victim");
    let window = Duration::from_secs(args.window);
    let mut size = 0usize;
    let mut next_size = 2i64;
    println!(
        "| Bindings in the flood namespace | syncer CPU at rest | syncer CPU, one patched every 100 ms | victim lag p50 | victim lag p99 |"
    );
    println!("|---:|---:|---:|---:|---:|");
    for target in args.sizes.iter().copied() {
        if target > size {
            let started = Instant::now();
            grow(&flood, size, target).await;
            let created = started.elapsed();
            size = target;
            // Until the schema manager has answered every flood Binding (one status write each:
            // the flood's cost on the consumer's API server, the same for every tenant).
            let answered = settled(&s, size).await;
            eprintln!(
                "{size} flood Bindings: created in {:.0} s, all answered by the schema manager {:.0} s later",
                created.as_secs_f64(),
                answered.as_secs_f64()
            );
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
        let cpu = cpu_seconds(syncer_pid);
        tokio::time::sleep(window).await;
        let at_rest = (cpu_seconds(syncer_pid) - cpu) / window.as_secs_f64();

        let cpu = cpu_seconds(syncer_pid);
        let started = Instant::now();
        let (mut sent, mut patches, mut policy) = (Vec::new(), 0u64, "Fail");
        let mut next_patch = started;
        let mut next_change = started;
        let mut turn = 0usize;
        while started.elapsed() < window {
            let now = Instant::now();
            if size > 0 && now >= next_patch {
                policy = if policy == "Fail" { "Adopt" } else { "Fail" };
                let patch = json!({ "spec": { "conflictPolicy": policy } });
                flood
                    .patch(
                        "flood-00000",
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                    .expect("patch the flood Binding");
                patches += 1;
                next_patch += Duration::from_millis(100);
            }
            if now >= next_change {
                let name = format!("v{}", turn % args.victims.max(1));
                turn += 1;
                let patch = json!({ "spec": { "size": next_size } });
                victims
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .expect("change a victim Widget");
                sent.push(((name, next_size), Instant::now()));
                next_size += 1;
                next_change += Duration::from_millis(250);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let busy = (cpu_seconds(syncer_pid) - cpu) / started.elapsed().as_secs_f64();
        // Every change has its chance to arrive.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let seen = seen.lock().expect("not poisoned").clone();
        let mut lags: Vec<f64> = sent
            .iter()
            .map(|(key, at)| {
                seen.get(key).map_or(f64::INFINITY, |arrived| {
                    arrived.saturating_duration_since(*at).as_secs_f64() * 1000.0
                })
            })
            .collect();
        lags.sort_by(f64::total_cmp);
        println!(
            "| {size} | {:.1} ms/s | {:.1} ms/s ({patches} patches) | {:.0} ms | {:.0} ms |",
            at_rest * 1000.0,
            busy * 1000.0,
            percentile(&lags, 0.5),
            percentile(&lags, 0.99),
        );
    }
    watching.abort();
}
