//! Benchmark of instance sync on two real clusters. Prints figures; asserts nothing about time.
//!
//! 1. Creates N Widgets on the consumer (16 in flight) and measures the time until every provider
//!    copy exists and every status is back.
//! 2. Changes M Widgets at a steady rate and measures each change's spec-up latency (consumer
//!    write → provider copy updated) and status-down latency (→ consumer status updated by the
//!    provider's stand-in controller, so it includes that controller's reaction).
//! 3. Reports API requests per change, kbind's own (`kbind_api_requests_total`) and as counted by
//!    both API servers, and the syncer's peak RSS.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::eventually;
use kbind_e2e::fixtures::*;
use kbind_e2e::kbind::counter_by;
use kbind_shared::api::ClusterBinding;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::json;

#[derive(Parser)]
#[command(name = "kbind-bench")]
struct Args {
    /// Objects created in phase 1.
    #[arg(long, default_value_t = 1000)]
    objects: usize,
    /// Changes made in phase 2.
    #[arg(long, default_value_t = 300)]
    changes: usize,
    /// Changes per second in phase 2.
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    /// Phase 3: delete every object and time until every provider copy is gone.
    #[arg(long)]
    delete: bool,
    /// Write the programs' `/metrics` addresses here as a Prometheus `file_sd` target list, for a
    /// Prometheus scraping the run (`scripts/dashboard-picture`).
    #[arg(long)]
    prometheus_targets: Option<std::path::PathBuf>,
    /// Keep the clusters and programs running this many seconds after the last phase (so that a
    /// scraper sees the end).
    #[arg(long, default_value_t = 0)]
    linger_secs: u64,
    /// Write every figure here as JSON.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// At rest after phase 2: count kbind's requests over this many seconds (0: skip).
    #[arg(long, default_value_t = 0)]
    idle_secs: u64,
}

/// `kbind_api_requests_total` of one program by `"<cluster> <verb>"`.
fn kbind_requests_by(metrics: &str) -> std::collections::BTreeMap<String, f64> {
    counter_by(metrics, "kbind_api_requests_total", &["cluster", "verb"])
        .into_iter()
        .map(|([cluster, verb], n)| (format!("{cluster} {verb}"), n))
        .collect()
}

async fn apiserver_metrics(client: &kube::Client) -> String {
    client
        .request_text(http::Request::get("/metrics").body(Vec::new()).unwrap())
        .await
        .unwrap_or_default()
}

/// Requests an API server served by `"<verb> <resource>"` (every client's), from its `/metrics`.
async fn apiserver_requests_by(client: &kube::Client) -> std::collections::BTreeMap<String, f64> {
    let text = apiserver_metrics(client).await;
    counter_by(&text, "apiserver_request_total", &["verb", "resource"])
        .into_iter()
        .map(|([verb, resource], n)| (format!("{verb} {resource}"), n))
        .collect()
}

/// Per minute, what grew from `before` to `after` over `seconds`.
fn per_minute(
    before: &std::collections::BTreeMap<String, f64>,
    after: &std::collections::BTreeMap<String, f64>,
    seconds: u64,
) -> std::collections::BTreeMap<String, f64> {
    after
        .iter()
        .filter_map(|(key, n)| {
            let delta = n - before.get(key).copied().unwrap_or_default();
            (delta > 0.0).then(|| (key.clone(), delta * 60.0 / seconds.max(1) as f64))
        })
        .collect()
}

/// The `file_sd` target list of the bench's two programs.
fn prometheus_targets(s: &SyncEnv) -> serde_json::Value {
    json!([
        { "targets": [s.manager.metrics], "labels": { "job": "kbind", "component": "schema-manager" } },
        { "targets": [s.syncer.metrics], "labels": { "job": "kbind", "component": "syncer" } },
    ])
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn kbind_requests(metrics: &str) -> u64 {
    metric_sum(metrics, "kbind_api_requests_total", &[]) as u64
}

async fn apiserver_requests(client: &kube::Client) -> u64 {
    metric_sum(
        &apiserver_metrics(client).await,
        "apiserver_request_total",
        &[],
    ) as u64
}

fn peak_rss_mib(pid: Option<u32>) -> f64 {
    status_mib(pid, "VmHWM:")
}

/// Resident memory now.
fn rss_mib(pid: Option<u32>) -> f64 {
    status_mib(pid, "VmRSS:")
}

fn status_mib(pid: Option<u32>, field: &str) -> f64 {
    let status = pid
        .and_then(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok())
        .unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or_default()
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let s = SyncEnv::start("bench", &[0, 1, 2], None).await;
    wait_binding_condition(
        &Api::<ClusterBinding>::all(s.consumer.clone()),
        "widgets",
        "Ready",
        "True",
        None,
    )
    .await
    .unwrap();
    if let Some(path) = &args.prometheus_targets {
        std::fs::write(path, prometheus_targets(&s).to_string()).expect("write the target list");
    }
    ensure_namespace(&s.consumer, "bench").await.unwrap();
    let (manager_pid, syncer_pid) = (
        s.env.process_ref(s.manager.index).pid(),
        s.env.process_ref(s.syncer.index).pid(),
    );
    // Memory with the API bound and no objects: the base that per-object figures subtract.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let empty = (rss_mib(manager_pid), rss_mib(syncer_pid));
    let (consumer_widgets, provider_widgets) =
        (widgets(&s.consumer, "bench"), widgets(&s.provider, "bench"));
    let n = args.objects;

    // Phase 1: create N.
    let started = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let api = consumer_widgets.clone();
            async move {
                api.create(&PostParams::default(), &widget(&format!("w{i}"), 1))
                    .await
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .expect("creates");
    let created = started.elapsed();
    eventually("all provider copies", Duration::from_secs(1800), || async {
        let count = provider_widgets
            .list_metadata(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .len();
        Ok((count == n).then_some(()))
    })
    .await
    .unwrap();
    let synced_up = started.elapsed();
    eventually("all statuses back", Duration::from_secs(1800), || async {
        let list = consumer_widgets
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        Ok((list
            .items
            .iter()
            .filter(|w| w.data["status"]["phase"] == "Ready")
            .count()
            == n)
            .then_some(()))
    })
    .await
    .unwrap();
    let all_back = started.elapsed();
    // Memory with every object synced, once the burst's buffers have been returned.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let steady = (rss_mib(manager_pid), rss_mib(syncer_pid));

    // Phase 2: steady changes; watches on both sides timestamp when each change arrives.
    let sent: Arc<Mutex<HashMap<String, (i64, Instant)>>> = Arc::default();
    let up: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let down: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let watch = |api: Api<kube::api::DynamicObject>,
                 pointer: &'static str,
                 out: Arc<Mutex<Vec<Duration>>>| {
        let sent = sent.clone();
        tokio::spawn(async move {
            let mut events = std::pin::pin!(
                watcher(api, watcher::Config::default())
                    .default_backoff()
                    .applied_objects()
            );
            while let Some(Ok(object)) = events.next().await {
                let value = object.data.pointer(pointer).and_then(|v| v.as_i64());
                let mut sent = sent.lock().unwrap();
                if let Some((target, at)) = sent.get(&object.name_any()).copied()
                    && value == Some(target)
                {
                    out.lock().unwrap().push(at.elapsed());
                    if pointer == "/status/observedSize" {
                        sent.remove(&object.name_any());
                    }
                }
            }
        })
    };
    let up_watch = watch(provider_widgets.clone(), "/spec/size", up.clone());
    let down_watch = watch(
        consumer_widgets.clone(),
        "/status/observedSize",
        down.clone(),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let kbind_before = kbind_requests(&s.syncer.metrics().await.unwrap());
    let (consumer_before, provider_before) = (
        apiserver_requests(&s.consumer).await,
        apiserver_requests(&s.provider).await,
    );
    let interval = Duration::from_secs_f64(1.0 / args.rate);
    let phase2 = Instant::now();
    for i in 0..args.changes {
        let name = format!("w{}", i % n);
        let size = 2 + i as i64;
        sent.lock()
            .unwrap()
            .insert(name.clone(), (size, Instant::now()));
        consumer_widgets
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "spec": { "size": size } })),
            )
            .await
            .unwrap();
        tokio::time::sleep_until((phase2 + interval * (i as u32 + 1)).into()).await;
    }
    eventually(
        "every change to come back",
        Duration::from_secs(300),
        || async { Ok(sent.lock().unwrap().is_empty().then_some(())) },
    )
    .await
    .unwrap();
    let kbind_after = kbind_requests(&s.syncer.metrics().await.unwrap());
    let (consumer_after, provider_after) = (
        apiserver_requests(&s.consumer).await,
        apiserver_requests(&s.provider).await,
    );
    up_watch.abort();
    down_watch.abort();

    let mut up = up.lock().unwrap().clone();
    let mut down = down.lock().unwrap().clone();
    up.sort();
    down.sort();
    let m = args.changes as f64;
    println!(
        "kbind benchmark on two real clusters (kube-apiserver v1.36.3, this machine: {} cores)",
        std::thread::available_parallelism()
            .map(|p| p.get())
            .unwrap_or(0)
    );
    println!("phase 1: {n} objects");
    println!("  created on the consumer in        {:>8.1?}", created);
    println!(
        "  all provider copies after         {:>8.1?}  ({:.0} objects/s)",
        synced_up,
        n as f64 / synced_up.as_secs_f64()
    );
    println!(
        "  all statuses back after           {:>8.1?}  ({:.0} objects/s)",
        all_back,
        n as f64 / all_back.as_secs_f64()
    );
    println!("phase 2: {} changes at {}/s", args.changes, args.rate);
    println!(
        "  spec-up latency      p50 {:>8.1?}  p99 {:>8.1?}",
        percentile(&up, 0.5),
        percentile(&up, 0.99)
    );
    println!(
        "  status-down latency  p50 {:>8.1?}  p99 {:>8.1?}  (includes the provider controller)",
        percentile(&down, 0.5),
        percentile(&down, 0.99)
    );
    println!(
        "  kbind-syncer requests per change:          {:.2}",
        (kbind_after - kbind_before) as f64 / m
    );
    println!(
        "  consumer API server requests per change:   {:.2}  (all clients, including this benchmark's own patch)",
        (consumer_after - consumer_before) as f64 / m
    );
    println!(
        "  provider API server requests per change:   {:.2}  (all clients, including the stand-in controller)",
        (provider_after - provider_before) as f64 / m
    );
    let syncer_peak = peak_rss_mib(syncer_pid);
    println!("kbind-syncer peak RSS: {syncer_peak:.1} MiB");
    let per_object_kib = ((steady.0 + steady.1) - (empty.0 + empty.1)) * 1024.0 / n as f64;
    println!(
        "memory at {n} objects: schema manager {:.1} MiB, syncer {:.1} MiB (with no objects: {:.1}, {:.1})",
        steady.0, steady.1, empty.0, empty.1
    );
    println!("  per synced object, both programs:  {per_object_kib:.2} KiB  (goal <= 2 KiB)");
    let mut report = json!({
        "objects": n,
        "changes": args.changes,
        "rate": args.rate,
        "cores": std::thread::available_parallelism().map(|p| p.get()).unwrap_or(0),
        "bulk": {
            "createdSeconds": created.as_secs_f64(),
            "allProviderCopiesSeconds": synced_up.as_secs_f64(),
            "allStatusesBackSeconds": all_back.as_secs_f64(),
            "objectsPerSecond": n as f64 / synced_up.as_secs_f64(),
        },
        "changesPhase": {
            "specUpP50Ms": percentile(&up, 0.5).as_secs_f64() * 1000.0,
            "specUpP99Ms": percentile(&up, 0.99).as_secs_f64() * 1000.0,
            "statusDownP50Ms": percentile(&down, 0.5).as_secs_f64() * 1000.0,
            "statusDownP99Ms": percentile(&down, 0.99).as_secs_f64() * 1000.0,
            "syncerRequestsPerChange": (kbind_after - kbind_before) as f64 / m,
            "consumerRequestsPerChange": (consumer_after - consumer_before) as f64 / m,
            "providerRequestsPerChange": (provider_after - provider_before) as f64 / m,
        },
        "memoryMiB": {
            "schemaManagerEmpty": empty.0,
            "syncerEmpty": empty.1,
            "schemaManagerSteady": steady.0,
            "syncerSteady": steady.1,
            "syncerPeak": syncer_peak,
            "perObjectKiB": per_object_kib,
            "perObjectGoalKiB": 2.0,
        },
    });
    if args.idle_secs > 0 {
        // At rest: nothing changes; what kbind still asks for is background load.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let snapshot = || async {
            let mut kbind = kbind_requests_by(&s.manager.metrics().await.unwrap_or_default());
            for (key, n) in kbind_requests_by(&s.syncer.metrics().await.unwrap_or_default()) {
                *kbind.entry(key).or_default() += n;
            }
            (
                kbind,
                apiserver_requests_by(&s.consumer).await,
                apiserver_requests_by(&s.provider).await,
            )
        };
        let before = snapshot().await;
        tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
        let after = snapshot().await;
        let kbind = per_minute(&before.0, &after.0, args.idle_secs);
        let consumer = per_minute(&before.1, &after.1, args.idle_secs);
        let provider = per_minute(&before.2, &after.2, args.idle_secs);
        println!("at rest, per minute over {} s:", args.idle_secs);
        println!("  kbind's requests (both programs, by cluster and verb): {kbind:?}");
        println!("  consumer API server, every client (by verb and resource): {consumer:?}");
        println!("  provider API server, every client (by verb and resource): {provider:?}");
        report["atRestPerMinute"] = json!({
            "kbindByClusterVerb": kbind,
            "consumerApiServer": consumer,
            "providerApiServer": provider,
        });
    }
    if args.delete {
        let started = Instant::now();
        consumer_widgets
            .delete_collection(&Default::default(), &ListParams::default())
            .await
            .expect("delete every Widget");
        eventually(
            "every provider copy gone",
            Duration::from_secs(1800),
            || async {
                let left = provider_widgets
                    .list_metadata(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .len();
                Ok((left == 0).then_some(()))
            },
        )
        .await
        .unwrap();
        let deleted = started.elapsed();
        println!("phase 3: deleted {n} objects");
        println!(
            "  every provider copy gone after    {:>8.1?}  ({:.0} objects/s)",
            deleted,
            n as f64 / deleted.as_secs_f64()
        );
        report["deleteSeconds"] = json!(deleted.as_secs_f64());
    }
    if let Some(path) = &args.json {
        std::fs::write(path, format!("{report:#}\n")).expect("write the JSON report");
    }
    tokio::time::sleep(Duration::from_secs(args.linger_secs)).await;
}
