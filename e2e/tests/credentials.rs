//! Short-lived provider credentials (#51) on two real clusters, kbind's programs real processes:
//! a bound ServiceAccount token is renewed in process before it expires — several times, while
//! objects keep syncing, with no restart — and written back into the Connection's Secret; a
//! Secret edited by hand meanwhile is respected.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Event, Secret, ServiceAccount};
use kbind_e2e::cluster::{USERS_NAMESPACE, ensure_namespace, kubeconfig_yaml};
use kbind_e2e::fixtures::*;
use kbind_e2e::wait::wait_for;
use kbind_shared::bound_token;
use kbind_shared::kubeconfig::InlineKubeconfig;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// The token in the consumer's provider Secret.
async fn secret_token(consumer: &Client) -> (String, Vec<u8>) {
    let secret = Api::<Secret>::namespaced(consumer.clone(), "kbind")
        .get("provider-kubeconfig")
        .await
        .unwrap();
    let data = secret.data.unwrap()["kubeconfig"].0.clone();
    let token = InlineKubeconfig::parse(&data).unwrap().token().unwrap();
    (token, data)
}

/// Sets the consumer Widget `team-a/w`'s size.
async fn resize(consumer: &Client, size: i64) {
    widgets(consumer, "team-a")
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "size": size } })),
        )
        .await
        .unwrap();
}

/// Sets it and waits (≤ 30 s) for its provider copy to show it.
async fn resize_synced(s: &SyncEnv, size: i64, what: &str) {
    resize(&s.consumer, size).await;
    wait_for(what, 30, || async {
        Ok((size_upstream(&s.provider, "w").await == Some(size)).then_some(()))
    })
    .await;
}

async fn size_upstream(provider: &Client, name: &str) -> Option<i64> {
    widgets(provider, "team-a")
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|w| w.data["spec"]["size"].as_i64())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_token_is_renewed_in_process_while_objects_sync_and_a_hand_edit_is_respected() {
    // The provider credential: a ServiceAccount with everything kbind needs and a token of the
    // API server's shortest lifetime (10 min); kbind renews once 1 % of it has passed (6 s).
    let s = SyncEnv::start_full(
        "credentials_renewal",
        &[0, 1, 2],
        None,
        &[],
        &["--token-renewal-at=0.01"],
    )
    .await;
    let cluster = s.env.cluster("provider");
    let user = cluster.mint_user("renewing").await.unwrap();
    let mut rules = provider_rules(true);
    rules.push(k8s_openapi::api::rbac::v1::PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["serviceaccounts/token".into()]),
        resource_names: Some(vec![user.service_account.clone()]),
        verbs: vec!["create".into()],
        ..Default::default()
    });
    cluster.grant(&user, "renewing", rules).await.unwrap();
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let accounts = Api::<ServiceAccount>::namespaced(s.provider.clone(), USERS_NAMESPACE);
    let first = accounts
        .create_token_request(&user.service_account, &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .and_then(|s| s.token)
        .unwrap();
    let kubeconfig = kubeconfig_yaml("provider", cluster.server(), cluster.ca_pem(), &first, None);
    put_kubeconfig(&s.consumer, "provider-kubeconfig", &kubeconfig).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "w", 0).await;

    let pids: Vec<Option<u32>> = [&s.manager, &s.syncer]
        .iter()
        .map(|p| s.env.process_ref(p.index).pid())
        .collect();
    // For 30 s: a change every second, each on the provider within 10 s; the Secret's token
    // watched.
    let started = Instant::now();
    let mut tokens = vec![first.clone()];
    let mut size = 0;
    let mut slowest = Duration::ZERO;
    while started.elapsed() < Duration::from_secs(30) {
        size += 1;
        resize(&s.consumer, size).await;
        let changed = Instant::now();
        loop {
            let (token, _) = secret_token(&s.consumer).await;
            if tokens.last() != Some(&token) {
                tokens.push(token);
            }
            if size_upstream(&s.provider, "w").await == Some(size) {
                break;
            }
            assert!(
                changed.elapsed() < Duration::from_secs(10),
                "change {size} not on the provider within 10 s ({} renewals so far)",
                tokens.len() - 1
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        slowest = slowest.max(changed.elapsed());
        tokio::time::sleep(Duration::from_millis(900)).await;
    }
    println!(
        "{} renewals in 30 s; {size} changes synced meanwhile, the slowest in {} ms",
        tokens.len() - 1,
        slowest.as_millis()
    );
    assert!(
        tokens.len() >= 4,
        "at least 3 renewals: {}",
        tokens.len() - 1
    );
    // Each a bound token of the same ServiceAccount and lifetime, each issued after the last.
    let claims: Vec<_> = tokens
        .iter()
        .map(|t| bound_token::claims(t).expect("a bound token"))
        .collect();
    for pair in claims.windows(2) {
        assert_eq!(
            (
                &pair[1].namespace,
                &pair[1].service_account,
                pair[1].lifetime()
            ),
            (&pair[0].namespace, &pair[0].service_account, 600)
        );
        assert!(pair[1].issued_at >= pair[0].issued_at, "{pair:?}");
    }
    assert_eq!(tokens.iter().collect::<BTreeSet<_>>().len(), tokens.len());
    // Said on the Connection.
    let events = Api::<Event>::all(s.consumer.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    // (Repeats of one Event are counted in its series.)
    let renewed: Vec<(String, i32)> = events
        .items
        .iter()
        .filter(|e| {
            e.involved_object.kind.as_deref() == Some("Connection")
                && e.reason.as_deref() == Some("CredentialRenewed")
        })
        .map(|e| {
            let count = e.series.as_ref().and_then(|s| s.count).or(e.count);
            (e.message.clone().unwrap_or_default(), count.unwrap_or(1))
        })
        .collect();
    assert!(
        renewed.iter().map(|(_, n)| n).sum::<i32>() >= 3,
        "{renewed:#?}"
    );
    assert!(
        renewed[0]
            .0
            .contains("kbind-e2e-users/renewing was renewed"),
        "{renewed:#?}"
    );
    // No restart: the processes that started the test run still.
    for (program, pid) in [&s.manager, &s.syncer].into_iter().zip(&pids) {
        let process = s.env.process_ref(program.index);
        assert!(process.is_running() && process.pid() == *pid);
    }

    // The right to a new token taken away: the renewal is refused, said as a Warning on the
    // Connection, and the token in use keeps working until it expires.
    Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(s.provider.clone())
        .patch(
            "renewing",
            &PatchParams::default(),
            &Patch::Merge(json!({ "rules": provider_rules(true) })),
        )
        .await
        .unwrap();
    let refused = wait_for("a CredentialRenewalFailed Warning", 60, || async {
        let list = Api::<Event>::all(s.consumer.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        Ok(list
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("CredentialRenewalFailed"))
            .map(|e| (e.type_.unwrap_or_default(), e.message.unwrap_or_default())))
    })
    .await;
    assert_eq!(refused.0, "Warning");
    assert!(
        refused.1.contains("kbind-e2e-users/renewing")
            && refused.1.contains("could not be renewed"),
        "{refused:?}"
    );
    size += 1;
    resize_synced(&s, size, "a change synced with the unrenewed token").await;

    // A Secret edited by hand — here to a token that never expires — is kept as written.
    let legacy: Secret = serde_json::from_value(json!({
        "metadata": {
            "name": "renewing-token",
            "annotations": { "kubernetes.io/service-account.name": user.service_account },
        },
        "type": "kubernetes.io/service-account-token",
    }))
    .unwrap();
    let secrets = Api::<Secret>::namespaced(s.provider.clone(), USERS_NAMESPACE);
    secrets
        .create(&PostParams::default(), &legacy)
        .await
        .unwrap();
    let never_expires = wait_for("the legacy token", 30, || async {
        let secret = secrets
            .get("renewing-token")
            .await
            .map_err(|e| e.to_string())?;
        Ok(secret.data.and_then(|d| {
            d.get("token")
                .map(|t| String::from_utf8_lossy(&t.0).into_owned())
        }))
    })
    .await;
    let by_hand = kubeconfig_yaml(
        "provider",
        cluster.server(),
        cluster.ca_pem(),
        &never_expires,
        None,
    );
    put_kubeconfig(&s.consumer, "provider-kubeconfig", &by_hand).await;
    size += 1;
    resize_synced(&s, size, "the change after the hand edit upstream").await;
    // Two renewal periods of the bound tokens pass: the Secret is as the hand wrote it.
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(secret_token(&s.consumer).await.1, by_hand.as_bytes());
    drop(s);
}
