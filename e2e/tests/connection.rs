//! The Connection lifecycle on two real clusters, with `kbind-schema-manager` as a real process
//! (REFERENCE-BEHAVIOUR §4 CONN, §5 ID, §6 DISC, §8 CDEL, §11 HB).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Secret};
use kbind_e2e::cluster::{User, ensure_namespace};
use kbind_e2e::fixtures::*;
use kbind_e2e::forward::{Forward, port_of};
use kbind_e2e::kbind::{apiserver_requests, grown};
use kbind_e2e::wait::wait_gone;
use kbind_e2e::{TestEnv, eventually};
use kbind_shared::api::{ActiveSchemaSource, Binding, BindingSpec, Connection, SchemaSource};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

/// A consumer with kbind's CRDs and a running schema manager, and a provider.
struct Setup {
    env: TestEnv,
    consumer: Client,
    provider: Client,
    manager: Program,
}

async fn setup(test: &str, extra_clusters: &[&str]) -> Setup {
    setup_with(test, extra_clusters, &[]).await
}

async fn setup_with(test: &str, extra_clusters: &[&str], manager_args: &[&str]) -> Setup {
    let Pair {
        mut env,
        consumer,
        provider,
    } = Pair::start(test, extra_clusters).await;
    let manager = start_lone_schema_manager(&mut env, manager_args).await;
    Setup {
        env,
        consumer,
        provider,
        manager,
    }
}

/// Puts the Secret `p` on the consumer: `cluster`'s admin kubeconfig.
async fn admin_secret(s: &Setup, cluster: &str) {
    let kubeconfig = s.env.cluster(cluster).admin_kubeconfig();
    put_secret(&s.consumer, "p", "kubeconfig", kubeconfig.as_bytes())
        .await
        .unwrap();
}

/// The provider's admin kubeconfig in the Secret `p`, then `connection` (which names it): the
/// Connection once it is Ready.
async fn connect_ready(s: &Setup, connection: &Connection) -> Connection {
    admin_secret(s, "provider").await;
    create_connection(&s.consumer, connection).await.unwrap();
    wait_connection(&s.consumer, &connection.name_any(), "Ready=True").await
}

async fn granted_user(env: &TestEnv, name: &str) -> User {
    let provider = env.cluster("provider");
    let user = provider.mint_user(name).await.unwrap();
    provider
        .grant(&user, name, connection_rules())
        .await
        .unwrap();
    user
}

/// The reads of a cluster identity source (ID-1) the provider served while `at_rest` ran.
async fn identity_reads_during(
    provider: &Client,
    at_rest: impl std::future::Future<Output = ()>,
) -> std::collections::BTreeMap<String, u64> {
    let before = apiserver_requests(provider).await.unwrap();
    at_rest.await;
    let after = apiserver_requests(provider).await.unwrap();
    let mut reads = grown(&before, &after);
    reads.retain(|key, _| {
        key.starts_with("GET ")
            && (key.contains("/namespaces ") || key.contains("/logicalclusters "))
    });
    reads
}

#[tokio::test]
async fn connection_before_its_secret_becomes_ready_and_pins_both_identities() {
    // GEN-5, CONN-2, CONN-3, CONN-6, ID-1
    let s = setup("conn_before_secret", &[]).await;
    create_connection(
        &s.consumer,
        &connection("provider", "provider-kubeconfig", SchemaSource::Auto),
    )
    .await
    .unwrap();
    let c = wait_connection(&s.consumer, "provider", "SecretValid=False/SecretNotFound").await;
    let ready = kbind_shared::conditions::find(&c.status.as_ref().unwrap().conditions, "Ready")
        .unwrap()
        .clone();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "SecretNotFound")
    );
    assert!(
        ready
            .message
            .contains("Secret kbind/provider-kubeconfig not found"),
        "{}",
        ready.message
    );

    let kubeconfig = s.env.cluster("provider").admin_kubeconfig();
    put_secret(
        &s.consumer,
        "provider-kubeconfig",
        "kubeconfig",
        kubeconfig.as_bytes(),
    )
    .await
    .unwrap();
    let c = wait_connection(&s.consumer, "provider", "Ready=True/AsExpected").await;
    let status = c.status.unwrap();
    assert_eq!(
        status.remote_cluster_uid,
        uid_of_kube_system(&s.provider).await
    );
    assert_eq!(
        status.local_cluster_uid,
        uid_of_kube_system(&s.consumer).await
    );
    for type_ in ["SecretValid", "Connected"] {
        assert!(
            kbind_shared::conditions::is_true(&status.conditions, type_),
            "{type_}"
        );
    }
    let generation = c.metadata.generation;
    assert!(
        status
            .conditions
            .iter()
            .all(|c| c.observed_generation == generation)
    );

    // At rest the identity comes from a watch of `kube-system` (issue #15, goal 5): a few checks
    // (1 s interval) read no identity source.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let reads =
        identity_reads_during(&s.provider, tokio::time::sleep(Duration::from_secs(4))).await;
    assert!(reads.is_empty(), "identity reads at rest: {reads:?}");

    // CONN-2: both the Connection and its Secret carry the cleanup finalizer.
    assert!(
        c.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&"core.kbind.io/cleanup".to_owned())
    );
    let secret = Api::<Secret>::namespaced(s.consumer.clone(), "kbind")
        .get("provider-kubeconfig")
        .await
        .unwrap();
    assert!(
        secret
            .finalizers()
            .contains(&"core.kbind.io/cleanup".to_owned())
    );

    // Metrics and Events.
    let metrics = s.manager.metrics().await.unwrap();
    assert!(
        metrics.contains("kbind_connection_ready{connection=\"provider\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics
            .contains("kbind_api_requests_total{cluster=\"provider\",code=\"200\",verb=\"get\"}"),
        "{metrics}"
    );
    // The heartbeat's age, computed when scraped: renewed within the last intervals.
    let heartbeat = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("kbind_connection_heartbeat_age_seconds{connection=\"provider\"} ")
        })
        .and_then(|v| v.parse::<f64>().ok());
    assert!(
        heartbeat.is_some_and(|age| (0.0..30.0).contains(&age)),
        "{metrics}"
    );
    let events = Api::<Event>::namespaced(s.consumer.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap();
    let reasons: Vec<(String, String)> = events
        .items
        .iter()
        .filter(|e| e.involved_object.name.as_deref() == Some("provider"))
        .map(|e| {
            (
                e.type_.clone().unwrap_or_default(),
                e.reason.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert!(
        reasons.contains(&("Warning".into(), "SecretNotFound".into())),
        "{reasons:?}"
    );
    assert!(
        reasons.contains(&("Normal".into(), "AsExpected".into())),
        "{reasons:?}"
    );
}

#[tokio::test]
async fn kcp_like_provider_pins_its_logical_cluster_uid() {
    // ID-1, ID-2: a LogicalCluster named `cluster` wins over the kube-system Namespace.
    let s = setup("conn_kcp_identity", &[]).await;
    let mut logical = crd("logicalclusters", "core.kcp.io", "LogicalCluster", &[]);
    logical.spec.scope = "Cluster".into();
    logical.spec.versions[0].name = "v1alpha1".into();
    install_crd(&s.provider, &logical).await.unwrap();
    let resource = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("core.kcp.io", "v1alpha1", "LogicalCluster"),
        "logicalclusters",
    );
    let api: Api<kube::api::DynamicObject> = Api::all_with(s.provider.clone(), &resource);
    let object: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "core.kcp.io/v1alpha1", "kind": "LogicalCluster", "metadata": { "name": "cluster" }
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &object).await.unwrap();

    let c = connect_ready(&s, &connection("provider", "p", SchemaSource::Crd)).await;
    let status = c.status.unwrap();
    assert_eq!(
        Some(status.remote_cluster_uid.clone()),
        created.metadata.uid
    );
    assert_ne!(
        status.remote_cluster_uid,
        uid_of_kube_system(&s.provider).await
    );

    // At rest the LogicalCluster is watched, not read (issue #15, goal 5).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let reads =
        identity_reads_during(&s.provider, tokio::time::sleep(Duration::from_secs(4))).await;
    assert!(reads.is_empty(), "identity reads at rest: {reads:?}");

    // The LogicalCluster replaced (another logical cluster now behind the credential): its watch
    // shows the new UID and the Connection reports it against the pin. (Between the delete and
    // the create the provider's identity is `kube-system`'s, which is reported meanwhile.)
    api.delete("cluster", &DeleteParams::default())
        .await
        .unwrap();
    let recreated = api.create(&PostParams::default(), &object).await.unwrap();
    let new_uid = recreated.metadata.uid.unwrap();
    let connections: Api<Connection> = Api::all(s.consumer.clone());
    let c = eventually(
        "Connection provider ClusterIdentityChanged naming the new LogicalCluster",
        Duration::from_secs(30),
        || async {
            let c = connections
                .get("provider")
                .await
                .map_err(|e| e.to_string())?;
            let conds = c
                .status
                .as_ref()
                .map(|s| s.conditions.clone())
                .unwrap_or_default();
            let ready = kbind_shared::conditions::find(&conds, "Ready").cloned();
            Ok(ready
                .is_some_and(|r| {
                    r.status == "False"
                        && r.reason == "ClusterIdentityChanged"
                        && r.message.contains(&new_uid)
                })
                .then_some(c))
        },
    )
    .await
    .unwrap();
    assert_eq!(
        c.status.unwrap().remote_cluster_uid,
        status.remote_cluster_uid
    );
}

#[tokio::test]
async fn restricted_credentials_report_permission_denied() {
    // CONN-4 (and QRK-16 fixed: Connected=False too), CONN-7
    let s = setup("conn_forbidden", &[]).await;
    let provider = s.env.cluster("provider");
    let user = provider.mint_user("restricted").await.unwrap();
    put_secret(&s.consumer, "p", "kubeconfig", user.kubeconfig.as_bytes())
        .await
        .unwrap();
    create_connection(&s.consumer, &connection("provider", "p", SchemaSource::Crd))
        .await
        .unwrap();
    let c = wait_connection(&s.consumer, "provider", "PermissionDenied=True/Forbidden").await;
    let conds = c.status.unwrap().conditions;
    let connected = kbind_shared::conditions::find(&conds, "Connected").unwrap();
    assert_eq!(
        (connected.status.as_str(), connected.reason.as_str()),
        ("False", "Forbidden")
    );
    assert!(
        connected.message.contains("denied by RBAC"),
        "{}",
        connected.message
    );

    // Identity allowed, CRD list still denied: connected, but not Ready.
    provider
        .grant(&user, "identity-only", identity_rules())
        .await
        .unwrap();
    let c = wait_connection(&s.consumer, "provider", "Connected=True").await;
    let conds = c.status.unwrap().conditions;
    let ready = kbind_shared::conditions::find(&conds, "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "Forbidden")
    );
    assert!(
        ready.message.contains("CustomResourceDefinitions"),
        "{}",
        ready.message
    );
    assert!(kbind_shared::conditions::is_true(
        &conds,
        "PermissionDenied"
    ));

    // #38: the heartbeat is renewed as soon as the identity is verified, whether or not discovery
    // succeeds — with Lease rights alone (CRDs still denied), the Lease appears and is renewed.
    provider
        .grant(
            &user,
            "heartbeat-only",
            vec![
                rule("", &["namespaces"], &["create"]),
                rule(
                    "coordination.k8s.io",
                    &["leases"],
                    &["get", "create", "update", "patch"],
                ),
            ],
        )
        .await
        .unwrap();
    let local = uid_of_kube_system(&s.consumer).await;
    let leases: Api<Lease> = Api::namespaced(s.provider.clone(), "kbind");
    let lease_name = format!("provider-{}", &local[..10]);
    let renewed = |lease: Option<Lease>| lease.and_then(|l| l.spec?.renew_time).map(|t| t.0);
    let first = eventually("the heartbeat Lease", Duration::from_secs(15), || async {
        Ok(renewed(
            leases
                .get_opt(&lease_name)
                .await
                .map_err(|e| e.to_string())?,
        ))
    })
    .await
    .unwrap();
    eventually(
        "the heartbeat renewed while discovery is denied",
        Duration::from_secs(15),
        || async {
            let now = renewed(
                leases
                    .get_opt(&lease_name)
                    .await
                    .map_err(|e| e.to_string())?,
            );
            Ok(now.filter(|t| *t > first))
        },
    )
    .await
    .unwrap();
    let c = wait_connection(&s.consumer, "provider", "Ready=False/Forbidden").await;
    assert!(kbind_shared::conditions::is_true(
        &c.status.unwrap().conditions,
        "PermissionDenied"
    ));

    // With the full set of rules it becomes Ready and PermissionDenied clears.
    provider
        .grant(&user, "the-rest", connection_rules())
        .await
        .unwrap();
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    wait_connection(&s.consumer, "provider", "PermissionDenied=False").await;
}

/// CONN-6: the Connection reports the identity of the cluster `other` against the pin it keeps,
/// and writes nothing there (no heartbeat).
async fn reports_identity_changed_and_writes_nothing(
    s: &Setup,
    pinned: &kbind_shared::api::ConnectionStatus,
    other: &str,
) {
    let c = wait_connection(
        &s.consumer,
        "provider",
        "Connected=False/ClusterIdentityChanged",
    )
    .await;
    let status = c.status.unwrap();
    assert_eq!(status.remote_cluster_uid, pinned.remote_cluster_uid);
    assert_eq!(status.local_cluster_uid, pinned.local_cluster_uid);
    let ready = kbind_shared::conditions::find(&status.conditions, "Ready").unwrap();
    assert_eq!(ready.reason, "ClusterIdentityChanged");
    let other = s.env.cluster(other).admin_client().await.unwrap();
    let other_uid = uid_of_kube_system(&other).await;
    assert!(
        ready.message.contains(&other_uid) && ready.message.contains(&pinned.remote_cluster_uid),
        "{}",
        ready.message
    );

    // Nothing else happens: no heartbeat on the other cluster.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leases = Api::<Lease>::all(other)
        .list(&ListParams::default().labels("core.kbind.io/managed=true"))
        .await
        .unwrap();
    assert!(
        leases.items.is_empty(),
        "a heartbeat was written to the other cluster"
    );
}

#[tokio::test]
async fn secret_swapped_to_another_cluster_reports_identity_changed_and_keeps_the_pin() {
    // CONN-6, ID-3
    let s = setup("conn_identity_changed", &["other"]).await;
    let pinned = connect_ready(&s, &connection("provider", "p", SchemaSource::Crd))
        .await
        .status
        .unwrap();

    admin_secret(&s, "other").await;
    reports_identity_changed_and_writes_nothing(&s, &pinned, "other").await;
}

#[tokio::test]
async fn another_cluster_behind_the_same_address_and_credential_is_noticed_by_the_identity_watch() {
    // CONN-6 with the credential unchanged: the address it names now reaches another cluster
    // (same certificate, same token). The periodic check is 300 s away; the identity watch's
    // fresh list after its connection broke is what notices (issue #15, goal 5).
    let mut s = setup_with(
        "conn_identity_behind_address",
        &[],
        &[
            "--discovery-interval=300s",
            "--binding-resync-interval=300s",
        ],
    )
    .await;
    s.env.start_twin("other", "provider").await.unwrap();
    let provider = s.env.cluster("provider");
    let forward = Forward::start(port_of(provider.server()).unwrap())
        .await
        .unwrap();
    let kubeconfig = provider
        .admin_kubeconfig()
        .replace(provider.server(), &forward.server());
    put_secret(&s.consumer, "p", "kubeconfig", kubeconfig.as_bytes())
        .await
        .unwrap();
    create_connection(&s.consumer, &connection("provider", "p", SchemaSource::Crd))
        .await
        .unwrap();
    let pinned = wait_connection(&s.consumer, "provider", "Ready=True")
        .await
        .status
        .unwrap();
    assert_eq!(
        pinned.remote_cluster_uid,
        uid_of_kube_system(&s.provider).await
    );

    let other = s.env.cluster("other").admin_client().await.unwrap();
    assert_ne!(uid_of_kube_system(&other).await, pinned.remote_cluster_uid);
    tokio::time::sleep(Duration::from_secs(1)).await;
    forward.switch(port_of(s.env.cluster("other").server()).unwrap());
    reports_identity_changed_and_writes_nothing(&s, &pinned, "other").await;

    // Back to the pinned cluster: Ready again, without any edit.
    forward.switch(port_of(s.env.cluster("provider").server()).unwrap());
    wait_connection(&s.consumer, "provider", "Ready=True").await;
}

#[tokio::test]
async fn a_credential_that_may_only_read_the_identity_connects_and_checks_it_by_reads() {
    // The identity watch needs list/watch on the identity objects; a credential allowed only to
    // GET them (the reference's RBAC) works as before: the identity is read at each check.
    let s = setup("conn_identity_get_only", &[]).await;
    let provider = s.env.cluster("provider");
    let user = provider.mint_user("get-only").await.unwrap();
    let mut rules: Vec<_> = connection_rules()
        .into_iter()
        .filter(|r| {
            !r.resources.as_ref().is_some_and(|rs| {
                rs.iter()
                    .any(|r| r == "namespaces" || r == "logicalclusters")
            })
        })
        .collect();
    rules.push(rule("core.kcp.io", &["logicalclusters"], &["get"]));
    rules.push(rule("", &["namespaces"], &["get", "create"]));
    provider.grant(&user, "get-only", rules).await.unwrap();
    put_secret(&s.consumer, "p", "kubeconfig", user.kubeconfig.as_bytes())
        .await
        .unwrap();
    create_connection(&s.consumer, &connection("provider", "p", SchemaSource::Crd))
        .await
        .unwrap();
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    let reads =
        identity_reads_during(&s.provider, tokio::time::sleep(Duration::from_secs(4))).await;
    assert!(
        reads.keys().any(|k| k.starts_with("GET /namespaces ")),
        "the identity is read at each check: {reads:?}"
    );
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    let log = std::fs::read_to_string(s.env.process_ref(s.manager.index).log()).unwrap();
    assert!(
        log.contains("watching the provider's identity is not allowed"),
        "the schema manager says why it reads"
    );
}

#[tokio::test]
async fn rotated_credentials_are_used_without_restart_and_the_old_token_can_be_revoked() {
    // LIM-1 improved: the provider client is rebuilt when the Secret's data changes.
    let s = setup("conn_rotation", &[]).await;
    let old = granted_user(&s.env, "old-credential").await;
    put_secret(&s.consumer, "p", "kubeconfig", old.kubeconfig.as_bytes())
        .await
        .unwrap();
    create_connection(&s.consumer, &connection("provider", "p", SchemaSource::Crd))
        .await
        .unwrap();
    wait_connection(&s.consumer, "provider", "Ready=True").await;

    let new = granted_user(&s.env, "new-credential").await;
    put_secret(&s.consumer, "p", "kubeconfig", new.kubeconfig.as_bytes())
        .await
        .unwrap();
    // Give the schema manager a moment to pick up the new data, then revoke the old token.
    tokio::time::sleep(Duration::from_secs(3)).await;
    Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(
        s.provider.clone(),
        &old.namespace,
    )
    .delete(&old.service_account, &DeleteParams::default())
    .await
    .unwrap();

    // The heartbeat keeps being renewed, so the provider is reached with the new credential.
    let local = uid_of_kube_system(&s.consumer).await;
    let leases: Api<Lease> = Api::namespaced(s.provider.clone(), "kbind");
    let lease_name = format!("provider-{}", &local[..10]);
    let renewed = |lease: Lease| lease.spec.and_then(|s| s.renew_time).map(|t| t.0);
    let first = renewed(leases.get(&lease_name).await.unwrap()).unwrap();
    eventually(
        "the heartbeat to be renewed after revocation",
        Duration::from_secs(15),
        || async {
            let now = renewed(leases.get(&lease_name).await.map_err(|e| e.to_string())?);
            Ok(now.filter(|t| *t > first + jiff::SignedDuration::from_secs(2)))
        },
    )
    .await
    .unwrap();
    let c = wait_connection(&s.consumer, "provider", "Ready=True").await;
    assert!(kbind_shared::conditions::is_true(
        &c.status.unwrap().conditions,
        "Connected"
    ));
}

#[tokio::test]
async fn export_label_must_be_exactly_true_and_new_exports_appear_within_an_interval() {
    // DISC-1, DISC-5, DISC-6, KEY-1
    let s = setup("conn_exports", &[]).await;
    install_crd(
        &s.provider,
        &crd(
            "widgets",
            "example.org",
            "Widget",
            &[("core.kbind.io/exported", "True")],
        ),
    )
    .await
    .unwrap();
    install_crd(&s.provider, &crd("gadgets", "example.org", "Gadget", &[]))
        .await
        .unwrap();
    let c = connect_ready(&s, &connection("provider", "p", SchemaSource::Crd)).await;
    assert!(
        c.status.unwrap().exported_apis.is_empty(),
        "\"True\" is not \"true\""
    );

    label_crd(
        &s.provider,
        "gadgets.example.org",
        "core.kbind.io/exported",
        Some("true"),
    )
    .await
    .unwrap();
    let exported = exported_names(&s.consumer, |names| names == ["gadgets.example.org"]).await;
    assert_eq!(exported, ["gadgets.example.org"]);
    let metrics = s.manager.metrics().await.unwrap();
    assert!(
        metrics.contains("kbind_connection_exported_apis{connection=\"provider\"} 1"),
        "{metrics}"
    );

    label_crd(
        &s.provider,
        "gadgets.example.org",
        "core.kbind.io/exported",
        None,
    )
    .await
    .unwrap();
    exported_names(&s.consumer, |names| names.is_empty()).await;
}

async fn exported_names(consumer: &Client, want: impl Fn(&[String]) -> bool) -> Vec<String> {
    let api: Api<Connection> = Api::all(consumer.clone());
    eventually("exportedAPIs", Duration::from_secs(15), || async {
        let c = api.get("provider").await.map_err(|e| e.to_string())?;
        let names: Vec<String> = c
            .status
            .unwrap_or_default()
            .exported_apis
            .into_iter()
            .map(|a| a.name)
            .collect();
        if want(&names) {
            Ok(Some(names))
        } else {
            Err(format!("exportedAPIs are {names:?}"))
        }
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn auto_falls_through_to_the_openapi_boundary_and_narrows_to_labelled_crds_and_marked_is_an_opt_in()
 {
    // DISC-2, DISC-3, DISC-4, API-C6 activeSchemaSource; #53.5: the OpenAPI source exports the
    // credential's discovery boundary (the seed's contract, what CRD-less providers need), `Auto`
    // narrows from OpenAPI to CRD once the provider labels exports, and `openAPIExports: Marked`
    // keeps #32.8's filter as an opt-in.
    let s = setup("conn_auto_source", &[]).await;
    install_crd(&s.provider, &crd("gadgets", "example.org", "Gadget", &[]))
        .await
        .unwrap();
    admin_secret(&s, "provider").await;
    create_connection(&s.consumer, &connection("auto", "p", SchemaSource::Auto))
        .await
        .unwrap();
    create_connection(&s.consumer, &connection("crd-only", "p", SchemaSource::Crd))
        .await
        .unwrap();
    create_connection(
        &s.consumer,
        &connection("openapi", "p", SchemaSource::OpenApi),
    )
    .await
    .unwrap();
    let mut marked = connection("marked", "p", SchemaSource::OpenApi);
    marked.spec.schema.openapi_exports = kbind_shared::api::OpenApiExports::Marked;
    create_connection(&s.consumer, &marked).await.unwrap();

    for name in ["auto", "openapi"] {
        let status = wait_connection(&s.consumer, name, "Ready=True")
            .await
            .status
            .unwrap();
        assert_eq!(
            status.active_schema_source,
            Some(ActiveSchemaSource::OpenApi),
            "{name}"
        );
        // The boundary: the unlabelled gadgets, and nothing built in.
        assert_eq!(status.exported_names(), ["gadgets.example.org"], "{name}");
    }
    let marked = wait_connection(&s.consumer, "marked", "Ready=True")
        .await
        .status
        .unwrap();
    assert!(
        marked.exported_apis.is_empty(),
        "Marked exports unmarked APIs: {:?}",
        marked.exported_names()
    );
    let crd_only = wait_connection(&s.consumer, "crd-only", "Ready=True")
        .await
        .status
        .unwrap();
    assert_eq!(crd_only.active_schema_source, Some(ActiveSchemaSource::Crd));
    assert!(crd_only.exported_apis.is_empty());

    install_crd(
        &s.provider,
        &crd(
            "widgets",
            "example.org",
            "Widget",
            &[("core.kbind.io/exported", "true")],
        ),
    )
    .await
    .unwrap();
    // Auto narrows to the labelled CRD; explicit OpenAPI keeps the boundary (both APIs); Marked
    // shows the marked one through OpenAPI; the CRD source sees it as well.
    let api: Api<Connection> = Api::all(s.consumer.clone());
    for (name, source, names) in [
        (
            "auto",
            ActiveSchemaSource::Crd,
            &["widgets.example.org"][..],
        ),
        (
            "openapi",
            ActiveSchemaSource::OpenApi,
            &["gadgets.example.org", "widgets.example.org"][..],
        ),
        (
            "marked",
            ActiveSchemaSource::OpenApi,
            &["widgets.example.org"][..],
        ),
        (
            "crd-only",
            ActiveSchemaSource::Crd,
            &["widgets.example.org"][..],
        ),
    ] {
        eventually(
            &format!("{name} to show {names:?} through {source:?}"),
            Duration::from_secs(15),
            || async {
                let status = api
                    .get(name)
                    .await
                    .map_err(|e| e.to_string())?
                    .status
                    .unwrap_or_default();
                let shows = status.exported_names() == names;
                Ok((status.active_schema_source == Some(source) && shows).then_some(()))
            },
        )
        .await
        .unwrap();
    }
}

#[tokio::test]
async fn heartbeat_lease_is_named_labelled_and_renewed_on_the_provider() {
    // HB-2, HB-3
    let s = setup("conn_heartbeat", &[]).await;
    let provider_cluster = s.env.cluster("provider");
    let kubeconfig = kbind_e2e::cluster::kubeconfig_yaml(
        "provider",
        provider_cluster.server(),
        provider_cluster.ca_pem(),
        // The admin token, with the context namespace set to team-a.
        provider_cluster.admin_token(),
        Some("team-a"),
    );
    put_secret(&s.consumer, "p", "kubeconfig", kubeconfig.as_bytes())
        .await
        .unwrap();
    create_connection(&s.consumer, &connection("provider", "p", SchemaSource::Crd))
        .await
        .unwrap();
    wait_connection(&s.consumer, "provider", "Ready=True").await;

    let local = uid_of_kube_system(&s.consumer).await;
    let leases: Api<Lease> = Api::namespaced(s.provider.clone(), "team-a");
    let name = format!("provider-{}", &local[..10]);
    let lease = eventually("the heartbeat Lease", Duration::from_secs(10), || async {
        leases.get_opt(&name).await.map_err(|e| e.to_string())
    })
    .await
    .unwrap();
    assert_eq!(label(&lease, "core.kbind.io/managed"), Some("true"));
    assert_eq!(
        lease
            .annotations()
            .get("core.kbind.io/consumer-cluster-uid"),
        Some(&local)
    );
    assert_eq!(
        annotation(&lease, "core.kbind.io/connection"),
        Some("provider")
    );
    let spec = lease.spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(local.as_str()));
    assert_eq!(spec.lease_duration_seconds, Some(60));
    let (acquired, renewed) = (spec.acquire_time.unwrap().0, spec.renew_time.unwrap().0);

    let later = eventually(
        "the heartbeat to be renewed",
        Duration::from_secs(10),
        || async {
            let spec = leases
                .get(&name)
                .await
                .map_err(|e| e.to_string())?
                .spec
                .unwrap();
            Ok(spec
                .renew_time
                .as_ref()
                .is_some_and(|t| t.0 > renewed)
                .then_some(spec))
        },
    )
    .await
    .unwrap();
    assert_eq!(
        later.acquire_time.unwrap().0,
        acquired,
        "acquireTime is set only once"
    );
    assert!(ensure_namespace(&s.provider, "team-a").await.is_ok());
}

#[tokio::test]
async fn deleting_a_connection_drains_bindings_then_releases_finalizers_and_keeps_the_secret() {
    // CDEL-1 … CDEL-5, CONN-15
    let s = setup("conn_delete", &[]).await;
    connect_ready(&s, &connection("provider", "p", SchemaSource::Crd)).await;

    let mut binding = Binding::new(
        "widgets",
        BindingSpec::new("provider", &["widgets.example.org"]),
    );
    binding.metadata.namespace = Some("default".into());
    let bindings: Api<Binding> = Api::namespaced(s.consumer.clone(), "default");
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();

    let connections: Api<Connection> = Api::all(s.consumer.clone());
    connections
        .delete("provider", &DeleteParams::default())
        .await
        .unwrap();
    let c = wait_connection(&s.consumer, "provider", "Ready=False/DrainingBindings").await;
    let message = kbind_shared::conditions::find(&c.status.unwrap().conditions, "Ready")
        .unwrap()
        .message
        .clone();
    assert!(message.contains("1 binding"), "{message}");
    let secrets: Api<Secret> = Api::namespaced(s.consumer.clone(), "kbind");
    assert!(
        secrets
            .get("p")
            .await
            .unwrap()
            .finalizers()
            .contains(&"core.kbind.io/cleanup".to_owned())
    );

    // The heartbeat Lease says how often it is renewed (the schema manager's
    // --discovery-interval=1s here).
    let local = uid_of_kube_system(&s.consumer).await;
    let leases: Api<Lease> = Api::namespaced(s.provider.clone(), "kbind");
    let lease_name = format!("provider-{}", &local[..10]);
    let lease = leases.get(&lease_name).await.unwrap();
    assert_eq!(
        annotation(&lease, "core.kbind.io/heartbeat-interval-seconds"),
        Some("1")
    );
    assert_eq!(annotation(&lease, "core.kbind.io/disconnected"), None);

    bindings
        .delete("widgets", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&connections, "provider", "the Connection to be gone", 20).await;
    // #38: it left cleanly — the Lease says so, after its last renewal.
    let lease = leases.get(&lease_name).await.unwrap();
    let disconnected: jiff::Timestamp = annotation(&lease, "core.kbind.io/disconnected")
        .expect("the Lease is marked disconnected")
        .parse()
        .unwrap();
    let last_renewal = lease.spec.unwrap().renew_time.unwrap().0;
    assert!(
        disconnected >= last_renewal,
        "{disconnected} < {last_renewal}"
    );
    let secret = secrets.get("p").await.expect("the Secret is never deleted");
    assert!(
        !secret
            .finalizers()
            .contains(&"core.kbind.io/cleanup".to_owned())
    );
}

/// The password of the proxy in the `proxied` case: it must never be repeated.
const PROXY_PASSWORD: &str = "pr0xy-pa55w0rd";

#[tokio::test]
async fn bad_credentials_each_get_a_clear_condition_and_nothing_crashes() {
    // CONN-3, CONN-4; INTERFACES.md: no panics on cluster data, no Secret contents in conditions.
    let mut s = setup("conn_bad_input", &["other"]).await;
    let provider = s.env.cluster("provider");
    let good = provider.admin_kubeconfig();
    let token = provider.admin_token().to_owned();
    let ca = provider.ca_pem().to_owned();
    let unreachable = kbind_e2e::cluster::kubeconfig_yaml(
        "p",
        &format!("https://127.0.0.1:{}", kbind_e2e::cluster::free_port()),
        &ca,
        &token,
        None,
    );
    let wrong_ca = kbind_e2e::cluster::kubeconfig_yaml(
        "p",
        provider.server(),
        s.env.cluster("other").ca_pem(),
        &token,
        None,
    );
    let bad_token =
        kbind_e2e::cluster::kubeconfig_yaml("p", provider.server(), &ca, "not-a-valid-token", None);
    let file_ref = good.replace(
        "    token: ",
        "    tokenFile: /var/run/secrets/token\n    x-old-token: ",
    );
    let exec = good.replace("    token: ", "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: get-token\n    x-old-token: ");
    let no_context = good.replace("current-context: provider\n", "");
    let dangling_context = good.replace(
        "current-context: provider\n",
        "current-context: elsewhere\n",
    );
    let auth_provider = good.replace(
        "    token: ",
        "    auth-provider:\n      name: oidc\n    x-old-token: ",
    );
    let insecure_tls =
        kbind_e2e::cluster::kubeconfig_yaml("p", provider.server(), &ca, &token, None).replace(
            "    certificate-authority-data: ",
            "    insecure-skip-tls-verify: true\n    x-ca: ",
        );
    let plain_http = kbind_e2e::cluster::kubeconfig_yaml(
        "p",
        &provider.server().replacen("https://", "http://", 1),
        &ca,
        &token,
        None,
    );
    // A proxy with credentials in its URL: they never appear in a condition or a log.
    let proxied = kbind_e2e::cluster::kubeconfig_yaml("p", provider.server(), &ca, &token, None)
        .replace(
            "    certificate-authority-data: ",
            &format!(
                "    proxy-url: http://kbind-proxy-user:{PROXY_PASSWORD}@127.0.0.1:{}\n    certificate-authority-data: ",
                kbind_e2e::cluster::free_port()
            ),
        );

    // (name, secret key, secret data, condition type, reason, message fragment)
    type Case<'a> = (&'a str, &'a str, Vec<u8>, &'a str, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (
            "missing-key",
            "config",
            good.clone().into_bytes(),
            "SecretValid",
            "SecretNotFound",
            "has no key `kubeconfig`",
        ),
        (
            "empty",
            "kubeconfig",
            Vec::new(),
            "SecretValid",
            "SecretNotFound",
            "is empty",
        ),
        (
            "not-yaml",
            "kubeconfig",
            format!("{token}: [unclosed").into_bytes(),
            "SecretValid",
            "SecretNotFound",
            "not a valid kubeconfig",
        ),
        (
            "no-context",
            "kubeconfig",
            no_context.into_bytes(),
            "SecretValid",
            "SecretNotFound",
            "no current-context",
        ),
        (
            "file-reference",
            "kubeconfig",
            file_ref.into_bytes(),
            "SecretValid",
            "SecretNotFound",
            "users[provider].user.tokenFile refers to a file",
        ),
        (
            "exec-plugin",
            "kubeconfig",
            exec.into_bytes(),
            "SecretValid",
            "SecretNotFound",
            "users[provider].user.exec uses a credential plugin",
        ),
        (
            "dangling-context",
            "kubeconfig",
            dangling_context.into_bytes(),
            "SecretValid",
            "SecretNotFound",
            "context \"elsewhere\" is not defined",
        ),
        (
            "auth-provider",
            "kubeconfig",
            auth_provider.into_bytes(),
            "SecretValid",
            "SecretNotFound",
            "users[provider].user.auth-provider uses a credential plugin",
        ),
        (
            "insecure-tls",
            "kubeconfig",
            insecure_tls.into_bytes(),
            "SecretValid",
            "SecretNotFound",
            "insecure-skip-tls-verify: true; kbind refuses insecure transport",
        ),
        (
            "plain-http",
            "kubeconfig",
            plain_http.into_bytes(),
            "SecretValid",
            "SecretNotFound",
            "an http:// server; kbind refuses insecure transport",
        ),
        (
            "proxied",
            "kubeconfig",
            proxied.into_bytes(),
            "SecretValid",
            "SecretNotFound",
            "clusters[p].cluster.proxy-url is not supported",
        ),
        (
            "unreachable",
            "kubeconfig",
            unreachable.into_bytes(),
            "Connected",
            "Pending",
            "Connection refused",
        ),
        (
            "wrong-ca",
            "kubeconfig",
            wrong_ca.into_bytes(),
            "Connected",
            "Pending",
            "certificate",
        ),
        (
            "bad-token",
            "kubeconfig",
            bad_token.into_bytes(),
            "Connected",
            "Pending",
            "Unauthorized (HTTP 401)",
        ),
    ];
    for (name, key, data, ..) in &cases {
        put_secret(&s.consumer, name, key, data).await.unwrap();
        create_connection(&s.consumer, &connection(name, name, SchemaSource::Crd))
            .await
            .unwrap();
    }
    for (name, _, _, type_, reason, fragment) in &cases {
        let c = wait_condition(&s.consumer, name, type_, "False", Some(reason))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let status = c.status.unwrap();
        let ready = kbind_shared::conditions::find(&status.conditions, "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", *reason),
            "{name}"
        );
        eprintln!("{name}: Ready=False {reason}: {}", ready.message);
        assert!(
            ready.message.contains(fragment),
            "{name}: {}",
            ready.message
        );
        for condition in &status.conditions {
            assert!(
                !condition.message.contains(&token) && !condition.message.contains(PROXY_PASSWORD),
                "{name}: a credential leaked into {}",
                condition.type_
            );
        }
        assert!(
            status.remote_cluster_uid.is_empty(),
            "{name}: nothing is pinned"
        );
    }
    // Nothing deleted, nothing crashed.
    let secrets: Api<Secret> = Api::namespaced(s.consumer.clone(), "kbind");
    assert_eq!(
        secrets
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        cases.len()
    );
    assert!(
        s.env.process(s.manager.index).try_status().is_none(),
        "the schema manager exited"
    );
    let log = std::fs::read_to_string(s.env.process(s.manager.index).log()).unwrap();
    assert!(!log.contains(&token), "the token leaked into the log");
    assert!(
        !log.contains(PROXY_PASSWORD),
        "the proxy password leaked into the log"
    );
    assert!(!log.contains("panicked"), "the schema manager panicked");
}

#[tokio::test]
async fn auto_bind_maintains_a_cluster_binding_named_after_the_connection() {
    // AUTO-1, AUTO-3 (deleting only a ClusterBinding the Connection controls, and only once the
    // exports have been missing for the grace period)
    let s = setup_with("conn_autobind", &[], &["--autobind-grace-period=3s"]).await;
    install_crd(
        &s.provider,
        &crd(
            "widgets",
            "example.org",
            "Widget",
            &[("core.kbind.io/exported", "true")],
        ),
    )
    .await
    .unwrap();
    let mut auto = connection("provider", "p", SchemaSource::Crd);
    auto.spec.auto_bind = true;
    let owner_uid = connect_ready(&s, &auto).await.metadata.uid;

    let bindings: Api<kbind_shared::api::ClusterBinding> = Api::all(s.consumer.clone());
    let apis = |b: &kbind_shared::api::ClusterBinding| {
        b.spec
            .apis
            .iter()
            .map(|a| a.name.clone())
            .collect::<Vec<_>>()
    };
    let binding = eventually(
        "the autoBind ClusterBinding",
        Duration::from_secs(15),
        || async {
            bindings
                .get_opt("provider")
                .await
                .map_err(|e| e.to_string())
        },
    )
    .await
    .unwrap();
    assert_eq!(apis(&binding), ["widgets.example.org"]);
    assert_eq!(binding.spec.connection_ref.name, "provider");
    assert_eq!(label(&binding, "core.kbind.io/managed"), Some("true"));
    let owner = &binding.owner_references()[0];
    assert_eq!(
        (Some(owner.uid.clone()), owner.controller),
        (owner_uid, Some(true))
    );

    // A newly exported API is added without any user action (AUTO-2).
    install_crd(
        &s.provider,
        &crd(
            "gadgets",
            "example.org",
            "Gadget",
            &[("core.kbind.io/exported", "true")],
        ),
    )
    .await
    .unwrap();
    eventually(
        "the new export to be bound",
        Duration::from_secs(15),
        || async {
            let b = bindings.get("provider").await.map_err(|e| e.to_string())?;
            Ok((apis(&b) == ["gadgets.example.org", "widgets.example.org"]).then_some(()))
        },
    )
    .await
    .unwrap();

    // Turning autoBind off removes the ClusterBinding it owns (LIM-12); on again brings it back.
    let connections: Api<Connection> = Api::all(s.consumer.clone());
    for (auto_bind, present) in [(false, false), (true, true)] {
        connections
            .patch(
                "provider",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&json!({ "spec": { "autoBind": auto_bind } })),
            )
            .await
            .unwrap();
        eventually(
            &format!("autoBind={auto_bind}"),
            Duration::from_secs(15),
            || async {
                Ok((bindings
                    .get_opt("provider")
                    .await
                    .map_err(|e| e.to_string())?
                    .is_some()
                    == present)
                    .then_some(()))
            },
        )
        .await
        .unwrap();
    }

    // No exports left for longer than the grace: the ClusterBinding it controls is deleted
    // (AUTO-3).
    for name in ["widgets.example.org", "gadgets.example.org"] {
        label_crd(&s.provider, name, "core.kbind.io/exported", None)
            .await
            .unwrap();
    }
    wait_gone(
        &bindings,
        "provider",
        "the autoBind ClusterBinding to go",
        15,
    )
    .await;

    // Safe by default: a user's ClusterBinding that happens to have the Connection's name is
    // neither taken over by autoBind nor deleted with the Connection.
    let mine = kbind_shared::api::ClusterBinding::new(
        "provider",
        kbind_shared::api::ClusterBindingSpec {
            binding: binding_spec("someone-else", &["things.example.org"]),
        },
    );
    bindings
        .create(&PostParams::default(), &mine)
        .await
        .unwrap();
    let before = bindings.get("provider").await.unwrap();
    label_crd(
        &s.provider,
        "widgets.example.org",
        "core.kbind.io/exported",
        Some("true"),
    )
    .await
    .unwrap();
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = bindings.get("provider").await.unwrap();
    assert_eq!(
        (&after.spec, after.owner_references(), after.labels()),
        (&before.spec, before.owner_references(), before.labels()),
        "autoBind changed a user's ClusterBinding"
    );
    delete_connection(&s.consumer, "provider").await;
    assert!(
        bindings.get_opt("provider").await.unwrap().is_some(),
        "the Connection's deletion took a user's ClusterBinding with it"
    );
}

/// kbind's Connection CRD as the Go konnector's chart installs it: without the status fields only
/// kbind writes (`status.verifiedCredential` — the API server prunes it).
fn go_shaped_connection_crd()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    let mut crd = kbind_e2e::kbind::crd_manifests()
        .unwrap()
        .into_iter()
        .find(|c| c.metadata.name.as_deref() == Some("connections.core.kbind.io"))
        .unwrap();
    for version in &mut crd.spec.versions {
        let status = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .and_then(|s| s.properties.as_mut())
            .and_then(|p| p.get_mut("status"))
            .and_then(|s| s.properties.as_mut())
            .unwrap();
        assert!(status.remove("verifiedCredential").is_some());
    }
    crd
}

#[tokio::test]
async fn core_crds_that_drop_kbinds_fields_are_named_and_nothing_says_ready() {
    // #53.6: with the Go konnector's core CRDs installed, kbind's status writes lose
    // status.verifiedCredential and the syncer never starts; the Connection and its bindings must
    // say so instead of Ready — and recover once kbind's CRDs are installed.
    let s = SyncEnv::start("connection_core_crds", &[0, 1, 2], None).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "before", 1).await;

    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(s.consumer.clone());
    let apply = kube::api::PatchParams::apply("kbind-e2e").force();
    crds.patch(
        "connections.core.kbind.io",
        &apply,
        &kube::api::Patch::Apply(go_shaped_connection_crd()),
    )
    .await
    .unwrap();
    let connection =
        wait_connection(&s.consumer, "provider", "Ready=False/CoreSchemaOutdated").await;
    let ready =
        kbind_shared::conditions::find(&connection.status.unwrap_or_default().conditions, "Ready")
            .cloned()
            .unwrap();
    assert!(
        ready
            .message
            .contains("connections.core.kbind.io lacks status.verifiedCredential"),
        "{}",
        ready.message
    );
    let bindings: Api<kbind_shared::api::ClusterBinding> = Api::all(s.consumer.clone());
    let binding = wait_binding(&bindings, "widgets", "Ready=False").await;
    let message =
        kbind_shared::conditions::find(&binding.status.unwrap_or_default().conditions, "Ready")
            .map(|c| c.message.clone())
            .unwrap_or_default();
    assert!(message.contains("status.verifiedCredential"), "{message}");
    let metrics = s.manager.metrics().await.unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l == "kbind_connection_ready{connection=\"provider\"} 0"),
        "{metrics}"
    );

    // The doctor says so too, and is not satisfied.
    let kubeconfig = s.env.cluster("consumer").admin_kubeconfig_path();
    let doctor = plugin(&kubeconfig, &["doctor", "provider"]).await;
    assert_ne!(doctor.code, 0, "{doctor}");
    assert!(
        doctor
            .stdout
            .contains("PROBLEM: the core CRDs installed are not kbind's: connections.core.kbind.io lacks status.verifiedCredential"),
        "{doctor}"
    );

    let plan = plugin(&kubeconfig, &["migrate", "plan"]).await;
    assert!(
        plan.stdout.contains(
            "the core CRDs installed are not kbind's (connections.core.kbind.io lacks status.verifiedCredential)"
        ),
        "{plan}"
    );

    // kbind's CRDs again: Ready, and objects sync.
    kbind_e2e::kbind::install_crds(&s.consumer).await.unwrap();
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "after", 1).await;
    let doctor = plugin(&kubeconfig, &["doctor", "provider"]).await;
    assert!(!doctor.stdout.contains("PROBLEM"), "{doctor}");
}
