//! Benchmark of `kbind-reaper`'s cost on a real provider holding many managed objects. Prints the
//! reaper's requests per sweep at rest and per deleted object while it reaps; asserts nothing
//! about time.
//!
//! One provider cluster holds `--objects` Widget copies spread evenly over `--consumers`
//! simulated consumers, each with a heartbeat Lease in kbind's form (renewed every
//! `--renew-secs`) that its copies record, in a namespace of its own. The reaper (this build's,
//! with the provider admin's credential) sweeps a `Delete` policy. First, `--idle-secs` with every
//! consumer alive: the reaper's requests per sweep. Then `--dead` consumers stop renewing: the
//! requests from then until their copies and namespaces are gone, per deleted object.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use kbind_e2e::cluster::{ensure_namespace, free_port};
use kbind_e2e::fixtures::*;
use kbind_e2e::measure::{grown, kbind_requests_at};
use kbind_e2e::{TestEnv, eventually};
use kbind_shared::api::reaper::ReaperPolicy;
use kbind_shared::keys;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, CustomResourceExt};
use serde_json::json;

#[derive(Parser)]
#[command(name = "kbind-bench-reaper")]
struct Args {
    /// Managed objects (Widget copies) on the provider.
    #[arg(long, default_value_t = 200_000)]
    objects: usize,
    /// Consumers they belong to, each with one heartbeat.
    #[arg(long, default_value_t = 200)]
    consumers: usize,
    /// Consumers that die after the idle phase.
    #[arg(long, default_value_t = 2)]
    dead: usize,
    /// How often the live consumers renew.
    #[arg(long, default_value_t = 5)]
    renew_secs: u64,
    /// Seconds at rest over which the sweeps' requests are counted.
    #[arg(long, default_value_t = 90)]
    idle_secs: u64,
    /// The policy's delete budget.
    #[arg(long, default_value_t = 6000)]
    deletes_per_minute: u32,
    /// Concurrent creates while filling the provider.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
}

fn uid(i: usize) -> String {
    format!("{i:05}-bench-consumer")
}

fn namespace(i: usize) -> String {
    format!("c-{i:05}")
}

async fn renew(provider: &Client, i: usize) {
    let uid = uid(i);
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(jiff::Timestamp::now());
    let body = kbind_shared::heartbeat::lease_body("p", &uid, 1, None, None, &now);
    let _ = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(provider.clone(), "kbind")
        .patch(
            &kbind_shared::heartbeat::lease_name("p", &uid),
            &PatchParams::apply("bench").force(),
            &Patch::Apply(&body),
        )
        .await;
}

fn total(requests: &BTreeMap<String, f64>) -> f64 {
    requests.values().sum()
}

async fn sweeps(provider: &Client) -> Option<String> {
    Api::<ReaperPolicy>::all(provider.clone())
        .get("default")
        .await
        .ok()?
        .status?
        .last_sweep
        .map(|t| t.0.to_string())
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let per_consumer = args.objects.div_ceil(args.consumers.max(1));
    println!(
        "kbind-reaper benchmark on a real provider: {} objects over {} consumers ({per_consumer} each), {} to die",
        args.objects, args.consumers, args.dead
    );
    let mut env = TestEnv::start("bench-reaper", &["provider"]).await.unwrap();
    let provider = env.cluster("provider").admin_client().await.unwrap();
    install_crd(&provider, &widget_crd()).await.unwrap();
    ensure_namespace(&provider, "kbind").await.unwrap();
    ensure_namespace(&provider, "kbind-reaper").await.unwrap();
    let crds = ReaperPolicy::crd();
    kbind_e2e::fixtures::apply_manifest(&provider, &serde_yaml::to_string(&crds).unwrap())
        .await
        .unwrap();
    kbind_e2e::kbind::wait_established(
        &Api::all(provider.clone()),
        "reaperpolicies.reaper.kbind.io",
    )
    .await
    .unwrap();

    // Fill the provider.
    let filled = Instant::now();
    for i in 0..args.consumers {
        create_marked_namespace(&provider, &namespace(i), &uid(i)).await;
        renew(&provider, i).await;
    }
    let work: Vec<(usize, usize)> = (0..args.consumers)
        .flat_map(|i| (0..per_consumer).map(move |j| (i, j)))
        .take(args.objects)
        .collect();
    let created = futures::stream::iter(work)
        .map(|(i, j)| {
            let provider = provider.clone();
            async move {
                let ns = namespace(i);
                let mut object = widget(&format!("w-{j:06}"), 1);
                object.metadata.namespace = Some(ns.clone());
                object.metadata.labels =
                    Some([(keys::MANAGED_LABEL.to_owned(), keys::TRUE.to_owned())].into());
                object.metadata.annotations = Some(
                    [
                        (keys::CONSUMER_CLUSTER_UID_ANNOTATION.to_owned(), uid(i)),
                        (
                            keys::CONSUMER_OBJECT_UID_ANNOTATION.to_owned(),
                            format!("o-{j}"),
                        ),
                        (
                            keys::HEARTBEAT_ANNOTATION.to_owned(),
                            kbind_shared::heartbeat::record(Some("kbind"), "p", &uid(i)),
                        ),
                    ]
                    .into(),
                );
                let api: Api<DynamicObject> =
                    Api::namespaced_with(provider, &ns, &widget_resource());
                for _ in 0..5 {
                    match api.create(&PostParams::default(), &object).await {
                        Ok(_) => return 1usize,
                        Err(kube::Error::Api(s)) if s.is_already_exists() => return 1,
                        Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                    }
                }
                0
            }
        })
        .buffer_unordered(args.concurrency)
        .fold(0usize, |n, one| async move {
            let n = n + one;
            if n % 20_000 == 0 {
                eprintln!("  {n} objects created");
            }
            n
        })
        .await;
    println!(
        "filled: {created} objects in {:.0}s",
        filled.elapsed().as_secs_f64()
    );

    // The consumers' heartbeats.
    let alive: std::sync::Arc<Vec<std::sync::atomic::AtomicBool>> =
        std::sync::Arc::new((0..args.consumers).map(|_| true.into()).collect());
    let renewer = {
        let (alive, provider) = (alive.clone(), provider.clone());
        let every = Duration::from_secs(args.renew_secs);
        tokio::spawn(async move {
            loop {
                for (i, a) in alive.iter().enumerate() {
                    if a.load(std::sync::atomic::Ordering::Relaxed) {
                        renew(&provider, i).await;
                    }
                }
                tokio::time::sleep(every).await;
            }
        })
    };

    // The reaper, on Delete.
    let stale_after = (args.renew_secs * 10).max(30);
    kbind_e2e::fixtures::create_reaper_policy(
        &provider,
        json!({
            "leaseNamespaces": ["kbind"],
            "staleAfter": format!("{stale_after}s"),
            "deleteAfter": "1s",
            "action": "Delete",
            "apis": ["widgets.example.org"],
            "includeNamespaces": true,
            "deletesPerMinute": args.deletes_per_minute,
        }),
    )
    .await;
    let metrics = format!("127.0.0.1:{}", free_port());
    let kubeconfig = env.cluster("provider").admin_kubeconfig_path();
    env.start_kbind(
        "kbind-reaper",
        "reaper",
        &[
            format!("--kubeconfig={}", kubeconfig.display()),
            "--namespace=kbind-reaper".into(),
            format!("--metrics-bind-address={metrics}"),
            format!("--health-probe-bind-address=127.0.0.1:{}", free_port()),
            "--leader-elect=false".into(),
        ],
        &[],
    )
    .unwrap();
    eventually(
        "the reaper's first sweep",
        Duration::from_secs(600),
        || async { Ok(sweeps(&provider).await) },
    )
    .await
    .unwrap();

    // At rest: every consumer alive. A sweep's requests come in a burst before it writes the
    // policy's status: counted between the first and the last status change seen, whole sweeps.
    let mut last = sweeps(&provider).await;
    let mut first: Option<BTreeMap<String, f64>> = None;
    let mut at_rest = BTreeMap::new();
    let mut whole = 0u32;
    let idle = Instant::now();
    while idle.elapsed() < Duration::from_secs(args.idle_secs) {
        let now = sweeps(&provider).await;
        if now != last {
            last = now;
            let requests = kbind_requests_at(&metrics).await;
            match &first {
                None => first = Some(requests),
                Some(start) => {
                    whole += 1;
                    at_rest = grown(start, &requests);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let per_sweep = f64::from(whole.max(1));
    println!(
        "at rest: {whole} whole sweeps in {}s; the reaper's requests per sweep: {:.1} ({}; lists count as get)",
        args.idle_secs,
        total(&at_rest) / per_sweep,
        at_rest
            .iter()
            .map(|(k, n)| format!("{k} {:.1}", n / per_sweep))
            .collect::<Vec<_>>()
            .join(", ")
    );

    // Some die: everything of theirs is deleted.
    let died = Instant::now();
    let before = kbind_requests_at(&metrics).await;
    for a in alive.iter().take(args.dead) {
        a.store(false, std::sync::atomic::Ordering::Relaxed);
    }
    let dead_objects = per_consumer.min(args.objects) * args.dead;
    for i in 0..args.dead {
        let api: Api<DynamicObject> =
            Api::namespaced_with(provider.clone(), &namespace(i), &widget_resource());
        eventually(
            "the dead consumer's copies to go",
            Duration::from_secs(3600),
            || async {
                let left = api
                    .list_metadata(&ListParams::default().limit(1))
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(left.items.is_empty().then_some(()))
            },
        )
        .await
        .unwrap();
    }
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(provider.clone());
    for i in 0..args.dead {
        eventually(
            "the dead consumer's namespace to go",
            Duration::from_secs(600),
            || async {
                let gone = namespaces
                    .get_opt(&namespace(i))
                    .await
                    .map_err(|e| e.to_string())?
                    .is_none_or(|n| n.metadata.deletion_timestamp.is_some());
                Ok(gone.then_some(()))
            },
        )
        .await
        .unwrap();
    }
    let reaping = grown(&before, &kbind_requests_at(&metrics).await);
    let deleted = dead_objects + args.dead;
    println!(
        "reaping: {dead_objects} copies and {} namespaces gone {:.0}s after their consumers died (staleAfter {stale_after}s, {} deletes/min)",
        args.dead,
        died.elapsed().as_secs_f64(),
        args.deletes_per_minute
    );
    println!(
        "  the reaper's requests per deleted object: {:.2} ({})",
        total(&reaping) / deleted as f64,
        reaping
            .iter()
            .map(|(k, n)| format!("{k} {n:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    renewer.abort();
}
