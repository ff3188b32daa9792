//! #53.2: a consumer restored into a fresh cluster (a new cluster UID, new object UIDs) claims the
//! provider copies its previous identity left with `kubectl kbind rehome`, only once that identity
//! is gone — one provider write per copy, no conflict left, and the next change one write.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::fixtures::*;
use kbind_e2e::kbind::{apiserver_writes, grown};
use kbind_e2e::wait::wait_for;
use kbind_shared::keys;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};

const NAMES: [&str; 3] = ["w1", "w2", "w3"];

/// The ClusterBinding's related entries: the consumer's `settings` to the provider, the
/// provider's `published` to the consumer.
fn related_entries() -> serde_json::Value {
    serde_json::json!({ "spec": { "relatedResources": [
        { "resource": "configmaps", "direction": "FromConsumer", "selector": { "names": ["settings"] } },
        { "resource": "configmaps", "direction": "FromProvider", "selector": { "names": ["published"] } },
    ] } })
}

async fn with_related(client: &Client) {
    Api::<kbind_shared::api::ClusterBinding>::all(client.clone())
        .patch(
            "widgets",
            &PatchParams::default(),
            &Patch::Merge(related_entries()),
        )
        .await
        .unwrap();
}

fn config_map(name: &str, colour: &str) -> ConfigMap {
    ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some([("colour".to_owned(), colour.to_owned())].into()),
        ..Default::default()
    }
}

/// `kubectl kbind <args> -o json` against `cluster` as its admin: exit code, JSON (if any), stderr.
fn rehome(
    env: &kbind_e2e::TestEnv,
    cluster: &str,
    args: &[&str],
) -> (Option<i32>, serde_json::Value, String) {
    let output =
        std::process::Command::new(kbind_e2e::controlplane::kbind_bin("kubectl-kbind").unwrap())
            .arg("rehome")
            .args(args)
            .arg("--kubeconfig")
            .arg(env.cluster(cluster).admin_kubeconfig_path())
            .args(["-o", "json"])
            .output()
            .unwrap();
    (
        output.status.code(),
        serde_json::from_slice(&output.stdout).unwrap_or_default(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

async fn versions(provider: &Api<DynamicObject>) -> Vec<Option<String>> {
    let mut all = Vec::new();
    for name in NAMES {
        all.push(provider.get(name).await.unwrap().resource_version());
    }
    all
}

fn writes_to_widgets(written: &BTreeMap<String, u64>) -> u64 {
    written
        .iter()
        // The provider's own controller writes the status; kbind writes the rest.
        .filter(|(k, _)| k.contains("example.org/widgets") && !k.ends_with(" status"))
        .map(|(_, v)| v)
        .sum()
}

async fn conflicts(api: &Api<DynamicObject>) -> Vec<String> {
    let mut found = Vec::new();
    for name in NAMES {
        let o = api.get(name).await.unwrap();
        if let Some(reason) = o.annotations().get(keys::CONFLICT_ANNOTATION) {
            found.push(format!("{name}: {reason}"));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_consumer_rehomes_its_previous_identitys_copies_once_that_identity_is_gone() {
    // The consumer, kbind on it renewing 3 s heartbeat Leases, three Widgets synced.
    let mut s = SyncEnv::start_full(
        "restore",
        &[0, 1, 2],
        None,
        &["restored"],
        &["--heartbeat-lease-duration=3s"],
    )
    .await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    let (consumer_widgets, provider_widgets) = (
        widgets(&s.consumer, "team-a"),
        widgets(&s.provider, "team-a"),
    );
    for name in NAMES {
        create_and_wait_copy(&consumer_widgets, &provider_widgets, name, 1).await;
    }
    // Related copies both ways: the consumer's `settings` on the provider, the provider's
    // `published` on the consumer.
    with_related(&s.consumer).await;
    Api::<ConfigMap>::namespaced(s.consumer.clone(), "team-a")
        .create(&PostParams::default(), &config_map("settings", "blue"))
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(s.provider.clone(), "team-a")
        .create(&PostParams::default(), &config_map("published", "green"))
        .await
        .unwrap();
    let published = wait_for("the related copies", 60, || async {
        let settings = Api::<ConfigMap>::namespaced(s.provider.clone(), "team-a")
            .get_opt("settings")
            .await
            .map_err(|e| e.to_string())?;
        let published = Api::<ConfigMap>::namespaced(s.consumer.clone(), "team-a")
            .get_opt("published")
            .await
            .map_err(|e| e.to_string())?;
        Ok(settings.and(published))
    })
    .await;
    let old_uid = uid_of_kube_system(&s.consumer).await;

    // The restore: a fresh cluster with kbind, the same one file, the same Widgets (new UIDs).
    let restored: Client = s.env.cluster("restored").admin_client().await.unwrap();
    kbind_e2e::kbind::install_crds(&restored).await.unwrap();
    for namespace in [KBIND_NAMESPACE, SECRET_NAMESPACE, "team-a"] {
        ensure_namespace(&restored, namespace).await.unwrap();
    }
    // The related source and the related copy, restored as they were (its markers name the
    // previous cluster and the previous binding's UID).
    let restored_maps: Api<ConfigMap> = Api::namespaced(restored.clone(), "team-a");
    restored_maps
        .create(&PostParams::default(), &config_map("settings", "blue"))
        .await
        .unwrap();
    let mut copy = published.clone();
    copy.metadata = kube::api::ObjectMeta {
        name: copy.metadata.name.clone(),
        labels: copy.metadata.labels.clone(),
        annotations: copy.metadata.annotations.clone(),
        ..Default::default()
    };
    restored_maps
        .create(&PostParams::default(), &copy)
        .await
        .unwrap();
    let manager = start_schema_manager(
        &mut s.env,
        "restored",
        "restored-manager",
        &["--leader-elect=false"],
    )
    .await
    .unwrap();
    let syncer = start_syncer(&mut s.env, "restored", "restored-syncer", &[])
        .await
        .unwrap();
    manager.wait_ready("the restored schema manager", 60).await;
    syncer.wait_ready("the restored syncer", 60).await;
    let kubeconfig = s.env.cluster("provider").admin_kubeconfig();
    apply_manifest(&restored, &one_file(&kubeconfig, &[0, 1, 2]))
        .await
        .unwrap();
    with_related(&restored).await;
    wait_cluster_binding_ready(&restored, "widgets").await;
    let restored_widgets = widgets(&restored, "team-a");
    for name in NAMES {
        restored_widgets
            .create(&PostParams::default(), &widget(name, 1))
            .await
            .unwrap();
    }
    // kbind tells the truth about them meanwhile: another consumer's copies.
    wait_for("the restored Widgets to show the conflict", 60, || async {
        let found = conflicts(&restored_widgets).await;
        Ok((found.len() == NAMES.len()
            && found
                .iter()
                .all(|c| c.ends_with(keys::CONFLICT_OWNED_BY_ANOTHER)))
        .then_some(()))
    })
    .await;

    // While the previous identity renews its Lease, re-homing is refused, writing nothing.
    let (code, plan, _) = rehome(
        &s.env,
        "restored",
        &["plan", "--connection", "provider", "--from", &old_uid],
    );
    assert_eq!(code, Some(1), "{plan:#}");
    assert_eq!(plan["previous"]["verdict"], "alive", "{plan:#}");
    assert_eq!(plan["counts"]["claim"], 3, "{plan:#}");
    let related: Vec<String> = plan["related"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{} {} {} {}",
                r["side"], r["name"], r["verdict"], r["binding"]
            )
            .replace('"', "")
        })
        .collect();
    assert_eq!(
        related,
        [
            "provider settings claim ClusterBinding widgets",
            "consumer published claim ClusterBinding widgets"
        ],
        "{plan:#}"
    );
    let before = versions(&provider_widgets).await;
    let (code, _, stderr) = rehome(
        &s.env,
        "restored",
        &["apply", "--connection", "provider", "--from", &old_uid],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "refused: the consumer {old_uid} is alive — its Lease kbind/provider-"
        )),
        "{stderr}"
    );
    assert_eq!(versions(&provider_widgets).await, before, "nothing written");

    // The previous cluster is gone: its kbind stops, its Lease goes stale.
    s.env.process(s.manager.index).kill();
    s.env.process(s.syncer.index).kill();
    wait_for("the previous identity to be stale", 60, || async {
        let (_, plan, _) = rehome(
            &s.env,
            "restored",
            &["plan", "--connection", "provider", "--from", &old_uid],
        );
        Ok((plan["previous"]["verdict"] == "stale").then_some(()))
    })
    .await;

    // Re-homed: one provider write per copy, nothing else; the conflicts clear and each object
    // is delivered with no further write.
    let writes_before = apiserver_writes(&s.provider).await.unwrap();
    let consumer_writes_before = apiserver_writes(&restored).await.unwrap();
    let (code, applied, stderr) = rehome(
        &s.env,
        "restored",
        &["apply", "--connection", "provider", "--from", &old_uid],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(applied["claimed"], 3, "{applied:#}");
    assert_eq!(applied["related_claimed"], 2, "{applied:#}");
    let bindings: Api<kbind_shared::api::ClusterBinding> = Api::all(restored.clone());
    wait_binding(&bindings, "widgets", "RelatedResourcesSynced=True").await;
    wait_for(
        "the conflicts to clear and everything to be delivered",
        60,
        || async {
            let mut synced = 0;
            for name in NAMES {
                let o = restored_widgets
                    .get(name)
                    .await
                    .map_err(|e| e.to_string())?;
                if o.data["status"]["kbindSync"]["state"] == "Synced"
                    && !o.annotations().contains_key(keys::CONFLICT_ANNOTATION)
                {
                    synced += 1;
                }
            }
            Ok((synced == NAMES.len()).then_some(()))
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let written = grown(
        &writes_before,
        &apiserver_writes(&s.provider).await.unwrap(),
    );
    assert_eq!(
        writes_to_widgets(&written),
        3,
        "one write per copy: {written:?}"
    );
    assert_eq!(
        written.get("APPLY /configmaps ").copied(),
        Some(1),
        "one write for the related copy on the provider: {written:?}"
    );
    let consumer_written = grown(
        &consumer_writes_before,
        &apiserver_writes(&restored).await.unwrap(),
    );
    assert_eq!(
        consumer_written.get("APPLY /configmaps ").copied(),
        Some(1),
        "one write for the related copy on the consumer: {consumer_written:?}"
    );
    let new_uid = uid_of_kube_system(&restored).await;
    for name in NAMES {
        let copy = provider_widgets.get(name).await.unwrap();
        let object = restored_widgets.get(name).await.unwrap();
        assert_eq!(
            copy.annotations()
                .get(keys::CONSUMER_CLUSTER_UID_ANNOTATION),
            Some(&new_uid)
        );
        assert_eq!(
            copy.labels().get(keys::CONSUMER_CLUSTER_UID_LABEL),
            Some(&new_uid)
        );
        assert_eq!(
            copy.annotations().get(keys::CONSUMER_OBJECT_UID_ANNOTATION),
            object.metadata.uid.as_ref()
        );
    }
    assert!(conflicts(&restored_widgets).await.is_empty());

    // The next change: one write.
    let writes_before = apiserver_writes(&s.provider).await.unwrap();
    resize_and_wait_upstream(&restored_widgets, &provider_widgets, "w1", 9).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let written = grown(
        &writes_before,
        &apiserver_writes(&s.provider).await.unwrap(),
    );
    assert_eq!(writes_to_widgets(&written), 1, "{written:?}");
    drop((manager, syncer));
}
