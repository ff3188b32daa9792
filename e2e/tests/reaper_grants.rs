//! `kbind-reaper` learns Grants (#51): with `grants: true` it reads the heartbeats in every Grant's
//! boundary — the one place that consumer's Lease can be, which only its credential may write —
//! and a Stale Grant is revoked before anything of it is orphaned or deleted. Three real clusters;
//! the consumers run real kbind through their Grants' bundles, the issuer and the reaper are real
//! processes with their charts' RBAC and admission fences.

use std::time::Instant;

use kbind_e2e::cluster::{client_for, ensure_namespace};
use kbind_e2e::fixtures::*;
use kbind_e2e::wait::wait_for;
use kbind_shared::api::Connection;
use kbind_shared::api::iam::Grant;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

async fn consumer_uid(tenant: &Tenant) -> String {
    Api::<Connection>::all(tenant.client.clone())
        .get("widgets")
        .await
        .unwrap()
        .status
        .unwrap_or_default()
        .local_cluster_uid
}

async fn revoked(provider: &Client, grant: &str) -> bool {
    Api::<Grant>::all(provider.clone())
        .get(grant)
        .await
        .unwrap()
        .spec
        .revoked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_grant_is_revoked_its_copies_untouched_and_a_live_one_is_left_alone() {
    let (mut door, tenants) = tenants(
        "reaper-grants",
        &[("alice", "alice@example.org"), ("bob", "bob@example.org")],
        &["--heartbeat-lease-duration=1s"],
    )
    .await;
    let provider = door.provider.clone();
    for (tenant, size) in tenants.iter().zip([1, 2]) {
        widgets(&tenant.client, "team-a")
            .create(&Default::default(), &widget("w", size))
            .await
            .unwrap();
        let copies = widgets(&provider, &tenant.team_a());
        wait_for(&format!("{}'s copy", tenant.name), 30, || async {
            Ok((size_of(&copies, "w").await == Some(size)).then_some(()))
        })
        .await;
    }
    let uids = [
        consumer_uid(&tenants[0]).await,
        consumer_uid(&tenants[1]).await,
    ];

    // The policy reads no shared namespace's Leases (nothing is there): only the boundaries.
    ensure_namespace(&provider, "kbind").await.unwrap();
    start_reaper(
        &mut door.env,
        &provider,
        "kbind",
        json!({
            "leaseNamespaces": ["kbind"],
            "grants": true,
            "staleAfter": "10s",
            "deleteAfter": "2s",
            "action": "Revoke",
            "apis": ["widgets.example.org"],
        }),
        &[],
    )
    .await;
    for uid in &uids {
        wait_state(&provider, uid, "Live", 60).await;
    }
    let version = |tenant: &Tenant| {
        let copies = widgets(&provider, &tenant.team_a());
        async move { copies.get("w").await.unwrap().resource_version() }
    };
    let before = [version(&tenants[0]).await, version(&tenants[1]).await];

    // Alice's kbind stops: her heartbeat is renewed no more.
    for program in &tenants[0].programs {
        door.env.process(program.index).kill();
    }
    let stopped = Instant::now();
    wait_for("alice's Grant revoked by the reaper", 90, || async {
        Ok(revoked(&provider, &tenants[0].boundary).await.then_some(()))
    })
    .await;
    println!(
        "alice's Grant revoked {} s after her kbind stopped (staleAfter 10 s, deleteAfter 2 s)",
        stopped.elapsed().as_secs()
    );
    wait_state(&provider, &uids[0], "Revoked", 30).await;
    // Her credential stops working within seconds; nothing of hers is touched.
    let theirs = widgets(&tenants[0].credential, &tenants[0].team_a());
    wait_for("alice's credential refused", 30, || async {
        Ok(matches!(
            theirs.list(&ListParams::default()).await,
            Err(kube::Error::Api(s)) if s.code == 403
        )
        .then_some(()))
    })
    .await;
    // Bob, alive, is left alone — and nobody's copy was written.
    let status = policy_status(&provider).await.unwrap();
    assert_eq!(state_of(&status, &uids[1]), "Live", "{status:?}");
    assert_eq!(status.counts.revoked, 1, "{status:?}");
    assert!(!revoked(&provider, &tenants[1].boundary).await);
    let after = [version(&tenants[0]).await, version(&tenants[1]).await];
    assert_eq!(after, before);

    // The reaper's account may revoke a Grant and change nothing else of one: its chart's fence.
    let account = std::fs::read_to_string(door.env.dir().join("reaper.kubeconfig")).unwrap();
    let reaper = Api::<Grant>::all(client_for(&account).await.unwrap());
    let dry_run = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    for (grant, patch, what) in [
        (
            &tenants[0].boundary,
            json!({ "spec": { "revoked": false } }),
            "restore a Grant",
        ),
        (
            &tenants[1].boundary,
            json!({ "spec": { "credential": { "expirationSeconds": 7200 } } }),
            "lengthen a credential",
        ),
        (
            &tenants[1].boundary,
            json!({ "spec": { "revoked": true, "credential": { "mode": "LongLived" } } }),
            "revoke and change a credential at once",
        ),
    ] {
        let answer = reaper.patch(grant, &dry_run, &Patch::Merge(&patch)).await;
        assert!(
            // (Refused by the fence — the policy names itself — not by RBAC: the chart grants
            // `patch` on Grants.)
            matches!(&answer, Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("kbind-reaper-fence")),
            "the reaper may not {what}: {answer:?}"
        );
    }
    assert!(!revoked(&provider, &tenants[1].boundary).await);
}
