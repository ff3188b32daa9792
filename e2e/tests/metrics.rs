//! "Is it keeping up?" from `/metrics`, on two real clusters: the end-to-end lag histograms count
//! every change delivered (spec up, status down, deletion), the backlog drains to zero, and
//! failed operations say why (`result`: conflict, transient here; forbidden and rejected in
//! `sync_resilience.rs`).

use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::fixtures::*;
use kbind_e2e::wait::{wait_for, wait_gone};
use kube::api::{DeleteParams, DynamicObject, PostParams};

const API: &str = "widgets.example.org";

/// `kbind_sync_operations_total` for `op` and `result`.
fn operations(text: &str, op: &str, result: &str) -> f64 {
    metric_sum(
        text,
        "kbind_sync_operations_total",
        &[("api", API), ("op", op), ("result", result)],
    )
}

/// How many delays `kbind_sync_lag_seconds` recorded for `op`.
fn lags(text: &str, op: &str) -> f64 {
    metric_sum(
        text,
        "kbind_sync_lag_seconds_count",
        &[("connection", "provider"), ("api", API), ("op", op)],
    )
}

#[tokio::test]
async fn lag_histograms_count_every_delivered_change_and_the_backlog_drains() {
    let s = SyncEnv::start("metrics_lag", &[0, 1, 2], None).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    let (consumer_widgets, provider_widgets) = (
        widgets(&s.consumer, "team-a"),
        widgets(&s.provider, "team-a"),
    );
    let names = ["w1", "w2", "w3", "w4", "w5"];
    for name in names {
        create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", name, 1).await;
    }
    for name in &names[..3] {
        resize_and_wait_upstream(&consumer_widgets, &provider_widgets, name, 2).await;
    }
    // Every status (the provider's stand-in controller sets observedSize) has come down.
    wait_for("every status down", 30, || async {
        let list = consumer_widgets
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        Ok(list
            .items
            .iter()
            .all(|w: &DynamicObject| w.data["status"]["observedSize"] == w.data["spec"]["size"])
            .then_some(()))
    })
    .await;
    for name in ["w4", "w5"] {
        consumer_widgets
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    for name in ["w4", "w5"] {
        wait_gone(&consumer_widgets, name, "the deleted consumer object", 30).await;
    }
    wait_backlog_drained(&s.syncer, API).await;

    let text = s.syncer.metrics().await.unwrap();
    // One spec-up write per change (5 creations, 3 resizes), each with its delay recorded.
    assert_eq!(operations(&text, "spec_up", "ok"), 8.0, "{text}");
    assert_eq!(lags(&text, "spec_up"), 8.0);
    assert_eq!(
        metric_sum(
            &text,
            "kbind_sync_latency_seconds_count",
            &[("op", "spec_up")]
        ),
        8.0,
        "INTERFACES.md's histogram measures the same delay"
    );
    // Every status written back, and both deletions, timed the same way.
    let status_writes = operations(&text, "status_down", "ok");
    assert!(status_writes >= 8.0, "{text}");
    assert_eq!(lags(&text, "status_down"), status_writes);
    assert_eq!(operations(&text, "delete", "ok"), 2.0);
    assert_eq!(lags(&text, "delete"), 2.0);
    assert!(
        metric_sum(&text, "kbind_sync_lag_seconds_sum", &[("op", "spec_up")]) > 0.0,
        "delays are real"
    );
    // Nothing failed and no binding asked for provider Events: the dashboard's "Failed writes"
    // and "Provider Events" panels read 0 — the series exist from the start, at 0.
    for series in [
        r#"kbind_reconcile_errors_total{controller="sync",reason="consumer"} 0"#,
        r#"kbind_reconcile_errors_total{controller="sync",reason="provider"} 0"#,
        r#"kbind_provider_events_total{api="widgets.example.org",result="mirrored"} 0"#,
        r#"kbind_provider_events_total{api="widgets.example.org",result="error"} 0"#,
    ] {
        assert!(text.lines().any(|l| l == series), "{series} in {text}");
    }
    let manager = s.manager.metrics().await.unwrap();
    for controller in ["connection", "clusterbinding", "binding"] {
        for reason in ["consumer", "provider", "finalizer"] {
            let series = format!(
                r#"kbind_reconcile_errors_total{{controller="{controller}",reason="{reason}"}} 0"#
            );
            assert!(
                manager.lines().any(|l| l == series),
                "{series} in {manager}"
            );
        }
    }
}

#[tokio::test]
async fn failures_are_labelled_conflict_and_transient_and_the_backlog_shows_them() {
    let s = SyncEnv::start("metrics_results", &[0, 1, 2], None).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    ensure_namespace(&s.provider, "team-a").await.unwrap();
    let (consumer_widgets, provider_widgets) = (
        widgets(&s.consumer, "team-a"),
        widgets(&s.provider, "team-a"),
    );

    // Conflict: the provider already has an object of that name that kbind did not create.
    provider_widgets
        .create(&PostParams::default(), &widget("taken", 1))
        .await
        .unwrap();
    consumer_widgets
        .create(&PostParams::default(), &widget("taken", 2))
        .await
        .unwrap();
    wait_for("a conflict result", 30, || async {
        let text = s.syncer.metrics().await?;
        Ok((operations(&text, "spec_up", "conflict") >= 1.0).then_some(()))
    })
    .await;

    // Transient: the provider's admission webhook is down (failurePolicy Fail → HTTP 500).
    kbind_e2e::webhook::register_down(&s.provider)
        .await
        .unwrap();
    consumer_widgets
        .create(&PostParams::default(), &widget("flaky", 3))
        .await
        .unwrap();
    wait_for(
        "a transient result, and the object waiting in the backlog",
        30,
        || async {
            let text = s.syncer.metrics().await?;
            let waiting = metric_sum(
                &text,
                "kbind_sync_backlog",
                &[("connection", "provider"), ("api", API)],
            );
            Ok((operations(&text, "spec_up", "transient") >= 1.0 && waiting >= 1.0).then_some(()))
        },
    )
    .await;
    // It ages while it waits.
    wait_for("the oldest waiting object to age", 30, || async {
        let text = s.syncer.metrics().await?;
        let oldest = metric_sum(
            &text,
            "kbind_sync_backlog_oldest_seconds",
            &[("connection", "provider"), ("api", API)],
        );
        Ok((oldest >= 2.0).then_some(()))
    })
    .await;

    // The webhook is back out of the way: the object syncs and the backlog drains.
    kbind_e2e::webhook::unregister(&s.provider, "down")
        .await
        .unwrap();
    wait_object(
        &provider_widgets,
        "flaky",
        "the waiting object upstream",
        60,
        |_| true,
    )
    .await;
    // The conflict is not a backlog: it waits for a person, not for a retry.
    consumer_widgets
        .delete("taken", &DeleteParams::default())
        .await
        .unwrap();
    wait_backlog_drained(&s.syncer, API).await;
}

#[tokio::test]
async fn with_metrics_auth_only_a_token_allowed_to_get_metrics_is_served() {
    // #32.10: `--metrics-auth` (chart `metrics.auth.enabled`): the consumer API server reviews the
    // scrape's bearer token (TokenReview) and its access to the non-resource URL /metrics
    // (SubjectAccessReview).
    use k8s_openapi::api::rbac::v1::PolicyRule;
    use kbind_e2e::kbind::http_get_with;
    let mut env = kbind_e2e::TestEnv::start("metrics_auth", &["consumer"])
        .await
        .unwrap();
    let consumer = env.cluster("consumer").admin_client().await.unwrap();
    kbind_e2e::kbind::install_crds(&consumer).await.unwrap();
    let manager = start_lone_schema_manager(&mut env, &["--metrics-auth=true"]).await;
    // The endpoints bind once the program reached its API server: wait for them.
    manager.wait_ready("schema manager", 30).await;
    let cluster = env.cluster("consumer");
    let scraper = cluster
        .mint_service_account_user("monitoring", "prometheus")
        .await
        .unwrap();
    let get = |token: Option<String>| {
        let address = manager.metrics.clone();
        async move {
            http_get_with(&address, "/metrics", token.as_deref())
                .await
                .unwrap()
        }
    };
    let (code, body) = get(None).await;
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("a bearer token is required"), "{body}");
    let (code, body) = get(Some("not-a-token".into())).await;
    assert_eq!(code, 401, "{body}");
    let (code, body) = get(Some(scraper.token.clone())).await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("system:serviceaccount:monitoring:prometheus may not get /metrics"),
        "{body}"
    );
    assert!(!body.contains("kbind_"), "{body}");
    cluster
        .grant(
            &scraper,
            "prometheus-metrics",
            vec![PolicyRule {
                non_resource_urls: Some(vec!["/metrics".into()]),
                verbs: vec!["get".into()],
                ..Default::default()
            }],
        )
        .await
        .unwrap();
    // A refusal is remembered for 10 s; then the grant applies.
    wait_for("the granted scraper to be served", 30, || async {
        let (code, body) = get(Some(scraper.token.clone())).await;
        if code == 200 && body.contains("kbind_leader") {
            Ok(Some(()))
        } else {
            Err(format!(
                "{code}: {}",
                body.chars().take(300).collect::<String>()
            ))
        }
    })
    .await;
    // A flood of made-up tokens: reviews are rate-bounded (429 beyond 10 a second), and the
    // scraper whose verdict is remembered is served throughout.
    let started = std::time::Instant::now();
    let answers =
        futures::future::join_all((0..40).map(|i| get(Some(format!("made-up-token-{i}"))))).await;
    let throttled = answers.iter().filter(|(code, _)| *code == 429).count();
    let reviewed = answers.iter().filter(|(code, _)| *code == 401).count();
    assert!(throttled > 0, "{answers:?}");
    let seconds = started.elapsed().as_secs() as usize + 1;
    assert!(
        reviewed <= 10 * seconds,
        "{reviewed} reviews in {seconds} s"
    );
    let (code, _) = get(Some(scraper.token.clone())).await;
    assert_eq!(code, 200);
    // Probes stay open: the kubelet sends no token.
    let (code, _) = kbind_e2e::kbind::http_get(&manager.probes, "/readyz")
        .await
        .unwrap();
    assert_eq!(code, 200);
}
