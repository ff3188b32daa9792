//! `kbind-reaper` (#38) on a real provider, run as a real process with its chart's RBAC and its
//! ServiceAccount's token, its host clock hours off. Consumer A is real kbind (schema manager and
//! syncer on the consumer cluster); consumer B keeps a heartbeat the way the Go reference does
//! (its markers in the label form on its namespace); C's objects carry a UID no Lease ever
//! named.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kbind_e2e::cluster::{ensure_namespace, free_port};
use kbind_e2e::fixtures::*;
use kbind_e2e::kbind::{apiserver_requests, grown, http_get};
use kbind_e2e::tools::{chart_dir, helm_checked};
use kbind_e2e::wait::{wait_for, wait_gone};
use kbind_shared::api::ClusterBinding;
use kbind_shared::api::reaper::ReaperPolicy;
use kbind_shared::keys;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

const REAPER_NAMESPACE: &str = "kbind-reaper";
const SERVICE_ACCOUNT: &str = "r-kbind-reaper";
const UID_B: &str = "consumer-b-0000-0000";
const UID_C: &str = "consumer-c-never-leased";
const FINALIZER: &str = "provider.example.org/hold";
const PROTECT: &str = "reaper.kbind.io/protect";

/// The reaper chart's RBAC, rendered for these values (`action`, Secrets/ConfigMaps and
/// Namespaces included), and its CRD, applied to the provider.
async fn install_reaper_rbac(provider: &Client, lease_namespace: &str, action: &str) {
    let action = format!("action={action}");
    let chart = chart_dir().with_file_name("kbind-reaper");
    let chart = chart.display().to_string();
    let lease_namespaces = format!("leaseNamespaces={{{lease_namespace}}}");
    let rbac = helm_checked(&[
        "template",
        "r",
        &chart,
        "--kube-version",
        "1.36.3",
        "-n",
        REAPER_NAMESPACE,
        "--show-only",
        "templates/rbac.yaml",
        "--set",
        "apis[0].group=example.org",
        "--set",
        "apis[0].resources[0]=widgets",
        "--set",
        &action,
        "--set",
        "includeRelated=true",
        "--set",
        "includeNamespaces=true",
        "--set",
        &lease_namespaces,
    ])
    .unwrap();
    let crd = std::fs::read_to_string(
        chart_dir()
            .with_file_name("kbind-reaper")
            .join("crds/reaper.kbind.io_reaperpolicies.yaml"),
    )
    .unwrap();
    apply_manifest(provider, &crd).await.unwrap();
    let crds = Api::all(provider.clone());
    kbind_e2e::kbind::wait_established(&crds, "reaperpolicies.reaper.kbind.io")
        .await
        .unwrap();
    apply_manifest(provider, &rbac).await.unwrap();
}

/// Installs the reaper's CRD and its chart's RBAC for the policy's action, creates the policy
/// `default` with `spec`, and starts `kbind-reaper` as a process with its ServiceAccount's token
/// and `extra` flags. Returns its process index and metrics address.
async fn start_reaper(
    env: &mut kbind_e2e::TestEnv,
    provider: &Client,
    lease_namespace: &str,
    spec: serde_json::Value,
    extra: &[&str],
) -> (usize, String) {
    ensure_namespace(provider, REAPER_NAMESPACE).await.unwrap();
    let action = spec["action"].as_str().unwrap_or("Report").to_owned();
    install_reaper_rbac(provider, lease_namespace, &action).await;
    let account = env
        .cluster("provider")
        .mint_service_account_user(REAPER_NAMESPACE, SERVICE_ACCOUNT)
        .await
        .unwrap();
    let kubeconfig = env.dir().join("reaper.kubeconfig");
    std::fs::write(&kubeconfig, &account.kubeconfig).unwrap();
    Api::<ReaperPolicy>::all(provider.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "reaper.kbind.io/v1alpha1",
                "kind": "ReaperPolicy",
                "metadata": { "name": "default" },
                "spec": spec,
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--namespace={REAPER_NAMESPACE}"),
        format!("--metrics-bind-address={metrics}"),
        format!("--health-probe-bind-address=127.0.0.1:{}", free_port()),
        "--sweep-interval=2s".into(),
        "--log-level=info,kbind_schema_manager=debug".into(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let index = env
        .start_kbind("kbind-reaper", "reaper", &args, &[("POD_NAME", "reaper-0")])
        .unwrap();
    (index, metrics)
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

/// Writes another consumer's heartbeat Lease once, as the Go reference would (its own field
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

async fn policy_status(
    provider: &Client,
) -> Result<kbind_shared::api::reaper::ReaperPolicyStatus, String> {
    Api::<ReaperPolicy>::all(provider.clone())
        .get("default")
        .await
        .map_err(|e| e.to_string())?
        .status
        .ok_or_else(|| "no status yet".to_owned())
}

/// Waits until the policy's status says consumer `uid` is in `state`; returns the status.
async fn wait_state(provider: &Client, uid: &str, state: &str, limit: u64) {
    wait_for(&format!("consumer {uid} to be {state}"), limit, || async {
        let status = policy_status(provider).await?;
        Ok(status
            .consumers
            .iter()
            .any(|c| c.uid == uid && c.state == state)
            .then_some(()))
    })
    .await
}

fn state_of(status: &kbind_shared::api::reaper::ReaperPolicyStatus, uid: &str) -> String {
    status
        .consumers
        .iter()
        .find(|c| c.uid == uid)
        .map(|c| c.state.clone())
        .unwrap_or_default()
}

/// Renews consumer B's heartbeat Lease every second, as another implementation would, until
/// aborted.
fn keep_b_alive(provider: Client, namespace: String) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            // A failed renewal is one missed beat, as for any consumer.
            let _ = write_lease(&provider, &namespace, "other-consumer-b", UID_B).await;
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

    // Consumer B: alive, in the Go reference's form. Consumer C: never had a Lease.
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
    let policy = json!({
        "leaseNamespaces": [lease_namespace],
        "staleAfter": "12s",
        "deleteAfter": "20s",
        "action": "Delete",
        "apis": ["widgets.example.org"],
        "includeRelated": true,
        "includeNamespaces": true,
        "deletesPerMinute": 600,
    });
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
    write_lease(&provider, &lease_namespace, "dead-consumer-d", UID_D)
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
