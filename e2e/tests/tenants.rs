//! Other people are adversaries (issue #32): a namespace user on the consumer and a provider admin
//! each try, from outside, to make kbind act beyond their scope — on two real clusters with kbind's
//! programs as real processes — and each test shows the safe outcome.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::fixtures::*;
use kbind_e2e::wait::{wait_for, wait_gone};
use kbind_shared::api::{
    ActiveSchemaSource, Binding, ClusterBinding, ClusterBindingSpec, Connection, SchemaSource,
};
use kbind_shared::keys;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

/// Name → UID of the Widgets in `namespace`.
async fn widget_uids(client: &Client, namespace: &str) -> BTreeMap<String, String> {
    widgets(client, namespace)
        .list(&ListParams::default())
        .await
        .expect("Widgets are listed")
        .items
        .iter()
        .map(|w| (w.name_any(), w.uid().unwrap_or_default()))
        .collect()
}

#[tokio::test]
async fn deleting_a_refused_binding_touches_nothing_another_connection_serves() {
    // #32.3: a second Connection reaching the same provider lists an API the first serves: its
    // ClusterBinding is refused (SchemaConflict). Deleting it must finish at once and leave the
    // served objects' finalizers and provider copies exactly as they were.
    let s = SyncEnv::start("tenants_refused_release", &[0, 1, 2], None).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    let consumer_widgets = widgets(&s.consumer, "team-a");
    for i in 0..5 {
        consumer_widgets
            .create(&PostParams::default(), &widget(&format!("w{i}"), i))
            .await
            .unwrap();
    }
    wait_for("5 provider copies", 60, || async {
        Ok((widget_uids(&s.provider, "team-a").await.len() == 5).then_some(()))
    })
    .await;

    connect_to(
        &s.consumer,
        "second",
        &s.env.cluster("provider").admin_kubeconfig(),
    )
    .await;
    let cluster_bindings: Api<ClusterBinding> = Api::all(s.consumer.clone());
    cluster_bindings
        .create(
            &PostParams::default(),
            &ClusterBinding::new(
                "second-widgets",
                ClusterBindingSpec::from(binding_spec("second", &["widgets.example.org"])),
            ),
        )
        .await
        .unwrap();
    wait_binding(
        &cluster_bindings,
        "second-widgets",
        "Ready=False/SchemaConflict",
    )
    .await;
    let copies = widget_uids(&s.provider, "team-a").await;

    cluster_bindings
        .delete("second-widgets", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(
        &cluster_bindings,
        "second-widgets",
        "the refused ClusterBinding to go",
        30,
    )
    .await;
    // Long enough for a release loop to have deleted and re-created copies several times.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        widget_uids(&s.provider, "team-a").await,
        copies,
        "the provider copies were deleted or re-created"
    );
    for w in consumer_widgets
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        assert!(
            w.finalizers().iter().any(|f| f == "core.kbind.io/syncer"),
            "{} lost its syncer finalizer",
            w.name_any()
        );
    }
    // The serving binding still syncs.
    resize_and_wait_upstream(&consumer_widgets, &widgets(&s.provider, "team-a"), "w1", 42).await;
}

/// A Binding `widgets` in `namespace` for the Widgets of Connection `provider`.
fn team_binding(namespace: &str, policy: &str) -> Binding {
    let mut spec = binding_spec("provider", &["widgets.example.org"]);
    spec.conflict_policy = serde_json::from_value(json!(policy)).unwrap();
    let mut b = Binding::new("widgets", spec);
    b.metadata.namespace = Some(namespace.into());
    b
}

/// Forges the status of Binding `name` to say the Widgets are bound through `provider` (as anyone
/// who may write `bindings/status` could).
async fn forge_bound(bindings: &Api<Binding>, name: &str) {
    let forged = json!({ "status": {
        "apis": [{ "name": "widgets.example.org", "connection": "provider", "bound": true,
                   "reason": "AsExpected" }],
        "conditions": [{ "type": "Ready", "status": "True", "reason": "AsExpected", "message": "",
                         "lastTransitionTime": "2026-01-01T00:00:00Z" }],
    } });
    bindings
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&forged))
        .await
        .unwrap();
}

/// The consumer Widget `namespace/name` has no provider copy and no finalizer (`why` otherwise).
async fn assert_not_synced(s: &SyncEnv, namespace: &str, name: &str, why: &str) {
    let copy = widgets(&s.provider, namespace).get_opt(name).await.unwrap();
    assert!(copy.is_none(), "{why}");
    let w = widgets(&s.consumer, namespace).get(name).await.unwrap();
    assert!(w.finalizers().is_empty(), "{:?}", w.finalizers());
}

#[tokio::test]
async fn a_forged_binding_status_syncs_nothing_the_connection_forbids() {
    // #32.7: the Connection serves Bindings in team-a only. team-b's Binding is refused; someone
    // who can write bindings/status forges it to "bound" while the schema manager is stopped (so
    // nothing corrects it). The syncer checks the Connection's rules itself: team-b's Widget gets
    // no finalizer and no provider copy, while team-a's syncs.
    let mut s = SyncEnv::start("tenants_forged_status", &[0, 1], None).await;
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    patch_connection(
        &s.consumer,
        "provider",
        json!({ "access": { "bindingNamespaces": ["team-a"] } }),
    )
    .await;
    for namespace in ["team-a", "team-b"] {
        ensure_namespace(&s.consumer, namespace).await.unwrap();
        Api::<Binding>::namespaced(s.consumer.clone(), namespace)
            .create(&PostParams::default(), &team_binding(namespace, "Fail"))
            .await
            .unwrap();
    }
    let in_a: Api<Binding> = Api::namespaced(s.consumer.clone(), "team-a");
    let in_b: Api<Binding> = Api::namespaced(s.consumer.clone(), "team-b");
    wait_binding(&in_a, "widgets", "Ready=True").await;
    wait_binding(&in_b, "widgets", "Ready=False/NotAllowed").await;
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "w0", 1).await;

    s.env.process(s.manager.index).signal("STOP").unwrap();
    forge_bound(&in_b, "widgets").await;
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "w1", 1).await;
    widgets(&s.consumer, "team-b")
        .create(&PostParams::default(), &widget("forged", 1))
        .await
        .unwrap();
    // team-a's next Widget reached the provider after the forgery; give team-b's as long again.
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "w2", 1).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let b = in_b.get("widgets").await.unwrap();
    assert!(
        b.status.unwrap().apis.iter().any(|a| a.bound),
        "the forged status must still be in place for this test to mean anything"
    );
    assert_not_synced(
        &s,
        "team-b",
        "forged",
        "a Widget of a namespace the Connection does not serve reached the provider",
    )
    .await;
    s.env.process(s.manager.index).signal("CONT").unwrap();
}

#[tokio::test]
async fn a_bindings_adopt_takes_over_nothing_unless_the_connection_allows_it() {
    // #32.6: a namespace user's Binding asks for Adopt; an unmarked provider object of the same
    // name is a conflict, never overwritten, until the Connection's owner sets bindingsMayAdopt.
    let s = SyncEnv::start("tenants_adopt", &[0, 1], None).await;
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    for client in [&s.consumer, &s.provider] {
        ensure_namespace(client, "team-a").await.unwrap();
    }
    let provider_widgets = widgets(&s.provider, "team-a");
    provider_widgets
        .create(&PostParams::default(), &widget("theirs", 99))
        .await
        .unwrap();
    let in_a: Api<Binding> = Api::namespaced(s.consumer.clone(), "team-a");
    in_a.create(&PostParams::default(), &team_binding("team-a", "Adopt"))
        .await
        .unwrap();
    wait_binding(&in_a, "widgets", "Ready=True").await;
    let consumer_widgets = widgets(&s.consumer, "team-a");
    consumer_widgets
        .create(&PostParams::default(), &widget("theirs", 1))
        .await
        .unwrap();
    wait_conflict(&consumer_widgets, "theirs", Some("ForeignObjectExists")).await;
    // A Widget of its own still syncs.
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "own", 1).await;
    let foreign = provider_widgets.get("theirs").await.unwrap();
    assert_eq!(foreign.data["spec"]["size"], 99, "overwritten");
    assert!(
        !foreign
            .annotations()
            .contains_key("core.kbind.io/consumer-object-uid"),
        "marked as kbind's"
    );

    // The owner allows adoption: now it is taken over.
    patch_connection(
        &s.consumer,
        "provider",
        json!({ "access": { "bindingsMayAdopt": true } }),
    )
    .await;
    wait_for("the foreign Widget adopted", 30, || async {
        let w = provider_widgets
            .get("theirs")
            .await
            .map_err(|e| e.to_string())?;
        Ok((w.data["spec"]["size"] == 1).then_some(()))
    })
    .await;
    wait_conflict(&consumer_widgets, "theirs", None).await;
}

/// Sets the `relatedResources` of the ClusterBinding `widgets`.
async fn set_related(consumer: &Client, entries: serde_json::Value) {
    merge_patch(
        &Api::<ClusterBinding>::all(consumer.clone()),
        "widgets",
        &json!({ "spec": { "relatedResources": entries } }),
    )
    .await;
}

/// Waits until the ClusterBinding `widgets` has `RelatedResourcesSynced` with `status` (and
/// `reason`), and checks that its message contains `text`.
async fn related_condition_says(consumer: &Client, status: &str, reason: Option<&str>, text: &str) {
    let cluster_bindings: Api<ClusterBinding> = Api::all(consumer.clone());
    let b = wait_binding_condition(
        &cluster_bindings,
        "widgets",
        "RelatedResourcesSynced",
        status,
        reason,
    )
    .await
    .unwrap();
    let conditions = b.status.unwrap_or_default().conditions;
    let message = kbind_shared::conditions::find(&conditions, "RelatedResourcesSynced")
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(message.contains(text), "{message}");
}

/// `Secret <namespace>/<name>` of every Secret on `client` that kbind copied there.
async fn copied_secrets(client: &Client) -> Vec<String> {
    Api::<Secret>::all(client.clone())
        .list(&ListParams::default().labels("core.kbind.io/managed=true"))
        .await
        .unwrap()
        .items
        .iter()
        .map(|s| format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any()))
        .collect()
}

#[tokio::test]
async fn related_copies_never_leave_or_enter_protected_namespaces() {
    // #32.4 and #32.5, with the Connection allowing Secrets out:
    // - a ClusterBinding entry that would send every Secret of the cluster is refused outright;
    // - one that selects by label still never reads kube-* or kbind's namespaces (the provider
    //   kubeconfig Secrets live there);
    // - a provider publishing ConfigMaps into kube-system and kbind's namespaces plants nothing;
    // - nor into a namespace where the ClusterBinding has no objects and that no entry lists
    //   (team-b, until a Widget is created there), while a listed one (team-c) receives them.
    let s = SyncEnv::start("tenants_related_fence", &[0, 1, 2], None).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    patch_connection(
        &s.consumer,
        "provider",
        json!({ "access": { "secretsToProvider": true } }),
    )
    .await;
    let protected = ["kube-system", KBIND_NAMESPACE, SECRET_NAMESPACE];
    let open = ["team-a", "team-b", "team-c"];
    for client in [&s.consumer, &s.provider] {
        for namespace in protected.iter().chain(&open) {
            ensure_namespace(client, namespace).await.unwrap();
        }
    }
    // The binding's objects are in team-a only.
    widgets(&s.consumer, "team-a")
        .create(&PostParams::default(), &widget("here", 1))
        .await
        .unwrap();
    let shared = |namespace: &str, name: &str| {
        let mut secret = Secret::default();
        secret.metadata.name = Some(name.into());
        secret.metadata.namespace = Some(namespace.into());
        secret.metadata.labels = Some([("share".to_owned(), "yes".to_owned())].into());
        secret.string_data = Some([("value".to_owned(), "s3cret".to_owned())].into());
        secret
    };
    for namespace in protected.iter().chain(&["team-a"]) {
        Api::<Secret>::namespaced(s.consumer.clone(), namespace)
            .create(&PostParams::default(), &shared(namespace, "shared"))
            .await
            .unwrap();
    }
    let planted = |namespace: &str| {
        let mut map = ConfigMap::default();
        map.metadata.name = Some("planted".into());
        map.metadata.namespace = Some(namespace.into());
        map.metadata.labels = Some([("plant".to_owned(), "yes".to_owned())].into());
        map.data = Some([("value".to_owned(), "provider's".to_owned())].into());
        map
    };
    for namespace in protected.iter().chain(&open) {
        Api::<ConfigMap>::namespaced(s.provider.clone(), namespace)
            .create(&PostParams::default(), &planted(namespace))
            .await
            .unwrap();
    }

    let set_entries = |entries| set_related(&s.consumer, entries);
    set_entries(json!([{ "resource": "secrets", "direction": "FromConsumer" }])).await;
    related_condition_says(
        &s.consumer,
        "False",
        Some("NotAllowed"),
        "must be selected by names or labels",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(copied_secrets(&s.provider).await, Vec::<String>::new());

    set_entries(json!([
        { "resource": "secrets", "direction": "FromConsumer",
          "selector": { "labelSelector": { "matchLabels": { "share": "yes" } } } },
        { "resource": "configmaps", "direction": "FromProvider",
          "selector": { "labelSelector": { "matchLabels": { "plant": "yes" } } } },
        { "resource": "configmaps", "direction": "FromProvider", "namespaces": ["team-c"],
          "selector": { "names": ["planted"] } },
    ]))
    .await;
    wait_for("team-a's Secret and ConfigMap copied", 30, || async {
        let secret = Api::<Secret>::namespaced(s.provider.clone(), "team-a")
            .get_opt("shared")
            .await
            .map_err(|e| e.to_string())?;
        let map = Api::<ConfigMap>::namespaced(s.consumer.clone(), "team-a")
            .get_opt("planted")
            .await
            .map_err(|e| e.to_string())?;
        Ok((secret.is_some() && map.is_some()).then_some(()))
    })
    .await;
    related_condition_says(&s.consumer, "True", None, "protected namespaces").await;
    related_condition_says(
        &s.consumer,
        "True",
        None,
        "hold none of the binding's objects and that no entry lists",
    )
    .await;
    assert_eq!(copied_secrets(&s.provider).await, ["team-a/shared"]);
    let planted_in = |namespace: &'static str| {
        let consumer = s.consumer.clone();
        async move {
            Api::<ConfigMap>::namespaced(consumer, namespace)
                .get_opt("planted")
                .await
                .map(|m| m.is_some())
                .map_err(|e| e.to_string())
        }
    };
    assert!(planted_in("team-c").await.unwrap(), "the listed namespace");
    assert!(
        !planted_in("team-b").await.unwrap(),
        "the provider chose a namespace where the binding has no objects"
    );
    // The binding's objects arrive in team-b: the provider's ConfigMap follows.
    widgets(&s.consumer, "team-b")
        .create(&PostParams::default(), &widget("there", 1))
        .await
        .unwrap();
    wait_for(
        "team-b's ConfigMap copied once a Widget is there",
        30,
        || async { Ok(planted_in("team-b").await?.then_some(())) },
    )
    .await;
    for namespace in protected {
        assert!(
            Api::<ConfigMap>::namespaced(s.consumer.clone(), namespace)
                .get_opt("planted")
                .await
                .unwrap()
                .is_none(),
            "the provider planted a ConfigMap in {namespace}"
        );
    }
}

/// The units of the work assignment the schema manager wrote.
async fn assigned_units(consumer: &Client) -> Vec<String> {
    let map = Api::<ConfigMap>::namespaced(consumer.clone(), KBIND_NAMESPACE)
        .get_opt(kbind_shared::shard::ASSIGNMENT_CONFIGMAP)
        .await
        .unwrap();
    let text = map
        .and_then(|m| m.data?.get(kbind_shared::shard::ASSIGNMENT_KEY).cloned())
        .unwrap_or_default();
    kbind_shared::shard::Assignment::decode(&text)
        .map(|a| a.units.into_keys().collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_flood_of_bindings_from_one_namespace_is_capped_reported_and_stops_nobody() {
    // #32.1: a namespace user creates 24 Bindings with related resources and long names; the
    // schema manager serves 3 per namespace here. The first 3 by name get work units, the rest say
    // why on their binding and in kbind_assignment_unassigned_units, and another team's objects
    // keep syncing.
    let s = SyncEnv::start_full(
        "tenants_flood",
        &[0, 1, 2],
        None,
        &[],
        // A resync far away: whatever changes below happens through triggers alone.
        &[
            "--max-related-bindings-per-namespace=3",
            "--binding-resync-interval=10m",
        ],
    )
    .await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    ensure_namespace(&s.consumer, "flood").await.unwrap();
    let flood: Api<Binding> = Api::namespaced(s.consumer.clone(), "flood");
    let name = |i: usize| format!("{}-{i:02}", "f".repeat(200));
    for i in 0..24 {
        let mut b = team_binding("flood", "Fail");
        b.metadata.name = Some(name(i));
        b.spec.related_resources = serde_json::from_value(json!([
            { "resource": "configmaps", "direction": "FromConsumer", "selector": { "names": ["x"] } }
        ]))
        .unwrap();
        flood.create(&PostParams::default(), &b).await.unwrap();
    }
    for i in 3..24 {
        let b = wait_binding(
            &flood,
            &name(i),
            "RelatedResourcesSynced=False/TooManyBindings",
        )
        .await;
        let status = b.status.unwrap_or_default();
        let message = &kbind_shared::conditions::find(&status.conditions, "RelatedResourcesSynced")
            .unwrap()
            .message;
        assert!(
            message.contains("namespace flood has more Bindings"),
            "{message}"
        );
    }
    wait_for(
        "3 related units of namespace flood assigned",
        30,
        || async {
            let units = assigned_units(&s.consumer).await;
            let related: Vec<&String> = units
                .iter()
                .filter(|u| u.contains("/binding:flood/"))
                .collect();
            Ok(
                (related.len() == 3 && units.iter().any(|u| u == "provider/widgets.example.org"))
                    .then_some(()),
            )
        },
    )
    .await;
    for i in 0..3 {
        // Served: the syncer reports on them (their selector matches nothing yet).
        wait_binding(&flood, &name(i), "RelatedResourcesSynced=True").await;
    }
    let metrics = s.manager.metrics().await.unwrap();
    assert_eq!(
        metric_sum(&metrics, "kbind_assignment_unassigned_units", &[]),
        21.0
    );
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "w0", 1).await;

    // A Binding that sorts first arrives: the third served one is pushed out and says so at once
    // (not at its next resync); when the newcomer goes, it is served again.
    let mut first = team_binding("flood", "Fail");
    first.metadata.name = Some("a-first".into());
    first.spec.related_resources = serde_json::from_value(json!([
        { "resource": "configmaps", "direction": "FromConsumer", "selector": { "names": ["x"] } }
    ]))
    .unwrap();
    flood.create(&PostParams::default(), &first).await.unwrap();
    wait_binding(
        &flood,
        &name(2),
        "RelatedResourcesSynced=False/TooManyBindings",
    )
    .await;
    flood
        .delete("a-first", &DeleteParams::default())
        .await
        .unwrap();
    wait_binding(&flood, &name(2), "RelatedResourcesSynced=True").await;
}

#[tokio::test]
async fn a_namespace_past_its_binding_cap_binds_nothing_more_and_slows_nobody() {
    // #50.2: both programs serve 3 Bindings per namespace here (the oldest). Past the cap a
    // Binding says TooManyBindings, the syncer's gauge counts it, and the syncer ignores it even
    // when its status is forged to "bound"; when an older one goes, the next is let in at once
    // (no resync: it is 10 minutes away) and its objects sync. Another namespace never waits.
    let mut s = SyncEnv::start_full(
        "tenants_binding_cap",
        &[0, 1],
        None,
        &[],
        &[
            "--max-bindings-per-namespace=3",
            "--binding-resync-interval=10m",
        ],
    )
    .await;
    s.restart_syncer("syncer-capped", &["--max-bindings-per-namespace=3"])
        .await;
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    for namespace in ["crowd", "team-a"] {
        ensure_namespace(&s.consumer, namespace).await.unwrap();
    }
    let team_a: Api<Binding> = Api::namespaced(s.consumer.clone(), "team-a");
    team_a
        .create(&PostParams::default(), &team_binding("team-a", "Fail"))
        .await
        .unwrap();
    // Bound before the schema manager is stopped below.
    wait_binding(&team_a, "widgets", "Ready=True").await;
    let crowd: Api<Binding> = Api::namespaced(s.consumer.clone(), "crowd");
    // Three served Bindings of an API the provider does not export (they count all the same),
    // then one for the Widgets: ties in age are broken by name, so "b…" come first.
    for i in 0..3 {
        let mut b = Binding::new(
            &format!("b{i}"),
            binding_spec("provider", &["gadgets.example.org"]),
        );
        b.metadata.namespace = Some("crowd".into());
        crowd.create(&PostParams::default(), &b).await.unwrap();
    }
    let mut late = team_binding("crowd", "Fail");
    late.metadata.name = Some("c-widgets".into());
    crowd.create(&PostParams::default(), &late).await.unwrap();
    let b = wait_binding(&crowd, "c-widgets", "Ready=False/TooManyBindings").await;
    let status = b.status.unwrap_or_default();
    let message = &kbind_shared::conditions::find(&status.conditions, "Ready")
        .unwrap()
        .message;
    assert!(
        message.contains("namespace crowd has more Bindings than kbind serves there: the 3 oldest"),
        "{message}"
    );
    assert!(status.apis.iter().all(|a| !a.bound), "{:?}", status.apis);
    wait_for("the syncer counts one Binding past the cap", 30, || async {
        let metrics = s.syncer.metrics().await?;
        Ok((metric_sum(
            &metrics,
            "kbind_bindings_past_cap",
            &[("namespace", "crowd")],
        ) == 1.0)
            .then_some(()))
    })
    .await;

    // Its status forged to "bound" while the schema manager is stopped: the syncer still ignores
    // it — a Widget in crowd gets no finalizer and no copy, while team-a's sync.
    s.env.process(s.manager.index).signal("STOP").unwrap();
    forge_bound(&crowd, "c-widgets").await;
    widgets(&s.consumer, "crowd")
        .create(&PostParams::default(), &widget("w", 1))
        .await
        .unwrap();
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "w0", 1).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_not_synced(
        &s,
        "crowd",
        "w",
        "a Widget covered only by a Binding past the cap reached the provider",
    )
    .await;
    s.env.process(s.manager.index).signal("CONT").unwrap();

    // An older one goes: c-widgets is let in (Ready at once, long before any resync) and the
    // Widget syncs.
    crowd.delete("b0", &DeleteParams::default()).await.unwrap();
    wait_binding(&crowd, "c-widgets", "Ready=True").await;
    wait_for(
        "the Widget of the Binding let in reaches the provider",
        60,
        || async {
            Ok(widgets(&s.provider, "crowd")
                .get_opt("w")
                .await
                .map_err(|e| e.to_string())?
                .map(|_| ()))
        },
    )
    .await;
    wait_for("the syncer counts none past the cap", 30, || async {
        let metrics = s.syncer.metrics().await?;
        Ok((!metrics.contains("kbind_bindings_past_cap{namespace=\"crowd\"}")).then_some(()))
    })
    .await;
}

/// `kbind_sync_operations_total` of the syncer's consumer status writes (status, or the record).
async fn status_writes(syncer: &Program) -> f64 {
    let metrics = syncer.metrics().await.unwrap();
    ["status_down", "record"]
        .iter()
        .map(|op| {
            metric_sum(
                &metrics,
                "kbind_sync_operations_total",
                &[("op", op), ("result", "ok")],
            )
        })
        .sum()
}

#[tokio::test]
async fn a_provider_flooding_statuses_is_paced_and_bounded() {
    // #32.2: for 4 s the provider rewrites one copy's status with 1 MiB every 100 ms and another's
    // with 16 KiB every 100 ms. The 1 MiB status never reaches the consumer (a Warning Event says
    // why); the 16 KiB one is copied at most once a second and its last state arrives; a third
    // object keeps syncing meanwhile.
    let s = SyncEnv::start("tenants_status_flood", &[0, 1, 2], None).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    for client in [&s.consumer, &s.provider] {
        ensure_namespace(client, "team-a").await.unwrap();
    }
    let (consumer_widgets, provider_widgets) = (
        widgets(&s.consumer, "team-a"),
        widgets(&s.provider, "team-a"),
    );
    for name in ["big", "chatty", "calm"] {
        create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", name, 1).await;
        wait_status_down(&consumer_widgets, name, 1).await;
    }
    let before = status_writes(&s.syncer).await;
    let started = std::time::Instant::now();
    let flood = {
        let provider_widgets = provider_widgets.clone();
        tokio::spawn(async move {
            for i in 0..40 {
                let big = json!({ "status": { "phase": "Ready", "observedSize": 1, "round": i,
                                              "blob": "x".repeat(1024 * 1024) } });
                let chatty = json!({ "status": { "phase": "Ready", "observedSize": 1, "round": i,
                                                 "blob": "y".repeat(16 * 1024) } });
                for (name, status) in [("big", big), ("chatty", chatty)] {
                    provider_widgets
                        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
                        .await
                        .unwrap();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    // Meanwhile another object syncs both ways.
    resize_and_wait_upstream(&consumer_widgets, &provider_widgets, "calm", 2).await;
    wait_status_down(&consumer_widgets, "calm", 2).await;
    flood.await.unwrap();
    wait_for("chatty's last status on the consumer", 30, || async {
        let w = consumer_widgets
            .get("chatty")
            .await
            .map_err(|e| e.to_string())?;
        Ok((w.data["status"]["round"] == 39).then_some(()))
    })
    .await;
    let writes = status_writes(&s.syncer).await - before;
    // chatty at most once a second, the first at once; calm's status and record (3 at most).
    let seconds = started.elapsed().as_secs_f64().ceil();
    assert!(
        writes <= seconds + 1.0 + 3.0,
        "{writes} consumer status writes in {seconds} s for 40 status changes of one object"
    );
    let big = consumer_widgets.get("big").await.unwrap();
    assert!(
        big.data["status"].get("blob").is_none(),
        "the 1 MiB status was copied"
    );
    assert_eq!(
        big.data["status"]["observedSize"], 1,
        "the last good status is kept"
    );
    wait_for("a StatusTooLarge Warning on big", 30, || async {
        let warnings = warning_events(&s.consumer, Some("team-a"), "big").await;
        Ok(warnings
            .iter()
            .any(|w| w.starts_with("StatusTooLarge") && w.contains("--max-status-bytes"))
            .then_some(()))
    })
    .await;
}

#[tokio::test]
async fn an_export_label_blip_under_auto_never_widens_the_exports() {
    // #32.8: a Connection with the default source (Auto) and autoBind resolves to CRDs, which the
    // provider exports; the provider also serves an API it never exported (gadgets). The export
    // label disappears for a few seconds: the exports are empty meanwhile — never every API the
    // provider's OpenAPI shows — and no CRD is installed for gadgets.
    let s = SyncEnv::start_full(
        "tenants_auto_blip",
        &[0],
        None,
        &[],
        &["--discovery-interval=1s"],
    )
    .await;
    install_crd(&s.provider, &crd("gadgets", "example.org", "Gadget", &[]))
        .await
        .unwrap();
    let mut auto = connection("auto", "provider-kubeconfig", SchemaSource::Auto);
    auto.spec.auto_bind = true;
    create_connection(&s.consumer, &auto).await.unwrap();
    let status = wait_connection(&s.consumer, "auto", "Ready=True")
        .await
        .status
        .unwrap_or_default();
    assert_eq!(status.active_schema_source, Some(ActiveSchemaSource::Crd));
    let crds: Api<CustomResourceDefinition> = Api::all(s.consumer.clone());
    wait_for("widgets installed by autoBind", 30, || async {
        crds.get_opt("widgets.example.org")
            .await
            .map_err(|e| e.to_string())
    })
    .await;

    let provider_crds: Api<CustomResourceDefinition> = Api::all(s.provider.clone());
    let label = |value: serde_json::Value| json!({ "metadata": { "labels": { "core.kbind.io/exported": value } } });
    merge_patch(
        &provider_crds,
        "widgets.example.org",
        &label(serde_json::Value::Null),
    )
    .await;
    let connections: Api<Connection> = Api::all(s.consumer.clone());
    let mut saw_empty = false;
    for _ in 0..20 {
        let status = connections
            .get("auto")
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        let names = status.exported_names();
        assert!(!names.contains(&"gadgets.example.org"), "{names:?}");
        assert_eq!(status.active_schema_source, Some(ActiveSchemaSource::Crd));
        saw_empty |= names.is_empty();
        assert!(
            crds.get_opt("gadgets.example.org").await.unwrap().is_none(),
            "an API the provider never exported was installed"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        saw_empty,
        "the blip was never discovered: the test proves nothing"
    );
    merge_patch(&provider_crds, "widgets.example.org", &label(json!("true"))).await;
    wait_for("widgets exported again", 30, || async {
        let status = connections
            .get("auto")
            .await
            .map_err(|e| e.to_string())?
            .status
            .unwrap_or_default();
        Ok((status.exported_apis.len() == 1).then_some(()))
    })
    .await;
}

#[tokio::test]
async fn under_pull_policy_all_one_export_that_cannot_be_installed_stops_nothing_else() {
    // #32.10: the provider exports gadgets and widgets; the consumer already has a gadgets CRD of
    // its own, which kbind never changes. Under pullPolicy All widgets is installed anyway, the
    // Connection stays Ready, and SchemaInSync names gadgets.
    let s = SyncEnv::start_full(
        "tenants_pull_all",
        &[0],
        None,
        &[],
        &["--discovery-interval=1s"],
    )
    .await;
    let exported = [("core.kbind.io/exported", "true")];
    install_crd(
        &s.provider,
        &crd("gadgets", "example.org", "Gadget", &exported),
    )
    .await
    .unwrap();
    install_crd(&s.consumer, &crd("gadgets", "example.org", "Gadget", &[]))
        .await
        .unwrap();
    let mut all = connection("provider", "provider-kubeconfig", SchemaSource::Crd);
    all.spec.schema.pull_policy = kbind_shared::api::PullPolicy::All;
    create_connection(&s.consumer, &all).await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(s.consumer.clone());
    wait_for("widgets installed under pullPolicy All", 30, || async {
        crds.get_opt("widgets.example.org")
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    let connection =
        wait_connection(&s.consumer, "provider", "SchemaInSync=False/InstallFailed").await;
    let conditions = connection.status.unwrap_or_default().conditions;
    let ready = kbind_shared::conditions::find(&conditions, "Ready").unwrap();
    assert_eq!(ready.status, "True", "{}", ready.message);
    let schema = kbind_shared::conditions::find(&conditions, "SchemaInSync").unwrap();
    assert!(
        schema.message.contains("gadgets.example.org"),
        "{}",
        schema.message
    );
    let gadgets = crds.get("gadgets.example.org").await.unwrap();
    assert!(
        !gadgets
            .annotations()
            .contains_key("core.kbind.io/connection"),
        "the consumer's own CRD was taken over"
    );
}

#[tokio::test]
async fn a_provider_publishing_many_related_objects_gets_a_bounded_number_copied() {
    // #32.2: the syncer copies at most 3 objects per entry here; the provider publishes 6
    // matching ConfigMaps. The first 3 (by name) are copied, the binding names what was left out,
    // and nothing more arrives.
    let mut s = SyncEnv::start("tenants_related_limits", &[0, 1, 2], None).await;
    s.restart_syncer("syncer-limited", &["--related-copies-per-entry=3"])
        .await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    for client in [&s.consumer, &s.provider] {
        ensure_namespace(client, "team-a").await.unwrap();
    }
    for i in 0..6 {
        let mut map = ConfigMap::default();
        map.metadata.name = Some(format!("published-{i}"));
        map.metadata.labels = Some([("pub".to_owned(), "yes".to_owned())].into());
        map.data = Some([("value".to_owned(), format!("{i}"))].into());
        Api::<ConfigMap>::namespaced(s.provider.clone(), "team-a")
            .create(&PostParams::default(), &map)
            .await
            .unwrap();
    }
    set_related(
        &s.consumer,
        json!([{ "resource": "configmaps", "direction": "FromProvider", "namespaces": ["team-a"],
                 "selector": { "labelSelector": { "matchLabels": { "pub": "yes" } } } }]),
    )
    .await;
    let copies = || async {
        let mut names: Vec<String> = Api::<ConfigMap>::namespaced(s.consumer.clone(), "team-a")
            .list(&ListParams::default().labels("core.kbind.io/managed=true"))
            .await
            .unwrap()
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect();
        names.sort();
        names
    };
    wait_for("3 copies", 60, || async {
        Ok((copies().await.len() == 3).then_some(()))
    })
    .await;
    related_condition_says(
        &s.consumer,
        "False",
        Some("TooManyObjects"),
        "3 object(s) over an entry's limits (3 copies",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        copies().await,
        ["published-0", "published-1", "published-2"]
    );
}

/// Another consumer cluster's copy of a Widget, as its kbind writes it: kbind's labels and markers
/// naming that cluster.
fn another_consumers_copy(name: &str, size: i64) -> kube::api::DynamicObject {
    let mut copy = widget(name, size);
    copy.metadata.labels = Some(
        [
            (keys::MANAGED_LABEL.to_owned(), keys::TRUE.to_owned()),
            (
                keys::CONSUMER_CLUSTER_UID_LABEL.to_owned(),
                OTHER_CONSUMER.to_owned(),
            ),
        ]
        .into(),
    );
    copy.metadata.annotations = Some(
        [
            (
                keys::CONSUMER_CLUSTER_UID_ANNOTATION.to_owned(),
                OTHER_CONSUMER.to_owned(),
            ),
            (
                keys::CONSUMER_OBJECT_UID_ANNOTATION.to_owned(),
                format!("7f3a9c2e-1b4d-4e6f-8a0c-{:012}", name.len()),
            ),
        ]
        .into(),
    );
    copy
}

/// The consumer cluster UID of the other consumer sharing the provider.
const OTHER_CONSUMER: &str = "0b2e4c9a-5d1f-4e8b-9a7c-3f6d2e1b0a98";

#[tokio::test]
async fn another_consumers_copies_are_never_read_and_one_under_a_shared_name_is_a_conflict_until_it_goes()
 {
    // #50.5: the syncer's provider watch selects this consumer cluster's copies by their label;
    // another consumer's are never listed, watched or fetched — but the one under a name this
    // consumer also uses, read to classify it, which is a conflict until it goes.
    let s = SyncEnv::start("tenants_own_copies", &[0, 1, 2], None).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    for client in [&s.consumer, &s.provider] {
        ensure_namespace(client, "team-a").await.unwrap();
    }
    let local_uid = uid_of_kube_system(&s.consumer).await;
    let provider_widgets = widgets(&s.provider, "team-a");
    let theirs: Vec<String> = (0..20).map(|i| format!("theirs-{i}")).collect();
    for name in &theirs {
        provider_widgets
            .create(&PostParams::default(), &another_consumers_copy(name, 5))
            .await
            .unwrap();
    }
    // Ours: two that sync, and one under the name of another consumer's copy.
    for name in ["mine-1", "mine-2"] {
        create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", name, 1).await;
        let copy = provider_widgets.get(name).await.unwrap();
        assert_eq!(
            copy.labels().get(keys::CONSUMER_CLUSTER_UID_LABEL),
            Some(&local_uid),
            "{name} carries this consumer's label"
        );
        assert_eq!(
            copy.annotations()
                .get(keys::CONSUMER_CLUSTER_UID_ANNOTATION),
            Some(&local_uid),
            "{name} keeps the marker annotation"
        );
    }
    let consumer_widgets = widgets(&s.consumer, "team-a");
    consumer_widgets
        .create(&PostParams::default(), &widget("theirs-0", 1))
        .await
        .unwrap();
    wait_conflict(&consumer_widgets, "theirs-0", Some("OwnedByAnother")).await;
    // Their changes reach nothing here; ours still do.
    for name in &theirs {
        provider_widgets
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "size": 6 } })),
            )
            .await
            .unwrap();
    }
    resize_and_wait_upstream(&consumer_widgets, &provider_widgets, "mine-1", 2).await;
    assert_eq!(
        provider_widgets.get("theirs-0").await.unwrap().data["spec"]["size"],
        6,
        "another consumer's copy untouched"
    );

    // The other consumer's copy goes: this consumer's theirs-0 syncs (read again within its wait).
    provider_widgets
        .delete("theirs-0", &DeleteParams::default())
        .await
        .unwrap();
    wait_conflict(&consumer_widgets, "theirs-0", None).await;
    let copy = wait_object(
        &provider_widgets,
        "theirs-0",
        "our copy of theirs-0",
        30,
        |c| c.labels().get(keys::CONSUMER_CLUSTER_UID_LABEL) == Some(&local_uid),
    )
    .await;
    assert_eq!(copy.data["spec"]["size"], 1);

    // What kbind's programs asked the provider for Widgets: every list and watch selects this
    // consumer's label; the only Widget read by name besides its own copies is theirs-0.
    let reads: Vec<_> = s
        .env
        .cluster("provider")
        .audited()
        .into_iter()
        .filter(|a| a.resource == "widgets" && a.user_agent.starts_with("kbind-"))
        .filter(|a| matches!(a.verb.as_str(), "get" | "list" | "watch"))
        .collect();
    let selector = format!(
        "labelSelector={}",
        format!("{}={local_uid}", keys::CONSUMER_CLUSTER_UID_LABEL)
            .replace('/', "%2F")
            .replace('=', "%3D")
    );
    let collections: Vec<_> = reads.iter().filter(|a| a.name.is_empty()).collect();
    assert!(
        collections
            .iter()
            .any(|a| a.user_agent.starts_with("kbind-syncer/")),
        "the syncer's watch is audited: {reads:#?}"
    );
    for read in &collections {
        if read.user_agent.starts_with("kbind-syncer/") {
            assert!(read.request_uri.contains(&selector), "{read:#?}");
        }
    }
    let named: std::collections::BTreeSet<&str> = reads
        .iter()
        .filter(|a| a.verb == "get" && a.user_agent.starts_with("kbind-syncer/"))
        .map(|a| a.name.as_str())
        .collect();
    assert!(
        named
            .iter()
            .all(|n| ["mine-1", "mine-2", "theirs-0"].contains(n)),
        "the syncer read only names this consumer uses: {named:?}"
    );
    assert!(named.contains("theirs-0"), "{named:?}");
}
