//! Horizontally sharded syncers on two real clusters: every work unit has exactly one live owner,
//! never two at any sampled instant; a SIGKILLed syncer's units move within its Lease duration
//! plus an assignment round; SIGTERM hands work back at once; both sides agree at the end.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::fixtures::*;
use kbind_e2e::kbind::install_crds;
use kbind_e2e::{TestEnv, eventually};
use kbind_shared::api::{ClusterBinding, ClusterBindingSpec, SchemaSource};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

const KINDS: [&str; 6] = ["Alpha", "Bravo", "Charlie", "Delta", "Echo", "Foxtrot"];
const LEASE: Duration = Duration::from_secs(3);

fn resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.org", "v1", kind),
        &format!("{}s", kind.to_lowercase()),
    )
}

fn object(kind: &str, name: &str, value: i64) -> DynamicObject {
    serde_json::from_value(json!({ "apiVersion": "example.org/v1", "kind": kind, "metadata": { "name": name }, "spec": { "value": value } })).unwrap()
}

/// Units each live syncer reports running, from the membership Leases.
async fn running(consumer: &Client) -> BTreeMap<String, BTreeSet<String>> {
    let leases: Api<Lease> = Api::namespaced(consumer.clone(), KBIND_NAMESPACE);
    let now = jiff::Timestamp::now();
    leases
        .list(&ListParams::default().labels("core.kbind.io/syncer-member=true"))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|l| {
            let spec = l.spec.clone().unwrap_or_default();
            let duration = jiff::SignedDuration::from_secs(i64::from(
                spec.lease_duration_seconds.unwrap_or(0),
            ));
            spec.renew_time.is_some_and(|t| t.0 + duration > now)
        })
        .map(|l| {
            let units = l
                .annotations()
                .get("core.kbind.io/running-units")
                .and_then(|a| serde_json::from_str(a).ok())
                .unwrap_or_default();
            (
                l.spec.and_then(|s| s.holder_identity).unwrap_or_default(),
                units,
            )
        })
        .collect()
}

fn owners(running: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (member, units) in running {
        for unit in units {
            out.entry(unit.clone()).or_default().push(member.clone());
        }
    }
    out
}

#[tokio::test]
async fn units_have_one_owner_and_move_safely_when_a_syncer_dies_or_leaves() {
    let mut env = TestEnv::start("sharding", &["consumer", "provider"])
        .await
        .expect("clusters start");
    let consumer = env.cluster("consumer").admin_client().await.unwrap();
    let provider = env.cluster("provider").admin_client().await.unwrap();
    install_crds(&consumer).await.unwrap();
    for kind in KINDS {
        install_crd(
            &provider,
            &crd(
                &format!("{}s", kind.to_lowercase()),
                "example.org",
                kind,
                &[("core.kbind.io/exported", "true")],
            ),
        )
        .await
        .unwrap();
    }
    let manager = start_schema_manager(
        &mut env,
        "consumer",
        "schema-manager",
        &["--leader-elect=false"],
    )
    .await
    .unwrap();
    let mut syncers = BTreeMap::new();
    for name in ["syncer-a", "syncer-b", "syncer-c"] {
        syncers.insert(
            name,
            start_syncer(
                &mut env,
                "consumer",
                name,
                &["--membership-lease-duration=3s"],
            )
            .await
            .unwrap(),
        );
    }
    put_secret(
        &consumer,
        "p",
        "kubeconfig",
        env.cluster("provider").admin_kubeconfig().as_bytes(),
    )
    .await
    .unwrap();
    create_connection(&consumer, &connection("provider", "p", SchemaSource::Crd))
        .await
        .unwrap();
    let apis: Vec<String> = KINDS
        .iter()
        .map(|k| format!("{}s.example.org", k.to_lowercase()))
        .collect();
    let bindings: Api<ClusterBinding> = Api::all(consumer.clone());
    let api_names: Vec<&str> = apis.iter().map(String::as_str).collect();
    let spec = binding_spec("provider", &api_names);
    bindings
        .create(
            &PostParams::default(),
            &ClusterBinding::new("all", ClusterBindingSpec::from(spec)),
        )
        .await
        .unwrap();
    wait_binding_condition(&bindings, "all", "Ready", "True", None)
        .await
        .unwrap();
    ensure_namespace(&consumer, "team-a").await.unwrap();

    // Every unit owned by exactly one live syncer, and spread over the three.
    let units: BTreeSet<String> = apis.iter().map(|a| format!("provider/{a}")).collect();
    eventually(
        "every unit to have one owner",
        Duration::from_secs(30),
        || async {
            let owners = owners(&running(&consumer).await);
            let all_single = units
                .iter()
                .all(|u| owners.get(u).is_some_and(|o| o.len() == 1));
            if all_single {
                Ok(Some(()))
            } else {
                Err(format!("owners: {owners:?}"))
            }
        },
    )
    .await
    .unwrap();
    let spread = running(&consumer)
        .await
        .values()
        .filter(|u| !u.is_empty())
        .count();
    assert!(spread >= 2, "6 units all on one of 3 syncers");

    // A sampler checks, all through the churn, that no unit ever has two live owners.
    let sampling = Arc::new(AtomicBool::new(true));
    let worst = Arc::new(AtomicUsize::new(0));
    let sampler = tokio::spawn({
        let (consumer, sampling, worst) = (consumer.clone(), sampling.clone(), worst.clone());
        async move {
            while sampling.load(Ordering::Relaxed) {
                let most = owners(&running(&consumer).await)
                    .values()
                    .map(Vec::len)
                    .max()
                    .unwrap_or(0);
                worst.fetch_max(most, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });

    // Churn on every API while one syncer is SIGKILLed and another leaves with SIGTERM.
    let churn = tokio::spawn({
        let consumer = consumer.clone();
        async move {
            for round in 0..30i64 {
                for kind in KINDS {
                    let api: Api<DynamicObject> =
                        Api::namespaced_with(consumer.clone(), "team-a", &resource(kind));
                    let name = format!("o{}", round % 12);
                    if round < 12 {
                        api.create(&PostParams::default(), &object(kind, &name, round))
                            .await
                            .unwrap();
                    } else if round < 24 {
                        api.patch(
                            &name,
                            &PatchParams::default(),
                            &Patch::Merge(&json!({ "spec": { "value": round * 10 } })),
                        )
                        .await
                        .unwrap();
                    } else if round % 2 == 0 {
                        api.delete(&name, &DeleteParams::default()).await.unwrap();
                    }
                }
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = running(&consumer).await;
    let (victim, victim_units) = before
        .iter()
        .max_by_key(|(_, u)| u.len())
        .map(|(m, u)| (m.clone(), u.clone()))
        .unwrap();
    let victim_index = syncers[victim.as_str()].index;
    env.process(victim_index).kill();
    let killed_at = Instant::now();
    eventually(
        "the killed syncer's units to move",
        Duration::from_secs(30),
        || async {
            let owners = owners(&running(&consumer).await);
            Ok(victim_units
                .iter()
                .all(|u| {
                    owners
                        .get(u)
                        .is_some_and(|o| o.len() == 1 && o[0] != victim)
                })
                .then_some(()))
        },
    )
    .await
    .unwrap();
    let moved_after = killed_at.elapsed();
    eprintln!(
        "units of the SIGKILLed syncer running elsewhere after {moved_after:?} (membership Lease {LEASE:?})"
    );
    assert!(
        moved_after <= LEASE + Duration::from_secs(4),
        "took {moved_after:?}"
    );

    // SIGTERM another: it hands its units back and releases its Lease.
    let leaver = before.keys().find(|m| **m != victim).unwrap().clone();
    let leaver_process = env.process(syncers[leaver.as_str()].index);
    leaver_process.signal("TERM").unwrap();
    let status = leaver_process.wait_exit(Duration::from_secs(10)).await;
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    churn.await.unwrap();
    eventually(
        "every unit on the last syncer",
        Duration::from_secs(30),
        || async {
            let owners = owners(&running(&consumer).await);
            Ok(units
                .iter()
                .all(|u| owners.get(u).is_some_and(|o| o.len() == 1))
                .then_some(()))
        },
    )
    .await
    .unwrap();

    // Both sides agree on every API.
    for kind in KINDS {
        let c: Api<DynamicObject> =
            Api::namespaced_with(consumer.clone(), "team-a", &resource(kind));
        let p: Api<DynamicObject> =
            Api::namespaced_with(provider.clone(), "team-a", &resource(kind));
        eventually(
            &format!("{kind}s to agree"),
            Duration::from_secs(60),
            || async {
                let specs = |list: Vec<DynamicObject>| {
                    list.into_iter()
                        .map(|o| (o.name_any(), o.data["spec"].clone()))
                        .collect::<BTreeMap<_, _>>()
                };
                let (cs, ps) = (
                    specs(
                        c.list(&ListParams::default())
                            .await
                            .map_err(|e| e.to_string())?
                            .items,
                    ),
                    specs(
                        p.list(&ListParams::default())
                            .await
                            .map_err(|e| e.to_string())?
                            .items,
                    ),
                );
                if cs.len() == 9 && cs == ps {
                    Ok(Some(()))
                } else {
                    Err(format!("consumer {cs:?} provider {ps:?}"))
                }
            },
        )
        .await
        .unwrap();
    }
    sampling.store(false, Ordering::Relaxed);
    sampler.await.unwrap();
    assert_eq!(
        worst.load(Ordering::Relaxed),
        1,
        "a unit had two live owners at a sampled instant"
    );
    let metrics = manager.metrics().await.unwrap();
    assert!(metrics.contains("kbind_assignment_overlaps 0"), "{metrics}");
}
