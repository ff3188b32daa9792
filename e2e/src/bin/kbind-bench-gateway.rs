//! Benchmark of `kbind-gateway` on a real provider (#52): how long a bind takes end to end —
//! the request, the issuer issuing the Grant, the pickup with its minted credential — with
//! `--callers` binding at once, each a distinct ServiceAccount (a new Grant each: the issuer
//! provisions its boundary), then again (the Grants exist); and the gateway's memory and CPU over
//! `--binds` binds (`--concurrency` in flight, each picked up). Prints figures; asserts nothing
//! about time.
//!
//! The gateway and the issuer run with their chart's RBAC and admission fences and their
//! ServiceAccounts' tokens, serving TLS; each request is a new TLS connection, as a CLI makes.

use std::time::{Duration, Instant};

use clap::Parser;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kbind_e2e::TestEnv;
use kbind_e2e::cluster::USERS_NAMESPACE;
use kbind_e2e::fixtures::*;
use kbind_e2e::measure::{cpu_seconds, rss_mib};
use kube::Api;
use kube::api::PostParams;

#[derive(Parser)]
#[command(name = "kbind-bench-gateway")]
struct Args {
    /// Callers binding at once (each a new Grant the first time).
    #[arg(long, default_value_t = 50)]
    callers: usize,
    /// Binds (each picked up) over which the gateway's memory is followed.
    #[arg(long, default_value_t = 10_000)]
    binds: usize,
    /// Binds in flight during that run.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

/// One bind by `token`, picked up: its duration in ms, or what went wrong.
async fn bind_and_pick_up(gateway: &Gateway, ca: &str, token: &str) -> Result<f64, String> {
    let started = Instant::now();
    let authorization = format!("Bearer {token}");
    let bound = https(
        &gateway.address,
        ca,
        "POST",
        "/api/bind",
        &[
            ("Content-Type", "application/json"),
            ("Authorization", &authorization),
        ],
        br#"{"export":"widgets"}"#,
    )
    .await?;
    if bound.code != 201 {
        return Err(format!("bind: {} {}", bound.code, bound.body.trim()));
    }
    let pickup = serde_json::from_str::<serde_json::Value>(&bound.body)
        .map_err(|e| e.to_string())?["pickup"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let taken = https(&gateway.address, ca, "GET", &pickup, &[], b"").await?;
    if taken.code != 200 {
        return Err(format!("pickup: {} {}", taken.code, taken.body.trim()));
    }
    Ok(started.elapsed().as_secs_f64() * 1000.0)
}

/// Runs `binds` by `tokens` (round-robin), `concurrency` at once; returns the durations.
async fn run(
    gateway: &Gateway,
    ca: &str,
    tokens: &[String],
    binds: usize,
    concurrency: usize,
) -> Vec<f64> {
    use futures::StreamExt;
    let mut times: Vec<f64> = futures::stream::iter(0..binds)
        .map(|i| {
            let token = &tokens[i % tokens.len()];
            async move { bind_and_pick_up(gateway, ca, token).await }
        })
        .buffer_unordered(concurrency)
        .map(|r| r.unwrap_or_else(|e| panic!("a bind failed: {e}")))
        .collect()
        .await;
    times.sort_by(f64::total_cmp);
    times
}

fn summary(times: &[f64]) -> String {
    format!(
        "p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        percentile(times, 0.5),
        percentile(times, 0.99),
        times.last().copied().unwrap_or_default()
    )
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    println!(
        "kbind-gateway benchmark on a real provider: {} callers at once, then {} binds ({} in flight)",
        args.callers, args.binds, args.concurrency
    );
    let mut env = TestEnv::start("bench-gateway", &["provider"])
        .await
        .unwrap();
    let provider = env.cluster("provider").admin_client().await.unwrap();
    install_issuer_chart(&provider).await;
    install_gateway_rbac(&provider).await;
    install_crd(&provider, &widget_crd()).await.unwrap();
    start_issuer(&mut env).await;
    apply_export(&provider, "widgets", &["widgets.example.org"], false).await;
    wait_export_offered(&provider, "widgets").await;
    // Every ServiceAccount of the users' namespace may bind Widgets.
    let rule = PolicyRule {
        api_groups: Some(vec!["catalog.kbind.io".into()]),
        resources: Some(vec!["exports".into()]),
        verbs: vec!["bind".into()],
        resource_names: Some(vec!["widgets".into()]),
        ..Default::default()
    };
    let meta = kube::api::ObjectMeta {
        name: Some("bench-binds-widgets".into()),
        ..Default::default()
    };
    Api::<ClusterRole>::all(provider.clone())
        .create(
            &PostParams::default(),
            &ClusterRole {
                metadata: meta.clone(),
                rules: Some(vec![rule]),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(provider.clone())
        .create(
            &PostParams::default(),
            &ClusterRoleBinding {
                metadata: meta,
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "ClusterRole".into(),
                    name: "bench-binds-widgets".into(),
                },
                subjects: Some(vec![Subject {
                    kind: "Group".into(),
                    name: format!("system:serviceaccounts:{USERS_NAMESPACE}"),
                    ..Default::default()
                }]),
            },
        )
        .await
        .unwrap();
    let mut tokens = Vec::new();
    for i in 0..args.callers.max(args.concurrency) {
        let user = env
            .cluster("provider")
            .mint_user(&format!("caller-{i:03}"))
            .await
            .unwrap();
        tokens.push(user.token);
    }
    let account = env
        .cluster("provider")
        .mint_service_account_user(ISSUER_NAMESPACE, GATEWAY_SERVICE_ACCOUNT)
        .await
        .unwrap();
    let (cert, key, ca) = gateway_certificate(&env);
    // Per-caller bounds lifted: this measures the gateway, not its limits.
    let gateway = start_gateway(
        &mut env,
        "gateway",
        &account,
        (&cert, &key),
        &[
            "--binds-per-minute=1000000",
            "--token-reviews-per-second=100000",
        ],
    )
    .await;
    let pid = env.process_ref(gateway.index).pid();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_start = rss_mib(pid);

    let callers = &tokens[..args.callers];
    let first = run(&gateway, &ca, callers, args.callers, args.callers).await;
    println!(
        "{} new callers binding at once (a Grant issued for each): {}",
        args.callers,
        summary(&first)
    );
    let again = run(&gateway, &ca, callers, args.callers, args.callers).await;
    println!(
        "the same {} binding again at once (their Grants issued): {}",
        args.callers,
        summary(&again)
    );

    println!("\n| binds | gateway RSS (MiB) | binds/s |");
    println!("|---:|---:|---:|");
    println!("| 0 | {rss_start:.1} | |");
    let workers = &tokens[..args.concurrency];
    let step = (args.binds / 10).max(1);
    let cpu_before = cpu_seconds(pid);
    let started = Instant::now();
    let mut done = 0;
    let mut all = Vec::new();
    while done < args.binds {
        let n = step.min(args.binds - done);
        let round = Instant::now();
        let times = run(&gateway, &ca, workers, n, args.concurrency).await;
        done += n;
        all.extend(times);
        println!(
            "| {done} | {:.1} | {:.0} |",
            rss_mib(pid),
            n as f64 / round.elapsed().as_secs_f64()
        );
    }
    all.sort_by(f64::total_cmp);
    let cpu = cpu_seconds(pid) - cpu_before;
    println!(
        "\n{} binds in {:.0} s ({} in flight): {}; gateway CPU {:.2} ms per bind",
        args.binds,
        started.elapsed().as_secs_f64(),
        args.concurrency,
        summary(&all),
        cpu * 1000.0 / args.binds as f64
    );
    let left =
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(provider.clone(), ISSUER_NAMESPACE)
            .list(&kube::api::ListParams::default().labels("gateway.kbind.io/record=pickup"))
            .await
            .unwrap()
            .items
            .len();
    println!("pickup records left in the provider's store: {left}");
}
