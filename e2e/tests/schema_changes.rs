//! Schema evolution on two real clusters: a compatible provider schema change is applied at once;
//! a breaking one is held — `SchemaInSync=False/BreakingChange` naming each change and how many
//! existing consumer objects it would invalidate, one Warning Event, the old schema still served
//! and objects still syncing — until the user accepts its hash on the Connection.

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::fixtures::*;
use kbind_e2e::wait::wait_for;
use kbind_shared::api::{ClusterBinding, Connection};
use kbind_shared::conditions;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

const API: &str = "widgets.example.org";

/// A Widget CRD whose `spec` has exactly `spec` as its schema.
fn widget_crd_with(spec: Value) -> CustomResourceDefinition {
    let mut crd = widget_crd();
    crd.spec.versions[0].schema = serde_json::from_value(json!({ "openAPIV3Schema": {
        "type": "object",
        "properties": {
            "spec": spec,
            "status": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
        },
    }}))
    .unwrap();
    crd
}

/// Replaces the provider's Widget `spec` schema.
async fn provider_changes_spec(provider: &Client, spec: Value) {
    let crd = widget_crd_with(spec);
    let patch = json!({ "spec": { "versions": crd.spec.versions } });
    Api::<CustomResourceDefinition>::all(provider.clone())
        .patch(API, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// A schema as the API server returns it (numbers as their typed fields hold them).
fn normal(schema: &Value) -> Value {
    let typed: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps =
        serde_json::from_value(schema.clone()).unwrap();
    serde_json::to_value(typed).unwrap()
}

/// The consumer CRD's `spec` schema.
async fn consumer_spec_schema(consumer: &Client) -> Value {
    let crd = Api::<CustomResourceDefinition>::all(consumer.clone())
        .get(API)
        .await
        .unwrap();
    serde_json::to_value(&crd.spec.versions[0].schema).unwrap()["openAPIV3Schema"]["properties"]
        ["spec"]
        .clone()
}

/// Waits for `SchemaInSync=False/BreakingChange` whose message has every one of `parts`; returns
/// the held hash the message names.
async fn wait_held(consumer: &Client, parts: &[&str]) -> String {
    let bindings: Api<ClusterBinding> = Api::all(consumer.clone());
    wait_for(&format!("BreakingChange naming {parts:?}"), 30, || async {
        let binding = bindings.get("widgets").await.map_err(|e| e.to_string())?;
        let status = binding.status.unwrap_or_default();
        let Some(c) = conditions::find(&status.conditions, "SchemaInSync") else {
            return Ok(None);
        };
        if c.status != "False" || c.reason != "BreakingChange" {
            return Err(format!(
                "SchemaInSync {} {}: {}",
                c.status, c.reason, c.message
            ));
        }
        if let Some(missing) = parts.iter().find(|p| !c.message.contains(*p)) {
            return Err(format!("no {missing:?} in {}", c.message));
        }
        // The per-API entry says the same, and the API stays bound.
        let entry = status
            .apis
            .iter()
            .find(|a| a.name == API)
            .ok_or("no entry")?;
        assert!(entry.bound, "a held change does not unbind: {entry:?}");
        assert_eq!(entry.reason, "BreakingChange");
        let at = c.message.find("sha256:").ok_or("no hash in the message")?;
        Ok(Some(
            c.message[at..at + kbind_shared::keys::SCHEMA_HASH_LEN].to_owned(),
        ))
    })
    .await
}

/// The user's consent: the hash added to the Connection's `spec.schema.acceptedChanges`.
async fn accept(consumer: &Client, hashes: &[&str]) {
    let accepted: Vec<Value> = hashes
        .iter()
        .map(|h| json!({ "api": API, "schemaHash": h }))
        .collect();
    merge_patch(
        &Api::<Connection>::all(consumer.clone()),
        "provider",
        &json!({ "spec": { "schema": { "acceptedChanges": accepted } } }),
    )
    .await;
}

/// How many times a `BreakingChange` Warning Event about the ClusterBinding was recorded.
async fn breaking_change_events(consumer: &Client) -> i32 {
    Api::<Event>::all(consumer.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|e| {
            e.involved_object.name.as_deref() == Some("widgets")
                && e.reason.as_deref() == Some("BreakingChange")
        })
        .map(|e| {
            e.count
                .unwrap_or(1)
                .max(e.series.as_ref().and_then(|s| s.count).unwrap_or(1))
        })
        .sum()
}

#[tokio::test]
async fn compatible_changes_apply_at_once_and_breaking_ones_wait_for_consent() {
    let size = json!({ "type": "integer" });
    let s = SyncEnv::start_with_provider_crd(
        "schema_changes",
        widget_crd_with(json!({ "type": "object", "properties": { "size": size } })),
        &[],
    )
    .await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    for (name, size) in [("w1", 1), ("w2", 2), ("w3", 3)] {
        create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", name, size).await;
    }
    let (consumer_widgets, provider_widgets) = (
        widgets(&s.consumer, "team-a"),
        widgets(&s.provider, "team-a"),
    );
    let bindings: Api<ClusterBinding> = Api::all(s.consumer.clone());

    // 1. Compatible — a new optional field: applied within a discovery interval, no consent.
    let with_shape =
        json!({ "type": "object", "properties": { "size": size, "shape": { "type": "string" } } });
    provider_changes_spec(&s.provider, with_shape.clone()).await;
    wait_for("the optional field on the consumer", 20, || async {
        Ok(
            (consumer_spec_schema(&s.consumer).await["properties"]["shape"]
                == json!({ "type": "string" }))
            .then_some(()),
        )
    })
    .await;
    wait_binding(&bindings, "widgets", "SchemaInSync=True").await;

    // 2. Breaking — a narrowed bound that one object (size 3) violates: held.
    let bounded = json!({ "type": "object", "properties": { "size": { "type": "integer", "maximum": 2 }, "shape": { "type": "string" } } });
    provider_changes_spec(&s.provider, bounded.clone()).await;
    let held = wait_held(
        &s.consumer,
        &[
            "spec.size: maximum 2 added",
            "1 of 3 existing objects would be invalid",
        ],
    )
    .await;
    // The consumer keeps serving the old schema, and objects the provider still accepts sync.
    assert_eq!(consumer_spec_schema(&s.consumer).await, normal(&with_shape));
    resize_and_wait_upstream(&consumer_widgets, &provider_widgets, "w1", 2).await;
    assert_eq!(
        consumer_spec_schema(&s.consumer).await,
        with_shape,
        "still held"
    );
    // One Warning Event, however often the binding is reconciled meanwhile.
    wait_for("the BreakingChange Event", 20, || async {
        Ok((breaking_change_events(&s.consumer).await >= 1).then_some(()))
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(breaking_change_events(&s.consumer).await, 1);

    // Consent: the hash on the Connection applies it.
    accept(&s.consumer, &[&held]).await;
    wait_for("the accepted bound on the consumer", 20, || async {
        Ok((consumer_spec_schema(&s.consumer).await == normal(&bounded)).then_some(()))
    })
    .await;
    let binding = wait_binding(&bindings, "widgets", "SchemaInSync=True").await;
    let crd = Api::<CustomResourceDefinition>::all(s.consumer.clone())
        .get(API)
        .await
        .unwrap();
    assert_eq!(
        crd.annotations().get("core.kbind.io/schema-hash"),
        Some(&held),
        "the accepted hash is what is served"
    );
    assert!(
        binding
            .status
            .unwrap()
            .apis
            .iter()
            .all(|a| a.reason != "BreakingChange")
    );

    // 3. Breaking — a new required field every object lacks: held, 3 of 3.
    let required = json!({ "type": "object", "required": ["color"], "properties": {
        "size": { "type": "integer", "maximum": 2 }, "shape": { "type": "string" }, "color": { "type": "string" } } });
    provider_changes_spec(&s.provider, required.clone()).await;
    let held_required = wait_held(
        &s.consumer,
        &[
            "spec.color: newly required",
            "3 of 3 existing objects would be invalid",
        ],
    )
    .await;
    assert_eq!(
        consumer_spec_schema(&s.consumer).await,
        normal(&bounded),
        "held"
    );
    accept(&s.consumer, &[&held, &held_required]).await;
    wait_for(
        "the accepted required field on the consumer",
        20,
        || async {
            Ok((consumer_spec_schema(&s.consumer).await == normal(&required)).then_some(()))
        },
    )
    .await;
    // Consent expires (#33.6): the first accepted schema is no longer served, so its entry is
    // pruned (a provider returning to it must ask again); the status says which entry is served
    // since when.
    wait_for("the consent no longer served pruned", 20, || async {
        let connection = Api::<Connection>::all(s.consumer.clone())
            .get("provider")
            .await
            .map_err(|e| e.to_string())?;
        let accepted: Vec<&str> = connection
            .spec
            .schema
            .accepted_changes
            .iter()
            .map(|a| a.schema_hash.as_str())
            .collect();
        let applied: Vec<&str> = connection
            .status
            .as_ref()
            .map(|st| {
                st.applied_changes
                    .iter()
                    .map(|a| a.schema_hash.as_str())
                    .collect()
            })
            .unwrap_or_default();
        if accepted == [held_required.as_str()] && applied == [held_required.as_str()] {
            Ok(Some(()))
        } else {
            Err(format!("accepted {accepted:?}, applied {applied:?}"))
        }
    })
    .await;

    // 4. Breaking — a type change: held, naming the old and new type.
    let retyped = json!({ "type": "object", "required": ["color"], "properties": {
        "size": { "type": "string" }, "shape": { "type": "string" }, "color": { "type": "string" } } });
    provider_changes_spec(&s.provider, retyped.clone()).await;
    let held_type = wait_held(
        &s.consumer,
        &[
            "spec.size: type integer → string",
            "3 of 3 existing objects would be invalid",
        ],
    )
    .await;
    assert_eq!(
        consumer_spec_schema(&s.consumer).await,
        normal(&required),
        "held"
    );
    accept(&s.consumer, &[&held_type]).await;
    wait_for("the accepted type change on the consumer", 20, || async {
        Ok((consumer_spec_schema(&s.consumer).await == normal(&retyped)).then_some(()))
    })
    .await;
    wait_binding(&bindings, "widgets", "SchemaInSync=True").await;
    // Nothing was lost on the way: every consumer object is still there.
    for name in ["w1", "w2", "w3"] {
        assert!(
            consumer_widgets.get_opt(name).await.unwrap().is_some(),
            "{name}"
        );
    }

    // 5. Breaking — a field removed that one object holds: that object is not rejected, but its
    // data would be pruned, and the impact says so (#33.5); w1 and w3 still hold the integer
    // sizes the type change made invalid.
    merge_patch(
        &consumer_widgets,
        "w2",
        &json!({ "spec": { "size": "2", "shape": "round", "color": "red" } }),
    )
    .await;
    let unshaped = json!({ "type": "object", "required": ["color"], "properties": {
        "size": { "type": "string" }, "color": { "type": "string" } } });
    provider_changes_spec(&s.provider, unshaped).await;
    wait_held(
        &s.consumer,
        &[
            "spec.shape: removed (its data would be pruned)",
            "would lose pruned data",
        ],
    )
    .await;
    let bindings_now = bindings.get("widgets").await.unwrap();
    let message = conditions::find(
        &bindings_now.status.unwrap_or_default().conditions,
        "SchemaInSync",
    )
    .unwrap()
    .message
    .clone();
    assert!(
        message.contains("2 of 3 existing objects would be invalid and 1 would lose pruned data"),
        "{message}"
    );
}

#[tokio::test]
async fn a_provider_schema_change_reaches_the_consumer_in_seconds_at_the_default_intervals() {
    // The production intervals (30 s discovery, 30 s binding resync): a change that waited for
    // either would take up to 30 s.
    let s = SyncEnv::start_with_provider_crd(
        "schema_change_latency",
        widget_crd_with(
            json!({ "type": "object", "properties": { "size": { "type": "integer" } } }),
        ),
        &["--discovery-interval=30s", "--binding-resync-interval=30s"],
    )
    .await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    let bound = std::time::Duration::from_secs(5);
    let mut took = Vec::new();
    // Four compatible changes, each a new optional field: by chance alone (a resync landing
    // soon after the change) four would all arrive within 5 s about once in 1,300 runs.
    for field in ["a", "b", "c", "d"] {
        let mut properties = serde_json::Map::new();
        properties.insert("size".into(), json!({ "type": "integer" }));
        for earlier in ["a", "b", "c", "d"].iter().take_while(|f| **f != field) {
            properties.insert((*earlier).into(), json!({ "type": "string" }));
        }
        properties.insert(field.into(), json!({ "type": "string" }));
        let changed = std::time::Instant::now();
        provider_changes_spec(
            &s.provider,
            json!({ "type": "object", "properties": properties }),
        )
        .await;
        wait_for(&format!("field {field} on the consumer"), 40, || async {
            Ok(
                (consumer_spec_schema(&s.consumer).await["properties"][field]
                    == json!({ "type": "string" }))
                .then_some(()),
            )
        })
        .await;
        took.push(changed.elapsed());
    }
    println!("provider schema change → consumer CRD: {took:?}");
    for (field, took) in ["a", "b", "c", "d"].iter().zip(&took) {
        assert!(
            *took <= bound,
            "field {field} reached the consumer after {took:?}, not within {bound:?}: the change waited for a resync"
        );
    }
}
