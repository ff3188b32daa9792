//! Observe-first import (#54): a Binding with `spec.import` mirrors the provider objects in its
//! namespace that no consumer has marked — with no provider write — a claim adopts one in one
//! provider write and from then on it syncs both ways, and unbinding removes the unclaimed
//! mirrors on the consumer and touches nothing on the provider. Read from the API servers' own
//! audit logs.

use std::collections::BTreeMap;

use kbind_e2e::cluster::{Audited, ensure_namespace};
use kbind_e2e::fixtures::*;
use kbind_e2e::wait::{wait_for, wait_gone};
use kbind_shared::api::{Binding, Import};
use kbind_shared::keys;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

const WIDGETS: &str = "widgets.example.org";
const IMPORTED: usize = 100;

/// The writes to Widgets kbind's programs made on a cluster, as (verb, namespace/name).
fn kbind_widget_writes(audited: Vec<Audited>) -> Vec<(String, String)> {
    audited
        .into_iter()
        .filter(|a| {
            a.resource == "widgets"
                && a.user_agent.starts_with("kbind-")
                && matches!(
                    a.verb.as_str(),
                    "create" | "update" | "patch" | "delete" | "deletecollection"
                )
        })
        .map(|a| (a.verb, format!("{}/{}", a.namespace, a.name)))
        .collect()
}

/// A Widget someone other than kbind made on the provider, with `labels` and `annotations`.
fn provider_widget(
    name: &str,
    size: i64,
    labels: serde_json::Value,
    annotations: serde_json::Value,
) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "example.org/v1",
        "kind": "Widget",
        "metadata": { "name": name, "labels": labels, "annotations": annotations },
        "spec": { "size": size },
    }))
    .unwrap()
}

async fn bind_importing(consumer: &kube::Client, namespace: &str, limit: u32) -> Api<Binding> {
    let bindings: Api<Binding> = Api::namespaced(consumer.clone(), namespace);
    let mut spec = binding_spec("provider", &[WIDGETS]);
    spec.import = Some(Import { limit });
    bindings
        .create(&PostParams::default(), &Binding::new("widgets", spec))
        .await
        .unwrap();
    wait_binding(&bindings, "widgets", "Ready=True").await;
    bindings
}

/// The consumer's Widgets of `namespace` by name.
async fn by_name(client: &kube::Client, namespace: &str) -> BTreeMap<String, DynamicObject> {
    widgets(client, namespace)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|w| (w.name_any(), w))
        .collect()
}

/// `kbind_imported_objects{api="widgets.example.org",state}` as the syncer serves it now.
async fn imported(syncer: &Program, state: &str) -> f64 {
    let metrics = syncer.metrics().await.unwrap();
    metric_sum(
        &metrics,
        "kbind_imported_objects",
        &[("api", WIDGETS), ("state", state)],
    )
}

/// Sets `spec.size` of Widget `name` (a merge patch, as a user would).
async fn set_size(api: &Api<DynamicObject>, name: &str, size: i64) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "size": size } })),
    )
    .await
    .unwrap();
}

fn state(w: &DynamicObject) -> Option<&str> {
    w.data["status"]["kbindSync"]["state"].as_str()
}

#[tokio::test]
async fn provider_objects_are_observed_without_a_write_claimed_in_one_and_let_go_of_on_unbind() {
    let s = SyncEnv::start("import", &[0, 1], None).await;
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    for namespace in ["team-a", "team-b", "team-c"] {
        ensure_namespace(&s.consumer, namespace).await.unwrap();
        ensure_namespace(&s.provider, namespace).await.unwrap();
    }
    let on_provider = |ns: &str| widgets(&s.provider, ns);
    // What the provider's admins made before any binding: 100 Widgets in team-a, one another
    // consumer owns (its markers), 8 in team-b (whose Binding imports 5) and one in team-c (no
    // Binding imports there).
    for i in 0..IMPORTED {
        on_provider("team-a")
            .create(
                &PostParams::default(),
                &provider_widget(&format!("w{i:03}"), i as i64, json!({}), json!({})),
            )
            .await
            .unwrap();
    }
    let theirs = provider_widget(
        "theirs",
        7,
        json!({ keys::CONSUMER_CLUSTER_UID_LABEL: "another-cluster", keys::MANAGED_LABEL: "true" }),
        json!({ keys::CONSUMER_CLUSTER_UID_ANNOTATION: "another-cluster", keys::CONSUMER_OBJECT_UID_ANNOTATION: "another-object" }),
    );
    on_provider("team-a")
        .create(&PostParams::default(), &theirs)
        .await
        .unwrap();
    for i in 0..8 {
        on_provider("team-b")
            .create(
                &PostParams::default(),
                &provider_widget(&format!("b{i}"), i, json!({}), json!({})),
            )
            .await
            .unwrap();
    }
    on_provider("team-c")
        .create(
            &PostParams::default(),
            &provider_widget("c0", 1, json!({}), json!({})),
        )
        .await
        .unwrap();

    let bindings = bind_importing(&s.consumer, "team-a", 1000).await;
    // A user's object carrying the import label — a mirror's YAML applied again by hand — that no
    // provider object stands for: not a mirror (kbind did not set the label), so import neither
    // writes nor deletes it. (Paused, so that its ordinary sync writes nothing to the provider.)
    let copied: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.org/v1", "kind": "Widget",
        "metadata": { "name": "copied", "labels": { keys::IMPORTED_LABEL: "provider" },
            "annotations": { keys::PAUSED_ANNOTATION: "true" } },
        "spec": { "size": 42 },
    }))
    .unwrap();
    widgets(&s.consumer, "team-a")
        .create(&PostParams::default(), &copied)
        .await
        .unwrap();
    bind_importing(&s.consumer, "team-b", 5).await;
    // team-c is bound too, without import.
    bind_in(&s.consumer, "team-c", "widgets", "provider", &[WIDGETS]).await;

    // 100 mirrors, Observed, with the provider's spec and status (its controller's).
    let mut mirrors = wait_for("100 observed mirrors in team-a", 90, || async {
        let all = by_name(&s.consumer, "team-a").await;
        let observed = all
            .values()
            .filter(|w| state(w) == Some("Observed") && w.data["status"]["phase"] == "Ready")
            .count();
        Ok((observed == IMPORTED).then_some(all))
    })
    .await;
    assert!(
        !mirrors.contains_key("theirs"),
        "another consumer's copy is never imported"
    );
    let labelled = mirrors
        .remove("copied")
        .expect("the user's labelled object");
    assert_eq!(
        state(&labelled),
        Some("Paused"),
        "its own sync's record, not Observed"
    );
    for (name, mirror) in &mirrors {
        let provider = on_provider("team-a").get(name).await.unwrap();
        assert_eq!(mirror.data["spec"], provider.data["spec"], "{name}");
        assert_eq!(
            mirror
                .labels()
                .get(keys::IMPORTED_LABEL)
                .map(String::as_str),
            Some("provider"),
            "{name}"
        );
        assert!(mirror.finalizers().is_empty(), "{name}: nothing to release");
    }
    let (columns, row) = table(&s.consumer, "team-a", "w000").await;
    let delivery = columns.iter().position(|c| c == "Delivery").unwrap();
    assert_eq!(
        row[delivery], "Observed",
        "kubectl get shows it: {columns:?} {row:?}"
    );
    // team-b: 5 of 8 (the limit), the first by name; the Binding's Event says how many are left.
    let team_b = wait_for("team-b's 5 mirrors", 60, || async {
        let all = by_name(&s.consumer, "team-b").await;
        Ok((all.len() == 5 && all.values().all(|w| state(w) == Some("Observed"))).then_some(all))
    })
    .await;
    assert_eq!(
        team_b.keys().collect::<Vec<_>>(),
        ["b0", "b1", "b2", "b3", "b4"]
    );
    let events = wait_for("the limit's Event", 30, || async {
        let events = warning_events(&s.consumer, Some("team-b"), "widgets").await;
        Ok((!events.is_empty()).then_some(events))
    })
    .await;
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("ImportLimitReached: 3 provider objects")),
        "{events:?}"
    );
    assert_eq!(imported(&s.syncer, "observed").await, (IMPORTED + 5) as f64);
    assert_eq!(imported(&s.syncer, "over_limit").await, 3.0);
    assert!(
        by_name(&s.consumer, "team-c").await.is_empty(),
        "team-c does not import"
    );
    // At rest, import writes nothing on the consumer either.
    let consumer_writes = || kbind_widget_writes(s.env.cluster("consumer").audited()).len();
    let settled = consumer_writes();
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(consumer_writes(), settled, "writes at rest");
    let provider_writes = kbind_widget_writes(s.env.cluster("provider").audited());
    assert!(
        provider_writes.is_empty(),
        "importing wrote to the provider: {provider_writes:?}"
    );

    // `kubectl kbind diff` says what a mirror is, and that the provider object is unmarked.
    let kubeconfig = s.env.cluster("consumer").admin_kubeconfig_path();
    let run = plugin(&kubeconfig, &["diff", "widget/w005", "-n", "team-a"]).await;
    assert!(
        run.stdout.contains("imported:     a read-only mirror")
            && run.stdout.contains("markers say Unmarked")
            && run.stdout.contains("delivery:     Observed"),
        "{run}"
    );
    // A mirror is read-only: an edit is reverted, with a Warning Event.
    set_size(&widgets(&s.consumer, "team-a"), "w010", 999).await;
    wait_for("w010's edit reverted", 30, || async {
        let w = widgets(&s.consumer, "team-a").get("w010").await.unwrap();
        Ok((w.data["spec"]["size"] == 10).then_some(()))
    })
    .await;
    // The Event follows the reverting write (said only once that write succeeded).
    wait_warning(
        &s.consumer,
        Some("team-a"),
        "w010",
        "ImportedObjectReverted",
    )
    .await;
    // A deleted mirror is made again while the Binding imports its object.
    let old_uid = widgets(&s.consumer, "team-a")
        .get("w030")
        .await
        .unwrap()
        .uid();
    widgets(&s.consumer, "team-a")
        .delete("w030", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("w030 mirrored again", 30, || async {
        let again = widgets(&s.consumer, "team-a")
            .get_opt("w030")
            .await
            .unwrap();
        Ok(again
            .filter(|w| w.uid() != old_uid && state(w) == Some("Observed"))
            .map(|_| ()))
    })
    .await;
    // A provider change is mirrored (spec, and the status its controller writes).
    set_size(&on_provider("team-a"), "w020", 2020).await;
    wait_for("w020's provider change mirrored", 30, || async {
        let w = widgets(&s.consumer, "team-a").get("w020").await.unwrap();
        Ok(
            (w.data["spec"]["size"] == 2020 && w.data["status"]["observedSize"] == 2020)
                .then_some(()),
        )
    })
    .await;
    assert!(kbind_widget_writes(s.env.cluster("provider").audited()).is_empty());

    // Claiming 3: one provider write each adds kbind's markers; then they sync both ways.
    let claimed = ["w001", "w002", "w003"];
    for name in claimed {
        widgets(&s.consumer, "team-a")
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({ "metadata": { "annotations": { keys::CLAIM_ANNOTATION: "true" } } }),
                ),
            )
            .await
            .unwrap();
    }
    for name in claimed {
        let uid = widgets(&s.consumer, "team-a")
            .get(name)
            .await
            .unwrap()
            .uid()
            .unwrap();
        wait_for(&format!("{name} adopted and Synced"), 30, || async {
            let copy = on_provider("team-a").get(name).await.unwrap();
            let consumer = widgets(&s.consumer, "team-a").get(name).await.unwrap();
            let marked = copy.annotations().get(keys::CONSUMER_OBJECT_UID_ANNOTATION) == Some(&uid);
            Ok((marked && state(&consumer) == Some("Synced")).then_some(()))
        })
        .await;
    }
    let writes = kbind_widget_writes(s.env.cluster("provider").audited());
    let mut written: Vec<String> = writes.iter().map(|(_, object)| object.clone()).collect();
    written.sort();
    assert_eq!(
        written,
        ["team-a/w001", "team-a/w002", "team-a/w003"],
        "one provider write per claim: {writes:?}"
    );
    let run = plugin(
        &kubeconfig,
        &["diff", "widget/w001", "-n", "team-a", "-o", "json"],
    )
    .await;
    let report = run.json();
    assert_eq!(report["consumer"]["imported"], "Claimed", "{report:#}");
    assert_eq!(report["identical"], true, "{report:#}");
    assert_eq!(
        report["provider"]["copy"]["ownership"], "Ours",
        "{report:#}"
    );
    resize_and_wait_upstream(
        &widgets(&s.consumer, "team-a"),
        &on_provider("team-a"),
        "w002",
        222,
    )
    .await;
    wait_for("w002's status back", 30, || async {
        let w = widgets(&s.consumer, "team-a").get("w002").await.unwrap();
        Ok((w.data["status"]["observedSize"] == 222).then_some(()))
    })
    .await;
    assert_eq!(
        imported(&s.syncer, "observed").await,
        (IMPORTED - 3 + 5) as f64
    );

    // Unbinding team-a: the unclaimed mirrors go from the consumer; nothing unclaimed is touched
    // on the provider.
    let before: BTreeMap<String, String> = by_name(&s.provider, "team-a")
        .await
        .into_iter()
        .map(|(name, w)| (name, w.resource_version().unwrap()))
        .collect();
    bindings
        .delete("widgets", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("team-a's unclaimed mirrors gone", 60, || async {
        let left: Vec<String> = by_name(&s.consumer, "team-a")
            .await
            .into_values()
            .filter(|w| !claimed.contains(&w.name_any().as_str()) && w.name_any() != "copied")
            .map(|w| w.name_any())
            .collect();
        Ok(left.is_empty().then_some(()))
    })
    .await;
    wait_gone(&bindings, "widgets", "team-a's Binding", 60).await;
    let copied = widgets(&s.consumer, "team-a").get("copied").await.unwrap();
    assert_eq!(
        copied.data["spec"]["size"], 42,
        "the user's labelled object is left alone"
    );
    let after = by_name(&s.provider, "team-a").await;
    for (name, version) in &before {
        if claimed.contains(&name.as_str()) {
            continue;
        }
        assert_eq!(
            after
                .get(name)
                .map(|w| w.resource_version().unwrap())
                .as_ref(),
            Some(version),
            "{name} untouched on the provider"
        );
    }
    let stray: Vec<(String, String)> = kbind_widget_writes(s.env.cluster("provider").audited())
        .into_iter()
        .filter(|(_, object)| !claimed.iter().any(|c| object == &format!("team-a/{c}")))
        .collect();
    assert!(
        stray.is_empty(),
        "kbind wrote unclaimed provider objects: {stray:?}"
    );
    // team-b still imports; turning its import off deletes its mirrors (the syncer's doing, the
    // Binding stays).
    assert_eq!(by_name(&s.consumer, "team-b").await.len(), 5);
    let team_b: Api<Binding> = Api::namespaced(s.consumer.clone(), "team-b");
    team_b
        .patch(
            "widgets",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "import": null } })),
        )
        .await
        .unwrap();
    wait_for("team-b's mirrors gone with its import", 30, || async {
        Ok(by_name(&s.consumer, "team-b")
            .await
            .is_empty()
            .then_some(()))
    })
    .await;
    let stray = kbind_widget_writes(s.env.cluster("provider").audited())
        .into_iter()
        .filter(|(_, object)| object.starts_with("team-b/"))
        .count();
    assert_eq!(stray, 0, "nothing of team-b was written on the provider");
}
