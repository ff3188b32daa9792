//! Schema installation and the binding reconcilers on two real clusters
//! (REFERENCE-BEHAVIOUR §9 SCH, §12 BIND, §14 BCL), with kbind's programs as real processes.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::eventually;
use kbind_e2e::fixtures::*;
use kbind_e2e::kbind::{apiserver_requests, grown};
use kbind_e2e::wait::wait_gone;
use kbind_shared::api::{
    Binding, ClusterBinding, ClusterBindingSpec, Connection, PullPolicy, SchemaSource, UpdatePolicy,
};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

type Setup = Pair;

async fn setup(test: &str, with_syncer: bool) -> Setup {
    let mut s = Pair::start(test, &[]).await;
    start_lone_schema_manager(&mut s.env, &[]).await;
    if with_syncer {
        start_syncer(&mut s.env, "consumer", "syncer-0", &[])
            .await
            .unwrap();
    }
    put_kubeconfig(
        &s.consumer,
        "p",
        &s.env.cluster("provider").admin_kubeconfig(),
    )
    .await;
    s
}

async fn connect(s: &Setup, name: &str, pull: PullPolicy, update: UpdatePolicy) {
    let mut c = connection(name, "p", SchemaSource::Crd);
    c.spec.schema.pull_policy = pull;
    c.spec.schema.update_policy = update;
    create_connection(&s.consumer, &c).await.unwrap();
    wait_connection(&s.consumer, name, "Ready=True").await;
}

async fn cluster_bind(
    s: &Setup,
    name: &str,
    connection: &str,
    apis: &[&str],
) -> Api<ClusterBinding> {
    let api: Api<ClusterBinding> = Api::all(s.consumer.clone());
    api.create(
        &PostParams::default(),
        &ClusterBinding::new(
            name,
            ClusterBindingSpec::from(binding_spec(connection, apis)),
        ),
    )
    .await
    .unwrap();
    api
}

async fn bind(
    s: &Setup,
    namespace: &str,
    name: &str,
    connection: &str,
    apis: &[&str],
) -> Api<Binding> {
    ensure_namespace(&s.consumer, namespace).await.unwrap();
    let api: Api<Binding> = Api::namespaced(s.consumer.clone(), namespace);
    api.create(
        &PostParams::default(),
        &Binding::new(name, binding_spec(connection, apis)),
    )
    .await
    .unwrap();
    api
}

fn exported(plural: &str, kind: &str) -> CustomResourceDefinition {
    crd(
        plural,
        "example.org",
        kind,
        &[("core.kbind.io/exported", "true")],
    )
}

/// Safe by default: the binding reports a SchemaConflict for a CRD kbind did not create until the
/// user opts in (`core.kbind.io/adopt`); then it becomes Ready.
async fn refused_until_adopted(
    s: &Setup,
    bindings: &Api<ClusterBinding>,
    binding: &str,
    crd: &str,
) {
    wait_binding(bindings, binding, "Ready=False/SchemaConflict").await;
    adopt_crd(&s.consumer, crd, "provider").await.unwrap();
    wait_binding(bindings, binding, "Ready=True").await;
}

async fn consumer_crd(s: &Setup, name: &str) -> Option<CustomResourceDefinition> {
    Api::<CustomResourceDefinition>::all(s.consumer.clone())
        .get_opt(name)
        .await
        .unwrap()
}

#[tokio::test]
async fn update_policy_always_follows_provider_schema_changes_and_once_does_not() {
    // SCH-4, SCH-5, LIM-13 (SchemaInSync)
    let s = setup("bind_update_policy", false).await;
    install_crd(&s.provider, &exported("widgets", "Widget"))
        .await
        .unwrap();
    install_crd(&s.provider, &exported("gadgets", "Gadget"))
        .await
        .unwrap();
    connect(&s, "always", PullPolicy::Bound, UpdatePolicy::Always).await;
    connect(&s, "once", PullPolicy::Bound, UpdatePolicy::Once).await;
    let bindings = cluster_bind(&s, "widgets", "always", &["widgets.example.org"]).await;
    cluster_bind(&s, "gadgets", "once", &["gadgets.example.org"]).await;
    wait_binding(&bindings, "widgets", "Ready=True").await;
    wait_binding(&bindings, "gadgets", "Ready=True").await;
    let hash =
        |crd: &CustomResourceDefinition| crd.annotations()["core.kbind.io/schema-hash"].clone();
    let (widgets_before, gadgets_before) = (
        consumer_crd(&s, "widgets.example.org").await.unwrap(),
        consumer_crd(&s, "gadgets.example.org").await.unwrap(),
    );

    // The provider adds a required `spec.color` to both.
    for name in ["widgets.example.org", "gadgets.example.org"] {
        let patch = json!({ "spec": { "versions": [{
            "name": "v1", "served": true, "storage": true, "subresources": { "status": {} },
            "schema": { "openAPIV3Schema": { "type": "object", "properties": {
                "spec": { "type": "object", "required": ["color"], "properties": { "color": { "type": "string", "enum": ["red", "blue"] } } },
                "status": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
            }}},
        }]}});
        Api::<CustomResourceDefinition>::all(s.provider.clone())
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
    // Required `spec.color` is a breaking change: Always holds it until the hash is accepted.
    let held =
        eventually(
            "the Always binding to hold the breaking change",
            Duration::from_secs(30),
            || async {
                let binding = bindings.get("widgets").await.map_err(|e| e.to_string())?;
                let conds = binding.status.unwrap_or_default().conditions;
                let c = kbind_shared::conditions::find(&conds, "SchemaInSync").ok_or("none")?;
                let at = c.message.find("sha256:");
                Ok((c.reason == "BreakingChange"
                    && c.message.contains("spec.color: newly required"))
                .then(|| {
                    at.map(|at| c.message[at..at + kbind_shared::keys::SCHEMA_HASH_LEN].to_owned())
                })
                .flatten())
            },
        )
        .await
        .unwrap();
    assert_eq!(
        hash(&consumer_crd(&s, "widgets.example.org").await.unwrap()),
        hash(&widgets_before),
        "held until accepted"
    );
    merge_patch(
        &Api::<kbind_shared::api::Connection>::all(s.consumer.clone()),
        "always",
        &json!({ "spec": { "schema": { "acceptedChanges": [
                { "api": "widgets.example.org", "schemaHash": held }
            ] } } }),
    )
    .await;
    let widgets_after = eventually(
        "the Always CRD to follow",
        Duration::from_secs(20),
        || async {
            Ok(consumer_crd(&s, "widgets.example.org")
                .await
                .filter(|c| hash(c) != hash(&widgets_before)))
        },
    )
    .await
    .unwrap();
    let schema = serde_json::to_value(&widgets_after.spec.versions[0].schema).unwrap();
    assert_eq!(
        schema["openAPIV3Schema"]["properties"]["spec"]["required"],
        json!(["color"])
    );
    // The local API server now enforces the provider's schema.
    let w = widgets(&s.consumer, "default");
    let rejected = w.create(&PostParams::default(), &serde_json::from_value(json!({"apiVersion": "example.org/v1", "kind": "Widget", "metadata": {"name": "x"}, "spec": {"color": "green"}})).unwrap()).await;
    assert!(
        matches!(rejected, Err(kube::Error::Api(e)) if e.is_invalid()),
        "an enum violation is rejected locally"
    );

    wait_binding(&bindings, "gadgets", "SchemaInSync=False").await;
    assert_eq!(
        hash(&consumer_crd(&s, "gadgets.example.org").await.unwrap()),
        hash(&gadgets_before),
        "Once never updates"
    );
    wait_binding(&bindings, "widgets", "SchemaInSync=True").await;
}

#[tokio::test]
async fn multi_version_provider_crd_arrives_in_every_identical_version_with_conversion_none() {
    // SCH-2, improved: every served version whose schema is identical to the storage version's
    let s = setup("bind_multi_version", false).await;
    let mut multi = exported("widgets", "Widget");
    let mut older = multi.spec.versions[0].clone();
    older.name = "v1alpha1".into();
    older.storage = false;
    multi.spec.versions.insert(0, older);
    multi.spec.conversion = serde_json::from_value(json!({
        "strategy": "Webhook",
        "webhook": { "conversionReviewVersions": ["v1"], "clientConfig": { "url": "https://127.0.0.1:1/convert" } }
    }))
    .unwrap();
    install_crd(&s.provider, &multi).await.unwrap();
    connect(&s, "provider", PullPolicy::Bound, UpdatePolicy::Always).await;
    let bindings = cluster_bind(&s, "widgets", "provider", &["widgets.example.org"]).await;
    wait_binding(&bindings, "widgets", "Ready=True").await;
    let crd = consumer_crd(&s, "widgets.example.org").await.unwrap();
    let versions = kbind_shared::dynamic::version_flags(&crd.spec.versions);
    assert_eq!(versions, [("v1alpha1", true, false), ("v1", true, true)]);
    assert_eq!(crd.spec.conversion.as_ref().unwrap().strategy, "None");
    assert!(!crd.labels().contains_key("core.kbind.io/exported"));

    // At rest (1 s resyncs), the binding's and the Connection's checks read nothing: the
    // Connection, the CRDs on both sides and the provider's identity come from watches (issue
    // #15, goal 5).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (consumer_before, provider_before) = (
        apiserver_requests(&s.consumer).await.unwrap(),
        apiserver_requests(&s.provider).await.unwrap(),
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (consumer_after, provider_after) = (
        apiserver_requests(&s.consumer).await.unwrap(),
        apiserver_requests(&s.provider).await.unwrap(),
    );
    let reads = |before, after| {
        let mut reads = grown(before, after);
        // Resource reads only: the API servers' own aggregator fetches `/openapi/v3`.
        reads.retain(|key, _| {
            (key.starts_with("GET ") || key.starts_with("LIST ")) && !key.contains(" / ")
        });
        reads
    };
    let consumer_reads = reads(&consumer_before, &consumer_after);
    let provider_reads = reads(&provider_before, &provider_after);
    assert!(
        consumer_reads.is_empty() && provider_reads.is_empty(),
        "reads at rest: consumer {consumer_reads:?}, provider {provider_reads:?}"
    );
}

#[tokio::test]
async fn bad_binding_input_is_reported_per_api_and_nothing_is_deleted() {
    // BIND-3, BIND-7, BIND-14 / PGAP-6, DISC-6
    let s = setup("bind_bad_input", false).await;
    let mut clusters = exported("clusterthings", "ClusterThing");
    clusters.spec.scope = "Cluster".into();
    install_crd(&s.provider, &clusters).await.unwrap();
    install_crd(&s.provider, &exported("widgets", "Widget"))
        .await
        .unwrap();

    // Before its Connection exists: Pending.
    let bindings = bind(
        &s,
        "team-a",
        "things",
        "provider",
        &["clusterthings.example.org"],
    )
    .await;
    let b = wait_binding(&bindings, "things", "Ready=False/Pending").await;
    assert!(
        b.status
            .unwrap()
            .conditions
            .iter()
            .any(|c| c.message.contains("Connection provider not found"))
    );

    connect(&s, "provider", PullPolicy::Bound, UpdatePolicy::Always).await;
    // A cluster-scoped API in a namespaced Binding is refused, not silently accepted.
    let b = wait_binding(&bindings, "things", "Ready=False/ClusterScopedAPI").await;
    assert!(b.status.unwrap().bound_apis.is_empty());
    assert!(
        consumer_crd(&s, "clusterthings.example.org")
            .await
            .is_none()
    );

    // An API the provider does not export.
    let others = bind(
        &s,
        "team-a",
        "others",
        "provider",
        &["widgets.example.org", "missing.example.org"],
    )
    .await;
    wait_binding(&others, "others", "Ready=False/APINotExported").await;
    // The exported API is bound once its CRD is established (a moment later).
    let b = eventually(
        "the exported API bound next to the missing one",
        Duration::from_secs(30),
        || async {
            let b = others.get("others").await.map_err(|e| e.to_string())?;
            let bound = b.status.as_ref().is_some_and(|s| !s.bound_apis.is_empty());
            Ok(bound.then_some(b))
        },
    )
    .await
    .unwrap();
    let status = b.status.unwrap();
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.message.contains("missing.example.org"))
    );
    assert_eq!(
        status
            .bound_apis
            .iter()
            .map(|a| a.name.as_str())
            .collect::<Vec<_>>(),
        ["widgets.example.org"],
        "the exported API is still installed"
    );

    // The provider stops exporting: APINotExported, and nothing is deleted.
    label_crd(
        &s.provider,
        "widgets.example.org",
        "core.kbind.io/exported",
        None,
    )
    .await
    .unwrap();
    let cb = cluster_bind(&s, "all-widgets", "provider", &["widgets.example.org"]).await;
    wait_binding(&cb, "all-widgets", "Ready=False/APINotExported").await;
    assert!(consumer_crd(&s, "widgets.example.org").await.is_some());
}

#[tokio::test]
async fn pull_policy_none_stamps_a_user_crd_and_unbind_keeps_it() {
    // SCH-4 (None), §9.3 row CRD/None, LIM-9; None with an absent CRD is a clear Pending.
    let s = setup("bind_pull_none", false).await;
    install_crd(&s.provider, &exported("widgets", "Widget"))
        .await
        .unwrap();
    install_crd(&s.provider, &exported("gadgets", "Gadget"))
        .await
        .unwrap();
    connect(&s, "provider", PullPolicy::None, UpdatePolicy::Always).await;
    install_crd(&s.consumer, &crd("widgets", "example.org", "Widget", &[]))
        .await
        .unwrap();

    // Safe by default: a CRD kbind did not create is stamped only after the user opts in.
    let bindings = cluster_bind(&s, "widgets", "provider", &["widgets.example.org"]).await;
    refused_until_adopted(&s, &bindings, "widgets", "widgets.example.org").await;
    let stamped = consumer_crd(&s, "widgets.example.org").await.unwrap();
    assert_managed_for(&stamped, "provider");
    assert!(
        !stamped
            .annotations()
            .contains_key("core.kbind.io/created-by")
    );

    cluster_bind(&s, "gadgets", "provider", &["gadgets.example.org"]).await;
    let b = wait_binding(&bindings, "gadgets", "Ready=False/Pending").await;
    assert!(
        b.status
            .unwrap()
            .conditions
            .iter()
            .any(|c| c.message.contains("pullPolicy is None"))
    );

    bindings
        .delete("widgets", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&bindings, "widgets", "the ClusterBinding to go", 20).await;
    assert!(
        consumer_crd(&s, "widgets.example.org").await.is_some(),
        "a CRD kbind did not create is never deleted"
    );
}

#[tokio::test]
async fn deleting_a_binding_removes_only_the_copies_no_remaining_binding_covers() {
    // BCL-3 exact (LIM-22): overlapping Bindings keep exactly the objects still covered.
    let s = setup("bind_overlap", true).await;
    install_crd(&s.provider, &widget_crd()).await.unwrap();
    connect(&s, "provider", PullPolicy::Bound, UpdatePolicy::Always).await;
    let a = bind(
        &s,
        "team-a",
        "widgets",
        "provider",
        &["widgets.example.org"],
    )
    .await;
    let b = bind(
        &s,
        "team-b",
        "widgets",
        "provider",
        &["widgets.example.org"],
    )
    .await;
    let extra = bind(
        &s,
        "team-b",
        "widgets-too",
        "provider",
        &["widgets.example.org"],
    )
    .await;
    for (api, name) in [(&a, "widgets"), (&b, "widgets"), (&extra, "widgets-too")] {
        wait_binding(api, name, "Ready=True").await;
    }
    for ns in ["team-a", "team-b"] {
        widgets(&s.consumer, ns)
            .create(&PostParams::default(), &widget("w", 1))
            .await
            .unwrap();
    }
    for ns in ["team-a", "team-b"] {
        let provider = widgets(&s.provider, ns);
        eventually(
            &format!("the copy in {ns}"),
            Duration::from_secs(20),
            || async { provider.get_opt("w").await.map_err(|e| e.to_string()) },
        )
        .await
        .unwrap();
    }

    // team-b stays covered by its second Binding: deleting one keeps its copy.
    b.delete("widgets", &DeleteParams::default()).await.unwrap();
    // team-a loses its only Binding: its copy goes, the CRD stays (a Binding never removes it).
    a.delete("widgets", &DeleteParams::default()).await.unwrap();
    let provider_a = widgets(&s.provider, "team-a");
    wait_gone(&provider_a, "w", "team-a's copy to go", 20).await;
    wait_gone(&a, "widgets", "team-a's Binding to go", 20).await;
    wait_gone(&b, "widgets", "team-b's Binding to go", 20).await;
    assert!(
        widgets(&s.provider, "team-b")
            .get_opt("w")
            .await
            .unwrap()
            .is_some(),
        "team-b is still covered"
    );
    assert!(consumer_crd(&s, "widgets.example.org").await.is_some());
    let consumer_a = widgets(&s.consumer, "team-a").get("w").await.unwrap();
    assert!(
        !consumer_a
            .finalizers()
            .contains(&"core.kbind.io/syncer".to_owned()),
        "the consumer object is released"
    );
    drop(s.env);
}

/// `crd` with the export mark, which the OpenAPI source needs too (#32.8).
fn marked(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    crd.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("core.kbind.io/exported".into(), "true".into());
    crd
}

fn gizmo_crd(extra: Option<(&str, serde_json::Value)>) -> CustomResourceDefinition {
    let mut spec_properties = json!({
        "size": { "type": "integer", "minimum": 1 },
        "mode": { "type": "string", "enum": ["fast", "slow"] },
        "nested": { "type": "object", "required": ["x"], "properties": { "x": { "type": "string" } } },
    });
    if let Some((name, schema)) = extra {
        spec_properties[name] = schema;
    }
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": { "name": "gizmos.example.org" },
        "spec": {
            "group": "example.org", "scope": "Namespaced",
            "names": { "plural": "gizmos", "singular": "gizmo", "kind": "Gizmo", "shortNames": ["gz"], "categories": ["toys"] },
            "versions": [{ "name": "v1", "served": true, "storage": true, "subresources": { "status": {} },
                "schema": { "openAPIV3Schema": { "type": "object", "properties": {
                    "spec": { "type": "object", "required": ["size"], "properties": spec_properties },
                    "status": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
                }}}}],
        },
    }))
    .unwrap()
}

#[tokio::test]
async fn openapi_synthesized_crd_enforces_the_provider_schema_and_follows_changes() {
    // §9.2, §10 OAPI with LIM-5/LIM-6/PGAP-13 improved
    let s = setup("bind_openapi", true).await;
    install_crd(&s.provider, &marked(gizmo_crd(None)))
        .await
        .unwrap();
    let mut c = connection("provider", "p", SchemaSource::OpenApi);
    c.spec.schema.pull_policy = PullPolicy::Bound;
    create_connection(&s.consumer, &c).await.unwrap();
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    let bindings = cluster_bind(&s, "gizmos", "provider", &["gizmos.example.org"]).await;
    wait_binding(&bindings, "gizmos", "Ready=True").await;

    let crd = consumer_crd(&s, "gizmos.example.org").await.unwrap();
    assert_eq!(crd.spec.names.short_names, Some(vec!["gz".to_owned()]));
    assert_eq!(crd.spec.names.categories, Some(vec!["toys".to_owned()]));
    assert!(
        crd.spec.versions[0]
            .subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some()
    );

    let resource = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("example.org", "v1", "Gizmo"),
        "gizmos",
    );
    let gizmos: Api<kube::api::DynamicObject> =
        Api::namespaced_with(s.consumer.clone(), "default", &resource);
    let gizmo = |name: &str, spec: serde_json::Value| -> kube::api::DynamicObject {
        serde_json::from_value(json!({ "apiVersion": "example.org/v1", "kind": "Gizmo", "metadata": { "name": name }, "spec": spec })).unwrap()
    };
    for (why, spec) in [
        ("type", json!({ "size": "big" })),
        ("minimum", json!({ "size": 0 })),
        ("enum", json!({ "size": 1, "mode": "medium" })),
        ("required", json!({ "mode": "fast" })),
        ("nested required", json!({ "size": 1, "nested": {} })),
    ] {
        let result = gizmos
            .create(&PostParams::default(), &gizmo("bad", spec))
            .await;
        assert!(
            matches!(&result, Err(kube::Error::Api(e)) if e.is_invalid()),
            "{why}: {result:?}"
        );
    }
    gizmos
        .create(
            &PostParams::default(),
            &gizmo(
                "good",
                json!({ "size": 2, "mode": "slow", "nested": { "x": "y" } }),
            ),
        )
        .await
        .unwrap();
    let provider_gizmos: Api<kube::api::DynamicObject> =
        Api::namespaced_with(s.provider.clone(), "default", &resource);
    eventually(
        "the gizmo on the provider",
        Duration::from_secs(20),
        || async {
            provider_gizmos
                .get_opt("good")
                .await
                .map_err(|e| e.to_string())
        },
    )
    .await
    .unwrap();

    // LIM-6: with Bound + Always, a provider schema change reaches the installed CRD.
    install_crd(
        &s.provider,
        &marked(gizmo_crd(Some((
            "color",
            json!({ "type": "string", "enum": ["red"] }),
        )))),
    )
    .await
    .unwrap();
    eventually(
        "the synthesized CRD to follow",
        Duration::from_secs(30),
        || async {
            let crd = consumer_crd(&s, "gizmos.example.org")
                .await
                .ok_or("no CRD")?;
            let schema =
                serde_json::to_value(&crd.spec.versions[0].schema).map_err(|e| e.to_string())?;
            Ok(
                (schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["color"]["enum"]
                    == json!(["red"]))
                .then_some(()),
            )
        },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn pull_policy_all_installs_every_export_without_a_binding() {
    // CONN-8, §9.3 rows CRD/All and OpenAPI/All: schemas arrive, instance sync still needs a binding.
    let s = setup("bind_pull_all", false).await;
    install_crd(&s.provider, &exported("widgets", "Widget"))
        .await
        .unwrap();
    install_crd(&s.provider, &exported("gadgets", "Gadget"))
        .await
        .unwrap();
    connect(&s, "provider", PullPolicy::All, UpdatePolicy::Always).await;
    for name in ["widgets.example.org", "gadgets.example.org"] {
        let crd = eventually(
            &format!("{name} installed"),
            Duration::from_secs(20),
            || async { Ok(consumer_crd(&s, name).await) },
        )
        .await
        .unwrap();
        assert_eq!(
            annotation(&crd, "core.kbind.io/connection"),
            Some("provider")
        );
    }

    // The OpenAPI source installs its synthesized CRDs eagerly too. It exports only marked APIs
    // (#32.8), which the CRD source would then pull as well: that Connection goes first (its
    // CRDs stay).
    let connections: Api<Connection> = Api::all(s.consumer.clone());
    connections
        .delete("provider", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(
        &connections,
        "provider",
        "the CRD-source Connection to go",
        30,
    )
    .await;
    install_crd(&s.provider, &marked(gizmo_crd(None)))
        .await
        .unwrap();
    let mut openapi = connection("openapi", "p", SchemaSource::OpenApi);
    openapi.spec.schema.pull_policy = PullPolicy::All;
    // Once: it must not take over the CRDs the first Connection installed (SCH-6).
    openapi.spec.schema.update_policy = UpdatePolicy::Once;
    create_connection(&s.consumer, &openapi).await.unwrap();
    let gizmos = eventually(
        "gizmos installed from OpenAPI",
        Duration::from_secs(30),
        || async {
            Ok(consumer_crd(&s, "gizmos.example.org")
                .await
                .filter(|c| annotation(c, "core.kbind.io/connection") == Some("openapi")))
        },
    )
    .await
    .unwrap();
    assert_eq!(gizmos.spec.names.short_names, Some(vec!["gz".to_owned()]));
}

#[tokio::test]
async fn a_binding_shadowed_by_a_cluster_binding_says_so() {
    // RES-2 precedence made visible on the Binding.
    let s = setup("bind_precedence", false).await;
    install_crd(&s.provider, &exported("widgets", "Widget"))
        .await
        .unwrap();
    connect(&s, "provider", PullPolicy::Bound, UpdatePolicy::Always).await;
    let cluster_bindings =
        cluster_bind(&s, "everything", "provider", &["widgets.example.org"]).await;
    wait_binding(&cluster_bindings, "everything", "Ready=True").await;
    let bindings = bind(&s, "team-a", "mine", "provider", &["widgets.example.org"]).await;
    let b = eventually(
        "the Binding to name the ClusterBinding",
        Duration::from_secs(20),
        || async {
            let b = bindings.get("mine").await.map_err(|e| e.to_string())?;
            let conds = b.status.clone().unwrap_or_default().conditions;
            let ready = kbind_shared::conditions::find(&conds, "Ready").cloned();
            Ok(ready
                .filter(|r| {
                    r.status == "True"
                        && r.message
                            .contains("widgets.example.org (ClusterBinding everything)")
                })
                .map(|_| b))
        },
    )
    .await
    .unwrap();
    assert_eq!(b.status.unwrap().bound_apis.len(), 1);
}

#[tokio::test]
async fn openapi_pull_none_stamps_a_user_crd_and_waits_for_an_absent_one() {
    // §9.3 row OpenAPI/None, with LIM-8 improved: an existing CRD is stamped like the CRD source
    // (once the user opted in with core.kbind.io/adopt).
    let s = setup("bind_openapi_none", false).await;
    install_crd(&s.provider, &marked(gizmo_crd(None)))
        .await
        .unwrap();
    install_crd(&s.provider, &exported("widgets", "Widget"))
        .await
        .unwrap();
    let mut c = connection("provider", "p", SchemaSource::OpenApi);
    c.spec.schema.pull_policy = PullPolicy::None;
    create_connection(&s.consumer, &c).await.unwrap();
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    install_crd(&s.consumer, &gizmo_crd(None)).await.unwrap();

    // Safe by default: a CRD kbind did not create is stamped only after the user opts in.
    let bindings = cluster_bind(&s, "gizmos", "provider", &["gizmos.example.org"]).await;
    refused_until_adopted(&s, &bindings, "gizmos", "gizmos.example.org").await;
    let stamped = consumer_crd(&s, "gizmos.example.org").await.unwrap();
    assert_managed_for(&stamped, "provider");

    cluster_bind(&s, "widgets", "provider", &["widgets.example.org"]).await;
    let b = wait_binding(&bindings, "widgets", "Ready=False/Pending").await;
    assert!(
        b.status
            .unwrap()
            .conditions
            .iter()
            .any(|c| c.message.contains("pullPolicy is None"))
    );
    assert!(
        consumer_crd(&s, "widgets.example.org").await.is_none(),
        "None never creates a CRD"
    );
}

#[tokio::test]
async fn a_provider_crd_changing_scope_is_surfaced_not_applied() {
    // SCH-7: a scope change is held as breaking; once accepted, the consumer API server refuses
    // the update; the binding says why each time, nothing is lost.
    let s = setup("bind_scope_change", false).await;
    install_crd(&s.provider, &exported("widgets", "Widget"))
        .await
        .unwrap();
    connect(&s, "provider", PullPolicy::Bound, UpdatePolicy::Always).await;
    let bindings = cluster_bind(&s, "widgets", "provider", &["widgets.example.org"]).await;
    wait_binding(&bindings, "widgets", "Ready=True").await;
    // A provider may recreate its CRD with another scope.
    let provider_crds: Api<CustomResourceDefinition> = Api::all(s.provider.clone());
    provider_crds
        .delete("widgets.example.org", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(
        &provider_crds,
        "widgets.example.org",
        "the provider CRD to go",
        20,
    )
    .await;
    let mut cluster_scoped = exported("widgets", "Widget");
    cluster_scoped.spec.scope = "Cluster".into();
    install_crd(&s.provider, &cluster_scoped).await.unwrap();
    // A scope change is breaking: held, and named.
    let held = wait_binding(&bindings, "widgets", "SchemaInSync=False/BreakingChange").await;
    let message = kbind_shared::conditions::find(&held.status.unwrap().conditions, "SchemaInSync")
        .unwrap()
        .message
        .clone();
    assert!(
        message.contains("<scope>: scope Namespaced → Cluster"),
        "{message}"
    );
    // Accepted, the consumer API server still refuses it (scope is immutable): said, not lost.
    let at = message.find("sha256:").unwrap();
    merge_patch(&Api::<kbind_shared::api::Connection>::all(s.consumer.clone()), "provider", &json!({ "spec": { "schema": { "acceptedChanges": [
                { "api": "widgets.example.org", "schemaHash": &message[at..at + kbind_shared::keys::SCHEMA_HASH_LEN] }
            ] } } })).await;
    let b = wait_binding(&bindings, "widgets", "Ready=False/Pending").await;
    let messages: Vec<String> = b
        .status
        .unwrap()
        .conditions
        .into_iter()
        .map(|c| c.message)
        .collect();
    assert!(
        messages
            .iter()
            .any(|m| m.contains("rejected CRD widgets.example.org")),
        "{messages:?}"
    );
    assert_eq!(
        consumer_crd(&s, "widgets.example.org")
            .await
            .unwrap()
            .spec
            .scope,
        "Namespaced",
        "the installed CRD is untouched"
    );
}

#[tokio::test]
async fn update_policy_once_over_an_unmarked_crd_is_reported_until_adopted_then_only_stamped() {
    // LIM-7 decided: an existing unmarked consumer CRD is never silently left unmarked while the
    // binding says Ready. It is a SchemaConflict until the user opts in; then, under Once, kbind
    // only stamps its markers (an update of the schema is what Once forbids; the markers are
    // kbind's bookkeeping) and the objects sync.
    let s = setup("bind_once_unmarked", true).await;
    install_crd(&s.provider, &exported("widgets", "Widget"))
        .await
        .unwrap();
    connect(&s, "provider", PullPolicy::Bound, UpdatePolicy::Once).await;
    let mut users = crd("widgets", "example.org", "Widget", &[]);
    users.spec.versions[0].additional_printer_columns = Some(vec![
        serde_json::from_value(
            json!({ "name": "Size", "type": "integer", "jsonPath": ".spec.size" }),
        )
        .unwrap(),
    ]);
    install_crd(&s.consumer, &users).await.unwrap();
    let before = consumer_crd(&s, "widgets.example.org").await.unwrap();
    let bindings = cluster_bind(&s, "widgets", "provider", &["widgets.example.org"]).await;
    refused_until_adopted(&s, &bindings, "widgets", "widgets.example.org").await;
    let stamped = consumer_crd(&s, "widgets.example.org").await.unwrap();
    assert_eq!(
        annotation(&stamped, "core.kbind.io/connection"),
        Some("provider")
    );
    // The whole spec — schema, versions, printer columns — is the user's, unchanged; and the
    // provider's own columns (kbind's delivery columns among them) never arrived.
    assert_eq!(stamped.spec, before.spec, "Once keeps the user's schema");
    assert_eq!(stamped.metadata.generation, before.metadata.generation);
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "w1", 1).await;
}
