//! How many watches kbind's leader holds on the consumer, per kind, as the consumer's API server
//! counts them (#35.1: one reflector per kind for the leadership term, shared by every controller
//! and trigger that reads it).

use std::collections::BTreeMap;

use kbind_e2e::fixtures::*;
use kbind_e2e::kbind::apiserver_watches;

/// The kinds the leader's term watches, by the API server's `"<group>/<resource>"`.
const TERM_KINDS: [&str; 6] = [
    "core.kbind.io/connections",
    "core.kbind.io/clusterbindings",
    "core.kbind.io/bindings",
    "apiextensions.k8s.io/customresourcedefinitions",
    "coordination.k8s.io/leases",
    "/configmaps",
];

#[tokio::test]
async fn the_schema_manager_watches_each_consumer_kind_once() {
    let mut s = SyncEnv::start("watches_per_kind", &[0, 1, 2], None).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    kbind_e2e::cluster::ensure_namespace(&s.consumer, "team-a")
        .await
        .unwrap();
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "w1", 1).await;
    let with = apiserver_watches(&s.consumer).await.unwrap();

    // What the API server holds without the schema manager: the difference is its own.
    s.env.process(s.manager.index).kill();
    // Closed (fewer than before) and settled (two samples a second apart agree).
    let mut previous = with.clone();
    let mut without = None;
    for _ in 0..30 {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let now = apiserver_watches(&s.consumer).await.unwrap();
        if now != with && now == previous {
            without = Some(now);
            break;
        }
        previous = now;
    }
    let without = without.expect("the schema manager's watches close within 30 s");
    let manager: BTreeMap<&str, u64> = with
        .iter()
        .map(|(kind, n)| {
            let left = without.get(kind).copied().unwrap_or_default();
            (kind.as_str(), n.saturating_sub(left))
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    println!("the schema manager's watches on the consumer, per kind: {manager:?}");
    for kind in TERM_KINDS {
        let n = manager.get(kind).copied().unwrap_or_default();
        assert!(
            n <= 1,
            "{kind}: {n} watches (one reflector per kind): {manager:?}"
        );
    }
    for kind in [
        "core.kbind.io/connections",
        "core.kbind.io/clusterbindings",
        "core.kbind.io/bindings",
    ] {
        assert_eq!(
            manager.get(kind).copied(),
            Some(1),
            "the leader watches {kind}: {manager:?}"
        );
    }
}
