//! Leader election of `kbind-schema-manager` on a real cluster: only the leader reconciles and
//! writes; killing it hands over within one Lease duration; SIGTERM releases the Lease.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kbind_e2e::eventually;
use kbind_e2e::fixtures::*;
use kbind_e2e::kbind::http_get;
use kbind_shared::api::SchemaSource;
use kube::Api;

const LEASE_DURATION: Duration = Duration::from_secs(4);

fn metric(text: &str, line_prefix: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(line_prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// Requests a process made to a cluster with a writing verb, from its `/metrics`.
fn writes(text: &str, cluster: &str) -> Vec<String> {
    text.lines()
        .filter(|l| {
            l.starts_with("kbind_api_requests_total{")
                && l.contains(&format!("cluster=\"{cluster}\""))
        })
        .filter(|l| {
            ["create", "update", "patch", "delete"]
                .iter()
                .any(|v| l.contains(&format!("verb=\"{v}\"")))
        })
        .map(str::to_owned)
        .collect()
}

/// A schema manager competing for leadership with a short Lease.
async fn candidate(env: &mut kbind_e2e::TestEnv, name: &str) -> Program {
    let duration = format!(
        "--leader-election-lease-duration={}s",
        LEASE_DURATION.as_secs()
    );
    start_schema_manager(env, "consumer", name, &[&duration])
        .await
        .unwrap()
}

#[tokio::test]
async fn only_the_leader_reconciles_and_a_killed_leader_is_replaced_within_one_lease_duration() {
    let Pair {
        mut env, consumer, ..
    } = Pair::start("leader_election", &[]).await;
    let a = candidate(&mut env, "manager-a").await;

    let leases: Api<Lease> = Api::namespaced(consumer.clone(), KBIND_NAMESPACE);
    let holder = |lease: Lease| {
        lease
            .spec
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty())
    };
    let first = eventually("a leader", Duration::from_secs(20), || async {
        Ok(leases
            .get_opt("kbind-schema-manager")
            .await
            .map_err(|e| e.to_string())?
            .and_then(holder))
    })
    .await
    .unwrap();
    // The second starts once the first leads. (Two started at once race to create the Lease; the
    // loser's refused create, a 409 and no write, would count as a write attempt below.)
    let b = candidate(&mut env, "manager-b").await;
    let (leader, standby) = if first == "manager-a" {
        (&a, &b)
    } else {
        (&b, &a)
    };
    for m in [leader, standby] {
        let ready = eventually("/readyz", Duration::from_secs(10), || async {
            Ok(http_get(&m.probes, "/readyz")
                .await
                .ok()
                .filter(|r| r.0 == 200))
        })
        .await;
        assert!(ready.is_ok(), "a standby is ready too");
    }

    put_kubeconfig(&consumer, "p", &env.cluster("provider").admin_kubeconfig()).await;
    create_connection(&consumer, &connection("first", "p", SchemaSource::Crd))
        .await
        .unwrap();
    wait_connection(&consumer, "first", "Ready=True").await;

    let leader_metrics = leader.metrics().await.unwrap();
    let standby_metrics = standby.metrics().await.unwrap();
    assert_eq!(metric(&leader_metrics, "kbind_leader "), Some(1.0));
    assert_eq!(metric(&standby_metrics, "kbind_leader "), Some(0.0));
    assert!(
        !writes(&leader_metrics, "consumer").is_empty(),
        "the leader writes: {leader_metrics}"
    );
    assert!(
        writes(&standby_metrics, "consumer").is_empty(),
        "the standby wrote: {:?}",
        writes(&standby_metrics, "consumer")
    );
    // Readiness is the leader's to say: a standby exports none (so dashboards read one source).
    assert!(leader_metrics.contains("kbind_connection_ready{connection=\"first\"} 1"));
    assert!(
        !standby_metrics.contains("kbind_connection_ready{"),
        "{standby_metrics}"
    );
    assert!(
        !standby_metrics.contains("cluster=\"first\""),
        "the standby talked to the provider"
    );

    // SIGKILL the leader: the standby takes over within one Lease duration (plus one renewal).
    let leader_index = leader.index;
    let killed_at = Instant::now();
    env.process(leader_index).kill();
    let standby_name = if first == "manager-a" {
        "manager-b"
    } else {
        "manager-a"
    };
    eventually("the standby to take over", LEASE_DURATION * 3, || async {
        let now = leases
            .get("kbind-schema-manager")
            .await
            .map_err(|e| e.to_string())?;
        Ok((holder(now).as_deref() == Some(standby_name)).then_some(()))
    })
    .await
    .unwrap();
    let handover = killed_at.elapsed();
    eprintln!("leader handover took {handover:?} with a {LEASE_DURATION:?} Lease");
    assert!(
        handover <= LEASE_DURATION + LEASE_DURATION / 2,
        "handover took {handover:?}"
    );

    // The new leader reconciles.
    create_connection(&consumer, &connection("second", "p", SchemaSource::Crd))
        .await
        .unwrap();
    wait_connection(&consumer, "second", "Ready=True").await;
    assert_eq!(
        metric(&standby.metrics().await.unwrap(), "kbind_leader "),
        Some(1.0)
    );

    // SIGTERM: it exits 0 within 10 s and releases the Lease.
    let process = env.process(standby.index);
    process.signal("TERM").unwrap();
    let status = process.wait_exit(Duration::from_secs(10)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        process.log_tail(20)
    );
    assert!(
        process.log_tail(10).contains("released the leader Lease"),
        "{}",
        process.log_tail(10)
    );
}

#[tokio::test]
async fn a_leader_that_loses_its_lease_forgets_its_provider_clients() {
    // #32.10: a replica that stops leading keeps no provider client (its credential and identity
    // watch): only the current leader talks to providers.
    let Pair {
        mut env, consumer, ..
    } = Pair::start("leader_demoted", &[]).await;
    let a = candidate(&mut env, "manager-a").await;
    let leases: Api<Lease> = Api::namespaced(consumer.clone(), KBIND_NAMESPACE);
    let holds = |name: &'static str| {
        let leases = leases.clone();
        async move {
            let lease = leases
                .get_opt("kbind-schema-manager")
                .await
                .map_err(|e| e.to_string())?;
            let holder = lease
                .and_then(|l| l.spec)
                .and_then(|s| s.holder_identity)
                .unwrap_or_default();
            Ok((holder == name).then_some(()))
        }
    };
    eventually("manager-a to lead", Duration::from_secs(20), || {
        holds("manager-a")
    })
    .await
    .unwrap();
    put_kubeconfig(&consumer, "p", &env.cluster("provider").admin_kubeconfig()).await;
    create_connection(&consumer, &connection("first", "p", SchemaSource::Crd))
        .await
        .unwrap();
    wait_connection(&consumer, "first", "Ready=True").await;
    let b = candidate(&mut env, "manager-b").await;

    // manager-a freezes past its Lease; manager-b takes over; manager-a wakes up demoted.
    let process = env.process(a.index);
    process.signal("STOP").unwrap();
    eventually("manager-b to take over", LEASE_DURATION * 4, || {
        holds("manager-b")
    })
    .await
    .unwrap();
    process.signal("CONT").unwrap();
    let log_path = process.log().to_path_buf();
    eventually(
        "manager-a to step down and forget its provider client",
        LEASE_DURATION * 3,
        || async {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            // The log is coloured: drop the escape sequences before reading fields.
            let plain = |line: &str| {
                let mut out = String::new();
                let mut chars = line.chars();
                while let Some(c) = chars.next() {
                    if c == '\x1b' {
                        chars.by_ref().find(|c| *c == 'm');
                    } else {
                        out.push(c);
                    }
                }
                out
            };
            Ok(log
                .lines()
                .map(plain)
                .any(|l| l.contains("provider clients forgotten") && l.contains("kept=1"))
                .then_some(()))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", env.process(a.index).log_tail(30)));
    assert_eq!(
        metric(&a.metrics().await.unwrap(), "kbind_leader "),
        Some(0.0)
    );
    // The new leader serves the Connection with a client of its own.
    wait_connection(&consumer, "first", "Ready=True").await;
    assert_eq!(
        metric(&b.metrics().await.unwrap(), "kbind_leader "),
        Some(1.0)
    );
}
