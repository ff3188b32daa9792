//! Provider Events mirrored onto consumer objects (#39.2), on two real clusters: off by default;
//! a binding's `spec.providerEvents` selects types and reasons; each provider Event about a
//! synced object's copy is copied once onto the consumer object — its reason kept, its note naming
//! the Connection and capped, the copy's UID checked — and a chatty provider controller is
//! rate-limited per object without slowing another object's. What the metric says is compared
//! with the Events the consumer's API server holds. A Binding asking for them has them watched
//! in its namespace only (the provider's request metrics show no cluster-wide read).

use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::fixtures::*;
use kbind_e2e::kbind::{apiserver_metrics, counter_by};
use kbind_e2e::wait::wait_for;
use kbind_shared::api::ClusterBinding;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

const API: &str = "widgets.example.org";

/// The provider's controller records an Event about the provider copy `name` in team-a.
async fn provider_event(s: &SyncEnv, name: &str, type_: &str, reason: &str, message: &str) {
    provider_event_in(s, "team-a", name, type_, reason, message).await;
}

/// [`provider_event`] in `namespace`.
async fn provider_event_in(
    s: &SyncEnv,
    namespace: &str,
    name: &str,
    type_: &str,
    reason: &str,
    message: &str,
) {
    let copy = widgets(&s.provider, namespace).get(name).await.unwrap();
    let event: Event = serde_json::from_value(json!({
        "metadata": { "generateName": format!("{name}.") },
        "involvedObject": {
            "apiVersion": "example.org/v1", "kind": "Widget",
            "name": name, "namespace": namespace, "uid": copy.uid(),
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
    Api::<Event>::namespaced(s.provider.clone(), namespace)
        .create(&PostParams::default(), &event)
        .await
        .unwrap();
}

/// kbind's copies of provider Events on the consumer Widget `name` (what `kubectl describe`
/// lists), oldest first.
async fn copies(consumer: &Client, name: &str) -> Vec<Event> {
    copies_in(consumer, "team-a", name).await
}

/// [`copies`] in `namespace`.
async fn copies_in(consumer: &Client, namespace: &str, name: &str) -> Vec<Event> {
    let uid = widgets(consumer, namespace)
        .get(name)
        .await
        .unwrap()
        .uid()
        .unwrap();
    let mut events: Vec<Event> = Api::<Event>::namespaced(consumer.clone(), namespace)
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

/// The provider's LISTs of Events so far and its open WATCHes of Events, by scope (`cluster`,
/// `namespace`): a watch is counted in `apiserver_request_total` only once it ends, so open ones
/// are read from `apiserver_longrunning_requests`.
async fn event_reads_by_scope(
    provider: &Client,
) -> std::collections::BTreeMap<(&'static str, String), f64> {
    let text = apiserver_metrics(provider).await.unwrap();
    let mut by_scope = std::collections::BTreeMap::new();
    for (verb, metric) in [
        ("LIST", "apiserver_request_total"),
        ("WATCH", "apiserver_longrunning_requests"),
    ] {
        for ([read, resource, scope], n) in
            counter_by(&text, metric, &["verb", "resource", "scope"])
        {
            if resource == "events" && read == verb {
                *by_scope.entry((verb, scope)).or_default() += n;
            }
        }
    }
    by_scope
}

#[tokio::test]
async fn a_binding_asks_for_provider_events_in_its_namespace_only() {
    // No ClusterBinding: team-a's Binding asks for Events, team-b's does not.
    let s = SyncEnv::start("provider-events-ns", &[0, 1], None).await;
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    let before = event_reads_by_scope(&s.provider).await;
    for (namespace, events) in [("team-a", true), ("team-b", false)] {
        ensure_namespace(&s.consumer, namespace).await.unwrap();
        let asks = if events { ", providerEvents: {}" } else { "" };
        apply_manifest(
            &s.consumer,
            &format!("apiVersion: core.kbind.io/v1alpha1\nkind: Binding\nmetadata: {{ name: widgets, namespace: {namespace} }}\nspec: {{ connectionRef: {{ name: provider }}, apis: [ {{ name: {API} }} ]{asks} }}\n"),
        )
        .await
        .unwrap();
        let bindings: Api<kbind_shared::api::Binding> =
            Api::namespaced(s.consumer.clone(), namespace);
        wait_binding(&bindings, "widgets", "Ready=True").await;
    }
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "a1", 1).await;
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-b", "b1", 1).await;
    provider_event_in(&s, "team-b", "b1", "Warning", "QuotaExceeded", "for b1").await;
    provider_event_in(&s, "team-a", "a1", "Warning", "QuotaExceeded", "for a1").await;
    let copied = wait_copies(&s.consumer, "a1", 1).await;
    assert_eq!(
        copied[0].message.as_deref(),
        Some("from the provider of Connection provider (db-operator): for a1")
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(copies_in(&s.consumer, "team-b", "b1").await.is_empty());
    // Read in team-a's namespace only: never a cluster-wide LIST or WATCH of Events.
    let after = event_reads_by_scope(&s.provider).await;
    let grew = |verb: &'static str, scope: &str| {
        let key = (verb, scope.to_owned());
        after.get(&key).copied().unwrap_or_default() - before.get(&key).copied().unwrap_or_default()
    };
    assert_eq!(grew("LIST", "cluster"), 0.0, "{before:?} → {after:?}");
    assert_eq!(grew("WATCH", "cluster"), 0.0, "{before:?} → {after:?}");
    assert!(grew("LIST", "namespace") >= 1.0, "{before:?} → {after:?}");
    assert!(grew("WATCH", "namespace") >= 1.0, "{before:?} → {after:?}");
}
