//! kbind's main job, locally: a provider and a consumer cluster (real API servers), kbind's
//! programs as real processes, and one file applied on the consumer that makes a provider API
//! usable there. `--check` runs the same flow non-interactively and exits 0 only when every step
//! was observed. `--pods` runs kbind the way its users do instead: the Helm chart's two
//! Deployments as pods on a real kubelet node of the consumer (needs root; see docs/developing.md, "Run on
//! a real node").

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_e2e::chart;
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::fixtures::*;
use kbind_e2e::kbind::install_crds;
use kbind_e2e::{TestEnv, eventually};
use kbind_shared::api::ClusterBinding;
use kube::api::{DynamicObject, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

/// A local provider + consumer demo of kbind on real Kubernetes API servers.
#[derive(Parser)]
#[command(name = "kbind-demo")]
struct Args {
    /// Run the flow non-interactively and exit 0 only when every step was observed.
    #[arg(long)]
    check: bool,
    /// Run kbind as the Helm chart's pods on a real kubelet node of the consumer cluster
    /// (containerd + runc; needs root) instead of as local processes.
    #[arg(long)]
    pods: bool,
}

const STEP_LIMIT: Duration = Duration::from_secs(60);

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let started = Instant::now();
    match run(&args).await {
        Ok(()) => {
            println!(
                "\nkbind demo: every step observed ({:.0?} in all)",
                started.elapsed()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("\nkbind demo FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn step(n: usize, text: &str) {
    println!("\n[{n}/8] {text}");
}

async fn run(args: &Args) -> Result<(), String> {
    println!("kbind demo: an API served by the provider cluster, used from the consumer cluster.");
    step(
        1,
        "starting two real Kubernetes clusters, `provider` and `consumer` (the first run builds the control plane from the official Go modules: ~10 minutes)",
    );
    let t = Instant::now();
    let mut env = if args.pods {
        println!(
            "      the consumer with a kubelet node (containerd + runc) that runs kbind's images"
        );
        TestEnv::start_on_node("demo").await?
    } else {
        TestEnv::start("demo", &["provider", "consumer"]).await?
    };
    if !args.check {
        env.keep_files();
    }
    println!(
        "      up in {:.1?}; files and logs in {}",
        t.elapsed(),
        env.dir().display()
    );
    let provider = env.cluster("provider").admin_client().await?;
    let consumer = env.cluster("consumer").admin_client().await?;

    step(
        2,
        "provider: installing widgets.example.org, labelled core.kbind.io/exported=true, and a tiny provider controller that fills each Widget's status",
    );
    install_crd(&provider, &widget_crd()).await?;
    let _controller = run_provider_widget_controller(provider.clone());

    let manifest = if args.pods {
        step(
            3,
            "consumer: `helm install` of kbind's chart (its CRDs, RBAC, two schema managers — one leads — and two syncers, as pods of the images scripts/images built; related resources on)",
        );
        let cluster = env.cluster("consumer");
        tokio::task::block_in_place(|| {
            chart::install(cluster, &["relatedResources.enabled=true"])
        })?;
        for deployment in ["kbind-schema-manager", "kbind-syncer"] {
            let pods =
                chart::wait_available(&consumer, deployment, Duration::from_secs(180)).await?;
            let names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
            println!(
                "      Deployment {deployment} Available: {}",
                names.join(", ")
            );
        }
        chart::one_file_in_release_namespace(&env.provider_kubeconfig_for_pods()?)
    } else {
        step(
            3,
            "consumer: installing kbind's CRDs and starting kbind-schema-manager and two kbind-syncer replicas (the schema manager assigns work between them)",
        );
        install_crds(&consumer).await?;
        start_schema_manager(
            &mut env,
            "consumer",
            "schema-manager",
            &["--leader-elect=false"],
        )
        .await?;
        start_syncer(&mut env, "consumer", "syncer-0", &[]).await?;
        start_syncer(&mut env, "consumer", "syncer-1", &[]).await?;
        for name in ["schema-manager", "syncer-0", "syncer-1"] {
            println!(
                "      {name} logs: {}",
                env.dir().join(format!("{name}.log")).display()
            );
        }
        ensure_namespace(&consumer, SECRET_NAMESPACE).await?;
        one_file(&env.cluster("provider").admin_kubeconfig(), &[0, 1, 2])
    };

    step(
        4,
        "consumer: applying ONE file with the provider kubeconfig Secret, a Connection and a ClusterBinding",
    );
    let file = env.dir().join("kbind.yaml");
    std::fs::write(&file, &manifest).map_err(|e| e.to_string())?;
    println!("      {}", file.display());
    apply_manifest(&consumer, &manifest).await?;
    let connection = wait_condition(&consumer, "provider", "Ready", "True", None).await?;
    let status = connection.status.unwrap_or_default();
    println!("      Connection provider is Ready");
    println!(
        "        remoteClusterUID (provider, pinned): {}",
        status.remote_cluster_uid
    );
    println!(
        "        localClusterUID  (consumer, pinned): {}",
        status.local_cluster_uid
    );
    let exported: Vec<String> = status
        .exported_apis
        .iter()
        .map(|a| a.name.clone())
        .collect();
    println!("        exported APIs: {}", exported.join(", "));
    let bindings: Api<ClusterBinding> = Api::all(consumer.clone());
    eventually("ClusterBinding widgets to be Ready", STEP_LIMIT, || async {
        let b = bindings.get("widgets").await.map_err(|e| e.to_string())?;
        Ok(
            kbind_shared::conditions::is_true(&b.status.unwrap_or_default().conditions, "Ready")
                .then_some(()),
        )
    })
    .await?;
    println!("      ClusterBinding widgets is Ready");

    step(5, "consumer: the provider's CRD is installed here");
    let crd = Api::<CustomResourceDefinition>::all(consumer.clone())
        .get("widgets.example.org")
        .await
        .map_err(|e| e.to_string())?;
    println!(
        "      CustomResourceDefinition widgets.example.org: version {}, managed={}, connection={}, schema-hash={}",
        crd.spec
            .versions
            .first()
            .map(|v| v.name.as_str())
            .unwrap_or("?"),
        label(&crd, "core.kbind.io/managed").unwrap_or("?"),
        annotation(&crd, "core.kbind.io/connection").unwrap_or("?"),
        annotation(&crd, "core.kbind.io/schema-hash").unwrap_or("?"),
    );

    step(
        6,
        "consumer: creating Widget team-a/my-widget with spec.size=3",
    );
    ensure_namespace(&consumer, "team-a").await?;
    let widget: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.org/v1", "kind": "Widget",
        "metadata": { "name": "my-widget", "namespace": "team-a" }, "spec": { "size": 3 }
    }))
    .map_err(|e| e.to_string())?;
    let consumer_widgets: Api<DynamicObject> =
        Api::namespaced_with(consumer.clone(), "team-a", &widget_resource());
    consumer_widgets
        .create(&PostParams::default(), &widget)
        .await
        .map_err(|e| e.to_string())?;
    let provider_widgets: Api<DynamicObject> =
        Api::namespaced_with(provider.clone(), "team-a", &widget_resource());
    let copy = eventually("the provider copy", STEP_LIMIT, || async {
        provider_widgets
            .get_opt("my-widget")
            .await
            .map_err(|e| e.to_string())
    })
    .await?;
    println!(
        "      provider copy team-a/my-widget: spec {}",
        copy.data["spec"]
    );
    for key in [
        "core.kbind.io/consumer-cluster-uid",
        "core.kbind.io/consumer-object-uid",
    ] {
        println!(
            "        {key}: {}",
            annotation(&copy, key).unwrap_or("MISSING")
        );
    }
    let back = eventually("status to be copied back", STEP_LIMIT, || async {
        let w = consumer_widgets
            .get("my-widget")
            .await
            .map_err(|e| e.to_string())?;
        Ok(w.data
            .get("status")
            .filter(|s| s["phase"] == "Ready")
            .cloned())
    })
    .await?;
    println!("      status copied back to the consumer: {back}");

    step(
        7,
        "related resources: the provider publishes Secret team-a/my-widget-connection; the ClusterBinding asks for provider Secrets labelled widget=my-widget (spec.relatedResources)",
    );
    let mut published = k8s_openapi::api::core::v1::Secret {
        string_data: Some(
            [(
                "endpoint".to_owned(),
                "https://widgets.example.org/my-widget".to_owned(),
            )]
            .into(),
        ),
        ..Default::default()
    };
    published.metadata.name = Some("my-widget-connection".into());
    published.metadata.labels = Some([("widget".to_owned(), "my-widget".to_owned())].into());
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(provider.clone(), "team-a")
        .create(&PostParams::default(), &published)
        .await
        .map_err(|e| e.to_string())?;
    bindings
        .patch(
            "widgets",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&json!({ "spec": { "relatedResources": [
                { "resource": "secrets", "direction": "FromProvider",
                  "selector": { "labelSelector": { "matchLabels": { "widget": "my-widget" } } } }
            ] } })),
        )
        .await
        .map_err(|e| e.to_string())?;
    let consumer_secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(consumer.clone(), "team-a");
    let copied = eventually("the related Secret on the consumer", STEP_LIMIT, || async {
        consumer_secrets
            .get_opt("my-widget-connection")
            .await
            .map_err(|e| e.to_string())
    })
    .await?;
    let keys: Vec<&String> = copied.data.iter().flat_map(|d| d.keys()).collect();
    println!(
        "      consumer Secret team-a/my-widget-connection (keys {keys:?}), related-binding={}",
        annotation(&copied, "core.kbind.io/related-binding").unwrap_or("MISSING")
    );

    let consumer_kubeconfig = env.cluster("consumer").admin_kubeconfig_path();
    let provider_kubeconfig = env.cluster("provider").admin_kubeconfig_path();
    step(8, "explore (copy-paste):");
    println!(
        "      kubectl --kubeconfig {} get connections,clusterbindings",
        consumer_kubeconfig.display()
    );
    println!(
        "      kubectl --kubeconfig {} get widgets -A",
        consumer_kubeconfig.display()
    );
    println!(
        "      kubectl --kubeconfig {} get widgets -A -o yaml",
        provider_kubeconfig.display()
    );
    println!(
        "      kubectl --kubeconfig {} get secret -n team-a my-widget-connection -o yaml",
        consumer_kubeconfig.display()
    );
    println!(
        "      kubectl --kubeconfig {} explain connection.spec.schema",
        consumer_kubeconfig.display()
    );
    if args.pods {
        println!(
            "      kubectl --kubeconfig {} get pods -n {KBIND_NAMESPACE} -o wide",
            consumer_kubeconfig.display()
        );
        println!(
            "      kubectl --kubeconfig {} logs -n {KBIND_NAMESPACE} deployment/kbind-syncer",
            consumer_kubeconfig.display()
        );
    }

    if args.check {
        return Ok(());
    }
    println!("\nkbind is running. Press Ctrl-C to stop every process this demo started.");
    let _ = tokio::signal::ctrl_c().await;
    drop(env);
    println!(
        "stopped kbind ({}) and both clusters; files kept in {}",
        if args.pods {
            "the node and its pods"
        } else {
            "kbind-schema-manager, both kbind-syncer replicas"
        },
        file.parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    );
    Ok(())
}
