//! Safe by default, on real clusters with kbind's programs as real processes: each test triggers a
//! hazard from outside — a Secret swapped to another cluster, a provider exporting a CRD the
//! consumer owns, a second Connection serving the same API — and shows nothing was written where
//! it must not be and nothing was lost.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::fixtures::*;
use kbind_e2e::kbind::crd_manifests;
use kbind_e2e::wait::wait_for;
use kbind_shared::api::{ClusterBinding, ClusterBindingSpec, SchemaSource};
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

/// Everything kbind could have written on a cluster: Widgets, kbind-labelled Leases, Namespaces
/// and Secrets.
async fn kbind_writes_on(client: &Client) -> Vec<String> {
    let managed = ListParams::default().labels("core.kbind.io/managed=true");
    let mut found: Vec<String> = Api::<DynamicObject>::all_with(client.clone(), &widget_resource())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .iter()
        .map(|w| {
            format!(
                "Widget {}/{}",
                w.namespace().unwrap_or_default(),
                w.name_any()
            )
        })
        .collect();
    found.extend(labelled::<Lease>(client, &managed).await);
    found.extend(labelled::<Namespace>(client, &managed).await);
    found.extend(labelled::<Secret>(client, &managed).await);
    found
}

/// `"<Kind> <name>"` of every `K` that `params` selects.
async fn labelled<K>(client: &Client, params: &ListParams) -> Vec<String>
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    Api::<K>::all(client.clone())
        .list(params)
        .await
        .unwrap()
        .items
        .iter()
        .map(|o| format!("{} {}", K::kind(&()), o.name_any()))
        .collect()
}

#[tokio::test]
async fn a_secret_swapped_to_another_cluster_is_never_written_to_and_swapping_back_resumes() {
    // Guarantee 0 (CONN-6, ID-3 made airtight): the syncer and the heartbeat write only with a
    // credential whose cluster identity was verified against the pin.
    let s = SyncEnv::start_with("safety_swap", &[0, 1, 2], None, &["other"]).await;
    let other = s.env.cluster("other").admin_client().await.unwrap();
    install_crd(&other, &widget_crd()).await.unwrap();
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    let consumer_widgets = widgets(&s.consumer, "team-a");
    for i in 0..50 {
        consumer_widgets
            .create(&PostParams::default(), &widget(&format!("w{i}"), i))
            .await
            .unwrap();
    }
    let provider_widgets = widgets(&s.provider, "team-a");
    wait_for("50 provider copies", 60, || async {
        let n = provider_widgets
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .len();
        Ok((n == 50).then_some(()))
    })
    .await;

    // Churn: every object changes, all the time, while the Secret is swapped.
    let churn = {
        let api = consumer_widgets.clone();
        tokio::spawn(async move {
            for round in 100.. {
                for i in 0..50 {
                    let patch = json!({ "spec": { "size": round * 100 + i } });
                    let _ = api
                        .patch(
                            &format!("w{i}"),
                            &PatchParams::default(),
                            &Patch::Merge(&patch),
                        )
                        .await;
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let other_kubeconfig = s.env.cluster("other").admin_kubeconfig();
    put_secret(
        &s.consumer,
        "provider-kubeconfig",
        "kubeconfig",
        other_kubeconfig.as_bytes(),
    )
    .await
    .unwrap();
    wait_connection(
        &s.consumer,
        "provider",
        "Ready=False/ClusterIdentityChanged",
    )
    .await;
    // Keep churning for a while with the wrong credential in place.
    tokio::time::sleep(Duration::from_secs(4)).await;
    churn.abort();
    let written = kbind_writes_on(&other).await;
    assert!(
        written.is_empty(),
        "kbind wrote to a cluster whose identity does not match the pin: {written:?}"
    );

    // Swap back: the verified credential is used again and sync resumes.
    put_secret(
        &s.consumer,
        "provider-kubeconfig",
        "kubeconfig",
        s.env.cluster("provider").admin_kubeconfig().as_bytes(),
    )
    .await
    .unwrap();
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    resize_and_wait_upstream(&consumer_widgets, &provider_widgets, "w7", 777).await;
    let written = kbind_writes_on(&other).await;
    assert!(written.is_empty(), "{written:?}");
}

/// What must stay byte-for-byte the same on a CRD kbind may not touch.
fn fingerprint(crd: &CustomResourceDefinition) -> String {
    format!(
        "{:?} {:?} {:?} {}",
        crd.metadata.resource_version,
        crd.labels(),
        crd.annotations(),
        serde_json::to_string(&crd.spec).unwrap()
    )
}

async fn get_crd(client: &Client, name: &str) -> CustomResourceDefinition {
    Api::<CustomResourceDefinition>::all(client.clone())
        .get(name)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_provider_exporting_a_crd_the_consumer_owns_never_changes_it_until_the_user_opts_in() {
    // Guarantee 1: a consumer CRD kbind did not create is never replaced or re-marked; kbind's
    // own group is refused outright.
    let s = SyncEnv::start("safety_crd_takeover", &[0, 1, 2], None).await;
    // The provider exports kbind's own Binding CRD and a cert-manager-like CRD, which the consumer
    // already has (installed by its admin, with another schema).
    let mut bindings_crd = crd_manifests()
        .unwrap()
        .into_iter()
        .find(|c| c.name_any() == "bindings.core.kbind.io")
        .unwrap();
    bindings_crd
        .labels_mut()
        .insert("core.kbind.io/exported".into(), "true".into());
    install_crd(&s.provider, &bindings_crd).await.unwrap();
    let exported_certificates = crd(
        "certificates",
        "cert-manager.io",
        "Certificate",
        &[("core.kbind.io/exported", "true")],
    );
    install_crd(&s.provider, &exported_certificates)
        .await
        .unwrap();
    let mut users_certificates = crd("certificates", "cert-manager.io", "Certificate", &[]);
    users_certificates.spec.versions[0].additional_printer_columns = Some(vec![
        serde_json::from_value(
            json!({ "name": "Issuer", "type": "string", "jsonPath": ".spec.issuer" }),
        )
        .unwrap(),
    ]);
    install_crd(&s.consumer, &users_certificates).await.unwrap();
    let before_bindings = fingerprint(&get_crd(&s.consumer, "bindings.core.kbind.io").await);
    let before_certificates =
        fingerprint(&get_crd(&s.consumer, "certificates.cert-manager.io").await);

    // A user binding lists them (Widgets stay in their own binding).
    let cluster_bindings: Api<ClusterBinding> = Api::all(s.consumer.clone());
    cluster_bindings
        .create(
            &PostParams::default(),
            &ClusterBinding::new(
                "takeover",
                ClusterBindingSpec {
                    binding: binding_spec(
                        "provider",
                        &["bindings.core.kbind.io", "certificates.cert-manager.io"],
                    ),
                },
            ),
        )
        .await
        .unwrap();
    let b = wait_binding(&cluster_bindings, "takeover", "Ready=False/SchemaConflict").await;
    let ready = b
        .status
        .as_ref()
        .and_then(|s| kbind_shared::conditions::find(&s.conditions, "Ready").cloned())
        .unwrap();
    assert!(
        ready.message.contains("core.kbind.io is reserved")
            && ready
                .message
                .contains("certificates.cert-manager.io was not created by kbind"),
        "{}",
        ready.message
    );
    let events = warning_events(&s.consumer, None, "takeover").await;
    assert!(
        events.iter().any(|e| e.starts_with("SchemaConflict: ")),
        "{events:?}"
    );
    // Other APIs of the Connection are unaffected.
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "w1", 1).await;

    // autoBind lists every export: the same refusal.
    patch_connection(&s.consumer, "provider", json!({ "autoBind": true })).await;
    wait_binding(&cluster_bindings, "provider", "Ready=False/SchemaConflict").await;
    // Several binding resyncs later, both consumer CRDs are unchanged.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        fingerprint(&get_crd(&s.consumer, "bindings.core.kbind.io").await),
        before_bindings
    );
    assert_eq!(
        fingerprint(&get_crd(&s.consumer, "certificates.cert-manager.io").await),
        before_certificates
    );

    // The explicit opt-in: the user lets the Connection take the cert-manager-like CRD over.
    adopt_crd(&s.consumer, "certificates.cert-manager.io", "provider")
        .await
        .unwrap();
    wait_for(
        "the adopted CRD to carry the provider's schema",
        30,
        || async {
            let crd = get_crd(&s.consumer, "certificates.cert-manager.io").await;
            // The provider's schema (no Issuer column), with kbind's delivery columns.
            let columns: Vec<String> = crd.spec.versions[0]
                .additional_printer_columns
                .iter()
                .flatten()
                .map(|c| c.name.clone())
                .collect();
            Ok(
                (annotation(&crd, "core.kbind.io/connection") == Some("provider")
                    && !columns.iter().any(|c| c == "Issuer")
                    && columns.iter().any(|c| c == "Delivery"))
                .then_some(()),
            )
        },
    )
    .await;
    // kbind's own group stays refused, opt-in or not.
    assert_eq!(
        fingerprint(&get_crd(&s.consumer, "bindings.core.kbind.io").await),
        before_bindings
    );
}

/// Connects the cluster `second` as Connection `second` and binds Widgets through it in the
/// ClusterBinding `second-widgets`, which is refused (`SchemaConflict`: Connection `provider`
/// serves the CRD); returns that binding.
async fn second_connection_binds_widgets(s: &SyncEnv) -> ClusterBinding {
    connect_to(
        &s.consumer,
        "second",
        &s.env.cluster("second").admin_kubeconfig(),
    )
    .await;
    let cluster_bindings: Api<ClusterBinding> = Api::all(s.consumer.clone());
    cluster_bindings
        .create(
            &PostParams::default(),
            &ClusterBinding::new(
                "second-widgets",
                ClusterBindingSpec {
                    binding: binding_spec("second", &["widgets.example.org"]),
                },
            ),
        )
        .await
        .unwrap();
    wait_binding(
        &cluster_bindings,
        "second-widgets",
        "Ready=False/SchemaConflict",
    )
    .await
}

#[tokio::test]
async fn a_second_connection_serving_the_same_api_is_refused_and_never_re_pins_it() {
    // Guarantee 1: two Connections serving one API → the second reports a conflict; the CRD's
    // marker never flips; every instance keeps syncing to the first provider.
    let s = SyncEnv::start_with("safety_two_connections", &[0, 1, 2], None, &["second"]).await;
    let second = s.env.cluster("second").admin_client().await.unwrap();
    install_crd(&second, &widget_crd()).await.unwrap();
    let cluster_bindings: Api<ClusterBinding> = Api::all(s.consumer.clone());
    wait_binding(&cluster_bindings, "widgets", "Ready=True").await;

    let b = second_connection_binds_widgets(&s).await;
    let status = b.status.unwrap();
    let message = &kbind_shared::conditions::find(&status.conditions, "Ready")
        .unwrap()
        .message;
    assert!(message.contains("serves Connection provider"), "{message}");

    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    for i in 0..5 {
        widgets(&s.consumer, "team-a")
            .create(&PostParams::default(), &widget(&format!("w{i}"), i))
            .await
            .unwrap();
    }
    wait_for("5 copies on the first provider", 30, || async {
        let n = widgets(&s.provider, "team-a")
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .len();
        Ok((n == 5).then_some(()))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let crd = get_crd(&s.consumer, "widgets.example.org").await;
    assert_eq!(
        annotation(&crd, "core.kbind.io/connection"),
        Some("provider")
    );
    let on_second = kbind_writes_on(&second).await;
    assert!(
        on_second.iter().all(|w| !w.starts_with("Widget")),
        "{on_second:?}"
    );
}

#[tokio::test]
async fn adopting_a_crd_another_connection_serves_drains_that_provider_before_the_new_one_gets_anything()
 {
    // #32.10: `core.kbind.io/adopt=<second>` on a CRD that Connection `provider` serves hands it
    // over the way a connectionRef move does — the first provider's copies are deleted (and
    // awaited) before any object reaches the second — so no object is ever on both.
    let s = SyncEnv::start_with("safety_adopt_drains", &[0, 1, 2], None, &["second"]).await;
    let second = s.env.cluster("second").admin_client().await.unwrap();
    install_crd(&second, &widget_crd()).await.unwrap();
    let cluster_bindings: Api<ClusterBinding> = Api::all(s.consumer.clone());
    wait_binding(&cluster_bindings, "widgets", "Ready=True").await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    for i in 0..10 {
        widgets(&s.consumer, "team-a")
            .create(&PostParams::default(), &widget(&format!("w{i}"), i))
            .await
            .unwrap();
    }
    let names = |client: Client| async move {
        widgets(&client, "team-a")
            .list(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .iter()
                    .map(ResourceExt::name_any)
                    .collect::<std::collections::BTreeSet<_>>()
            })
            .map_err(|e| e.to_string())
    };
    wait_for("10 copies on the first provider", 30, || async {
        Ok((names(s.provider.clone()).await?.len() == 10).then_some(()))
    })
    .await;
    second_connection_binds_widgets(&s).await;

    adopt_crd(&s.consumer, "widgets.example.org", "second")
        .await
        .unwrap();
    // Sampled every 100 ms, the second provider first: an object seen there and then still on
    // the first provider was on both at once.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let on_second = names(second.clone()).await.unwrap();
        let on_first = names(s.provider.clone()).await.unwrap();
        let both: Vec<&String> = on_second.intersection(&on_first).collect();
        assert!(both.is_empty(), "on both providers at once: {both:?}");
        if on_second.len() == 10 && on_first.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not handed over: first {on_first:?}, second {on_second:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let crd = get_crd(&s.consumer, "widgets.example.org").await;
    assert_eq!(annotation(&crd, "core.kbind.io/connection"), Some("second"));
    assert!(!crd.annotations().contains_key("core.kbind.io/handover-to"));
    wait_binding(&cluster_bindings, "second-widgets", "Ready=True").await;
    // A change now reaches the second provider only.
    merge_patch(
        &widgets(&s.consumer, "team-a"),
        "w3",
        &json!({ "spec": { "size": 33 } }),
    )
    .await;
    wait_for("the change on the second provider", 30, || async {
        let w = widgets(&second, "team-a")
            .get("w3")
            .await
            .map_err(|e| e.to_string())?;
        Ok((w.data["spec"]["size"] == 33).then_some(()))
    })
    .await;
    assert!(names(s.provider.clone()).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_provider_object_created_just_before_the_first_spec_up_is_a_conflict_never_overwritten() {
    // Guarantee 4: ownership is decided on fresh facts. The syncer is paused while, for each of
    // ten names, a consumer object and a foreign provider object appear; after it resumes, its
    // provider cache may not have seen the foreign one yet — the first write only creates, so each
    // is reported as a conflict and never overwritten.
    let mut s = SyncEnv::start("safety_fresh_facts", &[0, 1, 2], None).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    for client in [&s.consumer, &s.provider] {
        ensure_namespace(client, "team-a").await.unwrap();
    }
    let (consumer_widgets, provider_widgets) = (
        widgets(&s.consumer, "team-a"),
        widgets(&s.provider, "team-a"),
    );
    let syncer = s.syncer.index;
    s.env.process(syncer).signal("STOP").unwrap();
    for i in 0..10 {
        let name = format!("race-{i}");
        consumer_widgets
            .create(&PostParams::default(), &widget(&name, 1))
            .await
            .unwrap();
        provider_widgets
            .create(&PostParams::default(), &widget(&name, 99))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.env.process(syncer).signal("CONT").unwrap();
    for i in 0..10 {
        wait_conflict(
            &consumer_widgets,
            &format!("race-{i}"),
            Some("ForeignObjectExists"),
        )
        .await;
    }
    for i in 0..10 {
        let foreign = provider_widgets.get(&format!("race-{i}")).await.unwrap();
        assert_eq!(foreign.data["spec"]["size"], 99, "overwritten");
        assert!(
            !foreign
                .annotations()
                .contains_key("core.kbind.io/consumer-object-uid"),
            "re-marked"
        );
        assert!(
            foreign
                .managed_fields()
                .iter()
                .all(|f| f.manager.as_deref() != Some("kbind-konnector")),
            "kbind wrote to a foreign object"
        );
    }

    // A provider namespace deleted under a synced object: the next object there syncs again (the
    // known-namespace cache is forgotten on NotFound).
    ensure_namespace(&s.consumer, "team-b").await.unwrap();
    let consumer_b = widgets(&s.consumer, "team-b");
    let provider_b = widgets(&s.provider, "team-b");
    consumer_b
        .create(&PostParams::default(), &widget("first", 1))
        .await
        .unwrap();
    wait_for("the first copy in team-b", 30, || async {
        provider_b.get_opt("first").await.map_err(|e| e.to_string())
    })
    .await;
    Api::<Namespace>::all(s.provider.clone())
        .delete("team-b", &Default::default())
        .await
        .unwrap();
    kbind_e2e::wait::wait_gone(
        &Api::<Namespace>::all(s.provider.clone()),
        "team-b",
        "the provider namespace team-b to be gone",
        60,
    )
    .await;
    consumer_b
        .create(&PostParams::default(), &widget("second", 2))
        .await
        .unwrap();
    wait_for(
        "a copy in the re-created provider namespace",
        30,
        || async {
            provider_b
                .get_opt("second")
                .await
                .map_err(|e| e.to_string())
        },
    )
    .await;
}

#[tokio::test]
async fn a_create_only_apply_creates_what_is_absent_and_refuses_what_exists() {
    // Guarantee 4, the mechanism on a real API server: kbind_shared::apply::create_only makes a
    // server-side apply create-only, and the object it creates is owned by an Apply entry (so later
    // applies still remove the fields they drop).
    let env = kbind_e2e::TestEnv::start("safety_create_only", &["provider"])
        .await
        .unwrap();
    let provider = env.cluster("provider").admin_client().await.unwrap();
    install_crd(&provider, &widget_crd()).await.unwrap();
    ensure_namespace(&provider, "a").await.unwrap();
    let api = widgets(&provider, "a");
    let params = PatchParams::apply("kbind-konnector").force();
    let body = |name: &str, spec: serde_json::Value| {
        let mut body = json!({ "apiVersion": "example.org/v1", "kind": "Widget", "metadata": { "name": name, "namespace": "a" }, "spec": spec });
        kbind_shared::apply::create_only(&mut body);
        body
    };
    let created = api
        .patch(
            "new",
            &params,
            &Patch::Apply(body("new", json!({ "size": 1, "extra": true }))),
        )
        .await
        .unwrap();
    let entry = &created.managed_fields()[0];
    assert_eq!(
        (entry.manager.as_deref(), entry.operation.as_deref()),
        (Some("kbind-konnector"), Some("Apply"))
    );
    let again = api
        .patch(
            "new",
            &params,
            &Patch::Apply(body("new", json!({ "size": 2 }))),
        )
        .await
        .unwrap_err();
    assert!(kbind_shared::apply::exists(&again), "{again}");
    api.create(&PostParams::default(), &widget("foreign", 99))
        .await
        .unwrap();
    let refused = api
        .patch(
            "foreign",
            &params,
            &Patch::Apply(body("foreign", json!({ "size": 1 }))),
        )
        .await
        .unwrap_err();
    assert!(kbind_shared::apply::exists(&refused), "{refused}");
    assert_eq!(api.get("foreign").await.unwrap().data["spec"]["size"], 99);
    // A plain apply afterwards drops the field it no longer sends.
    let plain = json!({ "apiVersion": "example.org/v1", "kind": "Widget", "metadata": { "name": "new", "namespace": "a" }, "spec": { "size": 3 } });
    let updated = api
        .patch("new", &params, &Patch::Apply(plain))
        .await
        .unwrap();
    assert_eq!(updated.data["spec"], json!({ "size": 3 }));
}

/// Requests kbind's programs made to the consumer so far (`kbind_api_requests_total`).
async fn consumer_requests(programs: &[&Program]) -> f64 {
    let mut total = 0.0;
    for program in programs {
        let text = program.metrics().await.unwrap();
        total += text
            .lines()
            .filter(|l| {
                l.starts_with("kbind_api_requests_total{") && l.contains("cluster=\"consumer\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    total
}

#[tokio::test]
async fn a_secret_outside_the_allowed_namespaces_is_refused_without_a_hot_loop() {
    // Guarantee 6: --provider-secret-namespaces is enforced by kbind itself (not only by RBAC),
    // with a clear condition, and nothing retries in a hot loop.
    let Pair {
        mut env, consumer, ..
    } = Pair::start("safety_secret_namespace", &[]).await;
    let manager = start_lone_schema_manager(&mut env, &[]).await;
    let syncer = start_syncer(&mut env, "consumer", "syncer-0", &[])
        .await
        .unwrap();
    ensure_namespace(&consumer, "elsewhere").await.unwrap();
    let mut secret = Secret::default();
    secret.metadata.name = Some("p".into());
    secret.metadata.namespace = Some("elsewhere".into());
    secret.string_data = Some(
        [(
            "kubeconfig".to_owned(),
            env.cluster("provider").admin_kubeconfig(),
        )]
        .into(),
    );
    Api::<Secret>::namespaced(consumer.clone(), "elsewhere")
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();

    // Idle baseline: what kbind asks of the consumer in 10 s with nothing to do, once its start
    // (lists, watches, the first Lease writes) is over.
    let programs = [&manager, &syncer];
    for program in programs {
        wait_for("the metrics endpoint", 30, || async {
            Ok(program.metrics().await.ok().map(drop))
        })
        .await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let start = consumer_requests(&programs).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle = consumer_requests(&programs).await - start;

    let mut refused = connection("outside", "p", SchemaSource::Crd);
    refused.spec.kubeconfig_secret_ref.namespace = "elsewhere".into();
    create_connection(&consumer, &refused).await.unwrap();
    let c = wait_connection(&consumer, "outside", "SecretValid=False").await;
    let message = kbind_shared::conditions::find(&c.status.unwrap().conditions, "SecretValid")
        .unwrap()
        .message
        .clone();
    assert!(
        message.contains("Secret elsewhere/p is in a namespace kbind does not read provider credentials from (allowed: kbind, kbind-system)"),
        "{message}"
    );
    let start = consumer_requests(&programs).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let refusing = consumer_requests(&programs).await - start;
    println!("consumer requests in 10 s: idle {idle}, with the refused Connection {refusing}");
    // Tight: the refusal was written before the window; in it, at most a retry's few requests
    // beyond idle (#33.10) — not one per backoff step of a loop.
    assert!(
        refusing <= idle + 3.0,
        "kbind retries a refused Secret in a loop: {refusing} requests in 10 s (idle: {idle})"
    );
    // Nothing was held: no finalizer on a Secret kbind may not use.
    let held = Api::<Secret>::namespaced(consumer.clone(), "elsewhere")
        .get("p")
        .await
        .unwrap();
    assert!(held.finalizers().is_empty(), "{:?}", held.finalizers());
}

async fn widgets_count(api: &Api<DynamicObject>) -> usize {
    api.list(&ListParams::default()).await.unwrap().items.len()
}

async fn connection_status(consumer: &Client) -> kbind_shared::api::ConnectionStatus {
    Api::<kbind_shared::api::Connection>::all(consumer.clone())
        .get("provider")
        .await
        .unwrap()
        .status
        .unwrap_or_default()
}

async fn set_auto_bind(consumer: &Client, on: bool) {
    patch_connection(consumer, "provider", json!({ "autoBind": on })).await;
}

#[tokio::test]
async fn no_automatic_event_deletes_a_crd_or_an_object() {
    // Guarantee 2: an export missing for 2 s, one missing past the grace, autoBind turned off and
    // the Connection deleted — none deletes the consumer CRD or any of the 50 objects.
    let s = SyncEnv::start_full(
        "safety_no_cascade",
        &[0, 1],
        None,
        &[],
        &["--discovery-interval=1s", "--autobind-grace-period=8s"],
    )
    .await;
    let cluster_bindings: Api<ClusterBinding> = Api::all(s.consumer.clone());
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    set_auto_bind(&s.consumer, true).await;
    wait_binding(&cluster_bindings, "provider", "Ready=True").await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    let consumer_widgets = widgets(&s.consumer, "team-a");
    let provider_widgets = widgets(&s.provider, "team-a");
    for i in 0..50 {
        consumer_widgets
            .create(&PostParams::default(), &widget(&format!("w{i}"), i))
            .await
            .unwrap();
    }
    wait_for("50 provider copies", 60, || async {
        Ok((widgets_count(&provider_widgets).await == 50).then_some(()))
    })
    .await;
    let crds: Api<CustomResourceDefinition> = Api::all(s.consumer.clone());
    let crd_uid = crds.get("widgets.example.org").await.unwrap().uid();
    let intact = || async {
        let crd = crds.get_opt("widgets.example.org").await.unwrap();
        assert_eq!(
            crd.as_ref().and_then(|c| c.uid()),
            crd_uid,
            "the CRD was deleted"
        );
        assert_eq!(
            widgets_count(&consumer_widgets).await,
            50,
            "objects were deleted"
        );
        crd.unwrap()
    };
    let exported = |on: bool| {
        let provider = s.provider.clone();
        async move {
            label_crd(
                &provider,
                "widgets.example.org",
                "core.kbind.io/exported",
                on.then_some("true"),
            )
            .await
            .unwrap()
        }
    };

    // A 2 s blip: discovered as missing (recorded with its time), listed all along.
    exported(false).await;
    wait_for("the missing export recorded", 30, || async {
        Ok((!connection_status(&s.consumer)
            .await
            .missing_exports
            .is_empty())
        .then_some(()))
    })
    .await;
    wait_connection(&s.consumer, "provider", "Unbound=True/ExportsMissing").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        cluster_bindings
            .get("provider")
            .await
            .unwrap()
            .spec
            .apis
            .iter()
            .any(|a| a.name == "widgets.example.org")
    );
    exported(true).await;
    wait_for("the record cleared", 30, || async {
        Ok(connection_status(&s.consumer)
            .await
            .missing_exports
            .is_empty()
            .then_some(()))
    })
    .await;
    intact().await;

    // Missing past the grace: autoBind drops it; CRD and objects stay, the CRD marked unbound,
    // provider copies kept (orphaned).
    exported(false).await;
    kbind_e2e::wait::wait_gone(
        &cluster_bindings,
        "provider",
        "the autoBind binding to go",
        60,
    )
    .await;
    let crd = intact().await;
    assert!(
        crd.annotations().contains_key("core.kbind.io/unbound"),
        "{:?}",
        crd.annotations()
    );
    assert_eq!(
        widgets_count(&provider_widgets).await,
        50,
        "provider copies were deleted"
    );
    let w = consumer_widgets.get("w1").await.unwrap();
    assert!(w.finalizers().is_empty(), "{:?}", w.finalizers());
    let events = warning_events(&s.consumer, None, "provider").await;
    assert!(
        events.iter().any(|e| e.starts_with("AutoBindDropped")),
        "{events:?}"
    );
    let c = wait_connection(&s.consumer, "provider", "Unbound=True/CRDsKept").await;
    let kept = kbind_shared::conditions::find(&c.status.unwrap().conditions, "Unbound")
        .unwrap()
        .message
        .clone();
    assert!(kept.contains("widgets.example.org"), "{kept}");

    // Exported again: bound again, the mark comes off, objects sync again.
    exported(true).await;
    wait_binding(&cluster_bindings, "provider", "Ready=True").await;
    wait_for("the unbound mark removed", 30, || async {
        let crd = crds
            .get("widgets.example.org")
            .await
            .map_err(|e| e.to_string())?;
        Ok((!crd.annotations().contains_key("core.kbind.io/unbound")).then_some(()))
    })
    .await;
    resize_and_wait_upstream(&consumer_widgets, &provider_widgets, "w1", 1001).await;

    // autoBind turned off: the same.
    set_auto_bind(&s.consumer, false).await;
    kbind_e2e::wait::wait_gone(
        &cluster_bindings,
        "provider",
        "the autoBind binding to go",
        60,
    )
    .await;
    intact().await;

    // The Connection deleted (autoBind on again): the same.
    set_auto_bind(&s.consumer, true).await;
    wait_binding(&cluster_bindings, "provider", "Ready=True").await;
    delete_connection(&s.consumer, "provider").await;
    let crd = intact().await;
    assert!(crd.annotations().contains_key("core.kbind.io/unbound"));
}

#[tokio::test]
async fn a_connection_serves_only_the_namespaces_and_secrets_its_owner_allows() {
    // Guarantee 5: a Binding outside spec.access.bindingNamespaces gets a clear condition and
    // nothing syncs; a FromConsumer Secret entry needs spec.access.secretsToProvider.
    let s = SyncEnv::start("safety_access", &[0, 1], None).await;
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    patch_connection(
        &s.consumer,
        "provider",
        json!({ "access": { "bindingNamespaces": ["team-a"] } }),
    )
    .await;
    let mut team_secret = Secret::default();
    team_secret.metadata.name = Some("db".into());
    team_secret.string_data = Some([("password".to_owned(), "s3cret".to_owned())].into());
    for namespace in ["team-a", "team-b"] {
        ensure_namespace(&s.consumer, namespace).await.unwrap();
        Api::<Secret>::namespaced(s.consumer.clone(), namespace)
            .create(&PostParams::default(), &team_secret)
            .await
            .unwrap();
    }
    let binding = |namespace: &str| {
        let mut spec = binding_spec("provider", &["widgets.example.org"]);
        spec.related_resources = serde_json::from_value(json!([
            { "resource": "secrets", "direction": "FromConsumer", "selector": { "names": ["db"] } }
        ]))
        .unwrap();
        let mut b = kbind_shared::api::Binding::new("widgets", spec);
        b.metadata.namespace = Some(namespace.into());
        b
    };
    let in_b: Api<kbind_shared::api::Binding> = Api::namespaced(s.consumer.clone(), "team-b");
    in_b.create(&PostParams::default(), &binding("team-b"))
        .await
        .unwrap();
    let b = wait_binding(&in_b, "widgets", "Ready=False/NotAllowed").await;
    let message = &kbind_shared::conditions::find(&b.status.as_ref().unwrap().conditions, "Ready")
        .unwrap()
        .message;
    assert!(
        message.contains("does not serve Bindings in namespace team-b"),
        "{message}"
    );
    // Nothing was installed for it either.
    assert!(
        Api::<CustomResourceDefinition>::all(s.consumer.clone())
            .get_opt("widgets.example.org")
            .await
            .unwrap()
            .is_none()
    );

    // team-a may use it, but its Secret may not leave the consumer yet.
    let in_a: Api<kbind_shared::api::Binding> = Api::namespaced(s.consumer.clone(), "team-a");
    in_a.create(&PostParams::default(), &binding("team-a"))
        .await
        .unwrap();
    wait_binding(&in_a, "widgets", "Ready=True").await;
    let b = wait_binding(&in_a, "widgets", "RelatedResourcesSynced=False/NotAllowed").await;
    let related = kbind_shared::conditions::find(
        &b.status.as_ref().unwrap().conditions,
        "RelatedResourcesSynced",
    )
    .unwrap()
    .message
    .clone();
    assert!(
        related.contains("spec.access.secretsToProvider"),
        "{related}"
    );
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "w1", 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for namespace in ["team-a", "team-b"] {
        assert!(
            Api::<Secret>::namespaced(s.provider.clone(), namespace)
                .get_opt("db")
                .await
                .unwrap()
                .is_none(),
            "a Secret of {namespace} left the consumer"
        );
    }

    // The owner allows Secrets: team-a's is copied; team-b's still never is.
    patch_connection(
        &s.consumer,
        "provider",
        json!({ "access": { "secretsToProvider": true } }),
    )
    .await;
    wait_object(
        &Api::<Secret>::namespaced(s.provider.clone(), "team-a"),
        "db",
        "team-a's Secret on the provider",
        30,
        |_| true,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        Api::<Secret>::namespaced(s.provider.clone(), "team-b")
            .get_opt("db")
            .await
            .unwrap()
            .is_none()
    );

    // The API server itself refuses what is not a namespace name (CEL).
    let refused = Api::<kbind_shared::api::Connection>::all(s.consumer.clone())
        .patch(
            "provider",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "access": { "bindingNamespaces": ["Team_A"] } } })),
        )
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("each entry must be a namespace name"),
        "{refused}"
    );
}
