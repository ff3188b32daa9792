//! Every version a provider serves, on two real clusters: the consumer CRD serves each version
//! whose schema is identical to the storage version's (conversion `None` converts it losslessly),
//! with the provider's storage version as storage; versions that differ are left out and named —
//! in the binding's per-API entry and in the Connection's `exportedAPIs[].omittedVersions` — from
//! both schema sources.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::fixtures::*;
use kbind_e2e::wait::wait_for;
use kbind_shared::api::{ClusterBinding, ClusterBindingSpec, Connection, PullPolicy, SchemaSource};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// A Gizmo CRD on the provider serving v1beta1 (`spec.size` a string), v1 (storage) and v2 (the
/// same schema as v1, deprecated), conversion None; labelled exported (every schema source reads
/// the mark, #32.8).
fn gizmo_versions() -> CustomResourceDefinition {
    let schema = |size: &str| {
        json!({ "openAPIV3Schema": { "type": "object", "properties": {
            "spec": { "type": "object", "properties": { "size": { "type": size } } },
            "status": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
        }}})
    };
    let labels = json!({ "core.kbind.io/exported": "true" });
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": { "name": "gizmos.example.org", "labels": labels },
        "spec": {
            "group": "example.org", "scope": "Namespaced",
            "names": { "plural": "gizmos", "singular": "gizmo", "kind": "Gizmo" },
            "versions": [
                { "name": "v1beta1", "served": true, "storage": false, "subresources": { "status": {} }, "schema": schema("string") },
                { "name": "v1", "served": true, "storage": true, "subresources": { "status": {} }, "schema": schema("integer") },
                { "name": "v2", "served": true, "storage": false, "subresources": { "status": {} }, "schema": schema("integer"),
                  "deprecated": true, "deprecationWarning": "example.org/v2 Gizmo is going away" },
            ],
        },
    }))
    .unwrap()
}

fn gizmos(client: &Client, version: &str, namespace: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.org", version, "Gizmo"),
        "gizmos",
    );
    Api::namespaced_with(client.clone(), namespace, &resource)
}

type Setup = Pair;

async fn setup(test: &str, source: SchemaSource) -> Setup {
    let Pair {
        mut env,
        consumer,
        provider,
    } = Pair::start(test, &[]).await;
    install_crd(&provider, &gizmo_versions()).await.unwrap();
    start_lone_schema_manager(&mut env, &[]).await;
    start_syncer(&mut env, "consumer", "syncer-0", &[])
        .await
        .unwrap();
    put_kubeconfig(&consumer, "p", &env.cluster("provider").admin_kubeconfig()).await;
    let mut c = connection("provider", "p", source);
    c.spec.schema.pull_policy = PullPolicy::Bound;
    create_connection(&consumer, &c).await.unwrap();
    wait_connection(&consumer, "provider", "Ready=True").await;
    let bindings: Api<ClusterBinding> = Api::all(consumer.clone());
    bindings
        .create(
            &PostParams::default(),
            &ClusterBinding::new(
                "gizmos",
                ClusterBindingSpec::from(binding_spec("provider", &["gizmos.example.org"])),
            ),
        )
        .await
        .unwrap();
    wait_binding(&bindings, "gizmos", "Ready=True").await;
    Pair {
        env,
        consumer,
        provider,
    }
}

/// The consumer serves v1 and v2 (`versions`: name, served, storage, in order), not v1beta1, and
/// says why — in the binding's entry and on the Connection; an object written as v2 syncs and
/// reads back as v1.
async fn every_lossless_version_is_served_and_the_others_are_named(
    s: &Setup,
    expected: &[(&str, bool, bool)],
) {
    let crd = Api::<CustomResourceDefinition>::all(s.consumer.clone())
        .get("gizmos.example.org")
        .await
        .unwrap();
    let versions = kbind_shared::dynamic::version_flags(&crd.spec.versions);
    assert_eq!(versions, expected);
    assert_eq!(crd.spec.conversion.as_ref().unwrap().strategy, "None");

    // Named: the binding's entry (still bound) and the Connection's export.
    let bindings: Api<ClusterBinding> = Api::all(s.consumer.clone());
    let binding = bindings.get("gizmos").await.unwrap();
    let entry = binding
        .status
        .unwrap()
        .apis
        .into_iter()
        .find(|a| a.name == "gizmos.example.org")
        .unwrap();
    assert!(entry.bound);
    assert_eq!(entry.reason, "VersionsOmitted");
    assert!(
        entry
            .message
            .contains("not served here: v1beta1 (its schema differs from the storage version"),
        "{}",
        entry.message
    );
    let connection = Api::<Connection>::all(s.consumer.clone())
        .get("provider")
        .await
        .unwrap();
    let export = connection
        .status
        .unwrap()
        .exported_apis
        .into_iter()
        .find(|e| e.name == "gizmos.example.org")
        .unwrap();
    let omitted: Vec<&str> = export
        .omitted_versions
        .iter()
        .map(|v| v.name.as_str())
        .collect();
    assert_eq!(omitted, ["v1beta1"]);
    assert!(
        export.omitted_versions[0]
            .reason
            .contains("conversion None would lose data")
    );

    // An object created as v2 syncs up, reads back as v1, and its status comes down.
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    let gizmo: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.org/v2", "kind": "Gizmo",
        "metadata": { "name": "g1" }, "spec": { "size": 4 },
    }))
    .unwrap();
    gizmos(&s.consumer, "v2", "team-a")
        .create(&PostParams::default(), &gizmo)
        .await
        .unwrap();
    let copy = wait_object(
        &gizmos(&s.provider, "v1", "team-a"),
        "g1",
        "the provider copy",
        30,
        |_| true,
    )
    .await;
    assert_eq!(copy.data["spec"], json!({ "size": 4 }));
    let as_v1 = gizmos(&s.consumer, "v1", "team-a").get("g1").await.unwrap();
    assert_eq!(as_v1.types.unwrap().api_version, "example.org/v1");
    assert_eq!(as_v1.data["spec"], json!({ "size": 4 }));
    gizmos(&s.provider, "v1", "team-a")
        .patch_status(
            "g1",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "status": { "phase": "Ready" } })),
        )
        .await
        .unwrap();
    wait_for("status down, read as v2", 30, || async {
        let g = gizmos(&s.consumer, "v2", "team-a")
            .get("g1")
            .await
            .map_err(|e| e.to_string())?;
        Ok((g.data["status"]["phase"] == "Ready").then_some(()))
    })
    .await;
    // A change made through v1 syncs too.
    merge_patch(
        &gizmos(&s.consumer, "v1", "team-a"),
        "g1",
        &json!({ "spec": { "size": 5 } }),
    )
    .await;
    wait_for("the change upstream", 30, || async {
        let copy = gizmos(&s.provider, "v1", "team-a")
            .get("g1")
            .await
            .map_err(|e| e.to_string())?;
        Ok((copy.data["spec"]["size"] == 5).then_some(()))
    })
    .await;
    let _ = &s.env;
}

#[tokio::test]
async fn crd_source_serves_every_lossless_version_and_names_the_others() {
    let s = setup("versions_crd", SchemaSource::Crd).await;
    // The provider's storage version is the consumer's; its deprecation is kept.
    let expected = [("v1", true, true), ("v2", true, false)];
    every_lossless_version_is_served_and_the_others_are_named(&s, &expected).await;
    let crd = Api::<CustomResourceDefinition>::all(s.consumer.clone())
        .get("gizmos.example.org")
        .await
        .unwrap();
    let v2 = &crd.spec.versions[1];
    assert_eq!(
        v2.deprecated,
        Some(true),
        "the provider's deprecation is kept"
    );
    assert_eq!(
        v2.deprecation_warning.as_deref(),
        Some("example.org/v2 Gizmo is going away")
    );
}

#[tokio::test]
async fn openapi_source_serves_every_lossless_version_and_names_the_others() {
    let s = setup("versions_openapi", SchemaSource::OpenApi).await;
    // Discovery does not say which version the provider stores: the synthesized CRD stores the
    // preferred (highest) one (OAPI-5) — lossless either way, since v1 and v2 are identical.
    let expected = [("v2", true, true), ("v1", true, false)];
    every_lossless_version_is_served_and_the_others_are_named(&s, &expected).await;
}
