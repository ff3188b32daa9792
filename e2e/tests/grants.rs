//! Grants (#51) on a real provider, with `kbind-issuer` a real process under its chart's RBAC and
//! admission fence, and the bundle made by the real `kubectl kbind grant`: the credential it
//! carries may do exactly its Export's work inside its boundary — asked of the API server
//! (SelfSubjectRulesReview) and tried, each refusal a 403 — revocation takes it away within
//! seconds and touches nothing it wrote; bad Grants get a clear condition and nothing else.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::authorization::v1::{SelfSubjectRulesReview, SelfSubjectRulesReviewSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_e2e::cluster::client_for;
use kbind_e2e::fixtures::*;
use kbind_e2e::wait::wait_for;
use kbind_provider::issuer::{plan, rbac};
use kbind_shared::api::catalog::Export;
use kbind_shared::api::iam::Grant;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

const IDENTITY: &str = "alice@example.org";

async fn apply_grant(provider: &Client, name: &str, identity: &str, export: &str) {
    Api::<Grant>::all(provider.clone())
        .patch(
            name,
            &PatchParams::apply("platform-team").force(),
            &Patch::Apply(json!({
                "apiVersion": "iam.kbind.io/v1alpha1",
                "kind": "Grant",
                "metadata": { "name": name },
                "spec": { "export": export, "consumer": { "identity": identity } },
            })),
        )
        .await
        .unwrap();
}

/// Waits until Grant `name`'s `Issued` condition, for its generation, has `reason` and a message
/// containing `says`; the message.
async fn wait_issued(provider: &Client, name: &str, reason: &str, says: &str) -> String {
    let grants = Api::<Grant>::all(provider.clone());
    wait_for(
        &format!("Grant {name}: Issued {reason} saying {says:?}"),
        30,
        || async {
            let Some(g) = grants.get_opt(name).await.map_err(|e| e.to_string())? else {
                return Ok(None);
            };
            let status = g.status.unwrap_or_default();
            if status.observed_generation != g.metadata.generation {
                return Ok(None);
            }
            Ok(status
                .conditions
                .iter()
                .find(|c| {
                    c.type_ == plan::types::ISSUED && c.reason == reason && c.message.contains(says)
                })
                .map(|c| c.message.clone()))
        },
    )
    .await
}

/// The rules `client` holds in `namespace` as the API server answers a SelfSubjectRulesReview,
/// as (group, resource, verb, resource name) — the review API's own and discovery's left out.
async fn rules(client: &Client, namespace: &str) -> BTreeSet<(String, String, String, String)> {
    let review = SelfSubjectRulesReview {
        spec: SelfSubjectRulesReviewSpec {
            namespace: Some(namespace.into()),
        },
        ..SelfSubjectRulesReview::default()
    };
    let answer = Api::<SelfSubjectRulesReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    let mut out = BTreeSet::new();
    for rule in answer.status.unwrap().resource_rules {
        let groups = rule.api_groups.unwrap_or_default();
        if groups
            .iter()
            .any(|g| g == "authorization.k8s.io" || g == "authentication.k8s.io")
        {
            continue;
        }
        let names = rule.resource_names.unwrap_or_else(|| vec![String::new()]);
        for group in &groups {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    for name in &names {
                        out.insert((group.clone(), resource.clone(), verb.clone(), name.clone()));
                    }
                }
            }
        }
    }
    out
}

/// Rules as written here: (group, resource, verbs, resource name or "").
type Rules<'a> = &'a [(&'a str, &'a str, &'a [&'a str], &'a str)];

fn expected(entries: Rules<'_>) -> BTreeSet<(String, String, String, String)> {
    let mut out = BTreeSet::new();
    for (group, resource, verbs, name) in entries {
        for verb in *verbs {
            out.insert((
                (*group).to_owned(),
                (*resource).to_owned(),
                (*verb).to_owned(),
                (*name).to_owned(),
            ));
        }
    }
    out
}

/// Whether `result` is the API server's refusal.
fn forbidden<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> Result<(), String> {
    match result {
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(()),
        other => Err(format!("not refused: {other:?}")),
    }
}

/// Tries `attempt` until the API server refuses it with a 403 whose message contains `says` — an
/// admission policy is compiled in the background after it is created; panics after 60 s.
async fn until_refused<T, F, Fut>(what: &str, says: &str, mut attempt: F)
where
    T: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match attempt().await {
            Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(says) => return,
            other if Instant::now() > deadline => {
                panic!("{what} refused nothing after 60 s: {other:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

fn widgets(client: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &widget_resource())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grants_credential_may_do_its_exports_work_in_its_boundary_and_nothing_else() {
    let Pair {
        mut env,
        consumer: consumer_admin,
        provider,
    } = Pair::start("grants", &[]).await;
    install_issuer_chart(&provider).await;
    install_crd(&provider, &widget_crd()).await.unwrap();
    // Exported, but not part of the Export.
    install_crd(
        &provider,
        &crd(
            "gadgets",
            "example.org",
            "Gadget",
            &[(kbind_shared::keys::EXPORTED_LABEL, kbind_shared::keys::TRUE)],
        ),
    )
    .await
    .unwrap();
    start_issuer(&mut env).await;
    apply_export(&provider, "widgets", &["widgets.example.org"], true).await;
    let exports = Api::<Export>::all(provider.clone());
    wait_for("Export widgets offered", 30, || async {
        let e = exports.get("widgets").await.map_err(|e| e.to_string())?;
        Ok(plan::offered("widgets", Some(&e)).is_ok().then_some(()))
    })
    .await;

    // The provider admin's one command: the bundle.
    let admin = env.cluster("provider").admin_kubeconfig_path();
    let started = Instant::now();
    let grant = [
        "grant",
        "widgets",
        "--consumer",
        IDENTITY,
        "--expiration-seconds",
        "600",
    ];
    let run = plugin(&admin, &grant).await;
    assert_eq!(run.code, 0, "{run}");
    println!(
        "a Grant recorded, issued and its bundle printed in {} ms",
        started.elapsed().as_millis()
    );
    assert!(run.stderr.contains("renews it in process"), "{run}");
    let documents = yaml_documents(&run.stdout).unwrap();
    let kinds: Vec<&str> = documents
        .iter()
        .map(|d| d["kind"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(kinds, ["Secret", "Connection", "ClusterBinding"], "{run}");
    assert_eq!(
        documents[2]["spec"]["relatedResources"][0]["resource"],
        "secrets"
    );
    let kubeconfig = documents[0]["stringData"]["kubeconfig"].as_str().unwrap();
    let boundary = rbac::boundary(IDENTITY, None, "widgets");
    let parsed = kbind_shared::kubeconfig::InlineKubeconfig::parse(kubeconfig.as_bytes()).unwrap();
    assert_eq!(parsed.namespace(), Some(boundary.as_str()));
    let consumer = client_for(kubeconfig).await.unwrap();
    // Running it again finds the same Grant: one Grant per consumer, cluster and Export.
    let again = plugin(&admin, &grant).await;
    assert_eq!(again.code, 0, "{again}");
    let grants = Api::<Grant>::all(provider.clone());
    assert_eq!(
        grants
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );

    // A namespace of the boundary (where a consumer's copies live), created with the credential
    // itself — the only kind of namespace the issuer chart's admission policy lets it create —
    // gets the sync rules.
    let team = format!("{boundary}-team-a");
    let as_consumer = Api::<Namespace>::all(consumer.clone());
    let named = |name: &str, label: Option<&str>| -> Namespace {
        let mut meta = json!({ "name": name });
        if let Some(label) = label {
            meta["labels"] = json!({ plan::BOUNDARY_LABEL: label });
        }
        serde_json::from_value(json!({ "metadata": meta })).unwrap()
    };
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    // (The API server compiles a new policy in the background: refusals are awaited.)
    let elsewhere = named("elsewhere", Some(&boundary));
    until_refused(
        "the boundaries policy",
        "may only create namespaces named",
        || as_consumer.create(&dry_run, &elsewhere),
    )
    .await;
    let other = rbac::boundary("someone else", None, "widgets");
    for (what, namespace) in [
        (
            "a namespace of the boundary without its label",
            named(&format!("{boundary}-x"), None),
        ),
        (
            "a namespace of the boundary labelled with another",
            named(&format!("{boundary}-x"), Some(&other)),
        ),
        (
            "a namespace of another boundary",
            named(&format!("{other}-x"), Some(&other)),
        ),
    ] {
        if let Err(e) = forbidden(as_consumer.create(&dry_run, &namespace).await) {
            panic!("{what}: {e}");
        }
    }
    as_consumer
        .create(&PostParams::default(), &named(&team, Some(&boundary)))
        .await
        .unwrap();
    let bindings = Api::<RoleBinding>::namespaced(provider.clone(), &team);
    wait_for(
        "the sync RoleBinding in the boundary's namespace",
        30,
        || async {
            bindings
                .get_opt(rbac::SERVICE_ACCOUNT)
                .await
                .map_err(|e| e.to_string())
        },
    )
    .await;

    // What the API server says the credential may do, exactly.
    let cluster: Rules<'_> = &[
        ("", "namespaces", &["get"], "kube-system"),
        ("core.kcp.io", "logicalclusters", &["get"], "cluster"),
        ("", "namespaces", &["create"], ""),
        (
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            &["get"],
            "widgets.example.org",
        ),
        (
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            &["list", "watch"],
            "",
        ),
    ];
    let sync: Rules<'_> = &[
        (
            "example.org",
            "widgets",
            &[
                "get", "list", "watch", "create", "update", "patch", "delete",
            ],
            "",
        ),
        ("", "secrets", &["get", "list", "watch"], ""),
        ("", "events", &["list", "watch"], ""),
    ];
    let own: Rules<'_> = &[
        (
            "coordination.k8s.io",
            "leases",
            &["get", "create", "update", "patch"],
            "",
        ),
        (
            "",
            "serviceaccounts/token",
            &["create"],
            rbac::SERVICE_ACCOUNT,
        ),
    ];
    let with = |parts: &[Rules<'_>]| {
        parts
            .iter()
            .flat_map(|p| expected(p))
            .collect::<BTreeSet<_>>()
    };
    for (namespace, want) in [
        (team.as_str(), with(&[cluster, sync])),
        (boundary.as_str(), with(&[cluster, own])),
        ("default", with(&[cluster])),
    ] {
        // The authorizer follows new bindings within moments.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut have = rules(&consumer, namespace).await;
        while have != want && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
            have = rules(&consumer, namespace).await;
        }
        assert_eq!(have, want, "in {namespace}");
    }

    // Tried: what it must do works…
    widgets(&consumer, &team)
        .create(&PostParams::default(), &widget("w1", 1))
        .await
        .unwrap();
    widgets(&consumer, &team)
        .list(&ListParams::default())
        .await
        .unwrap();
    Api::<Secret>::namespaced(consumer.clone(), &team)
        .list(&ListParams::default())
        .await
        .unwrap();
    let lease: Lease =
        serde_json::from_value(json!({ "metadata": { "name": "heartbeat" } })).unwrap();
    Api::<Lease>::namespaced(consumer.clone(), &boundary)
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
    Api::<Namespace>::all(consumer.clone())
        .get("kube-system")
        .await
        .unwrap();
    let crds = Api::<CustomResourceDefinition>::all(consumer.clone());
    crds.get("widgets.example.org").await.unwrap();
    crds.list(&ListParams::default()).await.unwrap();
    Api::<ServiceAccount>::namespaced(consumer.clone(), &boundary)
        .create_token_request(
            rbac::SERVICE_ACCOUNT,
            &PostParams::default(),
            &TokenRequest::default(),
        )
        .await
        .unwrap();

    // …and everything else is a 403.
    let secret: Secret = serde_json::from_value(json!({ "metadata": { "name": "s" } })).unwrap();
    let namespace: Namespace =
        serde_json::from_value(json!({ "metadata": { "name": "mine" } })).unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": "escalate" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
        "subjects": [{ "kind": "ServiceAccount", "name": rbac::SERVICE_ACCOUNT, "namespace": boundary }],
    }))
    .unwrap();
    let gadgets = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("example.org", "v1", "Gadget"),
        "gadgets",
    );
    let tries: Vec<(&str, Result<(), String>)> = vec![
        (
            "list Widgets in every namespace",
            forbidden(
                Api::<DynamicObject>::all_with(consumer.clone(), &widget_resource())
                    .list(&ListParams::default())
                    .await,
            ),
        ),
        (
            "create a Widget in default",
            forbidden(
                widgets(&consumer, "default")
                    .create(&PostParams::default(), &widget("w", 1))
                    .await,
            ),
        ),
        (
            "create a Widget in the boundary itself",
            forbidden(
                widgets(&consumer, &boundary)
                    .create(&PostParams::default(), &widget("w", 1))
                    .await,
            ),
        ),
        (
            "list Gadgets (not in the Export)",
            forbidden(
                Api::<DynamicObject>::namespaced_with(consumer.clone(), &team, &gadgets)
                    .list(&ListParams::default())
                    .await,
            ),
        ),
        (
            "create a Secret (related only from the provider)",
            forbidden(
                Api::<Secret>::namespaced(consumer.clone(), &team)
                    .create(&PostParams::default(), &secret)
                    .await,
            ),
        ),
        (
            "read Secrets in the boundary",
            forbidden(
                Api::<Secret>::namespaced(consumer.clone(), &boundary)
                    .list(&ListParams::default())
                    .await,
            ),
        ),
        (
            "read another namespace",
            forbidden(Api::<Namespace>::all(consumer.clone()).get("default").await),
        ),
        (
            "create a namespace",
            forbidden(
                Api::<Namespace>::all(consumer.clone())
                    .create(&PostParams::default(), &namespace)
                    .await,
            ),
        ),
        (
            "delete a CRD",
            forbidden(
                crds.delete("widgets.example.org", &Default::default())
                    .await,
            ),
        ),
        (
            "create a Lease elsewhere",
            forbidden(
                Api::<Lease>::namespaced(consumer.clone(), "default")
                    .create(&PostParams::default(), &lease)
                    .await,
            ),
        ),
        (
            "a token for another ServiceAccount",
            forbidden(
                Api::<ServiceAccount>::namespaced(consumer.clone(), &boundary)
                    .create_token_request(
                        "default",
                        &PostParams::default(),
                        &TokenRequest::default(),
                    )
                    .await,
            ),
        ),
        (
            "read Grants",
            forbidden(grants_as(&consumer).list(&ListParams::default()).await),
        ),
        (
            "bind itself more rights",
            forbidden(
                Api::<RoleBinding>::namespaced(consumer.clone(), &boundary)
                    .create(&PostParams::default(), &binding)
                    .await,
            ),
        ),
    ];
    let failures: Vec<String> = tries
        .into_iter()
        .filter_map(|(what, result)| result.err().map(|e| format!("{what}: {e}")))
        .collect();
    assert!(failures.is_empty(), "{failures:#?}");

    // The bundle's Secret and Connection applied on a consumer running kbind: Ready with only this
    // credential, which kbind renews (here once 1 % of its 600 s have passed).
    start_lone_schema_manager(&mut env, &["--token-renewal-at=0.01"]).await;
    kbind_e2e::cluster::ensure_namespace(&consumer_admin, "kbind")
        .await
        .unwrap();
    for document in &documents[..2] {
        apply_manifest(&consumer_admin, &serde_yaml::to_string(document).unwrap())
            .await
            .unwrap();
    }
    wait_connection(&consumer_admin, "widgets", "Ready=True").await;
    let secret = Api::<Secret>::namespaced(consumer_admin.clone(), "kbind");
    wait_for("the Grant's token renewed on the consumer", 60, || async {
        let data = secret
            .get("widgets-kubeconfig")
            .await
            .map_err(|e| e.to_string())?
            .data
            .unwrap_or_default();
        let renewed = data.get("kubeconfig").and_then(|k| {
            kbind_shared::kubeconfig::InlineKubeconfig::parse(&k.0)
                .ok()?
                .token()
        });
        Ok(renewed.filter(|t| t.as_str() != parsed.token().unwrap_or_default()))
    })
    .await;
    wait_connection(&consumer_admin, "widgets", "Ready=True").await;

    // Revoked: within seconds the credential may do nothing; what it wrote stays.
    let revoke = |revoked: bool| {
        let grants = grants.clone();
        let name = boundary.clone();
        async move {
            grants
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "spec": { "revoked": revoked } })),
                )
                .await
                .unwrap();
        }
    };
    let started = Instant::now();
    revoke(true).await;
    let mine = widgets(&consumer, &team);
    wait_for("the revoked credential refused", 30, || async {
        Ok(forbidden(mine.get("w1").await).ok())
    })
    .await;
    println!(
        "revoked: the credential refused {} ms after the write",
        started.elapsed().as_millis()
    );
    wait_issued(&provider, &boundary, plan::reasons::REVOKED, "").await;
    wait_connection(&consumer_admin, "widgets", "PermissionDenied=True").await;
    widgets(&provider, &team).get("w1").await.unwrap();
    Api::<Lease>::namespaced(provider.clone(), &boundary)
        .get("heartbeat")
        .await
        .unwrap();
    // Restored, with nothing it wrote rewritten.
    let version = widgets(&provider, &team)
        .get("w1")
        .await
        .unwrap()
        .metadata
        .resource_version;
    revoke(false).await;
    wait_for("the restored credential answered", 30, || async {
        Ok(mine.get("w1").await.ok())
    })
    .await;
    wait_issued(&provider, &boundary, plan::reasons::ISSUED, "").await;
    wait_connection(&consumer_admin, "widgets", "PermissionDenied=False").await;
    assert_eq!(
        widgets(&provider, &team)
            .get("w1")
            .await
            .unwrap()
            .metadata
            .resource_version,
        version
    );
    drop(env);
}

fn grants_as(client: &Client) -> Api<Grant> {
    Api::all(client.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_grant_gets_a_clear_condition_and_nothing_else_happens() {
    let (env, provider, issuer) = provider_with_issuer("grants-bad").await;
    // Every failure series of the Grant controller exists from the start, at 0.
    let metrics = wait_for("the issuer's Grant failure series", 30, || async {
        let text = kbind_e2e::kbind::http_get(&issuer.metrics, "/metrics")
            .await
            .map(|(_, t)| t)
            .unwrap_or_default();
        Ok(text.contains("controller=\"grant\"").then_some(text))
    })
    .await;
    for reason in ["namespace", "apply", "delete", "status-write"] {
        assert_eq!(
            metric_sum(
                &metrics,
                "kbind_reconcile_errors_total",
                &[("controller", "grant"), ("reason", reason)]
            ),
            0.0,
            "{reason}"
        );
        assert!(
            metrics.contains(&format!("controller=\"grant\",reason=\"{reason}\"")),
            "{reason}: {metrics}"
        );
    }
    let issuer = issuer.account;
    let namespaces = Api::<Namespace>::all(provider.clone());

    // A Grant for an Export that does not exist: said so, nothing created; it follows when the
    // Export comes.
    apply_grant(&provider, "early", "erin", "later").await;
    wait_issued(
        &provider,
        "early",
        plan::reasons::EXPORT_NOT_FOUND,
        "no Export later",
    )
    .await;
    let early = rbac::boundary("erin", None, "later");
    assert!(namespaces.get_opt(&early).await.unwrap().is_none());
    // An Export naming an API that is served but not exported: not offered, so not issued.
    apply_export(&provider, "gadgets", &["gadgets.example.org"], false).await;
    apply_grant(&provider, "gadgets", "gina", "gadgets").await;
    wait_issued(
        &provider,
        "gadgets",
        plan::reasons::EXPORT_NOT_OFFERED,
        "gadgets.example.org",
    )
    .await;
    apply_export(&provider, "later", &["widgets.example.org"], false).await;
    wait_issued(&provider, "early", plan::reasons::ISSUED, "").await;

    // A boundary whose name someone else's namespace has: never adopted, nothing written in it.
    apply_export(&provider, "widgets", &["widgets.example.org"], false).await;
    let taken = rbac::boundary("bob", None, "widgets");
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": taken } })).unwrap(),
        )
        .await
        .unwrap();
    let before = namespaces.get(&taken).await.unwrap().metadata;
    apply_grant(&provider, "bob", "bob", "widgets").await;
    wait_issued(
        &provider,
        "bob",
        plan::reasons::BOUNDARY_TAKEN,
        "never adopted",
    )
    .await;
    let after = namespaces.get(&taken).await.unwrap().metadata;
    assert_eq!(
        (after.labels, after.annotations, after.resource_version),
        (before.labels, before.annotations, before.resource_version)
    );
    let accounts = Api::<ServiceAccount>::namespaced(provider.clone(), &taken);
    assert!(
        accounts
            .get_opt(rbac::SERVICE_ACCOUNT)
            .await
            .unwrap()
            .is_none()
    );

    // An object a Grant needs, created by someone else under its name: never taken over.
    let dave = rbac::boundary("dave", None, "widgets");
    let roles = Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(provider.clone());
    let foreign: k8s_openapi::api::rbac::v1::ClusterRole = serde_json::from_value(json!({
        "metadata": { "name": plan::cluster_role(&dave) },
        "rules": [{ "apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"] }],
    }))
    .unwrap();
    let before = roles
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap()
        .metadata
        .resource_version;
    apply_grant(&provider, "dave", "dave", "widgets").await;
    wait_issued(
        &provider,
        "dave",
        plan::reasons::OBJECT_TAKEN,
        &format!(
            "ClusterRole {} exists and was not created by kbind-issuer",
            plan::cluster_role(&dave)
        ),
    )
    .await;
    let after = roles.get(&plan::cluster_role(&dave)).await.unwrap();
    assert_eq!(after.metadata.resource_version, before);
    assert_eq!(after.metadata.labels, None);

    // A Grant's consumer and Export never change (the old boundary's credential would stay).
    let edit = Api::<Grant>::all(provider.clone())
        .patch(
            "early",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "consumer": { "identity": "mallory" } } })),
        )
        .await;
    match edit {
        Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains("immutable") => {}
        other => panic!("a Grant's consumer was edited: {other:?}"),
    }

    // Two Grants for one consumer and Export: the second waits, and holds the boundary once the
    // first is gone.
    apply_grant(&provider, "first", "carol", "widgets").await;
    wait_issued(&provider, "first", plan::reasons::ISSUED, "").await;
    apply_grant(&provider, "second", "carol", "widgets").await;
    wait_issued(
        &provider,
        "second",
        plan::reasons::BOUNDARY_CLAIMED,
        "Grant first",
    )
    .await;
    Api::<Grant>::all(provider.clone())
        .delete("first", &Default::default())
        .await
        .unwrap();
    wait_issued(&provider, "second", plan::reasons::ISSUED, "").await;

    // The admission fence: the issuer's own account may not write what it did not create.
    let as_issuer = client_for(&issuer.kubeconfig).await.unwrap();
    let label = json!({ "metadata": { "labels": { plan::BOUNDARY_LABEL: taken } } });
    let label = Patch::Merge(label);
    let issuer_namespaces = Api::<Namespace>::all(as_issuer.clone());
    let params = PatchParams::default();
    until_refused("the issuer's fence", "kbind-issuer may only write", || {
        issuer_namespaces.patch(&taken, &params, &label)
    })
    .await;

    // At rest: the issuer writes nothing but its leader Lease.
    let writes = |env: &kbind_e2e::TestEnv| {
        env.cluster("provider")
            .audited()
            .into_iter()
            .filter(|a| {
                a.user == issuer.username
                    && a.resource != "leases"
                    && matches!(a.verb.as_str(), "create" | "update" | "patch" | "delete")
            })
            .count()
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = writes(&env);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(writes(&env), before, "no write at rest");
    drop(env);
}
