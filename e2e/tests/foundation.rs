//! Foundation on real clusters: two independent API servers, kbind's CRDs and their validation,
//! restricted users, and the two programs' process behaviour.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::PolicyRule;
use kbind_e2e::cluster::{client_for, free_port};
use kbind_e2e::kbind::{http_get, install_crds};
use kbind_e2e::{TestEnv, eventually};
use kbind_shared::api::{
    Binding, BindingSpec, Connection, ConnectionSpec, ConnectionStatus, KubeconfigSecretRef,
};
use kbind_shared::identity::{IdentityError, cluster_identity};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

fn connection(name: &str, secret: &str) -> Connection {
    Connection::new(
        name,
        ConnectionSpec {
            kubeconfig_secret_ref: KubeconfigSecretRef {
                namespace: "kbind".into(),
                name: secret.into(),
                key: "kubeconfig".into(),
            },
            schema: Default::default(),
            auto_bind: false,
            access: Default::default(),
            boundary: None,
        },
    )
}

fn binding(name: &str, apis: &[&str]) -> Binding {
    let mut b = Binding::new(name, BindingSpec::new("provider", apis));
    b.metadata.namespace = Some("default".into());
    b
}

/// The rejection message of an API call that must fail validation.
fn invalid(result: kube::Result<impl std::fmt::Debug>) -> String {
    match result {
        Err(kube::Error::Api(status)) if status.is_invalid() => status.message.clone(),
        other => panic!("expected the API server to reject this as Invalid, got {other:?}"),
    }
}

async fn consumer_with_crds(test: &str) -> (TestEnv, Client) {
    let env = TestEnv::start(test, &["consumer"])
        .await
        .expect("cluster starts");
    let client = env
        .cluster("consumer")
        .admin_client()
        .await
        .expect("admin client");
    install_crds(&client).await.expect("kbind CRDs install");
    (env, client)
}

#[tokio::test]
async fn two_clusters_are_independent_with_different_identities() {
    // ID-1: each cluster's identity is its kube-system Namespace UID (no kcp LogicalCluster here).
    let env = TestEnv::start("two_clusters", &["consumer", "provider"])
        .await
        .expect("clusters start");
    let consumer = env.cluster("consumer").admin_client().await.unwrap();
    let provider = env.cluster("provider").admin_client().await.unwrap();

    let consumer_uid = cluster_identity(&consumer)
        .await
        .expect("consumer identity");
    let provider_uid = cluster_identity(&provider)
        .await
        .expect("provider identity");
    assert_ne!(consumer_uid, provider_uid);
    let kube_system = Api::<Namespace>::all(consumer.clone())
        .get("kube-system")
        .await
        .unwrap();
    assert_eq!(
        kube_system.metadata.uid.as_deref(),
        Some(consumer_uid.as_str())
    );

    // Independent: an object created on one is not on the other.
    kbind_e2e::cluster::ensure_namespace(&consumer, "only-on-consumer")
        .await
        .unwrap();
    assert!(
        Api::<Namespace>::all(provider)
            .get_opt("only-on-consumer")
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn generated_crds_install_and_become_established() {
    let (_env, client) = consumer_with_crds("crds_established").await;
    let discovery = kube::Discovery::new(client).run().await.unwrap();
    let group = discovery
        .get("core.kbind.io")
        .expect("core.kbind.io is served");
    let mut kinds: Vec<String> = group
        .recommended_resources()
        .into_iter()
        .map(|(r, _)| r.kind)
        .collect();
    kinds.sort();
    assert_eq!(kinds, ["Binding", "ClusterBinding", "Connection"]);
}

#[tokio::test]
async fn kubeconfig_secret_ref_is_immutable() {
    // API-C3
    let (_env, client) = consumer_with_crds("secret_ref_immutable").await;
    let connections: Api<Connection> = Api::all(client);
    let created = connections
        .create(&PostParams::default(), &connection("provider", "creds"))
        .await
        .unwrap();
    // Defaults are applied by the API server (API-C3, API-C4, API-C5).
    assert_eq!(created.spec.kubeconfig_secret_ref.key, "kubeconfig");
    assert_eq!(
        serde_json::to_value(&created.spec.schema).unwrap(),
        json!({"source": "Auto", "openAPIExports": "Boundary", "pullPolicy": "Bound", "updatePolicy": "Always"})
    );

    let patch = json!({"spec": {"kubeconfigSecretRef": {"namespace": "kbind", "name": "other"}}});
    let message = invalid(
        connections
            .patch("provider", &PatchParams::default(), &Patch::Merge(&patch))
            .await,
    );
    assert!(
        message.contains("kubeconfigSecretRef is immutable"),
        "{message}"
    );

    // The Secret data may change, and the rest of the spec stays mutable.
    let patch = json!({"spec": {"autoBind": true, "schema": {"source": "CRD"}}});
    connections
        .patch("provider", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("schema and autoBind are mutable");
}

#[tokio::test]
async fn pinned_cluster_uids_cannot_be_changed_or_dropped() {
    // API-C6, and better than the reference: dropping a pinned UID is rejected too.
    let (_env, client) = consumer_with_crds("pinned_uids").await;
    let connections: Api<Connection> = Api::all(client);
    connections
        .create(&PostParams::default(), &connection("provider", "creds"))
        .await
        .unwrap();

    let set_status = |status: serde_json::Value| {
        let connections = connections.clone();
        async move {
            connections
                .patch_status(
                    "provider",
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"status": status})),
                )
                .await
        }
    };
    // Setting from empty is allowed, and other status fields stay writable.
    set_status(json!({"remoteClusterUID": "uid-a", "localClusterUID": "uid-l"}))
        .await
        .expect("first pin");
    set_status(json!({"activeSchemaSource": "CRD"}))
        .await
        .expect("other status fields stay writable");

    let message = invalid(set_status(json!({"remoteClusterUID": "uid-b"})).await);
    assert!(
        message.contains("remoteClusterUID is immutable once set"),
        "{message}"
    );
    let message = invalid(set_status(json!({"localClusterUID": "uid-other"})).await);
    assert!(
        message.contains("localClusterUID is immutable once set"),
        "{message}"
    );
    let message = invalid(set_status(json!({"remoteClusterUID": null})).await);
    assert!(
        message.contains("remoteClusterUID is immutable once set"),
        "{message}"
    );

    let status: ConnectionStatus = connections
        .get_status("provider")
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(
        (
            status.remote_cluster_uid.as_str(),
            status.local_cluster_uid.as_str()
        ),
        ("uid-a", "uid-l")
    );
}

#[tokio::test]
async fn invalid_and_duplicate_api_names_are_rejected() {
    // API-B3, improving on QRK-2.
    let (_env, client) = consumer_with_crds("api_names").await;
    let bindings: Api<Binding> = Api::namespaced(client, "default");
    for bad in [
        "widgets",
        "Widgets.example.org",
        "widgets.example.org/v1",
        "widgets..org",
        "",
    ] {
        let message = invalid(
            bindings
                .create(&PostParams::default(), &binding("b", &[bad]))
                .await,
        );
        assert!(message.contains("spec.apis[0].name"), "{bad}: {message}");
    }
    let message = invalid(
        bindings
            .create(
                &PostParams::default(),
                &binding("b", &["widgets.example.org", "widgets.example.org"]),
            )
            .await,
    );
    assert!(message.contains("Duplicate value"), "{message}");
    let message = invalid(
        bindings
            .create(&PostParams::default(), &binding("b", &[]))
            .await,
    );
    assert!(message.contains("spec.apis"), "{message}");

    bindings
        .create(
            &PostParams::default(),
            &binding("b", &["widgets.example.org", "gadgets.v2.example.org"]),
        )
        .await
        .expect("well-formed, unique names are accepted");
}

#[tokio::test]
async fn restricted_user_is_forbidden_until_granted() {
    let env = TestEnv::start("restricted_user", &["provider"])
        .await
        .expect("cluster starts");
    let provider = env.cluster("provider");
    let user = provider.mint_user("alice").await.unwrap();
    let client = client_for(&user.kubeconfig).await.unwrap();

    // ID-1: a Forbidden identity read is reported, never skipped.
    match cluster_identity(&client).await {
        Err(IdentityError::Forbidden { .. }) => {}
        other => panic!("expected Forbidden, got {other:?}"),
    }

    // Both identity sources need `get`: RBAC is checked before the API server knows that the kcp
    // group does not exist, so a denied LogicalCluster read is Forbidden even here.
    let get = |group: &str, resource: &str| PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(vec![resource.into()]),
        verbs: vec!["get".into()],
        ..Default::default()
    };
    provider
        .grant(&user, "alice-namespaces", vec![get("", "namespaces")])
        .await
        .unwrap();
    match cluster_identity(&client).await {
        Err(IdentityError::Forbidden { source_name, .. }) => {
            assert_eq!(source_name, "LogicalCluster cluster")
        }
        other => panic!("expected Forbidden on the LogicalCluster, got {other:?}"),
    }
    provider
        .grant(
            &user,
            "alice-logicalclusters",
            vec![get("core.kcp.io", "logicalclusters")],
        )
        .await
        .unwrap();
    let uid = eventually(
        "the grant to take effect",
        Duration::from_secs(10),
        || async { Ok(cluster_identity(&client).await.ok()) },
    )
    .await
    .unwrap();
    assert_eq!(
        uid,
        cluster_identity(&provider.admin_client().await.unwrap())
            .await
            .unwrap()
    );
    // Still nothing it was not granted.
    let err = Api::<Namespace>::all(client)
        .list(&Default::default())
        .await
        .unwrap_err();
    assert!(matches!(err, kube::Error::Api(s) if s.is_forbidden()));
}

#[tokio::test]
async fn programs_serve_probes_and_metrics_and_exit_cleanly_on_sigterm() {
    // INTERFACES.md: /healthz, /readyz (caches synced), /metrics; SIGTERM exits 0 within 10 s,
    // also while still waiting for caches.
    let mut env = TestEnv::start("programs_probes", &["consumer"])
        .await
        .expect("cluster starts");
    let kubeconfig = env
        .cluster("consumer")
        .admin_kubeconfig_path()
        .display()
        .to_string();
    let mut started = Vec::new();
    let programs = [
        (
            "kbind-schema-manager",
            vec!["--leader-elect=false".to_owned()],
        ),
        ("kbind-syncer", vec!["--identity=syncer-0".to_owned()]),
        ("kbind-syncer", vec!["--identity=syncer-early".to_owned()]),
    ];
    for (i, (program, extra)) in programs.into_iter().enumerate() {
        let (metrics, probes) = (
            format!("127.0.0.1:{}", free_port()),
            format!("127.0.0.1:{}", free_port()),
        );
        let mut args = vec![
            format!("--kubeconfig={kubeconfig}"),
            format!("--metrics-bind-address={metrics}"),
            format!("--health-probe-bind-address={probes}"),
            "--log-format=json".to_owned(),
        ];
        args.extend(extra);
        let index = env
            .start_kbind(program, &format!("{program}-{i}"), &args, &[])
            .unwrap();
        started.push((program, index, metrics, probes));
    }
    // Without kbind's CRDs the syncer's caches cannot list: alive, not ready.
    let syncer_probes = started[1].3.clone();
    eventually("the syncer's /healthz", Duration::from_secs(30), || async {
        Ok(http_get(&syncer_probes, "/healthz")
            .await
            .ok()
            .filter(|(c, _)| *c == 200))
    })
    .await
    .unwrap();
    assert_eq!(http_get(&syncer_probes, "/readyz").await.unwrap().0, 503);
    // SIGTERM while still waiting: a clean exit all the same.
    let early = env.process(started[2].1);
    early.signal("TERM").unwrap();
    let status = early.wait_exit(Duration::from_secs(10)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "a syncer waiting for caches did not exit 0 on SIGTERM: {status:?}"
    );
    started.pop();

    install_crds(&env.cluster("consumer").admin_client().await.unwrap())
        .await
        .unwrap();
    for (program, _, metrics, probes) in &started {
        let ready = eventually(
            &format!("{program} /readyz"),
            Duration::from_secs(30),
            || async {
                Ok(http_get(probes, "/readyz")
                    .await
                    .ok()
                    .filter(|(code, _)| *code == 200))
            },
        )
        .await;
        ready.unwrap();
        assert_eq!(http_get(probes, "/healthz").await.unwrap().0, 200);
        let (code, body) = http_get(metrics, "/metrics").await.unwrap();
        assert_eq!(code, 200);
        assert!(body.contains("kbind_"), "{program} /metrics: {body}");
    }
    for (program, index, _, _) in started {
        let process = env.process(index);
        process.signal("TERM").unwrap();
        let status = process.wait_exit(Duration::from_secs(10)).await;
        assert!(
            status.is_some_and(|s| s.success()),
            "{program} did not exit 0 within 10 s after SIGTERM: {status:?}\n{}",
            process.log_tail(20)
        );
    }
}

#[tokio::test]
async fn programs_fail_fast_with_one_clear_line_on_a_bad_kubeconfig() {
    // INTERFACES.md: a fatal start-up error exits non-zero naming the cause.
    let mut env = TestEnv::start("programs_bad_kubeconfig", &[])
        .await
        .expect("env");
    let missing = env.dir().join("no-such.kubeconfig").display().to_string();
    for program in ["kbind-schema-manager", "kbind-syncer"] {
        let args = [
            format!("--kubeconfig={missing}"),
            "--metrics-bind-address=0".into(),
            "--health-probe-bind-address=0".into(),
        ];
        let index = env
            .start_kbind(program, program, &args, &[("KBIND_IDENTITY", "x")])
            .unwrap_or_else(|e| panic!("{e}"));
        let process = env.process(index);
        let status = process
            .wait_exit(Duration::from_secs(10))
            .await
            .expect("exits");
        assert!(!status.success());
        let log = process.log_tail(5);
        assert!(
            log.contains(&format!("{program}: cannot read kubeconfig {missing}")),
            "{log}"
        );
    }
}
