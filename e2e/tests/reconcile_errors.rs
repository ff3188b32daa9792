//! `kbind_reconcile_errors_total` against what the consumer's API server saw (#33.9): the
//! consumer's own admission (a webhook on kbind's objects) refuses the schema manager's writes,
//! and each refused write is one failed reconcile of its controller and reason — exactly the
//! refused writes in the consumer's audit log. A deletion waiting for what it must drain is a
//! wait, not a failure, and is not counted.

use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::fixtures::*;
use kbind_e2e::wait::wait_for;
use kbind_e2e::webhook::{DenyingWebhook, register_in, unregister};
use kbind_shared::api::{ClusterBinding, Connection};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;
use std::time::Duration;

/// kbind's API group: the webhooks below guard its objects.
const GROUP: &str = "core.kbind.io";

/// The schema manager's failed reconciles of `controller` for `reason` (`None`: every reason).
async fn errors(s: &SyncEnv, controller: &str, reason: Option<&str>) -> Result<f64, String> {
    let text = s.manager.metrics().await?;
    let mut labels = vec![("controller", controller)];
    labels.extend(reason.map(|r| ("reason", r)));
    Ok(metric_sum(&text, "kbind_reconcile_errors_total", &labels))
}

/// Writes of `resource` (`subresource`, "" for the object itself) the consumer's API server
/// refused with 403 (the webhook's answer).
fn refused(s: &SyncEnv, resource: &str, subresource: &str) -> f64 {
    s.env
        .cluster("consumer")
        .audited()
        .iter()
        .filter(|r| r.resource == resource && r.subresource == subresource && r.code == 403)
        .count() as f64
}

/// Waits until `controller`'s failed reconciles for `reason` equal `refused()` — the refused
/// requests an API server's audit log has, named `what` — read between two equal metric
/// readings, with at least two refused.
async fn wait_errors_equal(
    s: &SyncEnv,
    (controller, reason): (&str, &str),
    what: &str,
    refused: impl Fn() -> f64,
) {
    wait_for(
        &format!("{controller} {reason} errors equal to the refused {what}"),
        90,
        || async {
            let first = errors(s, controller, Some(reason)).await?;
            let refused = refused();
            let again = errors(s, controller, Some(reason)).await?;
            if first == again && first == refused && refused >= 2.0 {
                Ok(Some(()))
            } else {
                Err(format!("{first} then {again} errors, {refused} refused"))
            }
        },
    )
    .await;
}

/// [`wait_errors_equal`] the consumer's refused writes of `resource`/`subresource`.
async fn wait_errors_equal_refused(
    s: &SyncEnv,
    controller: &str,
    reason: &str,
    (resource, subresource): (&str, &str),
) {
    let what = format!("{resource}/{subresource} writes");
    wait_errors_equal(s, (controller, reason), &what, || {
        refused(s, resource, subresource)
    })
    .await;
}

/// Waits until the Connection `provider` says it waits for its bindings to go.
async fn wait_draining_bindings(s: &SyncEnv) {
    wait_connection(&s.consumer, "provider", "Ready=False/DrainingBindings").await;
}

/// Waits until the ClusterBinding `widgets` says it waits for provider copies to go.
async fn wait_draining_objects(cluster_bindings: &Api<ClusterBinding>) {
    wait_binding(cluster_bindings, "widgets", "Ready=False/DrainingObjects").await;
}

/// Registers a webhook `name` that `hook` answers, denying updates of `resource` of kbind's group;
/// waits a second for the API server to load it.
async fn deny(s: &SyncEnv, hook: &DenyingWebhook, name: &str, resource: &str) {
    register_in(
        &s.consumer,
        name,
        Some(hook),
        &["UPDATE"],
        GROUP,
        resource,
        None,
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn each_refused_write_is_one_reconcile_error_of_its_reason_and_a_drain_wait_is_none() {
    // Only the Secret first: the webhooks are in place before the Connection and the
    // ClusterBinding exist.
    let s = SyncEnv::start("reconcile_errors", &[0], None).await;
    let hook = DenyingWebhook::start(403, "kbind's objects are frozen here")
        .await
        .unwrap();

    // 1. Status writes refused: `consumer` errors of the Connection and the ClusterBinding.
    deny(&s, &hook, "frozen-connection-status", "connections/status").await;
    deny(&s, &hook, "frozen-binding-status", "clusterbindings/status").await;
    let kubeconfig = s.env.cluster("provider").admin_kubeconfig();
    apply_manifest(&s.consumer, &one_file(&kubeconfig, &[1, 2]))
        .await
        .unwrap();
    wait_errors_equal_refused(&s, "connection", "consumer", ("connections", "status")).await;
    wait_errors_equal_refused(
        &s,
        "clusterbinding",
        "consumer",
        ("clusterbindings", "status"),
    )
    .await;
    unregister(&s.consumer, "frozen-connection-status")
        .await
        .unwrap();
    unregister(&s.consumer, "frozen-binding-status")
        .await
        .unwrap();
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "w", 1).await;
    for reason in ["provider", "local_identity", "finalizer"] {
        assert_eq!(
            errors(&s, "connection", Some(reason)).await.unwrap(),
            0.0,
            "{reason}"
        );
    }
    for reason in ["provider", "finalizer"] {
        assert_eq!(
            errors(&s, "clusterbinding", Some(reason)).await.unwrap(),
            0.0,
            "{reason}"
        );
    }

    // 2. Updates of the objects themselves refused: removing kbind's finalizer fails once each
    // deletion has drained (4). Until then the deletions wait — the Connection for its
    // ClusterBinding, the ClusterBinding for a provider copy held by a provider finalizer —
    // and a wait counts nothing.
    deny(&s, &hook, "frozen-connections", "connections").await;
    deny(&s, &hook, "frozen-bindings", "clusterbindings").await;
    let provider_widgets = widgets(&s.provider, "team-a");
    merge_patch(
        &provider_widgets,
        "w",
        &json!({ "metadata": { "finalizers": ["example.org/hold"] } }),
    )
    .await;
    let connection_before = errors(&s, "connection", None).await.unwrap();
    Api::<Connection>::all(s.consumer.clone())
        .delete("provider", &DeleteParams::default())
        .await
        .unwrap();
    wait_draining_bindings(&s).await;

    // 3. The provider refuses to delete its copy (its own admission): `provider` errors of the
    // ClusterBinding, exactly the refused deletes the provider's audit log has.
    kbind_e2e::webhook::register(
        &s.provider,
        "no-deletes",
        Some(&hook),
        &["DELETE"],
        "widgets",
        None,
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cluster_bindings: Api<ClusterBinding> = Api::all(s.consumer.clone());
    cluster_bindings
        .delete("widgets", &DeleteParams::default())
        .await
        .unwrap();
    wait_errors_equal(
        &s,
        ("clusterbinding", "provider"),
        "provider deletes",
        || {
            s.env
                .cluster("provider")
                .audited()
                .iter()
                .filter(|r| r.resource == "widgets" && r.verb == "delete" && r.code == 403)
                .count() as f64
        },
    )
    .await;
    unregister(&s.provider, "no-deletes").await.unwrap();
    wait_draining_objects(&cluster_bindings).await;
    // Both drains are rechecked every 2 s: a few rounds each.
    let binding_before = errors(&s, "clusterbinding", None).await.unwrap();
    tokio::time::sleep(Duration::from_secs(7)).await;
    wait_draining_objects(&cluster_bindings).await;
    wait_draining_bindings(&s).await;
    assert_eq!(
        errors(&s, "connection", None).await.unwrap(),
        connection_before,
        "a Connection waiting for its bindings is not a failed reconcile"
    );
    assert_eq!(
        errors(&s, "clusterbinding", None).await.unwrap(),
        binding_before,
        "a ClusterBinding waiting for its provider copies is not a failed reconcile"
    );

    // 4. The provider lets its copy go: the ClusterBinding's finalizer removal is refused.
    merge_patch(
        &provider_widgets,
        "w",
        &json!({ "metadata": { "finalizers": null } }),
    )
    .await;
    wait_errors_equal_refused(&s, "clusterbinding", "finalizer", ("clusterbindings", "")).await;
    unregister(&s.consumer, "frozen-bindings").await.unwrap();
    wait_for("the ClusterBinding to go", 60, || async {
        let gone = cluster_bindings
            .get_opt("widgets")
            .await
            .map_err(|e| e.to_string())?
            .is_none();
        Ok(gone.then_some(()))
    })
    .await;
    // Then the Connection's.
    wait_errors_equal_refused(&s, "connection", "finalizer", ("connections", "")).await;
    unregister(&s.consumer, "frozen-connections").await.unwrap();
    wait_for("the Connection to go", 60, || async {
        let gone = Api::<Connection>::all(s.consumer.clone())
            .get_opt("provider")
            .await
            .map_err(|e| e.to_string())?
            .is_none();
        Ok(gone.then_some(()))
    })
    .await;
    assert_eq!(
        errors(&s, "connection", Some("consumer")).await.unwrap(),
        refused(&s, "connections", "status"),
        "no other consumer failure of the Connection"
    );
    drop(hook);
}

#[tokio::test]
async fn an_unreadable_consumer_identity_is_a_local_identity_error_per_refused_read() {
    // The schema manager runs as a consumer user that may do everything kbind needs except read
    // the consumer's identity (CONN-5: kcp's LogicalCluster `cluster`, else the `kube-system`
    // Namespace's UID; the README's RBAC grants both gets). Each refused read is one
    // `local_identity` failure of the Connection; granted the reads, the Connection becomes
    // Ready and the count stops.
    let Pair {
        mut env,
        consumer,
        provider,
    } = Pair::start("reconcile_errors_identity", &[]).await;
    install_crd(&provider, &widget_crd()).await.unwrap();
    for namespace in [KBIND_NAMESPACE, SECRET_NAMESPACE] {
        ensure_namespace(&consumer, namespace).await.unwrap();
    }
    let cluster = env.cluster("consumer");
    let user = cluster.mint_user("manager").await.unwrap();
    let mut everything_else: Vec<_> = [
        GROUP,
        "apiextensions.k8s.io",
        "coordination.k8s.io",
        "events.k8s.io",
        "example.org",
    ]
    .into_iter()
    .map(|group| rule(group, &["*"], &["*"]))
    .collect();
    everything_else.push(rule("", &["secrets", "configmaps", "events"], &["*"]));
    everything_else.push(rule("", &["namespaces"], &["list", "watch"]));
    cluster
        .grant(&user, "manager", everything_else)
        .await
        .unwrap();
    let kubeconfig = env.dir().join("manager.kubeconfig");
    std::fs::write(&kubeconfig, &user.kubeconfig).unwrap();
    let manager = Component::SchemaManager
        .start_built(
            &mut env,
            &Build::Current,
            &kubeconfig,
            "schema-manager",
            &["--leader-elect=false"],
        )
        .unwrap();
    let provider_kubeconfig = env.cluster("provider").admin_kubeconfig();
    apply_manifest(&consumer, &one_file(&provider_kubeconfig, &[0, 1]))
        .await
        .unwrap();
    let errors = || async {
        let text = manager.metrics().await?;
        Ok::<_, String>(metric_sum(
            &text,
            "kbind_reconcile_errors_total",
            &[("controller", "connection"), ("reason", "local_identity")],
        ))
    };
    let refused = || {
        env.cluster("consumer")
            .audited()
            .iter()
            .filter(|r| {
                r.user == user.username
                    && r.verb == "get"
                    && ((r.resource == "namespaces" && r.name == "kube-system")
                        || (r.resource == "logicalclusters" && r.name == "cluster"))
                    && r.code == 403
            })
            .count() as f64
    };
    let settled = || async {
        let first = errors().await?;
        let refused = refused();
        let again = errors().await?;
        if first == again && first == refused {
            Ok(first)
        } else {
            Err(format!(
                "{first} then {again} local_identity errors, {refused} refused reads"
            ))
        }
    };
    wait_for(
        "local_identity errors equal to the refused identity reads",
        90,
        || async {
            let count = settled().await?;
            Ok((count >= 2.0).then_some(()))
        },
    )
    .await;
    env.cluster("consumer")
        .grant(&user, "manager-identity", identity_rules())
        .await
        .unwrap();
    wait_connection(&consumer, "provider", "Ready=True").await;
    let after = settled().await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        settled().await.unwrap(),
        after,
        "no failure once the identity is read"
    );
    for reason in ["consumer", "provider", "finalizer"] {
        let text = manager.metrics().await.unwrap();
        let labels = [("controller", "connection"), ("reason", reason)];
        assert_eq!(
            metric_sum(&text, "kbind_reconcile_errors_total", &labels),
            0.0,
            "{reason}"
        );
    }
}

#[tokio::test]
async fn a_replica_that_cannot_renew_its_membership_writes_nothing_and_rejoins_once() {
    // The consumer's admission refuses the syncer's membership Lease renewals (a webhook on
    // Leases in kbind's namespace) while a Widget changes five times a second. Within 2/3 of the
    // Lease duration (and the 1 s recheck) the replica stops writing: the provider's audit log
    // shows no write of the Widget from then until renewals are allowed again; meanwhile it
    // lapses once and retries at its renewal interval, not every second; then it rejoins and the
    // latest spec arrives.
    let mut s = SyncEnv::start("reconcile_errors_fenced", &[0, 1, 2], None).await;
    // 24 s: renewals every 6 s, the fence at 16 s.
    s.restart_syncer("syncer-0-fenced", &["--membership-lease-duration=24s"])
        .await;
    s.syncer.wait_ready("the restarted syncer", 60).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "w", 1).await;
    let provider_writes = || {
        s.env
            .cluster("provider")
            .audited()
            .iter()
            .filter(|r| {
                r.resource == "widgets"
                    && r.subresource.is_empty()
                    && r.name == "w"
                    && r.code < 300
                    && matches!(r.verb.as_str(), "create" | "update" | "patch" | "delete")
            })
            .count()
    };
    let refused_renewals = || {
        s.env
            .cluster("consumer")
            .audited()
            .iter()
            .filter(|r| {
                r.resource == "leases" && r.name == "kbind-syncer-syncer-0" && r.code == 403
            })
            .count()
    };

    let consumer_widgets = widgets(&s.consumer, "team-a");
    let churn = {
        let widgets = consumer_widgets.clone();
        tokio::spawn(async move {
            for size in 2.. {
                let patch = json!({ "spec": { "size": size } });
                let _ = widgets
                    .patch("w", &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let hook = DenyingWebhook::start(403, "membership renewals are frozen")
        .await
        .unwrap();
    register_in(
        &s.consumer,
        "frozen-membership",
        Some(&hook),
        &["CREATE", "UPDATE"],
        "coordination.k8s.io",
        "leases",
        Some(("kubernetes.io/metadata.name", KBIND_NAMESPACE)),
    )
    .await
    .unwrap();
    let frozen_at = std::time::Instant::now();
    // Loaded by the API server within a second: from then on no renewal succeeds, so the fence is
    // up at 16 s and the workers stopped a second later at the latest.
    tokio::time::sleep(Duration::from_secs(19)).await;
    let writes_fenced = provider_writes();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        provider_writes(),
        writes_fenced,
        "a fenced replica writes nothing to the provider"
    );
    unregister(&s.consumer, "frozen-membership").await.unwrap();
    let frozen = frozen_at.elapsed().as_secs_f64();
    churn.abort();
    let _ = churn.await;
    // Renewals every 6 s, and a few at once when its units change (stopping, the lapse cleaned
    // up); before: a new lapse and a refused renewal every second after the first lapse.
    let refused = refused_renewals();
    assert!(refused >= 2, "{refused} refused renewals");
    assert!(
        (refused as f64) <= frozen / 6.0 + 4.0,
        "{refused} refused renewals in {frozen:.0} s"
    );
    let log = std::fs::read_to_string(s.env.dir().join("syncer-0-fenced.log")).unwrap();
    assert_eq!(
        log.matches("the membership Lease lapsed").count(),
        1,
        "one lapse per outage"
    );
    let latest = consumer_widgets.get("w").await.unwrap().data["spec"]["size"].clone();
    let provider_widgets = widgets(&s.provider, "team-a");
    wait_for(
        "the latest spec upstream after the replica rejoins",
        90,
        || async {
            let copy = provider_widgets.get("w").await.map_err(|e| e.to_string())?;
            Ok((copy.data["spec"]["size"] == latest).then_some(()))
        },
    )
    .await;
    assert!(provider_writes() > writes_fenced);
    drop(hook);
}
