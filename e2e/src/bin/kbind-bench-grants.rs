//! Benchmark of `kbind-issuer`'s Grants on a real provider (#51): how long one Grant takes to be
//! issued and its bundle to be ready, how many Grants it provisions per second in a burst, what
//! it costs in memory and CPU per Grant, and what it asks of the API server at rest. Prints
//! figures; asserts nothing about time.
//!
//! The issuer (this build's) runs with its chart's RBAC and admission fence and its
//! ServiceAccount's token. First `--single` Grants one at a time, each timed from its create to
//! `Issued=True` and then to a minted token (the bundle's last step); then `--grants` created at
//! once (`--concurrency` in flight), timed until every one is issued; then `--idle-secs` at rest.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kbind_e2e::TestEnv;
use kbind_e2e::fixtures::*;
use kbind_e2e::measure::{cpu_seconds, kbind_requests_at, rss_mib};
use kbind_provider::issuer::{plan, rbac};
use kbind_shared::api::iam::Grant;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

#[derive(Parser)]
#[command(name = "kbind-bench-grants")]
struct Args {
    /// Grants created at once.
    #[arg(long, default_value_t = 5000)]
    grants: usize,
    /// Grants created one at a time first, each timed.
    #[arg(long, default_value_t = 10)]
    single: usize,
    /// Concurrent creates in the burst.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Seconds at rest over which the issuer's requests are counted.
    #[arg(long, default_value_t = 60)]
    idle_secs: u64,
}

fn grant_body(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "iam.kbind.io/v1alpha1",
        "kind": "Grant",
        "metadata": { "name": name },
        "spec": { "export": "widgets", "consumer": { "identity": name } },
    })
}

fn issued(grant: &Grant) -> bool {
    let Some(status) = grant.status.as_ref() else {
        return false;
    };
    status.observed_generation == grant.metadata.generation
        && kbind_shared::conditions::find(&status.conditions, plan::types::ISSUED)
            .is_some_and(|c| c.status == "True")
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    println!(
        "kbind-issuer Grants benchmark on a real provider: {} one at a time, then {} at once",
        args.single, args.grants
    );
    let mut env = TestEnv::start("bench-grants", &["provider"]).await.unwrap();
    let provider = env.cluster("provider").admin_client().await.unwrap();
    install_issuer_chart(&provider).await;
    install_crd(&provider, &widget_crd()).await.unwrap();
    let issuer = start_issuer(&mut env).await;
    let pid = env.process_ref(issuer.index).pid();
    Api::<kbind_shared::api::catalog::Export>::all(provider.clone())
        .patch(
            "widgets",
            &PatchParams::apply("bench").force(),
            &Patch::Apply(json!({
                "apiVersion": "catalog.kbind.io/v1alpha1",
                "kind": "Export",
                "metadata": { "name": "widgets" },
                "spec": { "title": "Widgets", "apis": [{ "name": "widgets.example.org" }] },
            })),
        )
        .await
        .unwrap();
    let grants = Api::<Grant>::all(provider.clone());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_empty = rss_mib(pid);

    // One at a time: create → Issued → a token minted (the bundle is ready).
    let mut issue_ms = Vec::new();
    let mut bundle_ms = Vec::new();
    for i in 0..args.single {
        let name = format!("single-{i:03}");
        let started = Instant::now();
        grants
            .patch(
                &name,
                &PatchParams::apply("bench"),
                &Patch::Apply(grant_body(&name)),
            )
            .await
            .unwrap();
        loop {
            if grants.get(&name).await.is_ok_and(|g| issued(&g)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        issue_ms.push(started.elapsed().as_secs_f64() * 1000.0);
        let boundary = rbac::boundary(&name, None, "widgets");
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(3600),
                ..TokenRequestSpec::default()
            }),
            ..TokenRequest::default()
        };
        Api::<ServiceAccount>::namespaced(provider.clone(), &boundary)
            .create_token_request(rbac::SERVICE_ACCOUNT, &PostParams::default(), &request)
            .await
            .unwrap();
        bundle_ms.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    issue_ms.sort_by(f64::total_cmp);
    bundle_ms.sort_by(f64::total_cmp);
    println!(
        "one Grant at a time ({}): issued p50 {:.0} ms, max {:.0} ms; bundle ready (token minted) p50 {:.0} ms, max {:.0} ms (goal: ≤ 1 s)",
        args.single,
        percentile(&issue_ms, 0.5),
        percentile(&issue_ms, 1.0),
        percentile(&bundle_ms, 0.5),
        percentile(&bundle_ms, 1.0),
    );

    // A burst: every Grant created at once, watched until issued.
    let cpu_before = cpu_seconds(pid);
    let requests_before = kbind_requests_at(&issuer.metrics).await;
    let created_at: std::sync::Arc<std::sync::Mutex<BTreeMap<String, Instant>>> =
        Default::default();
    let watching = {
        let (grants, created_at) = (grants.clone(), created_at.clone());
        let want = args.grants;
        tokio::spawn(async move {
            let mut lags = Vec::with_capacity(want);
            let mut done = std::collections::BTreeSet::new();
            let mut events =
                std::pin::pin!(watcher(grants, watcher::Config::default()).applied_objects());
            while let Some(Ok(grant)) = events.next().await {
                let name = grant.metadata.name.clone().unwrap_or_default();
                if !name.starts_with("burst-") || !issued(&grant) || !done.insert(name.clone()) {
                    continue;
                }
                if let Some(at) = created_at.lock().unwrap().get(&name) {
                    lags.push(at.elapsed().as_secs_f64());
                }
                if done.len() == want {
                    break;
                }
            }
            lags
        })
    };
    let started = Instant::now();
    futures::stream::iter(0..args.grants)
        .map(|i| {
            let (grants, created_at) = (grants.clone(), created_at.clone());
            async move {
                let name = format!("burst-{i:05}");
                created_at
                    .lock()
                    .unwrap()
                    .insert(name.clone(), Instant::now());
                for _ in 0..5 {
                    if grants
                        .patch(
                            &name,
                            &PatchParams::apply("bench"),
                            &Patch::Apply(grant_body(&name)),
                        )
                        .await
                        .is_ok()
                    {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        })
        .buffer_unordered(args.concurrency)
        .collect::<Vec<()>>()
        .await;
    let created = started.elapsed().as_secs_f64();
    let mut lags = watching.await.unwrap();
    let all = started.elapsed().as_secs_f64();
    lags.sort_by(f64::total_cmp);
    let cpu = cpu_seconds(pid) - cpu_before;
    let requests_after = kbind_requests_at(&issuer.metrics).await;
    let burst_requests: f64 =
        requests_after.values().sum::<f64>() - requests_before.values().sum::<f64>();
    println!(
        "{} Grants at once: created in {created:.1} s, all issued after {all:.1} s ({:.0} Grants/s); create → issued p50 {:.1} s, p99 {:.1} s",
        args.grants,
        args.grants as f64 / all,
        percentile(&lags, 0.5),
        percentile(&lags, 0.99),
    );
    println!(
        "issuer per Grant: {:.2} ms CPU, {:.1} requests (7 objects each: namespace, ServiceAccount, Role, 2 ClusterRoles, RoleBinding, ClusterRoleBinding, plus its status)",
        cpu * 1000.0 / args.grants as f64,
        burst_requests / args.grants as f64
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let total = args.grants + args.single;
    let rss_full = rss_mib(pid);
    println!(
        "issuer RSS: {rss_empty:.1} MiB with no Grant, {rss_full:.1} MiB with {total} ({:.2} KiB per Grant)",
        (rss_full - rss_empty) * 1024.0 / total as f64
    );

    // At rest.
    let before = kbind_requests_at(&issuer.metrics).await;
    let cpu_before = cpu_seconds(pid);
    tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
    let after = kbind_requests_at(&issuer.metrics).await;
    let grown: BTreeMap<&String, f64> = after
        .iter()
        .map(|(k, v)| (k, v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect();
    let rss_rest = rss_mib(pid);
    println!(
        "at rest for {} s with {total} Grants: the issuer's requests {grown:?} (its leader Lease only is the goal), CPU {:.2} s; RSS then {rss_rest:.1} MiB ({:.2} KiB per Grant)",
        args.idle_secs,
        cpu_seconds(pid) - cpu_before,
        (rss_rest - rss_empty) * 1024.0 / total as f64
    );
    let listed = grants.list(&ListParams::default()).await.unwrap().items;
    println!(
        "issued: {} of {}",
        listed.iter().filter(|g| issued(g)).count(),
        listed.len()
    );
    drop(env);
}
