//! Every edit converges, on two (or three) real clusters with kbind's programs as real processes:
//! an API removed from a binding is released exactly as if a binding covering only it were
//! deleted, an API moved to another Connection drains the old provider before the new one
//! receives anything, and one bad API in a binding never stops the others (BIND-16, AUTO-2,
//! LIM-22, QRK-25 fixed; BIND-14).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::fixtures::*;
use kbind_e2e::wait::{wait_for, wait_gone};
use kbind_shared::api::{ApiStatus, Binding, BindingStatus, ClusterBinding, ClusterBindingSpec};
use kube::api::{ApiResource, DynamicObject, ListParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;

const WIDGETS: &str = "widgets.example.org";
const GADGETS: &str = "gadgets.example.org";

fn gadget_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("example.org", "v1", "Gadget"),
        "gadgets",
    )
}

fn gadgets(client: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &gadget_resource())
}

fn exported(plural: &str, kind: &str) -> CustomResourceDefinition {
    crd(
        plural,
        "example.org",
        kind,
        &[(kbind_shared::keys::EXPORTED_LABEL, kbind_shared::keys::TRUE)],
    )
}

async fn names(api: &Api<DynamicObject>) -> BTreeSet<String> {
    api.list_metadata(&ListParams::default())
        .await
        .map(|l| l.items.iter().map(|o| o.name_any()).collect())
        .unwrap_or_default()
}

/// Waits until `api` holds exactly `want` (by name).
async fn wait_names(api: &Api<DynamicObject>, want: &BTreeSet<String>, what: &str) {
    wait_for(what, 60, || async {
        Ok((names(api).await == *want).then_some(()))
    })
    .await;
}

fn entry<'a>(status: &'a BindingStatus, api: &str) -> Option<&'a ApiStatus> {
    status.apis.iter().find(|a| a.name == api)
}

async fn cluster_binding_status(consumer: &Client, name: &str) -> BindingStatus {
    Api::<ClusterBinding>::all(consumer.clone())
        .get(name)
        .await
        .unwrap()
        .status
        .unwrap_or_default()
}

#[tokio::test]
async fn removing_one_of_two_apis_releases_it_and_leaves_the_other_untouched() {
    let s = SyncEnv::start("edits_remove_api", &[0, 1], None).await;
    install_crd(&s.provider, &exported("gadgets", "Gadget"))
        .await
        .unwrap();
    let cluster_bindings: Api<ClusterBinding> = Api::all(s.consumer.clone());
    cluster_bindings
        .create(
            &PostParams::default(),
            &ClusterBinding::new(
                "both",
                ClusterBindingSpec::from(binding_spec("provider", &[WIDGETS, GADGETS])),
            ),
        )
        .await
        .unwrap();
    wait_binding(&cluster_bindings, "both", "Ready=True").await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    let all: BTreeSet<String> = (0..20).map(|i| format!("o{i:02}")).collect();
    for name in &all {
        widgets(&s.consumer, "team-a")
            .create(&PostParams::default(), &widget(name, 1))
            .await
            .unwrap();
        let gadget: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "example.org/v1", "kind": "Gadget",
            "metadata": { "name": name }, "spec": { "size": 1 }
        }))
        .unwrap();
        gadgets(&s.consumer, "team-a")
            .create(&PostParams::default(), &gadget)
            .await
            .unwrap();
    }
    let provider_widgets = widgets(&s.provider, "team-a");
    wait_names(&provider_widgets, &all, "20 widget copies").await;
    wait_names(&gadgets(&s.provider, "team-a"), &all, "20 gadget copies").await;
    let before: BTreeMap<String, (Option<String>, Option<i64>)> = provider_widgets
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|w| (w.name_any(), (w.metadata.uid, w.metadata.generation)))
        .collect();

    // The user drops gadgets from the ClusterBinding.
    merge_patch(
        &cluster_bindings,
        "both",
        &json!({ "spec": { "apis": [{ "name": WIDGETS }] } }),
    )
    .await;

    // Exactly like deleting a ClusterBinding that covered only gadgets: every provider copy goes,
    // and the CRD kbind created goes once its instances are released (a CRD whose instances kept
    // kbind's finalizer could not finish deleting).
    wait_names(
        &gadgets(&s.provider, "team-a"),
        &BTreeSet::new(),
        "gadget copies gone",
    )
    .await;
    wait_gone(
        &Api::<CustomResourceDefinition>::all(s.consumer.clone()),
        GADGETS,
        "the consumer gadgets CRD to go",
        60,
    )
    .await;
    let status = wait_for("the gadgets entry to go", 30, || async {
        let status = cluster_binding_status(&s.consumer, "both").await;
        Ok(entry(&status, GADGETS).is_none().then_some(status))
    })
    .await;
    let w = entry(&status, WIDGETS).expect("the widgets entry stays");
    assert!(w.bound, "{w:?}");
    assert_eq!(w.connection, "provider");

    // Widgets untouched: the same provider objects (UID, generation), consumer finalizers kept,
    // and a change still goes up.
    let after: BTreeMap<String, (Option<String>, Option<i64>)> = provider_widgets
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|w| (w.name_any(), (w.metadata.uid, w.metadata.generation)))
        .collect();
    assert_eq!(before, after, "the widget copies were not touched");
    for w in widgets(&s.consumer, "team-a")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        assert!(
            w.finalizers().contains(&"core.kbind.io/syncer".to_owned()),
            "{} keeps its finalizer",
            w.name_any()
        );
    }
    resize_and_wait_upstream(&widgets(&s.consumer, "team-a"), &provider_widgets, "o07", 7).await;
    drop(s.env);
}

/// Per name: every provider UID seen, and when it was first seen and when it was deleted.
#[derive(Default)]
struct Seen {
    uids: BTreeMap<String, BTreeSet<String>>,
    first_seen: BTreeMap<String, Instant>,
    deleted: BTreeMap<String, Instant>,
}

fn record(client: &Client) -> (Arc<Mutex<Seen>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let into = seen.clone();
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &widget_resource());
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
        while let Some(event) = events.next().await {
            let now = Instant::now();
            let mut seen = into.lock().unwrap();
            match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                    let name = o.name_any();
                    seen.first_seen.entry(name.clone()).or_insert(now);
                    seen.uids
                        .entry(name)
                        .or_default()
                        .insert(o.metadata.uid.unwrap_or_default());
                }
                Ok(watcher::Event::Delete(o)) => {
                    seen.deleted.entry(o.name_any()).or_insert(now);
                }
                _ => {}
            }
        }
    });
    (seen, task)
}

#[tokio::test]
async fn moving_an_api_to_another_connection_drains_the_old_provider_before_the_new_one_gets_it() {
    let s = SyncEnv::start_with("edits_move_api", &[0, 1, 2], None, &["second"]).await;
    let second = s.connect_second().await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    let all: BTreeSet<String> = (0..10).map(|i| format!("w{i}")).collect();
    for name in &all {
        widgets(&s.consumer, "team-a")
            .create(&PostParams::default(), &widget(name, 1))
            .await
            .unwrap();
    }
    wait_names(
        &widgets(&s.provider, "team-a"),
        &all,
        "10 copies on the first provider",
    )
    .await;
    let consumer_uids: BTreeMap<String, String> = widgets(&s.consumer, "team-a")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|w| (w.name_any(), w.metadata.uid.unwrap_or_default()))
        .collect();
    // A related ConfigMap copied to the first provider, to see it follow the move.
    let mut settings = k8s_openapi::api::core::v1::ConfigMap {
        data: Some([("mode".to_owned(), "fast".to_owned())].into()),
        ..Default::default()
    };
    settings.metadata.name = Some("settings".into());
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(s.consumer.clone(), "team-a")
        .create(&PostParams::default(), &settings)
        .await
        .unwrap();
    merge_patch(&Api::<ClusterBinding>::all(s.consumer.clone()), "widgets", &json!({ "spec": { "relatedResources": [
                { "resource": "configmaps", "direction": "FromConsumer", "selector": { "names": ["settings"] } }
            ] } })).await;
    let config_maps = |client: &Client| {
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), "team-a")
    };
    wait_object(
        &config_maps(&s.provider),
        "settings",
        "the related copy on the first provider",
        60,
        |_| true,
    )
    .await;
    let (on_first, first_task) = record(&s.provider);
    let (on_second, second_task) = record(&second);

    // The user points the ClusterBinding at the second Connection.
    merge_patch(
        &Api::<ClusterBinding>::all(s.consumer.clone()),
        "widgets",
        &json!({ "spec": { "connectionRef": { "name": "second" } } }),
    )
    .await;

    wait_names(
        &widgets(&s.provider, "team-a"),
        &BTreeSet::new(),
        "the first provider drained",
    )
    .await;
    wait_names(
        &widgets(&second, "team-a"),
        &all,
        "10 copies on the second provider",
    )
    .await;
    let status = wait_for("the widgets entry bound through second", 30, || async {
        let status = cluster_binding_status(&s.consumer, "widgets").await;
        Ok(entry(&status, WIDGETS)
            .is_some_and(|e| e.bound && e.connection == "second")
            .then_some(status))
    })
    .await;
    assert_eq!(status.apis.len(), 1, "{:?}", status.apis);
    let crd = Api::<CustomResourceDefinition>::all(s.consumer.clone())
        .get(WIDGETS)
        .await
        .unwrap();
    assert_eq!(
        annotation(&crd, "core.kbind.io/connection"),
        Some("second"),
        "the CRD kbind created moved with the API"
    );

    // Each object reached the second provider once, after its first copy was gone, and belongs to
    // the same consumer object as before (nothing on the consumer was re-created).
    let copies = widgets(&second, "team-a")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    for copy in &copies {
        let name = copy.name_any();
        assert_eq!(
            copy.annotations().get("core.kbind.io/consumer-object-uid"),
            consumer_uids.get(&name),
            "{name}"
        );
    }
    // Let the watches catch up with what the lists showed.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    first_task.abort();
    second_task.abort();
    {
        let (first, second_seen) = (on_first.lock().unwrap(), on_second.lock().unwrap());
        for name in &all {
            let uids = second_seen.uids.get(name).map_or(0, BTreeSet::len);
            assert_eq!(
                uids, 1,
                "{name} was created on the second provider exactly once"
            );
            let gone = first
                .deleted
                .get(name)
                .expect("the first copy's deletion was seen");
            let arrived = second_seen
                .first_seen
                .get(name)
                .expect("the second copy was seen");
            assert!(
                gone < arrived,
                "{name} reached the second provider before its first copy was gone"
            );
        }
    }
    // The related copy moved too: gone from the first provider, present on the second.
    wait_gone(
        &config_maps(&s.provider),
        "settings",
        "the related copy to leave the first provider",
        60,
    )
    .await;
    wait_object(
        &config_maps(&second),
        "settings",
        "the related copy on the second provider",
        60,
        |_| true,
    )
    .await;
    resize_and_wait_upstream(
        &widgets(&s.consumer, "team-a"),
        &widgets(&second, "team-a"),
        "w3",
        4,
    )
    .await;
    drop(s.env);
}

#[tokio::test]
async fn a_binding_listing_a_cluster_scoped_api_still_syncs_its_namespaced_one() {
    let s = SyncEnv::start("edits_per_api", &[0, 1], None).await;
    let mut things = exported("clusterthings", "ClusterThing");
    things.spec.scope = "Cluster".into();
    install_crd(&s.provider, &things).await.unwrap();
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    let bindings: Api<Binding> = Api::namespaced(s.consumer.clone(), "team-a");
    bindings
        .create(
            &PostParams::default(),
            &Binding::new(
                "mixed",
                binding_spec("provider", &[WIDGETS, "clusterthings.example.org"]),
            ),
        )
        .await
        .unwrap();
    // The binding as a whole is not Ready, and says why …
    wait_binding(&bindings, "mixed", "Ready=False/ClusterScopedAPI").await;
    // … but each API is judged on its own: widgets is bound and syncs.
    let status = wait_for("the widgets entry bound", 30, || async {
        let b = bindings.get("mixed").await.map_err(|e| e.to_string())?;
        let status = b.status.unwrap_or_default();
        Ok(entry(&status, WIDGETS)
            .is_some_and(|e| e.bound)
            .then_some(status))
    })
    .await;
    let things = entry(&status, "clusterthings.example.org").expect("an entry for the bad API");
    assert_eq!(
        (things.bound, things.reason.as_str()),
        (false, "ClusterScopedAPI")
    );
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "w", 2).await;
    drop(s.env);
}
