//! kbind as its users run it: the Helm chart's two Deployments as pods on a real kubelet node
//! (containerd + runc, the images `scripts/images` builds, in-cluster config through the
//! `kubernetes` Service routed by kube-proxy), against a provider cluster reached the way a pod
//! reaches any server outside its cluster. See `kbind_e2e::node` for what the node is.
//!
//! The node tier runs as its own step of `scripts/test` (`--features node`): it needs root and
//! the machine's container runtime packages, which that step installs.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kbind_e2e::cluster::kubeconfig_yaml;
use kbind_e2e::fixtures::*;
use kbind_e2e::tools::{chart_dir, run_helm};
use kbind_e2e::wait::wait_for;
use kbind_e2e::{Cluster, TestEnv};
use kube::api::{ListParams, LogParams};
use kube::{Api, Client, ResourceExt};

const RELEASE: &str = "kbind";

/// `helm <args>` against `cluster`; panics with helm's output when it fails.
fn helm(cluster: &Cluster, args: &[&str]) -> String {
    let kubeconfig = cluster.admin_kubeconfig_path().display().to_string();
    let mut all = vec!["--kubeconfig", kubeconfig.as_str()];
    all.extend_from_slice(args);
    let output = run_helm(&all).unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(
        output.status.success(),
        "helm {all:?} failed:\n{stdout}\n{stderr}"
    );
    stdout.into_owned()
}

/// `--set` arguments that point the chart at the images loaded into the node (never pulled);
/// everything else stays at the chart's defaults, apart from `extra`.
fn image_values(extra: &[&str]) -> Vec<String> {
    let mut values = vec![
        "--set".to_owned(),
        "boundAPIGroups={example.org}".to_owned(),
    ];
    for (component, program) in [
        ("schemaManager", "kbind-schema-manager"),
        ("syncer", "kbind-syncer"),
    ] {
        let reference = kbind_e2e::images::reference(program).unwrap();
        let (repository, tag) = reference.rsplit_once(':').unwrap();
        for (key, value) in [
            ("repository", repository),
            ("tag", tag),
            ("pullPolicy", "Never"),
        ] {
            values.push("--set".into());
            values.push(format!("{component}.image.{key}={value}"));
        }
    }
    for value in extra {
        values.push("--set".into());
        values.push((*value).to_owned());
    }
    values
}

/// `helm install` (or `upgrade --install`) of the chart in [`KBIND_NAMESPACE`].
fn install(cluster: &Cluster, extra: &[&str]) {
    let chart = chart_dir().display().to_string();
    let mut args = vec![
        "upgrade",
        "--install",
        RELEASE,
        chart.as_str(),
        "-n",
        KBIND_NAMESPACE,
        "--create-namespace",
    ];
    let values = image_values(extra);
    args.extend(values.iter().map(String::as_str));
    helm(cluster, &args);
}

/// Waits until the Deployment has all its replicas updated and Available, and returns its pods
/// (all Running, every container ready by the kubelet's own probes).
async fn wait_available(client: &Client, deployment: &str, limit_secs: u64) -> Vec<Pod> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), KBIND_NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), KBIND_NAMESPACE);
    wait_for(
        &format!("Deployment {deployment} Available"),
        limit_secs,
        || async {
            let d = deployments
                .get(deployment)
                .await
                .map_err(|e| e.to_string())?;
            let wanted = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            let status = d.status.clone().unwrap_or_default();
            let available = status
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Available" && c.status == "True");
            if !(available
                && status.updated_replicas == Some(wanted)
                && status.ready_replicas == Some(wanted)
                && status.replicas == Some(wanted))
            {
                return Err(format!("{deployment}: {status:?}", status = d.status));
            }
            let selector = format!("app.kubernetes.io/component={}", component(deployment));
            let list = pods
                .list(&ListParams::default().labels(&selector))
                .await
                .map_err(|e| e.to_string())?;
            let running: Vec<Pod> = list
                .items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            let all_ready = running.iter().all(|p| {
                p.status.as_ref().is_some_and(|s| {
                    s.phase.as_deref() == Some("Running")
                        && s.container_statuses
                            .as_ref()
                            .is_some_and(|c| c.iter().all(|c| c.ready))
                })
            });
            Ok((running.len() == wanted as usize && all_ready).then_some(running))
        },
    )
    .await
}

/// The chart's component label of a Deployment.
fn component(deployment: &str) -> &str {
    deployment.strip_prefix("kbind-").unwrap_or(deployment)
}

/// The provider kubeconfig Secret, Connection and ClusterBinding, as a user applies them with
/// the chart's defaults (the Secret in the release namespace, where kbind may read Secrets).
fn one_file_in_release_namespace(kubeconfig: &str) -> String {
    one_file(kubeconfig, &[0, 1, 2]).replace(
        &format!("namespace: {SECRET_NAMESPACE}\n"),
        &format!("namespace: {KBIND_NAMESPACE}\n"),
    )
}

#[tokio::test]
async fn the_chart_installs_on_a_node_its_probes_pass_and_an_object_syncs_both_ways() {
    let env = TestEnv::start_on_node("chart_on_node").await.unwrap();
    let consumer_cluster = env.cluster("consumer");
    let consumer = consumer_cluster.admin_client().await.unwrap();
    let provider_cluster = env.cluster("provider");
    let provider = provider_cluster.admin_client().await.unwrap();
    install_crd(&provider, &widget_crd()).await.unwrap();
    let _controller = run_provider_widget_controller(provider.clone());

    install(consumer_cluster, &[]);
    let mut pods = wait_available(&consumer, "kbind-schema-manager", 180).await;
    pods.extend(wait_available(&consumer, "kbind-syncer", 180).await);
    // Both Deployments at the chart's default replicas, every pod Ready by the kubelet's own
    // readiness probe (the chart defines it: no probe would make "ready" mean nothing).
    assert_eq!(pods.len(), 4, "two schema managers and two syncers");
    for pod in &pods {
        let spec = pod.spec.as_ref().unwrap();
        for container in &spec.containers {
            assert!(
                container.readiness_probe.is_some() && container.liveness_probe.is_some(),
                "{}: the chart's probes",
                pod.name_any()
            );
        }
        let statuses = pod.status.as_ref().unwrap().container_statuses.clone();
        for status in statuses.unwrap_or_default() {
            assert_eq!(status.restart_count, 0, "{}: no restarts", pod.name_any());
        }
    }

    // The provider credential as a pod reaches it: the provider's address seen from the node.
    let server = env.provider_server_for_pods().unwrap();
    let kubeconfig = kubeconfig_yaml(
        "provider",
        &server,
        provider_cluster.ca_pem(),
        provider_cluster.admin_token(),
        None,
    );
    apply_manifest(&consumer, &one_file_in_release_namespace(&kubeconfig))
        .await
        .unwrap();
    wait_condition(&consumer, "provider", "Ready", "True", None)
        .await
        .unwrap();
    kbind_e2e::kbind::wait_established(&Api::all(consumer.clone()), "widgets.example.org")
        .await
        .unwrap();

    kbind_e2e::cluster::ensure_namespace(&consumer, "default")
        .await
        .unwrap();
    create_widget_and_wait_upstream(&consumer, &provider, "default", "first", 3).await;
    wait_status_down(&widgets(&consumer, "default"), "first", 3).await;

    // Every pod's log, as `kubectl logs` reads it through the kubelet: kbind's JSON lines,
    // starting with the program's start-up line.
    let pod_api: Api<Pod> = Api::namespaced(consumer.clone(), KBIND_NAMESPACE);
    for pod in &pods {
        let log = pod_api
            .logs(&pod.name_any(), &LogParams::default())
            .await
            .unwrap_or_else(|e| panic!("logs of {}: {e}", pod.name_any()));
        let lines: Vec<serde_json::Value> = log
            .lines()
            .map(|line| {
                serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("{}: a JSON log line: {e}: {line}", pod.name_any()))
            })
            .collect();
        let program = format!(
            "kbind-{}",
            component(pod.name_any().rsplitn(3, '-').nth(2).unwrap())
        );
        assert!(
            lines
                .iter()
                .any(|l| l["fields"]["message"] == format!("{program} started")),
            "{}: its start-up line in:\n{log}",
            pod.name_any()
        );
    }
}
