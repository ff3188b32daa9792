//! Benchmark of instance sync on two real clusters. Prints figures; asserts nothing about time.
//!
//! 1. Creates N Widgets on the consumer (16 in flight) and measures the time until every provider
//!    copy exists and every status is back.
//! 2. Changes M Widgets at a steady rate and measures each change's spec-up latency (consumer
//!    write → provider copy updated) and status-down latency (→ consumer status updated by the
//!    provider's stand-in controller, so it includes that controller's reaction).
//! 3. Reports API requests per change, kbind's own (`kbind_api_requests_total`) and as counted by
//!    both API servers, and memory per synced object (both programs, steady minus empty RSS).
//!
//! With `--minimal`, phase 1 first runs with the minimal client ([`kbind_e2e::minimal`]) in place
//! of kbind's syncer, on the same two API servers, so that kbind's throughput is printed beside
//! the best a client can do there. `--pairs P` measures that ratio fairly: P pairs of batches of
//! N objects, kbind and the minimal client alternating on the same clusters (the first of each
//! pair alternating too), so that the machine's drift between runs falls on both alike; it prints
//! each pair's ratio, their median and spread, and where the CPU went (both control planes and
//! kbind, per object), then stops; `--minimal-shape` makes the minimal client's writes carry what
//! kbind's carry, on either cluster or both ([`kbind_e2e::minimal::Shape`]). `--restart` restarts the syncer at the end and times it until
//! ready and caught up, counting its writes and its peak memory. `--idle-secs` counts requests at
//! rest; `--json` writes every figure with its goal (issue #15).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::eventually;
use kbind_e2e::fixtures::*;
use kbind_e2e::kbind::counter_by;
use kbind_e2e::measure::{
    cpu_seconds, grown, kbind_requests_by, peak_rss_mib, per_minute, rss_mib,
};
use kbind_e2e::minimal::Shape;
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
    /// Run phase 1 with the minimal client first, for the throughput kbind is measured against.
    #[arg(long)]
    minimal: bool,
    /// Instead of the phases: this many pairs of batches of `--objects`, kbind and the minimal
    /// client alternating on the same clusters; prints the throughput ratio's median and spread
    /// and the CPU per object of both control planes and of kbind.
    #[arg(long, default_value_t = 0)]
    pairs: usize,
    /// What the minimal client's writes carry: only what syncing needs (`plain`), or what kbind's
    /// carry — on both clusters (`like-kbind`: ownership markers, heartbeat record, delivery
    /// record, precondition, field manager), on the provider only (`provider-markers`) or on the
    /// consumer only (`consumer-record`): what the bodies cost the API servers.
    #[arg(long, value_enum, default_value_t = Shape::Plain)]
    minimal_shape: Shape,
    /// After the other phases: restart the syncer and time it until ready and caught up.
    #[arg(long)]
    restart: bool,
    /// Run the programs with their production intervals (discovery and binding resync 30 s,
    /// membership Lease 15 s) instead of the tests' 1 s and 3 s: for `--idle-secs` figures an
    /// operator will see.
    #[arg(long)]
    production_intervals: bool,
}

/// How long a client takes to read every Widget on both sides at once, with the streaming lists
/// kbind's syncer uses (`streaming`) or with paged lists (500 a page): each object parsed, none
/// kept.
async fn list_both(
    consumer: &Api<kube::api::DynamicObject>,
    provider: &Api<kube::api::DynamicObject>,
    streaming: bool,
) -> Duration {
    let list = |api: Api<kube::api::DynamicObject>| async move {
        let mut events = if streaming {
            kbind_shared::streaming::instances(api, watcher::Config::default())
        } else {
            watcher(api, watcher::Config::default()).boxed()
        };
        let mut objects = 0_usize;
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::InitApply(_)) => objects += 1,
                Ok(watcher::Event::InitDone) => break,
                _ => {}
            }
        }
        objects
    };
    let started = Instant::now();
    let (a, b) = futures::join!(list(consumer.clone()), list(provider.clone()));
    let took = started.elapsed();
    assert!(a > 0 && b > 0, "both sides list their objects");
    took
}

/// Phase 1's figures.
struct Bulk {
    created: Duration,
    synced_up: Duration,
    all_back: Duration,
    /// CPU seconds both clusters' control planes used meanwhile.
    control_planes: f64,
}

/// CPU seconds both clusters' control planes have used so far.
fn control_planes_cpu(s: &SyncEnv) -> f64 {
    s.env.cluster("consumer").cpu_seconds() + s.env.cluster("provider").cpu_seconds()
}

/// Creates `n` Widgets named `<prefix><i>` (16 in flight) and times them until every provider
/// copy exists and every status is back — counted from a watch of each side, not by listing
/// (a list of every object ten times a second would load the API servers more than the sync).
async fn bulk(
    consumer: &Api<kube::api::DynamicObject>,
    provider: &Api<kube::api::DynamicObject>,
    prefix: &str,
    n: usize,
    control_planes: impl Fn() -> f64,
) -> Bulk {
    use kube::runtime::reflector;
    let writer = reflector::store::Writer::new(widget_resource());
    let copies = writer.as_reader();
    let provider_watch = tokio::spawn(
        reflector::reflector(
            writer,
            watcher(provider.clone(), watcher::Config::default())
                .modify(|w| w.metadata.managed_fields = None),
        )
        .default_backoff()
        .for_each(|_| async {}),
    );
    let writer = reflector::store::Writer::new(widget_resource());
    let statuses = writer.as_reader();
    let consumer_watch = tokio::spawn(
        reflector::reflector(
            writer,
            watcher(consumer.clone(), watcher::Config::default())
                .modify(|w| w.metadata.managed_fields = None),
        )
        .default_backoff()
        .for_each(|_| async {}),
    );
    let _ = copies.wait_until_ready().await;
    let _ = statuses.wait_until_ready().await;
    let cpu_start = control_planes();
    let started = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let api = consumer.clone();
            async move {
                api.create(&PostParams::default(), &widget(&format!("{prefix}{i}"), 1))
                    .await
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .expect("creates");
    let created = started.elapsed();
    let prefixed = |name: Option<&String>| name.is_some_and(|n| n.starts_with(prefix));
    eventually("all provider copies", Duration::from_secs(7200), || async {
        let count = copies
            .state()
            .iter()
            .filter(|c| prefixed(c.metadata.name.as_ref()))
            .count();
        Ok((count == n).then_some(()))
    })
    .await
    .unwrap();
    let synced_up = started.elapsed();
    eventually("all statuses back", Duration::from_secs(7200), || async {
        let done = statuses
            .state()
            .iter()
            .filter(|w| prefixed(w.metadata.name.as_ref()) && w.data["status"]["phase"] == "Ready")
            .count();
        Ok((done == n).then_some(()))
    })
    .await
    .unwrap();
    let all_back = started.elapsed();
    let control_planes = control_planes() - cpu_start;
    provider_watch.abort();
    consumer_watch.abort();
    Bulk {
        created,
        synced_up,
        all_back,
        control_planes,
    }
}

/// Phase 1 with the minimal client in kbind's place: the syncer is stopped, the minimal client
/// syncs `n` Widgets of its own namespace, they are removed from both sides, and a new syncer
/// process (same identity) is started and ready.
async fn minimal_bulk(s: &mut SyncEnv, n: usize, shape: Shape) -> Bulk {
    const NAMESPACE: &str = "bench-minimal";
    s.env.process(s.syncer.index).kill();
    ensure_namespace(&s.consumer, NAMESPACE).await.unwrap();
    ensure_namespace(&s.provider, NAMESPACE).await.unwrap();
    let (consumer, provider) = (
        widgets(&s.consumer, NAMESPACE),
        widgets(&s.provider, NAMESPACE),
    );
    let tasks = kbind_e2e::minimal::start(consumer.clone(), provider.clone(), 8, shape);
    let figures = bulk(&consumer, &provider, "m", n, || control_planes_cpu(s)).await;
    for task in tasks {
        task.abort();
    }
    // Removed from both sides: the finalizers released first (16 in flight), then a collection
    // delete, which for many objects can outlast a request's timeout and go on in the API server:
    // it is repeated until nothing is left.
    let names: Vec<String> = consumer
        .list_metadata(&ListParams::default())
        .await
        .expect("list the minimal client's Widgets")
        .items
        .iter()
        .map(|o| o.name_any())
        .collect();
    futures::stream::iter(names)
        .map(|name| {
            let api = consumer.clone();
            async move {
                let patch = json!({ "metadata": { "finalizers": null } });
                let _ = api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
            }
        })
        .buffer_unordered(16)
        .for_each(|()| async {})
        .await;
    for api in [&consumer, &provider] {
        wait_empty(
            api,
            "the minimal client's Widgets gone",
            Duration::from_secs(1200),
            true,
        )
        .await;
    }
    s.syncer = start_syncer(
        &mut s.env,
        "consumer",
        "syncer-0-after-minimal",
        &["--identity=syncer-0"],
    )
    .await
    .unwrap();
    s.syncer
        .wait_ready("the syncer after the minimal client", 60)
        .await;
    figures
}

/// One kbind batch of the interleaved measure: `n` Widgets in namespace `bench`, timed with the
/// CPU both programs used; then deleted (kbind deletes the copies) and waited for on both sides,
/// so that every batch starts from the same empty state.
async fn kbind_batch(s: &SyncEnv, n: usize, prefix: &str) -> (Bulk, f64) {
    let (consumer, provider) = (widgets(&s.consumer, "bench"), widgets(&s.provider, "bench"));
    let pids = [
        s.env.process_ref(s.manager.index).pid(),
        s.env.process_ref(s.syncer.index).pid(),
    ];
    let kbind_cpu = || pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>();
    let before = kbind_cpu();
    let figures = bulk(&consumer, &provider, prefix, n, || control_planes_cpu(s)).await;
    let used = kbind_cpu() - before;
    let _ = consumer
        .delete_collection(&Default::default(), &ListParams::default())
        .await;
    for api in [&consumer, &provider] {
        wait_empty(
            api,
            "the kbind batch gone",
            Duration::from_secs(3600),
            false,
        )
        .await;
    }
    (figures, used)
}

/// Waits, at most `limit`, until `api` lists no object; `delete`: deleting what is left each time
/// (a collection delete of many objects can outlast a request's timeout).
async fn wait_empty(
    api: &Api<kube::api::DynamicObject>,
    what: &str,
    limit: Duration,
    delete: bool,
) {
    eventually(what, limit, || async {
        let left = api
            .list_metadata(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .len();
        if left > 0 && delete {
            let _ = api
                .delete_collection(&Default::default(), &ListParams::default())
                .await;
        }
        Ok((left == 0).then_some(()))
    })
    .await
    .unwrap();
}

/// The median and the extremes of `values`.
fn spread(values: &[f64]) -> (f64, f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = if sorted.is_empty() {
        0.0
    } else if sorted.len() % 2 == 1 {
        sorted[sorted.len() / 2]
    } else {
        (sorted[sorted.len() / 2 - 1] + sorted[sorted.len() / 2]) / 2.0
    };
    (
        median,
        sorted.first().copied().unwrap_or_default(),
        sorted.last().copied().unwrap_or_default(),
    )
}

/// `--pairs`: kbind against the minimal client, interleaved (see the module's documentation).
async fn interleaved(
    s: &mut SyncEnv,
    n: usize,
    pairs: usize,
    shape: Shape,
    json_path: Option<&std::path::Path>,
) {
    let rate = |b: &Bulk| n as f64 / b.all_back.as_secs_f64();
    let (mut ratios, mut rows) = (Vec::new(), Vec::new());
    let (mut kbind_planes, mut minimal_planes, mut kbind_own) =
        (Vec::new(), Vec::new(), Vec::new());
    println!(
        "kbind against the minimal client, interleaved: {pairs} pairs of {n} objects \
         (statuses back, objects/s; this machine: {} cores)",
        std::thread::available_parallelism()
            .map(|p| p.get())
            .unwrap_or(0)
    );
    for pair in 0..pairs {
        let prefix = format!("p{pair}-");
        let minimal_first = pair % 2 == 0;
        let (minimal, (kbind, used)) = if minimal_first {
            let minimal = minimal_bulk(s, n, shape).await;
            (minimal, kbind_batch(s, n, &prefix).await)
        } else {
            let kbind = kbind_batch(s, n, &prefix).await;
            (minimal_bulk(s, n, shape).await, kbind)
        };
        let ratio = rate(&kbind) / rate(&minimal);
        println!(
            "  pair {} ({} first): minimal client {:>5.0}, kbind {:>5.0}  → {:>5.1} %",
            pair + 1,
            if minimal_first { "minimal" } else { "kbind" },
            rate(&minimal),
            rate(&kbind),
            100.0 * ratio
        );
        ratios.push(100.0 * ratio);
        kbind_planes.push(kbind.control_planes * 1000.0 / n as f64);
        minimal_planes.push(minimal.control_planes * 1000.0 / n as f64);
        kbind_own.push(used * 1000.0 / n as f64);
        rows.push(json!({
            "minimalFirst": minimal_first,
            "minimalObjectsPerSecond": rate(&minimal),
            "kbindObjectsPerSecond": rate(&kbind),
            "kbindPercent": 100.0 * ratio,
            "controlPlanesMsPerObjectKbind": kbind.control_planes * 1000.0 / n as f64,
            "controlPlanesMsPerObjectMinimal": minimal.control_planes * 1000.0 / n as f64,
            "kbindMsPerObject": used * 1000.0 / n as f64,
        }));
    }
    let (median, low, high) = spread(&ratios);
    println!(
        "  kbind / minimal client: median {median:.1} % (min {low:.1} %, max {high:.1} %; goal: median >= 90 %)"
    );
    let (kp, _, _) = spread(&kbind_planes);
    let (mp, _, _) = spread(&minimal_planes);
    let (ko, _, _) = spread(&kbind_own);
    println!(
        "  CPU per object (medians): both control planes {kp:.2} ms with kbind, {mp:.2} ms with the \
         minimal client; kbind itself (both programs) {ko:.2} ms"
    );
    if let Some(path) = json_path {
        let report = json!({
            "objects": n,
            "pairs": rows,
            "kbindPercentMedian": median,
            "kbindPercentMin": low,
            "kbindPercentMax": high,
            "controlPlanesMsPerObjectKbind": kp,
            "controlPlanesMsPerObjectMinimal": mp,
            "kbindMsPerObject": ko,
        });
        std::fs::write(path, serde_json::to_string_pretty(&report).unwrap())
            .expect("write the report");
    }
}

async fn apiserver_metrics(client: &kube::Client) -> String {
    kbind_e2e::kbind::apiserver_metrics(client)
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

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let manager_args: &[&str] = if args.production_intervals {
        &["--discovery-interval=30s", "--binding-resync-interval=30s"]
    } else {
        &[]
    };
    let mut s = SyncEnv::start_full("bench", &[0, 1, 2], None, &[], manager_args).await;
    if args.production_intervals {
        s.restart_syncer("syncer-0-production", &["--membership-lease-duration=15s"])
            .await;
        s.syncer.wait_ready("the syncer", 60).await;
    }
    wait_binding(
        &Api::<ClusterBinding>::all(s.consumer.clone()),
        "widgets",
        "Ready=True",
    )
    .await;
    if let Some(path) = &args.prometheus_targets {
        std::fs::write(path, prometheus_targets(&s).to_string()).expect("write the target list");
    }
    ensure_namespace(&s.consumer, "bench").await.unwrap();
    let n = args.objects;
    // Memory with the API bound and no objects: the base that per-object figures subtract (the
    // schema manager's before the minimal client's objects come and go; the syncer's in the
    // process that runs the benchmark).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let manager_pid = s.env.process_ref(s.manager.index).pid();
    let manager_empty = rss_mib(manager_pid);
    let shape = args.minimal_shape;
    if args.pairs > 0 {
        interleaved(&mut s, n, args.pairs, shape, args.json.as_deref()).await;
        return;
    }
    let minimal = if args.minimal {
        Some(minimal_bulk(&mut s, n, shape).await)
    } else {
        None
    };
    let syncer_pid = s.env.process_ref(s.syncer.index).pid();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let empty = (manager_empty, rss_mib(syncer_pid));
    let cpu = || cpu_seconds(manager_pid) + cpu_seconds(syncer_pid);
    // The breakdown: the syncer's share (the schema manager's is the rest).
    let syncer_cpu = || cpu_seconds(syncer_pid);
    let cpu_start = cpu();
    let syncer_cpu_start = syncer_cpu();
    let (consumer_widgets, provider_widgets) =
        (widgets(&s.consumer, "bench"), widgets(&s.provider, "bench"));

    // Phase 1: create N.
    let requests_before_bulk = kbind_requests_by(&s.syncer.metrics().await.unwrap_or_default());
    let Bulk {
        created,
        synced_up,
        all_back,
        control_planes,
    } = bulk(&consumer_widgets, &provider_widgets, "w", n, || {
        control_planes_cpu(&s)
    })
    .await;
    let cpu_bulk = cpu() - cpu_start;
    let syncer_cpu_bulk = syncer_cpu() - syncer_cpu_start;
    // What the syncer asked for per object, by cluster and verb (the unavoidable: one consumer
    // finalizer patch, one provider apply, one consumer status patch).
    let bulk_requests: std::collections::BTreeMap<String, f64> = grown(
        &requests_before_bulk,
        &kbind_requests_by(&s.syncer.metrics().await.unwrap_or_default()),
    )
    .into_iter()
    .map(|(key, total)| (key, total / n as f64))
    .collect();
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
    let cpu_before_changes = cpu();
    let syncer_cpu_before_changes = syncer_cpu();
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
        merge_patch(
            &consumer_widgets,
            &name,
            &json!({ "spec": { "size": size } }),
        )
        .await;
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
    let cpu_changes = cpu() - cpu_before_changes;
    let syncer_cpu_changes = syncer_cpu() - syncer_cpu_before_changes;
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
    println!(
        "  kbind-syncer requests per object:  {}",
        bulk_requests
            .iter()
            .map(|(key, n)| format!("{key} {n:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let throughput = |b: &Bulk| n as f64 / b.all_back.as_secs_f64();
    let kbind_bulk = Bulk {
        created,
        synced_up,
        all_back,
        control_planes,
    };
    if let Some(minimal) = &minimal {
        println!(
            "  the minimal client, same run:     {:>8.1?}  ({:.0} objects/s, statuses back)",
            minimal.all_back,
            throughput(minimal)
        );
        println!(
            "  kbind / minimal client:            {:>7.0} %  (goal >= 90 %)",
            100.0 * throughput(&kbind_bulk) / throughput(minimal)
        );
    }
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
    println!(
        "CPU, both programs: {:.2} ms per object synced in phase 1, {:.2} ms per change in phase 2",
        cpu_bulk * 1000.0 / n as f64,
        cpu_changes * 1000.0 / m
    );
    println!(
        "  of it the syncer: {:.2} ms per object, {:.2} ms per change; the schema manager: {:.2} and {:.2}",
        syncer_cpu_bulk * 1000.0 / n as f64,
        syncer_cpu_changes * 1000.0 / m,
        (cpu_bulk - syncer_cpu_bulk) * 1000.0 / n as f64,
        (cpu_changes - syncer_cpu_changes) * 1000.0 / m
    );
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
            "statusesBackObjectsPerSecond": throughput(&kbind_bulk),
            "syncerRequestsPerObject": bulk_requests,
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
        "cpuMs": {
            "perObjectSynced": cpu_bulk * 1000.0 / n as f64,
            "perChange": cpu_changes * 1000.0 / m,
            "syncerPerObjectSynced": syncer_cpu_bulk * 1000.0 / n as f64,
            "syncerPerChange": syncer_cpu_changes * 1000.0 / m,
        },
    });
    if let Some(minimal) = &minimal {
        report["minimalClient"] = json!({
            "allProviderCopiesSeconds": minimal.synced_up.as_secs_f64(),
            "allStatusesBackSeconds": minimal.all_back.as_secs_f64(),
            "statusesBackObjectsPerSecond": throughput(minimal),
            "kbindPercent": 100.0 * throughput(&kbind_bulk) / throughput(minimal),
            "goalPercent": 90.0,
        });
    }
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
        let cpu_before_idle = cpu();
        tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
        let after = snapshot().await;
        let cpu_idle = (cpu() - cpu_before_idle) * 60.0 / args.idle_secs as f64;
        let kbind = per_minute(&before.0, &after.0, args.idle_secs);
        let consumer = per_minute(&before.1, &after.1, args.idle_secs);
        let provider = per_minute(&before.2, &after.2, args.idle_secs);
        println!("at rest, per minute over {} s:", args.idle_secs);
        println!("  kbind's requests (both programs, by cluster and verb): {kbind:?}");
        println!("  consumer API server, every client (by verb and resource): {consumer:?}");
        println!("  provider API server, every client (by verb and resource): {provider:?}");
        println!(
            "  CPU at rest, both programs: {:.0} ms per minute",
            cpu_idle * 1000.0
        );
        report["atRestPerMinute"] = json!({
            "cpuMs": cpu_idle * 1000.0,
            "kbindByClusterVerb": kbind,
            "consumerApiServer": consumer,
            "providerApiServer": provider,
        });
    }
    if args.restart {
        // A restart of the syncer: it lists everything again, is ready, and a change made right
        // after the restart is synced — with no write but that change's own.
        use kbind_e2e::kbind::{apiserver_writes, new_writes};
        let (consumer, provider) = (s.consumer.clone(), s.provider.clone());
        let writes = async || {
            (
                apiserver_writes(&consumer).await.unwrap_or_default(),
                apiserver_writes(&provider).await.unwrap_or_default(),
            )
        };
        let writes_before = writes().await;
        let before = rss_mib(s.env.process_ref(s.syncer.index).pid());
        let started = Instant::now();
        s.restart_syncer("syncer-0-restarted", &[]).await;
        let target = 1_000_000_i64;
        merge_patch(
            &consumer_widgets,
            "w0",
            &json!({ "spec": { "size": target } }),
        )
        .await;
        let probes = s.syncer.probes.clone();
        let ready = tokio::spawn(async move {
            loop {
                if let Ok((200, _)) = kbind_e2e::kbind::http_get(&probes, "/readyz").await {
                    return started.elapsed();
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        eventually(
            "the change after the restart",
            Duration::from_secs(600),
            || async {
                let copy = provider_widgets
                    .get("w0")
                    .await
                    .map_err(|e| e.to_string())?;
                Ok((copy.data["spec"]["size"] == target).then_some(()))
            },
        )
        .await
        .unwrap();
        let caught_up = started.elapsed();
        let ready = ready.await.unwrap_or_default();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let pid = s.env.process_ref(s.syncer.index).pid();
        let (after, peak) = (rss_mib(pid), peak_rss_mib(pid));
        // As both API servers count them (Lease renewals aside): the change's own are the
        // benchmark's patch and kbind's status write on the consumer, kbind's apply and the
        // stand-in controller's status write on the provider.
        let writes_after = writes().await;
        let consumer_writes = new_writes(&writes_before.0, &writes_after.0);
        let provider_writes = new_writes(&writes_before.1, &writes_after.1);
        let total = |w: &std::collections::BTreeMap<String, u64>,
                     b: &std::collections::BTreeMap<String, u64>| {
            w.iter()
                .map(|(k, n)| n - b.get(k).copied().unwrap_or_default())
                .sum::<u64>()
        };
        let writes =
            total(&writes_after.0, &writes_before.0) + total(&writes_after.1, &writes_before.1);
        // The floor: what any client that starts must do before it knows what to write — read
        // both sides (the same streaming lists, both at once), parse every object and keep none.
        // Twice each, alternating, the quicker of each kept (a second read finds the API servers'
        // caches warmer).
        let (mut floor, mut paged) = (Duration::MAX, Duration::MAX);
        for _ in 0..2 {
            floor = floor.min(list_both(&consumer_widgets, &provider_widgets, true).await);
            paged = paged.min(list_both(&consumer_widgets, &provider_widgets, false).await);
        }
        println!("restart of the syncer at {n} objects:");
        println!("  ready after                       {ready:>8.1?}");
        println!("  a change made at the restart synced after {caught_up:>8.1?}  (goal <= 10 s)");
        println!(
            "  a minimal client reads both sides in {floor:>8.1?}  (kbind / minimal {:.2})",
            caught_up.as_secs_f64() / floor.as_secs_f64()
        );
        println!("  (with paged lists instead: {paged:>8.1?})");
        println!(
            "  writes, both API servers: {writes}  (the change's own: 4 — goal: nothing else); consumer {consumer_writes:?}, provider {provider_writes:?}"
        );
        println!(
            "  peak RSS {peak:.1} MiB, then {after:.1} MiB; before the restart {before:.1} MiB  (peak / steady {:.2}, goal <= 1.2)",
            peak / before
        );
        report["restart"] = json!({
            "readySeconds": ready.as_secs_f64(),
            "caughtUpSeconds": caught_up.as_secs_f64(),
            "caughtUpGoalSeconds": 10.0,
            "minimalReadBothSidesSeconds": floor.as_secs_f64(),
            "minimalReadBothSidesPagedSeconds": paged.as_secs_f64(),
            "writes": writes,
            "writesOfTheChange": 4,
            "consumerWrites": consumer_writes,
            "providerWrites": provider_writes,
            "peakMiB": peak,
            "steadyAfterMiB": after,
            "steadyBeforeMiB": before,
            "peakOverSteady": peak / before,
            "peakOverSteadyGoal": 1.2,
        });
    }
    if args.delete {
        let started = Instant::now();
        consumer_widgets
            .delete_collection(&Default::default(), &ListParams::default())
            .await
            .expect("delete every Widget");
        wait_empty(
            &provider_widgets,
            "every provider copy gone",
            Duration::from_secs(1800),
            false,
        )
        .await;
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
