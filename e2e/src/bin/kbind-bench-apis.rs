//! Benchmark of many APIs and Connections on two real clusters (issue #15, goal 4). Prints
//! figures beside their goals and asserts nothing about time.
//!
//! One provider cluster exports `--apis` CRDs; the consumer has `--connections` Connections to
//! it (several Connections per provider cluster stand in for as many providers: each pins the
//! same cluster, discovers all exports and binds its own share of the APIs with its own
//! ClusterBinding), and `--objects` objects of each API. It prints how long setup and the bulk
//! sync take, memory per API and per object, the watches the syncer holds per API, and then
//! restarts both programs: the time from their start until every object is reported synced
//! again and a change made at the start has reached the provider, and the writes meanwhile.
//! Before the restart, one provider CRD gains a field: the time until the consumer CRD has it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::fixtures::*;
use kbind_e2e::kbind::{http_get, install_crds, new_writes};
use kbind_e2e::measure::{kbind_requests_by, object_writes, peak_rss_mib, per_minute, rss_mib};
use kbind_e2e::sharding::{object, resource};
use kbind_e2e::{TestEnv, eventually};
use kbind_shared::api::{ClusterBinding, ClusterBindingSpec, SchemaSource};
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

#[derive(Parser)]
#[command(name = "kbind-bench-apis")]
struct Args {
    /// Connections (all to the one provider cluster).
    #[arg(long, default_value_t = 20)]
    connections: usize,
    /// Exported and bound APIs, shared out among the Connections.
    #[arg(long, default_value_t = 200)]
    apis: usize,
    /// Objects per API.
    #[arg(long, default_value_t = 50)]
    objects: usize,
    /// Seconds at rest (after the bulk sync) over which kbind's own requests are counted.
    #[arg(long, default_value_t = 60)]
    idle_secs: u64,
    /// Write every figure here as JSON.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

/// kbind's requests so far (`kbind_api_requests_total`) by `"<cluster> <verb>"`.
async fn kbind_requests(program: &Program) -> BTreeMap<String, f64> {
    kbind_requests_by(&program.metrics().await.unwrap_or_default())
}

const NAMESPACE: &str = "bench";

fn kind(i: usize) -> String {
    format!("Kind{i:03}")
}

/// Objects the syncer reports synced (`kbind_synced_objects`, every API).
async fn synced(syncer: &Program) -> f64 {
    syncer
        .metrics()
        .await
        .map(|text| metric_sum(&text, "kbind_synced_objects", &[]))
        .unwrap_or_default()
}

/// Open watches of `example.org` resources an API server serves (every client's).
async fn example_watches(client: &Client) -> f64 {
    let text = kbind_e2e::kbind::apiserver_metrics(client)
        .await
        .unwrap_or_default();
    metric_sum(
        &text,
        "apiserver_longrunning_requests",
        &[("group", "example.org"), ("verb", "WATCH")],
    )
}

async fn start_programs(env: &mut TestEnv, suffix: &str) -> (Program, Program) {
    // Production intervals: the figures are those of a deployed kbind, not of the test speed-ups.
    let manager = start_schema_manager(
        env,
        "consumer",
        &format!("schema-manager{suffix}"),
        &[
            "--leader-elect=false",
            "--discovery-interval=30s",
            "--binding-resync-interval=30s",
            "--log-level=info",
        ],
    )
    .await
    .unwrap();
    let syncer = start_syncer(
        env,
        "consumer",
        &format!("syncer-0{suffix}"),
        &[
            "--identity=syncer-0",
            "--membership-lease-duration=15s",
            "--log-level=info",
        ],
    )
    .await
    .unwrap();
    (manager, syncer)
}

/// Waits (at most `limit`) until the syncer reports `total` objects synced.
async fn all_synced(syncer: &Program, total: usize, limit: Duration) {
    eventually("every object synced", limit, || async {
        let n = synced(syncer).await;
        Ok((n as usize >= total).then_some(()))
    })
    .await
    .unwrap();
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let connections = args.connections.max(1);
    let apis = args.apis.max(connections);
    let total = apis * args.objects;
    let mut env = TestEnv::start("bench_apis", &["consumer", "provider"])
        .await
        .expect("clusters start");
    let consumer = env.cluster("consumer").admin_client().await.unwrap();
    let provider = env.cluster("provider").admin_client().await.unwrap();
    install_crds(&consumer).await.unwrap();
    println!(
        "kbind many-APIs benchmark on two real clusters (this machine: {} cores)",
        std::thread::available_parallelism()
            .map(|p| p.get())
            .unwrap_or(0)
    );
    println!(
        "workload: {connections} Connections to one provider cluster, {apis} APIs ({} per Connection), {} objects each = {total} objects",
        apis / connections,
        args.objects
    );
    let started = Instant::now();
    futures::stream::iter(0..apis)
        .map(|i| {
            let provider = provider.clone();
            async move {
                let kind = kind(i);
                install_crd(
                    &provider,
                    &crd(
                        &format!("{}s", kind.to_lowercase()),
                        "example.org",
                        &kind,
                        &[("core.kbind.io/exported", "true")],
                    ),
                )
                .await
            }
        })
        .buffer_unordered(4)
        .try_collect::<Vec<_>>()
        .await
        .expect("the provider's CRDs");
    println!(
        "  {apis} exported CRDs on the provider in {:.1?}",
        started.elapsed()
    );

    let (mut manager, mut syncer) = start_programs(&mut env, "").await;
    syncer.wait_ready("the syncer", 60).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pids = |env: &TestEnv, manager: &Program, syncer: &Program| {
        (
            env.process_ref(manager.index).pid(),
            env.process_ref(syncer.index).pid(),
        )
    };
    let (manager_pid, syncer_pid) = pids(&env, &manager, &syncer);
    let base = (rss_mib(manager_pid), rss_mib(syncer_pid));

    // Setup: the Secret, the Connections and one ClusterBinding each.
    put_secret(
        &consumer,
        "p",
        "kubeconfig",
        env.cluster("provider").admin_kubeconfig().as_bytes(),
    )
    .await
    .unwrap();
    let started = Instant::now();
    let per = apis / connections;
    let bindings: Api<ClusterBinding> = Api::all(consumer.clone());
    for c in 0..connections {
        let name = format!("conn-{c:02}");
        create_connection(&consumer, &connection(&name, "p", SchemaSource::Crd))
            .await
            .unwrap();
        let last = if c + 1 == connections {
            apis
        } else {
            (c + 1) * per
        };
        let names: Vec<String> = (c * per..last)
            .map(|i| format!("{}s.example.org", kind(i).to_lowercase()))
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        bindings
            .create(
                &PostParams::default(),
                &ClusterBinding::new(&name, ClusterBindingSpec::from(binding_spec(&name, &names))),
            )
            .await
            .unwrap();
    }
    for c in 0..connections {
        let name = format!("conn-{c:02}");
        eventually(
            &format!("ClusterBinding {name} Ready"),
            Duration::from_secs(900),
            || async {
                let binding = bindings.get(&name).await.map_err(|e| e.to_string())?;
                let ready = binding.status.as_ref().is_some_and(|s| {
                    kbind_shared::conditions::find(&s.conditions, "Ready")
                        .is_some_and(|c| c.status == "True")
                });
                Ok(ready.then_some(()))
            },
        )
        .await
        .unwrap();
    }
    let setup = started.elapsed();
    println!(
        "  {connections} Connections and ClusterBindings Ready, {apis} CRDs installed on the consumer in {setup:.1?}"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let bound = (rss_mib(manager_pid), rss_mib(syncer_pid));

    // Bulk: every object created on the consumer, and synced.
    ensure_namespace(&consumer, NAMESPACE).await.unwrap();
    let started = Instant::now();
    let objects: Vec<(usize, usize)> = (0..apis)
        .flat_map(|a| (0..args.objects).map(move |o| (a, o)))
        .collect();
    futures::stream::iter(objects)
        .map(|(a, o)| {
            let api: Api<DynamicObject> =
                Api::namespaced_with(consumer.clone(), NAMESPACE, &resource(&kind(a)));
            async move {
                api.create(
                    &PostParams::default(),
                    &object(&kind(a), &format!("o{o}"), 1),
                )
                .await
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .expect("creates");
    all_synced(&syncer, total, Duration::from_secs(1800)).await;
    let bulk = started.elapsed();
    println!(
        "  {total} objects created and synced in {bulk:.1?} ({:.0} objects/s)",
        total as f64 / bulk.as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let steady = (rss_mib(manager_pid), rss_mib(syncer_pid));

    // At rest: what each program still asks the API servers for (watches are one request each,
    // counted when they start; Lease renewals are included).
    let idle_before = (
        kbind_requests(&manager).await,
        kbind_requests(&syncer).await,
    );
    tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
    let idle = (
        per_minute(
            &idle_before.0,
            &kbind_requests(&manager).await,
            args.idle_secs,
        ),
        per_minute(
            &idle_before.1,
            &kbind_requests(&syncer).await,
            args.idle_secs,
        ),
    );

    // A provider schema change under this load: the first API's provider CRD declares a field that
    // may hold anything (so compatible), and the time until the consumer CRD shows it is printed.
    let schema_change = {
        let crd_name = format!("{}s.example.org", kind(0).to_lowercase());
        let patch = json!({ "spec": { "versions": [{
            "name": "v1", "served": true, "storage": true, "subresources": { "status": {} },
            "schema": { "openAPIV3Schema": { "type": "object", "properties": {
                "spec": { "type": "object", "x-kubernetes-preserve-unknown-fields": true,
                          "properties": { "note": {
                              "x-kubernetes-preserve-unknown-fields": true,
                              "description": "added by kbind-bench-apis" } } },
                "status": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
            } } },
        }] } });
        let crds: Api<CustomResourceDefinition> = Api::all(provider.clone());
        let consumer_crds: Api<CustomResourceDefinition> = Api::all(consumer.clone());
        let started = Instant::now();
        crds.patch(&crd_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("the provider CRD changes");
        eventually(
            "the provider's schema change on the consumer",
            Duration::from_secs(120),
            || async {
                let crd = consumer_crds
                    .get(&crd_name)
                    .await
                    .map_err(|e| e.to_string())?;
                let spec = serde_json::to_value(&crd.spec.versions[0].schema)
                    .map_err(|e| e.to_string())?;
                Ok(
                    (!spec["openAPIV3Schema"]["properties"]["spec"]["properties"]["note"]
                        .is_null())
                    .then_some(()),
                )
            },
        )
        .await
        .map(|()| started.elapsed())
        .ok()
    };

    // The syncer's watches: what the API servers serve with it running, less without it.
    let watches_with = (
        example_watches(&consumer).await,
        example_watches(&provider).await,
    );
    let writes_before = object_writes(&consumer, &provider).await;
    let watches = async || {
        tokio::time::sleep(Duration::from_secs(3)).await;
        example_watches(&consumer).await + example_watches(&provider).await
    };
    env.process(syncer.index).kill();
    let without_syncer = watches().await;
    env.process(manager.index).kill();
    let without_either = watches().await;
    let syncer_watches = watches_with.0 + watches_with.1 - without_syncer;
    let manager_watches = without_syncer - without_either;

    // Restart both programs; a change made at once must reach the provider.
    let started = Instant::now();
    (manager, syncer) = start_programs(&mut env, "-restarted").await;
    let first: Api<DynamicObject> =
        Api::namespaced_with(consumer.clone(), NAMESPACE, &resource(&kind(0)));
    let provider_first: Api<DynamicObject> =
        Api::namespaced_with(provider.clone(), NAMESPACE, &resource(&kind(0)));
    merge_patch(&first, "o0", &json!({ "spec": { "value": 2 } })).await;
    let probes = syncer.probes.clone();
    let ready = tokio::spawn(async move {
        loop {
            if let Ok((200, _)) = http_get(&probes, "/readyz").await {
                return started.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let change = async {
        eventually(
            "the change at the restart",
            Duration::from_secs(600),
            || async {
                let copy = provider_first.get("o0").await.map_err(|e| e.to_string())?;
                Ok((copy.data["spec"]["value"] == 2).then_some(()))
            },
        )
        .await
        .unwrap();
        started.elapsed()
    };
    let every = async {
        all_synced(&syncer, total, Duration::from_secs(600)).await;
        started.elapsed()
    };
    let (change, every) = tokio::join!(change, every);
    let ready = ready.await.unwrap_or_default();
    let caught_up = change.max(every);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (manager_pid, syncer_pid) = pids(&env, &manager, &syncer);
    let after = (rss_mib(manager_pid), rss_mib(syncer_pid));
    let peak = (peak_rss_mib(manager_pid), peak_rss_mib(syncer_pid));
    let writes_after = object_writes(&consumer, &provider).await;
    // The change's own: the benchmark's patch and kbind's status write on the consumer, kbind's
    // apply on the provider.
    let writes: Vec<String> = ["consumer", "provider"]
        .iter()
        .enumerate()
        .flat_map(|(i, side)| {
            new_writes(&writes_before[i], &writes_after[i])
                .into_iter()
                .map(move |w| format!("{side} {w}"))
        })
        .collect();

    let per_api_kib = |now: f64, before: f64| (now - before) * 1024.0 / apis as f64;
    let per_object_kib = |now: f64, before: f64| (now - before) * 1024.0 / total.max(1) as f64;
    println!("memory (RSS, MiB)          schema manager   syncer");
    println!(
        "  no Connection               {:>8.1}  {:>8.1}",
        base.0, base.1
    );
    println!(
        "  {apis} APIs bound, no object  {:>8.1}  {:>8.1}   per API {:.0} KiB + {:.0} KiB",
        bound.0,
        bound.1,
        per_api_kib(bound.0, base.0),
        per_api_kib(bound.1, base.1)
    );
    println!(
        "  {total} objects synced       {:>8.1}  {:>8.1}   per object {:.2} KiB together",
        steady.0,
        steady.1,
        per_object_kib(steady.0 + steady.1, bound.0 + bound.1)
    );
    println!(
        "watches of the APIs' objects, both clusters: the syncer {syncer_watches:.0} for {apis} APIs = {:.2} per API  (goal <= 2); the schema manager {manager_watches:.0} = {:.2} per API",
        syncer_watches / apis as f64,
        manager_watches / apis as f64
    );
    println!(
        "at rest, kbind's requests per minute over {} s (by cluster and verb; Lease renewals included):",
        args.idle_secs
    );
    println!("  schema manager: {:?}", idle.0);
    println!("  syncer:         {:?}", idle.1);
    match schema_change {
        Some(took) => println!(
            "a provider schema change (a new field) on the consumer CRD after {took:>8.2?}  (goal <= 2 s, 30 s intervals)"
        ),
        None => {
            println!("a provider schema change (a new field) NOT on the consumer CRD within 120 s")
        }
    }
    println!("restart of both programs at {apis} APIs, {total} objects:");
    println!("  syncer ready after                {ready:>8.1?}");
    println!(
        "  every object reported synced and a change made at the start synced after {caught_up:>8.1?}  (goal <= 30 s)"
    );
    println!(
        "  writes meanwhile (the change's own: its PATCH and kbind's status write on the consumer, kbind's APPLY on the provider): {}",
        if writes.is_empty() {
            "none".to_owned()
        } else {
            writes.join(", ")
        }
    );
    println!(
        "  peak RSS {:.1} + {:.1} MiB, then {:.1} + {:.1} MiB (peak / steady {:.2})",
        peak.0,
        peak.1,
        after.0,
        after.1,
        (peak.0 + peak.1) / (after.0 + after.1).max(1.0)
    );
    if let Some(path) = &args.json {
        let report = json!({
            "connections": connections,
            "apis": apis,
            "objects": total,
            "setupSeconds": setup.as_secs_f64(),
            "bulkSeconds": bulk.as_secs_f64(),
            "rssMiB": {
                "noConnection": { "schemaManager": base.0, "syncer": base.1 },
                "bound": { "schemaManager": bound.0, "syncer": bound.1 },
                "synced": { "schemaManager": steady.0, "syncer": steady.1 },
            },
            "perApiKiB": {
                "schemaManager": per_api_kib(bound.0, base.0),
                "syncer": per_api_kib(bound.1, base.1),
            },
            "perObjectKiB": per_object_kib(steady.0 + steady.1, bound.0 + bound.1),
            "atRestPerMinute": { "schemaManager": idle.0, "syncer": idle.1 },
            "syncerWatches": syncer_watches,
            "syncerWatchesPerApi": syncer_watches / apis as f64,
            "schemaManagerWatches": manager_watches,
            "schemaChangeSeconds": schema_change.map(|d| d.as_secs_f64()),
            "restart": {
                "readySeconds": ready.as_secs_f64(),
                "allSyncedSeconds": every.as_secs_f64(),
                "changeSyncedSeconds": change.as_secs_f64(),
                "goalSeconds": 30,
                "writes": writes,
                "peakMiB": { "schemaManager": peak.0, "syncer": peak.1 },
                "afterMiB": { "schemaManager": after.0, "syncer": after.1 },
            },
        });
        std::fs::write(path, serde_json::to_string_pretty(&report).unwrap())
            .expect("write the report");
    }
}
