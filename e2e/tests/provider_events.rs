//! Provider Events mirrored onto consumer objects (#39.2), on two real clusters: off by default;
//! a binding's `spec.providerEvents` selects types and reasons; each provider Event about a
//! synced object's copy is copied once onto the consumer object — its reason kept, its note naming
//! the Connection and capped, the copy's UID checked — and a chatty provider controller is
//! rate-limited per object without slowing another object's. What the metric says is compared
//! with the Events the consumer's API server holds.

use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::fixtures::*;
use kbind_e2e::wait::wait_for;
use kbind_shared::api::ClusterBinding;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

const API: &str = "widgets.example.org";

/// The provider's controller records an Event about the provider copy `name` in team-a.
async fn provider_event(s: &SyncEnv, name: &str, type_: &str, reason: &str, message: &str) {
    let copy = widgets(&s.provider, "team-a").get(name).await.unwrap();
    let event: Event = serde_json::from_value(json!({
        "metadata": { "generateName": format!("{name}.") },
        "involvedObject": {
            "apiVersion": "example.org/v1", "kind": "Widget",
            "name": name, "namespace": "team-a", "uid": copy.uid(),
        },
        "type": type_,
        "reason": reason,
        "message": message,
        "source": { "component": "db-operator" },
        "reportingComponent": "db-operator",
        "reportingInstance": "db-operator-0",
        "firstTimestamp": jiff::Timestamp::now().to_string(),
        "lastTimestamp": jiff::Timestamp::now().to_string(),
        "count": 1,
    }))
    .unwrap();
    Api::<Event>::namespaced(s.provider.clone(), "team-a")
        .create(&PostParams::default(), &event)
        .await
        .unwrap();
}

/// kbind's copies of provider Events on the consumer Widget `name` (what `kubectl describe`
/// lists), oldest first.
async fn copies(consumer: &Client, name: &str) -> Vec<Event> {
    let uid = widgets(consumer, "team-a")
        .get(name)
        .await
        .unwrap()
        .uid()
        .unwrap();
    let mut events: Vec<Event> = Api::<Event>::namespaced(consumer.clone(), "team-a")
        .list(&ListParams::default().fields(&format!("involvedObject.uid={uid}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reporting_instance.as_deref() == Some("connection/provider")
                && e.reporting_component.as_deref() == Some("kbind-konnector")
        })
        .collect();
    events.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    events
}

/// Waits until the consumer Widget `name` carries `count` copies.
async fn wait_copies(consumer: &Client, name: &str, count: usize) -> Vec<Event> {
    wait_for(&format!("{count} copies on {name}"), 30, || async {
        let found = copies(consumer, name).await;
        if found.len() == count {
            Ok(Some(found))
        } else {
            Err(format!("{} copies", found.len()))
        }
    })
    .await
}

/// The syncer's `kbind_provider_events_total` for `result` (an error while it is not serving).
async fn events_metric(s: &SyncEnv, result: &str) -> Result<f64, String> {
    let text = s.syncer.metrics().await?;
    Ok(metric_sum(
        &text,
        "kbind_provider_events_total",
        &[("api", API), ("result", result)],
    ))
}

fn reasons(events: &[Event]) -> Vec<&str> {
    events.iter().filter_map(|e| e.reason.as_deref()).collect()
}

#[tokio::test]
async fn provider_events_are_mirrored_once_when_asked_capped_and_rate_limited() {
    let mut s = SyncEnv::start("provider-events", &[0, 1, 2], None).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "w1", 1).await;
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "w2", 2).await;

    // Off by default: nothing is copied.
    provider_event(&s, "w1", "Warning", "QuotaExceeded", "no room for w1").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(copies(&s.consumer, "w1").await.is_empty());

    // Asked for: Warnings with two reasons. The Event already there is copied.
    let bindings: Api<ClusterBinding> = Api::all(s.consumer.clone());
    merge_patch(
        &bindings,
        "widgets",
        &json!({ "spec": { "providerEvents": { "reasons": ["QuotaExceeded", "Chatty"] } } }),
    )
    .await;
    let first = wait_copies(&s.consumer, "w1", 1).await;
    let copy = &first[0];
    let consumer_w1 = widgets(&s.consumer, "team-a").get("w1").await.unwrap();
    assert_eq!(copy.type_.as_deref(), Some("Warning"));
    assert_eq!(copy.reason.as_deref(), Some("QuotaExceeded"));
    assert_eq!(
        copy.message.as_deref(),
        Some("from the provider of Connection provider (db-operator): no room for w1")
    );
    assert_eq!(copy.involved_object.uid, consumer_w1.uid());
    assert_eq!(copy.involved_object.kind.as_deref(), Some("Widget"));
    assert_eq!(
        copy.related, None,
        "no reference to another provider object"
    );

    // Not asked for: a Normal Event, another reason.
    provider_event(&s, "w1", "Normal", "QuotaExceeded", "normal").await;
    provider_event(&s, "w1", "Warning", "Other", "other reason").await;

    // A chatty controller: 60 Events about w2 in a burst. w2 gets its five, the rest are
    // dropped; w1's next Event is still copied at once.
    let flood_start = std::time::Instant::now();
    for i in 0..60 {
        provider_event(&s, "w2", "Warning", "Chatty", &format!("chatter {i}")).await;
    }
    provider_event(&s, "w1", "Warning", "QuotaExceeded", &"x".repeat(20_000)).await;
    let w1 = wait_copies(&s.consumer, "w1", 2).await;
    let huge = w1[1].message.as_deref().unwrap();
    assert!(huge.len() <= 1024, "{}", huge.len());
    assert!(huge.starts_with("from the provider of Connection provider (db-operator): xxx"));
    assert!(huge.ends_with('…'));
    let handled = wait_for("every chatty Event handled", 30, || async {
        let copied = events_metric(&s, "mirrored").await?;
        let dropped = events_metric(&s, "rate_limited").await?;
        Ok((copied + dropped >= 62.0).then_some((copied, dropped)))
    })
    .await;
    let elapsed = flood_start.elapsed().as_secs();
    let w2 = copies(&s.consumer, "w2").await;
    // Five at once, then one per ten seconds at most.
    let allowed = 5 + (elapsed / 10) as usize;
    assert!(
        (5..=allowed).contains(&w2.len()),
        "{} copies on w2 in {elapsed} s",
        w2.len()
    );
    assert!(reasons(&w2).iter().all(|r| *r == "Chatty"));
    // The metric says what the consumer's API server holds: every copy, and the rest dropped.
    let w1 = copies(&s.consumer, "w1").await;
    assert_eq!(reasons(&w1), ["QuotaExceeded", "QuotaExceeded"]);
    assert_eq!(handled.0, (w1.len() + w2.len()) as f64, "mirrored");
    assert_eq!(handled.1, (60 - w2.len()) as f64, "rate_limited");

    // A restarted syncer lists the provider's Events again and copies none it copied before (a
    // dropped one may be copied now, within w2's budget); its metric counts exactly the new ones.
    let w2_before = w2.len();
    s.restart_syncer("syncer-restarted", &[]).await;
    let after = wait_for(
        "the restarted syncer handled the Events again",
        60,
        || async {
            let duplicates = events_metric(&s, "duplicate").await?;
            let copied = events_metric(&s, "mirrored").await?;
            let dropped = events_metric(&s, "rate_limited").await?;
            Ok((duplicates + copied + dropped >= 62.0).then_some((duplicates, copied)))
        },
    )
    .await;
    assert_eq!(copies(&s.consumer, "w1").await.len(), 2);
    let w2_after = copies(&s.consumer, "w2").await.len();
    assert!(w2_after <= w2_before + 5, "{w2_before} → {w2_after}");
    assert_eq!(
        after.1,
        (w2_after - w2_before) as f64,
        "mirrored after the restart"
    );
    assert!(
        after.0 >= 2.0,
        "w1's copies were refused as existing: {after:?}"
    );

    // Turned off: new Events stay on the provider.
    merge_patch(
        &bindings,
        "widgets",
        &json!({ "spec": { "providerEvents": null } }),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    provider_event(&s, "w1", "Warning", "QuotaExceeded", "after turning it off").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(copies(&s.consumer, "w1").await.len(), 2);
}
