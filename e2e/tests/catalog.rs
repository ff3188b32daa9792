//! `kbind-issuer`'s catalog (#51) on a real provider, run as a real process with its chart's RBAC
//! and its ServiceAccount's token: an `Export` is offered only while every API it names is served
//! by a CRD labelled exported, says which is not and why, follows the CRDs either way; a
//! `Collection` counts what it lists that is offered; at rest nothing is written.

use kbind_e2e::fixtures::*;
use kbind_e2e::wait::wait_for;
use kbind_shared::api::catalog::{Collection, Export, OFFERED};
use kbind_shared::keys;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

fn export(name: &str, apis: &[&str]) -> serde_json::Value {
    json!({
        "apiVersion": "catalog.kbind.io/v1alpha1",
        "kind": "Export",
        "metadata": { "name": name },
        "spec": {
            "title": name,
            "apis": apis.iter().map(|a| json!({ "name": a })).collect::<Vec<_>>(),
        },
    })
}

/// The `Offered` condition of Export `name` — status and reason — once its status describes its
/// current generation.
async fn offered(exports: &Api<Export>, name: &str) -> Option<(String, String, String)> {
    let export = exports.get_opt(name).await.ok()??;
    let status = export.status?;
    if status.observed_generation != export.metadata.generation {
        return None;
    }
    let c = status.conditions.iter().find(|c| c.type_ == OFFERED)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn wait_offered(exports: &Api<Export>, name: &str, status: &str, reason: &str) -> String {
    wait_for(&format!("Export {name} {status}/{reason}"), 30, || async {
        Ok(offered(exports, name)
            .await
            .filter(|(s, r, _)| s == status && r == reason)
            .map(|(_, _, message)| message))
    })
    .await
}

fn apply<K>(api: &Api<K>, name: &str, body: &serde_json::Value) -> impl Future<Output = ()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let (api, name, body) = (api.clone(), name.to_owned(), body.clone());
    async move {
        api.patch(
            &name,
            &PatchParams::apply("platform-team").force(),
            &Patch::Apply(&body),
        )
        .await
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_is_offered_only_while_every_api_it_names_is_exported() {
    // Gadgets: served, not exported.
    let (env, provider, issuer) = provider_with_issuer("catalog").await;
    let account = issuer.account;

    let exports = Api::<Export>::all(provider.clone());
    let collections = Api::<Collection>::all(provider.clone());
    apply(
        &exports,
        "widgets",
        &export("widgets", &["widgets.example.org"]),
    )
    .await;
    apply(
        &exports,
        "both",
        &export("both", &["widgets.example.org", "gadgets.example.org"]),
    )
    .await;
    apply(
        &exports,
        "later",
        &export("later", &["sprockets.example.org"]),
    )
    .await;
    apply(
        &collections,
        "all",
        &json!({
            "apiVersion": "catalog.kbind.io/v1alpha1",
            "kind": "Collection",
            "metadata": { "name": "all" },
            "spec": { "title": "All", "exports": [
                { "name": "widgets" }, { "name": "both" }, { "name": "later" }, { "name": "nowhere" },
            ] },
        }),
    )
    .await;

    // Each Export says what is true, and names what is not.
    wait_offered(&exports, "widgets", "True", "Exported").await;
    let message = wait_offered(&exports, "both", "False", "NotExported").await;
    assert!(
        message.contains("gadgets.example.org") && !message.contains("widgets.example.org"),
        "{message}"
    );
    let message = wait_offered(&exports, "later", "False", "UnknownAPI").await;
    assert!(message.contains("sprockets.example.org"), "{message}");
    let widgets = exports.get("widgets").await.unwrap().status.unwrap();
    assert_eq!(
        (widgets.apis[0].exported, widgets.apis[0].scope.as_deref()),
        (true, Some("Namespaced"))
    );
    let collection = |offered: i64, status: &'static str| {
        let collections = collections.clone();
        async move {
            wait_for(
                &format!("Collection all: {offered} offered"),
                30,
                || async {
                    let c = collections.get("all").await.map_err(|e| e.to_string())?;
                    let Some(s) = c.status else { return Ok(None) };
                    let condition = s.conditions.iter().find(|c| c.type_ == OFFERED).cloned();
                    Ok((s.offered == offered
                        && condition.as_ref().is_some_and(|c| c.status == status))
                    .then(|| condition.map(|c| c.message).unwrap_or_default()))
                },
            )
            .await
        }
    };
    let message = collection(1, "False").await;
    assert!(
        message.contains("no such Export: nowhere") && message.contains("not offered: both, later"),
        "{message}"
    );

    // At rest: nothing written.
    let issuer = account.username.clone();
    let status_writes = |env: &kbind_e2e::TestEnv, resource: &str| {
        env.cluster("provider")
            .audited()
            .into_iter()
            .filter(|a| a.user == issuer && a.resource == resource && a.subresource == "status")
            .count()
    };
    let before = status_writes(&env, "exports") + status_writes(&env, "collections");
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    assert_eq!(
        status_writes(&env, "exports") + status_writes(&env, "collections"),
        before,
        "no write at rest"
    );

    // The truth moves, the catalog follows: the label added, a CRD created, a label removed.
    let crds = Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(provider.clone());
    let label =
        |value: Option<&str>| json!({ "metadata": { "labels": { keys::EXPORTED_LABEL: value } } });
    crds.patch(
        "gadgets.example.org",
        &PatchParams::default(),
        &Patch::Merge(label(Some(keys::TRUE))),
    )
    .await
    .unwrap();
    wait_offered(&exports, "both", "True", "Exported").await;
    install_crd(
        &provider,
        &crd(
            "sprockets",
            "example.org",
            "Sprocket",
            &[(keys::EXPORTED_LABEL, keys::TRUE)],
        ),
    )
    .await
    .unwrap();
    wait_offered(&exports, "later", "True", "Exported").await;
    collection(3, "False").await;
    crds.patch(
        "widgets.example.org",
        &PatchParams::default(),
        &Patch::Merge(label(None)),
    )
    .await
    .unwrap();
    wait_offered(&exports, "widgets", "False", "NotExported").await;
    wait_offered(&exports, "both", "False", "NotExported").await;
    collection(1, "False").await;

    // Each change of the truth cost one status write per Export it concerns — widgets: listed,
    // unlabelled; both: listed, gadgets labelled, widgets unlabelled; later: listed, its CRD
    // created — and a Collection at most one per change of an Export it lists.
    assert_eq!(status_writes(&env, "exports"), 2 + 3 + 2);
    let collection_writes = status_writes(&env, "collections");
    assert!(
        (1..=7).contains(&collection_writes),
        "{collection_writes} Collection status writes"
    );
}
