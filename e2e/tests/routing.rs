//! #36 on three real clusters — a consumer and two providers serving the same Widget CRD — with
//! kbind's programs as real processes: per-object routing with pinned routes. Connection
//! `provider` serves the consumer CRD (the default route, ClusterBinding `widgets`); Connection
//! `second` is a route only for the objects its ClusterBinding selects.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::fixtures::*;
use kbind_e2e::wait::wait_for;
use kbind_shared::api::{Binding, ClusterBinding, ClusterBindingSpec};
use kube::api::{DynamicObject, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

const API: &str = "widgets.example.org";
const NS: &str = "team-a";

fn selecting(connection: &str, key: &str, value: &str) -> kbind_shared::api::BindingSpec {
    let mut spec = binding_spec(connection, &[API]);
    spec.object_selector = Some(LabelSelector {
        match_labels: Some([(key.to_owned(), value.to_owned())].into()),
        ..Default::default()
    });
    spec
}

/// The names of the Widgets in `team-a` that `client`'s cluster holds.
async fn names(client: &Client) -> BTreeSet<String> {
    widgets(client, NS)
        .list(&ListParams::default())
        .await
        .map(|l| l.items.iter().map(ResourceExt::name_any).collect())
        .unwrap_or_default()
}

/// A Widget with `labels`, created on the consumer.
async fn create(consumer: &Client, name: &str, labels: &[(&str, &str)]) {
    let mut w = widget(name, 1);
    w.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    );
    widgets(consumer, NS)
        .create(&PostParams::default(), &w)
        .await
        .unwrap();
}

async fn consumer_widget(consumer: &Client, name: &str) -> DynamicObject {
    widgets(consumer, NS).get(name).await.unwrap()
}

/// Waits until the consumer Widget `name` carries the conflict annotation `reason`.
async fn wait_conflict(consumer: &Client, name: &str, reason: Option<&str>) -> DynamicObject {
    let api = widgets(consumer, NS);
    wait_for(&format!("{name} conflict {reason:?}"), 30, || async {
        let w = api.get(name).await.map_err(|e| e.to_string())?;
        Ok((annotation(&w, "core.kbind.io/conflict") == reason).then_some(w))
    })
    .await
}

/// Where the objects a check follows are moving.
#[derive(Clone, Copy)]
enum Toward {
    /// From the provider (or nowhere) to the second.
    Second,
    /// From the second to the provider.
    Provider,
}

/// Samples both providers every 100 ms — the one the objects move `toward` first, so that an
/// object seen there and then still on the other was on both at once (sampled the other way
/// round, a move whose old copy went just before the new one came would look like both) —
/// until `done` holds for (on provider, on second).
async fn never_on_both(
    provider: &Client,
    second: &Client,
    toward: Toward,
    what: &str,
    done: impl Fn(&BTreeSet<String>, &BTreeSet<String>) -> bool,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (on_first, on_second) = match toward {
            Toward::Second => {
                let on_second = names(second).await;
                (names(provider).await, on_second)
            }
            Toward::Provider => {
                let on_first = names(provider).await;
                (on_first, names(second).await)
            }
        };
        let both: Vec<&String> = on_second.intersection(&on_first).collect();
        assert!(both.is_empty(), "on both providers at once: {both:?}");
        if done(&on_first, &on_second) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: provider {on_first:?}, second {on_second:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Events with `reason` about the consumer Widget `name`.
async fn events_about(consumer: &Client, name: &str, reason: &str) -> usize {
    Api::<k8s_openapi::api::core::v1::Event>::namespaced(consumer.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|e| {
            e.involved_object.name.as_deref() == Some(name) && e.reason.as_deref() == Some(reason)
        })
        .count()
}

/// The provider cluster UID Connection `name` is pinned to.
async fn provider_uid(consumer: &Client, name: &str) -> String {
    Api::<kbind_shared::api::Connection>::all(consumer.clone())
        .get(name)
        .await
        .unwrap()
        .status
        .unwrap()
        .remote_cluster_uid
}

fn pin(w: &DynamicObject) -> Option<String> {
    annotation(w, "core.kbind.io/route").map(str::to_owned)
}

/// Three clusters: the consumer, `provider` serving `crd` (the schema Connection, bound by the
/// ClusterBinding `widgets`, Ready) and `second` serving it too, connected as Connection
/// `second` but not bound yet. Returns the env and a client of `second`.
async fn three_clusters(test: &str, crd: CustomResourceDefinition) -> (SyncEnv, Client) {
    let s = SyncEnv::start_with_provider_crd_and(test, crd.clone(), &["second"]).await;
    let second = s.env.cluster("second").admin_client().await.unwrap();
    install_crd(&second, &crd).await.unwrap();
    let cluster_bindings: Api<ClusterBinding> = Api::all(s.consumer.clone());
    wait_binding(&cluster_bindings, "widgets", "Ready=True").await;
    connect_to(
        &s.consumer,
        "second",
        &s.env.cluster("second").admin_kubeconfig(),
    )
    .await;
    ensure_namespace(&s.consumer, NS).await.unwrap();
    (s, second)
}

/// Routes the Widgets labelled `region=us` to Connection `second` (the ClusterBinding
/// `second-us`) and waits until its binding shows `condition`.
async fn route_us_to_second(consumer: &Client, condition: &str) -> ClusterBinding {
    let cluster_bindings: Api<ClusterBinding> = Api::all(consumer.clone());
    cluster_bindings
        .create(
            &PostParams::default(),
            &ClusterBinding::new(
                "second-us",
                ClusterBindingSpec::from(selecting("second", "region", "us")),
            ),
        )
        .await
        .unwrap();
    wait_binding(&cluster_bindings, "second-us", condition).await
}

#[tokio::test]
async fn each_object_goes_to_exactly_the_route_its_labels_choose_and_stays_there_until_moved() {
    let (s, second) = three_clusters("routing", widget_crd()).await;
    let cluster_bindings: Api<ClusterBinding> = Api::all(s.consumer.clone());
    // An object synced before any route exists: routing pins it where its copy is, without a
    // write.
    create(&s.consumer, "early", &[]).await;
    wait_for("early on the provider", 30, || async {
        Ok(names(&s.provider).await.contains("early").then_some(()))
    })
    .await;
    let early = wait_object(
        &widgets(&s.consumer, NS),
        "early",
        "early synced",
        30,
        |w| w.data["status"]["kbindSync"]["state"] == "Synced",
    )
    .await;
    assert!(pin(&early).is_none(), "no pin while the API has one route");
    // "Must hold" 4: without a selector, the second Connection is still refused.
    cluster_bindings
        .create(
            &PostParams::default(),
            &ClusterBinding::new(
                "second-all",
                ClusterBindingSpec::from(binding_spec("second", &[API])),
            ),
        )
        .await
        .unwrap();
    let refused = wait_binding(
        &cluster_bindings,
        "second-all",
        "Ready=False/SchemaConflict",
    )
    .await;
    let message = &refused.status.unwrap().apis[0].message;
    assert!(
        message.contains("serves Connection provider") && message.contains("object selector"),
        "{message}"
    );
    cluster_bindings
        .delete("second-all", &Default::default())
        .await
        .unwrap();

    // A route through a selecting binding: admitted, the CRD untouched.
    let routed = route_us_to_second(&s.consumer, "Ready=True").await;
    let entry = &routed.status.unwrap().apis[0];
    assert_eq!(
        (
            entry.bound,
            entry.reason.as_str(),
            entry
                .route
                .as_ref()
                .map(|r| (r.served_by.as_str(), r.schema_agrees))
        ),
        (true, "Routed", Some(("provider", true))),
        "{entry:?}"
    );
    let crd = Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(s.consumer.clone()).get(API).await.unwrap();
    assert_eq!(
        annotation(&crd, "core.kbind.io/connection"),
        Some("provider")
    );

    // 1. The default route and the selected route each receive exactly their objects.
    create(&s.consumer, "plain", &[]).await;
    create(&s.consumer, "us", &[("region", "us")]).await;
    create(&s.consumer, "us-orphan", &[("region", "us")]).await;
    never_on_both(
        &s.provider,
        &second,
        Toward::Second,
        "each on its route",
        |first, second| {
            first.contains("plain") && second.contains("us") && second.contains("us-orphan")
        },
    )
    .await;
    let (first_uid, second_uid) = (
        provider_uid(&s.consumer, "provider").await,
        provider_uid(&s.consumer, "second").await,
    );

    assert_eq!(
        pin(&consumer_widget(&s.consumer, "plain").await),
        Some(format!("provider/{first_uid}"))
    );
    assert_eq!(
        pin(&consumer_widget(&s.consumer, "us").await),
        Some(format!("second/{second_uid}"))
    );
    // The early object was not written to when the API became routed, and stays where it is.
    let still = consumer_widget(&s.consumer, "early").await;
    assert_eq!(
        (still.metadata.resource_version.as_deref(), pin(&still)),
        (early.metadata.resource_version.as_deref(), None),
        "{:?}",
        still.metadata
    );
    // `kubectl get` shows each object's route (the API server's Table, its printer column).
    let (columns, row) = table(&s.consumer, NS, "us").await;
    let at = columns
        .iter()
        .position(|c| c == "Route")
        .expect("a Route column");
    assert_eq!(
        row[at],
        json!(format!("second/{second_uid}")),
        "{columns:?} {row:?}"
    );
    let (_, row) = table(&s.consumer, NS, "plain").await;
    assert_eq!(row[at], json!(format!("provider/{first_uid}")), "{row:?}");
    // The status comes back from the route's provider.
    wait_for("us's status from the second provider", 30, || async {
        let api = widgets(&second, NS);
        let mut copy = api.get("us").await.map_err(|e| e.to_string())?;
        copy.data["status"] = json!({ "phase": "FromSecond" });
        api.replace_status("us", &PostParams::default(), &copy)
            .await
            .map_err(|e| e.to_string())?;
        let w = consumer_widget(&s.consumer, "us").await;
        Ok((w.data["status"]["phase"] == "FromSecond").then_some(()))
    })
    .await;

    // `kubectl kbind status` shows the routing table, as the providers hold it.
    let kubeconfig = s.env.cluster("consumer").admin_kubeconfig_path();
    let report = plugin(&kubeconfig, &["status", "-o", "json"]).await.json();
    let row = |connection: &str| {
        report["routes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["api"] == API && r["connection"] == connection)
            .unwrap_or_else(|| panic!("no route {connection} in {:#}", report["routes"]))
            .clone()
    };
    assert_eq!(row("provider")["objects"], names(&s.provider).await.len());
    assert_eq!(row("second")["objects"], names(&second).await.len());
    assert_eq!(
        (
            row("provider")["serves"].clone(),
            row("second")["serves"].clone()
        ),
        (json!(true), json!(false))
    );
    assert!(
        row("second")["bindings"][0]
            .as_str()
            .unwrap()
            .contains("second-us (region=us)"),
        "{}",
        row("second")
    );
    // Metrics per route: objects, as the providers hold them, and the lag of their writes; the
    // per-API gauge is their sum.
    wait_for("objects per route in the syncer's metrics", 30, || async {
        let text = s.syncer.metrics().await?;
        let on = |connection: &str| {
            metric_sum(
                &text,
                "kbind_route_objects",
                &[
                    ("connection", connection),
                    ("api", API),
                    ("state", "synced"),
                ],
            )
        };
        let want = (
            names(&s.provider).await.len() as f64,
            names(&second).await.len() as f64,
        );
        let total = metric_sum(&text, "kbind_synced_objects", &[("api", API)]);
        let lagged = metric_sum(
            &text,
            "kbind_sync_lag_seconds_count",
            &[("connection", "second"), ("api", API), ("op", "spec_up")],
        );
        let got = (on("provider"), on("second"));
        (got == want && total == want.0 + want.1 && lagged >= 2.0)
            .then_some(())
            .ok_or(format!(
                "{got:?} (total {total}, lag count {lagged}), providers hold {want:?}"
            ))
            .map(Some)
    })
    .await;
    let text = plugin(&kubeconfig, &["status"]).await.stdout;
    assert!(
        text.contains("ROUTES") && text.contains("MOVING-OUT"),
        "{text}"
    );

    // 2. An ambiguous selection is a conflict and written nowhere: a Binding of the serving
    // Connection that selects tier=gold, and an object both selectors match.
    Api::<Binding>::namespaced(s.consumer.clone(), NS)
        .create(
            &PostParams::default(),
            &Binding::new("gold", selecting("provider", "tier", "gold")),
        )
        .await
        .unwrap();
    wait_binding(
        &Api::<Binding>::namespaced(s.consumer.clone(), NS),
        "gold",
        "Ready=True",
    )
    .await;
    create(&s.consumer, "both", &[("region", "us"), ("tier", "gold")]).await;
    wait_conflict(&s.consumer, "both", Some("AmbiguousRoute")).await;
    // The delivery record says so too (its own write, the status subresource's).
    let held = wait_object(
        &widgets(&s.consumer, NS),
        "both",
        "both's record: AmbiguousRoute",
        30,
        |w| w.data["status"]["kbindSync"]["state"] == "AmbiguousRoute",
    )
    .await;
    assert!(pin(&held).is_none());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!names(&s.provider).await.contains("both") && !names(&second).await.contains("both"));
    // `kubectl kbind plan` decides routes as the syncer does: another selecting route leaves it
    // ambiguous, and nothing is written meanwhile.
    let file = s.env.dir().join("routes.yaml");
    std::fs::write(
        &file,
        "apiVersion: core.kbind.io/v1alpha1\nkind: ClusterBinding\nmetadata: { name: second-gold }\nspec: { connectionRef: { name: second }, apis: [ { name: widgets.example.org } ], objectSelector: { matchLabels: { tier: gold } } }\n",
    )
    .unwrap();
    let planned = plugin(&kubeconfig, &["plan", file.to_str().unwrap(), "-o", "json"])
        .await
        .json();
    let api = &planned["apis"][0];
    assert_eq!(
        (api["crd"]["action"].as_str(), api["startSyncing"].as_u64()),
        (Some("route"), Some(0)),
        "{api:#}"
    );
    assert_eq!(
        api["conflicts"],
        json!([{ "object": "team-a/both", "reason": "AmbiguousRoute" }]),
        "{api:#}"
    );

    // Resolved by the user (one label less): it goes to the one route left.
    merge_patch(
        &widgets(&s.consumer, NS),
        "both",
        &json!({ "metadata": { "labels": { "tier": null } } }),
    )
    .await;
    never_on_both(
        &s.provider,
        &second,
        Toward::Second,
        "both on the second",
        |_, second| second.contains("both"),
    )
    .await;
    wait_conflict(&s.consumer, "both", None).await;

    // 3. A label change is held as RouteChanged and nothing moves.
    merge_patch(
        &widgets(&s.consumer, NS),
        "us",
        &json!({ "metadata": { "labels": { "region": "eu" } } }),
    )
    .await;
    wait_conflict(&s.consumer, "us", Some("RouteChanged")).await;
    wait_for("one RouteChanged Event", 20, || async {
        Ok((events_about(&s.consumer, "us", "RouteChanged").await == 1).then_some(()))
    })
    .await;
    // It keeps syncing to its pinned route.
    merge_patch(
        &widgets(&s.consumer, NS),
        "us",
        &json!({ "spec": { "size": 7 } }),
    )
    .await;
    wait_for("the change on the pinned route", 30, || async {
        let w = widgets(&second, NS)
            .get("us")
            .await
            .map_err(|e| e.to_string())?;
        Ok((w.data["spec"]["size"] == 7).then_some(()))
    })
    .await;
    assert!(!names(&s.provider).await.contains("us"));
    // The bindings covering it count it as routing's, not as a provider object in the way.
    let conflicts =
        wait_binding(&cluster_bindings, "widgets", "Conflicts=True/RouteConflict").await;
    let status = conflicts.status.unwrap();
    let message = &kbind_shared::conditions::find(&status.conditions, "Conflicts")
        .unwrap()
        .message;
    assert!(
        message.contains("1 object(s) conflict") && message.contains("routing"),
        "{message}"
    );

    // 4. An explicit move (the pin set to the other Connection): the old copy goes first, then
    // the new one is created — never both.
    merge_patch(
        &widgets(&s.consumer, NS),
        "us",
        &json!({ "metadata": { "annotations": { "core.kbind.io/route": "provider" } } }),
    )
    .await;
    never_on_both(
        &s.provider,
        &second,
        Toward::Provider,
        "us moved to provider",
        |first, second| first.contains("us") && !second.contains("us"),
    )
    .await;
    let moved = wait_conflict(&s.consumer, "us", None).await;
    assert_eq!(
        widgets(&s.provider, NS).get("us").await.unwrap().data["spec"]["size"],
        7
    );
    assert!(
        !moved
            .finalizers()
            .iter()
            .any(|f| f.starts_with("core.kbind.io/route-")),
        "{:?}",
        moved.finalizers()
    );

    // 5. An Orphan move leaves the old copy, unmarked and foreign to kbind.
    merge_patch(
        &widgets(&s.consumer, NS),
        "us-orphan",
        &json!({ "metadata": { "annotations": {
        "core.kbind.io/deletion-policy": "Orphan",
        "core.kbind.io/route": format!("provider/{first_uid}"),
    } } }),
    )
    .await;
    wait_for("us-orphan on the provider", 60, || async {
        Ok(names(&s.provider).await.contains("us-orphan").then_some(()))
    })
    .await;
    let left = widgets(&second, NS).get("us-orphan").await.unwrap();
    assert_eq!(
        (
            annotation(&left, "core.kbind.io/consumer-object-uid"),
            label(&left, "core.kbind.io/managed")
        ),
        (None, None),
        "{:?}",
        left.metadata
    );
    // kbind never takes it back; the user removes it (and from here on no name is on both).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        annotation(
            &widgets(&second, NS).get("us-orphan").await.unwrap(),
            "core.kbind.io/consumer-object-uid"
        )
        .is_none()
    );
    widgets(&second, NS)
        .delete("us-orphan", &Default::default())
        .await
        .unwrap();

    // Moved against its labels (region=us still chooses the second): said so, not moved back.
    wait_conflict(&s.consumer, "us-orphan", Some("RouteChanged")).await;
    merge_patch(
        &widgets(&s.consumer, NS),
        "us-orphan",
        &json!({ "metadata": { "labels": { "region": null } } }),
    )
    .await;
    wait_conflict(&s.consumer, "us-orphan", None).await;
    wait_binding(&cluster_bindings, "widgets", "Conflicts=False").await;

    // A deletion removes the copy from the object's own route.
    widgets(&s.consumer, NS)
        .delete("both", &Default::default())
        .await
        .unwrap();
    wait_for("both deleted everywhere", 30, || async {
        let gone =
            !names(&second).await.contains("both") && !names(&s.consumer).await.contains("both");
        Ok(gone.then_some(()))
    })
    .await;
    // The default route never saw the second's objects, nor the reverse.
    assert_eq!(
        names(&s.provider).await,
        ["early", "plain", "us", "us-orphan"]
            .map(String::from)
            .into()
    );
    assert!(names(&second).await.is_empty());

    // Unbinding the route drains its copies; what was pinned there is held (NoRoute), never
    // moved to the default route behind the user's back — until the user removes the pin.
    create(&s.consumer, "us2", &[("region", "us")]).await;
    never_on_both(
        &s.provider,
        &second,
        Toward::Second,
        "us2 on the second",
        |_, second| second.contains("us2"),
    )
    .await;
    cluster_bindings
        .delete("second-us", &Default::default())
        .await
        .unwrap();
    never_on_both(
        &s.provider,
        &second,
        Toward::Second,
        "us2 drained",
        |_, second| !second.contains("us2"),
    )
    .await;
    wait_object(
        &widgets(&s.consumer, NS),
        "us2",
        "us2 held (NoRoute) with its route's finalizer released",
        30,
        |w| annotation(w, "core.kbind.io/conflict") == Some("NoRoute") && w.finalizers().is_empty(),
    )
    .await;
    wait_for("second-us gone", 30, || async {
        Ok(cluster_bindings
            .get_opt("second-us")
            .await
            .map_err(|e| e.to_string())?
            .is_none()
            .then_some(()))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!names(&s.provider).await.contains("us2"));
    merge_patch(
        &widgets(&s.consumer, NS),
        "us2",
        &json!({ "metadata": { "annotations": { "core.kbind.io/route": null } } }),
    )
    .await;
    wait_for("us2 on the default route", 30, || async {
        Ok(names(&s.provider).await.contains("us2").then_some(()))
    })
    .await;
    wait_conflict(&s.consumer, "us2", None).await;
}

/// A Widget CRD whose `spec.size` has the JSON type `size_type`.
fn widget_crd_sized(size_type: &str) -> CustomResourceDefinition {
    let mut crd = widget_crd();
    crd.spec.versions[0].schema = serde_json::from_value(
        json!({ "openAPIV3Schema": { "type": "object", "properties": {
            "spec": { "type": "object", "properties": { "size": { "type": size_type } } },
            "status": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
        }}}),
    )
    .unwrap();
    crd
}

#[tokio::test]
async fn a_schema_drift_on_one_provider_holds_only_that_routes_objects() {
    let (s, second) = three_clusters("routing_drift", widget_crd_sized("integer")).await;
    let cluster_bindings: Api<ClusterBinding> = Api::all(s.consumer.clone());
    route_us_to_second(&s.consumer, "SchemaInSync=True").await;
    create(&s.consumer, "plain", &[]).await;
    create(&s.consumer, "us", &[("region", "us")]).await;
    never_on_both(
        &s.provider,
        &second,
        Toward::Second,
        "each on its route",
        |first, second| first.contains("plain") && second.contains("us"),
    )
    .await;

    // The second provider retypes spec.size: its route no longer agrees.
    install_crd(&second, &widget_crd_sized("string"))
        .await
        .unwrap();
    let drifted = wait_binding(&cluster_bindings, "second-us", "SchemaInSync=False").await;
    let entry = drifted.status.unwrap().apis[0].clone();
    let route = entry.route.clone().unwrap();
    assert_eq!(
        (entry.reason.as_str(), route.schema_agrees),
        ("SchemaMismatch", false),
        "{entry:?}"
    );
    assert!(route.schema_message.contains("spec.size"), "{route:?}");
    wait_conflict(&s.consumer, "us", Some("SchemaMismatch")).await;
    // Its objects are held: a change is not written there ...
    merge_patch(
        &widgets(&s.consumer, NS),
        "us",
        &json!({ "spec": { "size": 5 } }),
    )
    .await;
    // ... while the other route's objects sync as ever.
    merge_patch(
        &widgets(&s.consumer, NS),
        "plain",
        &json!({ "spec": { "size": 6 } }),
    )
    .await;
    wait_for("plain's change on the default route", 30, || async {
        let w = widgets(&s.provider, NS)
            .get("plain")
            .await
            .map_err(|e| e.to_string())?;
        Ok((w.data["spec"]["size"] == 6).then_some(()))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        widgets(&second, NS).get("us").await.unwrap().data["spec"]["size"],
        1
    );
    wait_object(
        &widgets(&s.consumer, NS),
        "us",
        "us's record: SchemaMismatch",
        30,
        |w| w.data["status"]["kbindSync"]["state"] == "SchemaMismatch",
    )
    .await;

    // The provider agrees again: the held change goes through.
    install_crd(&second, &widget_crd_sized("integer"))
        .await
        .unwrap();
    wait_binding(&cluster_bindings, "second-us", "SchemaInSync=True").await;
    wait_for("us's change on its route", 60, || async {
        let w = widgets(&second, NS)
            .get("us")
            .await
            .map_err(|e| e.to_string())?;
        Ok((w.data["spec"]["size"] == 5).then_some(()))
    })
    .await;
    wait_conflict(&s.consumer, "us", None).await;
    assert!(!names(&s.provider).await.contains("us"));
}

/// The pins of the consumer Widgets, by name (the Connection part only).
async fn pins(consumer: &Client) -> std::collections::BTreeMap<String, String> {
    widgets(consumer, NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|w| {
            let pin = pin(w)?;
            Some((
                w.name_any(),
                pin.split('/').next().unwrap_or_default().to_owned(),
            ))
        })
        .collect()
}

/// Lists `first` then `then`: an object on both whose pin names `first` was on both at once (its
/// copy on `first` is created only after the one on `then` is gone, so seeing both in this order
/// is a violation; the other direction is checked by listing the other way round).
async fn never_both_toward(
    first: (&Client, &str),
    then: &Client,
    pinned: &std::collections::BTreeMap<String, String>,
) {
    let on_first = names(first.0).await;
    let on_then = names(then).await;
    let both: Vec<&String> = on_first
        .intersection(&on_then)
        .filter(|n| pinned.get(*n).map(String::as_str) == Some(first.1))
        .collect();
    assert!(both.is_empty(), "on both providers at once: {both:?}");
}

#[tokio::test]
async fn chaos_random_label_pin_and_binding_edits_never_leave_an_object_on_two_providers() {
    let mut rng = kbind_e2e::chaos::Lcg(kbind_e2e::chaos::seed(36));
    let (s, second) = three_clusters("routing_chaos", widget_crd()).await;
    route_us_to_second(&s.consumer, "Ready=True").await;
    let objects: Vec<String> = (0..10).map(|i| format!("c{i}")).collect();
    for (i, name) in objects.iter().enumerate() {
        let labels: &[(&str, &str)] = if i % 2 == 0 { &[("region", "us")] } else { &[] };
        create(&s.consumer, name, labels).await;
    }
    let gold = Api::<Binding>::namespaced(s.consumer.clone(), NS);
    let api = widgets(&s.consumer, NS);
    for step in 0..40 {
        let name = &objects[rng.below(objects.len() as u64) as usize];
        let edit = match rng.below(6) {
            0 => json!({ "metadata": { "labels": { "region": "us" } } }),
            1 => json!({ "metadata": { "labels": { "region": null } } }),
            2 => {
                json!({ "metadata": { "labels": { "tier": if rng.below(2) == 0 { json!("gold") } else { json!(null) } } } })
            }
            3 => json!({ "metadata": { "annotations": { "core.kbind.io/route": "second" } } }),
            4 => json!({ "metadata": { "annotations": { "core.kbind.io/route": "provider" } } }),
            _ => {
                // The binding that makes tier=gold objects ambiguous comes and goes.
                if gold.get_opt("gold").await.unwrap().is_some() {
                    let _ = gold.delete("gold", &Default::default()).await;
                } else {
                    let _ = gold
                        .create(
                            &PostParams::default(),
                            &Binding::new("gold", selecting("provider", "tier", "gold")),
                        )
                        .await;
                }
                json!({})
            }
        };
        eprintln!("step {step}: {name} {edit}");
        merge_patch(&api, name, &edit).await;
        for _ in 0..3 {
            let pinned = pins(&s.consumer).await;
            never_both_toward((&second, "second"), &s.provider, &pinned).await;
            never_both_toward((&s.provider, "provider"), &second, &pinned).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Settled: every pinned object's copy is on its route and nowhere else; none on both.
    wait_for("every object on its pinned route", 90, || async {
        let pinned = pins(&s.consumer).await;
        let (on_first, on_second) = (names(&s.provider).await, names(&second).await);
        let wrong: Vec<String> = pinned
            .iter()
            .filter(|(name, route)| {
                let (here, there) = if *route == "second" {
                    (&on_second, &on_first)
                } else {
                    (&on_first, &on_second)
                };
                !here.contains(*name) || there.contains(*name)
            })
            .map(|(name, route)| format!("{name}→{route}"))
            .collect();
        let both: Vec<&String> = on_first.intersection(&on_second).collect();
        assert!(both.is_empty(), "on both providers: {both:?}");
        if wrong.is_empty() {
            Ok(Some(()))
        } else {
            Err(format!("not on their route: {wrong:?}"))
        }
    })
    .await;
}

/// team-a's Binding `widgets` of Connection `provider`, the serving one (it installs the CRD);
/// waits until it is Ready.
async fn serve_team_a(consumer: &Client) {
    let mut served = Binding::new("widgets", binding_spec("provider", &[API]));
    served.metadata.namespace = Some(NS.into());
    let in_a: Api<Binding> = Api::namespaced(consumer.clone(), NS);
    in_a.create(&PostParams::default(), &served).await.unwrap();
    wait_binding(&in_a, "widgets", "Ready=True").await;
}

/// team-r's Binding `route`: the Widgets of team-r labelled `region=us` go to Connection
/// `second`; waits until it is Ready.
async fn route_team_r_to_second(in_r: &Api<Binding>) {
    let mut route = Binding::new("route", selecting("second", "region", "us"));
    route.metadata.namespace = Some("team-r".into());
    in_r.create(&PostParams::default(), &route).await.unwrap();
    wait_binding(in_r, "route", "Ready=True").await;
}

/// Creates team-r's Widget `r0` labelled `region=us` and waits until the second provider has it.
async fn team_r_widget_on_second(consumer: &Client, second: &Client) {
    let mut r0 = widget("r0", 1);
    r0.metadata.labels = Some([("region".to_owned(), "us".to_owned())].into());
    widgets(consumer, "team-r")
        .create(&PostParams::default(), &r0)
        .await
        .unwrap();
    wait_for("team-r's Widget on the second provider", 60, || async {
        Ok(widgets(second, "team-r")
            .get_opt("r0")
            .await
            .unwrap()
            .map(|_| ()))
    })
    .await;
}

#[tokio::test]
async fn a_tenants_route_binding_never_touches_objects_no_binding_covers() {
    // #50.3: Connection `provider` serves the Widgets through team-a's Binding only; namespace
    // `bystanders` has Widgets no binding covers. A tenant in team-r makes the API routed with a
    // selecting Binding to Connection `second`, and deletes it, again and again: the bystanders'
    // Widgets are never written (no NoRoute annotation, no record, no Event) — before, every
    // uncovered object was marked NoRoute and kept the mark after the route went. And the
    // flips restart no worker: once the route's worker runs, no API server serves another LIST
    // of Widgets (before, every flip restarted the serving worker: a re-list of both sides).
    let s = SyncEnv::start_with("routing_uncovered", &[0, 1], None, &["second"]).await;
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    let second = s.connect_second().await;
    for namespace in [NS, "team-r", "bystanders"] {
        ensure_namespace(&s.consumer, namespace).await.unwrap();
    }
    serve_team_a(&s.consumer).await;
    create_widget_and_wait_upstream(&s.consumer, &s.provider, NS, "a0", 1).await;
    let bystanders = widgets(&s.consumer, "bystanders");
    for i in 0..1000 {
        bystanders
            .create(&PostParams::default(), &widget(&format!("b{i}"), 1))
            .await
            .unwrap();
    }
    let versions = || async {
        bystanders
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|w| (w.name_any(), w.resource_version().unwrap_or_default()))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let before = versions().await;
    assert_eq!(before.len(), 1000);
    // Reads of Widget collections each API server served (a LIST, or a WATCH: a streaming list
    // is one), from their audit logs — Kubernetes' own controllers' aside, and the reads of the
    // tenant's own namespace (the schema manager counts the team-r objects a route's schema
    // would affect, a bounded LIST of that namespace: the tenant's own cost).
    let lists = || {
        ["consumer", "provider", "second"]
            .into_iter()
            .map(|cluster| {
                s.env
                    .cluster(cluster)
                    .audited()
                    .into_iter()
                    .filter(|a| {
                        a.resource == "widgets"
                            && matches!(a.verb.as_str(), "list" | "watch")
                            && !a.user_agent.starts_with("kube-controller-manager/")
                            && a.namespace != "team-r"
                    })
                    .map(|a| {
                        format!(
                            "{cluster} {} {} {} {}",
                            a.verb, a.namespace, a.user, a.user_agent
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    };
    let mut lists_before = None;
    let in_r: Api<Binding> = Api::namespaced(s.consumer.clone(), "team-r");
    for round in 0..10 {
        route_team_r_to_second(&in_r).await;
        if round == 0 {
            // The route is in effect: team-r's selected Widget goes to `second`.
            team_r_widget_on_second(&s.consumer, &second).await;
            lists_before = Some(lists());
        } else {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        in_r.delete("route", &Default::default()).await.unwrap();
        wait_for("the route Binding gone", 60, || async {
            Ok(in_r.get_opt("route").await.unwrap().is_none().then_some(()))
        })
        .await;
    }
    let lists_after = lists();
    // team-a's objects still sync: whatever was due to the bystanders had its turn by then.
    create_widget_and_wait_upstream(&s.consumer, &s.provider, NS, "a1", 1).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = versions().await;
    let written: Vec<&String> = after
        .iter()
        .filter(|(name, version)| before.get(*name) != Some(version))
        .map(|(name, _)| name)
        .collect();
    assert!(written.is_empty(), "uncovered Widgets written: {written:?}");
    let lists_before = lists_before.unwrap();
    let extra: Vec<&String> = lists_after
        .iter()
        .zip(&lists_before)
        .flat_map(|(after, before)| &after[before.len()..])
        .collect();
    assert!(
        extra.is_empty(),
        "reads of Widgets on the consumer, the provider and the second provider: {extra:#?}"
    );
    let b0 = bystanders.get("b0").await.unwrap();
    assert!(
        annotation(&b0, "core.kbind.io/conflict").is_none(),
        "{b0:?}"
    );
}

#[tokio::test]
async fn a_pin_to_a_connection_the_namespace_may_not_use_says_not_allowed() {
    // #50.3: Connection `second` lets only team-r's Bindings use it. A team-a Widget pinned to it
    // is held as NotAllowed, naming that rule — before, NoRoute said "which no binding covering it
    // offers", which sends a new user looking for a binding they may not make. So while the API
    // has one route, and once team-r's selecting Binding makes it routed.
    let s = SyncEnv::start_with("routing_not_allowed", &[0, 1], None, &["second"]).await;
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    let second = s.connect_second().await;
    let connections: Api<kbind_shared::api::Connection> = Api::all(s.consumer.clone());
    connections
        .patch(
            "second",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({ "spec": { "access": { "bindingNamespaces": ["team-r"] } } }),
            ),
        )
        .await
        .unwrap();
    wait_connection(&s.consumer, "second", "Ready=True").await;
    for namespace in [NS, "team-r"] {
        ensure_namespace(&s.consumer, namespace).await.unwrap();
    }
    serve_team_a(&s.consumer).await;

    let mut pinned = widget("pinned", 1);
    pinned.metadata.annotations =
        Some([("core.kbind.io/route".to_owned(), "second".to_owned())].into());
    widgets(&s.consumer, NS)
        .create(&PostParams::default(), &pinned)
        .await
        .unwrap();
    let says_not_allowed = |w: &DynamicObject| {
        let message = w.data["status"]["kbindSync"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            message.contains("namespace team-a may not use")
                && message.contains("spec.access.bindingNamespaces"),
            "{message}"
        );
    };
    // The annotation and the delivery record are two writes (the record paced): wait for both.
    let pinned_api = widgets(&s.consumer, NS);
    let held = wait_for(
        "pinned held as NotAllowed, annotated and recorded",
        30,
        || async {
            let w = pinned_api.get("pinned").await.map_err(|e| e.to_string())?;
            let recorded = w.data["status"]["kbindSync"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty());
            Ok(
                (annotation(&w, "core.kbind.io/conflict") == Some("NotAllowed") && recorded)
                    .then_some(w),
            )
        },
    )
    .await;
    says_not_allowed(&held);
    assert!(
        held.finalizers().is_empty(),
        "nothing written anywhere: {held:?}"
    );

    let in_r: Api<Binding> = Api::namespaced(s.consumer.clone(), "team-r");
    route_team_r_to_second(&in_r).await;
    // Routed now, with `second`'s worker running: team-r's selected Widget reaches it. The
    // routed workers decide on the pinned Widget again (a change of it, too): still NotAllowed.
    team_r_widget_on_second(&s.consumer, &second).await;
    merge_patch(
        &widgets(&s.consumer, NS),
        "pinned",
        &json!({ "spec": { "size": 2 } }),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = consumer_widget(&s.consumer, "pinned").await;
    assert_eq!(
        annotation(&held, "core.kbind.io/conflict"),
        Some("NotAllowed"),
        "{held:?}"
    );
    says_not_allowed(&held);
    assert!(events_about(&s.consumer, "pinned", "NotAllowed").await >= 1);
    assert!(
        names(&s.provider).await.is_empty(),
        "nothing of team-a reached a provider"
    );
}

#[tokio::test]
async fn a_route_binding_gone_takes_routings_mark_and_record_with_it() {
    // #50.3: team-r's only binding is a selecting route to `second`; its Widget labelled
    // region=eu matches nothing and is held (NoRoute: annotation, record, Event). The route
    // Binding deleted, no binding covers the Widget: kbind's annotation and its record both go —
    // before, `Delivery` went on saying NoRoute for an object kbind no longer had anything to do
    // with.
    let s = SyncEnv::start_with("routing_hold_record", &[0, 1], None, &["second"]).await;
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    let second = s.connect_second().await;
    for namespace in [NS, "team-r"] {
        ensure_namespace(&s.consumer, namespace).await.unwrap();
    }
    serve_team_a(&s.consumer).await;
    let in_r: Api<Binding> = Api::namespaced(s.consumer.clone(), "team-r");
    route_team_r_to_second(&in_r).await;
    team_r_widget_on_second(&s.consumer, &second).await;

    let team_r = widgets(&s.consumer, "team-r");
    let mut eu = widget("eu1", 1);
    eu.metadata.labels = Some([("region".to_owned(), "eu".to_owned())].into());
    team_r.create(&PostParams::default(), &eu).await.unwrap();
    wait_for("eu1 held: NoRoute, annotated and recorded", 30, || async {
        let w = team_r.get("eu1").await.map_err(|e| e.to_string())?;
        Ok((annotation(&w, "core.kbind.io/conflict") == Some("NoRoute")
            && w.data["status"]["kbindSync"]["state"] == "NoRoute")
            .then_some(()))
    })
    .await;

    in_r.delete("route", &Default::default()).await.unwrap();
    let w = wait_for("eu1's mark and record gone", 60, || async {
        let w = team_r.get("eu1").await.map_err(|e| e.to_string())?;
        let unmarked = annotation(&w, "core.kbind.io/conflict").is_none()
            && w.data["status"].get("kbindSync").is_none();
        Ok(unmarked.then_some(w))
    })
    .await;
    assert!(w.finalizers().is_empty(), "{w:?}");
}
