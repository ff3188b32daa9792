//! Per-object delivery on two real clusters: every synced consumer object says, in
//! `status.kbindSync` and in `kubectl get` columns, which generation of its spec reached the
//! provider and when — or why not — and saying so costs no write beyond those a change already
//! causes.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::fixtures::*;
use kbind_e2e::kbind::apiserver_metrics;
use kbind_e2e::wait::wait_for;
use kube::{Api, Client};
use serde_json::{Value, json};

/// The Widget API as the metrics name it.
const API: &str = "widgets.example.org";

/// Writes on Widgets an API server has served (every client's), from its own `/metrics`.
async fn widget_writes(client: &Client) -> f64 {
    let text = apiserver_metrics(client).await.unwrap();
    ["CREATE", "UPDATE", "PATCH", "APPLY", "DELETE"]
        .iter()
        .map(|verb| {
            metric_sum(
                &text,
                "apiserver_request_total",
                &[("resource", "widgets"), ("verb", verb)],
            )
        })
        .sum()
}

/// Server-side applies of Widgets an API server has served successfully (kbind's spec-ups).
async fn provider_applies(client: &Client) -> f64 {
    provider_answers(client, "200").await
}

/// Server-side applies of Widgets an API server has answered with `code`.
async fn provider_answers(client: &Client, code: &str) -> f64 {
    let text = apiserver_metrics(client).await.unwrap();
    metric_sum(
        &text,
        "apiserver_request_total",
        &[("resource", "widgets"), ("verb", "APPLY"), ("code", code)],
    )
}

/// Waits until w1's record has `state` and `generation`; returns it.
async fn wait_record(s: &SyncEnv, state: &str, generation: i64) -> Value {
    wait_record_in(s, "team-a", state, generation, None).await
}

/// Waits until `w1` in `namespace` carries the record `state` at `generation` — and, with
/// `size`, the provider's status for that size beside it — and returns the record.
async fn wait_record_in(
    s: &SyncEnv,
    namespace: &str,
    state: &str,
    generation: i64,
    size: Option<i64>,
) -> Value {
    let widgets = widgets(&s.consumer, namespace);
    let status = size
        .map(|n| format!(" and the status for size {n}"))
        .unwrap_or_default();
    wait_for(
        &format!("w1's record {state} at generation {generation}{status}"),
        30,
        || async {
            let w = widgets.get("w1").await.map_err(|e| e.to_string())?;
            let record = w.data["status"]["kbindSync"].clone();
            let sized = size.is_none_or(|n| w.data["status"]["observedSize"] == n);
            if record["state"] == state && record["generation"] == generation && sized {
                Ok(Some(record))
            } else {
                Err(format!(
                    "status {}, generation {:?}",
                    w.data["status"], w.metadata.generation
                ))
            }
        },
    )
    .await
}

#[tokio::test]
async fn each_object_says_which_generation_reached_the_provider_when_and_why_not() {
    let s = SyncEnv::start("delivery", &[0, 1, 2], None).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    // The installed CRD declares the record and shows it.
    let crd = Api::<CustomResourceDefinition>::all(s.consumer.clone())
        .get("widgets.example.org")
        .await
        .unwrap();
    let columns: Vec<&str> = crd.spec.versions[0]
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    let expected =
        "Generation Synced-Generation Delivery Delivered Route Message Waiting-Since Age";
    assert_eq!(columns.join(" "), expected);
    // kubectl's default view (priority 0) shows both generations and the state (#33.1).
    let default_view: Vec<&str> = crd.spec.versions[0]
        .additional_printer_columns
        .iter()
        .flatten()
        .filter(|c| c.priority.unwrap_or(0) == 0)
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        default_view,
        [
            "Generation",
            "Synced-Generation",
            "Delivery",
            "Delivered",
            "Route",
            "Age"
        ]
    );

    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "w1", 1).await;
    let first = wait_record(&s, "Synced", 1).await;
    assert!(
        first["time"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{first}"
    );
    let (columns, row) = table(&s.consumer, "team-a", "w1").await;
    let at = |name: &str| columns.iter().position(|c| c == name).unwrap();
    assert_eq!(
        row[at("Delivery")],
        "Synced",
        "kubectl get shows it: {columns:?} {row:?}"
    );
    assert_eq!(row[at("Synced-Generation")], 1);

    // A change: delivered, recorded, and no write beyond the one provider and one consumer write
    // it costs anyway (the record rides in the status write the provider's status change causes).
    let (consumer_widgets, provider_widgets) = (
        widgets(&s.consumer, "team-a"),
        widgets(&s.provider, "team-a"),
    );
    let before = (
        widget_writes(&s.consumer).await,
        widget_writes(&s.provider).await,
    );
    let ops_before = s.syncer.metrics().await.unwrap();
    resize_and_wait_upstream(&consumer_widgets, &provider_widgets, "w1", 2).await;
    wait_record(&s, "Synced", 2).await;
    wait_for("the new status down", 30, || async {
        let w = consumer_widgets
            .get("w1")
            .await
            .map_err(|e| e.to_string())?;
        Ok((w.data["status"]["observedSize"] == 2).then_some(()))
    })
    .await;
    // Past the wait after which a record would be written on its own.
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let after = (
        widget_writes(&s.consumer).await,
        widget_writes(&s.provider).await,
    );
    let ops_after = s.syncer.metrics().await.unwrap();
    // kbind's side of it: one spec-up, one status write carrying the record, no record alone.
    for (op, expected) in [("spec_up", 1.0), ("status_down", 1.0), ("record", 0.0)] {
        let n = |t: &str| metric_sum(t, "kbind_sync_operations_total", &[("op", op)]);
        assert_eq!(n(&ops_after) - n(&ops_before), expected, "{op}");
    }
    // Consumer: this test's patch and kbind's one status write. Provider: kbind's spec-up and
    // the provider controller's status update.
    assert_eq!(
        after.0 - before.0,
        2.0,
        "consumer writes on Widgets for one change"
    );
    assert_eq!(
        after.1 - before.1,
        2.0,
        "provider writes on Widgets for one change"
    );

    // Refused: the provider's schema now caps size at 10 (a breaking change the consumer holds,
    // so the consumer still accepts 50). The record says why; the delivered generation stays.
    let strict = widget_crd_with_max_size(10);
    install_crd(&s.provider, &strict).await.unwrap();
    merge_patch(&consumer_widgets, "w1", &json!({ "spec": { "size": 50 } })).await;
    let refused = wait_for("w1 refused", 30, || async {
        let w = consumer_widgets
            .get("w1")
            .await
            .map_err(|e| e.to_string())?;
        let record = w.data["status"]["kbindSync"].clone();
        Ok((record["state"] == "Rejected").then_some(record))
    })
    .await;
    assert_eq!(
        refused["generation"], 2,
        "the provider still has generation 2: {refused}"
    );
    assert!(
        refused["message"]
            .as_str()
            .is_some_and(|m| m.contains("less than or equal to 10")),
        "{refused}"
    );
    let (columns, row) = table(&s.consumer, "team-a", "w1").await;
    let at = |name: &str| columns.iter().position(|c| c == name).unwrap();
    assert_eq!(row[at("Delivery")], "Rejected");
    assert!(
        row[at("Message")]
            .as_str()
            .is_some_and(|m| m.contains("less than or equal to 10"))
    );

    // Fixed: delivered again.
    merge_patch(&consumer_widgets, "w1", &json!({ "spec": { "size": 5 } })).await;
    let fixed = wait_record(&s, "Synced", 4).await;
    assert!(fixed.get("message").is_none(), "{fixed}");
}

/// kbind's writes of `op` so far, from the syncer's metrics.
async fn ops(s: &SyncEnv, op: &str) -> f64 {
    let text = s.syncer.metrics().await.unwrap();
    metric_sum(&text, "kbind_sync_operations_total", &[("op", op)])
}

#[tokio::test]
async fn a_provider_that_answers_slowly_still_gets_one_status_write_per_change() {
    let s = SyncEnv::start("delivery_slow", &[0, 1, 2], None).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    let ns = SLOW_STATUS_NAMESPACE;
    ensure_namespace(&s.consumer, ns).await.unwrap();
    let wait_gauge = || async {
        let text = s.syncer.metrics().await.unwrap();
        metric_sum(
            &text,
            "kbind_delivery_record_wait_seconds",
            &[("connection", "provider"), ("api", API)],
        )
    };

    // Nothing learned yet: the record waits 2 s, then is written on its own; the provider's
    // status comes 4 s after the spec, in a second write.
    let (records, statuses) = (ops(&s, "record").await, ops(&s, "status_down").await);
    create_widget_and_wait_upstream(&s.consumer, &s.provider, ns, "w1", 1).await;
    wait_record_in(&s, ns, "Synced", 1, Some(1)).await;
    assert_eq!(
        ops(&s, "record").await - records,
        1.0,
        "the first record alone"
    );
    assert_eq!(ops(&s, "status_down").await - statuses, 1.0);
    // That answer taught the syncer how long this provider takes (the gauge is refreshed once a
    // second).
    wait_for("the wait learned from the slow answer", 10, || async {
        let learned = wait_gauge().await;
        if learned >= SLOW_STATUS_DELAY.as_secs_f64() {
            Ok(Some(()))
        } else {
            Err(format!(
                "waits {learned} s after a {SLOW_STATUS_DELAY:?} answer"
            ))
        }
    })
    .await;

    // A change now: the record waits for the provider's status and rides in its write.
    let (records, statuses, spec_ups) = (
        ops(&s, "record").await,
        ops(&s, "status_down").await,
        ops(&s, "spec_up").await,
    );
    let consumer_writes = widget_writes(&s.consumer).await;
    resize_and_wait_upstream(
        &widgets(&s.consumer, ns),
        &widgets(&s.provider, ns),
        "w1",
        2,
    )
    .await;
    wait_record_in(&s, ns, "Synced", 2, Some(2)).await;
    // Past any wait after which the record would still be written on its own.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(ops(&s, "spec_up").await - spec_ups, 1.0);
    assert_eq!(
        ops(&s, "record").await - records,
        0.0,
        "no record alone once the wait fits the provider"
    );
    assert_eq!(ops(&s, "status_down").await - statuses, 1.0);
    assert_eq!(
        widget_writes(&s.consumer).await - consumer_writes,
        2.0,
        "consumer writes on Widgets for one change: this test's patch and kbind's one status write"
    );
}

#[tokio::test]
async fn an_undelivered_generation_never_shows_synced_and_its_wait_survives_a_restart() {
    // #33.1 and #33.4: the provider's admission webhook is down (failurePolicy Fail → every write
    // answers 500), so a change cannot reach it. kubectl's default columns show the new
    // generation against the one the provider has from the user's own write on, the record says
    // Pending with the provider's answer and since when — in one consumer write, however many
    // retries — and the backlog counts it as pending from the change, across a syncer restart.
    let mut s = SyncEnv::start("delivery_pending", &[0, 1, 2], None).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "w1", 1).await;
    wait_record(&s, "Synced", 1).await;
    wait_backlog_drained(&s.syncer, API).await;

    kbind_e2e::webhook::register_down(&s.provider)
        .await
        .unwrap();

    let consumer_widgets = widgets(&s.consumer, "team-a");
    let before = widget_writes(&s.consumer).await;
    let changed = jiff::Timestamp::now();
    let patched = merge_patch(&consumer_widgets, "w1", &json!({ "spec": { "size": 2 } })).await;
    assert_eq!(patched.metadata.generation, Some(2));
    // Straight after the user's write, before kbind did anything: the default columns already
    // say generation 2 is not the one the provider has.
    let (columns, row) = table(&s.consumer, "team-a", "w1").await;
    let at = |name: &str| columns.iter().position(|c| c == name).unwrap();
    assert_eq!(
        (&row[at("Generation")], &row[at("Synced-Generation")]),
        (&json!(2), &json!(1)),
        "{columns:?} {row:?}"
    );

    let pending = wait_record(&s, "Pending", 1).await;
    let message = pending["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("answered 500") && message.contains("down.example.org"),
        "{pending}"
    );
    let since: jiff::Timestamp = pending["since"].as_str().unwrap().parse().unwrap();
    assert!(
        since.as_second() >= changed.as_second() - 1
            && since.as_second() <= changed.as_second() + 1,
        "since {since} is the change at {changed}"
    );
    let (_, row) = table(&s.consumer, "team-a", "w1").await;
    assert_eq!(row[at("Delivery")], "Pending", "{row:?}");

    // Retries do not write it again.
    let retries = |text: &str| {
        metric_sum(
            text,
            "kbind_sync_operations_total",
            &[("op", "spec_up"), ("result", "transient")],
        )
    };
    wait_for("several failed attempts", 60, || async {
        let text = s.syncer.metrics().await?;
        Ok((retries(&text) >= 3.0).then_some(()))
    })
    .await;
    assert_eq!(
        widget_writes(&s.consumer).await - before,
        2.0,
        "the user's change and kbind's one Pending record"
    );
    // #33.9: each failed attempt is one `kbind_reconcile_errors_total{controller="sync",
    // reason="provider"}` — exactly the failed applies the provider's API server answered.
    wait_for(
        "reconcile errors equal to the provider's failed applies",
        30,
        || async {
            let errors = |text: &str| {
                metric_sum(
                    text,
                    "kbind_reconcile_errors_total",
                    &[("controller", "sync"), ("reason", "provider")],
                )
            };
            let first = errors(&s.syncer.metrics().await?);
            let failed = provider_answers(&s.provider, "500").await;
            let again = errors(&s.syncer.metrics().await?);
            if first == again && first == failed && failed >= 3.0 {
                Ok(Some(()))
            } else {
                Err(format!(
                    "{first} then {again} reconcile errors, {failed} failed applies"
                ))
            }
        },
    )
    .await;

    // The backlog counts it as pending, aged from the change.
    let aged = wait_for("w1 pending in the backlog, aged", 30, || async {
        let (pending, oldest) = backlog(&s.syncer, "widgets.example.org", Some("pending")).await?;
        Ok((pending == 1.0 && oldest >= 3.0).then_some(oldest))
    })
    .await;
    // A syncer restart neither empties the backlog nor makes its oldest entry young again.
    let restarted = std::time::Instant::now();
    let waited_at_restart = (jiff::Timestamp::now() - changed)
        .total(jiff::Unit::Second)
        .unwrap();
    s.restart_syncer("syncer-0-restarted", &[]).await;
    let again = wait_for("the restarted syncer's backlog", 60, || async {
        let (pending, oldest) = backlog(&s.syncer, "widgets.example.org", Some("pending")).await?;
        Ok((pending == 1.0).then_some(oldest))
    })
    .await;
    assert!(
        again + 1.0 >= aged + restarted.elapsed().as_secs_f64().floor() - 1.0,
        "oldest {again} s after the restart, {aged} s before it"
    );

    // The provider is back: delivered, and the backlog drains.
    let applied_before = provider_applies(&s.provider).await;
    kbind_e2e::webhook::unregister(&s.provider, "down")
        .await
        .unwrap();
    let delivered = wait_record(&s, "Synced", 2).await;
    // #33.3: the delivering write is timed from the change (as the consumer's API server recorded
    // it), not from when the restarted syncer listed it — one observation for the one write the
    // provider's API server served.
    let text = s.syncer.metrics().await.unwrap();
    let lag = |suffix: &str| {
        metric_sum(
            &text,
            &format!("kbind_sync_lag_seconds_{suffix}"),
            &[("op", "spec_up")],
        )
    };
    assert_eq!(provider_applies(&s.provider).await - applied_before, 1.0);
    assert_eq!(lag("count"), 1.0, "{text}");
    assert!(
        lag("sum") >= waited_at_restart - 1.0,
        "lag {} s, though the change had waited {waited_at_restart} s before the restart",
        lag("sum")
    );
    assert!(
        delivered.get("message").is_none() && delivered.get("since").is_none(),
        "{delivered}"
    );
    wait_backlog_drained(&s.syncer, API).await;
}

/// What `kubectl get` showed of w1 at one moment: how long after the change, and its Delivery,
/// Generation and Synced-Generation columns.
#[derive(Debug)]
struct Sample {
    after: std::time::Duration,
    delivery: String,
    generation: i64,
    synced_generation: i64,
}

/// Polls `kubectl get` for w1 every 100 ms for `span` after `changed`.
async fn sample_columns(
    s: &SyncEnv,
    changed: std::time::Instant,
    span: std::time::Duration,
) -> Vec<Sample> {
    let mut samples = Vec::new();
    while changed.elapsed() < span {
        let (columns, row) = table(&s.consumer, "team-a", "w1").await;
        let at = |name: &str| columns.iter().position(|c| c == name).unwrap();
        samples.push(Sample {
            after: changed.elapsed(),
            delivery: row[at("Delivery")].as_str().unwrap_or_default().to_owned(),
            generation: row[at("Generation")].as_i64().unwrap_or_default(),
            synced_generation: row[at("Synced-Generation")].as_i64().unwrap_or_default(),
        });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    samples
}

/// The bound the Delivery column keeps (docs/user-guide.md, "Delivery"): a change still
/// undelivered this long after it was made no longer shows `Synced`.
const PENDING_BOUND: std::time::Duration = std::time::Duration::from_secs(2);

/// Asserts that no sample later than [`PENDING_BOUND`] said `Synced` beside a Synced-Generation
/// behind the Generation, and that the column did come to say `Pending`.
fn assert_never_synced_behind(samples: &[Sample], provider: &str) {
    let misleading: Vec<&Sample> = samples
        .iter()
        .filter(|x| {
            x.after > PENDING_BOUND && x.delivery == "Synced" && x.synced_generation < x.generation
        })
        .collect();
    assert!(
        misleading.is_empty(),
        "{provider}: Synced for an undelivered generation after {PENDING_BOUND:?}: {misleading:?}"
    );
    assert!(
        samples.iter().any(|x| x.delivery == "Pending"),
        "{provider}: never Pending: {samples:?}"
    );
}

#[tokio::test]
async fn delivery_never_says_synced_for_a_generation_a_hanging_or_unreachable_provider_lacks() {
    // #50.4: a change the provider does not take — its writes hang (an admission webhook that
    // never answers), then it cannot be reached at all (its API server paused) — shows Pending in
    // `kubectl get`, polled every 100 ms, within 2 s of the change; never Synced beside an older
    // Synced-Generation after that. Once delivered, the record is Synced again, whole.
    let s = SyncEnv::start("delivery_overdue", &[0, 1, 2], None).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "w1", 1).await;
    wait_record(&s, "Synced", 1).await;
    let consumer_widgets = widgets(&s.consumer, "team-a");
    let span = std::time::Duration::from_secs(6);

    let hook = kbind_e2e::webhook::DenyingWebhook::hanging().await.unwrap();
    kbind_e2e::webhook::register(
        &s.provider,
        "hangs",
        Some(&hook),
        &["CREATE", "UPDATE"],
        "widgets",
        None,
    )
    .await
    .unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let changed = std::time::Instant::now();
    merge_patch(&consumer_widgets, "w1", &json!({ "spec": { "size": 2 } })).await;
    let samples = sample_columns(&s, changed, span).await;
    assert_never_synced_behind(&samples, "a provider whose writes hang");
    kbind_e2e::webhook::unregister(&s.provider, "hangs")
        .await
        .unwrap();
    let delivered = wait_record(&s, "Synced", 2).await;
    assert!(
        delivered.get("message").is_none() && delivered.get("since").is_none(),
        "a delivered record keeps nothing of the Pending one: {delivered}"
    );

    s.env.cluster("provider").signal_apiserver("STOP").unwrap();
    let changed = std::time::Instant::now();
    merge_patch(&consumer_widgets, "w1", &json!({ "spec": { "size": 3 } })).await;
    let samples = sample_columns(&s, changed, span).await;
    s.env.cluster("provider").signal_apiserver("CONT").unwrap();
    assert_never_synced_behind(&samples, "an unreachable provider");
    let delivered = wait_record(&s, "Synced", 3).await;
    assert!(
        delivered.get("message").is_none() && delivered.get("since").is_none(),
        "{delivered}"
    );
}

#[tokio::test]
async fn a_refused_consumer_status_write_is_a_consumer_reconcile_error() {
    // #33.9: the consumer's own admission (a webhook denying Widget status writes in one
    // namespace) refuses kbind's status write. Each refused write is one
    // `kbind_reconcile_errors_total{controller="sync",reason="consumer"}` — exactly the refused
    // status writes in the consumer's audit log — and nothing is counted for the provider.
    use kbind_e2e::webhook::DenyingWebhook;
    let s = SyncEnv::start("delivery_consumer_refused", &[0, 1, 2], None).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    let hook = DenyingWebhook::start(403, "status writes are frozen here")
        .await
        .unwrap();
    kbind_e2e::cluster::labelled_namespace(&s.consumer, "frozen", ("status", "frozen"))
        .await
        .unwrap();
    kbind_e2e::webhook::register(
        &s.consumer,
        "frozen-status",
        Some(&hook),
        &["UPDATE"],
        "widgets/status",
        Some(("status", "frozen")),
    )
    .await
    .unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    // The spec reaches the provider; its status cannot come back.
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "frozen", "w1", 1).await;
    let errors = |text: &str, reason: &str| {
        metric_sum(
            text,
            "kbind_reconcile_errors_total",
            &[("controller", "sync"), ("reason", reason)],
        )
    };
    let refused_status_writes = || {
        s.env
            .cluster("consumer")
            .audited()
            .iter()
            .filter(|r| {
                r.resource == "widgets"
                    && r.subresource == "status"
                    && r.namespace == "frozen"
                    && r.code == 403
            })
            .count() as f64
    };
    wait_for("reconcile errors equal to the refused status writes", 60, || async {
        let first = errors(&s.syncer.metrics().await?, "consumer");
        let refused = refused_status_writes();
        let again = errors(&s.syncer.metrics().await?, "consumer");
        if first == again && first == refused && refused >= 2.0 {
            Ok(Some(()))
        } else {
            Err(format!("{first} then {again} consumer reconcile errors, {refused} refused status writes"))
        }
    })
    .await;
    let text = s.syncer.metrics().await.unwrap();
    assert_eq!(errors(&text, "provider"), 0.0, "{text}");
    drop(hook);
}
