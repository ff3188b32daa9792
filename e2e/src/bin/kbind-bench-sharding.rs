//! Benchmark of sharded syncers on two real clusters. Prints figures; asserts nothing about time.
//!
//! A fixed workload (APIs × namespaces × objects, each API split into namespace buckets) is synced
//! by N = 1, 2, 3, 4 fresh syncer replicas in turn; for each N it prints units and objects per
//! replica (max/min) and each replica's RSS. Then, with three replicas running, a fourth joins and
//! later one is SIGKILLed: it prints the time until every unit has exactly one owner again and
//! the writes both API servers served to the synced objects meanwhile (zero is right: nothing
//! changed).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::fixtures::*;
use kbind_e2e::kbind::metric_sum;
use kbind_e2e::kbind::{install_crds, new_writes};
use kbind_e2e::measure::{anon_rss_mib, object_writes, rss_mib};
use kbind_e2e::sharding::{
    assignment_quiet, connect_and_bind_all, export_kinds, object, owners, resource, running,
};
use kbind_e2e::{TestEnv, eventually};
use kube::api::{DynamicObject, PostParams};
use kube::{Api, Client};

const KINDS: [&str; 6] = ["Alpha", "Bravo", "Charlie", "Delta", "Echo", "Foxtrot"];

#[derive(Parser)]
#[command(name = "kbind-bench-sharding")]
struct Args {
    /// Bound APIs (at most 6).
    #[arg(long, default_value_t = 6)]
    apis: usize,
    /// Namespaces holding objects.
    #[arg(long, default_value_t = 8)]
    namespaces: usize,
    /// Objects per API and namespace.
    #[arg(long, default_value_t = 25)]
    objects: usize,
    /// Namespace buckets per API (`--namespace-buckets`).
    #[arg(long, default_value_t = 4)]
    buckets: u32,
    /// Largest replica count.
    #[arg(long, default_value_t = 4)]
    max_replicas: usize,
    /// Write every figure here as JSON.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

/// The largest over the smallest of `values` (1 when there is at most one, or a zero).
fn spread(values: &[f64]) -> f64 {
    let max = values.iter().cloned().fold(f64::MIN, f64::max);
    let min = values.iter().cloned().fold(f64::MAX, f64::min);
    if values.len() < 2 || min <= 0.0 {
        return if values.len() < 2 { 1.0 } else { f64::INFINITY };
    }
    max / min
}

/// Waits until every unit has exactly one live owner and `members` syncers run some.
async fn settled(consumer: &Client, units: &BTreeSet<String>, members: usize) -> Duration {
    let started = Instant::now();
    eventually(
        "every unit to have one owner",
        Duration::from_secs(120),
        || async {
            let running = running(consumer).await;
            let owners = owners(&running);
            let busy = running.values().filter(|u| !u.is_empty()).count();
            Ok((busy == members
                && units
                    .iter()
                    .all(|u| owners.get(u).is_some_and(|o| o.len() == 1)))
            .then_some(()))
        },
    )
    .await
    .unwrap();
    started.elapsed()
}

/// Waits until the replicas together report `total` objects synced; each one's count.
async fn all_synced(replicas: &[Program], total: usize, what: &str) -> Vec<f64> {
    eventually(what, Duration::from_secs(300), || async {
        let mut counts = Vec::new();
        for replica in replicas {
            counts.push(metric_sum(
                &replica.metrics().await?,
                "kbind_synced_objects",
            ));
        }
        let sum: f64 = counts.iter().sum();
        Ok((sum as usize == total).then_some(counts))
    })
    .await
    .unwrap()
}

fn write_delta(before: &[BTreeMap<String, u64>; 2], after: &[BTreeMap<String, u64>; 2]) -> String {
    let lines: Vec<String> = ["consumer", "provider"]
        .iter()
        .enumerate()
        .flat_map(|(i, side)| {
            new_writes(&before[i], &after[i])
                .into_iter()
                .map(move |w| format!("{side} {w}"))
        })
        .collect();
    if lines.is_empty() {
        "0".to_owned()
    } else {
        lines.join(", ")
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let kinds = &KINDS[..args.apis.clamp(1, KINDS.len())];
    let mut env = TestEnv::start("bench_sharding", &["consumer", "provider"])
        .await
        .expect("clusters start");
    let consumer = env.cluster("consumer").admin_client().await.unwrap();
    let provider = env.cluster("provider").admin_client().await.unwrap();
    install_crds(&consumer).await.unwrap();
    export_kinds(&provider, kinds).await;
    let buckets = format!("--namespace-buckets={}", args.buckets);
    let manager = start_lone_schema_manager(&mut env, &[&buckets]).await;
    let apis = connect_and_bind_all(&env, &consumer, kinds).await;
    let namespaces: Vec<String> = (0..args.namespaces).map(|i| format!("ns-{i}")).collect();
    for namespace in &namespaces {
        ensure_namespace(&consumer, namespace).await.unwrap();
    }
    let mut objects = Vec::new();
    for kind in kinds {
        for namespace in &namespaces {
            for i in 0..args.objects {
                objects.push((*kind, namespace.clone(), format!("o{i}")));
            }
        }
    }
    let total = objects.len();
    futures::stream::iter(objects)
        .map(|(kind, namespace, name)| {
            let api: Api<DynamicObject> =
                Api::namespaced_with(consumer.clone(), &namespace, &resource(kind));
            async move {
                api.create(&PostParams::default(), &object(kind, &name, 1))
                    .await
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .expect("creates");
    let units: BTreeSet<String> = apis
        .iter()
        .flat_map(|api| {
            kbind_shared::shard::api_units("provider", api, args.buckets)
                .into_iter()
                .map(|u| u.to_string())
        })
        .collect();

    println!(
        "kbind sharding benchmark on two real clusters (kube-apiserver v1.36.3, this machine: {} cores)",
        std::thread::available_parallelism()
            .map(|p| p.get())
            .unwrap_or(0)
    );
    println!(
        "workload: {} APIs x {} namespaces x {} objects = {total} objects; {} buckets per API = {} units",
        kinds.len(),
        args.namespaces,
        args.objects,
        args.buckets,
        units.len()
    );
    println!(
        "{:>3}  {:>14}  {:>16}  {:>26}  {:>10}",
        "N", "units max/min", "objects max/min", "RSS per replica (MiB)", "settled in"
    );
    let mut generation = 0;
    let mut rows = Vec::new();
    let mut single_rss = 0.0;
    let mut single_anon = 0.0;
    for n in 1..=args.max_replicas {
        let started = Instant::now();
        let mut replicas = Vec::new();
        for _ in 0..n {
            generation += 1;
            let name = format!("syncer-{generation}");
            replicas.push(
                start_syncer(&mut env, "consumer", &name, &[])
                    .await
                    .unwrap(),
            );
        }
        settled(&consumer, &units, n).await;
        all_synced(&replicas, total, "every object synced").await;
        let took = started.elapsed();
        // The leader may still move units for their objects (the syncers report them every few
        // seconds): what is measured is where the placement settles.
        let balanced_in = assignment_quiet(&consumer, Duration::from_secs(12)).await;
        settled(&consumer, &units, n).await;
        let counts = all_synced(&replicas, total, "every object synced after the moves").await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let per_replica = running(&consumer).await;
        let unit_counts: Vec<usize> = per_replica.values().map(BTreeSet::len).collect();
        let rss_values: Vec<f64> = replicas
            .iter()
            .map(|r| rss_mib(env.process_ref(r.index).pid()))
            .collect();
        let rss: Vec<String> = rss_values.iter().map(|v| format!("{v:.1}")).collect();
        let rss_sum: f64 = rss_values.iter().sum();
        let anon_sum: f64 = replicas
            .iter()
            .map(|r| anon_rss_mib(env.process_ref(r.index).pid()))
            .sum();
        if n == 1 {
            single_rss = rss_sum;
            single_anon = anon_sum;
        }
        let units_spread = spread(&unit_counts.iter().map(|&u| u as f64).collect::<Vec<_>>());
        let objects_spread = spread(&counts);
        rows.push(serde_json::json!({
            "replicas": n,
            "unitsPerReplica": unit_counts,
            "objectsPerReplica": counts,
            "unitsSpread": units_spread,
            "objectsSpread": objects_spread,
            "spreadGoal": 1.25,
            "rssMiB": rss_values,
            "rssSumMiB": rss_sum,
            "rssSumOverSingle": rss_sum / single_rss,
            "rssSumOverSingleGoal": 1.2,
            "anonRssSumMiB": anon_sum,
            "anonRssSumOverSingle": anon_sum / single_anon,
            "settledSeconds": took.as_secs_f64(),
            "placementQuietAfterSeconds": balanced_in.as_secs_f64(),
        }));
        println!(
            "{n:>3}  {:>14}  {:>16}  {:>26}  {:>9.1?}",
            format!(
                "{}/{}",
                unit_counts.iter().max().unwrap_or(&0),
                unit_counts.iter().min().unwrap_or(&0)
            ),
            format!(
                "{:.0}/{:.0}",
                counts.iter().cloned().fold(f64::MIN, f64::max),
                counts.iter().cloned().fold(f64::MAX, f64::min)
            ),
            rss.join(" "),
            took
        );
        if n > 1 {
            println!(
                "     placement last moved {balanced_in:.1?} after that; spread units {units_spread:.2}, objects {objects_spread:.2} (goal <= 1.25); RSS summed {rss_sum:.1} MiB = {:.2} x one replica's (goal <= 1.2); without the program file's pages {anon_sum:.1} MiB = {:.2} x",
                rss_sum / single_rss,
                anon_sum / single_anon
            );
        }
        if n < args.max_replicas {
            for replica in &replicas {
                env.process(replica.index).signal("TERM").unwrap();
            }
            for replica in &replicas {
                env.process(replica.index)
                    .wait_exit(Duration::from_secs(15))
                    .await;
            }
        }
    }

    // Rebalancing with the last set (max_replicas running): one leaves by SIGKILL, one joins.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = object_writes(&consumer, &provider).await;
    let victim = running(&consumer)
        .await
        .into_iter()
        .max_by_key(|(_, u)| u.len())
        .map(|(m, _)| m)
        .unwrap();
    let index = (0..)
        .map(|i| env.process_ref(i))
        .position(|p| p.name() == victim)
        .unwrap();
    env.process(index).kill();
    let after_death = settled(&consumer, &units, args.max_replicas - 1).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let death_writes = object_writes(&consumer, &provider).await;
    generation += 1;
    let joined_at = Instant::now();
    start_syncer(&mut env, "consumer", &format!("syncer-{generation}"), &[])
        .await
        .unwrap();
    settled(&consumer, &units, args.max_replicas).await;
    let after_join = joined_at.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let join_writes = object_writes(&consumer, &provider).await;
    println!("rebalance (membership Lease 3 s, assignment round ≤ 0.5 s):");
    println!(
        "  a member SIGKILLed: every unit owned again after {after_death:.1?}; object writes meanwhile: {}",
        write_delta(&before, &death_writes)
    );
    println!(
        "  a member joins:     every unit owned again after {after_join:.1?}; object writes meanwhile: {}",
        write_delta(&death_writes, &join_writes)
    );
    let manager_rss = rss_mib(env.process_ref(manager.index).pid());
    println!(
        "schema manager RSS: {manager_rss:.1} MiB ({} APIs bound, {total} objects)",
        kinds.len()
    );
    if let Some(path) = &args.json {
        let report = serde_json::json!({
            "schemaManagerRssMiB": manager_rss,
            "apis": kinds.len(),
            "namespaces": args.namespaces,
            "objects": total,
            "bucketsPerApi": args.buckets,
            "units": units.len(),
            "replicaCounts": rows,
            "rebalance": {
                "afterKillSeconds": after_death.as_secs_f64(),
                "objectWritesAfterKill": write_delta(&before, &death_writes),
                "afterJoinSeconds": after_join.as_secs_f64(),
                "objectWritesAfterJoin": write_delta(&death_writes, &join_writes),
            },
        });
        std::fs::write(path, format!("{report:#}\n")).expect("write the JSON report");
    }
}
