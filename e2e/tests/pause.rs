//! Day-two controls on two real clusters (#39.1): a user pauses one object with its
//! `core.kbind.io/paused` annotation, or everything a binding covers with its `spec.suspend`.
//! While paused kbind writes nothing for the object on either cluster — the record saying
//! `Paused` once is its only write, counted here from the API servers' own metrics — the
//! delivery column, the binding's status and a gauge say so, a deletion still runs, and resuming
//! costs one write on each side.

use std::collections::BTreeMap;
use std::time::Duration;

use kbind_e2e::fixtures::*;
use kbind_e2e::kbind::{apiserver_writes, grown};
use kbind_shared::api::ClusterBinding;
use kube::api::DeleteParams;
use kube::{Api, Client};
use serde_json::{Value, json};

/// The Widget API as the metrics and the binding name it.
const API: &str = "widgets.example.org";

/// Writes of Widgets an API server has served so far (every client's), by verb and subresource.
async fn widget_writes(client: &Client) -> BTreeMap<String, u64> {
    let mut writes = apiserver_writes(client).await.unwrap();
    writes.retain(|key, _| key.contains("example.org/widgets"));
    writes
}

async fn writes_now(s: &SyncEnv) -> (BTreeMap<String, u64>, BTreeMap<String, u64>) {
    (
        widget_writes(&s.consumer).await,
        widget_writes(&s.provider).await,
    )
}

/// Asserts the Widget writes each API server served since `before`: exactly `consumer` and
/// `provider`, each `(request, count)` (`"<verb> <group>/<resource> <subresource>"`).
async fn assert_writes(
    s: &SyncEnv,
    before: &(BTreeMap<String, u64>, BTreeMap<String, u64>),
    consumer: &[(&str, u64)],
    provider: &[(&str, u64)],
) {
    let counted = |entries: &[(&str, u64)]| -> BTreeMap<String, u64> {
        entries.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect()
    };
    let after = writes_now(s).await;
    assert_eq!(
        grown(&before.0, &after.0),
        counted(consumer),
        "consumer writes"
    );
    assert_eq!(
        grown(&before.1, &after.1),
        counted(provider),
        "provider writes"
    );
}

/// Waits until the consumer Widget `name` in team-a carries a delivery record in `state`, and
/// returns the Widget.
async fn wait_state(s: &SyncEnv, name: &str, state: &str) -> kube::api::DynamicObject {
    wait_object(
        &widgets(&s.consumer, "team-a"),
        name,
        &format!("{name}'s delivery record to say {state}"),
        30,
        |w| w.data["status"]["kbindSync"]["state"] == state,
    )
    .await
}

/// Waits until the syncer's `kbind_paused_objects` for Widgets is `count`.
async fn wait_paused_gauge(s: &SyncEnv, count: f64) {
    kbind_e2e::wait::wait_for("the paused gauge", 30, || async {
        let text = s.syncer.metrics().await?;
        let gauge = metric_sum(&text, "kbind_paused_objects", &[("api", API)]);
        Ok((gauge == count).then_some(()))
    })
    .await;
}

/// Waits until the ClusterBinding `widgets` reports `count` paused Widgets (absent: 0).
async fn wait_paused_count(s: &SyncEnv, count: i64) -> ClusterBinding {
    let bindings: Api<ClusterBinding> = Api::all(s.consumer.clone());
    wait_object(
        &bindings,
        "widgets",
        &format!("the binding to count {count} paused object(s)"),
        30,
        |b| {
            let reported = b
                .status
                .as_ref()
                .and_then(|s| s.bound_apis.iter().find(|a| a.name == API))
                .map(|a| i64::from(a.paused_count));
            reported == Some(count)
        },
    )
    .await
}

/// Pauses or resumes the consumer Widget `name` in team-a.
async fn set_paused(s: &SyncEnv, name: &str, paused: bool) {
    let value = if paused { json!("true") } else { Value::Null };
    let patch = json!({ "metadata": { "annotations": { "core.kbind.io/paused": value } } });
    merge_patch(&widgets(&s.consumer, "team-a"), name, &patch).await;
}

/// A pair with Widgets bound, and team-a's Widgets on each side.
async fn started(
    test: &str,
) -> (
    SyncEnv,
    Api<kube::api::DynamicObject>,
    Api<kube::api::DynamicObject>,
) {
    let s = SyncEnv::start(test, &[0, 1, 2], None).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    kbind_e2e::cluster::ensure_namespace(&s.consumer, "team-a")
        .await
        .unwrap();
    let consumer = widgets(&s.consumer, "team-a");
    let provider = widgets(&s.provider, "team-a");
    (s, consumer, provider)
}

#[tokio::test]
async fn a_paused_object_costs_no_write_until_resumed_and_then_one_on_each_side() {
    let (s, consumer, provider) = started("pause_object").await;
    create_and_wait_copy(&consumer, &provider, "w", 1).await;
    wait_status_down(&consumer, "w", 1).await;
    wait_state(&s, "w", "Synced").await;

    // Paused: the record says so — the one write the pause costs — and so do the gauge and the
    // binding.
    let before = writes_now(&s).await;
    set_paused(&s, "w", true).await;
    let w = wait_state(&s, "w", "Paused").await;
    let record = &w.data["status"]["kbindSync"];
    assert!(
        record["message"]
            .as_str()
            .is_some_and(|m| m.contains("core.kbind.io/paused")),
        "{record}"
    );
    assert_eq!(record["generation"], 1, "what the provider has is kept");
    assert!(record.get("since").is_none(), "nothing waits: {record}");
    assert_eq!(
        w.metadata.finalizers,
        Some(vec!["core.kbind.io/syncer".to_owned()]),
        "the finalizer stays"
    );
    wait_paused_count(&s, 1).await;
    wait_paused_gauge(&s, 1.0).await;
    let consumer_writes = [
        ("PATCH example.org/widgets ", 1),       // the test's annotation
        ("PATCH example.org/widgets status", 1), // kbind's record
    ];
    assert_writes(&s, &before, &consumer_writes, &[]).await;

    // While paused: a spec change does not go up.
    let before = writes_now(&s).await;
    merge_patch(&consumer, "w", &json!({ "spec": { "size": 2 } })).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    // Only the test's spec change.
    assert_writes(&s, &before, &[("PATCH example.org/widgets ", 1)], &[]).await;
    assert_eq!(provider.get("w").await.unwrap().data["spec"]["size"], 1);

    // Resumed: the latest spec goes up in one apply, and the provider's answer comes down with the
    // record in one status write.
    let before = writes_now(&s).await;
    set_paused(&s, "w", false).await;
    kbind_e2e::wait::wait_for("the record to say generation 2 arrived", 30, || async {
        let w = consumer.get("w").await.map_err(|e| e.to_string())?;
        let record = &w.data["status"]["kbindSync"];
        let done = record["state"] == "Synced"
            && record["generation"] == 2
            && w.data["status"]["observedSize"] == 2;
        Ok(done.then_some(()))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let consumer_writes = [
        ("PATCH example.org/widgets ", 1),       // the test's resume
        ("PATCH example.org/widgets status", 1), // kbind: the status and the record
    ];
    let provider_writes = [
        ("APPLY example.org/widgets ", 1),       // kbind's spec-up
        ("PATCH example.org/widgets status", 1), // the provider controller
    ];
    assert_writes(&s, &before, &consumer_writes, &provider_writes).await;
    wait_paused_count(&s, 0).await;
    wait_paused_gauge(&s, 0.0).await;

    // Paused again: drift on the provider (and the provider controller's status for it) is
    // neither repaired nor copied down.
    set_paused(&s, "w", true).await;
    wait_state(&s, "w", "Paused").await;
    let before = writes_now(&s).await;
    merge_patch(&provider, "w", &json!({ "spec": { "size": 7 } })).await;
    kbind_e2e::wait::wait_for(
        "the provider controller's status for the drift",
        30,
        || async {
            let copy = provider.get("w").await.map_err(|e| e.to_string())?;
            Ok((copy.data["status"]["observedSize"] == 7).then_some(()))
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    // Nothing came down, and kbind wrote nothing on the provider.
    let provider_writes = [
        ("PATCH example.org/widgets ", 1),       // the test's drift
        ("PATCH example.org/widgets status", 1), // the provider controller
    ];
    assert_writes(&s, &before, &[], &provider_writes).await;
    assert_eq!(
        provider.get("w").await.unwrap().data["spec"]["size"],
        7,
        "not repaired"
    );
    assert_eq!(
        consumer.get("w").await.unwrap().data["status"]["observedSize"],
        2
    );
}

#[tokio::test]
async fn a_suspended_binding_pauses_everything_it_covers_and_a_delete_still_runs() {
    let (s, consumer, provider) = started("pause_binding").await;
    for name in ["w1", "w2"] {
        create_and_wait_copy(&consumer, &provider, name, 1).await;
        wait_state(&s, name, "Synced").await;
    }
    let bindings: Api<ClusterBinding> = Api::all(s.consumer.clone());

    // Suspended: every object says why, the binding counts them and is not Synced.
    merge_patch(
        &bindings,
        "widgets",
        &json!({ "spec": { "suspend": true } }),
    )
    .await;
    for name in ["w1", "w2"] {
        let w = wait_state(&s, name, "Paused").await;
        let message = w.data["status"]["kbindSync"]["message"].clone();
        assert!(
            message
                .as_str()
                .is_some_and(|m| m.contains("ClusterBinding widgets is suspended")),
            "{message}"
        );
    }
    wait_paused_count(&s, 2).await;
    let binding = wait_binding(&bindings, "widgets", "Synced=False/Paused").await;
    let ready = binding.status.as_ref().and_then(|s| {
        kbind_shared::conditions::find(&s.conditions, "Ready").map(|c| c.status.clone())
    });
    assert_eq!(ready.as_deref(), Some("True"), "suspending is not a fault");

    // A new object is paused from its start: no finalizer, no copy; the count follows.
    let before = writes_now(&s).await;
    consumer
        .create(&Default::default(), &widget("w3", 3))
        .await
        .unwrap();
    let w3 = wait_state(&s, "w3", "Paused").await;
    assert_eq!(
        w3.metadata.finalizers, None,
        "nothing to clean up: no finalizer"
    );
    wait_paused_count(&s, 3).await;
    wait_paused_gauge(&s, 3.0).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(provider.get_opt("w3").await.unwrap().is_none(), "no copy");
    let consumer_writes = [
        ("POST example.org/widgets ", 1),        // the test's create
        ("PATCH example.org/widgets status", 1), // kbind's record
    ];
    assert_writes(&s, &before, &consumer_writes, &[]).await;

    // Deleting a paused object is the user's explicit action: its deletion runs.
    consumer
        .delete("w1", &DeleteParams::default())
        .await
        .unwrap();
    kbind_e2e::wait::wait_gone(&provider, "w1", "w1's copy to go", 30).await;
    kbind_e2e::wait::wait_gone(&consumer, "w1", "w1 to go", 30).await;
    wait_paused_count(&s, 2).await;

    // Resumed: what was paused syncs, the binding is Synced again, nothing is counted paused.
    merge_patch(
        &bindings,
        "widgets",
        &json!({ "spec": { "suspend": false } }),
    )
    .await;
    wait_object(&provider, "w3", "w3 upstream", 30, |_| true).await;
    for name in ["w2", "w3"] {
        wait_state(&s, name, "Synced").await;
    }
    wait_binding(&bindings, "widgets", "Synced=True").await;
    wait_paused_count(&s, 0).await;
    wait_paused_gauge(&s, 0.0).await;
}
