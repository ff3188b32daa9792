//! kbind's Helm chart installed on a cluster with a node ([`crate::TestEnv::start_on_node`]): the
//! release in [`KBIND_NAMESPACE`], the images `scripts/images` built and the node holds (never
//! pulled), everything else at the chart's defaults unless asked. Used by the node tests and
//! `kbind-demo --pods`.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client};

use crate::cluster::Cluster;
use crate::fixtures::{KBIND_NAMESPACE, SECRET_NAMESPACE, one_file};
use crate::tools::{chart_dir, helm_checked};
use crate::wait::eventually;

/// The release's name.
pub const RELEASE: &str = "kbind";

/// `helm <args>` against `cluster`.
pub fn helm(cluster: &Cluster, args: &[&str]) -> Result<String, String> {
    let kubeconfig = cluster.admin_kubeconfig_path().display().to_string();
    let mut all = vec!["--kubeconfig", kubeconfig.as_str()];
    all.extend_from_slice(args);
    helm_checked(&all)
}

/// `--set` arguments that point the chart at the images loaded into the node (never pulled) and
/// bind `example.org`; everything else stays at the chart's defaults, apart from `extra`.
pub fn image_values(extra: &[&str]) -> Result<Vec<String>, String> {
    let mut values = vec![
        "--set".to_owned(),
        "boundAPIGroups={example.org}".to_owned(),
    ];
    for (component, program) in [
        ("schemaManager", "kbind-schema-manager"),
        ("syncer", "kbind-syncer"),
    ] {
        let reference = crate::images::reference(program)?;
        let (repository, tag) = reference
            .rsplit_once(':')
            .ok_or_else(|| format!("{reference}: no tag"))?;
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
    Ok(values)
}

/// `helm upgrade --install` of the chart as [`RELEASE`] in [`KBIND_NAMESPACE`].
pub fn install(cluster: &Cluster, extra: &[&str]) -> Result<(), String> {
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
    let values = image_values(extra)?;
    args.extend(values.iter().map(String::as_str));
    helm(cluster, &args).map(drop)
}

/// The chart's component label of a Deployment (`kbind-syncer` → `syncer`).
pub fn component(deployment: &str) -> &str {
    deployment.strip_prefix("kbind-").unwrap_or(deployment)
}

/// Pods of a chart component (`schema-manager`, `syncer`), terminating ones included.
pub async fn component_pods(client: &Client, component: &str) -> Result<Vec<Pod>, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), KBIND_NAMESPACE);
    pods.list(&ListParams::default().labels(&format!("app.kubernetes.io/component={component}")))
        .await
        .map(|list| list.items)
        .map_err(|e| e.to_string())
}

/// Waits until the Deployment's controller has seen its spec and all its replicas are updated and
/// Available, and returns its pods (all Running, every container ready by the kubelet's own
/// probes).
pub async fn wait_available(
    client: &Client,
    deployment: &str,
    limit: Duration,
) -> Result<Vec<Pod>, String> {
    wait_available_pods(client, deployment, component(deployment), limit).await
}

/// [`wait_available`] for a Deployment whose pods' `app.kubernetes.io/component` is `component`
/// (the issuer chart's gateway: Deployment `kbind-issuer-gateway`, component `gateway`).
pub async fn wait_available_pods(
    client: &Client,
    deployment: &str,
    component: &str,
    limit: Duration,
) -> Result<Vec<Pod>, String> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), KBIND_NAMESPACE);
    eventually(
        &format!("Deployment {deployment} Available"),
        limit,
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
            // The controller's status of this very spec (a status from before an upgrade would
            // describe the old pods).
            let observed = status.observed_generation >= d.metadata.generation;
            if !(available
                && observed
                && status.updated_replicas == Some(wanted)
                && status.ready_replicas == Some(wanted)
                && status.replicas == Some(wanted))
            {
                return Err(format!("{deployment}: {status:?}", status = d.status));
            }
            let running: Vec<Pod> = component_pods(client, component)
                .await?
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

/// The provider kubeconfig Secret, Connection and ClusterBinding ([`one_file`]), as a user of the
/// chart applies them: the Secret in the release namespace, where the chart lets kbind read
/// Secrets by default.
pub fn one_file_in_release_namespace(kubeconfig: &str) -> String {
    one_file(kubeconfig, &[0, 1, 2]).replace(
        &format!("namespace: {SECRET_NAMESPACE}\n"),
        &format!("namespace: {KBIND_NAMESPACE}\n"),
    )
}
