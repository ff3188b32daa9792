//! Least privilege (#54): an API only Bindings list is read by kbind in their namespaces only, on
//! both clusters — proven from the API servers' audit logs — and the namespaces the syncer reads
//! grow and shrink with the Bindings without re-listing the others.

use std::time::Duration;

use kbind_e2e::cluster::{Audited, ensure_namespace};
use kbind_e2e::fixtures::*;
use kbind_e2e::wait::wait_for;
use kbind_shared::api::Binding;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};

const WIDGETS: &str = "widgets.example.org";

/// The requests about Widgets of a program whose User-Agent starts with `agent` an API server
/// audited, as (verb, namespace, URI) (namespace `*` for a cluster-wide one).
fn widget_requests(audited: Vec<Audited>, agent: &str) -> Vec<(String, String, String)> {
    audited
        .into_iter()
        .filter(|a| a.resource == "widgets" && a.user_agent.starts_with(agent))
        .map(|a| {
            let namespace = if a.namespace.is_empty() {
                "*".to_owned()
            } else {
                a.namespace
            };
            (a.verb, namespace, a.request_uri)
        })
        .collect()
}

async fn bind(consumer: &kube::Client, namespace: &str) {
    bind_in(consumer, namespace, "widgets", "provider", &[WIDGETS]).await;
}

#[tokio::test]
async fn an_api_only_bindings_list_is_read_only_in_their_namespaces_on_both_clusters() {
    let s = SyncEnv::start("least_privilege_namespaces", &[0, 1], None).await;
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    for namespace in ["team-a", "team-b", "team-c"] {
        ensure_namespace(&s.consumer, namespace).await.unwrap();
        ensure_namespace(&s.provider, namespace).await.unwrap();
    }
    bind(&s.consumer, "team-a").await;
    bind(&s.consumer, "team-b").await;
    // team-c has Widgets (the CRD is installed now) but no Binding.
    widgets(&s.consumer, "team-c")
        .create(&PostParams::default(), &widget("c1", 1))
        .await
        .unwrap();
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "a1", 1).await;
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-b", "b1", 1).await;
    resize_and_wait_upstream(
        &widgets(&s.consumer, "team-a"),
        &widgets(&s.provider, "team-a"),
        "a1",
        2,
    )
    .await;
    let copies = widgets(&s.provider, "team-a");
    let status_back = wait_for("a1's status back", 30, || async {
        let a1 = widgets(&s.consumer, "team-a").get("a1").await.unwrap();
        Ok(a1.data.get("status").cloned().filter(|s| !s.is_null()))
    })
    .await;
    assert!(status_back.is_object(), "{status_back:?}");
    assert!(copies.get_opt("a1").await.unwrap().is_some());

    // Both programs: the syncer's syncs, the schema manager's counts of conflicts and pauses.
    let outside = |cluster: &str, allowed: &[&str]| -> Vec<(String, String, String)> {
        widget_requests(s.env.cluster(cluster).audited(), "kbind-")
            .into_iter()
            .filter(|(_, namespace, _)| !allowed.contains(&namespace.as_str()))
            .collect()
    };
    for cluster in ["consumer", "provider"] {
        assert!(
            !widget_requests(s.env.cluster(cluster).audited(), "kbind-syncer/").is_empty(),
            "the audit log of the {cluster} shows the syncer's reads (the check can fail)"
        );
        let stray = outside(cluster, &["team-a", "team-b"]);
        assert!(
            stray.is_empty(),
            "kbind read or wrote Widgets outside team-a and team-b on the {cluster} \
             (`*`: cluster-wide): {stray:#?}"
        );
    }
    assert!(
        !widget_requests(s.env.cluster("consumer").audited(), "kbind-schema-manager/").is_empty(),
        "the consumer's audit log shows the schema manager's reads (the check can fail)"
    );
    let c1 = widgets(&s.consumer, "team-c").get("c1").await.unwrap();
    assert!(c1.finalizers().is_empty(), "team-c is not synced: {c1:?}");

    // team-c gets a Binding: it is read from then on, its Widget syncs, and team-a and team-b
    // are not listed again.
    let lists_in = |cluster: &str, namespace: &str| -> usize {
        widget_requests(s.env.cluster(cluster).audited(), "kbind-syncer/")
            .into_iter()
            .filter(|(verb, ns, uri)| {
                ns == namespace && (verb == "list" || uri.contains("sendInitialEvents=true"))
            })
            .count()
    };
    let listed_before = [
        lists_in("consumer", "team-a"),
        lists_in("consumer", "team-b"),
        lists_in("provider", "team-a"),
    ];
    bind(&s.consumer, "team-c").await;
    wait_for("c1's copy on the provider", 30, || async {
        Ok(widgets(&s.provider, "team-c")
            .get_opt("c1")
            .await
            .unwrap()
            .map(|_| ()))
    })
    .await;
    resize_and_wait_upstream(
        &widgets(&s.consumer, "team-b"),
        &widgets(&s.provider, "team-b"),
        "b1",
        3,
    )
    .await;
    assert_eq!(
        [
            lists_in("consumer", "team-a"),
            lists_in("consumer", "team-b"),
            lists_in("provider", "team-a"),
        ],
        listed_before,
        "a namespace more re-lists none of the others"
    );

    // team-c's Binding goes: its Widget is let go of (its copy deleted, kbind's finalizer
    // released), then team-c is read no more — a Widget made there afterwards is left alone.
    let in_c: Api<Binding> = Api::namespaced(s.consumer.clone(), "team-c");
    in_c.delete("widgets", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("team-c's Binding gone", 60, || async {
        Ok(in_c
            .get_opt("widgets")
            .await
            .unwrap()
            .is_none()
            .then_some(()))
    })
    .await;
    wait_for("c1 released", 30, || async {
        let c1 = widgets(&s.consumer, "team-c").get("c1").await.unwrap();
        let copy = widgets(&s.provider, "team-c").get_opt("c1").await.unwrap();
        Ok((c1.finalizers().is_empty() && copy.is_none()).then_some(()))
    })
    .await;
    // Then team-c is read no more: every watch of it the syncer started has ended, on both
    // clusters, and none starts again.
    let watches_of_c = |cluster: &str| -> (usize, usize) {
        let of_c = |requests: Vec<Audited>| {
            widget_requests(requests, "kbind-syncer/")
                .into_iter()
                .filter(|(verb, ns, _)| verb == "watch" && ns == "team-c")
                .count()
        };
        let c = s.env.cluster(cluster);
        (of_c(c.audited()), of_c(c.audited_watch_ends()))
    };
    for cluster in ["consumer", "provider"] {
        let (started, _) = watches_of_c(cluster);
        assert!(started > 0, "the syncer watched team-c on the {cluster}");
        wait_for(
            &format!("the syncer's watches of team-c on the {cluster} to end"),
            30,
            || async {
                let (started, ended) = watches_of_c(cluster);
                Ok((started == ended).then_some(()))
            },
        )
        .await;
    }
    let c_before = [watches_of_c("consumer"), watches_of_c("provider")];
    widgets(&s.consumer, "team-c")
        .create(&PostParams::default(), &widget("c2", 1))
        .await
        .unwrap();
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "a2", 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let c2 = widgets(&s.consumer, "team-c").get("c2").await.unwrap();
    assert!(c2.finalizers().is_empty(), "team-c is let go of: {c2:?}");
    assert!(
        widgets(&s.provider, "team-c")
            .get_opt("c2")
            .await
            .unwrap()
            .is_none(),
        "no copy of c2"
    );
    assert_eq!(
        [watches_of_c("consumer"), watches_of_c("provider")],
        c_before,
        "no watch of team-c starts again"
    );
    let stray: Vec<_> = ["consumer", "provider"]
        .into_iter()
        .flat_map(|cluster| outside(cluster, &["team-a", "team-b", "team-c"]))
        .collect();
    assert!(stray.is_empty(), "cluster-wide or elsewhere: {stray:#?}");
}
