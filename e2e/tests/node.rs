//! kbind as its users run it: the Helm chart's two Deployments as pods on a real kubelet node
//! (containerd + runc, the images `scripts/images` builds, in-cluster config through the
//! `kubernetes` Service routed by kube-proxy), against a provider cluster reached the way a pod
//! reaches any server outside its cluster. See `kbind_e2e::node` for what the node is.
//!
//! The node tier runs as its own step of `scripts/test` (`--features node`): it needs root and
//! the machine's container runtime packages, which that step installs.

use std::collections::BTreeMap;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kbind_e2e::chart::{self, RELEASE, component};
use kbind_e2e::fixtures::*;
use kbind_e2e::tools::chart_dir;
use kbind_e2e::wait::wait_for;
use kbind_e2e::{Cluster, TestEnv};
use kube::api::LogParams;
use kube::{Api, Client, ResourceExt};

/// `helm <args>` against `cluster`; panics with helm's output when it fails.
fn helm(cluster: &Cluster, args: &[&str]) -> String {
    chart::helm(cluster, args).unwrap()
}

/// `helm upgrade --install` of the chart with the node's images and `extra` values.
fn install(cluster: &Cluster, extra: &[&str]) {
    chart::install(cluster, extra).unwrap();
}

/// [`chart::wait_available`]; panics after `limit_secs`.
async fn wait_available(client: &Client, deployment: &str, limit_secs: u64) -> Vec<Pod> {
    chart::wait_available(client, deployment, Duration::from_secs(limit_secs))
        .await
        .unwrap()
}

/// Pods of a chart component (`schema-manager`, `syncer`).
async fn component_pods(client: &Client, component: &str) -> Vec<Pod> {
    chart::component_pods(client, component).await.unwrap()
}

/// Widgets resized round after round (500 ms apart) on the consumer while a test changes kbind.
struct Churn {
    names: Vec<String>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Changes made to each Widget (its creation included), and the last round (= size).
    task: tokio::task::JoinHandle<(Vec<usize>, i64)>,
}

impl Churn {
    /// Starts resizing the existing Widgets `names` in `default`.
    fn start(consumer: &Client, names: &[String]) -> Self {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let task = {
            let (consumer, names, stop) = (consumer.clone(), names.to_vec(), stop.clone());
            tokio::spawn(async move {
                let api = widgets(&consumer, "default");
                let mut changes = vec![1usize; names.len()];
                let mut round = 0i64;
                while !stop.load(Ordering::SeqCst) {
                    round += 1;
                    for (i, name) in names.iter().enumerate() {
                        let patch = serde_json::json!({ "spec": { "size": round } });
                        api.patch(
                            name,
                            &kube::api::PatchParams::default(),
                            &kube::api::Patch::Merge(&patch),
                        )
                        .await
                        .unwrap();
                        changes[i] += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                (changes, round)
            })
        };
        Self {
            names: names.to_vec(),
            stop,
            task,
        }
    }

    /// Stops the churn, then waits until every Widget's last size is on the provider and its
    /// status came down (nothing lost); returns the changes made to each and the last size.
    async fn stop_and_converge(self, consumer: &Client, provider: &Client) -> (Vec<usize>, i64) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let (changes, last) = self.task.await.unwrap();
        for name in &self.names {
            wait_for(&format!("{name} at size {last} upstream"), 60, || async {
                let copy = widgets(provider, "default")
                    .get(name)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok((copy.data["spec"]["size"] == last).then_some(()))
            })
            .await;
            wait_status_down(&widgets(consumer, "default"), name, last).await;
        }
        (changes, last)
    }
}

/// A test's clusters: the provider serving Widgets (with its stand-in controller) and the
/// consumer with a node.
struct NodeSetup {
    env: TestEnv,
    consumer: Client,
    provider: Client,
    _controller: tokio::task::JoinHandle<()>,
}

impl NodeSetup {
    async fn start(test: &str) -> Self {
        Self::start_with(test, false).await
    }

    /// [`NodeSetup::start`]; with `previous`, the node also holds the previous version's images.
    async fn start_with(test: &str, previous: bool) -> Self {
        let env = TestEnv::start_on_node_with(test, previous).await.unwrap();
        let consumer = env.cluster("consumer").admin_client().await.unwrap();
        let provider = env.cluster("provider").admin_client().await.unwrap();
        install_crd(&provider, &widget_crd()).await.unwrap();
        let controller = run_provider_widget_controller(provider.clone());
        Self {
            env,
            consumer,
            provider,
            _controller: controller,
        }
    }

    fn consumer_cluster(&self) -> &Cluster {
        self.env.cluster("consumer")
    }

    /// `helm upgrade --install` with `extra` values, then waits until both Deployments are
    /// Available; returns their pods (schema managers first).
    async fn install_available(&self, extra: &[&str]) -> Vec<Pod> {
        install(self.consumer_cluster(), extra);
        let mut pods = wait_available(&self.consumer, "kbind-schema-manager", 180).await;
        pods.extend(wait_available(&self.consumer, "kbind-syncer", 180).await);
        pods
    }

    /// Applies the Secret (the provider as pods reach it), Connection and ClusterBinding, and
    /// waits until the Connection is Ready and the Widget CRD served on the consumer.
    async fn connect(&self) {
        let kubeconfig = self.env.provider_kubeconfig_for_pods().unwrap();
        apply_manifest(
            &self.consumer,
            &chart::one_file_in_release_namespace(&kubeconfig),
        )
        .await
        .unwrap();
        wait_connection(&self.consumer, "provider", "Ready=True").await;
        kbind_e2e::kbind::wait_established(&Api::all(self.consumer.clone()), "widgets.example.org")
            .await
            .unwrap();
        kbind_e2e::cluster::ensure_namespace(&self.consumer, "default")
            .await
            .unwrap();
    }

    /// The Widget writes (not status) each side's API server has answered so far, by name.
    fn widget_writes(&self, cluster: &str) -> BTreeMap<String, usize> {
        let mut writes = BTreeMap::new();
        for a in self.env.cluster(cluster).audited() {
            if a.resource == "widgets"
                && a.subresource.is_empty()
                && matches!(a.verb.as_str(), "create" | "update" | "patch" | "delete")
                && a.code < 300
            {
                *writes.entry(a.name).or_default() += 1;
            }
        }
        writes
    }
}

#[tokio::test]
async fn the_chart_installs_on_a_node_its_probes_pass_and_an_object_syncs_both_ways() {
    let setup = NodeSetup::start("chart_on_node").await;
    let (consumer, provider) = (&setup.consumer, &setup.provider);
    let pods = setup.install_available(&[]).await;
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

    setup.connect().await;
    create_widget_and_wait_upstream(consumer, provider, "default", "first", 3).await;
    wait_status_down(&widgets(consumer, "default"), "first", 3).await;

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

#[tokio::test]
async fn helm_uninstall_keeps_crds_and_objects_and_a_reinstall_resumes_without_object_writes() {
    let setup = NodeSetup::start("chart_uninstall").await;
    let (consumer, provider) = (&setup.consumer, &setup.provider);
    setup.install_available(&[]).await;
    setup.connect().await;
    let names = ["one", "two", "three"];
    for (size, name) in names.iter().enumerate() {
        create_widget_and_wait_upstream(consumer, provider, "default", name, size as i64).await;
    }
    for (size, name) in names.iter().enumerate() {
        wait_status_down(&widgets(consumer, "default"), name, size as i64).await;
    }

    helm(
        setup.consumer_cluster(),
        &["uninstall", RELEASE, "-n", KBIND_NAMESPACE, "--wait"],
    );
    wait_for("kbind's pods gone", 120, || async {
        let left = component_pods(consumer, "schema-manager").await.len()
            + component_pods(consumer, "syncer").await.len();
        Ok((left == 0).then_some(()))
    })
    .await;
    // Kept: the core CRDs (resource-policy keep), the pulled CRD, the user's objects on both
    // sides, and the Connection and binding.
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(consumer.clone());
    for crd in [
        "connections.core.kbind.io",
        "clusterbindings.core.kbind.io",
        "bindings.core.kbind.io",
        "widgets.example.org",
    ] {
        assert!(crds.get_opt(crd).await.unwrap().is_some(), "{crd} kept");
    }
    assert!(
        Api::<kbind_shared::api::Connection>::all(consumer.clone())
            .get_opt("provider")
            .await
            .unwrap()
            .is_some()
    );
    for name in names {
        assert!(
            widgets(consumer, "default")
                .get_opt(name)
                .await
                .unwrap()
                .is_some()
        );
        assert!(
            widgets(provider, "default")
                .get_opt(name)
                .await
                .unwrap()
                .is_some()
        );
    }
    let before = (
        setup.widget_writes("consumer"),
        setup.widget_writes("provider"),
    );

    setup.install_available(&[]).await;
    // Sync resumed (a new object goes up and its status comes down)…
    create_widget_and_wait_upstream(consumer, provider, "default", "after", 7).await;
    wait_status_down(&widgets(consumer, "default"), "after", 7).await;
    // …and the objects it had synced before were not written again, on either side.
    let after = (
        setup.widget_writes("consumer"),
        setup.widget_writes("provider"),
    );
    for name in names {
        assert_eq!(
            (before.0.get(name), before.1.get(name)),
            (after.0.get(name), after.1.get(name)),
            "{name}: writes (consumer, provider) before and after the reinstall"
        );
    }
}

#[tokio::test]
async fn a_deleted_leader_pod_hands_over_within_the_lease_and_a_deleted_syncer_pod_loses_nothing() {
    use k8s_openapi::api::coordination::v1::Lease;
    let setup = NodeSetup::start("chart_pod_deletion").await;
    let (consumer, provider) = (&setup.consumer, &setup.provider);
    setup.install_available(&[]).await;
    setup.connect().await;
    create_widget_and_wait_upstream(consumer, provider, "default", "before", 1).await;

    let leases: Api<Lease> = Api::namespaced(consumer.clone(), KBIND_NAMESPACE);
    let holder = |lease: &Lease| {
        lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .unwrap_or_default()
    };
    let lease = leases.get("kbind-schema-manager").await.unwrap();
    let leader = holder(&lease);
    let duration = lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_duration_seconds)
        .expect("the leader Lease has a duration");
    let pods: Api<Pod> = Api::namespaced(consumer.clone(), KBIND_NAMESPACE);
    assert!(
        pods.get_opt(&leader).await.unwrap().is_some(),
        "the holder {leader} is a pod"
    );
    let deleted = std::time::Instant::now();
    pods.delete(&leader, &Default::default()).await.unwrap();
    let standby = wait_for("a standby leads", duration as u64 + 5, || async {
        let current = holder(
            &leases
                .get("kbind-schema-manager")
                .await
                .map_err(|e| e.to_string())?,
        );
        Ok((!current.is_empty() && current != leader).then_some(current))
    })
    .await;
    let handover = deleted.elapsed();
    assert!(
        handover.as_secs() <= duration as u64,
        "{standby} leads {handover:?} after {leader} was deleted; the lease lasts {duration}s"
    );
    // The new leader works: a new object syncs, and its status comes down.
    create_widget_and_wait_upstream(consumer, provider, "default", "after-leader", 2).await;
    wait_status_down(&widgets(consumer, "default"), "after-leader", 2).await;

    // A syncer pod goes while objects are created; every object arrives anyway.
    let victim = component_pods(consumer, "syncer").await[0].name_any();
    pods.delete(&victim, &Default::default()).await.unwrap();
    let names: Vec<String> = (0..10).map(|i| format!("churn-{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        widgets(consumer, "default")
            .create(&Default::default(), &widget(name, i as i64))
            .await
            .unwrap();
    }
    wait_available(consumer, "kbind-syncer", 180).await;
    for (i, name) in names.iter().enumerate() {
        wait_status_down(&widgets(consumer, "default"), name, i as i64).await;
    }
    let writes = setup.widget_writes("provider");
    for name in &names {
        assert_eq!(
            writes.get(name),
            Some(&1),
            "{name}: one provider write, {writes:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syncer_replicas_scale_one_three_one_under_churn_without_loss_or_double_writes() {
    let setup = NodeSetup::start("chart_scale").await;
    let (consumer, provider) = (&setup.consumer, &setup.provider);
    setup.install_available(&["syncer.replicas=1"]).await;
    setup.connect().await;

    // Churn: 20 Widgets, each resized over and over while the syncer Deployment scales.
    let names: Vec<String> = (0..20).map(|i| format!("churn-{i}")).collect();
    for name in &names {
        widgets(consumer, "default")
            .create(&Default::default(), &widget(name, 0))
            .await
            .unwrap();
    }
    let churn = Churn::start(consumer, &names);
    tokio::time::sleep(Duration::from_secs(3)).await;
    for replicas in [3, 1] {
        let value = format!("syncer.replicas={replicas}");
        let cluster = setup.consumer_cluster();
        install(cluster, &[value.as_str()]);
        let pods = wait_available(consumer, "kbind-syncer", 180).await;
        assert_eq!(pods.len(), replicas);
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    // Nothing lost: every copy has the last size and its status came down…
    let (changes, last) = churn.stop_and_converge(consumer, provider).await;
    assert!(
        last >= 5,
        "the churn ran through both scalings ({last} rounds)"
    );
    // …and no change was delivered twice (two replicas writing one object would be): at most one
    // provider write per change made on the consumer.
    let writes = setup.widget_writes("provider");
    for (name, made) in names.iter().zip(&changes) {
        let written = writes.get(name).copied().unwrap_or_default();
        assert!(
            (1..=*made).contains(&written),
            "{name}: {written} provider writes for {made} changes"
        );
    }
}

/// Each pod of a chart component by name: its UID and its containers' restart counts.
async fn pod_identities(client: &Client, component: &str) -> BTreeMap<String, (String, i32)> {
    component_pods(client, component)
        .await
        .into_iter()
        .map(|p| {
            let restarts = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map(|c| c.iter().map(|c| c.restart_count).sum())
                .unwrap_or_default();
            (p.name_any(), (p.uid().unwrap_or_default(), restarts))
        })
        .collect()
}

/// The image every running container of `pods` reports (the kubelet's view, not the spec's).
fn running_images(pods: &[Pod]) -> Vec<String> {
    pods.iter()
        .flat_map(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.clone())
                .unwrap_or_default()
        })
        .map(|c| c.image)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_component_upgrades_alone_to_the_previous_version_and_back_while_objects_churn() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;
    let setup = NodeSetup::start_with("chart_upgrade", true).await;
    let (consumer, provider) = (&setup.consumer, &setup.provider);
    setup.install_available(&[]).await;
    setup.connect().await;

    // Churn: 10 Widgets, each resized round after round for the whole test.
    let names: Vec<String> = (0..10).map(|i| format!("churn-{i}")).collect();
    for name in &names {
        create_widget_and_wait_upstream(consumer, provider, "default", name, 0).await;
    }
    let churn = Churn::start(consumer, &names);
    let stop = Arc::new(AtomicBool::new(false));
    // What the provider saw: the longest time its copy of the first Widget went without a new
    // size while the churn ran — how long sync stopped. Read every 200 ms.
    let watcher = {
        let (provider, stop) = (provider.clone(), stop.clone());
        tokio::spawn(async move {
            let api = widgets(&provider, "default");
            let (mut last, mut changed, mut longest) = (None, Instant::now(), Duration::ZERO);
            while !stop.load(Ordering::SeqCst) {
                if let Ok(copy) = api.get("churn-0").await {
                    let size = copy.data["spec"]["size"].as_i64();
                    if size != last {
                        longest = longest.max(changed.elapsed());
                        (last, changed) = (size, Instant::now());
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            longest.max(changed.elapsed())
        })
    };

    let cluster = setup.consumer_cluster();
    for (component, key, deployment, other, program) in [
        (
            "syncer",
            "syncer",
            "kbind-syncer",
            "schema-manager",
            "kbind-syncer",
        ),
        (
            "schema-manager",
            "schemaManager",
            "kbind-schema-manager",
            "syncer",
            "kbind-schema-manager",
        ),
    ] {
        let previous = kbind_e2e::images::previous_reference(program).unwrap();
        let current = kbind_e2e::images::reference(program).unwrap();
        for reference in [&previous, &current] {
            let others = pod_identities(consumer, other).await;
            let tag = format!("{key}.image.tag={}", reference.rsplit_once(':').unwrap().1);
            install(cluster, &[tag.as_str()]);
            let pods = wait_available(consumer, deployment, 240).await;
            let images = running_images(&pods);
            assert!(
                !images.is_empty() && images.iter().all(|i| i == reference),
                "{component}: every pod runs {reference}: {images:?}"
            );
            assert_eq!(
                pod_identities(consumer, other).await,
                others,
                "upgrading the {component} to {reference}: the {other} pods (UIDs, restarts) untouched"
            );
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
    }
    stop.store(true, Ordering::SeqCst);
    let longest = watcher.await.unwrap();
    // Nothing lost: every copy has the last size, and its status came down.
    churn.stop_and_converge(consumer, provider).await;

    // Sync never stopped for longer than a handover: a syncer releases its membership Lease on
    // the way out (its units move at once), and the syncers keep syncing while the schema
    // managers roll; the bound is the membership Lease's duration (the chart's default).
    let membership = Duration::from_secs(15);
    println!("the longest time the provider's copy went unchanged: {longest:?}");
    assert!(
        longest <= membership,
        "sync stopped for {longest:?}; a handover takes at most {membership:?}"
    );
}

/// One number from a cgroup v1 file: the whole file, or the value of `key` in a `key value` file.
fn cgroup_value(dir: &std::path::Path, file: &str, key: Option<&str>) -> i64 {
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let value = match key {
        None => Some(text.trim()),
        Some(key) => text.lines().find_map(|l| {
            l.split_once(' ')
                .filter(|(k, _)| *k == key)
                .map(|(_, v)| v.trim())
        }),
    };
    value
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{}: no number {key:?} in {text}", path.display()))
}

/// The chart's measured costs of a component (`sizing.<key>` in its values): base MiB, KiB per
/// object, KiB per bound API.
fn sizing_costs(key: &str) -> (u64, u64, u64) {
    let values: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart_dir().join("values.yaml")).unwrap())
            .unwrap();
    let cost = &values["sizing"][key];
    let number = |field: &str| {
        cost[field]
            .as_u64()
            .unwrap_or_else(|| panic!("sizing.{key}.{field} in the chart's values"))
    };
    (
        number("baseMiB"),
        number("perObjectKiB"),
        number("perApiKiB"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_resources_hold_a_bulk_of_two_thousand_objects() {
    use futures::{StreamExt, TryStreamExt};
    const OBJECTS: usize = 2000;
    let setup = NodeSetup::start("chart_resources").await;
    let (consumer, provider) = (&setup.consumer, &setup.provider);
    setup.install_available(&[]).await;
    setup.connect().await;

    let api = widgets(consumer, "default");
    futures::stream::iter(0..OBJECTS)
        .map(|i| {
            let api = api.clone();
            async move {
                api.create(&Default::default(), &widget(&format!("bulk-{i}"), i as i64))
                    .await
                    .map(drop)
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await
        .unwrap();
    wait_for(
        &format!("{OBJECTS} Widgets on the provider"),
        600,
        || async {
            let copies = widgets(provider, "default")
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            Ok((copies.items.len() == OBJECTS).then_some(()))
        },
    )
    .await;
    wait_for(&format!("{OBJECTS} statuses down"), 300, || async {
        let objects = api
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let down = objects
            .items
            .iter()
            .filter(|w| w.data["status"]["observedSize"] == w.data["spec"]["size"])
            .count();
        Ok((down == OBJECTS).then_some(()))
    })
    .await;

    // What the kernel saw of each pod, against the chart's resources and the documented Sizing
    // (the chart's `sizing` costs: base + objects × per object + APIs × per API, the objects of
    // the one bound API all in one unit, so any syncer may hold all of them).
    let node = setup.env.node().expect("the consumer has a node");
    let mut report = Vec::new();
    for (component, key) in [("schema-manager", "schemaManager"), ("syncer", "syncer")] {
        let (base, per_object, per_api) = sizing_costs(key);
        let predicted = (base << 20) + ((OBJECTS as u64 * per_object + per_api) << 10);
        for pod in component_pods(consumer, component).await {
            let name = pod.name_any();
            let status = pod.status.clone().unwrap_or_default();
            for container in status.container_statuses.unwrap_or_default() {
                assert_eq!(container.restart_count, 0, "{name}: no restarts");
                assert!(
                    container
                        .last_state
                        .as_ref()
                        .and_then(|s| s.terminated.as_ref())
                        .is_none(),
                    "{name}: never terminated (an OOM kill would be): {:?}",
                    container.last_state
                );
            }
            let limit = pod.spec.as_ref().unwrap().containers[0]
                .resources
                .as_ref()
                .and_then(|r| r.limits.as_ref())
                .and_then(|l| l.get("memory"))
                .map(|q| q.0.clone())
                .unwrap_or_default();
            let uid = pod.uid().unwrap();
            let memory = node.pod_cgroup("memory", &uid).unwrap();
            let cpu = node.pod_cgroup("cpu", &uid).unwrap();
            let cpuacct = node.pod_cgroup("cpuacct", &uid).unwrap();
            let usage = cgroup_value(&memory, "memory.usage_in_bytes", None);
            let inactive = cgroup_value(&memory, "memory.stat", Some("total_inactive_file"));
            let working_set = (usage - inactive).max(0) as u64;
            let peak = cgroup_value(&memory, "memory.max_usage_in_bytes", None);
            let failcnt = cgroup_value(&memory, "memory.failcnt", None);
            let quota = cgroup_value(&cpu, "cpu.cfs_quota_us", None);
            let throttled = cgroup_value(&cpu, "cpu.stat", Some("nr_throttled"));
            let cpu_ms = cgroup_value(&cpuacct, "cpuacct.usage", None) / 1_000_000;
            report.push(format!(
                "{name}: working set {:.1} MiB (Sizing predicts ≤ {:.1} MiB), peak {:.1} MiB, \
                 limit {limit}, limit hits {failcnt}, CPU {cpu_ms} ms, quota {quota}, throttled {throttled}",
                working_set as f64 / 1048576.0,
                predicted as f64 / 1048576.0,
                peak as f64 / 1048576.0,
            ));
            assert_eq!(failcnt, 0, "{name}: never at its memory limit {limit}");
            assert!(
                working_set <= predicted,
                "{name}: a working set of {working_set} B, more than Sizing predicts ({predicted} B)"
            );
            // The chart sets a CPU request and no limit (docs/operations.md, "Sizing"): no quota, so nothing
            // may be throttled.
            assert_eq!(quota, -1, "{name}: no CPU limit");
            assert_eq!(throttled, 0, "{name}: never throttled");
        }
    }
    println!("{}", report.join("\n"));
}

/// How many times the containers of `pods` restarted.
fn restarts(pods: &[Pod]) -> i32 {
    pods.iter()
        .flat_map(|p| {
            p.status
                .iter()
                .flat_map(|s| s.container_statuses.iter().flatten())
        })
        .map(|c| c.restart_count)
        .sum()
}

/// Installs the provider-side chart `program` (release and Deployment of that name) with its
/// built image and `values`, and waits until its one pod is available.
async fn install_provider_chart(setup: &NodeSetup, program: &str, values: &[&str]) -> Vec<Pod> {
    let reference = kbind_e2e::images::reference(program).unwrap();
    let (repository, tag) = reference.rsplit_once(':').unwrap();
    let chart = chart_dir().with_file_name(program).display().to_string();
    let mut sets = vec![
        format!("image.repository={repository}"),
        format!("image.tag={tag}"),
        "image.pullPolicy=Never".to_owned(),
        "logFormat=json".to_owned(),
    ];
    sets.extend(values.iter().map(|v| (*v).to_owned()));
    let mut args = vec![
        "upgrade",
        "--install",
        program,
        &chart,
        "-n",
        KBIND_NAMESPACE,
        "--create-namespace",
    ];
    for set in &sets {
        args.extend(["--set", set.as_str()]);
    }
    helm(setup.consumer_cluster(), &args);
    let pods = wait_available(&setup.consumer, program, 180).await;
    assert_eq!(pods.len(), 1, "{program}: one pod");
    pods
}

/// The provider side's charts on one node: the reaper's pod sweeps and the issuer's keeps the
/// catalog true, each with its chart's RBAC and in-cluster config; the gateway's two pods start
/// with their TLS Secret and become ready. The node's cluster plays a
/// provider here (they only need Leases, CRDs and their own kinds).
#[tokio::test]
async fn the_provider_side_charts_run_on_a_node_the_reaper_sweeps_and_the_issuer_keeps_the_catalog()
{
    use kbind_shared::api::reaper::ReaperPolicy;
    use kbind_shared::keys;
    let setup = NodeSetup::start("reaper_on_node").await;
    let client = &setup.consumer;
    install_crd(client, &widget_crd()).await.unwrap();
    kbind_e2e::cluster::ensure_namespace(client, "kbind")
        .await
        .unwrap();
    // A consumer's heartbeat, as kbind writes it.
    let lease = serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": { "name": "provider-consumer-x", "labels": { keys::MANAGED_LABEL: keys::TRUE },
            "annotations": { keys::CONSUMER_CLUSTER_UID_ANNOTATION: "consumer-x",
                             keys::CONNECTION_ANNOTATION: "provider" } },
        "spec": { "holderIdentity": "consumer-x", "leaseDurationSeconds": 60,
                  "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(jiff::Timestamp::now()) },
    });
    Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), "kbind")
        .patch(
            "provider-consumer-x",
            &kube::api::PatchParams::apply("kbind-schema-manager").force(),
            &kube::api::Patch::Apply(&lease),
        )
        .await
        .unwrap();
    let pods = install_provider_chart(
        &setup,
        "kbind-reaper",
        &[
            "apis[0].group=example.org",
            "apis[0].resources[0]=widgets",
            "sweepInterval=2s",
        ],
    )
    .await;
    // Its pod swept the policy the chart created: Ready, the consumer Live by its Lease.
    let policies: Api<ReaperPolicy> = Api::all(client.clone());
    wait_for("the reaper pod's sweep", 120, || async {
        let policy = policies.get("default").await.map_err(|e| e.to_string())?;
        let status = policy.status.ok_or("no status yet")?;
        let ready = kbind_shared::conditions::is_true(&status.conditions, "Ready");
        let live = status
            .consumers
            .iter()
            .any(|c| c.uid == "consumer-x" && c.state == "Live");
        Ok((ready && live && status.last_sweep.is_some()).then_some(()))
    })
    .await;
    assert_eq!(restarts(&pods), 0, "the reaper pod never restarted");

    // The issuer: an Export of the exported Widgets is judged Offered by its pod.
    // With its gateway (#52): two replicas of the built image serving TLS from a Secret, ready
    // once their ServiceAccount has read the catalog.
    use kbind_shared::api::catalog::{Export, OFFERED};
    let certified = rcgen::generate_simple_self_signed(vec![format!(
        "kbind-issuer-gateway.{KBIND_NAMESPACE}.svc"
    )])
    .unwrap();
    kbind_e2e::cluster::ensure_namespace(client, KBIND_NAMESPACE)
        .await
        .unwrap();
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), KBIND_NAMESPACE)
        .create(
            &Default::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": { "name": "gateway-tls" },
                "type": "kubernetes.io/tls",
                "stringData": { "tls.crt": certified.cert.pem(), "tls.key": certified.signing_key.serialize_pem() },
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let gateway_image = kbind_e2e::images::reference("kbind-gateway").unwrap();
    let (gateway_repository, gateway_tag) = gateway_image.rsplit_once(':').unwrap();
    let gateway_values = [
        "gateway.enabled=true".to_owned(),
        "gateway.providerServer=https://provider.example:6443".to_owned(),
        "gateway.tlsSecretName=gateway-tls".to_owned(),
        format!("gateway.image.repository={gateway_repository}"),
        format!("gateway.image.tag={gateway_tag}"),
    ];
    let gateway_values: Vec<&str> = gateway_values.iter().map(String::as_str).collect();
    let pods = install_provider_chart(&setup, "kbind-issuer", &gateway_values).await;
    let gateways = chart::wait_available_pods(
        &setup.consumer,
        "kbind-issuer-gateway",
        "gateway",
        Duration::from_secs(180),
    )
    .await
    .unwrap();
    assert_eq!(gateways.len(), 2, "the gateway's two replicas");
    let exports: Api<Export> = Api::all(client.clone());
    exports
        .patch(
            "widgets",
            &kube::api::PatchParams::apply("platform-team"),
            &kube::api::Patch::Apply(serde_json::json!({
                "apiVersion": "catalog.kbind.io/v1alpha1", "kind": "Export",
                "metadata": { "name": "widgets" },
                "spec": { "title": "Widgets", "apis": [{ "name": "widgets.example.org" }] },
            })),
        )
        .await
        .unwrap();
    wait_for("the issuer pod's verdict on the Export", 120, || async {
        let export = exports.get("widgets").await.map_err(|e| e.to_string())?;
        let offered = export
            .status
            .as_ref()
            .is_some_and(|s| kbind_shared::conditions::is_true(&s.conditions, OFFERED));
        Ok(offered.then_some(()))
    })
    .await;
    assert_eq!(restarts(&pods), 0, "the issuer pod never restarted");
    assert_eq!(restarts(&gateways), 0, "the gateway pods never restarted");
}
