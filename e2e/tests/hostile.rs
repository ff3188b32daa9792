//! Hostile and broken input from outside, on real clusters with kbind's programs as real
//! processes: each gets a clear per-object message, no crash, nothing deleted, and everything
//! else keeps working.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_e2e::TestEnv;
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::fixtures::*;
use kbind_e2e::kbind::install_crds;
use kbind_e2e::wait::wait_for;
use kbind_shared::api::{ClusterBinding, ClusterBindingSpec, PullPolicy, SchemaSource};
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;

/// A provider CRD in its own group whose OpenAPI document is far over 256 KiB (a plain group version's document already exceeds 64 KiB).
fn huge_crd() -> CustomResourceDefinition {
    let properties: serde_json::Map<String, serde_json::Value> = (0..1600)
        .map(|i| {
            (
                format!("field{i:04}"),
                json!({ "type": "string", "description": "x".repeat(200) }),
            )
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": { "name": "monsters.big.example.org", "labels": { "core.kbind.io/exported": "true" } },
        "spec": {
            "group": "big.example.org", "scope": "Namespaced",
            "names": { "plural": "monsters", "singular": "monster", "kind": "Monster" },
            "versions": [{ "name": "v1", "served": true, "storage": true,
                "schema": { "openAPIV3Schema": { "type": "object", "properties": {
                    "spec": { "type": "object", "properties": properties },
                }}}}],
        },
    }))
    .expect("a valid CRD")
}

async fn api_entry(
    consumer: &Client,
    binding: &str,
    api: &str,
) -> Option<kbind_shared::api::ApiStatus> {
    Api::<ClusterBinding>::all(consumer.clone())
        .get(binding)
        .await
        .ok()?
        .status?
        .apis
        .into_iter()
        .find(|a| a.name == api)
}

#[tokio::test]
async fn an_oversized_openapi_document_is_reported_on_its_api_and_the_others_sync() {
    let Pair {
        mut env,
        consumer,
        provider,
    } = Pair::start("hostile_openapi_size", &[]).await;
    install_crd(&provider, &widget_crd()).await.unwrap();
    install_crd(&provider, &huge_crd()).await.unwrap();
    let manager = start_lone_schema_manager(&mut env, &["--openapi-document-limit=256Ki"]).await;
    start_syncer(&mut env, "consumer", "syncer-0", &[])
        .await
        .unwrap();
    put_kubeconfig(&consumer, "p", &env.cluster("provider").admin_kubeconfig()).await;
    let mut c = connection("provider", "p", SchemaSource::OpenApi);
    c.spec.schema.pull_policy = PullPolicy::Bound;
    create_connection(&consumer, &c).await.unwrap();
    // The oversized API is still an export: binding it says why it cannot be installed. (The
    // provider publishes a new CRD's OpenAPI document a moment after the CRD is established, so
    // the first discovery may see only Widgets; the next one, a second later, sees both.)
    wait_connection(&consumer, "provider", "Ready=True").await;
    wait_for("both APIs exported", 30, || async {
        let connection = Api::<kbind_shared::api::Connection>::all(consumer.clone())
            .get("provider")
            .await
            .map_err(|e| e.to_string())?;
        let exported: Vec<String> = connection
            .status
            .unwrap_or_default()
            .exported_apis
            .into_iter()
            .map(|e| e.name)
            .collect();
        if exported.contains(&"monsters.big.example.org".to_owned())
            && exported.contains(&"widgets.example.org".to_owned())
        {
            Ok(Some(()))
        } else {
            Err(format!("exported: {exported:?}"))
        }
    })
    .await;

    Api::<ClusterBinding>::all(consumer.clone())
        .create(
            &PostParams::default(),
            &ClusterBinding::new(
                "both",
                ClusterBindingSpec::from(binding_spec(
                    "provider",
                    &["widgets.example.org", "monsters.big.example.org"],
                )),
            ),
        )
        .await
        .unwrap();
    let monster = wait_for("the oversized API's entry", 60, || async {
        Ok(api_entry(&consumer, "both", "monsters.big.example.org")
            .await
            .filter(|e| !e.bound && e.message.contains("larger than 262144 bytes")))
    })
    .await;
    eprintln!("monsters: {} {}", monster.reason, monster.message);
    assert!(
        monster.message.contains("--openapi-document-limit"),
        "{}",
        monster.message
    );
    assert!(
        Api::<CustomResourceDefinition>::all(consumer.clone())
            .get_opt("monsters.big.example.org")
            .await
            .unwrap()
            .is_none(),
        "nothing is installed for it"
    );
    // The other API is unaffected: bound, and its objects sync.
    wait_for("the widgets entry bound", 60, || async {
        match api_entry(&consumer, "both", "widgets.example.org").await {
            Some(e) if e.bound => Ok(Some(())),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    ensure_namespace(&consumer, "team-a").await.unwrap();
    create_widget_and_wait_upstream(&consumer, &provider, "team-a", "w", 3).await;
    assert!(
        env.process(manager.index).try_status().is_none(),
        "the schema manager is still running"
    );
}

#[tokio::test]
async fn oversized_and_malformed_names_are_refused_at_the_door() {
    // The CRDs bound every name: the API server refuses such objects with a message naming the
    // field, before kbind ever sees them.
    let env = TestEnv::start("hostile_names", &["consumer"])
        .await
        .expect("clusters start");
    let consumer = env.cluster("consumer").admin_client().await.unwrap();
    install_crds(&consumer).await.unwrap();
    ensure_namespace(&consumer, "team-a").await.unwrap();
    let long = "c".repeat(300);
    let bindings: Api<kbind_shared::api::Binding> = Api::namespaced(consumer.clone(), "team-a");
    let cluster_bindings: Api<ClusterBinding> = Api::all(consumer.clone());
    let connections: Api<kbind_shared::api::Connection> = Api::all(consumer.clone());
    let mut related = binding_spec("provider", &["widgets.example.org"]);
    related.related_resources = serde_json::from_value(json!([
        { "resource": "secrets", "direction": "FromProvider", "selector": { "names": ["Not_A_Name"] } }
    ]))
    .unwrap();
    let binding_cases: Vec<(&str, kbind_shared::api::BindingSpec, &str)> = vec![
        (
            "300-character connectionRef.name",
            binding_spec(&long, &["widgets.example.org"]),
            "spec.connectionRef.name",
        ),
        (
            "an API name without a group",
            binding_spec("provider", &["widgets"]),
            "spec.apis[0].name",
        ),
        (
            "an API name in capitals",
            binding_spec("provider", &["Widgets.Example.org"]),
            "spec.apis[0].name",
        ),
        (
            "a 300-character API name",
            binding_spec("provider", &[&format!("{long}.example.org")]),
            "spec.apis[0].name",
        ),
        (
            "a related object name that is no name",
            related,
            "spec.relatedResources[0].selector.names[0]",
        ),
    ];
    for (what, spec, field) in binding_cases {
        let err = bindings
            .create(
                &PostParams::default(),
                &kbind_shared::api::Binding::new("bad", spec.clone()),
            )
            .await
            .expect_err(what);
        assert!(
            matches!(&err, kube::Error::Api(s) if s.is_invalid() && s.message.contains(field)),
            "{what}: {err}"
        );
        let err = cluster_bindings
            .create(
                &PostParams::default(),
                &ClusterBinding::new("bad", ClusterBindingSpec::from(spec)),
            )
            .await
            .expect_err(what);
        assert!(
            matches!(&err, kube::Error::Api(s) if s.is_invalid()),
            "{what}: {err}"
        );
    }
    let mut too_many = binding_spec("provider", &["widgets.example.org"]);
    too_many.apis = (0..1025)
        .map(|i| kbind_shared::api::ApiRef {
            name: format!("r{i}.example.org"),
        })
        .collect();
    let err = bindings
        .create(
            &PostParams::default(),
            &kbind_shared::api::Binding::new("bad", too_many),
        )
        .await
        .expect_err("1025 APIs");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.is_invalid() && s.message.contains("spec.apis")),
        "{err}"
    );
    for (what, namespace, name, key, field) in [
        (
            "a Secret namespace that is no namespace",
            "Team_A",
            "p",
            "kubeconfig",
            "spec.kubeconfigSecretRef.namespace",
        ),
        (
            "a 300-character Secret name",
            "kbind",
            long.as_str(),
            "kubeconfig",
            "spec.kubeconfigSecretRef.name",
        ),
        (
            "a Secret key with a slash",
            "kbind",
            "p",
            "a/b",
            "spec.kubeconfigSecretRef.key",
        ),
    ] {
        let mut c = connection("bad", name, SchemaSource::Crd);
        c.spec.kubeconfig_secret_ref.namespace = namespace.into();
        c.spec.kubeconfig_secret_ref.key = key.into();
        let err = connections
            .create(&PostParams::default(), &c)
            .await
            .expect_err(what);
        assert!(
            matches!(&err, kube::Error::Api(s) if s.is_invalid() && s.message.contains(field)),
            "{what}: {err}"
        );
    }
}
