//! Instance sync on two real clusters with `kbind-schema-manager` and `kbind-syncer` as real
//! processes: the one-file apply converges, spec goes up, status comes down, drift is repaired,
//! conflicts are reported, deletion and unbind clean up (REFERENCE-BEHAVIOUR §9, §12, §14, §17).

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::eventually;
use kbind_e2e::fixtures::*;
use kbind_e2e::wait::{wait_for, wait_gone};
use kbind_shared::api::ClusterBinding;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

#[tokio::test]
async fn one_file_in_any_order_converges_and_instances_sync_both_ways() {
    // GEN-5, SCH-2, SYNC-5 … SYNC-9, SYNC-12, IDEL-3
    let s = SyncEnv::start("sync_both_ways", &[2, 1, 0], None).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;

    // The consumer CRD: one version, conversion None, kbind's markers, created by kbind.
    let crd = Api::<CustomResourceDefinition>::all(s.consumer.clone())
        .get("widgets.example.org")
        .await
        .unwrap();
    assert_managed_for(&crd, "provider");
    assert!(crd.annotations().contains_key("core.kbind.io/schema-hash"));
    assert!(
        !crd.labels().contains_key("core.kbind.io/exported"),
        "provider labels are not copied (QRK-20)"
    );

    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    let consumer_widgets = widgets(&s.consumer, "team-a");
    let mut labelled = widget("w1", 3);
    labelled.metadata.labels = Some([("team".to_owned(), "a".to_owned())].into());
    labelled.metadata.annotations = Some([("note".to_owned(), "consumer-only".to_owned())].into());
    let created = consumer_widgets
        .create(&PostParams::default(), &labelled)
        .await
        .unwrap();
    let provider_widgets = widgets(&s.provider, "team-a");

    // Spec up, with ownership markers and nothing else from the consumer.
    let copy = wait_object(&provider_widgets, "w1", "the provider copy", 30, |_| true).await;
    assert_eq!(copy.data["spec"], json!({ "size": 3 }));
    assert_eq!(
        copy.annotations().get("core.kbind.io/consumer-object-uid"),
        created.metadata.uid.as_ref()
    );
    assert_eq!(label(&copy, "core.kbind.io/managed"), Some("true"));
    assert!(
        copy.managed_fields()
            .iter()
            .any(|f| f.manager.as_deref() == Some("kbind-konnector"))
    );

    // Status down.
    wait_for("status to come back", 30, || async {
        let w = consumer_widgets
            .get("w1")
            .await
            .map_err(|e| e.to_string())?;
        // The provider's status, and kbind's delivery record beside it.
        let mut status = w.data["status"].clone();
        let record = status.as_object_mut().and_then(|s| s.remove("kbindSync"));
        Ok((status == json!({ "phase": "Ready", "observedSize": 3 })
            && record.is_some_and(|r| r["state"] == "Synced" && r["generation"] == 1))
        .then_some(()))
    })
    .await;
    let w = consumer_widgets.get("w1").await.unwrap();
    assert!(w.finalizers().contains(&"core.kbind.io/syncer".to_owned()));

    // A spec change goes up; drift on the provider is repaired.
    resize_and_wait_upstream(&consumer_widgets, &provider_widgets, "w1", 5).await;
    merge_patch(&provider_widgets, "w1", &json!({ "spec": { "size": 99 } })).await;
    wait_size(&provider_widgets, "w1", 5, "drift to be repaired").await;

    // A provider-side delete of our copy is repaired: it is recreated (SYNC-12, after QRK-13's wait).
    provider_widgets
        .delete("w1", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the deleted copy to be recreated", 30, || async {
        let copy = provider_widgets
            .get_opt("w1")
            .await
            .map_err(|e| e.to_string())?;
        Ok(copy
            .filter(|c| c.metadata.deletion_timestamp.is_none() && c.data["spec"]["size"] == 5)
            .map(|_| ()))
    })
    .await;

    // No write when nothing changed: spec-up count stays put while nothing happens.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = s.syncer.metrics().await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = s.syncer.metrics().await.unwrap();
    let spec_ups = |text: &str| {
        text.lines()
            .find(|l| l.contains("op=\"spec_up\"") && l.contains("result=\"ok\""))
            .map(str::to_owned)
    };
    assert!(
        spec_ups(&before).is_some(),
        "no spec_up was counted: {before}"
    );
    assert_eq!(
        spec_ups(&before),
        spec_ups(&after),
        "a write happened while nothing changed"
    );

    // Deleting the consumer object deletes the provider copy first.
    consumer_widgets
        .delete("w1", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&provider_widgets, "w1", "the provider copy to go", 30).await;
    wait_gone(&consumer_widgets, "w1", "the consumer object to go", 30).await;
    drop(s.env);
}

#[tokio::test]
async fn foreign_provider_object_is_a_conflict_and_adopt_takes_it() {
    // OWN-1 … OWN-3, BIND-10 (QRK-4 fixed), SYNC-7
    let s = SyncEnv::start("sync_conflict", &[0, 1, 2], None).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    ensure_namespace(&s.provider, "team-a").await.unwrap();
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    let provider_widgets = widgets(&s.provider, "team-a");
    provider_widgets
        .create(&PostParams::default(), &widget("taken", 1))
        .await
        .unwrap();

    let consumer_widgets = widgets(&s.consumer, "team-a");
    consumer_widgets
        .create(&PostParams::default(), &widget("taken", 7))
        .await
        .unwrap();
    wait_conflict(&consumer_widgets, "taken", Some("ForeignObjectExists")).await;
    assert_eq!(
        provider_widgets.get("taken").await.unwrap().data["spec"]["size"],
        1,
        "the foreign object is untouched"
    );
    let bindings: Api<ClusterBinding> = Api::all(s.consumer.clone());
    wait_for("Conflicts=True on the binding", 30, || async {
        let b = bindings.get("widgets").await.map_err(|e| e.to_string())?;
        let status = b.status.unwrap_or_default();
        let c = kbind_shared::conditions::find(&status.conditions, "Conflicts").cloned();
        Ok(
            c.filter(|c| c.status == "True" && c.reason == "ForeignObjectExists")
                .map(|_| status.bound_apis[0].conflict_count),
        )
    })
    .await;

    // Adopt takes the unmarked object and the conflict clears.
    merge_patch(
        &bindings,
        "widgets",
        &json!({ "spec": { "conflictPolicy": "Adopt" } }),
    )
    .await;
    wait_for("adoption", 30, || async {
        let copy = provider_widgets
            .get("taken")
            .await
            .map_err(|e| e.to_string())?;
        Ok((copy.data["spec"]["size"] == 7
            && copy
                .annotations()
                .contains_key("core.kbind.io/consumer-object-uid"))
        .then_some(()))
    })
    .await;
    wait_conflict(&consumer_widgets, "taken", None).await;
}

#[tokio::test]
async fn deleting_the_last_cluster_binding_removes_copies_and_the_crd_kbind_created() {
    // BCL-3 exact, PGAP-1, LIM-9
    let s = SyncEnv::start("sync_unbind", &[0, 1, 2], None).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    let consumer_widgets = widgets(&s.consumer, "team-a");
    consumer_widgets
        .create(&PostParams::default(), &widget("w1", 1))
        .await
        .unwrap();
    let orphan = {
        let mut w = widget("keep-me", 2);
        w.metadata.annotations = Some(
            [(
                "core.kbind.io/deletion-policy".to_owned(),
                "Orphan".to_owned(),
            )]
            .into(),
        );
        w
    };
    consumer_widgets
        .create(&PostParams::default(), &orphan)
        .await
        .unwrap();
    let provider_widgets = widgets(&s.provider, "team-a");
    for name in ["w1", "keep-me"] {
        wait_object(&provider_widgets, name, "provider copies", 30, |_| true).await;
    }

    Api::<ClusterBinding>::all(s.consumer.clone())
        .delete("widgets", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&provider_widgets, "w1", "the owned copy to go", 30).await;
    let crds: Api<CustomResourceDefinition> = Api::all(s.consumer.clone());
    wait_gone(
        &crds,
        "widgets.example.org",
        "the CRD kbind created to go",
        30,
    )
    .await;
    assert!(
        provider_widgets.get_opt("keep-me").await.unwrap().is_some(),
        "deletion-policy Orphan keeps the provider copy"
    );
}

#[tokio::test]
async fn no_writes_while_idle_or_after_a_syncer_restart_with_200_synced_objects() {
    // The write-efficiency headline: counted by both API servers themselves.
    use kbind_e2e::kbind::{apiserver_writes, new_writes};
    let mut s = SyncEnv::start("sync_zero_writes", &[0, 1, 2], None).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    let consumer_widgets = widgets(&s.consumer, "team-a");
    const N: usize = 200;
    for i in 0..N {
        consumer_widgets
            .create(&PostParams::default(), &widget(&format!("w{i}"), i as i64))
            .await
            .unwrap();
    }
    eventually("all statuses back", Duration::from_secs(120), || async {
        let list = consumer_widgets
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let done = list
            .items
            .iter()
            .filter(|w| w.data["status"]["phase"] == "Ready")
            .count();
        if done == N {
            Ok(Some(()))
        } else {
            Err(format!("{done}/{N} synced"))
        }
    })
    .await
    .unwrap();
    // Let the last writes (finalizers, status) settle.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let (consumer, provider) = (s.consumer.clone(), s.provider.clone());
    let writes = async || {
        (
            apiserver_writes(&consumer).await.unwrap(),
            apiserver_writes(&provider).await.unwrap(),
        )
    };
    let (consumer_before, provider_before) = writes().await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let (consumer_after, provider_after) = writes().await;
    assert_eq!(
        new_writes(&consumer_before, &consumer_after),
        Vec::<String>::new(),
        "consumer writes while idle"
    );
    assert_eq!(
        new_writes(&provider_before, &provider_after),
        Vec::<String>::new(),
        "provider writes while idle"
    );

    // Restart the syncer: it re-lists everything and writes nothing. (Same identity: a new one
    // would rightly move the work assignment, two writes of the assignment ConfigMap, and still
    // no sync write.)
    s.restart_syncer("syncer-0-restarted", &[]).await;
    let restarted = &s.syncer;
    eventually(
        "the restarted syncer to be ready and watching",
        Duration::from_secs(30),
        || async {
            let metrics = restarted.metrics().await?;
            Ok(metrics
                .contains("cluster=\"provider\",code=\"200\",verb=\"watch\"")
                .then_some(()))
        },
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (consumer_restart, provider_restart) = writes().await;
    assert_eq!(
        new_writes(&consumer_after, &consumer_restart),
        Vec::<String>::new(),
        "consumer writes after a syncer restart"
    );
    assert_eq!(
        new_writes(&provider_after, &provider_restart),
        Vec::<String>::new(),
        "provider writes after a syncer restart"
    );
    // Every object at rest was recognised as such from the caches, not synced again: all are
    // reported synced.
    eventually(
        "the restarted syncer to report every object synced",
        Duration::from_secs(30),
        || async {
            let synced = metric_sum(&restarted.metrics().await?, "kbind_synced_objects", &[]);
            Ok((synced as usize == N).then_some(()))
        },
    )
    .await
    .unwrap();
    eprintln!("{N} synced objects: 0 writes in 30 s idle, 0 writes after a syncer restart");

    // A change made while no syncer runs is not taken for one at rest: the next start syncs it.
    s.env.process(s.syncer.index).kill();
    merge_patch(
        &consumer_widgets,
        "w7",
        &json!({ "spec": { "size": 7007 } }),
    )
    .await;
    s.restart_syncer("syncer-0-again", &[]).await;
    let provider_widgets = widgets(&s.provider, "team-a");
    eventually(
        "the change made while stopped to reach the provider",
        Duration::from_secs(60),
        || async {
            let copy = provider_widgets
                .get("w7")
                .await
                .map_err(|e| e.to_string())?;
            Ok((copy.data["spec"]["size"] == 7007).then_some(()))
        },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn conflict_counts_follow_the_objects_without_waiting_for_a_resync() {
    // BIND-5d live (LIM-16 followed through): with the binding resync at 10 minutes, the count and
    // the Conflicts condition still follow a foreign provider object appearing and going.
    let s = SyncEnv::start_full(
        "sync_conflicts_live",
        &[0, 1, 2],
        None,
        &[],
        &["--binding-resync-interval=10m"],
    )
    .await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    for client in [&s.provider, &s.consumer] {
        ensure_namespace(client, "team-a").await.unwrap();
    }
    let (consumer_widgets, provider_widgets) = (
        widgets(&s.consumer, "team-a"),
        widgets(&s.provider, "team-a"),
    );
    let bindings: Api<ClusterBinding> = Api::all(s.consumer.clone());
    let conflicts = || async {
        let status = bindings
            .get("widgets")
            .await
            .map_err(|e| e.to_string())?
            .status
            .unwrap_or_default();
        let condition = kbind_shared::conditions::find(&status.conditions, "Conflicts")
            .map(|c| c.status.clone())
            .unwrap_or_default();
        let count = status.bound_apis.first().map_or(0, |a| a.conflict_count);
        Ok::<_, String>((count, condition))
    };
    provider_widgets
        .create(&PostParams::default(), &widget("taken", 1))
        .await
        .unwrap();
    consumer_widgets
        .create(&PostParams::default(), &widget("taken", 7))
        .await
        .unwrap();
    wait_conflict(&consumer_widgets, "taken", Some("ForeignObjectExists")).await;
    let started = std::time::Instant::now();
    wait_for("conflictCount 1 and Conflicts=True", 5, || async {
        Ok((conflicts().await? == (1, "True".to_owned())).then_some(()))
    })
    .await;
    println!("conflict counted after {:?}", started.elapsed());

    // The foreign object goes: kbind creates its copy, the annotation clears, the count follows.
    provider_widgets
        .delete("taken", &DeleteParams::default())
        .await
        .unwrap();
    wait_conflict(&consumer_widgets, "taken", None).await;
    let started = std::time::Instant::now();
    wait_for("conflictCount 0 and Conflicts=False", 5, || async {
        Ok((conflicts().await? == (0, "False".to_owned())).then_some(()))
    })
    .await;
    println!("conflict cleared after {:?}", started.elapsed());
}

#[tokio::test]
async fn a_provider_without_streaming_lists_is_listed_instead_and_syncs_both_ways() {
    // A provider API server without the WatchList feature (an older Kubernetes, or a server built
    // on other libraries) refuses the streaming list a worker asks for first.
    let mut s = SyncEnv::start_with_provider_flags(
        "no_streaming_lists",
        &["--feature-gates=WatchList=false"],
    )
    .await;
    let streaming_watch = http::Request::get(
        "/apis/example.org/v1/widgets?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
    )
    .body(Vec::new())
    .unwrap();
    let refusal = s.provider.request_text(streaming_watch).await;
    assert!(
        matches!(&refusal, Err(kube::Error::Api(status)) if matches!(status.code, 400 | 422)),
        "the provider refuses streaming lists: {refusal:?}"
    );
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    let (consumer_widgets, provider_widgets) = (
        widgets(&s.consumer, "team-a"),
        widgets(&s.provider, "team-a"),
    );

    // Spec up, and the provider's status down (the provider side's watch feeds it).
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "w1", 1).await;
    wait_status_down(&consumer_widgets, "w1", 1).await;
    resize_and_wait_upstream(&consumer_widgets, &provider_widgets, "w1", 2).await;
    wait_status_down(&consumer_widgets, "w1", 2).await;
    let log = std::fs::read_to_string(s.env.dir().join("syncer-0.log")).unwrap_or_default();
    assert!(
        log.contains("refuses streaming lists; listing instead"),
        "the syncer says it lists the provider instead"
    );

    // A restart lists both sides again (the provider's the paged way) and syncs a change made
    // while no syncer ran.
    s.env.process(s.syncer.index).kill();
    merge_patch(&consumer_widgets, "w1", &json!({ "spec": { "size": 3 } })).await;
    s.restart_syncer("syncer-0-restarted", &[]).await;
    wait_status_down(&consumer_widgets, "w1", 3).await;
}
