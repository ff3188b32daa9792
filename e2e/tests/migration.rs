//! #37: replacing a running Go konnector. Both clusters are brought into the state the Go
//! konnector leaves them in — written here from its contract (REFERENCE-BEHAVIOUR KEY-*, SYNC-8,
//! REL-4, HB-3), with its field managers, its markers in both forms, its finalizers, its 16-hex
//! schema hashes — and kbind is started on them. It must adopt everything writing to the provider
//! only its label on each copy (one apply each, #50.5): no namespace or related copy changes, no
//! conflict appears, the Go konnector's heartbeat Lease (`kbind/consumer-<uid>`) is renewed
//! beside kbind's own until it is deleted (never re-created), and the next spec change is one
//! write with one owner.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::fixtures::*;
use kbind_e2e::kbind::{apiserver_writes, grown};
use kbind_e2e::wait::wait_for;
use kbind_shared::api::ClusterBinding;
use kbind_shared::keys;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

/// The Go konnector's field manager for its other writes (controller-runtime names it after the
/// binary).
const GO_MANAGER: &str = "konnector";

fn gadget_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.org", "v1", "Gadget"),
        "gadgets",
    )
}

fn exported(plural: &str, kind: &str) -> CustomResourceDefinition {
    crd(
        plural,
        "example.org",
        kind,
        &[(keys::EXPORTED_LABEL, keys::TRUE)],
    )
}

/// The consumer CRD the Go konnector pulled: the provider's, marked, with its 16-hex hash.
fn go_pulled(plural: &str, kind: &str) -> CustomResourceDefinition {
    let mut crd = crd(
        plural,
        "example.org",
        kind,
        &[(keys::MANAGED_LABEL, keys::TRUE)],
    );
    crd.metadata.annotations = Some(
        [
            (
                keys::CONNECTION_ANNOTATION.to_owned(),
                "provider".to_owned(),
            ),
            (
                keys::SCHEMA_HASH_ANNOTATION.to_owned(),
                "sha256:0123456789abcdef".to_owned(),
            ),
        ]
        .into(),
    );
    crd
}

/// SYNC-8: the Go konnector's spec apply of one copy.
async fn go_copy(
    provider: &Client,
    resource: &ApiResource,
    consumer_object: &DynamicObject,
    local_uid: &str,
) {
    let name = consumer_object.name_any();
    let namespace = consumer_object.namespace().unwrap();
    let body = json!({
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": { keys::MANAGED_LABEL: keys::TRUE },
            "annotations": {
                keys::CONSUMER_CLUSTER_UID_ANNOTATION: local_uid,
                keys::CONSUMER_OBJECT_UID_ANNOTATION: consumer_object.metadata.uid.clone().unwrap(),
            },
        },
        "spec": consumer_object.data["spec"],
    });
    Api::<DynamicObject>::namespaced_with(provider.clone(), &namespace, resource)
        .patch(
            &name,
            &PatchParams::apply(keys::FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .unwrap();
}

/// A consumer object the user created, with the Go syncer's finalizer (SYNC-5, an update by the
/// konnector).
async fn user_object(
    api: &Api<DynamicObject>,
    object: DynamicObject,
    annotations: &[(&str, &str)],
) -> DynamicObject {
    let mut object = object;
    if !annotations.is_empty() {
        object.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
    }
    let created = api.create(&PostParams::default(), &object).await.unwrap();
    api.patch(
        &created.name_any(),
        &PatchParams {
            field_manager: Some(GO_MANAGER.into()),
            ..Default::default()
        },
        &Patch::Merge(json!({ "metadata": { "finalizers": [keys::SYNCER_FINALIZER] } })),
    )
    .await
    .unwrap()
}

/// Every provider object kbind could touch, by kind/namespace/name: its resourceVersion.
async fn provider_versions(provider: &Client) -> BTreeMap<String, String> {
    let mut versions = BTreeMap::new();
    for (kind, resource) in [
        ("widgets", widget_resource()),
        ("gadgets", gadget_resource()),
    ] {
        let api: Api<DynamicObject> = Api::all_with(provider.clone(), &resource);
        for o in api.list(&Default::default()).await.unwrap() {
            versions.insert(
                format!(
                    "{kind} {}/{}",
                    o.namespace().unwrap_or_default(),
                    o.name_any()
                ),
                o.resource_version().unwrap_or_default(),
            );
        }
    }
    let namespace = Api::<Namespace>::all(provider.clone())
        .get("team-a")
        .await
        .unwrap();
    versions.insert(
        "namespace team-a".into(),
        namespace.resource_version().unwrap_or_default(),
    );
    let map = Api::<ConfigMap>::namespaced(provider.clone(), "team-a")
        .get("settings")
        .await
        .unwrap();
    versions.insert(
        "configmap team-a/settings".into(),
        map.resource_version().unwrap_or_default(),
    );
    versions
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kbind_adopts_the_go_konnectors_state_writing_only_its_label_to_the_provider() {
    let Pair {
        mut env,
        consumer,
        provider,
    } = Pair::start("migration", &[]).await;
    let (local_uid, remote_uid) = (
        uid_of_kube_system(&consumer).await,
        uid_of_kube_system(&provider).await,
    );
    for crd in [exported("widgets", "Widget"), exported("gadgets", "Gadget")] {
        install_crd(&provider, &crd).await.unwrap();
    }
    let _controller = run_provider_widget_controller(provider.clone());

    // The consumer as the Go konnector left it: its pulled CRDs, the Secret and Connection with
    // its cleanup finalizer and its status (pins, exported APIs), the ClusterBinding.
    for crd in [
        go_pulled("widgets", "Widget"),
        go_pulled("gadgets", "Gadget"),
    ] {
        install_crd(&consumer, &crd).await.unwrap();
    }
    for namespace in [SECRET_NAMESPACE, KBIND_NAMESPACE, "team-a"] {
        ensure_namespace(&consumer, namespace).await.unwrap();
    }
    let kubeconfig = env.cluster("provider").admin_kubeconfig();
    apply_manifest(&consumer, &one_file(&kubeconfig, &[0, 1]))
        .await
        .unwrap();
    let finalize = |name: &str| json!({ "metadata": { "name": name, "finalizers": [keys::CLEANUP_FINALIZER] } });
    let go_update = PatchParams {
        field_manager: Some(GO_MANAGER.into()),
        ..Default::default()
    };
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(consumer.clone(), SECRET_NAMESPACE);
    secrets
        .patch(
            "provider-kubeconfig",
            &go_update,
            &Patch::Merge(finalize("provider-kubeconfig")),
        )
        .await
        .unwrap();
    let connections: Api<kbind_shared::api::Connection> = Api::all(consumer.clone());
    connections
        .patch("provider", &go_update, &Patch::Merge(finalize("provider")))
        .await
        .unwrap();
    let exported_api = |plural: &str| {
        json!({ "name": format!("{plural}.example.org"), "group": "example.org", "resource": plural,
                "scope": "Namespaced", "versions": ["v1"] })
    };
    connections
        .patch_status(
            "provider",
            &go_update,
            &Patch::Merge(json!({ "status": {
                "remoteClusterUID": remote_uid,
                "localClusterUID": local_uid,
                "exportedAPIs": [exported_api("gadgets"), exported_api("widgets")],
                "conditions": [{ "type": "Ready", "status": "True", "reason": "Ready",
                                 "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z" }],
            } })),
        )
        .await
        .unwrap();
    let bindings: Api<ClusterBinding> = Api::all(consumer.clone());
    bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "core.kbind.io/v1alpha1", "kind": "ClusterBinding",
                "metadata": { "name": "widgets", "finalizers": [keys::CLEANUP_FINALIZER] },
                "spec": {
                    "connectionRef": { "name": "provider" },
                    "apis": [{ "name": "widgets.example.org" }, { "name": "gadgets.example.org" }],
                    "relatedResources": [{ "resource": "configmaps", "direction": "FromConsumer",
                                           "selector": { "names": ["settings"] } }],
                },
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let binding_uid = bindings.get("widgets").await.unwrap().metadata.uid.unwrap();

    // The objects: Widgets w1–w3 (w3 with the Orphan deletion policy) and Gadgets g1–g2 synced;
    // w4 in conflict with a provider object that is not kbind's; a related ConfigMap.
    let consumer_widgets = widgets(&consumer, "team-a");
    let consumer_gadgets: Api<DynamicObject> =
        Api::namespaced_with(consumer.clone(), "team-a", &gadget_resource());
    let mut synced = Vec::new();
    for (name, annotations) in [
        ("w1", vec![]),
        ("w2", vec![]),
        (
            "w3",
            vec![(
                keys::DELETION_POLICY_ANNOTATION,
                keys::DELETION_POLICY_ORPHAN,
            )],
        ),
    ] {
        synced.push((
            widget_resource(),
            user_object(&consumer_widgets, widget(name, 1), &annotations).await,
        ));
    }
    for name in ["g1", "g2"] {
        let gadget: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "example.org/v1", "kind": "Gadget", "metadata": { "name": name }, "spec": { "colour": "red" } }))
        .unwrap();
        synced.push((
            gadget_resource(),
            user_object(&consumer_gadgets, gadget, &[]).await,
        ));
    }
    let w4 = user_object(
        &consumer_widgets,
        widget("w4", 1),
        &[(keys::CONFLICT_ANNOTATION, keys::CONFLICT_FOREIGN)],
    )
    .await;
    let mut settings = ConfigMap {
        data: Some([("colour".to_owned(), "blue".to_owned())].into()),
        ..Default::default()
    };
    settings.metadata.name = Some("settings".into());
    Api::<ConfigMap>::namespaced(consumer.clone(), "team-a")
        .create(&PostParams::default(), &settings)
        .await
        .unwrap();

    // The provider as the Go konnector left it: team-a (the syncer's label form), the copies,
    // the foreign w4, the related copy (REL-4), the heartbeat Lease (HB-3).
    create_marked_namespace(&provider, "team-a", &local_uid).await;
    for (resource, object) in &synced {
        go_copy(&provider, resource, object, &local_uid).await;
    }
    widgets(&provider, "team-a")
        .create(&PostParams::default(), &widget("w4", 7))
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(provider.clone(), "team-a")
        .patch(
            "settings",
            &PatchParams::apply(keys::RELATED_FIELD_MANAGER).force(),
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": { "name": "settings", "namespace": "team-a",
                    "labels": { keys::MANAGED_LABEL: keys::TRUE },
                    "annotations": { keys::CONSUMER_CLUSTER_UID_ANNOTATION: local_uid,
                                     keys::RELATED_BINDING_ANNOTATION: binding_uid } },
                "data": { "colour": "blue" },
            })),
        )
        .await
        .unwrap();
    // The Go konnector's heartbeat Lease.
    let go_lease_name = kbind_shared::heartbeat::go_lease_name(&local_uid);
    let kbind_lease_name = kbind_shared::heartbeat::lease_name("provider", &local_uid);
    let leases: Api<Lease> = Api::namespaced(provider.clone(), "kbind");
    let go_lease = create_go_lease(&provider, &local_uid).await;
    let go_renewed = go_lease.spec.clone().unwrap().renew_time.unwrap();
    // The status the Go syncer copied down (SYNC-9), once the provider's controller wrote it.
    for (resource, object) in &synced {
        let name = object.name_any();
        let provider_api: Api<DynamicObject> =
            Api::namespaced_with(provider.clone(), "team-a", resource);
        let status = if resource.kind == "Widget" {
            wait_for("the provider's status", 30, || async {
                let copy = provider_api.get(&name).await.map_err(|e| e.to_string())?;
                Ok(copy.data.get("status").filter(|s| !s.is_null()).cloned())
            })
            .await
        } else {
            json!({ "phase": "Ready" })
        };
        if resource.kind == "Gadget" {
            provider_api
                .patch_status(
                    &name,
                    &go_update,
                    &Patch::Merge(json!({ "status": status })),
                )
                .await
                .unwrap();
        }
        Api::<DynamicObject>::namespaced_with(consumer.clone(), "team-a", resource)
            .patch_status(
                &name,
                &go_update,
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .unwrap();
    }

    // kbind starts on it.
    let before = provider_versions(&provider).await;
    let writes_before = apiserver_writes(&provider).await.unwrap();
    let manager = start_lone_schema_manager(&mut env, &[]).await;
    let syncer = start_syncer(&mut env, "consumer", "syncer-0", &[])
        .await
        .unwrap();
    manager.wait_ready("the schema manager", 60).await;
    syncer.wait_ready("the syncer", 60).await;
    wait_cluster_binding_ready(&consumer, "widgets").await;
    for (resource, object) in &synced {
        let api: Api<DynamicObject> = Api::namespaced_with(consumer.clone(), "team-a", resource);
        let name = object.name_any();
        wait_for(&format!("{name}'s delivery record"), 60, || async {
            let o = api.get(&name).await.map_err(|e| e.to_string())?;
            Ok((o.data["status"]["kbindSync"]["state"] == "Synced").then_some(()))
        })
        .await;
    }
    wait_binding(&bindings, "widgets", "RelatedResourcesSynced=True").await;
    // The Go konnector's Lease is renewed beside kbind's own (#53.3): a reaper that knows only
    // the Go name reads this consumer as alive. Its renewTime only; the rest stays as Go left it.
    let renewed_by_kbind = wait_for("kbind to renew the Go konnector's Lease", 30, || async {
        let lease = leases
            .get(&go_lease_name)
            .await
            .map_err(|e| e.to_string())?;
        let renewed = lease.spec.as_ref().and_then(|s| s.renew_time.clone());
        Ok(lease
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .any(|f| f.manager.as_deref() == Some("kbind-schema-manager"))
            .then_some(lease)
            .filter(|_| renewed.is_some_and(|r| r.0 > go_renewed.0)))
    })
    .await;
    let (go_spec, renewed_spec) = (
        go_lease.spec.clone().unwrap(),
        renewed_by_kbind.spec.clone().unwrap(),
    );
    assert_eq!(renewed_spec.holder_identity, go_spec.holder_identity);
    assert_eq!(renewed_spec.lease_duration_seconds, Some(60));
    assert_eq!(renewed_spec.acquire_time, go_spec.acquire_time);
    assert_eq!(renewed_by_kbind.metadata.labels, go_lease.metadata.labels);
    assert_eq!(
        renewed_by_kbind.metadata.annotations,
        go_lease.metadata.annotations
    );
    let own = leases.get(&kbind_lease_name).await.unwrap();
    assert_eq!(
        own.spec.unwrap().holder_identity.as_deref(),
        Some(local_uid.as_str())
    );
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Nothing of the provider's was written but, on each copy kbind took over (the related copy
    // too), the label its provider watches select this consumer's copies by (#50.5): one apply
    // per copy, read first (no refused create), its spec and the Go konnector's markers as they
    // were.
    let kind = |resource: &kube::api::ApiResource| resource.plural.clone();
    let taken_over: Vec<String> = synced
        .iter()
        .map(|(r, o)| format!("{} team-a/{}", kind(r), o.name_any()))
        .chain(["configmap team-a/settings".to_owned()])
        .collect();
    let after = provider_versions(&provider).await;
    for (key, version) in &before {
        let changed = after.get(key) != Some(version);
        assert_eq!(
            changed,
            taken_over.contains(key),
            "{key}: {version} → {:?}",
            after.get(key)
        );
    }
    let written = grown(&writes_before, &apiserver_writes(&provider).await.unwrap());
    let count = |plural: &str| synced.iter().filter(|(r, _)| r.plural == plural).count() as u64;
    assert_eq!(
        written,
        BTreeMap::from([
            ("APPLY /configmaps ".to_owned(), 1),
            ("APPLY example.org/gadgets ".to_owned(), count("gadgets")),
            ("APPLY example.org/widgets ".to_owned(), count("widgets")),
        ]),
        "kbind wrote nothing but its Lease and one label per copy to the provider"
    );
    for (resource, object) in &synced {
        let copy = Api::<DynamicObject>::namespaced_with(provider.clone(), "team-a", resource)
            .get(&object.name_any())
            .await
            .unwrap();
        assert_eq!(
            copy.labels().get(keys::CONSUMER_CLUSTER_UID_LABEL),
            Some(&local_uid),
            "{}",
            copy.name_any()
        );
        assert_eq!(
            copy.annotations().get(keys::CONSUMER_OBJECT_UID_ANNOTATION),
            object.metadata.uid.as_ref(),
            "{}",
            copy.name_any()
        );
    }
    let managed_leases = Api::<Lease>::all(provider.clone())
        .list(&kube::api::ListParams::default().labels("core.kbind.io/managed=true"))
        .await
        .unwrap();
    let mut expected = vec![go_lease_name.clone(), kbind_lease_name.clone()];
    expected.sort();
    assert_eq!(
        managed_leases
            .items
            .iter()
            .map(|l| l.name_any())
            .collect::<Vec<_>>(),
        expected,
        "the Go konnector's Lease and kbind's own, nothing else"
    );

    // The documented consumer-side rewrite: each pulled CRD once, to kbind's 64-hex hash.
    let consumer_crds: Api<CustomResourceDefinition> = Api::all(consumer.clone());
    for name in ["widgets.example.org", "gadgets.example.org"] {
        let crd = consumer_crds.get(name).await.unwrap();
        let hash = annotation(&crd, keys::SCHEMA_HASH_ANNOTATION).unwrap_or_default();
        assert_eq!(hash.len(), keys::SCHEMA_HASH_LEN, "{name}: {hash}");
        assert_eq!(
            annotation(&crd, keys::CONNECTION_ANNOTATION),
            Some("provider")
        );
    }

    // On the consumer: no conflict appeared, w4's stays; one finalizer each, kbind's = Go's.
    for (resource, object) in &synced {
        let api: Api<DynamicObject> = Api::namespaced_with(consumer.clone(), "team-a", resource);
        let o = api.get(&object.name_any()).await.unwrap();
        assert_eq!(
            annotation(&o, keys::CONFLICT_ANNOTATION),
            None,
            "{}",
            o.name_any()
        );
        assert_eq!(
            o.finalizers(),
            [keys::SYNCER_FINALIZER.to_owned()],
            "{}",
            o.name_any()
        );
    }
    let w4 = consumer_widgets.get(&w4.name_any()).await.unwrap();
    assert_eq!(
        annotation(&w4, keys::CONFLICT_ANNOTATION),
        Some(keys::CONFLICT_FOREIGN)
    );

    // The next spec change: one write to the provider, and the copy's spec has one owner.
    let writes_before = apiserver_writes(&provider).await.unwrap();
    resize_and_wait_upstream(&consumer_widgets, &widgets(&provider, "team-a"), "w1", 9).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let written = grown(&writes_before, &apiserver_writes(&provider).await.unwrap());
    let widget_writes: u64 = written
        .iter()
        // The provider's own controller writes the status; kbind writes the rest.
        .filter(|(k, _)| k.contains("example.org/widgets") && !k.ends_with(" status"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(widget_writes, 1, "one write: {written:?}");
    let copy = widgets(&provider, "team-a").get("w1").await.unwrap();
    let owners: Vec<&str> = copy
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|f| {
            f.fields_v1
                .as_ref()
                .and_then(|v| v.0.get("f:spec"))
                .and_then(|s| s.get("f:size"))
                .is_some()
        })
        .filter_map(|f| f.manager.as_deref())
        .collect();
    assert_eq!(owners, [keys::FIELD_MANAGER], "spec.size has one owner");

    // Once the provider's admin deletes the Go konnector's Lease, kbind never re-creates it, and
    // its own goes on.
    leases
        .delete(&go_lease_name, &Default::default())
        .await
        .unwrap();
    let own_before = leases.get(&kbind_lease_name).await.unwrap();
    wait_for("kbind to renew its own Lease again", 30, || async {
        let own = leases
            .get(&kbind_lease_name)
            .await
            .map_err(|e| e.to_string())?;
        let renewed = |l: &Lease| l.spec.as_ref().and_then(|s| s.renew_time.clone());
        Ok((renewed(&own) > renewed(&own_before)).then_some(()))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        leases.get_opt(&go_lease_name).await.unwrap().is_none(),
        "the Go konnector's Lease is never re-created"
    );
}

/// Runs `kubectl kbind <args> -o json` against the consumer as its admin; its JSON report.
fn plugin_json(env: &kbind_e2e::TestEnv, args: &[&str]) -> serde_json::Value {
    let admin = env.cluster("consumer").admin_kubeconfig_path();
    let output =
        std::process::Command::new(kbind_e2e::controlplane::kbind_bin("kubectl-kbind").unwrap())
            .args(args)
            .arg("--kubeconfig")
            .arg(&admin)
            .args(["-o", "json"])
            .output()
            .unwrap();
    assert!(
        output.status.success(),
        "kubectl kbind {args:?}: {output:?}"
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

const CORE_CRDS: [&str; 3] = [
    "connections.core.kbind.io",
    "clusterbindings.core.kbind.io",
    "bindings.core.kbind.io",
];

/// The steps of a `migrate` report (JSON).
fn steps_of(report: &serde_json::Value) -> Vec<&str> {
    report["steps"]
        .as_array()
        .map(|steps| steps.iter().filter_map(|s| s.as_str()).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_plan_changes_nothing_and_apply_stops_the_go_konnector_and_keeps_the_crds_for_kbind()
 {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Pod;
    let Pair {
        env,
        consumer,
        provider,
    } = Pair::start("migrate", &[]).await;
    let crds: Api<CustomResourceDefinition> = Api::all(consumer.clone());
    // The Go release's marks on the core CRDs, as Helm leaves them (no keep policy).
    for name in CORE_CRDS {
        crds.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": {
                "labels": { "app.kubernetes.io/managed-by": "Helm" },
                "annotations": { "meta.helm.sh/release-name": "konnector",
                                 "meta.helm.sh/release-namespace": "konnector-system" } } })),
        )
        .await
        .unwrap();
    }
    // The Go konnector (no node here: its pod stays Pending, which is all a pod needs to be).
    ensure_namespace(&consumer, "konnector-system")
        .await
        .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(consumer.clone(), "konnector-system");
    deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": { "name": "konnector" },
                "spec": { "replicas": 1, "selector": { "matchLabels": { "app": "konnector" } },
                  "template": { "metadata": { "labels": { "app": "konnector" } },
                    "spec": { "containers": [{ "name": "konnector",
                      "image": "ghcr.io/kbind-dev/konnector:v0.4.0" }] } } },
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    // The Go konnector again, from an image renamed in a private registry (known by its
    // command), and kbind's own syncer, which is not the Go konnector.
    ensure_namespace(&consumer, "platform").await.unwrap();
    let platform: Api<Deployment> = Api::namespaced(consumer.clone(), "platform");
    for (name, image, command) in [
        (
            "bind-agent",
            "registry.local/platform/bind-agent:2",
            "/konnector",
        ),
        (
            "kbind-syncer",
            "ghcr.io/kbind-dev/kbind-syncer:0.1.0",
            "/kbind-syncer",
        ),
    ] {
        platform
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "apps/v1", "kind": "Deployment",
                    "metadata": { "name": name },
                    "spec": { "replicas": 1, "selector": { "matchLabels": { "app": name } },
                      "template": { "metadata": { "labels": { "app": name } },
                        "spec": { "containers": [{ "name": "main", "image": image,
                          "command": [command] }] } } },
                }))
                .unwrap(),
            )
            .await
            .unwrap();
    }
    // #53.3: a konnector may run as a StatefulSet (a renamed image behind a shell) or a
    // DaemonSet. (That no first page hides one is `migrate::tests::every_page_of_a_list_is_read`.)
    ensure_namespace(&consumer, "zz-late").await.unwrap();
    for (kind, name, container) in [
        (
            "Deployment",
            "konnector",
            json!({ "name": "main", "image": "ghcr.io/kbind-dev/konnector:v0.4.0" }),
        ),
        (
            "StatefulSet",
            "agent",
            json!({ "name": "main", "image": "registry.local/platform/agent:3",
                    "command": ["/bin/sh", "-c", "exec /konnector --v=2"] }),
        ),
        (
            "DaemonSet",
            "konnector-ds",
            json!({ "name": "main", "image": "ghcr.io/kbind-dev/konnector:v0.4.0" }),
        ),
    ] {
        let resource =
            kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk("apps", "v1", kind));
        let mut spec = json!({ "selector": { "matchLabels": { "app": name } },
            "template": { "metadata": { "labels": { "app": name } },
              "spec": { "containers": [container] } } });
        if kind != "DaemonSet" {
            spec["replicas"] = json!(1);
        }
        if kind == "StatefulSet" {
            spec["serviceName"] = json!(name);
        }
        Api::<DynamicObject>::namespaced_with(consumer.clone(), "zz-late", &resource)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({ "apiVersion": "apps/v1", "kind": kind,
                    "metadata": { "name": name }, "spec": spec }))
                .unwrap(),
            )
            .await
            .unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(consumer.clone(), "konnector-system");
    let app = kube::api::ListParams::default().labels("app=konnector");
    let platform_pods: Api<Pod> = Api::namespaced(consumer.clone(), "platform");
    let agent = kube::api::ListParams::default().labels("app=bind-agent");
    wait_for("the Go konnectors' pods", 60, || async {
        let one = pods.list(&app).await.map_err(|e| e.to_string())?;
        let other = platform_pods
            .list(&agent)
            .await
            .map_err(|e| e.to_string())?;
        Ok((!one.items.is_empty() && !other.items.is_empty()).then_some(()))
    })
    .await;
    install_crd(&consumer, &go_pulled("widgets", "Widget"))
        .await
        .unwrap();
    // The Go konnector's Connection (its status written by it) and its heartbeat Lease on the
    // provider, `kbind/consumer-<uid>`, renewed by it moments ago.
    ensure_namespace(&consumer, SECRET_NAMESPACE).await.unwrap();
    let kubeconfig = env.cluster("provider").admin_kubeconfig();
    apply_manifest(&consumer, &one_file(&kubeconfig, &[0, 1]))
        .await
        .unwrap();
    let local_uid = uid_of_kube_system(&consumer).await;
    let go_update = PatchParams {
        field_manager: Some(GO_MANAGER.into()),
        ..Default::default()
    };
    Api::<kbind_shared::api::Connection>::all(consumer.clone())
        .patch_status(
            "provider",
            &go_update,
            &Patch::Merge(json!({ "status": {
                "localClusterUID": local_uid,
                "remoteClusterUID": uid_of_kube_system(&provider).await } })),
        )
        .await
        .unwrap();
    let go_lease_name = kbind_shared::heartbeat::go_lease_name(&local_uid);
    let go_leases: Api<Lease> = Api::namespaced(provider.clone(), "kbind");
    create_go_lease(&provider, &local_uid).await;
    // Two related copies the Go konnector wrote (no per-entry record) and one kbind wrote.
    ensure_namespace(&consumer, "team-a").await.unwrap();
    let config_maps: Api<ConfigMap> = Api::namespaced(consumer.clone(), "team-a");
    for (name, entries) in [("go-1", None), ("go-2", None), ("kbind-1", Some("[\"a\"]"))] {
        let mut annotations = BTreeMap::from([(
            keys::RELATED_BINDING_ANNOTATION.to_owned(),
            "widgets".to_owned(),
        )]);
        if let Some(entries) = entries {
            annotations.insert(keys::RELATED_ENTRIES_ANNOTATION.to_owned(), entries.into());
        }
        let copy = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([(
                    keys::MANAGED_LABEL.to_owned(),
                    keys::TRUE.to_owned(),
                )])),
                annotations: Some(annotations),
                ..Default::default()
            },
            ..Default::default()
        };
        config_maps
            .create(&PostParams::default(), &copy)
            .await
            .unwrap();
    }

    // plan: what it found, and nothing changed.
    let versions = || async {
        let mut all: Vec<String> = Vec::new();
        for name in CORE_CRDS.iter().chain(&["widgets.example.org"]) {
            all.push(
                crds.get(name)
                    .await
                    .unwrap()
                    .resource_version()
                    .unwrap_or_default(),
            );
        }
        all.push(
            deployments
                .get("konnector")
                .await
                .unwrap()
                .resource_version()
                .unwrap_or_default(),
        );
        all
    };
    let before = versions().await;
    let plan = plugin_json(&env, &["migrate", "plan"]);
    assert_eq!(versions().await, before, "plan wrote nothing");
    let found: Vec<String> = plan["konnectors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            format!(
                "{} {}/{} {}",
                k["kind"], k["namespace"], k["name"], k["stopped"]
            )
            .replace('"', "")
        })
        .collect();
    assert_eq!(
        found,
        [
            "Deployment konnector-system/konnector false",
            "Deployment platform/bind-agent false",
            "Deployment zz-late/konnector false",
            "StatefulSet zz-late/agent false",
            "DaemonSet zz-late/konnector-ds false",
        ],
        "by image, command and args, in every workload kind; kbind's syncer is not one"
    );
    assert_eq!(plan["apis"][0]["name"], "widgets.example.org");
    assert_eq!(plan["apis"][0]["hash"], "Go");
    assert!(
        plan["apis"][0]["rewrite"]
            .as_str()
            .unwrap()
            .starts_with("once")
    );
    assert_eq!(plan["related"]["copies"], 3, "{plan:#}");
    assert_eq!(plan["related"]["without_record"], 2, "{plan:#}");
    let differences = plan["differences"].to_string();
    assert!(
        differences.contains("1 pulled CRD(s) carry the Go konnector's schema hash (sha256: + 16 hex): 1 rewritten once")
            && differences.contains("2 of 3 related copies here lack"),
        "{differences}"
    );
    for core in plan["core_crds"].as_array().unwrap() {
        assert_eq!(core["release"], "konnector");
        assert_eq!(core["kept"], false);
    }
    // #53.3: the Go konnector's real Lease, read on the provider, and what becomes of it; its
    // field manager's writes of the last minutes on both clusters.
    let lease_row = &plan["go_leases"][0];
    assert_eq!(lease_row["connection"], "provider", "{plan:#}");
    assert_eq!(lease_row["lease"], format!("kbind/{go_lease_name}"));
    assert_eq!(lease_row["found"], "this consumer's");
    assert!(
        lease_row["fate"].as_str().unwrap().contains(&format!(
            "kbind renews it beside its own (kbind/{})",
            kbind_shared::heartbeat::lease_name("provider", &local_uid)
        )),
        "{lease_row:#}"
    );
    let written: Vec<String> = plan["go_writes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| format!("{} {}", w["cluster"], w["object"]).replace('"', ""))
        .collect();
    for expected in [
        format!("provider of provider Lease kbind/{go_lease_name}"),
        "consumer Connection provider".to_owned(),
    ] {
        assert!(written.contains(&expected), "{expected}: {written:#?}");
    }
    let steps = steps_of(&plan);
    assert!(
        steps[0].starts_with("scale Deployment konnector-system/konnector to 0"),
        "{steps:#?}"
    );
    assert!(
        steps[0].contains("has written nothing on either cluster for --quiet-for"),
        "{steps:#?}"
    );
    assert!(
        steps[1].starts_with("scale Deployment platform/bind-agent to 0"),
        "{steps:#?}"
    );
    assert!(
        steps[3].starts_with("scale StatefulSet zz-late/agent to 0"),
        "{steps:#?}"
    );
    assert!(
        steps[4].starts_with("stop DaemonSet zz-late/konnector-ds"),
        "{steps:#?}"
    );
    assert!(
        steps[5].contains("never `helm uninstall` konnector"),
        "{steps:#?}"
    );

    // apply: the Go konnectors stopped (their pods gone), the core CRDs kept for kbind's release.
    let applied = plugin_json(&env, &["migrate", "apply", "--quiet-for", "3s"]);
    assert_eq!(applied["done"].as_array().unwrap().len(), 8, "{applied:#}");
    let stopped: Vec<bool> = applied["konnectors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["stopped"] == true && k["pods"] == 0)
        .collect();
    assert_eq!(stopped, [true; 5], "{applied:#}");
    let daemon_set =
        Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(consumer.clone(), "zz-late")
            .get("konnector-ds")
            .await
            .unwrap();
    assert!(
        daemon_set
            .spec
            .unwrap()
            .template
            .spec
            .unwrap()
            .node_selector
            .unwrap_or_default()
            .contains_key("core.kbind.io/go-konnector-stopped-for-kbind"),
        "the DaemonSet schedules nowhere"
    );
    assert_eq!(
        deployments
            .get("konnector")
            .await
            .unwrap()
            .spec
            .unwrap()
            .replicas,
        Some(0)
    );
    assert!(
        pods.list(&app).await.unwrap().items.is_empty()
            && platform_pods.list(&agent).await.unwrap().items.is_empty(),
        "their pods are gone"
    );
    assert_eq!(
        platform
            .get("kbind-syncer")
            .await
            .unwrap()
            .spec
            .unwrap()
            .replicas,
        Some(1),
        "kbind's own syncer is left alone"
    );
    let uids: Vec<Option<String>> = {
        let mut uids = Vec::new();
        for name in CORE_CRDS {
            let crd = crds.get(name).await.unwrap();
            assert_eq!(annotation(&crd, "helm.sh/resource-policy"), Some("keep"));
            assert_eq!(annotation(&crd, "meta.helm.sh/release-name"), Some("kbind"));
            uids.push(crd.metadata.uid);
        }
        uids
    };
    let widgets_crd = crds.get("widgets.example.org").await.unwrap();
    assert_eq!(
        annotation(&widgets_crd, keys::CREATED_BY_ANNOTATION),
        None,
        "not stamped unless asked"
    );

    // Helm installs kbind over them: adopted, not re-created.
    let chart = kbind_e2e::tools::chart_dir().display().to_string();
    let admin = env
        .cluster("consumer")
        .admin_kubeconfig_path()
        .display()
        .to_string();
    kbind_e2e::tools::helm_checked(&[
        "--kubeconfig",
        &admin,
        "upgrade",
        "--install",
        "kbind",
        &chart,
        "-n",
        "kbind-system",
        "--create-namespace",
        "--set",
        "boundAPIGroups={example.org}",
    ])
    .unwrap();
    for (name, uid) in CORE_CRDS.iter().zip(&uids) {
        assert_eq!(
            &crds.get(name).await.unwrap().metadata.uid,
            uid,
            "{name} adopted, not re-created"
        );
    }
    let after = plugin_json(&env, &["migrate", "plan"]);
    let steps = steps_of(&after);
    assert!(
        steps[0].starts_with("install kbind"),
        "nothing left before the install: {steps:#?}"
    );

    // A Go konnector that runs elsewhere (none here any more) renews its Lease: plan says so
    // first, and apply refuses, writing nothing (the CRD it was asked to stamp stays unstamped).
    go_leases
        .patch(
            &go_lease_name,
            &go_update,
            &Patch::Merge(json!({ "spec": { "renewTime":
                k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(jiff::Timestamp::now()) } })),
        )
        .await
        .unwrap();
    let plan = plugin_json(&env, &["migrate", "plan"]);
    let steps = steps_of(&plan);
    assert!(
        steps[0].starts_with("stop the Go konnector that still writes although none runs here")
            && steps[0].contains(&format!(
                "Lease kbind/{go_lease_name} on the provider of provider"
            )),
        "{steps:#?}"
    );
    let refused =
        std::process::Command::new(kbind_e2e::controlplane::kbind_bin("kubectl-kbind").unwrap())
            .args([
                "migrate",
                "apply",
                "--stamp-created-by",
                "--kubeconfig",
                &admin,
            ])
            .output()
            .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(
        stderr.contains(&format!(
            "the Go konnector's field manager (konnector) wrote Lease kbind/{go_lease_name} on the provider of provider"
        )) && stderr.contains("nothing was handed over"),
        "{stderr}"
    );
    assert_eq!(
        annotation(
            &crds.get("widgets.example.org").await.unwrap(),
            keys::CREATED_BY_ANNOTATION
        ),
        None,
        "nothing written"
    );
}

/// #37.4: a bundle exactly as the Go service layer's issuer hands it out — a Secret in `kbind`
/// (key `kubeconfig`), a Connection and a ClusterBinding, all three named after the Grant and
/// applied with forced server-side apply; the kubeconfig is the Grant's ServiceAccount, whose
/// context namespace is the consumer's boundary namespace on the provider and which may write
/// Leases only there. kbind takes it unchanged: it syncs within the Grant's rights (the provider
/// answered none of its requests with 403), and its heartbeat Lease is where the Go reaper looks —
/// in the boundary namespace, found by the managed label and the connection annotation, held by
/// the consumer's UID, renewed well within the reaper's window (2 × leaseDurationSeconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_issuer_bundle_works_unchanged_and_its_heartbeat_is_where_the_go_reaper_looks() {
    use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
    let Pair {
        mut env,
        consumer,
        provider,
    } = Pair::start("migration_bundle", &[]).await;
    let local_uid = uid_of_kube_system(&consumer).await;
    install_crd(&provider, &exported("widgets", "Widget"))
        .await
        .unwrap();
    let _controller = run_provider_widget_controller(provider.clone());

    // The issuer's side on the provider: the Grant's boundary namespace, its ServiceAccount, its
    // rights — the exported API and discovery cluster-wide, Leases only in the boundary.
    let (grant, boundary) = ("acme-widgets-x7k2p", "kbind-acme");
    ensure_namespace(&provider, boundary).await.unwrap();
    let cluster = env.cluster("provider");
    let user = cluster
        .mint_service_account_user(boundary, grant)
        .await
        .unwrap();
    let outside_boundary: Vec<PolicyRule> = provider_rules(true)
        .into_iter()
        .filter(|r| r.resources.as_deref() != Some(&["leases".to_owned()][..]))
        .collect();
    cluster.grant(&user, grant, outside_boundary).await.unwrap();
    let meta = kube::api::ObjectMeta {
        name: Some(grant.into()),
        namespace: Some(boundary.into()),
        ..Default::default()
    };
    Api::<Role>::namespaced(provider.clone(), boundary)
        .create(
            &PostParams::default(),
            &Role {
                metadata: meta.clone(),
                rules: Some(vec![rule(
                    "coordination.k8s.io",
                    &["leases"],
                    &["get", "create", "update", "patch"],
                )]),
            },
        )
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(provider.clone(), boundary)
        .create(
            &PostParams::default(),
            &RoleBinding {
                metadata: meta,
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "Role".into(),
                    name: grant.into(),
                },
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".into(),
                    name: grant.into(),
                    namespace: Some(boundary.into()),
                    ..Default::default()
                }]),
            },
        )
        .await
        .unwrap();
    let kubeconfig = kbind_e2e::cluster::kubeconfig_yaml(
        "provider",
        cluster.server(),
        cluster.ca_pem(),
        &user.token,
        Some(boundary),
    );

    // The bundle, applied as the Go CLI applies it (forced SSA), before kbind runs.
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::STANDARD.encode(&kubeconfig);
    let bundle = format!(
        "apiVersion: v1
kind: Secret
metadata: {{name: {grant}, namespace: kbind}}
type: Opaque
data: {{kubeconfig: {encoded}}}
---
apiVersion: core.kbind.io/v1alpha1
kind: Connection
metadata: {{name: {grant}}}
spec:
  kubeconfigSecretRef: {{namespace: kbind, name: {grant}, key: kubeconfig}}
---
apiVersion: core.kbind.io/v1alpha1
kind: ClusterBinding
metadata: {{name: {grant}}}
spec:
  connectionRef: {{name: {grant}}}
  apis:
  - name: widgets.example.org
"
    );
    ensure_namespace(&consumer, SECRET_NAMESPACE).await.unwrap();
    ensure_namespace(&consumer, KBIND_NAMESPACE).await.unwrap();
    apply_manifest(&consumer, &bundle).await.unwrap();

    // kbind with the production heartbeat timing's shape: renewals every 10 s, 60 s Leases.
    let manager = start_lone_schema_manager(&mut env, &["--discovery-interval=10s"]).await;
    let syncer = start_syncer(&mut env, "consumer", "syncer-0", &[])
        .await
        .unwrap();
    manager.wait_ready("the schema manager", 60).await;
    syncer.wait_ready("the syncer", 60).await;
    wait_connection(&consumer, grant, "Ready=True").await;
    wait_cluster_binding_ready(&consumer, grant).await;

    // It syncs: spec up, status down.
    let (consumer_widgets, provider_widgets) =
        (widgets(&consumer, "default"), widgets(&provider, "default"));
    create_and_wait_copy(&consumer_widgets, &provider_widgets, "w1", 3).await;
    wait_status_down(&consumer_widgets, "w1", 3).await;

    // The Go reaper's view: managed Leases in the boundary namespace, matched by the connection
    // annotation.
    let leases: Api<Lease> = Api::namespaced(provider.clone(), boundary);
    let selector = kube::api::ListParams::default().labels("core.kbind.io/managed=true");
    let matched = |list: Vec<Lease>| -> Vec<Lease> {
        list.into_iter()
            .filter(|l| annotation(l, keys::CONNECTION_ANNOTATION) == Some(grant))
            .collect()
    };
    let found = matched(leases.list(&selector).await.unwrap().items);
    assert_eq!(found.len(), 1, "{found:#?}");
    let lease = &found[0];
    assert_eq!(lease.name_any(), format!("{grant}-{}", &local_uid[..10]));
    assert_eq!(
        annotation(lease, keys::CONSUMER_CLUSTER_UID_ANNOTATION),
        Some(local_uid.as_str())
    );
    let spec = lease.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(local_uid.as_str()));
    let duration = spec.lease_duration_seconds.expect("a Lease duration");
    let first = spec.renew_time.expect("a renewal").0;
    // The next renewal, as the provider stores it, comes inside the reaper's live window.
    let next = wait_for(
        "the next heartbeat renewal",
        2 * duration as u64,
        || async {
            let renewed = leases
                .get(&lease.name_any())
                .await
                .map_err(|e| e.to_string())?
                .spec
                .and_then(|s| s.renew_time)
                .map(|t| t.0);
            Ok(renewed.filter(|t| *t > first))
        },
    )
    .await;
    let gap = next.duration_since(first).as_secs_f64();
    assert!(
        gap <= 2.0 * duration as f64,
        "renewed {gap:.1} s after the last renewal; the Go reaper calls a Lease dead after {} s",
        2 * duration
    );
    // No kbind Lease anywhere else on the provider.
    let everywhere = matched(
        Api::<Lease>::all(provider.clone())
            .list(&selector)
            .await
            .unwrap()
            .items,
    );
    assert!(
        everywhere
            .iter()
            .all(|l| l.namespace().as_deref() == Some(boundary)),
        "{everywhere:#?}"
    );
    // Within the Grant's rights: the provider refused nothing the bundle's credential asked.
    let refused: Vec<_> = env
        .cluster("provider")
        .audited()
        .into_iter()
        .filter(|a| a.user == user.username && a.code == 403)
        .collect();
    assert!(refused.is_empty(), "{refused:#?}");
    // The bundle's objects keep what the issuer wrote.
    let connection = Api::<kbind_shared::api::Connection>::all(consumer.clone())
        .get(grant)
        .await
        .unwrap();
    assert_eq!(connection.spec.kubeconfig_secret_ref.name, grant);
    let binding = Api::<ClusterBinding>::all(consumer.clone())
        .get(grant)
        .await
        .unwrap();
    assert_eq!(binding.spec.connection_ref.name, grant);
}

/// The Go konnector's heartbeat Lease of the consumer `uid`, as it writes it: `consumer-<uid>` in
/// `kbind` (its reconciler's leaseName and default namespace), created and renewed by update
/// under its default field manager, labelled managed and annotated with the consumer's UID only,
/// held by it, 60 s, renewed now.
async fn create_go_lease(provider: &Client, uid: &str) -> Lease {
    ensure_namespace(provider, "kbind").await.unwrap();
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(jiff::Timestamp::now());
    Api::<Lease>::namespaced(provider.clone(), "kbind")
        .create(
            &PostParams {
                field_manager: Some(GO_MANAGER.into()),
                ..Default::default()
            },
            &serde_json::from_value(json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": { "name": kbind_shared::heartbeat::go_lease_name(uid),
                    "labels": { keys::MANAGED_LABEL: keys::TRUE },
                    "annotations": { keys::CONSUMER_CLUSTER_UID_ANNOTATION: uid } },
                "spec": { "holderIdentity": uid, "leaseDurationSeconds": 60,
                          "acquireTime": now, "renewTime": now },
            }))
            .unwrap(),
        )
        .await
        .unwrap()
}

/// A Deployment of `image` in `namespace` with `replicas` (no node here: its pods stay Pending,
/// which is all a pod needs to be).
async fn deployment(client: &Client, namespace: &str, name: &str, image: &str, replicas: i32) {
    ensure_namespace(client, namespace).await.unwrap();
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), namespace)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": { "name": name },
                "spec": { "replicas": replicas, "selector": { "matchLabels": { "app": name } },
                  "template": { "metadata": { "labels": { "app": name } },
                    "spec": { "containers": [{ "name": "main", "image": image }] } } },
            }))
            .unwrap(),
        )
        .await
        .unwrap();
}

/// #53.4: going back to the Go konnector. `rollback plan` names every fence the Go konnector
/// drops, `apply` refuses (writing nothing) while an object is routed, then stops kbind, strips
/// the one route finalizer no route holds and starts the Go konnector — and `migrate apply`
/// takes it back to kbind — each step's consumer writes counted.
#[tokio::test]
async fn rollback_names_every_lost_fence_refuses_while_routed_and_hands_over_both_ways() {
    let Pair { env, consumer, .. } = Pair::start("rollback", &[]).await;
    // kbind running; the Go konnector stopped by an earlier `migrate apply`.
    for program in ["kbind-schema-manager", "kbind-syncer"] {
        deployment(
            &consumer,
            KBIND_NAMESPACE,
            program,
            &format!("ghcr.io/kbind-dev/{program}:0.1.0"),
            1,
        )
        .await;
    }
    deployment(
        &consumer,
        "konnector-system",
        "konnector",
        "ghcr.io/kbind-dev/konnector:v0.4.0",
        0,
    )
    .await;
    // Fences: Bindings served only in team-a, no Secrets to the provider, no Binding adopts.
    ensure_namespace(&consumer, SECRET_NAMESPACE).await.unwrap();
    let kubeconfig = env.cluster("provider").admin_kubeconfig();
    apply_manifest(&consumer, &one_file(&kubeconfig, &[0, 1]))
        .await
        .unwrap();
    Api::<kbind_shared::api::Connection>::all(consumer.clone())
        .patch(
            "provider",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "access": { "bindingNamespaces": ["team-a"] } } })),
        )
        .await
        .unwrap();
    for (namespace, name, extra) in [
        ("team-b", "outside", json!({ "conflictPolicy": "Adopt" })),
        (
            "team-a",
            "secrets",
            json!({ "suspend": true, "relatedResources": [{ "resource": "secrets",
                "direction": "FromConsumer", "selector": { "names": ["db"] } }] }),
        ),
    ] {
        ensure_namespace(&consumer, namespace).await.unwrap();
        let mut spec = json!({ "connectionRef": { "name": "provider" },
                               "apis": [{ "name": "widgets.example.org" }] });
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        Api::<kbind_shared::api::Binding>::namespaced(consumer.clone(), namespace)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({ "apiVersion": "core.kbind.io/v1alpha1",
                    "kind": "Binding", "metadata": { "name": name }, "spec": spec }))
                .unwrap(),
            )
            .await
            .unwrap();
    }
    // Objects: w1 routed to another Connection, w2 with a route finalizer no route holds, w3
    // paused.
    install_crd(&consumer, &go_pulled("widgets", "Widget"))
        .await
        .unwrap();
    let route_finalizer = format!("{}second", keys::ROUTE_FINALIZER_PREFIX);
    let consumer_widgets = widgets(&consumer, "team-a");
    for (name, annotations, finalizers) in [
        (
            "w1",
            json!({ keys::ROUTE_ANNOTATION: "second/0000-second" }),
            json!([keys::SYNCER_FINALIZER, route_finalizer]),
        ),
        (
            "w2",
            json!({}),
            json!([keys::SYNCER_FINALIZER, route_finalizer]),
        ),
        (
            "w3",
            json!({ keys::PAUSED_ANNOTATION: keys::TRUE }),
            json!([keys::SYNCER_FINALIZER]),
        ),
    ] {
        let mut object = widget(name, 1);
        object.metadata.annotations = serde_json::from_value(annotations).unwrap();
        object.metadata.finalizers = serde_json::from_value(finalizers).unwrap();
        consumer_widgets
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
    }

    // plan: every fence named, the routed object, the stranded finalizer; exit 1 while routed.
    let output =
        std::process::Command::new(kbind_e2e::controlplane::kbind_bin("kubectl-kbind").unwrap())
            .args(["migrate", "rollback", "plan", "-o", "json", "--kubeconfig"])
            .arg(env.cluster("consumer").admin_kubeconfig_path())
            .output()
            .unwrap();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let plan: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let fences: Vec<&str> = plan["fences"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f.as_str())
        .collect();
    for expected in [
        "the Bindings in team-b start syncing",
        "sends those Binding team-a/secrets select (FromConsumer)",
        "lets Bindings team-b/outside take over provider objects",
        "suspended: Binding team-a/secrets",
        "1 paused object(s)",
    ] {
        assert!(
            fences.iter().any(|f| f.contains(expected)),
            "{expected}: {fences:#?}"
        );
    }
    assert_eq!(fences.len(), 5, "{fences:#?}");
    assert_eq!(
        plan["routed"],
        json!(["widgets.example.org team-a/w1 → second"])
    );
    assert_eq!(
        plan["stranded"],
        json!([format!("widgets.example.org team-a/w2 {route_finalizer}")])
    );

    // apply refuses while w1 is routed, writing nothing.
    let writes = || async {
        let all = apiserver_writes(&consumer).await.unwrap();
        let of = |key: &str| all.get(key).copied().unwrap_or_default();
        (
            of("PATCH apps/deployments "),
            of("PATCH example.org/widgets "),
        )
    };
    let before = writes().await;
    let refused =
        std::process::Command::new(kbind_e2e::controlplane::kbind_bin("kubectl-kbind").unwrap())
            .args(["migrate", "rollback", "apply", "--kubeconfig"])
            .arg(env.cluster("consumer").admin_kubeconfig_path())
            .output()
            .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("refused: 1 object(s) are routed to another Connection (first: widgets.example.org team-a/w1 → second)")
            && stderr.contains("nothing was changed"),
        "{stderr}"
    );
    assert_eq!(writes().await, before, "nothing written");

    // w1 moved back (as kbind leaves it once its route copy is drained): apply hands over —
    // kbind's two Deployments scaled to 0, one finalizer stripped, the Go konnector started.
    consumer_widgets
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": {
                "annotations": { keys::ROUTE_ANNOTATION: null },
                "finalizers": [keys::SYNCER_FINALIZER] } })),
        )
        .await
        .unwrap();
    let before = writes().await;
    let applied = plugin_json(&env, &["migrate", "rollback", "apply"]);
    let after = writes().await;
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (3, 1),
        "2 kbind Deployments stopped, the Go konnector started, 1 finalizer stripped: {applied:#}"
    );
    assert_eq!(applied["done"].as_array().unwrap().len(), 4, "{applied:#}");
    let w2 = consumer_widgets.get("w2").await.unwrap();
    assert_eq!(w2.finalizers(), [keys::SYNCER_FINALIZER.to_owned()]);
    let replicas = |namespace: &str, name: &str| {
        let client = consumer.clone();
        let (namespace, name) = (namespace.to_owned(), name.to_owned());
        async move {
            Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client, &namespace)
                .get(&name)
                .await
                .unwrap()
                .spec
                .unwrap()
                .replicas
        }
    };
    assert_eq!(replicas(KBIND_NAMESPACE, "kbind-syncer").await, Some(0));
    assert_eq!(
        replicas(KBIND_NAMESPACE, "kbind-schema-manager").await,
        Some(0)
    );
    assert_eq!(replicas("konnector-system", "konnector").await, Some(1));

    // And back to kbind: `migrate apply` stops the Go konnector again (one write).
    let before = writes().await;
    let back = plugin_json(&env, &["migrate", "apply", "--quiet-for", "1s"]);
    let after = writes().await;
    assert_eq!(after.0 - before.0, 1, "{back:#}");
    assert_eq!(replicas("konnector-system", "konnector").await, Some(0));
}
