//! `kbind-reaper` (#38) on a real provider, run as a real process with its chart's RBAC and its
//! ServiceAccount's token, its host clock hours off. Consumer A is real kbind (schema manager and
//! syncer on the consumer cluster); consumer B keeps a heartbeat the way the Go reference does
//! (its markers in the label form on its namespace); C's objects carry a UID no Lease ever
//! named.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::fixtures::*;
use kbind_e2e::kbind::{apiserver_requests, grown, http_get};
use kbind_e2e::wait::{wait_for, wait_gone};
use kbind_shared::api::ClusterBinding;
use kbind_shared::heartbeat::go_lease_name;
use kbind_shared::keys;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

const UID_B: &str = "consumer-b-0000-0000";
const UID_C: &str = "consumer-c-never-leased";
const FINALIZER: &str = "provider.example.org/hold";
const PROTECT: &str = "reaper.kbind.io/protect";

/// A policy deleting Widget copies, related copies and namespaces of heartbeats in
/// `lease_namespace` stale for `stale_after`, `delete_after` later, 600 a minute.
fn delete_everything_after(
    lease_namespace: &str,
    stale_after: &str,
    delete_after: &str,
) -> serde_json::Value {
    json!({
        "leaseNamespaces": [lease_namespace],
        "staleAfter": stale_after,
        "deleteAfter": delete_after,
        "action": "Delete",
        "apis": ["widgets.example.org"],
        "includeRelated": true,
        "includeNamespaces": true,
        "deletesPerMinute": 600,
    })
}

/// Waits for consumer A's heartbeat Lease (the first kbind-managed Lease on the provider);
/// returns its namespace and A's UID.
async fn lease_of_a(provider: &Client) -> (String, String) {
    let all_leases: Api<Lease> = Api::all(provider.clone());
    let lease = wait_for("A's heartbeat Lease", 30, || async {
        let list = all_leases
            .list(&kube::api::ListParams::default().labels("core.kbind.io/managed=true"))
            .await
            .map_err(|e| e.to_string())?;
        Ok(list.items.into_iter().next())
    })
    .await;
    let namespace = lease.namespace().unwrap_or_default();
    let uid = lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    (namespace, uid)
}

/// Writes another consumer's heartbeat Lease once, as the Go konnector would (its own field
/// manager, its own clock).
async fn write_lease(
    provider: &Client,
    namespace: &str,
    name: &str,
    uid: &str,
) -> Result<Lease, kube::Error> {
    let body = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "labels": { keys::MANAGED_LABEL: keys::TRUE },
            "annotations": { keys::CONSUMER_CLUSTER_UID_ANNOTATION: uid },
        },
        "spec": {
            "holderIdentity": uid,
            "leaseDurationSeconds": 1,
            "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(jiff::Timestamp::now()),
        },
    });
    Api::<Lease>::namespaced(provider.clone(), namespace)
        .patch(
            name,
            &PatchParams::apply("go-konnector").force(),
            &Patch::Apply(&body),
        )
        .await
}

/// Single-object DELETEs of Widgets the provider's API server has served (scope `resource`: a
/// namespace's deletion empties it with collection deletes, which are not these).
async fn widget_object_deletes(provider: &Client) -> f64 {
    let text = kbind_e2e::kbind::apiserver_metrics(provider).await.unwrap();
    kbind_e2e::kbind::counter_by(
        &text,
        "apiserver_request_total",
        &["verb", "group", "resource", "scope"],
    )
    .into_iter()
    .filter(|([verb, group, resource, scope], _)| {
        verb == "DELETE" && group == "example.org" && resource == "widgets" && scope == "resource"
    })
    .map(|(_, n)| n)
    .sum()
}

fn widget_copies(provider: &Client, namespace: &str) -> Api<DynamicObject> {
    widgets(provider, namespace)
}

/// Renews consumer B's heartbeat Lease every second, as another implementation would, until
/// aborted.
fn keep_b_alive(provider: Client, namespace: String) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            // A failed renewal is one missed beat, as for any consumer.
            let _ = write_lease(&provider, &namespace, &go_lease_name(UID_B), UID_B).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

/// A Widget on the provider that belongs to `uid` by the annotation form of the marker.
fn foreign_widget(namespace: &str, name: &str, uid: &str) -> DynamicObject {
    let mut object = widget(name, 1);
    object.metadata.namespace = Some(namespace.into());
    object.metadata.labels = Some([(keys::MANAGED_LABEL.to_owned(), keys::TRUE.to_owned())].into());
    object.metadata.annotations = Some(
        [
            (
                keys::CONSUMER_CLUSTER_UID_ANNOTATION.to_owned(),
                uid.to_owned(),
            ),
            (
                keys::CONSUMER_OBJECT_UID_ANNOTATION.to_owned(),
                format!("{name}-uid"),
            ),
        ]
        .into(),
    );
    object
}

/// Every object's UID, and whether it is being deleted, by `<namespace>/<name>`.
async fn snapshot(api: &Api<DynamicObject>) -> BTreeMap<String, (String, bool)> {
    api.list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|o| {
            (
                format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any()),
                (
                    o.metadata.uid.clone().unwrap_or_default(),
                    o.metadata.deletion_timestamp.is_some(),
                ),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_consumer_is_reaped_after_both_graces_and_nothing_else_is_touched() {
    // A's heartbeat: a 1 s Lease renewed every second, so staleAfter can be 12 s (>= 10 Lease
    // durations).
    let mut s = SyncEnv::start_full(
        "reaper",
        &[0, 1, 2],
        None,
        &[],
        &["--heartbeat-lease-duration=1s"],
    )
    .await;
    let (consumer, provider) = (s.consumer.clone(), s.provider.clone());
    wait_cluster_binding_ready(&consumer, "widgets").await;

    // Consumer A's objects: w1, w2 and w3 in team-a (w3's copy will carry a provider finalizer),
    // w4 in team-p (its copy protected), and a related ConfigMap copied to team-a.
    for namespace in ["team-a", "team-p"] {
        ensure_namespace(&consumer, namespace).await.unwrap();
    }
    let consumer_a = widgets(&consumer, "team-a");
    for name in ["w1", "w2", "w3"] {
        create_and_wait_copy(&consumer_a, &widget_copies(&provider, "team-a"), name, 1).await;
    }
    create_and_wait_copy(
        &widgets(&consumer, "team-p"),
        &widget_copies(&provider, "team-p"),
        "w4",
        1,
    )
    .await;
    let mut settings = ConfigMap {
        data: Some([("colour".to_owned(), "blue".to_owned())].into()),
        ..Default::default()
    };
    settings.metadata.name = Some("settings".into());
    Api::<ConfigMap>::namespaced(consumer.clone(), "team-a")
        .create(&PostParams::default(), &settings)
        .await
        .unwrap();
    merge_patch(
        &Api::<ClusterBinding>::all(consumer.clone()),
        "widgets",
        &json!({ "spec": { "relatedResources": [
            { "resource": "configmaps", "direction": "FromConsumer",
              "selector": { "names": ["settings"] } } ] } }),
    )
    .await;
    let provider_maps: Api<ConfigMap> = Api::namespaced(provider.clone(), "team-a");
    wait_for("the related ConfigMap on the provider", 60, || async {
        Ok(provider_maps
            .get_opt("settings")
            .await
            .map_err(|e| e.to_string())?
            .map(|_| ()))
    })
    .await;
    let provider_a = widget_copies(&provider, "team-a");
    merge_patch(
        &provider_a,
        "w3",
        &json!({ "metadata": { "finalizers": [FINALIZER] } }),
    )
    .await;
    merge_patch(
        &widget_copies(&provider, "team-p"),
        "w4",
        &json!({ "metadata": { "labels": { PROTECT: "yes" } } }),
    )
    .await;

    // Where A's heartbeat is, and its UID.
    let (lease_namespace, uid_a) = lease_of_a(&provider).await;

    // Consumer B: alive, in the Go konnector's form. Consumer C: never had a Lease.
    let _b = keep_b_alive(provider.clone(), lease_namespace.clone());
    create_marked_namespace(&provider, "team-b", UID_B).await;
    create_marked_namespace(&provider, "team-c", UID_C).await;
    widget_copies(&provider, "team-b")
        .create(
            &PostParams::default(),
            &foreign_widget("team-b", "b1", UID_B),
        )
        .await
        .unwrap();
    widget_copies(&provider, "team-c")
        .create(
            &PostParams::default(),
            &foreign_widget("team-c", "c1", UID_C),
        )
        .await
        .unwrap();

    // The reaper: its chart's RBAC, its ServiceAccount's token, its host clock six hours ahead.
    let policy = delete_everything_after(&lease_namespace, "12s", "20s");
    let (reaper_index, metrics) = start_reaper(
        &mut s.env,
        &provider,
        &lease_namespace,
        policy,
        &["--host-clock-offset=+6h"],
    )
    .await;

    // Everyone is seen for what they are; six hours of host skew make no live consumer stale.
    wait_state(&provider, &uid_a, "Live", 60).await;
    wait_state(&provider, UID_B, "Live", 30).await;
    wait_state(&provider, UID_C, "NoLease", 30).await;
    let status = policy_status(&provider).await.unwrap();
    let a = status.consumers.iter().find(|c| c.uid == uid_a).unwrap();
    let counted: BTreeMap<&str, u64> = a
        .objects
        .iter()
        .map(|c| (c.api.as_str(), c.count))
        .collect();
    assert_eq!(
        counted,
        BTreeMap::from([
            ("configmaps", 1),
            ("namespaces", 2),
            ("protected", 1),
            ("widgets.example.org", 3)
        ]),
        "A's objects as the provider holds them"
    );
    assert_eq!(a.connections, ["provider"]);
    let text = http_get(&metrics, "/metrics").await.unwrap().1;
    assert_eq!(
        metric_sum(&text, "kbind_reaper_consumers", &[("state", "Live")]),
        f64::from(status.counts.live)
    );
    let before = snapshot(&Api::all_with(provider.clone(), &widget_resource())).await;
    let requests_before = apiserver_requests(&provider).await.unwrap();
    let widget_deletes_before = widget_object_deletes(&provider).await;

    // A's schema manager stops: no more renewals. A is Stale after staleAfter, and comes back
    // inside deleteAfter: nothing of it is lost.
    s.env.process(s.manager.index).kill();
    wait_state(&provider, &uid_a, "Stale", 40).await;
    s.manager = start_schema_manager(
        &mut s.env,
        "consumer",
        "schema-manager-again",
        &["--heartbeat-lease-duration=1s"],
    )
    .await
    .unwrap();
    wait_state(&provider, &uid_a, "Live", 30).await;
    let after = snapshot(&Api::all_with(provider.clone(), &widget_resource())).await;
    assert_eq!(
        before, after,
        "a consumer back inside the grace loses nothing"
    );
    let deletes = |m: &BTreeMap<String, u64>| {
        m.iter()
            .filter(|(k, _)| k.starts_with("DELETE "))
            .map(|(k, v)| (k.clone(), *v))
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(
        deletes(&grown(
            &requests_before,
            &apiserver_requests(&provider).await.unwrap()
        )),
        BTreeMap::new(),
        "no delete reached the provider"
    );

    // Now A dies for good: schema manager and syncer stopped.
    s.env.process(s.manager.index).kill();
    s.env.process(s.syncer.index).kill();
    wait_state(&provider, &uid_a, "Stale", 40).await;
    assert_eq!(
        state_of(&policy_status(&provider).await.unwrap(), UID_B),
        "Live"
    );
    // After deleteAfter: its copies and its related copy go; w3 waits for the provider's
    // finalizer, which is not stripped.
    wait_gone(&provider_a, "w1", "w1 reaped", 60).await;
    wait_gone(&provider_a, "w2", "w2 reaped", 30).await;
    wait_gone(&provider_maps, "settings", "the related copy reaped", 30).await;
    let w3 = provider_a.get("w3").await.unwrap();
    assert!(
        w3.metadata.deletion_timestamp.is_some(),
        "w3 is being deleted"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let w3 = provider_a.get("w3").await.unwrap();
    assert_eq!(
        w3.metadata.finalizers.as_deref(),
        Some(&[FINALIZER.to_owned()][..]),
        "the provider's finalizer is waited for, not stripped"
    );
    assert_eq!(
        state_of(&policy_status(&provider).await.unwrap(), &uid_a),
        "Reaping"
    );
    let namespaces: Api<Namespace> = Api::all(provider.clone());
    let team_a = namespaces.get("team-a").await.unwrap();
    assert!(
        team_a.metadata.deletion_timestamp.is_none(),
        "the namespace waits for the consumer's objects in it"
    );
    merge_patch(
        &provider_a,
        "w3",
        &json!({ "metadata": { "finalizers": null } }),
    )
    .await;
    wait_gone(&provider_a, "w3", "w3 gone once its finalizer is done", 30).await;
    wait_for("team-a to be deleted", 60, || async {
        Ok(namespaces
            .get_opt("team-a")
            .await
            .map_err(|e| e.to_string())?
            .is_none_or(|n| n.metadata.deletion_timestamp.is_some())
            .then_some(()))
    })
    .await;

    // What is protected, and everything of B and C, is untouched — and team-p, holding a
    // protected object, is kept.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let w4 = widget_copies(&provider, "team-p").get("w4").await.unwrap();
    assert!(
        w4.metadata.deletion_timestamp.is_none(),
        "a protected object survives"
    );
    let team_p = namespaces.get("team-p").await.unwrap();
    assert!(
        team_p.metadata.deletion_timestamp.is_none(),
        "team-p holds a protected object"
    );
    let now = snapshot(&Api::all_with(provider.clone(), &widget_resource())).await;
    for key in ["team-b/b1", "team-c/c1", "team-p/w4"] {
        assert_eq!(now.get(key), before.get(key), "{key} untouched");
    }
    for name in ["team-b", "team-c"] {
        let namespace = namespaces.get(name).await.unwrap();
        assert!(
            namespace.metadata.deletion_timestamp.is_none(),
            "{name} untouched"
        );
    }
    let status = policy_status(&provider).await.unwrap();
    assert_eq!(state_of(&status, UID_B), "Live");
    assert_eq!(state_of(&status, UID_C), "NoLease");
    // Once team-a is gone, nothing is left to act on: Reaped, though team-p and w4 remain,
    // kept — and the status counts them.
    wait_state(&provider, &uid_a, "Reaped", 60).await;
    let status = policy_status(&provider).await.unwrap();
    let a = status.consumers.iter().find(|c| c.uid == uid_a).unwrap();
    let count = |api: &str| a.objects.iter().find(|c| c.api == api).map(|c| c.count);
    assert_eq!(
        (count("namespaces"), count("protected")),
        (Some(1), Some(1)),
        "{a:#?}"
    );

    // The metric counts exactly the deletes the provider's API server served for the reaper
    // (nobody else deletes Widgets here), and the objects that went away.
    let text = http_get(&metrics, "/metrics").await.unwrap().1;
    let served = deletes(&grown(
        &requests_before,
        &apiserver_requests(&provider).await.unwrap(),
    ));
    eprintln!("deletes the provider served since A died: {served:?}");
    let reaped = |api: &str| {
        metric_sum(
            &text,
            "kbind_reaper_objects_total",
            &[("api", api), ("action", "Delete")],
        )
    };
    assert_eq!(
        reaped("widgets.example.org"),
        widget_object_deletes(&provider).await - widget_deletes_before,
        "the metric counts the Widget deletes the provider served"
    );
    assert_eq!(reaped("widgets.example.org"), 3.0, "w1, w2, w3");
    assert_eq!(reaped("configmaps"), 1.0, "the related copy, gone above");
    assert_eq!(reaped("namespaces"), 1.0, "team-a only, deleted above");
    assert!(
        s.env.process(reaper_index).is_running(),
        "the reaper runs on"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_strips_a_dead_consumers_markers_and_a_consumer_that_left_is_never_touched() {
    let s = SyncEnv::start_full(
        "reaper_orphan",
        &[0, 1, 2],
        None,
        &[],
        &["--heartbeat-lease-duration=1s"],
    )
    .await;
    let (consumer, provider) = (s.consumer.clone(), s.provider.clone());
    let mut env = s.env;
    wait_cluster_binding_ready(&consumer, "widgets").await;
    ensure_namespace(&consumer, "team-a").await.unwrap();
    create_and_wait_copy(
        &widgets(&consumer, "team-a"),
        &widget_copies(&provider, "team-a"),
        "w1",
        1,
    )
    .await;
    let (lease_namespace, uid_a) = lease_of_a(&provider).await;

    // Consumer D renewed its Lease once and died; its copy and namespace remain.
    const UID_D: &str = "consumer-d-dead";
    write_lease(&provider, &lease_namespace, &go_lease_name(UID_D), UID_D)
        .await
        .unwrap();
    create_marked_namespace(&provider, "team-d", UID_D).await;
    let d1 = widget_copies(&provider, "team-d")
        .create(
            &PostParams::default(),
            &foreign_widget("team-d", "d1", UID_D),
        )
        .await
        .unwrap();

    let policy = json!({
        "leaseNamespaces": [lease_namespace],
        "staleAfter": "12s",
        "deleteAfter": "3s",
        "action": "Orphan",
        "apis": ["widgets.example.org"],
        "includeNamespaces": true,
    });
    let (_reaper, metrics) = start_reaper(&mut env, &provider, &lease_namespace, policy, &[]).await;
    wait_state(&provider, &uid_a, "Live", 60).await;

    // A leaves in order: its binding and then its Connection deleted, its Lease marked.
    let bindings = Api::<ClusterBinding>::all(consumer.clone());
    bindings
        .delete("widgets", &Default::default())
        .await
        .unwrap();
    wait_gone(&bindings, "widgets", "the ClusterBinding to go", 60).await;
    delete_connection(&consumer, "provider").await;
    wait_state(&provider, &uid_a, "Left", 30).await;

    // D is orphaned after both graces: the same objects, without kbind's markers.
    wait_state(&provider, UID_D, "Reaped", 60).await;
    let orphaned = widget_copies(&provider, "team-d").get("d1").await.unwrap();
    assert_eq!(
        orphaned.metadata.uid, d1.metadata.uid,
        "the same object, not re-created"
    );
    assert!(orphaned.metadata.deletion_timestamp.is_none());
    for key in [
        keys::CONSUMER_CLUSTER_UID_ANNOTATION,
        keys::CONSUMER_OBJECT_UID_ANNOTATION,
    ] {
        assert_eq!(annotation(&orphaned, key), None, "{key} removed");
    }
    assert_eq!(label(&orphaned, keys::MANAGED_LABEL), None);
    let team_d = Api::<Namespace>::all(provider.clone())
        .get("team-d")
        .await
        .unwrap();
    assert!(
        team_d.metadata.deletion_timestamp.is_none(),
        "orphaned, not deleted"
    );
    assert_eq!(label(&team_d, keys::CONSUMER_CLUSTER_UID_ANNOTATION), None);

    // A stays Left, well past both graces: what it left behind keeps its markers.
    tokio::time::sleep(Duration::from_secs(18)).await;
    let status = policy_status(&provider).await.unwrap();
    assert_eq!(state_of(&status, &uid_a), "Left");
    let team_a = Api::<Namespace>::all(provider.clone())
        .get("team-a")
        .await
        .unwrap();
    assert_eq!(
        label(&team_a, keys::CONSUMER_CLUSTER_UID_ANNOTATION),
        Some(uid_a.as_str()),
        "a consumer that left is never touched"
    );
    let text = http_get(&metrics, "/metrics").await.unwrap().1;
    let orphans = |api: &str| {
        metric_sum(
            &text,
            "kbind_reaper_objects_total",
            &[("api", api), ("action", "Orphan")],
        )
    };
    assert_eq!(orphans("widgets.example.org"), 1.0, "d1");
    assert_eq!(orphans("namespaces"), 1.0, "team-d");
    assert_eq!(
        metric_sum(&text, "kbind_reaper_consumers", &[("state", "Left")]),
        f64::from(status.counts.left)
    );
}

/// The provider admin's kubeconfig with its context's namespace set: a Connection using it keeps
/// its heartbeat Lease there (HB-2).
fn with_context_namespace(kubeconfig: &str, namespace: &str) -> String {
    let mut value: serde_yaml::Value = serde_yaml::from_str(kubeconfig).unwrap();
    value["contexts"][0]["context"]["namespace"] = serde_yaml::Value::from(namespace);
    serde_yaml::to_string(&value).unwrap()
}

/// Writes a heartbeat Lease in kbind's form for `connection` of consumer `uid`, as a consumer
/// (or a co-tenant forging one) would.
async fn write_kbind_lease(provider: &Client, namespace: &str, connection: &str, uid: &str) {
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(jiff::Timestamp::now());
    let body = kbind_shared::heartbeat::lease_body(connection, uid, 1, None, None, &now);
    let name = kbind_shared::heartbeat::lease_name(connection, uid);
    // A failed renewal is one missed beat.
    let _ = Api::<Lease>::namespaced(provider.clone(), namespace)
        .patch(
            &name,
            &PatchParams::apply("someone").force(),
            &Patch::Apply(&body),
        )
        .await;
}

/// A Widget copy of consumer `uid` written through the Connection whose heartbeat is `heartbeat`
/// (`None`: a copy without the record, as the Go konnector writes them).
fn copy_of(namespace: &str, name: &str, uid: &str, heartbeat: Option<&str>) -> DynamicObject {
    let mut object = foreign_widget(namespace, name, uid);
    if let Some(record) = heartbeat {
        object
            .annotations_mut()
            .insert(keys::HEARTBEAT_ANNOTATION.into(), record.into());
    }
    object
}

fn gadget_crd()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    kbind_e2e::fixtures::crd("gadgets", "example.org", "Gadget", &[])
}

/// Whether `result` is the API server's refusal (403: RBAC, or the reaper's admission fence).
fn refused<T: std::fmt::Debug>(result: Result<T, kube::Error>, what: &str) -> String {
    match result {
        Err(kube::Error::Api(s)) if s.code == 403 => s.message,
        other => panic!("{what} was not refused: {other:?}"),
    }
}

/// Each object's UID and whether kbind's markers are still on it and it is not being deleted:
/// what "untouched by the reaper" means for a live consumer's object.
async fn intact(api: &Api<DynamicObject>, name: &str) -> (String, bool) {
    let object = api.get(name).await.unwrap();
    let marked = object.labels().get(keys::MANAGED_LABEL).map(String::as_str) == Some(keys::TRUE)
        || object.labels().is_empty();
    (
        object.metadata.uid.clone().unwrap_or_default(),
        marked && object.metadata.deletion_timestamp.is_none(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_co_tenant_can_make_the_reaper_touch_a_live_consumer() {
    // Consumer A is real kbind whose heartbeat lives in tenant-a, a namespace the policy does
    // not read; its copies record that heartbeat.
    let mut s = SyncEnv::start_full(
        "reaper-adversaries",
        &[0, 1, 2],
        None,
        &[],
        &["--heartbeat-lease-duration=1s"],
    )
    .await;
    let (consumer, provider) = (s.consumer.clone(), s.provider.clone());
    let provider_admin = s.env.cluster("provider").admin_kubeconfig();
    put_kubeconfig(
        &consumer,
        "provider-kubeconfig",
        &with_context_namespace(&provider_admin, "tenant-a"),
    )
    .await;
    wait_cluster_binding_ready(&consumer, "widgets").await;
    ensure_namespace(&consumer, "team-a").await.unwrap();
    let provider_a = widget_copies(&provider, "team-a");
    for name in ["w1", "w2"] {
        create_and_wait_copy(&widgets(&consumer, "team-a"), &provider_a, name, 1).await;
    }
    let uid_a = uid_of_kube_system(&consumer).await;
    let a_record = kbind_shared::heartbeat::record(Some("tenant-a"), "provider", &uid_a);
    let a_lease = wait_for("A's heartbeat in tenant-a", 60, || async {
        Api::<Lease>::namespaced(provider.clone(), "tenant-a")
            .get_opt(&kbind_shared::heartbeat::lease_name("provider", &uid_a))
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    assert!(a_lease.spec.is_some());
    // A's copies carry the record of the heartbeat of the Connection that wrote them.
    wait_for("A's copies to record A's heartbeat", 60, || async {
        let w1 = provider_a.get("w1").await.map_err(|e| e.to_string())?;
        Ok((annotation(&w1, keys::HEARTBEAT_ANNOTATION) == Some(a_record.as_str())).then_some(()))
    })
    .await;

    // The other consumers, kept as other implementations would, in the namespace the policy
    // reads (kbind): B alive (the Go konnector's form), D dead, E with two Connections.
    const UID_D: &str = "consumer-d-dead-000";
    const UID_E: &str = "consumer-e-0000000000";
    let watched = "kbind";
    ensure_namespace(&provider, watched).await.unwrap();
    install_crd(&provider, &gadget_crd()).await.unwrap();
    let _b = keep_b_alive(provider.clone(), watched.to_owned());
    write_lease(&provider, watched, &go_lease_name(UID_D), UID_D)
        .await
        .unwrap();
    write_kbind_lease(&provider, watched, "x", UID_E).await;
    let e_y = tokio::spawn({
        let provider = provider.clone();
        async move {
            loop {
                write_kbind_lease(&provider, watched, "y", UID_E).await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    });
    // A co-tenant clears B's managedFields right after each of its renewals.
    let b_lease = go_lease_name(UID_B);
    let clearing = tokio::spawn({
        let provider = provider.clone();
        let b_lease = b_lease.clone();
        async move {
            let leases = Api::<Lease>::namespaced(provider, watched);
            loop {
                let _ = leases
                    .patch(
                        &b_lease,
                        &PatchParams::default(),
                        &Patch::Merge(json!({ "metadata": { "managedFields": [{}] } })),
                    )
                    .await;
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
        }
    });
    // A co-tenant's fake Lease for A, in kbind's very name form, where the policy reads: A had
    // no visible heartbeat, and this one is never renewed.
    write_kbind_lease(&provider, watched, "provider", &uid_a).await;

    // B's objects: a copy in team-b, and in the namespaces dead D created, something each:
    // team-x1 a Gadget (an API the policy does not list), team-x2 a related Secret, team-x3 the
    // provider's own PVC. D's copies sit beside them; team-d holds only D's.
    create_marked_namespace(&provider, "team-b", UID_B).await;
    widget_copies(&provider, "team-b")
        .create(
            &PostParams::default(),
            &copy_of("team-b", "b1", UID_B, None),
        )
        .await
        .unwrap();
    for namespace in ["team-x1", "team-x2", "team-x3", "team-d"] {
        create_marked_namespace(&provider, namespace, UID_D).await;
        widget_copies(&provider, namespace)
            .create(
                &PostParams::default(),
                &copy_of(namespace, "d1", UID_D, None),
            )
            .await
            .unwrap();
    }
    let gadgets = |ns: &str| {
        let gvk = kube::api::GroupVersionKind::gvk("example.org", "v1", "Gadget");
        Api::<DynamicObject>::namespaced_with(
            provider.clone(),
            ns,
            &kube::api::ApiResource::from_gvk_with_plural(&gvk, "gadgets"),
        )
    };
    let mut gadget = copy_of("team-x1", "g1", UID_B, None);
    gadget.types = Some(kube::api::TypeMeta {
        api_version: "example.org/v1".into(),
        kind: "Gadget".into(),
    });
    gadgets("team-x1")
        .create(&PostParams::default(), &gadget)
        .await
        .unwrap();
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {
            "name": "b-settings", "namespace": "team-x2",
            "labels": { keys::MANAGED_LABEL: keys::TRUE },
            "annotations": { keys::CONSUMER_CLUSTER_UID_ANNOTATION: UID_B },
        },
        "stringData": { "k": "v" },
    }))
    .unwrap();
    let secrets =
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(provider.clone(), "team-x2");
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let claim: k8s_openapi::api::core::v1::PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": { "name": "data", "namespace": "team-x3" },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": { "requests": { "storage": "1Gi" } },
        },
    }))
    .unwrap();
    let claims = Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(
        provider.clone(),
        "team-x3",
    );
    claims.create(&PostParams::default(), &claim).await.unwrap();
    // E's copies, each written through one of its Connections (the record as kbind writes it).
    create_marked_namespace(&provider, "team-e", UID_E).await;
    for (name, connection) in [("e-x1", "x"), ("e-y1", "y")] {
        let record = kbind_shared::heartbeat::record(Some(watched), connection, UID_E);
        widget_copies(&provider, "team-e")
            .create(
                &PostParams::default(),
                &copy_of("team-e", name, UID_E, Some(&record)),
            )
            .await
            .unwrap();
    }

    // The reaper on Delete with its chart's RBAC and admission fence, its host clock hours off.
    let policy = delete_everything_after(watched, "12s", "20s");
    let flags = [
        "--host-clock-offset=-5h",
        "--leader-election-lease-duration=3s",
    ];
    let (reaper_index, _metrics) =
        start_reaper(&mut s.env, &provider, watched, policy, &flags).await;

    // The fence, tried with the reaper's own token: each forbidden write is refused by RBAC or
    // by the admission policy, and what it must do is allowed.
    let account = s
        .env
        .cluster("provider")
        .mint_service_account_user(REAPER_NAMESPACE, REAPER_SERVICE_ACCOUNT)
        .await
        .unwrap();
    let reaper_client = kbind_e2e::cluster::client_for(&account.kubeconfig)
        .await
        .unwrap();
    let mut unmarked = widget("provider-own", 1);
    unmarked.metadata.namespace = Some("team-b".into());
    widget_copies(&provider, "team-b")
        .create(&PostParams::default(), &unmarked)
        .await
        .unwrap();
    let fenced = refused(
        widget_copies(&reaper_client, "team-b")
            .delete("provider-own", &Default::default())
            .await,
        "deleting a Widget without kbind's marker",
    );
    assert!(fenced.contains("kbind-reaper may only change"), "{fenced}");
    refused(
        Api::<Lease>::namespaced(reaper_client.clone(), watched)
            .patch(
                &b_lease,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "labels": { "x": "y" } } })),
            )
            .await,
        "writing a consumer's Lease",
    );
    refused(
        Api::<Namespace>::all(reaper_client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({ "metadata": { "name": "made-by-reaper" } }))
                    .unwrap(),
            )
            .await,
        "creating a namespace",
    );
    let fenced = refused(
        Api::<ConfigMap>::namespaced(reaper_client.clone(), REAPER_NAMESPACE)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({ "metadata": { "name": "not-its-record" } }))
                    .unwrap(),
            )
            .await,
        "creating a ConfigMap that is not its record",
    );
    assert!(fenced.contains("kbind-reaper may only change"), "{fenced}");
    let throwaway = copy_of("team-b", "throwaway", "nobody-0000000", None);
    widget_copies(&provider, "team-b")
        .create(&PostParams::default(), &throwaway)
        .await
        .unwrap();
    widget_copies(&reaper_client, "team-b")
        .delete("throwaway", &Default::default())
        .await
        .expect("a marked object may be deleted");

    // What must never be touched, before the reaper acts.
    let live: Vec<(Api<DynamicObject>, &str)> = vec![
        (provider_a.clone(), "w1"),
        (provider_a.clone(), "w2"),
        (widget_copies(&provider, "team-b"), "b1"),
        (widget_copies(&provider, "team-b"), "provider-own"),
        (widget_copies(&provider, "team-e"), "e-y1"),
        (gadgets("team-x1"), "g1"),
    ];
    let mut before = Vec::new();
    for (api, name) in &live {
        before.push(intact(api, name).await);
    }
    assert!(before.iter().all(|(_, ok)| *ok), "{before:?}");

    // D goes stale; the reaper restarts mid-grace (its host clock off the other way): the grace
    // goes on from its record, neither reset nor shortened.
    let d_key = format!("{watched}/{}", go_lease_name(UID_D));
    wait_state(&provider, UID_D, "Stale", 60).await;
    let next_of = |status: &kbind_shared::api::reaper::ReaperPolicyStatus| {
        status
            .consumers
            .iter()
            .find(|c| c.leases == [d_key.clone()])
            .and_then(|c| c.next_change.clone())
    };
    let status = policy_status(&provider).await.unwrap();
    let due = next_of(&status).expect("D's next change");
    let swept = status.last_sweep.clone();
    s.env.process(reaper_index).kill();
    let restarted = run_reaper(
        &mut s.env,
        "reaper-again",
        "0",
        &[
            "--host-clock-offset=+7h",
            "--leader-election-lease-duration=3s",
        ],
    );
    let after_restart = wait_for("a sweep of the restarted reaper", 60, || async {
        let status = policy_status(&provider).await?;
        Ok((status.last_sweep != swept).then_some(status))
    })
    .await;
    assert_eq!(
        next_of(&after_restart),
        Some(due),
        "the grace is neither reset nor shortened by a restart: {after_restart:#?}"
    );
    let d1 = widget_copies(&provider, "team-d").get("d1").await.unwrap();
    assert!(
        d1.metadata.deletion_timestamp.is_none(),
        "nothing of D is deleted before its grace ends"
    );

    // D's copies go, and team-d with them; team-x1..3 stay, each for what else it holds.
    let namespaces: Api<Namespace> = Api::all(provider.clone());
    for namespace in ["team-x1", "team-x2", "team-x3", "team-d"] {
        wait_gone(
            &widget_copies(&provider, namespace),
            "d1",
            &format!("D's copy in {namespace} reaped"),
            90,
        )
        .await;
    }
    wait_for("team-d to be deleted", 60, || async {
        Ok(namespaces
            .get_opt("team-d")
            .await
            .map_err(|e| e.to_string())?
            .is_none_or(|n| n.metadata.deletion_timestamp.is_some())
            .then_some(()))
    })
    .await;
    wait_state(&provider, UID_D, "Reaped", 60).await;
    // Well past every grace of the fake Lease for A and of B's cleared Lease.
    tokio::time::sleep(Duration::from_secs(8)).await;
    for namespace in ["team-x1", "team-x2", "team-x3", "team-e"] {
        let kept = namespaces.get(namespace).await.unwrap();
        assert!(
            kept.metadata.deletion_timestamp.is_none(),
            "{namespace} holds something that is not D's: kept"
        );
    }
    let mut after = Vec::new();
    for (api, name) in &live {
        after.push(intact(api, name).await);
    }
    assert_eq!(before, after, "no live object touched");
    assert!(secrets.get_opt("b-settings").await.unwrap().is_some());
    assert!(claims.get_opt("data").await.unwrap().is_some());
    // E's copy written through its lapsed Connection goes; the other's stays.
    wait_gone(
        &widget_copies(&provider, "team-e"),
        "e-x1",
        "E's copy through its lapsed Connection reaped",
        60,
    )
    .await;
    let status = policy_status(&provider).await.unwrap();
    let state = |uid: &str, lease: Option<&str>| {
        status
            .consumers
            .iter()
            .filter(|c| c.uid == uid && lease.is_none_or(|l| c.leases == [l.to_owned()]))
            .map(|c| c.state.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(state(UID_B, None), ["Live"], "{status:#?}");
    assert!(
        state(&uid_a, None).contains(&"Unaccounted".to_owned()),
        "{status:#?}"
    );
    let e_y_key = format!(
        "{watched}/{}",
        kbind_shared::heartbeat::lease_name("y", UID_E)
    );
    assert_eq!(state(UID_E, Some(&e_y_key)), ["Live"], "{status:#?}");
    assert!(status.counts.unaccounted >= 1);

    // `kubectl kbind consumers` shows what the policy's status says, and the Leases.
    let consumer_kubeconfig = s.env.cluster("consumer").admin_kubeconfig_path();
    let provider_kubeconfig = s.env.cluster("provider").admin_kubeconfig_path();
    let provider_path = provider_kubeconfig.display().to_string();
    let run = kbind_e2e::fixtures::plugin(
        &consumer_kubeconfig,
        &[
            "consumers",
            "--provider-kubeconfig",
            &provider_path,
            "-o",
            "json",
        ],
    )
    .await;
    assert_eq!(run.code, 0, "{run}");
    let report = run.json();
    let listed: Vec<(String, String)> = report["policies"][0][1]["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["uid"].as_str().unwrap().to_owned(),
                c["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let fresh = policy_status(&provider).await.unwrap();
    assert!(
        listed.contains(&(UID_D.to_owned(), "Reaped".to_owned()))
            && listed.contains(&(UID_B.to_owned(), "Live".to_owned())),
        "{listed:?}"
    );
    assert_eq!(
        report["policies"][0][1]["counts"]["unaccounted"],
        json!(fresh.counts.unaccounted)
    );
    let leases: Vec<&str> = report["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["lease"].as_str().unwrap())
        .collect();
    for key in [d_key.as_str(), e_y_key.as_str()] {
        assert!(leases.contains(&key), "{key} in {leases:?}");
    }
    let text = kbind_e2e::fixtures::plugin(
        &consumer_kubeconfig,
        &["consumers", "--provider-kubeconfig", &provider_path],
    )
    .await;
    assert!(
        text.stdout.contains("unaccounted") && text.stdout.contains("SEEN RENEWED"),
        "{text}"
    );
    e_y.abort();
    clearing.abort();
    assert!(s.env.process(restarted).is_running(), "the reaper runs on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_report_mode_the_reaper_may_write_nothing_and_reads_related_copies_only_where_named() {
    // The chart's RBAC and fence for Report, tried with its ServiceAccount's token.
    let env = kbind_e2e::TestEnv::start("reaper-report-rbac", &["provider"])
        .await
        .unwrap();
    let provider = env.cluster("provider").admin_client().await.unwrap();
    install_crd(&provider, &widget_crd()).await.unwrap();
    for namespace in [REAPER_NAMESPACE, "kbind", "team-a", "team-b"] {
        ensure_namespace(&provider, namespace).await.unwrap();
    }
    install_reaper_rbac_with(
        &provider,
        "kbind",
        "Report",
        &["relatedNamespaces={team-a}"],
    )
    .await;
    let account = env
        .cluster("provider")
        .mint_service_account_user(REAPER_NAMESPACE, REAPER_SERVICE_ACCOUNT)
        .await
        .unwrap();
    let reaper = kbind_e2e::cluster::client_for(&account.kubeconfig)
        .await
        .unwrap();
    fence_in_force(&reaper).await;
    let w = copy_of("team-a", "w", "dead-consumer-0000", None);
    widget_copies(&provider, "team-a")
        .create(&PostParams::default(), &w)
        .await
        .unwrap();
    for namespace in ["team-a", "team-b"] {
        let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
            "metadata": {
                "name": "related", "namespace": namespace,
                "labels": { keys::MANAGED_LABEL: keys::TRUE },
                "annotations": { keys::CONSUMER_CLUSTER_UID_ANNOTATION: "dead-consumer-0000" },
            },
            "stringData": { "k": "v" },
        }))
        .unwrap();
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(provider.clone(), namespace)
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }

    // What a sweep reads: allowed.
    let params = kube::api::ListParams::default();
    Api::<DynamicObject>::all_with(reaper.clone(), &widget_resource())
        .list_metadata(&params)
        .await
        .expect("the copies' metadata");
    let related =
        |ns: &str| Api::<k8s_openapi::api::core::v1::Secret>::namespaced(reaper.clone(), ns);
    related("team-a")
        .list_metadata(&params)
        .await
        .expect("related copies' metadata where named");
    // No write verb at all.
    refused(
        widget_copies(&reaper, "team-a")
            .delete("w", &Default::default())
            .await,
        "deleting a marked copy in Report",
    );
    refused(
        widget_copies(&reaper, "team-a")
            .patch(
                "w",
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "labels": { "x": "y" } } })),
            )
            .await,
        "patching a marked copy in Report",
    );
    refused(
        related("team-a")
            .delete("related", &Default::default())
            .await,
        "deleting a related copy in Report",
    );
    refused(
        Api::<Namespace>::all(reaper.clone())
            .delete("team-a", &Default::default())
            .await,
        "deleting a namespace in Report",
    );
    // Related copies nowhere else; and no read of other kinds (that is only for Delete's
    // whole-namespace check).
    refused(
        related("team-b").list_metadata(&params).await,
        "listing Secrets where relatedNamespaces does not name",
    );
    refused(
        Api::<k8s_openapi::api::core::v1::Secret>::all(reaper.clone())
            .list_metadata(&params)
            .await,
        "listing Secrets cluster-wide",
    );
    refused(
        Api::<k8s_openapi::api::core::v1::Pod>::namespaced(reaper.clone(), "team-a")
            .list_metadata(&params)
            .await,
        "listing Pods in Report",
    );
    // Its own clock Lease: allowed; anyone else's Lease in its namespace: fenced.
    let clock = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": { "name": "kbind-reaper-clock" }, "spec": { "holderIdentity": "r" },
    });
    Api::<Lease>::namespaced(reaper.clone(), REAPER_NAMESPACE)
        .patch(
            "kbind-reaper-clock",
            &PatchParams::apply("kbind-reaper"),
            &Patch::Apply(&clock),
        )
        .await
        .expect("its own clock Lease");
    let fenced = refused(
        Api::<Lease>::namespaced(reaper.clone(), REAPER_NAMESPACE)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({ "metadata": { "name": "someone-elses" } }))
                    .unwrap(),
            )
            .await,
        "creating another Lease",
    );
    assert!(fenced.contains("kbind-reaper may only change"), "{fenced}");
}

/// How one heartbeat fares in the chaos test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Renewed throughout.
    Lives,
    /// Stops for a few seconds at a time — far less than `staleAfter` — and comes back.
    Flaps,
    /// Stops for good at some moment.
    Dies,
}

/// One heartbeat of a simulated consumer, the copies written through its Connection, and
/// whether its renewals run.
struct Beat {
    uid: String,
    /// `None`: the Go konnector's form (one Lease, copies without the record).
    connection: Option<String>,
    name: String,
    fate: Fate,
    alive: std::sync::Arc<std::sync::atomic::AtomicBool>,
    copies: Vec<(String, String, String)>,
}

impl Beat {
    async fn renew(&self, provider: &Client) {
        match &self.connection {
            Some(connection) => write_kbind_lease(provider, "kbind", connection, &self.uid).await,
            None => {
                let _ = write_lease(provider, "kbind", &self.name, &self.uid).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_no_live_consumer_loses_an_object_and_every_dead_one_is_reaped_in_bound() {
    // Consumers die, flap and are forged (copied Leases, Leases claiming their UID, cleared
    // managedFields) while the reaper restarts with its host clock anywhere; seeded, replayable.
    use std::sync::atomic::Ordering::Relaxed;
    let mut rng = kbind_e2e::chaos::Lcg(kbind_e2e::chaos::seed(49));
    let mut env = kbind_e2e::TestEnv::start("reaper-chaos", &["provider"])
        .await
        .unwrap();
    let provider = env.cluster("provider").admin_client().await.unwrap();
    install_crd(&provider, &widget_crd()).await.unwrap();
    for namespace in ["kbind", "kbind-2"] {
        ensure_namespace(&provider, namespace).await.unwrap();
    }
    let mut beats: Vec<Beat> = Vec::new();
    for i in 0..6 {
        let uid = format!("{i:02}-chaos-consumer");
        let connections: Vec<Option<&str>> = match (i % 3, rng.below(2)) {
            (0, _) => vec![None],
            (_, 0) => vec![Some("p")],
            _ => vec![Some("p"), Some("q")],
        };
        let namespace = format!("chaos-{i}");
        create_marked_namespace(&provider, &namespace, &uid).await;
        for connection in connections {
            let name = match connection {
                Some(c) => kbind_shared::heartbeat::lease_name(c, &uid),
                None => go_lease_name(&uid),
            };
            let record = connection.map(|_| format!("kbind/{name}"));
            let mut copies = Vec::new();
            for j in 0..2 {
                let copy = format!("{}-{j}", connection.unwrap_or("go"));
                let made = widget_copies(&provider, &namespace)
                    .create(
                        &PostParams::default(),
                        &copy_of(&namespace, &copy, &uid, record.as_deref()),
                    )
                    .await
                    .unwrap();
                copies.push((namespace.clone(), copy, made.metadata.uid.unwrap()));
            }
            let fate = match rng.below(3) {
                0 => Fate::Lives,
                1 => Fate::Flaps,
                _ => Fate::Dies,
            };
            beats.push(Beat {
                uid: uid.clone(),
                connection: connection.map(str::to_owned),
                name,
                fate,
                alive: std::sync::Arc::new(true.into()),
                copies,
            });
        }
    }
    // Every fate at least once.
    let count = beats.len();
    beats[0].fate = Fate::Lives;
    beats[count - 1].fate = Fate::Dies;
    if !beats.iter().any(|b| b.fate == Fate::Flaps) {
        beats[1].fate = Fate::Flaps;
    }
    for beat in &beats {
        eprintln!("{} {:?}: {:?}", beat.uid, beat.connection, beat.fate);
    }
    let beats = std::sync::Arc::new(beats);
    let renewers: Vec<_> = (0..beats.len())
        .map(|i| {
            let (beats, provider) = (beats.clone(), provider.clone());
            tokio::spawn(async move {
                loop {
                    if beats[i].alive.load(Relaxed) {
                        beats[i].renew(&provider).await;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;

    let policy = json!({
        "leaseNamespaces": ["kbind", "kbind-2"],
        "staleAfter": "12s",
        "deleteAfter": "6s",
        "action": "Delete",
        "apis": ["widgets.example.org"],
        "includeNamespaces": true,
        "deletesPerMinute": 600,
    });
    let handover = "--leader-election-lease-duration=3s";
    let (mut reaper, _) =
        start_reaper(&mut env, &provider, "kbind,kbind-2", policy, &[handover]).await;
    let start = std::time::Instant::now();
    let mut last_disruption = start;
    let mut restarts = 0;
    let leases = Api::<Lease>::namespaced(provider.clone(), "kbind");
    let forged = Api::<Lease>::namespaced(provider.clone(), "kbind-2");
    let mut step = 0;
    while start.elapsed() < Duration::from_secs(90) {
        step += 1;
        let beat = &beats[rng.below(beats.len() as u64) as usize];
        let live = beat.fate != Fate::Dies;
        match rng.below(6) {
            0 if beat.fate == Fate::Dies && beat.alive.load(Relaxed) => {
                eprintln!("step {step}: {} {:?} dies", beat.uid, beat.connection);
                beat.alive.store(false, Relaxed);
                last_disruption = last_disruption.max(std::time::Instant::now());
            }
            1 if beat.fate == Fate::Flaps && beat.alive.load(Relaxed) => {
                let pause = Duration::from_secs(2 + rng.below(4));
                eprintln!(
                    "step {step}: {} {:?} pauses {pause:?}",
                    beat.uid, beat.connection
                );
                beat.alive.store(false, Relaxed);
                let alive = beat.alive.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(pause).await;
                    alive.store(true, Relaxed);
                });
            }
            2 if live => {
                // A copy of a live consumer's Lease where the policy also reads, never renewed.
                eprintln!("step {step}: a copy of {}'s Lease in kbind-2", beat.name);
                if let Ok(Some(mut copy)) = leases.get_opt(&beat.name).await {
                    copy.metadata = kube::api::ObjectMeta {
                        name: copy.metadata.name.clone(),
                        labels: copy.metadata.labels.clone(),
                        annotations: copy.metadata.annotations.clone(),
                        ..Default::default()
                    };
                    let _ = forged.create(&PostParams::default(), &copy).await;
                }
            }
            3 if live => {
                eprintln!(
                    "step {step}: a Lease claiming {} under a name of its own",
                    beat.uid
                );
                let _ = write_lease(&provider, "kbind", &format!("forged-{step}"), &beat.uid).await;
            }
            4 if live => {
                eprintln!("step {step}: {}'s managedFields cleared", beat.name);
                let _ = leases
                    .patch(
                        &beat.name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({ "metadata": { "managedFields": [{}] } })),
                    )
                    .await;
            }
            5 => {
                restarts += 1;
                let offset = format!("--host-clock-offset={}h", rng.below(13) as i64 - 6);
                eprintln!("step {step}: the reaper restarts ({offset})");
                env.process(reaper).kill();
                reaper = run_reaper(
                    &mut env,
                    &format!("reaper-{restarts}"),
                    "0",
                    &[handover, &offset],
                );
                last_disruption = std::time::Instant::now();
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    for beat in beats.iter().filter(|b| b.fate == Fate::Dies) {
        if beat.alive.swap(false, Relaxed) {
            last_disruption = std::time::Instant::now();
        }
    }
    for beat in beats.iter().filter(|b| b.fate == Fate::Flaps) {
        beat.alive.store(true, Relaxed);
    }

    // The bound, from the later of a heartbeat's death and the reaper's last restart:
    // staleAfter + deleteAfter + two sweeps + the leader handover (12 + 6 + 4 + 3 s), then the
    // deletes at deletesPerMinute.
    let bound = Duration::from_secs(12 + 6 + 4 + 3 + 5);
    let deadline = last_disruption + bound;
    for beat in beats.iter().filter(|b| b.fate == Fate::Dies) {
        for (namespace, name, _) in &beat.copies {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            wait_gone(
                &widget_copies(&provider, namespace),
                name,
                &format!("{}'s copy {namespace}/{name} within the bound", beat.uid),
                left.as_secs().max(1),
            )
            .await;
        }
    }
    for beat in beats.iter().filter(|b| b.fate != Fate::Dies) {
        for (namespace, name, uid) in &beat.copies {
            let copy = widget_copies(&provider, namespace)
                .get_opt(name)
                .await
                .unwrap()
                .unwrap_or_else(|| {
                    panic!("{:?} {}'s {namespace}/{name} deleted", beat.fate, beat.uid)
                });
            assert_eq!(
                copy.metadata.uid.as_ref(),
                Some(uid),
                "{namespace}/{name} replaced"
            );
            assert!(
                copy.metadata.deletion_timestamp.is_none(),
                "{namespace}/{name} being deleted"
            );
        }
    }
    for renewer in renewers {
        renewer.abort();
    }
    assert!(env.process(reaper).is_running(), "the reaper runs on");
}
