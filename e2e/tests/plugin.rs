//! `kubectl kbind` on two real clusters: the plugin binary run as kubectl runs a plugin (its own
//! process, the user's `KUBECONFIG` in its environment), against kbind's programs running.
//!
//! - `status` shows Connections, bindings and per-API objects: counts, conflicts, lag;
//! - `plan` says which CRDs a file would create or change (breaking or not), which objects would
//!   start syncing and which conflict — and both API servers serve no write while it runs;
//! - `doctor` finds what a restricted provider credential lacks and prints RBAC that, applied,
//!   fixes it;
//! - `diff` compares one object with its provider copy — in sync, refused, fixed, then changed
//!   while kbind is stopped — and both API servers serve no write while it runs.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::fixtures::*;
use kbind_e2e::kbind::{apiserver_writes, new_writes};
use kbind_e2e::wait::wait_for;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::{Value, json};

const API: &str = "widgets.example.org";

#[tokio::test]
async fn status_shows_connections_bindings_objects_conflicts_and_lag() {
    let s = SyncEnv::start("plugin-status", &[0, 1, 2], None).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "w1", 1).await;
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "w2", 2).await;
    // A provider object kbind did not create: the consumer object of that name conflicts.
    ensure_namespace(&s.provider, "team-a").await.unwrap();
    widgets(&s.provider, "team-a")
        .create(&PostParams::default(), &widget("taken", 9))
        .await
        .unwrap();
    let consumer_widgets = widgets(&s.consumer, "team-a");
    consumer_widgets
        .create(&PostParams::default(), &widget("taken", 3))
        .await
        .unwrap();
    wait_conflict(&consumer_widgets, "taken", Some("ForeignObjectExists")).await;

    let kubeconfig = s.env.cluster("consumer").admin_kubeconfig_path();
    let report = wait_for("status counts both delivered widgets", 30, || async {
        let run = plugin(&kubeconfig, &["status", "-o", "json"]).await;
        if run.code != 0 {
            return Err(run.to_string());
        }
        let report = run.json();
        let api = entry(&report["apis"], "api", API).clone();
        if api["synced"] == 2 {
            Ok(Some(report))
        } else {
            Err(format!("{api}"))
        }
    })
    .await;

    let connection = entry(&report["connections"], "name", "provider");
    assert_eq!(connection["ready"], "True", "{connection:#}");
    assert_eq!(connection["exportedApis"], 1, "{connection:#}");
    assert!(
        connection["providerClusterUid"]
            .as_str()
            .is_some_and(|u| !u.is_empty()),
        "{connection:#}"
    );
    let binding = entry(&report["bindings"], "name", "widgets");
    assert_eq!(binding["kind"], "ClusterBinding");
    assert_eq!(binding["ready"], "True", "{binding:#}");
    assert_eq!(binding["connection"], "provider");
    assert_eq!(
        binding["apis"],
        json!([{ "name": API, "bound": true, "reason": "AsExpected" }])
    );
    assert_eq!(binding["conflicts"], 1, "{binding:#}");
    let api = entry(&report["apis"], "api", API);
    assert_eq!(
        (
            &api["connection"],
            &api["objects"],
            &api["synced"],
            &api["pending"],
            &api["conflicts"],
            &api["rejected"],
            &api["notBound"],
        ),
        (
            &json!("provider"),
            &json!(3),
            &json!(2),
            &json!(0),
            &json!(1),
            &json!(0),
            &json!(0)
        ),
        "{api:#}"
    );
    // Both delivered changes were timed (each took well under a minute here).
    let lag = api["lagMaxSeconds"].as_u64().expect("a delivery lag");
    assert!(lag < 60, "{api:#}");

    // The text view: one screen, three tables.
    let run = plugin(&kubeconfig, &["status"]).await;
    eprintln!("{run}");
    assert_eq!(run.code, 0, "{run}");
    for part in [
        "CONNECTIONS",
        "BINDINGS",
        "APIS",
        "OLDEST-PENDING",
        API,
        "provider",
    ] {
        assert!(run.stdout.contains(part), "{part} missing:\n{run}");
    }

    // An object the provider's admission rejects: `status` asks for attention (exit 1) until
    // told to ignore refusals (#33.7).
    let hook = kbind_e2e::webhook::DenyingWebhook::start(403, "no widgets here")
        .await
        .unwrap();
    kbind_e2e::webhook::register(
        &s.provider,
        "deny",
        Some(&hook),
        &["CREATE"],
        "widgets",
        Some(("policy", "guarded")),
    )
    .await
    .unwrap();
    kbind_e2e::cluster::labelled_namespace(&s.provider, "guarded", ("policy", "guarded"))
        .await
        .unwrap();
    ensure_namespace(&s.consumer, "guarded").await.unwrap();
    widgets(&s.consumer, "guarded")
        .create(&PostParams::default(), &widget("denied", 1))
        .await
        .unwrap();
    let refused = wait_for("status to count the rejected object", 30, || async {
        let run = plugin(&kubeconfig, &["status", "-o", "json"]).await;
        let rejected = entry(&run.json()["apis"], "api", API)["rejected"].clone();
        Ok((rejected == 1).then_some(run))
    })
    .await;
    assert_eq!(refused.code, 1, "{refused}");
    let ignored = plugin(&kubeconfig, &["status", "--ignore-refused"]).await;
    assert_eq!(ignored.code, 0, "{ignored}");
}

/// Snapshots both API servers' write counters until two readings a second apart agree (nothing
/// else is writing), and returns them.
async fn quiet_writes(
    consumer: &Client,
    provider: &Client,
) -> (
    std::collections::BTreeMap<String, u64>,
    std::collections::BTreeMap<String, u64>,
) {
    wait_for("both clusters are quiet", 60, || async {
        let before = (
            apiserver_writes(consumer).await?,
            apiserver_writes(provider).await?,
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = (
            apiserver_writes(consumer).await?,
            apiserver_writes(provider).await?,
        );
        if before == after {
            Ok(Some(after))
        } else {
            Err(format!(
                "still writing: {:?} {:?}",
                new_writes(&before.0, &after.0),
                new_writes(&before.1, &after.1)
            ))
        }
    })
    .await
}

/// Asserts that neither API server served a write since the counters `before` ([`quiet_writes`])
/// were read, while `what` ran.
async fn assert_no_writes_since(
    before: &(
        std::collections::BTreeMap<String, u64>,
        std::collections::BTreeMap<String, u64>,
    ),
    consumer: &Client,
    provider: &Client,
    what: &str,
) {
    let after = (
        apiserver_writes(consumer).await.unwrap(),
        apiserver_writes(provider).await.unwrap(),
    );
    assert_eq!(
        (
            new_writes(&before.0, &after.0),
            new_writes(&before.1, &after.1)
        ),
        (Vec::new(), Vec::new()),
        "writes during {what} (consumer, provider)"
    );
}

#[tokio::test]
async fn plan_shows_what_a_file_would_do_and_changes_nothing() {
    // A Connection and a Binding for team-a only: team-b's Widgets exist but do not sync.
    let mut s = SyncEnv::start("plugin-plan", &[0, 1], None).await;
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    ensure_namespace(&s.consumer, "team-b").await.unwrap();
    apply_manifest(
        &s.consumer,
        "apiVersion: core.kbind.io/v1alpha1\nkind: Binding\nmetadata: { name: widgets, namespace: team-a }\nspec: { connectionRef: { name: provider }, apis: [ { name: widgets.example.org } ] }\n",
    )
    .await
    .unwrap();
    let team_a: Api<kbind_shared::api::Binding> = Api::namespaced(s.consumer.clone(), "team-a");
    wait_binding(&team_a, "widgets", "Ready=True").await;
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "a1", 1).await;
    for name in ["b1", "b2"] {
        widgets(&s.consumer, "team-b")
            .create(&PostParams::default(), &widget(name, 1))
            .await
            .unwrap();
    }
    // On the provider, a b2 kbind did not create.
    ensure_namespace(&s.provider, "team-b").await.unwrap();
    widgets(&s.provider, "team-b")
        .create(&PostParams::default(), &widget("b2", 7))
        .await
        .unwrap();
    // kbind stops, and the provider's schema changes in a breaking way (an open spec becomes a
    // typed one): applying a binding now would hold the consumer CRD.
    let (manager, syncer) = (s.manager.index, s.syncer.index);
    s.env.process(manager).kill();
    s.env.process(syncer).kill();
    let mut crd = widget_crd();
    crd.spec.versions[0].schema = serde_json::from_value(json!({ "openAPIV3Schema": {
        "type": "object",
        "properties": {
            "spec": { "type": "object", "properties": { "size": { "type": "string" } } },
            "status": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
        },
    }}))
    .unwrap();
    merge_patch(
        &Api::<CustomResourceDefinition>::all(s.provider.clone()),
        API,
        &json!({ "spec": { "versions": crd.spec.versions } }),
    )
    .await;

    let file = s.env.dir().join("plan.yaml");
    std::fs::write(
        &file,
        r#"# A second Connection to the same provider, a ClusterBinding and a Binding.
apiVersion: core.kbind.io/v1alpha1
kind: Connection
metadata: { name: second }
spec:
  kubeconfigSecretRef: { namespace: kbind, name: provider-kubeconfig }
  schema: { source: CRD }
---
apiVersion: core.kbind.io/v1alpha1
kind: ClusterBinding
metadata: { name: all-widgets }
spec: { connectionRef: { name: provider }, apis: [ { name: widgets.example.org } ] }
---
apiVersion: core.kbind.io/v1alpha1
kind: Binding
metadata: { name: widgets, namespace: team-b }
spec: { connectionRef: { name: provider }, apis: [ { name: widgets.example.org } ] }
---
apiVersion: core.kbind.io/v1alpha1
kind: ClusterBinding
metadata: { name: second-widgets }
spec: { connectionRef: { name: second }, apis: [ { name: widgets.example.org } ] }
"#,
    )
    .unwrap();
    let kubeconfig = s.env.cluster("consumer").admin_kubeconfig_path();
    let before = quiet_writes(&s.consumer, &s.provider).await;
    let run = plugin(&kubeconfig, &["plan", file.to_str().unwrap(), "-o", "json"]).await;
    let text = plugin(&kubeconfig, &["plan", file.to_str().unwrap()]).await;
    // Proof that planning changes nothing: neither API server served a write.
    assert_no_writes_since(&before, &s.consumer, &s.provider, "the plan").await;
    // The counters do see writes: one ConfigMap created on each side shows up.
    for client in [&s.consumer, &s.provider] {
        let before = apiserver_writes(client).await.unwrap();
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), "default")
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({ "metadata": { "name": "witness" } })).unwrap(),
            )
            .await
            .unwrap();
        let seen = new_writes(&before, &apiserver_writes(client).await.unwrap());
        assert_eq!(seen, ["POST /configmaps : 1"], "the witness write");
    }

    assert_eq!(
        run.code, 1,
        "a plan with conflicts and a held schema asks for attention: {run}"
    );
    let report = run.json();
    let provider = entry(&report["connections"], "name", "provider");
    assert_eq!(provider["action"], "unchanged", "{provider:#}");
    assert_eq!(provider["identity"]["verdict"], "matches", "{provider:#}");
    let second = entry(&report["connections"], "name", "second");
    assert_eq!(second["action"], "create", "{second:#}");
    assert_eq!(second["identity"]["verdict"], "unpinned", "{second:#}");
    assert_eq!(second["exportedApis"], json!([API]), "{second:#}");

    let plan = |binding: &str| entry(&report["apis"], "binding", binding).clone();
    let cluster_wide = plan("ClusterBinding/all-widgets");
    assert_eq!(cluster_wide["crd"]["action"], "hold", "{cluster_wide:#}");
    assert!(
        !cluster_wide["crd"]["breaking"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{cluster_wide:#}"
    );
    assert_eq!(cluster_wide["crd"]["accepted"], false);
    assert_eq!(
        cluster_wide["alreadySyncing"], 1,
        "a1 syncs already: {cluster_wide:#}"
    );
    assert_eq!(cluster_wide["startSyncing"], 2, "{cluster_wide:#}");
    assert_eq!(
        cluster_wide["startSyncingNames"],
        json!(["team-b/b1", "team-b/b2"])
    );
    assert_eq!(
        cluster_wide["conflicts"],
        json!([{ "object": "team-b/b2", "reason": "ForeignObjectExists" }])
    );
    let team_b = plan("Binding/team-b/widgets");
    assert_eq!(
        (
            &team_b["crd"]["action"],
            &team_b["alreadySyncing"],
            &team_b["startSyncing"],
            &team_b["conflictCount"]
        ),
        (&json!("hold"), &json!(0), &json!(2), &json!(1)),
        "{team_b:#}"
    );
    let other = plan("ClusterBinding/second-widgets");
    assert_eq!(other["crd"]["action"], "refuse", "{other:#}");
    assert!(
        other["crd"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("serves Connection provider")),
        "{other:#}"
    );

    eprintln!("{text}");
    assert_eq!(text.code, 1, "{text}");
    for part in [
        "ClusterBinding/all-widgets",
        "hold",
        "conflict team-b/b2: ForeignObjectExists",
        "would start syncing team-b/b1, team-b/b2",
        "Nothing was changed on either cluster.",
    ] {
        assert!(text.stdout.contains(part), "{part} missing:\n{text}");
    }

    // Bad input gets a message naming what is wrong.
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Secret\nmetadata: { name: x }\n",
    )
    .unwrap();
    let bad = plugin(&kubeconfig, &["plan", file.to_str().unwrap()]).await;
    assert_eq!(bad.code, 2, "{bad}");
    assert!(bad.stderr.contains("a plan reads only"), "{bad}");
}

/// What a doctor report found missing: (group/resource, namespace, verbs) per check.
fn missing_checks(report: &Value) -> Vec<(String, Option<String>, Vec<String>)> {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| !c["missing"].as_array().unwrap().is_empty())
        .map(|c| {
            (
                format!(
                    "{}/{}",
                    c["need"]["group"].as_str().unwrap(),
                    c["need"]["resource"].as_str().unwrap()
                ),
                c["need"]["namespace"].as_str().map(str::to_owned),
                serde_json::from_value(c["missing"].clone()).unwrap(),
            )
        })
        .collect()
}

fn read_write() -> Vec<String> {
    [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ]
    .map(String::from)
    .to_vec()
}

/// Switches Connection `provider`'s credential to a new provider user with only what a
/// Connection needs (no bound API): the user.
async fn only_connection_rights(s: &SyncEnv, name: &str) -> kbind_e2e::cluster::User {
    let cluster = s.env.cluster("provider");
    let user = cluster.mint_user(name).await.unwrap();
    cluster
        .grant(&user, name, connection_rules())
        .await
        .unwrap();
    put_kubeconfig(&s.consumer, "provider-kubeconfig", &user.kubeconfig).await;
    user
}

#[tokio::test]
async fn doctor_asks_for_an_api_only_bindings_list_in_their_namespaces_and_that_is_enough() {
    // #54: the Widgets are listed only by Bindings in team-a and team-b, so kbind reads and
    // writes them only there — and the doctor asks for exactly that: Roles in those namespaces,
    // no cluster-wide rule on Widgets. Applied as printed, the objects sync.
    let s = SyncEnv::start("plugin-doctor-namespaces", &[0, 1], None).await;
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    for team in ["team-a", "team-b"] {
        ensure_namespace(&s.consumer, team).await.unwrap();
        bind_in(&s.consumer, team, "widgets", "provider", &[API]).await;
    }
    only_connection_rights(&s, "bob").await;
    let kubeconfig = s.env.cluster("consumer").admin_kubeconfig_path();
    let run = plugin(&kubeconfig, &["doctor", "provider", "-o", "json"]).await;
    assert_eq!(run.code, 1, "{run}");
    let report = run.json();
    assert_eq!(
        missing_checks(&report),
        [
            (
                "example.org/widgets".to_owned(),
                Some("team-a".to_owned()),
                read_write()
            ),
            (
                "example.org/widgets".to_owned(),
                Some("team-b".to_owned()),
                read_write()
            ),
        ],
        "{report:#}"
    );
    let rbac = report["missingRbac"]
        .as_str()
        .expect("RBAC to apply")
        .to_owned();
    for document in yaml_documents(&rbac).unwrap() {
        assert!(
            document["kind"] != "ClusterRole",
            "nothing cluster-wide is missing: {rbac}"
        );
    }
    apply_manifest(&s.provider, &rbac).await.unwrap();
    wait_for("the doctor is satisfied", 30, || async {
        let run = plugin(&kubeconfig, &["doctor", "provider"]).await;
        Ok((run.code == 0).then_some(()))
    })
    .await;
    for team in ["team-a", "team-b"] {
        create_widget_and_wait_upstream(&s.consumer, &s.provider, team, "w", 1).await;
    }
}

#[tokio::test]
async fn doctor_finds_what_the_credential_lacks_and_its_rbac_fixes_it() {
    let s = SyncEnv::start("plugin-doctor", &[0, 1, 2], None).await;
    wait_connection(&s.consumer, "provider", "Ready=True").await;
    // The credential becomes alice's: same provider, but only what a Connection needs — no
    // Widgets.
    let alice = only_connection_rights(&s, "alice").await;
    let kubeconfig = s.env.cluster("consumer").admin_kubeconfig_path();

    let run = plugin(&kubeconfig, &["doctor", "provider", "-o", "json"]).await;
    assert_eq!(run.code, 1, "missing permissions ask for attention: {run}");
    let report = run.json();
    assert_eq!(report["identity"]["verdict"], "matches", "{report:#}");
    assert_eq!(report["user"], alice.username, "{report:#}");
    assert_eq!(
        missing_checks(&report),
        [("example.org/widgets".to_owned(), None, read_write())],
        "{report:#}"
    );
    let rbac = report["missingRbac"]
        .as_str()
        .expect("RBAC to apply")
        .to_owned();

    let text = plugin(&kubeconfig, &["doctor", "provider"]).await;
    eprintln!("{text}");
    assert_eq!(text.code, 1, "{text}");
    assert!(text.stdout.contains("MISSING"), "{text}");
    assert!(text.stdout.contains("kind: ClusterRole"), "{text}");

    // The printed RBAC, applied on the provider as is, is all it takes.
    apply_manifest(&s.provider, &rbac).await.unwrap();
    let fixed = wait_for("the doctor is satisfied", 30, || async {
        let run = plugin(&kubeconfig, &["doctor", "provider"]).await;
        if run.code == 0 {
            Ok(Some(run))
        } else {
            Err(run.to_string())
        }
    })
    .await;
    assert!(
        fixed.stdout.contains("may do everything kbind needs"),
        "{fixed}"
    );

    // A Connection that does not exist is an error naming it.
    let absent = plugin(&kubeconfig, &["doctor", "nope"]).await;
    assert_eq!(absent.code, 2, "{absent}");
    assert!(
        absent.stderr.contains("Connection nope not found"),
        "{absent}"
    );
}

#[tokio::test]
async fn one_doctor_run_on_a_credential_with_nothing_prints_exactly_what_it_needs() {
    // #33.7: the provider credential has no RBAC at all and nothing is pinned yet. One run of
    // the doctor prints everything needed — identity included, the bound API taken from the
    // binding (discovery is forbidden too). That snippet without the Widgets rule leaves the
    // object unsynced; the whole snippet makes the Connection Ready and the object sync.
    let Pair {
        mut env,
        consumer,
        provider,
    } = Pair::start("plugin-doctor-nothing", &[]).await;
    install_crd(&provider, &widget_crd()).await.unwrap();
    start_lone_schema_manager(&mut env, &[]).await;
    start_syncer(&mut env, "consumer", "syncer-0", &[])
        .await
        .unwrap();
    let nobody = env.cluster("provider").mint_user("nobody").await.unwrap();
    put_kubeconfig(&consumer, "p", &nobody.kubeconfig).await;
    create_connection(
        &consumer,
        &connection("provider", "p", kbind_shared::api::SchemaSource::Crd),
    )
    .await
    .unwrap();
    Api::<kbind_shared::api::ClusterBinding>::all(consumer.clone())
        .create(
            &PostParams::default(),
            &kbind_shared::api::ClusterBinding::new(
                "widgets",
                kbind_shared::api::ClusterBindingSpec {
                    binding: binding_spec("provider", &[API]),
                },
            ),
        )
        .await
        .unwrap();
    let kubeconfig = env.cluster("consumer").admin_kubeconfig_path();
    let run = plugin(&kubeconfig, &["doctor", "provider", "-o", "json"]).await;
    assert_eq!(run.code, 1, "{run}");
    let report = run.json();
    let rbac = report["missingRbac"]
        .as_str()
        .expect("RBAC to apply")
        .to_owned();
    for part in [
        "namespaces",
        "leases",
        "customresourcedefinitions",
        "widgets",
    ] {
        assert!(rbac.contains(part), "the snippet grants {part}: {rbac}");
    }
    assert!(
        !rbac.contains("secrets") && !rbac.contains("configmaps"),
        "{rbac}"
    );

    // A rule fewer: the Widgets rule left out. The Connection comes up, the object does not sync.
    let mut documents = yaml_documents(&rbac).unwrap();
    for document in &mut documents {
        if let Some(rules) = document.get_mut("rules").and_then(Value::as_array_mut) {
            rules.retain(|r| r["resources"] != json!(["widgets"]));
        }
    }
    let fewer: String = documents
        .iter()
        .map(|d| format!("---\n{}", serde_yaml::to_string(d).unwrap()))
        .collect();
    apply_manifest(&provider, &fewer).await.unwrap();
    wait_connection(&consumer, "provider", "Ready=True").await;
    // The binding installs the Widget CRD once the Connection can read the provider's: Ready
    // says nothing of it (creating a Widget before the CRD is served is a 404).
    kbind_e2e::kbind::wait_established(&Api::all(consumer.clone()), API)
        .await
        .unwrap();
    ensure_namespace(&consumer, "team-a").await.unwrap();
    widgets(&consumer, "team-a")
        .create(&PostParams::default(), &widget("w", 1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        widgets(&provider, "team-a")
            .get_opt("w")
            .await
            .unwrap()
            .is_none(),
        "synced without the Widgets rule"
    );

    // The whole snippet: the object syncs, and the doctor is satisfied.
    apply_manifest(&provider, &rbac).await.unwrap();
    wait_for(
        "the object to sync with exactly the printed rules",
        60,
        || async {
            widgets(&provider, "team-a")
                .get_opt("w")
                .await
                .map_err(|e| e.to_string())
        },
    )
    .await;
    let fixed = plugin(&kubeconfig, &["doctor", "provider"]).await;
    assert_eq!(fixed.code, 0, "{fixed}");
}

/// Waits until team-a's Widget `name` on the consumer has a delivery record in `state` for
/// `generation`.
async fn wait_record(consumer: &Client, name: &str, state: &str, generation: i64) {
    wait_object(
        &widgets(consumer, "team-a"),
        name,
        &format!("{name}'s record to say {state} for generation {generation}"),
        30,
        |w| {
            let record = &w.data["status"]["kbindSync"];
            record["state"] == state && record["generation"] == generation
        },
    )
    .await;
}

/// Asserts that a diff report's last refusal is the provider's rejection of a size over 10, as
/// `source` (`record` or `event`) tells it.
fn assert_rejected_for_size(report: &Value, source: &str) {
    let refusal = &report["lastRefusal"];
    assert_eq!(
        (&refusal["state"], &refusal["source"]),
        (&json!("Rejected"), &json!(source)),
        "{report:#}"
    );
    assert!(
        refusal["message"]
            .as_str()
            .is_some_and(|m| m.contains("less than or equal to 10")),
        "{report:#}"
    );
}

/// The field owners of one side of a diff report with `field` among their fields.
fn owners_of(side: &Value, field: &str) -> Vec<String> {
    side["owners"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["fields"].as_array().unwrap().iter().any(|f| f == field))
        .map(|o| o["manager"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn diff_shows_an_object_against_its_provider_copy_and_changes_nothing() {
    let mut s = SyncEnv::start("plugin-diff", &[0, 1, 2], None).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    ensure_namespace(&s.consumer, "team-a").await.unwrap();
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "w1", 1).await;
    wait_record(&s.consumer, "w1", "Synced", 1).await;
    let kubeconfig = s.env.cluster("consumer").admin_kubeconfig_path();
    let diff = |args: &'static [&'static str]| {
        let kubeconfig = kubeconfig.clone();
        async move {
            let mut all = vec!["diff", "widget/w1", "-n", "team-a"];
            all.extend_from_slice(args);
            plugin(&kubeconfig, &all).await
        }
    };

    // In sync: the same fields on both sides, each copy's identity as the API servers hold it.
    let run = diff(&["-o", "json"]).await;
    assert_eq!(run.code, 0, "{run}");
    let report = run.json();
    let consumer_w1 = widgets(&s.consumer, "team-a").get("w1").await.unwrap();
    let provider_w1 = widgets(&s.provider, "team-a").get("w1").await.unwrap();
    let connection = Api::<kbind_shared::api::Connection>::all(s.consumer.clone())
        .get("provider")
        .await
        .unwrap();
    let pinned = connection.status.unwrap().remote_cluster_uid;
    assert_eq!(report["identical"], true, "{report:#}");
    assert_eq!(report["diff"], "", "{report:#}");
    assert_eq!(report["api"], API);
    assert_eq!(report["connection"], "provider");
    assert_eq!(report["consumer"]["uid"], json!(consumer_w1.metadata.uid));
    assert_eq!(report["consumer"]["generation"], 1);
    let copy = &report["provider"]["copy"];
    assert_eq!(copy["uid"], json!(provider_w1.metadata.uid), "{report:#}");
    assert_eq!(
        copy["resourceVersion"],
        json!(provider_w1.metadata.resource_version)
    );
    assert_eq!(copy["ownership"], "Ours");
    assert_eq!(report["provider"]["pin"]["verdict"], "matches");
    assert_eq!(report["provider"]["cluster"], json!(pinned));
    assert_eq!(report["provider"]["pinnedCluster"], json!(pinned));
    assert_eq!(
        copy["appliedAt"],
        json!(kbind_shared::delivery::applied_at(&provider_w1.metadata))
    );
    assert_eq!(report["delivery"]["state"], "Synced");
    assert_eq!(report["delivery"]["generation"], 1);
    assert_eq!(report["lastRefusal"], Value::Null, "{report:#}");
    // Who owns what: kbind the provider copy's size, the test's own client the consumer's size,
    // kbind's syncer the consumer's finalizer and delivery record.
    assert_eq!(
        owners_of(copy, ".spec.size"),
        ["kbind-konnector"],
        "{report:#}"
    );
    let consumer_size = owners_of(&report["consumer"], ".spec.size");
    assert_eq!(consumer_size.len(), 1, "{report:#}");
    assert_ne!(consumer_size[0], "kbind-konnector");
    assert_eq!(
        owners_of(
            &report["consumer"],
            ".metadata.finalizers[=\"core.kbind.io/syncer\"]"
        ),
        ["kbind-konnector"],
        "{report:#}"
    );
    assert_eq!(
        owners_of(&report["consumer"], ".status.kbindSync.state"),
        ["kbind-konnector"],
        "{report:#}"
    );
    let text = diff(&[]).await;
    assert_eq!(text.code, 0, "{text}");
    assert!(
        text.stdout
            .contains("no differences in the fields kbind syncs"),
        "{text}"
    );

    // Refused: the provider's schema caps the size at 10, the consumer asks for 50.
    let strict = widget_crd_with_max_size(10);
    install_crd(&s.provider, &strict).await.unwrap();
    let consumer_widgets = widgets(&s.consumer, "team-a");
    merge_patch(&consumer_widgets, "w1", &json!({ "spec": { "size": 50 } })).await;
    wait_record(&s.consumer, "w1", "Rejected", 1).await;
    let run = diff(&["-o", "json"]).await;
    assert_eq!(run.code, 1, "a copy that differs asks for attention: {run}");
    let report = run.json();
    assert_eq!(report["identical"], false);
    let lines: Vec<&str> = report["diff"].as_str().unwrap().lines().collect();
    for line in [
        "--- provider Widget team-a/w1",
        "+++ consumer Widget team-a/w1",
        "-  size: 1",
        "+  size: 50",
    ] {
        assert!(lines.contains(&line), "{line:?} in {report:#}");
    }
    assert_eq!(report["consumer"]["generation"], 2);
    assert_eq!(report["delivery"]["generation"], 1);
    assert_rejected_for_size(&report, "record");

    // Fixed: in sync again; the refusal is now known from kbind's Warning Event.
    merge_patch(&consumer_widgets, "w1", &json!({ "spec": { "size": 5 } })).await;
    wait_record(&s.consumer, "w1", "Synced", 3).await;
    let run = diff(&["-o", "json"]).await;
    assert_eq!(run.code, 0, "{run}");
    let report = run.json();
    assert_eq!(report["identical"], true, "{report:#}");
    assert_rejected_for_size(&report, "event");

    // kbind stopped, the consumer changed: the diff shows the change and writes nothing.
    let (manager, syncer) = (s.manager.index, s.syncer.index);
    s.env.process(manager).kill();
    s.env.process(syncer).kill();
    merge_patch(&consumer_widgets, "w1", &json!({ "spec": { "size": 7 } })).await;
    let before = quiet_writes(&s.consumer, &s.provider).await;
    let json_run = diff(&["-o", "json"]).await;
    let text = diff(&[]).await;
    let missing = plugin(&kubeconfig, &["diff", "widget/nope", "-n", "team-a"]).await;
    let unknown = plugin(&kubeconfig, &["diff", "pods/x"]).await;
    assert_no_writes_since(&before, &s.consumer, &s.provider, "the diffs").await;
    assert_eq!(json_run.code, 1, "{json_run}");
    assert_eq!(json_run.json()["consumer"]["generation"], 4);
    assert_eq!(text.code, 1, "{text}");
    for line in ["-  size: 5", "+  size: 7"] {
        assert!(text.stdout.lines().any(|l| l == line), "{line:?} in {text}");
    }
    assert!(
        text.stdout
            .lines()
            .any(|l| l.starts_with("SIDE ") && l.contains("MANAGER") && l.contains("FIELDS")),
        "{text}"
    );
    assert!(
        text.stdout.lines().any(|l| l.starts_with("provider ")
            && l.contains("kbind-konnector")
            && l.contains(".spec.size")),
        "{text}"
    );
    assert_eq!(missing.code, 2, "{missing}");
    assert!(
        missing.stderr.contains("Widget team-a/nope does not exist"),
        "{missing}"
    );
    assert_eq!(unknown.code, 2, "{unknown}");
    assert!(
        unknown
            .stderr
            .contains("no API kbind serves here is called \"pods\""),
        "{unknown}"
    );
}
