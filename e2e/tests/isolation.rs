//! Isolated tenants on one provider (#51): two consumers whose namespaces and objects have the same
//! names bind one Export, each through the bundle `kubectl kbind grant` printed for it, and sync
//! side by side — each with only its Grant's credential, each copy in its own boundary (`<boundary>-N`),
//! neither writing nor reading the other's. Three real clusters; kbind's programs, the issuer and
//! the plugin real processes.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Secret};
use kbind_e2e::fixtures::*;
use kbind_e2e::wait::{wait_for, wait_gone};
use kbind_provider::issuer::plan;
use kbind_shared::keys;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_with_the_same_names_sync_side_by_side_each_in_its_boundary() {
    let (door, tenants) = tenants(
        "isolation",
        &[("alice", "alice@example.org"), ("bob", "bob@example.org")],
        &[],
    )
    .await;
    let (env, provider) = (&door.env, door.provider.clone());
    assert_ne!(tenants[0].boundary, tenants[1].boundary);

    // The same namespace and name on both consumers, different specs.
    for (tenant, size) in tenants.iter().zip([1, 2]) {
        widgets(&tenant.client, "team-a")
            .create(&Default::default(), &widget("w", size))
            .await
            .unwrap();
    }
    for (tenant, size) in tenants.iter().zip([1, 2]) {
        let copies = widgets(&provider, &tenant.team_a());
        wait_for(
            &format!(
                "{}'s copy in {} with size {size}",
                tenant.name,
                tenant.team_a()
            ),
            30,
            || async { Ok((size_of(&copies, "w").await == Some(size)).then_some(())) },
        )
        .await;
        let mine = widgets(&tenant.client, "team-a");
        wait_for(
            &format!("{}'s status back from its own copy", tenant.name),
            30,
            || async {
                let w = mine.get("w").await.map_err(|e| e.to_string())?;
                Ok((w.data["status"]["observedSize"] == size).then_some(w))
            },
        )
        .await;
        let w = mine.get("w").await.unwrap();
        assert!(
            !w.annotations().contains_key(keys::CONFLICT_ANNOTATION),
            "{}: {:?}",
            tenant.name,
            w.annotations()
        );
        // The copy's namespace is the boundary's, labelled for it by kbind.
        let namespace = Api::<k8s_openapi::api::core::v1::Namespace>::all(provider.clone())
            .get(&tenant.team_a())
            .await
            .unwrap();
        assert_eq!(
            namespace.labels().get(plan::BOUNDARY_LABEL),
            Some(&tenant.boundary)
        );
    }
    // Related resources too: the provider's Secret beside each tenant's copies reaches that
    // tenant only.
    for tenant in &tenants {
        Api::<Secret>::namespaced(provider.clone(), &tenant.team_a())
            .create(
                &Default::default(),
                &serde_json::from_value(json!({
                    "metadata": { "name": "db-credentials" },
                    "stringData": { "for": tenant.name },
                }))
                .unwrap(),
            )
            .await
            .unwrap();
    }
    for tenant in &tenants {
        let secrets = Api::<Secret>::namespaced(tenant.client.clone(), "team-a");
        let got = wait_for(
            &format!("{}'s db-credentials copied from its boundary", tenant.name),
            30,
            || async {
                let found = secrets
                    .get_opt("db-credentials")
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(found.and_then(|s| s.data).map(|d| d["for"].0.clone()))
            },
        )
        .await;
        assert_eq!(got, tenant.name.as_bytes());
    }

    // Nothing under the consumers' own namespace name on the provider.
    let unmapped = widgets(&provider, "team-a")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(unmapped.items.is_empty(), "{:?}", unmapped.items);

    // A change of one tenant's object reaches its copy only.
    widgets(&tenants[0].client, "team-a")
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "size": 5 } })),
        )
        .await
        .unwrap();
    let alice_copies = widgets(&provider, &tenants[0].team_a());
    wait_for("alice's change on her copy", 30, || async {
        Ok((size_of(&alice_copies, "w").await == Some(5)).then_some(()))
    })
    .await;
    assert_eq!(
        size_of(&widgets(&provider, &tenants[1].team_a()), "w").await,
        Some(2)
    );

    // `kubectl kbind diff` finds each tenant's copy where it is, in its boundary.
    for tenant in &tenants {
        let kubeconfig = env.cluster(tenant.name).admin_kubeconfig_path();
        let run = plugin(
            &kubeconfig,
            &["diff", "widget/w", "-n", "team-a", "-o", "json"],
        )
        .await;
        assert_eq!(run.code, 0, "{}: {run}", tenant.name);
        let report = run.json();
        assert_eq!(report["identical"], true, "{report:#}");
        let copy = widgets(&provider, &tenant.team_a()).get("w").await.unwrap();
        assert_eq!(
            report["provider"]["copy"]["uid"],
            json!(copy.metadata.uid),
            "{report:#}"
        );
    }

    // `kubectl kbind doctor` asks the provider where each tenant's credential works — and it
    // lacks nothing there.
    for tenant in &tenants {
        let kubeconfig = env.cluster(tenant.name).admin_kubeconfig_path();
        let run = plugin(&kubeconfig, &["doctor", "widgets", "-o", "json"]).await;
        assert_eq!(run.code, 0, "{}: {run}", tenant.name);
        let report = run.json();
        assert_eq!(report["missingRbac"], serde_json::Value::Null, "{report:#}");
        let asked: Vec<&str> = report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["need"]["namespace"].as_str())
            .collect();
        assert!(asked.contains(&tenant.team_a().as_str()), "{report:#}");
    }

    // Provider Events, when asked for: each tenant's copy's Event reaches that tenant's object
    // only (the watch is in the tenant's boundary, the Event mapped back).
    for tenant in &tenants {
        let bindings = Api::<kbind_shared::api::ClusterBinding>::all(tenant.client.clone());
        bindings
            .patch(
                "widgets",
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "providerEvents": {} } })),
            )
            .await
            .unwrap();
        let copy = widgets(&provider, &tenant.team_a()).get("w").await.unwrap();
        let event: Event = serde_json::from_value(json!({
            "metadata": { "generateName": "w." },
            "involvedObject": {
                "apiVersion": "example.org/v1", "kind": "Widget",
                "name": "w", "namespace": tenant.team_a(), "uid": copy.uid(),
            },
            // (Warnings are what a binding asks for by default.)
            "type": "Warning",
            "reason": format!("ReadyFor-{}", tenant.name),
            "message": "provisioned",
            "source": { "component": "db-operator" },
            "firstTimestamp": jiff::Timestamp::now().to_string(),
            "lastTimestamp": jiff::Timestamp::now().to_string(),
            "count": 1,
        }))
        .unwrap();
        Api::<Event>::namespaced(provider.clone(), &tenant.team_a())
            .create(&Default::default(), &event)
            .await
            .unwrap();
    }
    for tenant in &tenants {
        let uid = widgets(&tenant.client, "team-a")
            .get("w")
            .await
            .unwrap()
            .uid()
            .unwrap();
        let events = Api::<Event>::namespaced(tenant.client.clone(), "team-a");
        let reasons = wait_for(
            &format!("the provider's Event on {}'s object", tenant.name),
            30,
            || async {
                let copied: Vec<String> = events
                    .list(&ListParams::default().fields(&format!("involvedObject.uid={uid}")))
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .into_iter()
                    .filter(|e| e.reporting_component.as_deref() == Some("kbind-konnector"))
                    .filter_map(|e| e.reason)
                    .filter(|r| r.starts_with("ReadyFor-"))
                    .collect();
                Ok((!copied.is_empty()).then_some(copied))
            },
        )
        .await;
        assert_eq!(reasons, [format!("ReadyFor-{}", tenant.name)]);
    }

    // Each credential reads and writes its own boundary only: the other's copies are refused.
    for (me, other) in [(&tenants[0], &tenants[1]), (&tenants[1], &tenants[0])] {
        let theirs = widgets(&me.credential, &other.team_a());
        let listed = theirs.list(&ListParams::default()).await;
        assert!(
            matches!(&listed, Err(kube::Error::Api(s)) if s.code == 403),
            "{} listing {}: {listed:?}",
            me.name,
            other.team_a()
        );
        let deleted = theirs.delete("w", &DeleteParams::default()).await;
        assert!(
            matches!(&deleted, Err(kube::Error::Api(s)) if s.code == 403),
            "{} deleting in {}: {deleted:?}",
            me.name,
            other.team_a()
        );
        let everywhere = widgets_everywhere(&me.credential)
            .list(&ListParams::default())
            .await;
        assert!(
            matches!(&everywhere, Err(kube::Error::Api(s)) if s.code == 403),
            "{} listing every namespace: {everywhere:?}",
            me.name
        );
    }

    // Deleting one tenant's object deletes its copy only.
    widgets(&tenants[0].client, "team-a")
        .delete("w", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&alice_copies, "w", "alice's copy deleted", 30).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        size_of(&widgets(&provider, &tenants[1].team_a()), "w").await,
        Some(2),
        "bob's copy stays"
    );
}

fn widgets_everywhere(client: &Client) -> Api<kube::api::DynamicObject> {
    Api::all_with(client.clone(), &widget_resource())
}
