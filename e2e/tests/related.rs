//! Related Secrets and ConfigMaps on two real clusters with kbind's programs as real processes
//! (REFERENCE-BEHAVIOUR §13, improved): both directions by label and by name, watch-driven
//! updates, per-entry garbage collection, conflicts under Fail and adoption under Adopt, scope of
//! a namespaced Binding, bad input, and no Secret payload in any log.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::fixtures::*;
use kbind_e2e::wait::{wait_for, wait_gone};
use kbind_shared::api::{Binding, BindingStatus, ClusterBinding};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

fn labels(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    (!pairs.is_empty()).then(|| {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    })
}

fn secret(namespace: &str, name: &str, label_pairs: &[(&str, &str)], value: &[u8]) -> Secret {
    let mut secret = Secret {
        data: Some([("value".to_owned(), ByteString(value.to_vec()))].into()),
        ..Default::default()
    };
    secret.metadata.name = Some(name.into());
    secret.metadata.namespace = Some(namespace.into());
    secret.metadata.labels = labels(label_pairs);
    secret
}

fn config_map(namespace: &str, name: &str, label_pairs: &[(&str, &str)], value: &str) -> ConfigMap {
    let mut map = ConfigMap {
        data: Some([("value".to_owned(), value.to_owned())].into()),
        ..Default::default()
    };
    map.metadata.name = Some(name.into());
    map.metadata.namespace = Some(namespace.into());
    map.metadata.labels = labels(label_pairs);
    map
}

fn secret_value(secret: &Secret) -> Option<Vec<u8>> {
    secret.data.as_ref()?.get("value").map(|b| b.0.clone())
}

fn map_value(map: &ConfigMap) -> Option<String> {
    map.data.as_ref()?.get("value").cloned()
}

async fn set_cluster_binding(consumer: &Client, spec: Value) {
    merge_patch(
        &Api::<ClusterBinding>::all(consumer.clone()),
        "widgets",
        &json!({ "spec": spec }),
    )
    .await;
}

/// Secrets go to the provider only with the Connection owner's consent (`spec.access`).
async fn allow_secrets_to_provider(consumer: &Client) {
    patch_connection(
        consumer,
        "provider",
        json!({ "access": { "secretsToProvider": true } }),
    )
    .await;
}

/// Waits until `status` says what `check` wants; returns it.
async fn wait_status<F>(what: &str, read: impl AsyncFn() -> Option<BindingStatus>, check: F)
where
    F: Fn(&BindingStatus) -> bool,
{
    wait_for(what, 30, || async {
        let status = read().await.unwrap_or_default();
        if check(&status) {
            Ok(Some(()))
        } else {
            Err(format!("status is {:?}", status.conditions))
        }
    })
    .await
}

fn related_condition(status: &BindingStatus) -> Option<(String, String, String)> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == "RelatedResourcesSynced")
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn cluster_binding_status(consumer: &Client) -> Option<BindingStatus> {
    Api::<ClusterBinding>::all(consumer.clone())
        .get("widgets")
        .await
        .ok()?
        .status
}

/// Secret payloads must never reach a log: every log file of the run is searched.
fn assert_not_logged(env: &kbind_e2e::TestEnv, payloads: &[&str]) {
    let mut files = Vec::new();
    let mut dirs = vec![env.dir().to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "log") {
                files.push(path);
            }
        }
    }
    assert!(files.len() >= 3, "found the logs: {files:?}");
    for file in files {
        let text = String::from_utf8_lossy(&std::fs::read(&file).unwrap()).into_owned();
        for payload in payloads {
            assert!(
                !text.contains(payload),
                "{} contains a Secret payload",
                file.display()
            );
        }
    }
}

fn random_token(tag: &str) -> String {
    format!("{tag}-{:016x}", rand::random::<u64>())
}

#[tokio::test]
async fn related_objects_are_copied_both_ways_follow_their_sources_and_are_collected_per_entry() {
    // REL-1 … REL-7 with per-entry GC (LIM-18), watch-driven updates, and BCL-4.
    let s = SyncEnv::start("related_both_ways", &[0, 1, 2], None).await;
    let (consumer, provider) = (s.consumer.clone(), s.provider.clone());
    // Sources: on the provider a labelled Secret (team-a does not exist on the consumer yet, and
    // kbind never creates consumer namespaces), a
    // Secret picked by name, and an immutable one; on the consumer a ConfigMap by name and a
    // labelled Secret.
    ensure_namespace(&provider, "team-a").await.unwrap();
    let provider_secrets: Api<Secret> = Api::namespaced(provider.clone(), "team-a");
    let (db_v1, db_v2, extra_v1, frozen_v1, frozen_v2, shared_v1) = (
        random_token("db-v1"),
        random_token("db-v2"),
        random_token("extra-v1"),
        random_token("frozen-v1"),
        random_token("frozen-v2"),
        random_token("shared-v1"),
    );
    let big: Vec<u8> = (0..1_000_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    for object in [
        secret("team-a", "db-creds", &[("app", "db")], db_v1.as_bytes()),
        secret("team-a", "extra", &[], extra_v1.as_bytes()),
        secret("team-a", "unselected", &[("app", "web")], b"never-copied"),
        secret("team-a", "big", &[("app", "db")], &big),
        Secret {
            immutable: Some(true),
            ..secret("team-a", "frozen", &[("app", "db")], frozen_v1.as_bytes())
        },
    ] {
        provider_secrets
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
    }
    ensure_namespace(&consumer, "team-b").await.unwrap();
    let consumer_maps: Api<ConfigMap> = Api::namespaced(consumer.clone(), "team-b");
    consumer_maps
        .create(
            &PostParams::default(),
            &config_map("team-b", "app-settings", &[], "colour=blue"),
        )
        .await
        .unwrap();
    Api::<Secret>::namespaced(consumer.clone(), "team-b")
        .create(
            &PostParams::default(),
            &secret(
                "team-b",
                "shared",
                &[("share", "yes")],
                shared_v1.as_bytes(),
            ),
        )
        .await
        .unwrap();

    let entries = json!([
        { "resource": "secrets", "direction": "FromProvider", "namespaces": ["team-a"],
          "selector": { "labelSelector": { "matchLabels": { "app": "db" } } } },
        { "resource": "secrets", "direction": "FromProvider", "namespaces": ["team-a"],
          "selector": { "names": ["extra"] } },
        { "resource": "configmaps", "direction": "FromConsumer",
          "selector": { "names": ["app-settings"] } },
        { "resource": "secrets", "direction": "FromConsumer",
          "selector": { "labelSelector": { "matchExpressions": [
              { "key": "share", "operator": "In", "values": ["yes"] } ] } } },
    ]);
    allow_secrets_to_provider(&consumer).await;
    set_cluster_binding(&consumer, json!({ "relatedResources": entries })).await;

    // Safe by default: a FromProvider copy waits for its consumer namespace; it is not created.
    wait_status(
        "copies waiting for the consumer namespace team-a",
        async || cluster_binding_status(&consumer).await,
        |s| {
            related_condition(s).is_some_and(|(status, _, message)| {
                status == "False"
                    && message.contains("waits for namespace team-a to exist on the consumer")
            })
        },
    )
    .await;
    assert!(
        Api::<Namespace>::all(consumer.clone())
            .get_opt("team-a")
            .await
            .unwrap()
            .is_none()
    );
    ensure_namespace(&consumer, "team-a").await.unwrap();

    // Copies appear on the other side (provider namespaces are created for them).
    let consumer_secrets: Api<Secret> = Api::namespaced(consumer.clone(), "team-a");
    let copy = wait_object(
        &consumer_secrets,
        "db-creds",
        "the labelled Secret on the consumer",
        30,
        |_| true,
    )
    .await;
    assert_eq!(secret_value(&copy), Some(db_v1.as_bytes().to_vec()));
    assert_eq!(
        copy.labels().clone(),
        labels(&[("core.kbind.io/managed", "true")]).unwrap(),
        "only kbind's label"
    );
    let uid = Api::<ClusterBinding>::all(consumer.clone())
        .get("widgets")
        .await
        .unwrap()
        .uid()
        .unwrap();
    assert_eq!(
        annotation(&copy, "core.kbind.io/related-binding"),
        Some(uid.as_str())
    );
    assert!(
        copy.annotations()
            .keys()
            .all(|k| k.starts_with("core.kbind.io/")),
        "only kbind's annotations: {:?}",
        copy.annotations()
    );
    assert!(
        copy.metadata
            .managed_fields
            .iter()
            .flatten()
            .any(|f| f.manager.as_deref() == Some("kbind-konnector-related")),
        "written by the related field manager"
    );
    for (name, expected) in [
        ("extra", extra_v1.as_bytes().to_vec()),
        ("big", big.clone()),
        ("frozen", frozen_v1.as_bytes().to_vec()),
    ] {
        let copy = wait_object(
            &consumer_secrets,
            name,
            &format!("the copy of {name}"),
            30,
            |_| true,
        )
        .await;
        assert_eq!(secret_value(&copy).unwrap(), expected, "{name}");
    }
    assert_eq!(
        consumer_secrets
            .get_opt("frozen")
            .await
            .unwrap()
            .unwrap()
            .immutable,
        Some(true)
    );
    assert!(
        consumer_secrets
            .get_opt("unselected")
            .await
            .unwrap()
            .is_none()
    );
    let provider_maps: Api<ConfigMap> = Api::namespaced(provider.clone(), "team-b");
    wait_object(
        &provider_maps,
        "app-settings",
        "the ConfigMap on the provider",
        30,
        |m| map_value(m).as_deref() == Some("colour=blue"),
    )
    .await;
    wait_for(
        "the labelled consumer Secret on the provider",
        30,
        || async {
            Api::<Secret>::namespaced(provider.clone(), "team-b")
                .get_opt("shared")
                .await
                .map_err(|e| e.to_string())
        },
    )
    .await;
    wait_status(
        "RelatedResourcesSynced=True",
        async || cluster_binding_status(&consumer).await,
        |s| related_condition(s).is_some_and(|(status, _, _)| status == "True"),
    )
    .await;

    // A change at the source appears at the target within 2 s, in both directions.
    let started = Instant::now();
    merge_patch(
        &provider_secrets,
        "db-creds",
        &json!({ "stringData": { "value": db_v2 } }),
    )
    .await;
    wait_object(
        &consumer_secrets,
        "db-creds",
        "the changed Secret on the consumer",
        2,
        |s| secret_value(s) == Some(db_v2.as_bytes().to_vec()),
    )
    .await;
    eprintln!("provider → consumer change took {:?}", started.elapsed());
    let started = Instant::now();
    merge_patch(
        &consumer_maps,
        "app-settings",
        &json!({ "data": { "value": "colour=green" } }),
    )
    .await;
    wait_object(
        &provider_maps,
        "app-settings",
        "the changed ConfigMap on the provider",
        2,
        |m| map_value(m).as_deref() == Some("colour=green"),
    )
    .await;
    eprintln!("consumer → provider change took {:?}", started.elapsed());

    // Drift on a copy is repaired.
    merge_patch(
        &consumer_secrets,
        "db-creds",
        &json!({ "stringData": { "value": "tampered" } }),
    )
    .await;
    wait_object(
        &consumer_secrets,
        "db-creds",
        "the tampered copy to be restored",
        10,
        |s| secret_value(s) == Some(db_v2.as_bytes().to_vec()),
    )
    .await;

    // An immutable source cannot change in place: it is deleted and created again with new data;
    // the immutable copy is then replaced (deleted and created), not left stale.
    let old_copy_uid = consumer_secrets.get("frozen").await.unwrap().uid();
    provider_secrets
        .delete("frozen", &DeleteParams::default())
        .await
        .unwrap();
    provider_secrets
        .create(
            &PostParams::default(),
            &Secret {
                immutable: Some(true),
                ..secret("team-a", "frozen", &[("app", "db")], frozen_v2.as_bytes())
            },
        )
        .await
        .unwrap();
    let replaced = wait_object(
        &consumer_secrets,
        "frozen",
        "the immutable copy to be replaced",
        15,
        |s| secret_value(s) == Some(frozen_v2.as_bytes().to_vec()),
    )
    .await;
    assert_ne!(replaced.uid(), old_copy_uid);
    assert_eq!(replaced.immutable, Some(true));

    // Two entries of one kind and direction keep each other's copies (LIM-18), across passes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for name in ["db-creds", "extra"] {
        assert!(
            consumer_secrets.get_opt(name).await.unwrap().is_some(),
            "{name} survived the other entry's GC"
        );
    }

    // Removing an entry removes only its copies (REL-6 improved).
    let without_extra = json!([entries[0], entries[2], entries[3]]);
    set_cluster_binding(&consumer, json!({ "relatedResources": without_extra })).await;
    wait_gone(
        &consumer_secrets,
        "extra",
        "the removed entry's copy to go",
        15,
    )
    .await;
    assert!(
        consumer_secrets
            .get_opt("db-creds")
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        provider_secrets.get_opt("extra").await.unwrap().is_some(),
        "sources are never deleted (REL-7)"
    );

    // A deleted source takes its copy with it.
    Api::<Secret>::namespaced(consumer.clone(), "team-b")
        .delete("shared", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the copy of a deleted source to go", 15, || async {
        Ok(Api::<Secret>::namespaced(provider.clone(), "team-b")
            .get_opt("shared")
            .await
            .map_err(|e| e.to_string())?
            .is_none()
            .then_some(()))
    })
    .await;

    // Deleting the binding deletes every copy and keeps every source (BCL-4, REL-7).
    Api::<ClusterBinding>::all(consumer.clone())
        .delete("widgets", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the binding and its copies to go", 60, || async {
        let binding = Api::<ClusterBinding>::all(consumer.clone())
            .get_opt("widgets")
            .await
            .map_err(|e| e.to_string())?;
        let copies: Vec<String> = consumer_secrets
            .list(&ListParams::default().labels("core.kbind.io/managed=true"))
            .await
            .map_err(|e| e.to_string())?
            .items
            .iter()
            .map(|s| s.name_any())
            .chain(
                provider_maps
                    .list(&ListParams::default().labels("core.kbind.io/managed=true"))
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .iter()
                    .map(|m| m.name_any()),
            )
            .collect();
        if binding.is_none() && copies.is_empty() {
            Ok(Some(()))
        } else {
            Err(format!(
                "binding present: {}, copies left: {copies:?}",
                binding.is_some()
            ))
        }
    })
    .await;
    for name in ["db-creds", "extra", "big", "frozen", "unselected"] {
        assert!(
            provider_secrets.get_opt(name).await.unwrap().is_some(),
            "source {name} kept"
        );
    }
    assert!(
        consumer_maps
            .get_opt("app-settings")
            .await
            .unwrap()
            .is_some()
    );

    // No Secret payload in any log line of the run.
    assert_not_logged(
        &s.env,
        &[
            &db_v1, &db_v2, &extra_v1, &frozen_v1, &frozen_v2, &shared_v1,
        ],
    );
}

#[tokio::test]
async fn a_foreign_target_is_a_conflict_under_fail_and_adopt_takes_over_only_provider_objects() {
    // PGAP-12: the reference skipped such targets silently, even under Adopt.
    let s = SyncEnv::start("related_conflict", &[0, 1, 2], None).await;
    let (consumer, provider) = (s.consumer.clone(), s.provider.clone());
    ensure_namespace(&provider, "team-a").await.unwrap();
    ensure_namespace(&consumer, "team-a").await.unwrap();
    let source_value = random_token("source");
    Api::<Secret>::namespaced(provider.clone(), "team-a")
        .create(
            &PostParams::default(),
            &secret("team-a", "taken", &[], source_value.as_bytes()),
        )
        .await
        .unwrap();
    let consumer_secrets: Api<Secret> = Api::namespaced(consumer.clone(), "team-a");
    consumer_secrets
        .create(
            &PostParams::default(),
            &secret("team-a", "taken", &[("mine", "yes")], b"the consumer's own"),
        )
        .await
        .unwrap();
    set_cluster_binding(
        &consumer,
        json!({ "relatedResources": [
            { "resource": "secrets", "direction": "FromProvider", "namespaces": ["team-a"],
              "selector": { "names": ["taken"] } }
        ] }),
    )
    .await;
    wait_status(
        "the conflict in the binding's status",
        async || cluster_binding_status(&consumer).await,
        |s| {
            s.related_conflict_count == 1
                && related_condition(s).is_some_and(|(status, reason, message)| {
                    status == "False"
                        && reason == "Conflicts"
                        && message.contains("Secret team-a/taken on the consumer")
                })
        },
    )
    .await;
    let warnings = wait_for("a Warning Event", 30, || async {
        let w = warning_events(&consumer, None, "widgets").await;
        Ok(w.iter()
            .any(|e| e.starts_with("RelatedResourceConflict"))
            .then_some(w))
    })
    .await;
    assert!(
        warnings.iter().any(|w| w.contains("team-a/taken")),
        "{warnings:?}"
    );
    let untouched = consumer_secrets.get("taken").await.unwrap();
    assert_eq!(
        secret_value(&untouched),
        Some(b"the consumer's own".to_vec())
    );
    assert!(
        !untouched
            .annotations()
            .contains_key("core.kbind.io/related-binding")
    );

    // Safe by default: Adopt never takes over a consumer object kbind did not create. It adopts
    // a foreign provider object (FromConsumer) instead, and never deletes what it adopted.
    let outbound_value = random_token("outbound");
    consumer_secrets
        .create(
            &PostParams::default(),
            &secret("team-a", "outbound", &[], outbound_value.as_bytes()),
        )
        .await
        .unwrap();
    let provider_secrets: Api<Secret> = Api::namespaced(provider.clone(), "team-a");
    provider_secrets
        .create(
            &PostParams::default(),
            &secret("team-a", "outbound", &[], b"the provider's own"),
        )
        .await
        .unwrap();
    allow_secrets_to_provider(&consumer).await;
    set_cluster_binding(
        &consumer,
        json!({ "conflictPolicy": "Adopt", "relatedResources": [
            { "resource": "secrets", "direction": "FromProvider", "namespaces": ["team-a"],
              "selector": { "names": ["taken"] } },
            { "resource": "secrets", "direction": "FromConsumer", "selector": { "names": ["outbound"] } },
        ] }),
    )
    .await;
    wait_object(
        &provider_secrets,
        "outbound",
        "the foreign provider Secret to be adopted",
        30,
        |s| {
            secret_value(s) == Some(outbound_value.as_bytes().to_vec())
                && s.annotations()
                    .get("core.kbind.io/related-adopted")
                    .is_some_and(|v| v == "true")
        },
    )
    .await;
    wait_status(
        "the consumer-side conflict stays under Adopt",
        async || cluster_binding_status(&consumer).await,
        |s| {
            s.related_conflict_count == 1
                && related_condition(s).is_some_and(|(status, _, message)| {
                    status == "False" && message.contains("never takes over a consumer object")
                })
        },
    )
    .await;
    let untouched = consumer_secrets.get("taken").await.unwrap();
    assert_eq!(
        secret_value(&untouched),
        Some(b"the consumer's own".to_vec())
    );

    // Dropping both entries: the adopted provider object stays (kbind did not create it), and the
    // consumer's own Secret was never kbind's to delete.
    set_cluster_binding(&consumer, json!({ "relatedResources": [] })).await;
    Api::<Secret>::namespaced(provider.clone(), "team-a")
        .delete("taken", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        provider_secrets
            .get_opt("outbound")
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(
        secret_value(&consumer_secrets.get("taken").await.unwrap()),
        Some(b"the consumer's own".to_vec())
    );
}

#[tokio::test]
async fn adopt_never_overwrites_or_deletes_a_consumer_config_map_kbind_did_not_create() {
    // Safe by default, guarantee 3: a provider publishing a ConfigMap named like one the consumer
    // owns (think kube-system/coredns) cannot overwrite it under Adopt, nor delete it later.
    let s = SyncEnv::start("related_adopt_consumer", &[0, 1, 2], None).await;
    let (consumer, provider) = (s.consumer.clone(), s.provider.clone());
    for client in [&consumer, &provider] {
        ensure_namespace(client, "infra").await.unwrap();
    }
    let consumer_maps: Api<ConfigMap> = Api::namespaced(consumer.clone(), "infra");
    consumer_maps
        .create(
            &PostParams::default(),
            &config_map("infra", "coredns", &[], "the consumer's DNS"),
        )
        .await
        .unwrap();
    let before = consumer_maps.get("coredns").await.unwrap();
    let provider_maps: Api<ConfigMap> = Api::namespaced(provider.clone(), "infra");
    provider_maps
        .create(
            &PostParams::default(),
            &config_map("infra", "coredns", &[], "hijacked"),
        )
        .await
        .unwrap();
    set_cluster_binding(
        &consumer,
        json!({ "conflictPolicy": "Adopt", "relatedResources": [
            { "resource": "configmaps", "direction": "FromProvider", "namespaces": ["infra"],
              "selector": { "names": ["coredns"] } },
        ] }),
    )
    .await;
    wait_status(
        "the conflict under Adopt",
        async || cluster_binding_status(&consumer).await,
        |s| s.related_conflict_count == 1,
    )
    .await;
    provider_maps
        .delete("coredns", &DeleteParams::default())
        .await
        .unwrap();
    wait_status(
        "no conflict once the source is gone",
        async || cluster_binding_status(&consumer).await,
        |s| s.related_conflict_count == 0,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = consumer_maps.get("coredns").await.unwrap();
    assert_eq!(map_value(&after).as_deref(), Some("the consumer's DNS"));
    assert_eq!(
        after.metadata.resource_version,
        before.metadata.resource_version
    );
}

#[tokio::test]
async fn a_binding_reads_and_writes_only_its_own_namespace_and_refuses_bad_selectors() {
    let s = SyncEnv::start("related_scope", &[0, 1, 2], None).await;
    let (consumer, provider) = (s.consumer.clone(), s.provider.clone());
    for namespace in ["team-a", "team-b"] {
        ensure_namespace(&consumer, namespace).await.unwrap();
        Api::<Secret>::namespaced(consumer.clone(), namespace)
            .create(
                &PostParams::default(),
                &secret(namespace, &format!("{namespace}-secret"), &[], b"x"),
            )
            .await
            .unwrap();
        ensure_namespace(&provider, namespace).await.unwrap();
        Api::<ConfigMap>::namespaced(provider.clone(), namespace)
            .create(
                &PostParams::default(),
                &config_map(namespace, "settings", &[("kind", "settings")], namespace),
            )
            .await
            .unwrap();
    }
    // A Binding in team-a with an empty selector: everything in scope — and its scope is team-a.
    allow_secrets_to_provider(&consumer).await;
    let bindings: Api<Binding> = Api::namespaced(consumer.clone(), "team-a");
    let mut spec = binding_spec("provider", &["widgets.example.org"]);
    spec.related_resources = serde_json::from_value(json!([
        { "resource": "secrets", "direction": "FromConsumer" },
        { "resource": "configmaps", "direction": "FromProvider",
          "selector": { "labelSelector": { "matchLabels": { "kind": "settings" } } } },
        // A selector that matches nothing: named on the binding, harmless otherwise.
        { "resource": "configmaps", "direction": "FromConsumer", "selector": { "names": ["absent"] } },
    ]))
    .unwrap();
    let binding = Binding::new("mine", spec);
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let provider_a: Api<Secret> = Api::namespaced(provider.clone(), "team-a");
    wait_object(
        &provider_a,
        "team-a-secret",
        "team-a's Secret on the provider",
        30,
        |_| true,
    )
    .await;
    let consumer_a_maps: Api<ConfigMap> = Api::namespaced(consumer.clone(), "team-a");
    wait_object(
        &consumer_a_maps,
        "settings",
        "team-a's ConfigMap on the consumer",
        30,
        |m| map_value(m).as_deref() == Some("team-a"),
    )
    .await;
    let read_status = async || {
        bindings
            .get_opt("mine")
            .await
            .ok()
            .flatten()
            .and_then(|b| b.status)
    };
    wait_status("RelatedResourcesSynced=True", read_status, |s| {
        related_condition(s).is_some_and(|(status, _, message)| {
            status == "True" && message.ends_with("relatedResources[2] selects nothing")
        })
    })
    .await;
    // Several passes later, nothing in team-b was read or written on either side.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        Api::<Secret>::namespaced(provider.clone(), "team-b")
            .get_opt("team-b-secret")
            .await
            .unwrap()
            .is_none(),
        "team-b's Secret never leaves the consumer"
    );
    let consumer_b_map = Api::<ConfigMap>::namespaced(consumer.clone(), "team-b")
        .get_opt("settings")
        .await
        .unwrap();
    assert!(
        consumer_b_map.is_none(),
        "team-b's ConfigMap never reaches the consumer"
    );

    // An invalid selector: a condition naming it; nothing copied, nothing deleted.
    merge_patch(
        &bindings,
        "mine",
        &json!({ "spec": { "relatedResources": [
                { "resource": "secrets", "direction": "FromConsumer" },
                { "resource": "configmaps", "direction": "FromProvider",
                  "selector": { "labelSelector": { "matchExpressions": [
                      { "key": "kind", "operator": "In" } ] } } },
            ] } }),
    )
    .await;
    wait_status("InvalidSelector", read_status, |s| {
        related_condition(s).is_some_and(|(status, reason, message)| {
            status == "False"
                && reason == "InvalidSelector"
                && message.contains("relatedResources[1].selector.labelSelector")
        })
    })
    .await;
    Api::<Secret>::namespaced(consumer.clone(), "team-a")
        .create(
            &PostParams::default(),
            &secret("team-a", "after-the-typo", &[], b"y"),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        provider_a
            .get_opt("after-the-typo")
            .await
            .unwrap()
            .is_none(),
        "nothing is copied while a selector is invalid"
    );
    assert!(
        provider_a.get_opt("team-a-secret").await.unwrap().is_some()
            && consumer_a_maps.get_opt("settings").await.unwrap().is_some(),
        "nothing is deleted while a selector is invalid"
    );
}

#[tokio::test]
async fn a_provider_credential_without_secret_permissions_is_reported_on_the_binding() {
    let s = SyncEnv::start("related_forbidden", &[0, 1, 2], None).await;
    let consumer = s.consumer.clone();
    let provider_cluster = s.env.cluster("provider");
    let user = provider_cluster.mint_user("no-secrets").await.unwrap();
    provider_cluster
        .grant(&user, "no-secrets", provider_rules(true))
        .await
        .unwrap();
    put_secret(
        &consumer,
        "provider-kubeconfig",
        "kubeconfig",
        user.kubeconfig.as_bytes(),
    )
    .await
    .unwrap();
    set_cluster_binding(
        &consumer,
        json!({ "relatedResources": [
            { "resource": "secrets", "direction": "FromProvider", "selector": { "names": ["db"] } }
        ] }),
    )
    .await;
    wait_status(
        "Forbidden on the binding",
        async || cluster_binding_status(&consumer).await,
        |s| {
            related_condition(s).is_some_and(|(status, reason, message)| {
                status == "False"
                    && reason == "Forbidden"
                    && message.contains("provider credentials")
                    && message.contains("secrets")
            })
        },
    )
    .await;
}

#[tokio::test]
async fn a_suspended_binding_copies_and_deletes_no_related_object_until_resumed() {
    // #39.1: `spec.suspend` pauses everything the binding covers, its related Secrets too.
    let s = SyncEnv::start("related_suspended", &[0, 1, 2], None).await;
    let (consumer, provider) = (s.consumer.clone(), s.provider.clone());
    for client in [&consumer, &provider] {
        ensure_namespace(client, "team-a").await.unwrap();
    }
    let provider_secrets: Api<Secret> = Api::namespaced(provider.clone(), "team-a");
    let consumer_secrets: Api<Secret> = Api::namespaced(consumer.clone(), "team-a");
    let (v1, v2) = (random_token("v1"), random_token("v2"));
    let db = secret("team-a", "db", &[("app", "db")], v1.as_bytes());
    provider_secrets
        .create(&PostParams::default(), &db)
        .await
        .unwrap();
    let entries = json!([
        { "resource": "secrets", "direction": "FromProvider", "namespaces": ["team-a"],
          "selector": { "labelSelector": { "matchLabels": { "app": "db" } } } },
    ]);
    set_cluster_binding(&consumer, json!({ "relatedResources": entries })).await;
    wait_object(&consumer_secrets, "db", "the copy", 30, |_| true).await;

    set_cluster_binding(&consumer, json!({ "suspend": true })).await;
    wait_status(
        "the related resources to say they are paused",
        async || cluster_binding_status(&consumer).await,
        |s| {
            related_condition(s).is_some_and(|(status, reason, _)| {
                (status.as_str(), reason.as_str()) == ("False", "Paused")
            })
        },
    )
    .await;
    // A changed source and a new one: nothing follows while suspended.
    merge_patch(
        &provider_secrets,
        "db",
        &json!({ "stringData": { "value": v2 } }),
    )
    .await;
    let more = secret("team-a", "more", &[("app", "db")], v1.as_bytes());
    provider_secrets
        .create(&PostParams::default(), &more)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let copy = consumer_secrets.get("db").await.unwrap();
    assert_eq!(
        secret_value(&copy),
        Some(v1.as_bytes().to_vec()),
        "not updated"
    );
    assert!(
        consumer_secrets.get_opt("more").await.unwrap().is_none(),
        "not copied"
    );

    // Resumed: everything follows again.
    set_cluster_binding(&consumer, json!({ "suspend": false })).await;
    wait_object(&consumer_secrets, "db", "the new value", 30, |copy| {
        secret_value(copy) == Some(v2.as_bytes().to_vec())
    })
    .await;
    wait_object(
        &consumer_secrets,
        "more",
        "the new source's copy",
        30,
        |_| true,
    )
    .await;
}

#[tokio::test]
async fn another_consumers_related_copies_on_the_provider_are_never_read() {
    // #50.5 for related resources: kbind's Secret copies on the provider carry the consumer
    // cluster's label and the syncer's provider-side watches and lists select by it — another
    // consumer's copies (its Secrets!) in the same namespace are never listed, watched or fetched.
    let s = SyncEnv::start("related_own_copies", &[0, 1, 2], None).await;
    let (consumer, provider) = (s.consumer.clone(), s.provider.clone());
    let local_uid = uid_of_kube_system(&consumer).await;
    for client in [&consumer, &provider] {
        ensure_namespace(client, "team-b").await.unwrap();
    }
    // Another consumer's copy of its Secret, as its kbind writes it.
    let mut theirs = secret("team-b", "their-token", &[], b"another-consumers-secret");
    theirs.metadata.labels = labels(&[
        ("core.kbind.io/managed", "true"),
        (
            "core.kbind.io/consumer-cluster-uid",
            "0b2e4c9a-5d1f-4e8b-9a7c-3f6d2e1b0a98",
        ),
    ]);
    theirs.metadata.annotations = Some(
        [
            (
                "core.kbind.io/consumer-cluster-uid".to_owned(),
                "0b2e4c9a-5d1f-4e8b-9a7c-3f6d2e1b0a98".to_owned(),
            ),
            (
                "core.kbind.io/related-binding".to_owned(),
                "another-binding".to_owned(),
            ),
        ]
        .into(),
    );
    let provider_secrets: Api<Secret> = Api::namespaced(provider.clone(), "team-b");
    provider_secrets
        .create(&PostParams::default(), &theirs)
        .await
        .unwrap();
    Api::<Secret>::namespaced(consumer.clone(), "team-b")
        .create(
            &PostParams::default(),
            &secret("team-b", "outbound", &[], b"ours"),
        )
        .await
        .unwrap();
    allow_secrets_to_provider(&consumer).await;
    set_cluster_binding(
        &consumer,
        json!({ "relatedResources": [
            { "resource": "secrets", "direction": "FromConsumer", "selector": { "names": ["outbound"] } },
        ] }),
    )
    .await;
    let copy = wait_object(&provider_secrets, "outbound", "our copy", 30, |_| true).await;
    assert_eq!(
        copy.labels().get("core.kbind.io/consumer-cluster-uid"),
        Some(&local_uid)
    );
    assert_eq!(secret_value(&copy), Some(b"ours".to_vec()));
    wait_status(
        "RelatedResourcesSynced=True",
        async || cluster_binding_status(&consumer).await,
        |s| related_condition(s).is_some_and(|(status, _, _)| status == "True"),
    )
    .await;
    // Their copy is untouched, and kbind read nothing of it.
    assert_eq!(
        secret_value(&provider_secrets.get("their-token").await.unwrap()),
        Some(b"another-consumers-secret".to_vec())
    );
    let reads: Vec<_> = s
        .env
        .cluster("provider")
        .audited()
        .into_iter()
        .filter(|a| a.resource == "secrets" && a.user_agent.starts_with("kbind-syncer/"))
        .collect();
    let selector = format!("core.kbind.io%2Fconsumer-cluster-uid%3D{local_uid}");
    let collections: Vec<_> = reads
        .iter()
        .filter(|a| matches!(a.verb.as_str(), "list" | "watch"))
        .collect();
    assert!(!collections.is_empty(), "{reads:#?}");
    for read in &collections {
        assert!(read.request_uri.contains(&selector), "{read:#?}");
    }
    assert!(reads.iter().all(|a| a.name != "their-token"), "{reads:#?}");
}
