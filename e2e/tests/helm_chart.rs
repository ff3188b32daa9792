//! The Helm chart (`deploy/charts/kbind`): rendered and linted by a real Helm, its values schema
//! rejects bad input, and its manifests are accepted by a real API server; kbind's programs then
//! run as the chart's ServiceAccounts and sync — the chart's RBAC is enough — while a verb it does
//! not grant is refused.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_e2e::cluster::{User, client_for, ensure_namespace};
use kbind_e2e::fixtures::*;
use kbind_e2e::kbind::wait_established;
use kbind_e2e::tools::{chart_dir, run_helm};
use kbind_e2e::{TestEnv, eventually};
use kbind_shared::api::{Binding, ClusterBinding};
use kube::Api;
use kube::api::{DeleteParams, PostParams};

const RELEASE_NAMESPACE: &str = "kbind-system";
/// The version of the test clusters.
const KUBE_VERSION: &str = "1.36.3";

fn helm_ok(args: &[&str]) -> String {
    kbind_e2e::tools::helm_checked(args).unwrap()
}

/// `helm template` of the chart as release `kbind` in [`RELEASE_NAMESPACE`], with `extra`
/// arguments: its output.
fn template(extra: &[&str]) -> String {
    template_with(extra, helm_ok)
}

/// The same, which must fail: its error output.
fn template_err(extra: &[&str]) -> String {
    template_with(extra, helm_err)
}

fn template_with(extra: &[&str], run: fn(&[&str]) -> String) -> String {
    let chart = chart_dir().display().to_string();
    let mut args = vec![
        "template",
        "kbind",
        &chart,
        "--kube-version",
        KUBE_VERSION,
        "-n",
        RELEASE_NAMESPACE,
    ];
    args.extend_from_slice(extra);
    run(&args)
}

fn helm_err(args: &[&str]) -> String {
    let output = run_helm(args).unwrap();
    assert!(!output.status.success(), "helm {args:?} should have failed");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn chart_lints_clean_and_its_schema_rejects_bad_values() {
    let chart = chart_dir().display().to_string();
    for extra in [
        vec![],
        vec![
            "--set",
            "boundAPIGroups={example.org,other.io}",
            "--set",
            "syncer.replicas=5",
            "--set",
            "schemaManager.leaderElect=false",
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "installCRDs=false",
            "--set",
            "providerSecretNamespaces={kbind,team-a}",
            "--set",
            "logFormat=text",
        ],
        vec![
            "--set",
            "metrics.podMonitor.enabled=true",
            "--set",
            "metrics.dashboard.enabled=true",
        ],
    ] {
        let mut args = vec![
            "lint",
            "--strict",
            chart.as_str(),
            "--kube-version",
            KUBE_VERSION,
        ];
        args.extend(extra.iter().copied());
        let out = helm_ok(&args);
        assert!(out.contains("0 chart(s) failed"), "{out}");
    }
    for (bad, why) in [
        ("syncer.replicas=three", "/syncer/replicas"),
        ("syncer.replicas=0", "/syncer/replicas"),
        ("syncerReplicas=3", "syncerReplicas"),
        ("logFormat=xml", "/logFormat"),
        (
            "schemaManager.discoveryInterval=soon",
            "/schemaManager/discoveryInterval",
        ),
        ("boundAPIGroups={Example.ORG}", "/boundAPIGroups"),
        // The core group: no CRD lives there, and a rule on it would grant every Secret.
        ("boundAPIGroups[0]=", "/boundAPIGroups"),
        ("allowInsecureProviders=maybe", "/allowInsecureProviders"),
        (
            "metrics.podMonitor.interval=often",
            "/metrics/podMonitor/interval",
        ),
        (
            "metrics.dashboard.namespace=Not_A_Namespace",
            "/metrics/dashboard/namespace",
        ),
        ("metrics.dashboard.enable=true", "enable"),
        ("sizing.objects=-1", "/sizing/objects"),
        (
            "sizing.syncer.perObjectKiB=a-lot",
            "/sizing/syncer/perObjectKiB",
        ),
        ("sizing.nodes=3", "nodes"),
        ("maxBindingsPerNamespace=0", "/maxBindingsPerNamespace"),
    ] {
        let err = template_err(&["--set", bad]);
        assert!(err.contains("schema") && err.contains(why), "{bad}: {err}");
    }
}

/// The resources of each Deployment's container, by component, as rendered with `extra`.
fn resources(extra: &[&str]) -> std::collections::BTreeMap<String, serde_json::Value> {
    yaml_documents(&template(extra))
        .unwrap()
        .iter()
        .filter(|d| d["kind"] == "Deployment")
        .map(|d| {
            (
                d["metadata"]["labels"]["app.kubernetes.io/component"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                d["spec"]["template"]["spec"]["containers"][0]["resources"].clone(),
            )
        })
        .collect()
}

#[test]
fn resources_are_derived_from_the_expected_load_unless_given() {
    let memory = |r: &serde_json::Value| {
        (
            r["requests"]["memory"].as_str().unwrap().to_owned(),
            r["limits"]["memory"].as_str().unwrap().to_owned(),
        )
    };
    // The defaults: 10,000 objects and 20 APIs, two syncers. Schema manager: 32 MiB + 10,000 ×
    // 1 KiB + 20 × 320 KiB = 48.02 → 49 MiB, limit × 1.5 (rounded up). Syncer: 24 MiB + 5,000 × 4 KiB + 20 × 1 MiB =
    // 64 MiB; limit: one replica holding all 10,000 (84 MiB) × 1.25.
    let defaults = resources(&[]);
    assert_eq!(
        memory(&defaults["schema-manager"]),
        ("49Mi".into(), "74Mi".into())
    );
    assert_eq!(memory(&defaults["syncer"]), ("64Mi".into(), "105Mi".into()));
    assert_eq!(defaults["syncer"]["requests"]["cpu"], "100m");
    assert!(
        defaults["syncer"]["limits"].get("cpu").is_none(),
        "no CPU limit"
    );
    // 100,000 objects over 200 APIs, three syncers: each holds a third, and half when one is gone.
    let large = resources(&[
        "--set",
        "sizing.objects=100000",
        "--set",
        "sizing.apis=200",
        "--set",
        "syncer.replicas=3",
    ]);
    assert_eq!(
        memory(&large["schema-manager"]),
        ("193Mi".into(), "290Mi".into())
    );
    assert_eq!(memory(&large["syncer"]), ("355Mi".into(), "525Mi".into()));
    // A component's own resources replace the derived ones, whole.
    let given = resources(&["--set", "syncer.resources.requests.memory=1Gi"]);
    assert_eq!(
        given["syncer"],
        serde_json::json!({ "requests": { "memory": "1Gi" } })
    );
    assert_eq!(given["schema-manager"], defaults["schema-manager"]);
}

#[test]
fn chart_renders_two_deployments_with_hardened_pods_and_kept_crds() {
    let docs = yaml_documents(&template(&["--set", "boundAPIGroups={example.org}"])).unwrap();
    let deployments: Vec<&serde_json::Value> =
        docs.iter().filter(|d| d["kind"] == "Deployment").collect();
    assert_eq!(deployments.len(), 2);
    for d in &deployments {
        let pod = &d["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(
            container["securityContext"]["capabilities"]["drop"],
            serde_json::json!(["ALL"])
        );
        let env: Vec<&str> = container["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["name"].as_str())
            .collect();
        // Both programs serve the same Bindings per namespace (the index and the condition
        // agree), set as an environment variable: a previous version run by this chart in a
        // skewed upgrade ignores it, where it would refuse an unknown flag.
        assert_eq!(
            env,
            [
                "POD_NAME",
                "POD_NAMESPACE",
                "KBIND_MAX_BINDINGS_PER_NAMESPACE"
            ]
        );
        assert_eq!(container["env"][2]["value"], "100");
        assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    }
    // The default images are exactly what scripts/images builds (repository, tag = appVersion =
    // the workspace version), and the pods run as the images' user.
    let images: Vec<&str> = deployments
        .iter()
        .filter_map(|d| d["spec"]["template"]["spec"]["containers"][0]["image"].as_str())
        .collect();
    let built = std::process::Command::new(chart_dir().join("../../../scripts/images"))
        .arg("--refs")
        .env_remove("KBIND_IMAGE_REGISTRY")
        .output()
        .unwrap();
    assert!(built.status.success(), "scripts/images --refs: {built:?}");
    let built = String::from_utf8(built.stdout).unwrap();
    // The consumer's two; the others are the provider side's (reaper, issuer, gateway), their
    // own charts'.
    let consumer_images: Vec<&str> = built
        .lines()
        .filter(|r| {
            !["/kbind-reaper:", "/kbind-issuer:", "/kbind-gateway:"]
                .iter()
                .any(|p| r.contains(p))
        })
        .collect();
    assert_eq!(images, consumer_images);
    let chart: serde_json::Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart_dir().join("Chart.yaml")).unwrap())
            .unwrap();
    assert_eq!(chart["appVersion"], env!("CARGO_PKG_VERSION"));
    assert!(
        images
            .iter()
            .all(|i| i.ends_with(&format!(":{}", env!("CARGO_PKG_VERSION"))))
    );
    for d in &deployments {
        let pod = &d["spec"]["template"]["spec"]["securityContext"];
        assert_eq!(
            (&pod["runAsUser"], &pod["runAsGroup"]),
            (&serde_json::json!(65532), &serde_json::json!(65532))
        );
    }
    let crds: Vec<&serde_json::Value> = docs
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .collect();
    assert_eq!(crds.len(), 3);
    assert!(
        crds.iter()
            .all(|c| c["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep")
    );
    assert_eq!(
        docs.iter()
            .filter(|d| d["kind"] == "PodDisruptionBudget")
            .count(),
        2
    );
    // Least privilege: no `*` verbs, and `*` resources only on the bound API groups.
    for role in docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
    {
        for rule in role["rules"].as_array().unwrap() {
            assert!(
                !rule["verbs"].as_array().unwrap().iter().any(|v| v == "*"),
                "{rule}"
            );
            if rule["resources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r == "*")
            {
                assert_eq!(
                    rule["apiGroups"],
                    serde_json::json!(["example.org"]),
                    "{rule}"
                );
            }
        }
    }
}

/// Two clusters with `rendered` (the chart) applied on the consumer — after the namespaces
/// `namespaces` it binds Roles in — and kbind's programs running as the chart's ServiceAccounts,
/// as the chart runs them (its default providerSecretNamespaces: the release namespace), with
/// `flags` too: the env, both admin clients, the two users and the two programs.
async fn run_as_chart(
    test: &str,
    rendered: &str,
    namespaces: &[&str],
    flags: &[&str],
) -> (
    TestEnv,
    kube::Client,
    kube::Client,
    User,
    User,
    [Program; 2],
) {
    let mut env = TestEnv::start(test, &["consumer", "provider"])
        .await
        .expect("clusters start");
    let consumer = env.cluster("consumer").admin_client().await.unwrap();
    let provider = env.cluster("provider").admin_client().await.unwrap();
    ensure_namespace(&consumer, RELEASE_NAMESPACE)
        .await
        .unwrap();
    for namespace in namespaces {
        ensure_namespace(&consumer, namespace).await.unwrap();
    }

    // Server-side dry run first, then for real.
    apply_manifest_with(&consumer, rendered, true)
        .await
        .expect("the chart passes a server-side dry run");
    apply_manifest_with(&consumer, rendered, false)
        .await
        .expect("the chart applies");
    let crds: Api<CustomResourceDefinition> = Api::all(consumer.clone());
    for name in [
        "connections.core.kbind.io",
        "clusterbindings.core.kbind.io",
        "bindings.core.kbind.io",
    ] {
        wait_established(&crds, name).await.unwrap();
    }

    let consumer_cluster = env.cluster("consumer");
    let manager = consumer_cluster
        .mint_service_account_user(RELEASE_NAMESPACE, "kbind-schema-manager")
        .await
        .unwrap();
    let syncer = consumer_cluster
        .mint_service_account_user(RELEASE_NAMESPACE, "kbind-syncer")
        .await
        .unwrap();
    let manager_kubeconfig = env.dir().join("schema-manager-sa.kubeconfig");
    let syncer_kubeconfig = env.dir().join("syncer-sa.kubeconfig");
    std::fs::write(&manager_kubeconfig, &manager.kubeconfig).unwrap();
    std::fs::write(&syncer_kubeconfig, &syncer.kubeconfig).unwrap();
    let namespace_flag = format!("--namespace={RELEASE_NAMESPACE}");
    let secrets_flag = format!("--provider-secret-namespaces={RELEASE_NAMESPACE}");
    let mut args = vec![namespace_flag.as_str(), secrets_flag.as_str()];
    args.extend_from_slice(flags);
    let manager_program = Component::SchemaManager
        .start_built(
            &mut env,
            &Build::Current,
            &manager_kubeconfig,
            "schema-manager",
            &args,
        )
        .unwrap();
    let syncer_program = Component::Syncer
        .start_built(
            &mut env,
            &Build::Current,
            &syncer_kubeconfig,
            "syncer-0",
            &args,
        )
        .unwrap();
    (
        env,
        consumer,
        provider,
        manager,
        syncer,
        [manager_program, syncer_program],
    )
}

/// The one file, with the provider Secret (holding `kubeconfig`) in the release namespace;
/// `order` as [`one_file`]'s.
fn chart_one_file(kubeconfig: &str, order: &[usize]) -> String {
    one_file(kubeconfig, order).replace(
        "namespace: kbind",
        &format!("namespace: {RELEASE_NAMESPACE}"),
    )
}

#[tokio::test]
async fn chart_rbac_is_enough_for_a_sync_and_refuses_what_it_does_not_grant() {
    let rendered = template(&[
        "--set",
        "boundAPIGroups={example.org}",
        "--set",
        "relatedResources.enabled=true",
        "--set",
        "relatedResources.namespaces={team-a}",
        "--set",
        "metrics.auth.enabled=true",
    ]);
    let (env, consumer, provider, manager, syncer, [manager_program, syncer_program]) =
        run_as_chart(
            "helm_rbac",
            &rendered,
            &["team-a"],
            &["--metrics-auth=true"],
        )
        .await;
    // `metrics.auth.enabled`: the chart's RBAC lets both review a scraper's token (#32.10).
    let consumer_cluster = env.cluster("consumer");
    let scraper = consumer_cluster
        .mint_service_account_user("monitoring", "prometheus")
        .await
        .unwrap();
    consumer_cluster
        .grant(
            &scraper,
            "prometheus-metrics",
            vec![k8s_openapi::api::rbac::v1::PolicyRule {
                non_resource_urls: Some(vec!["/metrics".into()]),
                verbs: vec!["get".into()],
                ..Default::default()
            }],
        )
        .await
        .unwrap();
    for program in [&manager_program, &syncer_program] {
        let scrape = |token: Option<String>| {
            let address = program.metrics.clone();
            async move {
                kbind_e2e::kbind::http_get_with(&address, "/metrics", token.as_deref())
                    .await
                    .map_err(|e| e.to_string())
            }
        };
        eventually(
            "a granted scrape served",
            Duration::from_secs(30),
            || async {
                let (code, body) = scrape(Some(scraper.token.clone())).await?;
                Ok((code == 200 && body.contains("kbind_")).then_some(()))
            },
        )
        .await
        .unwrap();
        assert_eq!(scrape(None).await.unwrap().0, 401);
    }

    // The one file, with the provider Secret in the release namespace.
    install_crd(&provider, &widget_crd()).await.unwrap();
    let _provider_controller = run_provider_widget_controller(provider.clone());
    let manifest = chart_one_file(&env.cluster("provider").admin_kubeconfig(), &[0, 1, 2]);
    apply_manifest(&consumer, &manifest).await.unwrap();
    wait_binding(
        &Api::<ClusterBinding>::all(consumer.clone()),
        "widgets",
        "Ready=True",
    )
    .await;
    ensure_namespace(&consumer, "team-a").await.unwrap();
    widgets(&consumer, "team-a")
        .create(&PostParams::default(), &widget("w", 4))
        .await
        .unwrap();
    eventually(
        "the status to come back through the chart's RBAC",
        Duration::from_secs(45),
        || async {
            let w = widgets(&consumer, "team-a")
                .get("w")
                .await
                .map_err(|e| e.to_string())?;
            Ok((w.data["status"]["observedSize"] == 4).then_some(()))
        },
    )
    .await
    .unwrap();
    // Related Secrets in team-a through the chart's `relatedResources` RBAC (REL-9): copied by
    // the syncer, deleted with the Binding by the schema manager.
    ensure_namespace(&provider, "team-a").await.unwrap();
    let mut source = Secret {
        string_data: Some([("password".to_owned(), "s3cret".to_owned())].into()),
        ..Default::default()
    };
    source.metadata.name = Some("db".into());
    Api::<Secret>::namespaced(provider.clone(), "team-a")
        .create(&PostParams::default(), &source)
        .await
        .unwrap();
    let mut spec = binding_spec("provider", &["widgets.example.org"]);
    spec.related_resources = serde_json::from_value(serde_json::json!([
        { "resource": "secrets", "direction": "FromProvider", "selector": { "names": ["db"] } }
    ]))
    .unwrap();
    let team_bindings: Api<Binding> = Api::namespaced(consumer.clone(), "team-a");
    team_bindings
        .create(&PostParams::default(), &Binding::new("related", spec))
        .await
        .unwrap();
    let team_secrets: Api<Secret> = Api::namespaced(consumer.clone(), "team-a");
    eventually(
        "the related Secret copied through the chart's RBAC",
        Duration::from_secs(45),
        || async { team_secrets.get_opt("db").await.map_err(|e| e.to_string()) },
    )
    .await
    .unwrap();
    team_bindings
        .delete("related", &DeleteParams::default())
        .await
        .unwrap();
    let what = "the copy deleted with its Binding through the chart's RBAC";
    kbind_e2e::wait::wait_gone(&team_secrets, "db", what, 45).await;
    kbind_e2e::wait::wait_gone(&team_bindings, "related", what, 45).await;

    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(consumer.clone(), RELEASE_NAMESPACE);
    assert!(
        leases
            .get_opt("kbind-schema-manager")
            .await
            .unwrap()
            .is_some(),
        "leader election works with the chart's Role"
    );

    // And what the chart does not grant is refused.
    let as_manager = client_for(&manager.kubeconfig).await.unwrap();
    let err = Api::<Secret>::namespaced(as_manager, RELEASE_NAMESPACE)
        .delete("provider-kubeconfig", &DeleteParams::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(s) if s.is_forbidden()),
        "the schema manager may not delete Secrets"
    );
    let as_syncer = client_for(&syncer.kubeconfig).await.unwrap();
    let err = Api::<CustomResourceDefinition>::all(as_syncer.clone())
        .delete("widgets.example.org", &DeleteParams::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(s) if s.is_forbidden()),
        "the syncer may not delete CRDs"
    );
    let err = Api::<Secret>::namespaced(as_syncer.clone(), "default")
        .list(&Default::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(s) if s.is_forbidden()),
        "the syncer may not list Secrets"
    );
    // The syncers' own Leases, yes; the schema manager's leader Lease, never.
    let syncer_leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(as_syncer, RELEASE_NAMESPACE);
    let take_over = serde_json::json!({ "spec": { "holderIdentity": "syncer-0" } });
    let err = syncer_leases
        .patch(
            "kbind-schema-manager",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&take_over),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.is_forbidden()),
        "the syncer may not change the leader Lease: {err}"
    );
    let err = syncer_leases
        .delete("kbind-schema-manager", &DeleteParams::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.is_forbidden()),
        "the syncer may not delete the leader Lease: {err}"
    );
    let crds: Api<CustomResourceDefinition> = Api::all(consumer.clone());
    let crd = crds.get("widgets.example.org").await.unwrap();
    assert_eq!(label(&crd, "core.kbind.io/managed"), Some("true"));
}

#[test]
fn related_resources_rbac_is_off_by_default_and_follows_its_namespaces() {
    let render = |extra: &[&str]| yaml_documents(&template(extra)).unwrap();
    let related = |docs: &[serde_json::Value]| -> Vec<(String, String, String)> {
        docs.iter()
            .filter(|d| {
                d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with("-related"))
            })
            .map(|d| {
                (
                    d["kind"].as_str().unwrap_or_default().to_owned(),
                    d["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    d["metadata"]["namespace"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                )
            })
            .collect()
    };
    assert!(related(&render(&[])).is_empty(), "nothing by default");
    let on = render(&["--set", "relatedResources.enabled=true"]);
    let mut found = related(&on);
    found.sort();
    assert_eq!(
        found,
        [
            (
                "ClusterRole".into(),
                "kbind-schema-manager-related".into(),
                String::new()
            ),
            (
                "ClusterRole".into(),
                "kbind-syncer-related".into(),
                String::new()
            ),
            (
                "ClusterRoleBinding".into(),
                "kbind-schema-manager-related".into(),
                String::new()
            ),
            (
                "ClusterRoleBinding".into(),
                "kbind-syncer-related".into(),
                String::new()
            ),
        ]
    );
    let rules = |name: &str| {
        on.iter()
            .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == name)
            .map(|d| d["rules"].clone())
            .unwrap()
    };
    assert_eq!(
        rules("kbind-schema-manager-related"),
        serde_json::json!([{ "apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": ["list", "delete"] }])
    );
    // Secrets and ConfigMaps only: no consumer namespace is ever created for a copy (#32.10).
    assert_eq!(
        rules("kbind-syncer-related"),
        serde_json::json!([{ "apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": ["get", "list", "watch", "create", "patch", "delete"] }])
    );
    let scoped = related(&render(&[
        "--set",
        "relatedResources.enabled=true",
        "--set",
        "relatedResources.namespaces={team-a,team-b}",
    ]));
    assert!(
        scoped
            .iter()
            .all(|(kind, _, _)| kind != "ClusterRoleBinding"),
        "{scoped:?}"
    );
    let mut bound: Vec<&str> = scoped
        .iter()
        .filter(|(kind, _, _)| kind == "RoleBinding")
        .map(|(_, _, ns)| ns.as_str())
        .collect();
    bound.sort();
    assert_eq!(bound, ["team-a", "team-a", "team-b", "team-b"]);
}

/// The `kbind_*` series a PromQL expression reads (histogram suffixes removed).
fn series_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("kbind_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        let base = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(&name);
        out.push(base.to_owned());
    }
    out
}

#[test]
fn chart_renders_scrape_configs_and_the_dashboard_on_request() {
    let kinds = |docs: &[serde_json::Value], kind: &str| -> Vec<serde_json::Value> {
        docs.iter().filter(|d| d["kind"] == kind).cloned().collect()
    };
    // Off by default.
    let plain = yaml_documents(&template(&[])).unwrap();
    for kind in ["ServiceMonitor", "PodMonitor", "ConfigMap"] {
        assert!(kinds(&plain, kind).is_empty(), "{kind} rendered by default");
    }
    let deployments = kinds(&plain, "Deployment");
    let pod_of = |component: &str| {
        deployments
            .iter()
            .find(|d| {
                d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
                    == component
            })
            .map(|d| d["spec"]["template"].clone())
            .unwrap_or_else(|| panic!("no {component} Deployment"))
    };
    let selects = |selector: &serde_json::Value, labels: &serde_json::Value| {
        let wanted = selector.as_object().expect("matchLabels");
        !wanted.is_empty() && wanted.iter().all(|(k, v)| labels[k] == *v)
    };

    // ServiceMonitors: one per component, selecting that component's metrics Service by its labels
    // and scraping its named port, which targets the pods' metrics port.
    let docs =
        yaml_documents(&template(&["--set", "metrics.serviceMonitor.enabled=true"])).unwrap();
    let monitors = kinds(&docs, "ServiceMonitor");
    assert_eq!(monitors.len(), 2);
    let services = kinds(&docs, "Service");
    for component in ["schema-manager", "syncer"] {
        let monitor = monitors
            .iter()
            .find(|m| m["metadata"]["name"] == format!("kbind-{component}"))
            .expect("a ServiceMonitor per component");
        let service = services
            .iter()
            .find(|s| {
                selects(
                    &monitor["spec"]["selector"]["matchLabels"],
                    &s["metadata"]["labels"],
                )
            })
            .unwrap_or_else(|| panic!("the {component} ServiceMonitor selects no Service"));
        assert_eq!(
            service["metadata"]["labels"]["app.kubernetes.io/component"],
            component
        );
        let pod = pod_of(component);
        assert!(selects(
            &service["spec"]["selector"],
            &pod["metadata"]["labels"]
        ));
        assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
        assert_eq!(service["spec"]["ports"][0]["name"], "metrics");
        assert_eq!(pod["spec"]["containers"][0]["ports"][0]["name"], "metrics");
    }

    // PodMonitors: one per component, selecting its pods and their named metrics port.
    let docs = yaml_documents(&template(&[
        "--set",
        "metrics.podMonitor.enabled=true",
        "--set",
        "metrics.podMonitor.labels.release=prometheus",
    ]))
    .unwrap();
    let monitors = kinds(&docs, "PodMonitor");
    assert_eq!(monitors.len(), 2);
    for component in ["schema-manager", "syncer"] {
        let monitor = monitors
            .iter()
            .find(|m| m["metadata"]["name"] == format!("kbind-{component}"))
            .expect("a PodMonitor per component");
        assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");
        let pod = pod_of(component);
        assert!(selects(
            &monitor["spec"]["selector"]["matchLabels"],
            &pod["metadata"]["labels"]
        ));
        let port = &monitor["spec"]["podMetricsEndpoints"][0]["port"];
        assert!(
            pod["spec"]["containers"][0]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == *port),
            "{port} is not a port of the {component} pod"
        );
    }
    for other in ["schema-manager", "syncer"] {
        let monitor = &monitors
            .iter()
            .find(|m| m["metadata"]["name"] == format!("kbind-{other}"))
            .unwrap()["spec"]["selector"]["matchLabels"];
        let another = if other == "syncer" {
            "schema-manager"
        } else {
            "syncer"
        };
        assert!(!selects(monitor, &pod_of(another)["metadata"]["labels"]));
    }
    // Both at once would scrape every pod twice.
    let err = template_err(&[
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.podMonitor.enabled=true",
    ]);
    assert!(err.contains("enable one"), "{err}");

    // The dashboard: a ConfigMap Grafana's sidecar picks up, holding the chart's dashboard JSON.
    let docs = yaml_documents(&template(&[
        "--set",
        "metrics.dashboard.enabled=true",
        "--set",
        "metrics.dashboard.namespace=monitoring",
    ]))
    .unwrap();
    let maps = kinds(&docs, "ConfigMap");
    assert_eq!(maps.len(), 1);
    let map = &maps[0];
    assert_eq!(map["metadata"]["namespace"], "monitoring");
    assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
    let file = std::fs::read_to_string(chart_dir().join("dashboards/kbind.json")).unwrap();
    let dashboard: serde_json::Value =
        serde_json::from_str(map["data"]["kbind.json"].as_str().unwrap()).unwrap();
    assert_eq!(
        dashboard,
        serde_json::from_str::<serde_json::Value>(&file).unwrap()
    );

    // Its panels answer the operator's questions, fit Grafana's 24-column grid, and read only
    // series kbind documents (and so serves).
    let panels = dashboard["panels"].as_array().unwrap();
    let titles: Vec<String> = panels
        .iter()
        .map(|p| p["title"].as_str().unwrap().to_lowercase())
        .collect();
    for topic in [
        "lag",
        "backlog",
        "writes per second",
        "failed",
        "per syncer replica",
    ] {
        assert!(
            titles.iter().any(|t| t.contains(topic)),
            "no panel on {topic}: {titles:?}"
        );
    }
    let mut ids = std::collections::BTreeSet::new();
    let readme = std::fs::read_to_string(chart_dir().join("../../../docs/operations.md")).unwrap();
    let documented = &readme[readme.find("## Metrics").unwrap()..];
    let documented = &documented[..documented[3..].find("\n## ").unwrap()];
    for panel in panels {
        assert!(
            ids.insert(panel["id"].as_u64().unwrap()),
            "duplicate panel id"
        );
        let grid = &panel["gridPos"];
        let (x, w) = (grid["x"].as_u64().unwrap(), grid["w"].as_u64().unwrap());
        assert!(x + w <= 24, "{} overflows the grid", panel["title"]);
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            assert!(!series_in(expr).is_empty(), "{expr} reads no kbind series");
            for series in series_in(expr) {
                assert!(
                    documented.contains(&format!("`{series}`")),
                    "{series} (in {expr}) is not a documented series"
                );
            }
        }
    }
    assert_eq!(
        dashboard["templating"]["list"][0]["type"], "datasource",
        "the data source is a choice, not a fixed UID"
    );
}

/// The one Deployment of a provider-side chart's rendered `docs` runs an image `scripts/images`
/// builds.
fn assert_runs_a_built_image(docs: &[serde_json::Value]) {
    let built = std::process::Command::new(chart_dir().join("../../../scripts/images"))
        .arg("--refs")
        .env_remove("KBIND_IMAGE_REGISTRY")
        .output()
        .unwrap();
    let built = String::from_utf8(built.stdout).unwrap();
    let image = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .and_then(|d| d["spec"]["template"]["spec"]["containers"][0]["image"].as_str())
        .unwrap()
        .to_owned();
    assert!(built.lines().any(|r| r == image), "{image} not in {built}");
}

/// `helm template` of the reaper's chart (installed on a provider) with `extra`: its output, or
/// its error.
fn reaper_template(extra: &[&str]) -> Result<String, String> {
    let chart = chart_dir()
        .with_file_name("kbind-reaper")
        .display()
        .to_string();
    let mut args = vec![
        "template",
        "r",
        &chart,
        "--kube-version",
        KUBE_VERSION,
        "-n",
        "kbind-reaper",
    ];
    args.extend_from_slice(extra);
    let output = run_helm(&args).unwrap();
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

#[test]
fn the_reaper_chart_grants_only_what_its_action_needs() {
    let chart = chart_dir()
        .with_file_name("kbind-reaper")
        .display()
        .to_string();
    let widgets = [
        "--set",
        "apis[0].group=example.org",
        "--set",
        "apis[0].resources[0]=widgets",
    ];
    let mut lint = vec![
        "lint",
        "--strict",
        chart.as_str(),
        "--kube-version",
        KUBE_VERSION,
    ];
    lint.extend_from_slice(&widgets);
    assert!(helm_ok(&lint).contains("0 chart(s) failed"));
    // Its default image is the one scripts/images builds.
    let rendered = yaml_documents(&reaper_template(&widgets).unwrap()).unwrap();
    assert_runs_a_built_image(&rendered);
    // Nothing to look at, nothing granted: refused with the reason.
    let error = reaper_template(&[]).unwrap_err();
    assert!(error.contains("set apis"), "{error}");
    let error = reaper_template(&[&widgets[..], &["--set", "action=Purge"]].concat()).unwrap_err();
    assert!(
        error.contains("Report, Revoke, Orphan or Delete"),
        "{error}"
    );
    // Grants (#51): read only with `grants`, patched only by an action that acts, Leases listed
    // everywhere then (the boundaries come and go).
    for (action, grants, want) in [
        ("Report", false, None),
        ("Revoke", false, None),
        ("Report", true, Some(serde_json::json!(["list"]))),
        ("Revoke", true, Some(serde_json::json!(["list", "patch"]))),
        ("Delete", true, Some(serde_json::json!(["list", "patch"]))),
    ] {
        let values = [format!("action={action}"), format!("grants={grants}")];
        let extra = [&widgets[..], &["--set", &values[0], "--set", &values[1]]].concat();
        let docs = yaml_documents(&reaper_template(&extra).unwrap()).unwrap();
        let role = docs.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
        let rules = role["rules"].as_array().unwrap();
        let rule = |group: &str, resource: &str| {
            rules
                .iter()
                .find(|r| {
                    r["apiGroups"] == serde_json::json!([group])
                        && r["resources"] == serde_json::json!([resource])
                })
                .map(|r| r["verbs"].clone())
        };
        assert_eq!(
            rule("iam.kbind.io", "grants"),
            want,
            "{action} grants={grants}"
        );
        assert_eq!(
            rule("coordination.k8s.io", "leases"),
            grants.then(|| serde_json::json!(["list"])),
            "{action} grants={grants}"
        );
        let policy = docs.iter().find(|d| d["kind"] == "ReaperPolicy").unwrap();
        assert_eq!(policy["spec"]["grants"], grants);
    }
    // The verbs on the consumers' objects follow the action; Secrets, ConfigMaps and Namespaces
    // only when included.
    for (action, verbs) in [
        ("Report", serde_json::json!(["list"])),
        ("Revoke", serde_json::json!(["list"])),
        ("Orphan", serde_json::json!(["list", "patch"])),
        ("Delete", serde_json::json!(["list", "delete"])),
    ] {
        let action_flag = format!("action={action}");
        for include in [false, true] {
            let related = format!("includeRelated={include}");
            let extra = [&widgets[..], &["--set", &action_flag, "--set", &related]].concat();
            let docs = yaml_documents(&reaper_template(&extra).unwrap()).unwrap();
            let role = docs
                .iter()
                .find(|d| d["kind"] == "ClusterRole")
                .expect("a ClusterRole");
            let rules = role["rules"].as_array().unwrap();
            let widget_rule = rules
                .iter()
                .find(|r| r["apiGroups"] == serde_json::json!(["example.org"]))
                .unwrap();
            assert_eq!(widget_rule["verbs"], verbs, "{action}");
            assert_eq!(
                rules
                    .iter()
                    .any(|r| r["resources"] == serde_json::json!(["secrets", "configmaps"])),
                include,
                "{action}, includeRelated={include}"
            );
            assert!(
                !rules
                    .iter()
                    .any(|r| r["resources"] == serde_json::json!(["namespaces"])),
                "namespaces only with includeNamespaces"
            );
            let policy = docs
                .iter()
                .find(|d| d["kind"] == "ReaperPolicy")
                .expect("the policy");
            assert_eq!(policy["spec"]["action"], action);
            assert_eq!(
                policy["spec"]["apis"],
                serde_json::json!(["widgets.example.org"])
            );
            // Heartbeat Leases: list only, in the Lease namespaces.
            let heartbeats = docs
                .iter()
                .find(|d| d["kind"] == "Role" && d["metadata"]["namespace"] == "kbind")
                .expect("a Role in the Lease namespace");
            assert_eq!(heartbeats["rules"][0]["verbs"], serde_json::json!(["list"]));
            // Its own Leases and record by name only; the fence is on by default.
            let own = docs
                .iter()
                .find(|d| d["kind"] == "Role" && d["metadata"]["namespace"] == "kbind-reaper")
                .expect("a Role in its own namespace");
            for rule in own["rules"].as_array().unwrap() {
                let writes = rule["verbs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|v| v != "create");
                assert_eq!(writes, rule.get("resourceNames").is_some(), "{rule}");
            }
            assert!(
                docs.iter()
                    .any(|d| d["kind"] == "ValidatingAdmissionPolicy"),
                "the admission fence"
            );
            // Whole-namespace reads only with includeNamespaces and Delete.
            let namespaces = format!("includeNamespaces={include}");
            let extra = [&extra[..], &["--set", &namespaces]].concat();
            let docs = yaml_documents(&reaper_template(&extra).unwrap()).unwrap();
            let reads_all = docs
                .iter()
                .filter(|d| d["kind"] == "ClusterRole")
                .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
                .any(|r| r["resources"] == serde_json::json!(["*"]));
            assert_eq!(
                reads_all,
                include && action == "Delete",
                "{action} {include}"
            );
        }
    }
    // Related copies only in the namespaces named, when named.
    let scoped = [
        &widgets[..],
        &[
            "--set",
            "includeRelated=true",
            "--set",
            "relatedNamespaces={team-a,team-b}",
        ],
    ]
    .concat();
    let docs = yaml_documents(&reaper_template(&scoped).unwrap()).unwrap();
    let cluster_wide = docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRole")
        .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
        .any(|r| r["resources"] == serde_json::json!(["secrets", "configmaps"]));
    assert!(
        !cluster_wide,
        "no cluster-wide Secret read when relatedNamespaces names some"
    );
    let related_roles: Vec<&str> = docs
        .iter()
        .filter(|d| {
            d["kind"] == "Role"
                && d["rules"][0]["resources"] == serde_json::json!(["secrets", "configmaps"])
        })
        .filter_map(|d| d["metadata"]["namespace"].as_str())
        .collect();
    assert_eq!(related_roles, ["team-a", "team-b"]);
    let policy = docs.iter().find(|d| d["kind"] == "ReaperPolicy").unwrap();
    assert_eq!(
        policy["spec"]["relatedNamespaces"],
        serde_json::json!(["team-a", "team-b"])
    );
    let off = [&widgets[..], &["--set", "admissionFence=false"]].concat();
    let docs = yaml_documents(&reaper_template(&off).unwrap()).unwrap();
    assert!(
        !docs
            .iter()
            .any(|d| d["kind"] == "ValidatingAdmissionPolicy")
    );
}

#[test]
fn the_issuer_chart_lints_runs_the_built_image_and_writes_only_what_it_provisions_behind_its_fence()
{
    let chart = chart_dir()
        .with_file_name("kbind-issuer")
        .display()
        .to_string();
    assert!(
        helm_ok(&["lint", "--strict", &chart, "--kube-version", KUBE_VERSION])
            .contains("0 chart(s) failed")
    );
    let render = |extra: &[&str]| {
        let mut args = vec![
            "template",
            "i",
            &chart,
            "--kube-version",
            KUBE_VERSION,
            "-n",
            "kbind-issuer",
        ];
        args.extend_from_slice(extra);
        helm_ok(&args)
    };
    let rendered = render(&[]);
    let docs = yaml_documents(&rendered).unwrap();
    assert_runs_a_built_image(&docs);
    // No wildcard anywhere; cluster-wide, nothing written but the catalog's and Grants' status
    // and what a Grant provisions; its own namespace: its leader Lease, by name (creating one
    // cannot be limited by name).
    let rules = |kind: &str| -> Vec<serde_json::Value> {
        docs.iter()
            .filter(|d| d["kind"] == kind)
            .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
            .collect()
    };
    let reads = ["get", "list", "watch"];
    for rule in rules("ClusterRole").iter().chain(&rules("Role")) {
        for field in ["apiGroups", "resources", "verbs"] {
            assert!(
                !rule[field].as_array().unwrap().iter().any(|v| v == "*"),
                "{rule}"
            );
        }
    }
    let mut writes = std::collections::BTreeSet::new();
    for rule in rules("ClusterRole") {
        for verb in rule["verbs"].as_array().unwrap() {
            let verb = verb.as_str().unwrap();
            if reads.contains(&verb) {
                continue;
            }
            for resource in rule["resources"].as_array().unwrap() {
                writes.insert(format!("{} {verb}", resource.as_str().unwrap()));
            }
        }
    }
    let mut expected = std::collections::BTreeSet::new();
    for status in ["exports/status", "collections/status", "grants/status"] {
        expected.insert(format!("{status} patch"));
    }
    for resource in ["namespaces", "serviceaccounts"] {
        for verb in ["create", "patch"] {
            expected.insert(format!("{resource} {verb}"));
        }
    }
    for resource in [
        "roles",
        "rolebindings",
        "clusterroles",
        "clusterrolebindings",
    ] {
        for verb in ["create", "patch", "delete"] {
            expected.insert(format!("{resource} {verb}"));
        }
    }
    for resource in ["roles", "clusterroles"] {
        for verb in ["escalate", "bind"] {
            expected.insert(format!("{resource} {verb}"));
        }
    }
    assert_eq!(writes, expected);
    // Those rights behind the admission fence, on by default, matching the issuer's account.
    let policy = |name: &str| {
        docs.iter()
            .filter(|d| d["kind"] == "ValidatingAdmissionPolicy")
            .filter(|d| {
                d["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .ends_with(name)
            })
            .collect::<Vec<_>>()
    };
    let fence = policy("-fence");
    assert_eq!(fence.len(), 1, "{rendered}");
    // The consumers' namespace policy is always there: the Grants' `create namespaces` needs it.
    assert_eq!(policy("-boundaries").len(), 1, "{rendered}");
    assert!(
        fence[0]["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .unwrap()
            .contains("system:serviceaccount:kbind-issuer:i-kbind-issuer"),
        "{:#}",
        fence[0]
    );
    assert!(
        docs.iter()
            .any(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
    );
    let unfenced = render(&["--set", "admissionFence=false"]);
    assert!(!unfenced.contains("-fence"));
    assert!(unfenced.contains("-boundaries"));
    for rule in rules("Role") {
        assert_eq!(rule["resources"], serde_json::json!(["leases"]), "{rule}");
        if rule["verbs"] != serde_json::json!(["create"]) {
            assert_eq!(
                rule["resourceNames"],
                serde_json::json!(["kbind-issuer"]),
                "{rule}"
            );
        }
    }
}

/// #54: with `boundAPINamespaces`, kbind holds no cluster-wide right on the bound APIs on the
/// consumer, and its provider credential none on the provider — and syncs two team namespaces'
/// Bindings both ways, refused nothing, never reading a third namespace (the audit logs of both
/// API servers).
#[tokio::test]
async fn chart_namespaced_rbac_syncs_two_team_namespaces_and_reads_no_third() {
    let teams = ["team-a", "team-b"];
    let rendered = template(&[
        "--set",
        "boundAPIGroups={example.org}",
        "--set",
        "boundAPINamespaces={team-a,team-b}",
    ]);
    let (env, consumer, provider, manager, syncer, _programs) =
        run_as_chart("helm_rbac_namespaced", &rendered, &teams, &[]).await;
    ensure_namespace(&consumer, "team-c").await.unwrap();
    // What the chart granted cluster-wide on the bound group: nothing.
    for user in [&manager, &syncer] {
        let as_user = client_for(&user.kubeconfig).await.unwrap();
        let everywhere: Api<kube::api::DynamicObject> = Api::all_with(as_user, &widget_resource());
        // (The CRD is not there yet: RBAC answers first.)
        let err = everywhere.list(&Default::default()).await.unwrap_err();
        assert!(
            matches!(&err, kube::Error::Api(s) if s.is_forbidden()),
            "{} may not list Widgets cluster-wide: {err}",
            user.username
        );
    }

    // The provider credential: the Connection's cluster-wide needs (identity, CRDs, namespaces,
    // heartbeat Lease) and Widgets in team-a and team-b only.
    install_crd(&provider, &widget_crd()).await.unwrap();
    let _provider_controller = run_provider_widget_controller(provider.clone());
    let provider_cluster = env.cluster("provider");
    let credential = provider_cluster.mint_user("kbind").await.unwrap();
    provider_cluster
        .grant(&credential, "kbind-connection", connection_rules())
        .await
        .unwrap();
    for team in teams {
        ensure_namespace(&provider, team).await.unwrap();
        let widget_verbs = [
            "get", "list", "watch", "create", "update", "patch", "delete",
        ];
        provider_cluster
            .grant_in(
                &credential,
                team,
                "kbind-widgets",
                vec![rule("example.org", &["widgets"], &widget_verbs)],
            )
            .await
            .unwrap();
    }
    apply_manifest(&consumer, &chart_one_file(&credential.kubeconfig, &[0, 1]))
        .await
        .unwrap();
    for team in teams {
        bind_in(
            &consumer,
            team,
            "widgets",
            "provider",
            &["widgets.example.org"],
        )
        .await;
    }
    widgets(&consumer, "team-c")
        .create(&PostParams::default(), &widget("c", 1))
        .await
        .unwrap();
    for (size, team) in (4..).zip(teams) {
        widgets(&consumer, team)
            .create(&PostParams::default(), &widget("w", size))
            .await
            .unwrap();
        eventually(
            &format!("{team}'s Widget synced up and its status back"),
            Duration::from_secs(45),
            || async {
                let w = widgets(&consumer, team)
                    .get("w")
                    .await
                    .map_err(|e| e.to_string())?;
                Ok((w.data["status"]["observedSize"] == size).then_some(()))
            },
        )
        .await
        .unwrap();
    }
    let c = widgets(&consumer, "team-c").get("c").await.unwrap();
    assert!(
        c.metadata.finalizers.is_none(),
        "team-c is not synced: {c:?}"
    );

    // Every request of kbind about Widgets, on both clusters: in team-a or team-b, none refused.
    for cluster in ["consumer", "provider"] {
        let requests: Vec<_> = env
            .cluster(cluster)
            .audited()
            .into_iter()
            .filter(|a| a.resource == "widgets" && a.user_agent.starts_with("kbind-"))
            .collect();
        assert!(
            requests
                .iter()
                .any(|a| a.user_agent.starts_with("kbind-syncer/")),
            "the {cluster}'s audit log shows the syncer's requests"
        );
        let stray: Vec<String> = requests
            .iter()
            .filter(|a| !teams.contains(&a.namespace.as_str()) || a.code == 403)
            .map(|a| {
                format!(
                    "{} {} {} → {} ({})",
                    a.verb, a.namespace, a.name, a.code, a.user_agent
                )
            })
            .collect();
        assert!(
            stray.is_empty(),
            "on the {cluster}, kbind asked outside team-a and team-b (an empty namespace: \
             cluster-wide) or was refused: {stray:#?}"
        );
    }
}

#[tokio::test]
async fn chart_import_rights_come_with_its_value_and_without_them_the_binding_says_so() {
    // Observe-first import (#54): the chart grants the syncer `create`/`delete` and the schema
    // manager `delete` on the bound groups only with `observeFirstImport`. Without: an importing
    // Binding says `ImportForbidden` and nothing is mirrored; with: the mirrors come, and go
    // with the Binding — both programs running as the chart's ServiceAccounts.
    let render = |import: bool| {
        let import = format!("observeFirstImport={import}");
        template(&[
            "--set",
            "boundAPIGroups={example.org}",
            "--set",
            "boundAPINamespaces={team-a}",
            "--set",
            &import,
        ])
    };
    let (env, consumer, provider, _manager, _syncer, _programs) =
        run_as_chart("helm_import", &render(false), &["team-a"], &[]).await;
    install_crd(&provider, &widget_crd()).await.unwrap();
    let _provider_controller = run_provider_widget_controller(provider.clone());
    ensure_namespace(&provider, "team-a").await.unwrap();
    for name in ["p0", "p1", "p2"] {
        widgets(&provider, "team-a")
            .create(&PostParams::default(), &widget(name, 1))
            .await
            .unwrap();
    }
    let kubeconfig = env.cluster("provider").admin_kubeconfig();
    apply_manifest(&consumer, &chart_one_file(&kubeconfig, &[0, 1]))
        .await
        .unwrap();
    let bindings: Api<Binding> = Api::namespaced(consumer.clone(), "team-a");
    let mut spec = binding_spec("provider", &["widgets.example.org"]);
    spec.import = Some(kbind_shared::api::Import { limit: 10 });
    bindings
        .create(&PostParams::default(), &Binding::new("widgets", spec))
        .await
        .unwrap();
    wait_binding(&bindings, "widgets", "Ready=True").await;
    let events = eventually(
        "the Binding says import is forbidden",
        Duration::from_secs(45),
        || async {
            let events = warning_events(&consumer, Some("team-a"), "widgets").await;
            Ok(events
                .iter()
                .any(|e| e.starts_with("ImportForbidden: kbind may not create"))
                .then_some(events))
        },
    )
    .await
    .unwrap();
    assert!(
        events.iter().any(|e| e.contains("widgets")),
        "it names what: {events:?}"
    );
    assert!(
        widgets(&consumer, "team-a")
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    // The value on: the mirrors come (a provider change wakes the import at once).
    apply_manifest_with(&consumer, &render(true), false)
        .await
        .expect("the chart applies");
    widgets(&provider, "team-a")
        .patch(
            "p0",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({ "spec": { "size": 2 } })),
        )
        .await
        .unwrap();
    eventually("3 mirrors", Duration::from_secs(45), || async {
        let mirrors = widgets(&consumer, "team-a")
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?
            .items;
        let observed = mirrors
            .iter()
            .filter(|w| w.data["status"]["kbindSync"]["state"] == "Observed")
            .count();
        Ok((observed == 3).then_some(()))
    })
    .await
    .unwrap();
    // And go with the Binding: the schema manager's deletes.
    bindings
        .delete("widgets", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the mirrors and the Binding gone",
        Duration::from_secs(45),
        || async {
            let left = widgets(&consumer, "team-a")
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .len();
            let binding = bindings
                .get_opt("widgets")
                .await
                .map_err(|e| e.to_string())?;
            Ok((left == 0 && binding.is_none()).then_some(()))
        },
    )
    .await
    .unwrap();
    let deletes: Vec<_> = env
        .cluster("consumer")
        .audited()
        .into_iter()
        .filter(|a| {
            a.resource == "widgets"
                && a.verb == "delete"
                && a.user_agent.starts_with("kbind-schema-manager/")
        })
        .map(|a| (a.name, a.code))
        .collect();
    assert_eq!(deletes.len(), 3, "{deletes:?}");
    assert!(deletes.iter().all(|(_, code)| *code == 200), "{deletes:?}");
}

/// #52: the issuer chart's gateway (`gateway.enabled`) — two replicas of the built image serving
/// TLS from the named Secret, a PodDisruptionBudget, a Service; its rights exactly what a bind
/// needs, behind its admission fence; refused without the values it cannot guess.
#[test]
fn the_gateway_renders_two_tls_replicas_with_only_the_rights_a_bind_needs() {
    let chart = chart_dir()
        .with_file_name("kbind-issuer")
        .display()
        .to_string();
    let base = [
        "template",
        "i",
        chart.as_str(),
        "--kube-version",
        KUBE_VERSION,
        "-n",
        "kbind-issuer",
        "--set",
        "gateway.enabled=true",
    ];
    fn join<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        args
    }
    let with = |extra: &[&'static str]| join(&base, extra);
    for (missing, says) in [
        (
            with(&["--set", "gateway.tlsSecretName=gateway-tls"]),
            "gateway.providerServer is required",
        ),
        (
            with(&["--set", "gateway.providerServer=https://p:6443"]),
            "gateway.tlsSecretName is required",
        ),
    ] {
        let err = helm_err(&missing);
        assert!(err.contains(says), "{err}");
    }
    let values = [
        "--set",
        "gateway.providerServer=https://provider.example:6443",
        "--set",
        "gateway.tlsSecretName=gateway-tls",
    ];
    assert!(
        helm_ok(
            &[
                &[
                    "lint",
                    "--strict",
                    chart.as_str(),
                    "--kube-version",
                    KUBE_VERSION,
                    "--set",
                    "gateway.enabled=true"
                ][..],
                &values[..],
            ]
            .concat()
        )
        .contains("0 chart(s) failed")
    );
    let rendered = helm_ok(&with(&values));
    let docs = yaml_documents(&rendered).unwrap();
    let gateway: Vec<&serde_json::Value> = docs
        .iter()
        .filter(|d| {
            d["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("i-kbind-issuer-gateway"))
        })
        .collect();
    let deployment = gateway.iter().find(|d| d["kind"] == "Deployment").unwrap();
    assert_runs_a_built_image(&[(*deployment).clone()]);
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["volumes"][0]["secret"]["secretName"], "gateway-tls");
    let args: Vec<&str> = pod["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    for arg in [
        "--tls-cert-file=/etc/kbind-gateway/tls/tls.crt",
        "--provider-server=https://provider.example:6443",
    ] {
        assert!(args.contains(&arg), "{args:?}");
    }
    assert!(!args.iter().any(|a| a.contains("plain-http")), "{args:?}");
    assert_eq!(
        pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"],
        true
    );
    for kind in ["Service", "PodDisruptionBudget", "ServiceAccount"] {
        assert!(
            gateway.iter().any(|d| d["kind"] == kind),
            "{kind}: {rendered}"
        );
    }
    // Its rights, exactly: reviews, the catalog read, Grants recorded, tokens minted (fenced),
    // its pickups in its namespace; no wildcard.
    let mut rights = std::collections::BTreeSet::new();
    for role in gateway
        .iter()
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
    {
        for rule in role["rules"].as_array().unwrap() {
            for resource in rule["resources"].as_array().unwrap() {
                for verb in rule["verbs"].as_array().unwrap() {
                    rights.insert(format!(
                        "{} {} {}",
                        role["kind"].as_str().unwrap(),
                        resource.as_str().unwrap(),
                        verb.as_str().unwrap()
                    ));
                }
            }
        }
    }
    let expected: std::collections::BTreeSet<String> = [
        "ClusterRole tokenreviews create",
        "ClusterRole subjectaccessreviews create",
        "ClusterRole exports get",
        "ClusterRole exports list",
        "ClusterRole exports watch",
        "ClusterRole collections get",
        "ClusterRole collections list",
        "ClusterRole collections watch",
        "ClusterRole grants get",
        "ClusterRole grants create",
        "ClusterRole grants patch",
        "ClusterRole serviceaccounts/token create",
        "Role secrets get",
        "Role secrets create",
        "Role secrets list",
        "Role secrets delete",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(rights, expected);
    let fence = gateway
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .unwrap();
    assert!(
        fence["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .unwrap()
            .contains("system:serviceaccount:kbind-issuer:i-kbind-issuer-gateway"),
        "{fence:#}"
    );
    let mut unfenced = with(&values);
    unfenced.extend_from_slice(&["--set", "admissionFence=false"]);
    assert!(!helm_ok(&unfenced).contains("gateway-kbind-issuer-fence"));
    // Browser login: the issuer, the client secret from its Secret, the URL browsers return to —
    // all three or none.
    let err = helm_err(
        &[
            &with(&values)[..],
            &["--set", "gateway.oidc.issuer=https://id.example"],
        ]
        .concat(),
    );
    assert!(err.contains("needs gateway.oidc.clientSecretName"), "{err}");
    let with_login = helm_ok(
        &[
            &with(&values)[..],
            &[
                "--set",
                "gateway.oidc.issuer=https://id.example",
                "--set",
                "gateway.oidc.clientSecretName=gateway-oidc",
                "--set",
                "gateway.oidc.externalURL=https://kbind.example",
                "--show-only",
                "templates/gateway.yaml",
            ],
        ]
        .concat(),
    );
    for expected in [
        "--oidc-issuer=https://id.example",
        "--oidc-client-secret-file=/etc/kbind-gateway/oidc/client-secret",
        "--external-url=https://kbind.example",
        "secretName: gateway-oidc",
    ] {
        assert!(with_login.contains(expected), "{expected}: {with_login}");
    }
    assert!(!rendered.contains("--oidc-issuer"), "no login unless asked");
    // Off by default: the issuer chart alone renders no gateway.
    assert!(!helm_ok(&base[..base.len() - 2]).contains("gateway"));
}
