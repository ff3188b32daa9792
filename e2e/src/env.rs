//! [`TestEnv`]: the clusters of one test and kbind's processes running against them.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::cluster::Cluster;
use crate::controlplane;
use crate::node::{NODE_IP, Node};
use crate::process::ChildProcess;

/// The environment of one test. Dropping it stops kbind's processes, then the clusters; the
/// directory with every log is removed after a passing test and kept (and printed) after a failing
/// one — its logs, not its etcd data — or kept whole with `KBIND_E2E_KEEP=1`.
pub struct TestEnv {
    dir: PathBuf,
    keep: bool,
    // The node and its pods go first of all (see [`TestEnv::start_on_node`]).
    node: Option<Node>,
    // kbind's processes go first so that they never see their clusters vanish under them.
    processes: Vec<ChildProcess>,
    // Image containers the processes ran in: removed once the processes are gone.
    containers: Vec<crate::images::Container>,
    clusters: Vec<Cluster>,
}

/// Removes the etcd data directories (`<cluster>/etcd/`) under a run's directory, keeping
/// every log beside them.
fn remove_etcd_data(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if !path.is_dir() {
            continue;
        }
        if path.file_name().is_some_and(|n| n == "etcd") && path.join("member").is_dir() {
            let _ = std::fs::remove_dir_all(&path);
        } else {
            remove_etcd_data(&path);
        }
    }
}

/// Where test environments keep their files: `target/e2e-runs/`.
pub fn runs_dir() -> PathBuf {
    let mut dir = controlplane::kbind_bin_dir();
    dir.pop();
    dir.join("e2e-runs")
}

impl TestEnv {
    /// Starts one independent cluster per name, all at once.
    pub async fn start(test: &str, cluster_names: &[&str]) -> Result<Self, String> {
        Self::start_flagged(test, cluster_names, &[]).await
    }

    /// [`TestEnv::start`], with more `kube-apiserver` flags for the named clusters (e.g. a
    /// feature gate turned off, to be an older or a different kind of server).
    pub async fn start_flagged(
        test: &str,
        cluster_names: &[&str],
        apiserver_flags: &[(&str, &[&str])],
    ) -> Result<Self, String> {
        let binaries = tokio::task::spawn_blocking(controlplane::binaries)
            .await
            .map_err(|e| e.to_string())??;
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        let dir = runs_dir().join(format!("{test}-{}-{stamp}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut env = Self {
            dir,
            keep: false,
            node: None,
            processes: Vec::new(),
            containers: Vec::new(),
            clusters: Vec::new(),
        };
        let starts = cluster_names.iter().map(|name| {
            let env_dir = env.dir.clone();
            let binaries = binaries.clone();
            let flags: Vec<String> = apiserver_flags
                .iter()
                .filter(|(cluster, _)| cluster == name)
                .flat_map(|(_, flags)| flags.iter().map(|f| (*f).to_owned()))
                .collect();
            async move {
                // A start that fails (say, a port another program took first) is retried once,
                // with fresh ports and a fresh directory; both failures are reported.
                let mut failures = Vec::new();
                for attempt in 1..=2 {
                    let dir = match attempt {
                        1 => env_dir.join(name),
                        n => env_dir.join(format!("{name}-attempt{n}")),
                    };
                    match Cluster::start(name, &dir, &binaries, &flags).await {
                        Ok(cluster) => return Ok(cluster),
                        Err(e) => {
                            eprintln!(
                                "kbind e2e: cluster {name} failed to start (attempt {attempt}): {e}"
                            );
                            failures.push(format!("attempt {attempt}: {e}"));
                        }
                    }
                }
                Err(failures.join("\n"))
            }
        });
        for result in futures::future::join_all(starts).await {
            match result {
                Ok(cluster) => env.clusters.push(cluster),
                Err(e) => {
                    env.keep_logs();
                    return Err(e);
                }
            }
        }
        Ok(env)
    }

    /// Starts one more cluster, `name`, that a client cannot tell from the cluster `like` by its
    /// address's certificate or the admin's token ([`Cluster::start_like`]).
    pub async fn start_twin(&mut self, name: &str, like: &str) -> Result<(), String> {
        let binaries = tokio::task::spawn_blocking(controlplane::binaries)
            .await
            .map_err(|e| e.to_string())??;
        let dir = self.dir.join(name);
        let started =
            Cluster::start_like(name, &dir, &binaries, &[], Some(self.cluster(like))).await;
        match started {
            Ok(cluster) => {
                self.clusters.push(cluster);
                Ok(())
            }
            Err(e) => {
                self.keep_logs();
                Err(e)
            }
        }
    }

    /// Two clusters, `provider` as in [`TestEnv::start`] and `consumer` with a real node
    /// ([`Node`]): its control plane runs in the node's network namespace, its kubelet runs pods
    /// with containerd and runc, and kbind's images (`scripts/images`) are loaded into its
    /// containerd. Pods reach the provider at [`TestEnv::provider_server_for_pods`].
    pub async fn start_on_node(test: &str) -> Result<Self, String> {
        Self::start_on_node_with(test, false).await
    }

    /// [`TestEnv::start_on_node`]; with `previous`, the node also holds the previous version's
    /// images ([`crate::images::previous`]).
    pub async fn start_on_node_with(test: &str, previous: bool) -> Result<Self, String> {
        // The provider's serving certificate also names the node's address, where pods reach it.
        let advertise = format!("--advertise-address={NODE_IP}");
        let mut env =
            Self::start_flagged(test, &["provider"], &[("provider", &[advertise.as_str()])])
                .await?;
        let binaries = tokio::task::spawn_blocking(controlplane::binaries)
            .await
            .map_err(|e| e.to_string())??;
        let images = tokio::task::spawn_blocking(move || {
            let mut archives = crate::images::archives()?;
            if previous {
                archives.extend(crate::images::previous_archives()?);
            }
            Ok::<_, String>(archives)
        })
        .await
        .map_err(|e| e.to_string())??;
        let provider_port = env.provider_port()?;
        let dir = env.dir.clone();
        let started = async {
            let mut node = Node::create(&dir.join("node")).await?;
            let consumer =
                Cluster::start_on_node("consumer", &dir.join("consumer"), &binaries, node.net())
                    .await?;
            node.join(&consumer, &binaries, &images).await?;
            node.forward_out(provider_port).await?;
            Ok::<_, String>((node, consumer))
        }
        .await;
        match started {
            Ok((node, consumer)) => {
                env.node = Some(node);
                env.clusters.push(consumer);
                Ok(env)
            }
            Err(e) => {
                env.keep_logs();
                Err(e)
            }
        }
    }

    fn provider_port(&self) -> Result<u16, String> {
        let server = self.cluster("provider").server();
        server
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| format!("no port in {server}"))
    }

    /// The provider's API server as pods on the node reach it ([`TestEnv::start_on_node`]).
    pub fn provider_server_for_pods(&self) -> Result<String, String> {
        Ok(format!("https://{NODE_IP}:{}", self.provider_port()?))
    }

    /// A kubeconfig for the provider's API server as pods on the node reach it, with its admin
    /// token (what a Connection's Secret holds when kbind runs as pods).
    pub fn provider_kubeconfig_for_pods(&self) -> Result<String, String> {
        let provider = self.cluster("provider");
        Ok(crate::cluster::kubeconfig_yaml(
            "provider",
            &self.provider_server_for_pods()?,
            provider.ca_pem(),
            provider.admin_token(),
            None,
        ))
    }

    /// The consumer's node, when it has one ([`TestEnv::start_on_node`]).
    pub fn node(&self) -> Option<&Node> {
        self.node.as_ref()
    }

    /// The directory of this test's files and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cluster with this name.
    pub fn cluster(&self, name: &str) -> &Cluster {
        self.clusters
            .iter()
            .find(|c| c.name() == name)
            .unwrap_or_else(|| panic!("no cluster named {name} in this TestEnv"))
    }

    /// Starts one of kbind's programs (`kbind-schema-manager`, `kbind-syncer`, …), logging to
    /// `<dir>/<name>.log`. It is stopped with the environment. Returns its index for
    /// [`TestEnv::process`].
    pub fn start_kbind(
        &mut self,
        program: &str,
        name: &str,
        args: &[String],
        envs: &[(&str, &str)],
    ) -> Result<usize, String> {
        let binary = controlplane::kbind_bin(program)?;
        self.start_process(name, &binary, args, envs, false)
    }

    /// Starts any program as one of this environment's processes, logging to `<dir>/<name>.log`;
    /// `group`: in a process group of its own, all of which is killed (see
    /// [`ChildProcess::start_with`]). Returns its index for [`TestEnv::process`].
    pub fn start_process(
        &mut self,
        name: &str,
        program: &Path,
        args: &[String],
        envs: &[(&str, &str)],
        group: bool,
    ) -> Result<usize, String> {
        let log = self.dir.join(format!("{name}.log"));
        let process = ChildProcess::start_with(name, program, args, envs, &log, group)?;
        self.processes.push(process);
        Ok(self.processes.len() - 1)
    }

    /// Keeps `container` until this environment's processes have stopped, then removes it.
    pub fn hold_container(&mut self, container: crate::images::Container) {
        self.containers.push(container);
    }

    /// A process started with [`TestEnv::start_kbind`].
    pub fn process(&mut self, index: usize) -> &mut ChildProcess {
        &mut self.processes[index]
    }

    /// Keeps the directory (logs, kubeconfigs) when the environment stops.
    pub fn keep_files(&mut self) {
        self.keep = true;
    }

    /// A process started with [`TestEnv::start_kbind`], read-only.
    pub fn process_ref(&self, index: usize) -> &ChildProcess {
        &self.processes[index]
    }

    fn keep_logs(&self) {
        eprintln!(
            "kbind e2e: logs of this run are kept in {}",
            self.dir.display()
        );
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        self.node = None;
        self.processes.clear();
        self.containers.clear();
        self.clusters.clear();
        let asked = self.keep || std::env::var_os("KBIND_E2E_KEEP").is_some_and(|v| v == "1");
        if asked {
            self.keep_logs();
        } else if std::thread::panicking() {
            // A failed test keeps its logs, not its clusters' databases (~125 MB of etcd
            // write-ahead log each, which fill a CI machine's disk when several tests fail).
            remove_etcd_data(&self.dir);
            self.keep_logs();
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
