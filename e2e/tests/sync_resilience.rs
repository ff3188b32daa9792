//! Instance sync when things go wrong, on two real clusters: the Connection goes un-Ready,
//! credentials rotate or are revoked, the provider rejects or disappears, ownership markers are
//! partial or stale, the syncer is killed mid-burst, objects are large (REFERENCE-BEHAVIOUR §15
//! ENG, §17 SYNC/OWN/IDEL).

use std::time::Duration;

use k8s_openapi::api::rbac::v1::ClusterRole;
use kbind_e2e::cluster::{User, ensure_namespace};
use kbind_e2e::fixtures::*;
use kbind_e2e::wait::{absent, wait_for, wait_gone};
use kbind_shared::api::ClusterBinding;
use kube::api::{DeleteParams, DynamicObject, ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

async fn ready(s: &SyncEnv) {
    wait_binding(
        &Api::<ClusterBinding>::all(s.consumer.clone()),
        "widgets",
        "Ready=True",
    )
    .await;
}

async fn granted(provider: &kbind_e2e::Cluster, name: &str) -> User {
    let user = provider.mint_user(name).await.unwrap();
    provider
        .grant(&user, name, provider_rules(true))
        .await
        .unwrap();
    user
}

/// Makes the Connection's Secret hold `name`, a restricted user granted everything kbind needs
/// (the ClusterRole `name`).
async fn switch_to_granted(s: &SyncEnv, name: &str) -> User {
    let user = granted(s.env.cluster("provider"), name).await;
    put_secret(
        &s.consumer,
        "provider-kubeconfig",
        "kubeconfig",
        user.kubeconfig.as_bytes(),
    )
    .await
    .unwrap();
    user
}

#[tokio::test]
async fn connection_not_ready_stops_syncing_and_ready_resumes_with_rotated_credentials() {
    // ENG-1 … ENG-4, LIM-1/ENG-5 improved: a rotated credential is used without a restart.
    let s = SyncEnv::start("resilience_engage", &[0, 1, 2], None).await;
    ready(&s).await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    let (consumer_widgets, provider_widgets) = (
        widgets(&s.consumer, "team-a"),
        widgets(&s.provider, "team-a"),
    );

    // Syncing works first.
    create_and_wait_copy(&consumer_widgets, &provider_widgets, "before", 1).await;

    // Break the credentials: the Connection goes un-Ready and the syncer disengages.
    put_secret(
        &s.consumer,
        "provider-kubeconfig",
        "kubeconfig",
        b"garbage: [",
    )
    .await
    .unwrap();
    wait_connection(&s.consumer, "provider", "Ready=False").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    consumer_widgets
        .create(&PostParams::default(), &widget("while-down", 1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        provider_widgets
            .get_opt("while-down")
            .await
            .unwrap()
            .is_none(),
        "synced while the Connection was not Ready"
    );

    // A new, different credential for the same provider: Ready again, syncing resumes with it.
    let user = granted(s.env.cluster("provider"), "rotated").await;
    put_secret(
        &s.consumer,
        "provider-kubeconfig",
        "kubeconfig",
        user.kubeconfig.as_bytes(),
    )
    .await
    .unwrap();
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    let copy = wait_object(
        &provider_widgets,
        "while-down",
        "the object to sync after recovery",
        30,
        |_| true,
    )
    .await;
    let managers: Vec<String> = copy
        .managed_fields()
        .iter()
        .filter_map(|f| f.manager.clone())
        .collect();
    assert!(
        managers.contains(&"kbind-konnector".to_owned()),
        "{managers:?}"
    );
    let syncer_log = std::fs::read_to_string(s.env.dir().join("syncer-0.log")).unwrap();
    assert!(
        syncer_log.contains("stopping sync worker")
            && syncer_log.matches("starting sync worker").count() >= 2,
        "the worker was not rebuilt"
    );
}

#[tokio::test]
async fn revoked_credentials_give_forbidden_events_and_recover_when_granted_again() {
    // SYNC-10, bad input: credentials revoked mid-run.
    let s = SyncEnv::start("resilience_forbidden", &[0, 1, 2], None).await;
    ready(&s).await;
    // The worker runs with the admin's credential first (a Ready binding does not say the syncer
    // started it yet: switched before, the first worker would already use the new one).
    let log = s.env.dir().join("syncer-0.log");
    wait_for("the first sync worker", 30, || async {
        let text = std::fs::read_to_string(&log).map_err(|e| e.to_string())?;
        Ok(text.contains("starting sync worker").then_some(()))
    })
    .await;
    // The Secret holds a restricted user that may do everything kbind needs.
    switch_to_granted(&s, "limited").await;
    // The syncer picks up new credentials (it watches the Secret) by rebuilding its worker.
    wait_for(
        "the worker to be rebuilt with the new credential",
        30,
        || async {
            let text = std::fs::read_to_string(&log).map_err(|e| e.to_string())?;
            Ok((text.matches("starting sync worker").count() >= 2).then_some(()))
        },
    )
    .await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    ensure_namespace(&s.provider, "team-a").await.unwrap();
    let (consumer_widgets, provider_widgets) = (
        widgets(&s.consumer, "team-a"),
        widgets(&s.provider, "team-a"),
    );
    create_and_wait_copy(&consumer_widgets, &provider_widgets, "first", 1).await;

    // Revoke the write permissions on widgets.
    let roles: Api<ClusterRole> = Api::all(s.provider.clone());
    let read_only = ClusterRole {
        rules: Some(provider_rules(false)),
        ..roles.get("limited").await.unwrap()
    };
    roles
        .replace("limited", &PostParams::default(), &read_only)
        .await
        .unwrap();
    consumer_widgets
        .create(&PostParams::default(), &widget("denied", 2))
        .await
        .unwrap();
    let warnings = wait_for("a Forbidden Warning Event", 30, || async {
        let w = warning_events(&s.consumer, Some("team-a"), "denied").await;
        if w.iter().any(|r| r.starts_with("Forbidden")) {
            return Ok(Some(w));
        }
        let copy = provider_widgets
            .get_opt("denied")
            .await
            .map_err(|e| e.to_string())?;
        Err(format!(
            "warnings {w:?}; provider copy exists: {}",
            copy.is_some()
        ))
    })
    .await;
    let metrics = s.syncer.metrics().await.unwrap();
    let forbidden = [("op", "spec_up"), ("result", "forbidden")];
    assert!(
        metric_sum(&metrics, "kbind_sync_operations_total", &forbidden) >= 1.0,
        "RBAC's refusal is counted as such: {metrics}"
    );
    assert!(
        warnings.iter().any(|w| w.contains("forbidden")),
        "{warnings:?}"
    );
    assert!(
        s.env.process_ref(s.syncer.index).is_running(),
        "the syncer crashed"
    );

    // Grant again: the object syncs (the 30 s Forbidden retry, or sooner).
    let granted_again = ClusterRole {
        rules: Some(provider_rules(true)),
        ..roles.get("limited").await.unwrap()
    };
    roles
        .replace("limited", &PostParams::default(), &granted_again)
        .await
        .unwrap();
    wait_object(
        &provider_widgets,
        "denied",
        "recovery after the grant",
        45,
        |_| true,
    )
    .await;
}

#[tokio::test]
async fn ownership_markers_decide_and_adopt_never_takes_an_object_owned_by_another() {
    // OWN-1, OWN-2, IDEL-5: partial markers, and an orphaned copy of a recreated consumer object.
    let s = SyncEnv::start("resilience_ownership", &[0, 1, 2], None).await;
    ready(&s).await;
    let bindings: Api<ClusterBinding> = Api::all(s.consumer.clone());
    merge_patch(
        &bindings,
        "widgets",
        &json!({ "spec": { "conflictPolicy": "Adopt" } }),
    )
    .await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    ensure_namespace(&s.provider, "team-a").await.unwrap();
    let (consumer_widgets, provider_widgets) = (
        widgets(&s.consumer, "team-a"),
        widgets(&s.provider, "team-a"),
    );

    let mut partial = widget("partial", 1);
    partial.metadata.annotations = Some(
        [(
            "core.kbind.io/consumer-cluster-uid".to_owned(),
            "someone".to_owned(),
        )]
        .into(),
    );
    provider_widgets
        .create(&PostParams::default(), &partial)
        .await
        .unwrap();
    consumer_widgets
        .create(&PostParams::default(), &widget("partial", 9))
        .await
        .unwrap();

    // An orphaned copy, then the consumer object is recreated with a new UID.
    let mut kept = widget("recreated", 3);
    kept.metadata.annotations = Some(
        [(
            "core.kbind.io/deletion-policy".to_owned(),
            "Orphan".to_owned(),
        )]
        .into(),
    );
    consumer_widgets
        .create(&PostParams::default(), &kept)
        .await
        .unwrap();
    wait_object(&provider_widgets, "recreated", "the copy", 30, |_| true).await;
    consumer_widgets
        .delete("recreated", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(
        &consumer_widgets,
        "recreated",
        "the consumer object to go",
        30,
    )
    .await;
    consumer_widgets
        .create(&PostParams::default(), &widget("recreated", 4))
        .await
        .unwrap();

    for name in ["partial", "recreated"] {
        wait_conflict(&consumer_widgets, name, Some("OwnedByAnother")).await;
    }
    assert_eq!(
        provider_widgets.get("partial").await.unwrap().data["spec"]["size"],
        1,
        "Adopt never takes it"
    );
    assert_eq!(
        provider_widgets.get("recreated").await.unwrap().data["spec"]["size"],
        3,
        "the orphaned copy is untouched"
    );
    // The Warning follows the conflict annotation's write: wait for it rather than race it.
    wait_warning(&s.consumer, Some("team-a"), "partial", "OwnedByAnother").await;
    wait_binding(&bindings, "widgets", "Conflicts=True/OwnedByAnother").await;
    let metrics = s.syncer.metrics().await.unwrap();
    assert!(
        metrics.contains("kbind_conflicts{api=\"widgets.example.org\"} 2"),
        "{metrics}"
    );
}

#[tokio::test]
async fn provider_rejection_is_reported_and_other_objects_keep_syncing() {
    // Bad input: a spec the provider's admission rejects.
    let s = SyncEnv::start("resilience_rejected", &[0, 1, 2], None).await;
    ready(&s).await;
    // The provider tightens its schema; the consumer keeps the old one (Once would too).
    let strict = widget_crd_with_max_size(10);
    merge_patch(
        &Api::<ClusterBinding>::all(s.consumer.clone()),
        "widgets",
        &json!({ "spec": { "apis": [{ "name": "widgets.example.org" }] } }),
    )
    .await;
    merge_patch(
        &Api::<kbind_shared::api::Connection>::all(s.consumer.clone()),
        "provider",
        &json!({ "spec": { "schema": { "updatePolicy": "Once" } } }),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    install_crd(&s.provider, &strict).await.unwrap();
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    let (consumer_widgets, provider_widgets) = (
        widgets(&s.consumer, "team-a"),
        widgets(&s.provider, "team-a"),
    );
    consumer_widgets
        .create(&PostParams::default(), &widget("too-big", 50))
        .await
        .unwrap();
    create_and_wait_copy(&consumer_widgets, &provider_widgets, "fine", 5).await;
    let warnings = wait_for("a ProviderRejected Warning", 30, || async {
        let w = warning_events(&s.consumer, Some("team-a"), "too-big").await;
        Ok(w.iter()
            .any(|r| r.starts_with("ProviderRejected"))
            .then_some(w))
    })
    .await;
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("less than or equal to 10")),
        "the provider's message: {warnings:?}"
    );
    let metrics = s.syncer.metrics().await.unwrap();
    let rejected = [("op", "spec_up"), ("result", "rejected")];
    assert!(
        metric_sum(&metrics, "kbind_sync_operations_total", &rejected) >= 1.0,
        "the provider's rejection is counted as such: {metrics}"
    );
    assert!(provider_widgets.get_opt("too-big").await.unwrap().is_none());
}

#[tokio::test]
async fn an_unreachable_provider_loses_nothing_and_deletions_wait_until_it_is_back() {
    // ENG-4, IDEL-3: the provider's API server is paused (SIGSTOP) for 20 s.
    let s = SyncEnv::start("resilience_unreachable", &[0, 1, 2], None).await;
    ready(&s).await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    let (consumer_widgets, provider_widgets) = (
        widgets(&s.consumer, "team-a"),
        widgets(&s.provider, "team-a"),
    );
    for name in ["a", "b"] {
        create_and_wait_copy(&consumer_widgets, &provider_widgets, name, 1).await;
    }

    s.env.cluster("provider").signal_apiserver("STOP").unwrap();
    consumer_widgets
        .delete("a", &DeleteParams::default())
        .await
        .unwrap();
    merge_patch(&consumer_widgets, "b", &json!({ "spec": { "size": 2 } })).await;
    consumer_widgets
        .create(&PostParams::default(), &widget("c", 3))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(20)).await;
    let a = consumer_widgets.get_opt("a").await.unwrap();
    assert!(
        a.is_some_and(|a| a.metadata.deletion_timestamp.is_some()),
        "the deletion waits for the provider"
    );
    s.env.cluster("provider").signal_apiserver("CONT").unwrap();

    wait_for("everything to catch up", 60, || async {
        let a_gone =
            absent(&consumer_widgets, "a").await? && absent(&provider_widgets, "a").await?;
        let b = provider_widgets
            .get_opt("b")
            .await
            .map_err(|e| e.to_string())?;
        let c = provider_widgets
            .get_opt("c")
            .await
            .map_err(|e| e.to_string())?;
        Ok((a_gone && b.is_some_and(|b| b.data["spec"]["size"] == 2) && c.is_some()).then_some(()))
    })
    .await;
}

#[tokio::test]
async fn sigkill_of_the_syncer_during_a_burst_ends_with_both_sides_in_agreement() {
    // Crash safety: 300 creates, updates and deletes with the syncer killed in the middle.
    let mut s = SyncEnv::start("resilience_sigkill", &[0, 1, 2], None).await;
    ready(&s).await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    let (consumer_widgets, provider_widgets) = (
        widgets(&s.consumer, "team-a"),
        widgets(&s.provider, "team-a"),
    );
    let mut restarted = None;
    for i in 0..150 {
        consumer_widgets
            .create(&PostParams::default(), &widget(&format!("w{i}"), 1))
            .await
            .unwrap();
        if i == 60 {
            s.env.process(s.syncer.index).kill();
            restarted = Some(
                start_syncer(
                    &mut s.env,
                    "consumer",
                    "syncer-1",
                    &["--log-level=info,kbind_syncer=trace"],
                )
                .await
                .unwrap(),
            );
        }
    }
    for i in 0..100 {
        merge_patch(
            &consumer_widgets,
            &format!("w{i}"),
            &json!({ "spec": { "size": 2 } }),
        )
        .await;
        if i == 50 {
            let r = restarted.take().unwrap();
            s.env.process(r.index).kill();
            start_syncer(
                &mut s.env,
                "consumer",
                "syncer-2",
                &["--log-level=info,kbind_syncer=trace"],
            )
            .await
            .unwrap();
        }
    }
    for i in 100..150 {
        consumer_widgets
            .delete(&format!("w{i}"), &DeleteParams::default())
            .await
            .unwrap();
    }

    wait_for("consumer and provider to agree", 120, || async {
        let consumer: Vec<DynamicObject> = consumer_widgets.list(&ListParams::default()).await.map_err(|e| e.to_string())?.items;
        let provider: Vec<DynamicObject> = provider_widgets.list(&ListParams::default()).await.map_err(|e| e.to_string())?.items;
        let spec = |list: &[DynamicObject]| -> std::collections::BTreeMap<String, serde_json::Value> {
            list.iter().map(|o| (o.name_any(), o.data["spec"].clone())).collect()
        };
        let (c, p) = (spec(&consumer), spec(&provider));
        if c.len() == 100 && c == p && consumer.iter().all(|o| o.data["status"]["observedSize"] == o.data["spec"]["size"]) {
            Ok(Some(()))
        } else {
            let differ: Vec<String> = c.iter().filter(|(k, v)| p.get(*k) != Some(v)).map(|(k, v)| format!("{k}: {v} vs {:?}", p.get(k))).take(3).collect();
            let stale: Vec<String> = consumer
                .iter()
                .filter(|o| o.data["status"]["observedSize"] != o.data["spec"]["size"])
                .map(|o| format!("{} status {} finalizers {:?} deleting {:?}", o.name_any(), o.data["status"], o.finalizers(), o.metadata.deletion_timestamp))
                .take(3)
                .collect();
            Err(format!("consumer {} objects, provider {}; spec differs: {differ:?}; status behind: {stale:?}", c.len(), p.len()))
        }
    })
    .await;
}

#[tokio::test]
async fn one_mebibyte_objects_sync() {
    // Bad input: objects of 1 MiB.
    let s = SyncEnv::start("resilience_large", &[0, 1, 2], None).await;
    ready(&s).await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    let (consumer_widgets, provider_widgets) = (
        widgets(&s.consumer, "team-a"),
        widgets(&s.provider, "team-a"),
    );
    let blob = "x".repeat(1024 * 1024 - 512);
    let big: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.org/v1", "kind": "Widget", "metadata": { "name": "big" }, "spec": { "size": 1, "blob": blob }
    }))
    .unwrap();
    consumer_widgets
        .create(&PostParams::default(), &big)
        .await
        .unwrap();
    let copy = wait_object(&provider_widgets, "big", "the large copy", 30, |_| true).await;
    assert_eq!(
        copy.data["spec"]["blob"].as_str().map(str::len),
        Some(blob.len())
    );
}

#[tokio::test]
async fn a_webhook_denial_is_rejected_not_forbidden() {
    // #33.2: a provider's validating webhook answers 403 (its default) in one namespace and 400 in
    // another. Both are the provider's admission saying no: the delivery record says Rejected with
    // the webhook's message, a ProviderRejected Warning tells the user, the metric says
    // `rejected` — never `forbidden` (RBAC) — and other objects keep syncing.
    use kbind_e2e::webhook::DenyingWebhook;
    let s = SyncEnv::start("resilience_webhook", &[0, 1, 2], None).await;
    ready(&s).await;
    let mut hooks = Vec::new();
    for (namespace, code) in [("guarded", 403u16), ("picky", 400)] {
        let hook = DenyingWebhook::start(code, &format!("{namespace} widgets need approval"))
            .await
            .unwrap();
        ensure_namespace(&s.consumer, namespace).await.unwrap();
        kbind_e2e::cluster::labelled_namespace(&s.provider, namespace, ("policy", namespace))
            .await
            .unwrap();
        kbind_e2e::webhook::register(
            &s.provider,
            namespace,
            Some(&hook),
            &["CREATE", "UPDATE"],
            "widgets",
            Some(("policy", namespace)),
        )
        .await
        .unwrap();
        hooks.push(hook);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    for namespace in ["guarded", "picky", "team-a"] {
        widgets(&s.consumer, namespace)
            .create(&PostParams::default(), &widget("w", 5))
            .await
            .unwrap();
    }
    wait_object(
        &widgets(&s.provider, "team-a"),
        "w",
        "team-a's widget to sync",
        30,
        |_| true,
    )
    .await;
    for namespace in ["guarded", "picky"] {
        let record = wait_for("a Rejected delivery record", 30, || async {
            let w = widgets(&s.consumer, namespace)
                .get("w")
                .await
                .map_err(|e| e.to_string())?;
            let record = w.data["status"]["kbindSync"].clone();
            Ok((record["state"] == "Rejected").then_some(record))
        })
        .await;
        let message = record["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("{namespace} widgets need approval"))
                && message.contains("denied the request"),
            "{record}"
        );
        let warnings = wait_for("a ProviderRejected Warning", 30, || async {
            let w = warning_events(&s.consumer, Some(namespace), "w").await;
            Ok(w.iter()
                .any(|r| r.starts_with("ProviderRejected"))
                .then_some(w))
        })
        .await;
        assert!(
            !warnings.iter().any(|w| w.starts_with("Forbidden")),
            "{warnings:?}"
        );
        assert!(
            widgets(&s.provider, namespace)
                .get_opt("w")
                .await
                .unwrap()
                .is_none()
        );
    }
    let metrics = s.syncer.metrics().await.unwrap();
    let count = |result: &str| {
        metric_sum(
            &metrics,
            "kbind_sync_operations_total",
            &[("op", "spec_up"), ("result", result)],
        )
    };
    assert!(count("rejected") >= 2.0, "{metrics}");
    assert_eq!(count("forbidden"), 0.0, "{metrics}");
    drop(hooks);
}

#[tokio::test]
async fn a_revoked_credential_is_reported_as_permission_denied_and_regained_access_clears_it() {
    // #33.8: with objects synced, the credential's ClusterRole is deleted. The watches that serve
    // discovery stay open, but the next heartbeat is denied: within a few discovery intervals the
    // Connection says PermissionDenied=True naming the verb and resource. Granted again, it clears.
    let s = SyncEnv::start("resilience_revoked_connection", &[0, 1, 2], None).await;
    ready(&s).await;
    let user = switch_to_granted(&s, "revocable").await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "w", 1).await;
    wait_connection(&s.consumer, "provider", "PermissionDenied=False").await;

    // #33.9: `kbind_reconcile_errors_total{controller="connection"}` against what the provider's
    // API server answered: a reconcile fails for `provider` only after a request of it was
    // denied, and for `consumer` only when the consumer refused a request.
    let errors = |reason: &'static str| {
        let manager = &s.manager;
        async move {
            metric_sum(
                &manager.metrics().await.unwrap(),
                "kbind_reconcile_errors_total",
                &[("controller", "connection"), ("reason", reason)],
            )
        }
    };
    // Denied requests are refused before the API server's request metrics count them: its audit
    // log has them.
    let denied = || async {
        s.env
            .cluster("provider")
            .audited()
            .iter()
            .filter(|r| r.user == user.username && r.code == 403)
            .count() as f64
    };
    let (errors_before, denied_before) = (errors("provider").await, denied().await);
    let roles: Api<ClusterRole> = Api::all(s.provider.clone());
    roles
        .delete("revocable", &DeleteParams::default())
        .await
        .unwrap();
    let revoked_at = std::time::Instant::now();
    let connection =
        wait_connection(&s.consumer, "provider", "PermissionDenied=True/Forbidden").await;
    eprintln!("PermissionDenied after {:?}", revoked_at.elapsed());
    let conditions = connection.status.unwrap_or_default().conditions;
    let message = &kbind_shared::conditions::find(&conditions, "PermissionDenied")
        .unwrap()
        .message;
    eprintln!("PermissionDenied: {message}");
    assert!(
        message.contains("leases") || message.contains("namespaces"),
        "names the verb and resource: {message}"
    );
    // The reconcile that wrote the condition is counted when it returns, just after its status
    // write: the count may trail the condition the test just saw by one reconcile.
    let failed = wait_for("a failed Connection reconcile counted", 10, || async {
        let failed = errors("provider").await - errors_before;
        Ok((failed >= 1.0).then_some(failed))
    })
    .await;
    let refused = denied().await - denied_before;
    assert!(
        failed <= refused,
        "{failed} failed Connection reconciles for {refused} requests the provider denied"
    );
    // The revocation fails nothing on the consumer: a `consumer` count is only ever a request
    // the consumer's API server refused. A write that raced another (409, retried at once) is
    // not a failed reconcile and is not counted (`context::raced`).
    let refused_on_consumer = s
        .env
        .cluster("consumer")
        .audited()
        .iter()
        .filter(|r| r.resource == "connections" && r.code >= 400 && r.code != 409)
        .count() as f64;
    assert_eq!(
        errors("consumer").await,
        refused_on_consumer,
        "consumer failures are exactly the consumer's refusals of Connection writes"
    );

    let mut role = ClusterRole::default();
    role.metadata.name = Some("revocable".into());
    role.rules = Some(provider_rules(true));
    roles.create(&PostParams::default(), &role).await.unwrap();
    wait_connection(&s.consumer, "provider", "PermissionDenied=False").await;
    wait_connection(&s.consumer, "provider", "Ready=True").await;
}

/// The Ready condition's message of a binding or Connection status, if any.
fn ready_message(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> String {
    conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| format!("{} {}: {}", c.status, c.reason, c.message))
        .unwrap_or_default()
}

#[tokio::test]
async fn an_unbind_while_the_provider_is_unreachable_is_owed_across_restarts_and_carried_out_when_it_answers()
 {
    // #53.1: the provider's API server is paused (SIGSTOP) while the ClusterBinding is deleted;
    // kbind is restarted twice and the Connection deleted meanwhile; then the provider answers.
    let mut s = SyncEnv::start("resilience_unbind_outage", &[0, 1, 2], None).await;
    ready(&s).await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    let (consumer_widgets, provider_widgets) = (
        widgets(&s.consumer, "team-a"),
        widgets(&s.provider, "team-a"),
    );
    for name in ["a", "b"] {
        create_and_wait_copy(&consumer_widgets, &provider_widgets, name, 1).await;
    }
    // A provider object kbind does not own, under a name no consumer object has.
    // (The provider's stand-in controller writes its status; kbind must write nothing of it.)
    let theirs = provider_widgets
        .create(&PostParams::default(), &widget("theirs", 5))
        .await
        .unwrap();
    let untouched = |w: &DynamicObject| {
        (
            w.metadata.generation,
            w.metadata.labels.clone(),
            w.metadata.annotations.clone(),
            w.metadata.finalizers.clone(),
            w.metadata.deletion_timestamp.clone(),
            w.data.get("spec").cloned(),
            w.metadata
                .managed_fields
                .iter()
                .flatten()
                .any(|f| f.manager.as_deref() == Some(kbind_shared::keys::FIELD_MANAGER)),
        )
    };
    let theirs = untouched(&theirs);

    s.env.cluster("provider").signal_apiserver("STOP").unwrap();
    let bindings: Api<ClusterBinding> = Api::all(s.consumer.clone());
    bindings
        .delete("widgets", &DeleteParams::default())
        .await
        .unwrap();
    let owing = || async {
        let binding = bindings
            .get_opt("widgets")
            .await
            .map_err(|e| e.to_string())?
            .ok_or("the ClusterBinding is gone")?;
        let message = ready_message(
            &binding
                .status
                .as_ref()
                .map(|s| s.conditions.clone())
                .unwrap_or_default(),
        );
        Ok::<_, String>(
            message
                .contains("2 provider copy(ies) owed")
                .then_some(message),
        )
    };
    let message = wait_for("the unbind to say what it owes", 120, owing).await;
    assert!(
        message.starts_with("False DrainingObjects: ")
            && message.contains("cannot reach the provider of Connection provider"),
        "{message}"
    );
    let finalized = || async {
        let mut held = Vec::new();
        for name in ["a", "b"] {
            let o = consumer_widgets.get(name).await.unwrap();
            if o.finalizers()
                .contains(&kbind_shared::keys::SYNCER_FINALIZER.to_owned())
            {
                held.push(name);
            }
        }
        held
    };
    assert_eq!(finalized().await, ["a", "b"], "what is owed is recorded");

    // Two restarts of kbind, then the Connection deleted: nothing is let go meanwhile. (A
    // restarted schema manager has no provider client: it times out reading the provider's
    // identity within 30 s and owes the copies again.)
    for round in ["1", "2"] {
        s.restart_manager(&format!("schema-manager-{round}")).await;
        s.restart_syncer(&format!("syncer-0-{round}"), &[]).await;
        s.manager
            .wait_ready("the restarted schema manager", 60)
            .await;
    }
    Api::<kbind_shared::api::Connection>::all(s.consumer.clone())
        .delete("provider", &DeleteParams::default())
        .await
        .unwrap();
    let connections: Api<kbind_shared::api::Connection> = Api::all(s.consumer.clone());
    let explained = wait_for("the Connection to say what it waits for", 60, || async {
        let c = connections
            .get("provider")
            .await
            .map_err(|e| e.to_string())?;
        let message = ready_message(
            &c.status
                .as_ref()
                .map(|s| s.conditions.clone())
                .unwrap_or_default(),
        );
        Ok(message
            .contains("waiting for 1 binding(s) that reference this Connection")
            .then_some(message))
    })
    .await;
    assert!(explained.starts_with("False "), "{explained}");
    tokio::time::sleep(Duration::from_secs(45)).await;
    assert!(bindings.get_opt("widgets").await.unwrap().is_some());
    assert_eq!(
        finalized().await,
        ["a", "b"],
        "nothing released while the provider is away"
    );
    let message = owing().await.unwrap();
    assert!(message.is_some(), "still owed after the restarts");

    s.env.cluster("provider").signal_apiserver("CONT").unwrap();
    wait_for(
        "the owed copies to be deleted and everything to go",
        180,
        || async {
            let copies_gone =
                absent(&provider_widgets, "a").await? && absent(&provider_widgets, "b").await?;
            let binding_gone = absent(&bindings, "widgets").await?;
            let connection_gone = absent(&connections, "provider").await?;
            Ok((copies_gone && binding_gone && connection_gone).then_some(()))
        },
    )
    .await;
    assert_eq!(
        untouched(&provider_widgets.get("theirs").await.unwrap()),
        theirs,
        "nothing else touched"
    );
}

#[tokio::test]
async fn a_binding_annotated_orphan_keeps_its_provider_copies_when_it_goes() {
    // #53.1: the explicit way to let an unbind keep the provider copies (as on one object).
    let s = SyncEnv::start("resilience_unbind_orphan", &[0, 1, 2], None).await;
    ready(&s).await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    let (consumer_widgets, provider_widgets) = (
        widgets(&s.consumer, "team-a"),
        widgets(&s.provider, "team-a"),
    );
    create_and_wait_copy(&consumer_widgets, &provider_widgets, "kept", 1).await;
    let copy = provider_widgets.get("kept").await.unwrap();
    let bindings: Api<ClusterBinding> = Api::all(s.consumer.clone());
    bindings
        .patch(
            "widgets",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({ "metadata": { "annotations": {
                kbind_shared::keys::DELETION_POLICY_ANNOTATION: kbind_shared::keys::DELETION_POLICY_ORPHAN } } })),
        )
        .await
        .unwrap();
    bindings
        .delete("widgets", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&bindings, "widgets", "the ClusterBinding", 60).await;
    let after = provider_widgets.get("kept").await.unwrap();
    assert_eq!(after.metadata.uid, copy.metadata.uid, "the copy is kept");
    assert_eq!(after.metadata.deletion_timestamp, None);
}
