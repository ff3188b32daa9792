//! A real kubelet node for the consumer cluster: containerd with runc runs the chart's pods from
//! kbind's images, a kubelet registers the node, kube-proxy routes the `kubernetes` Service — all
//! inside namespaces the test creates and tears down with it:
//!
//! - a **PID namespace**: every process of the node (containerd, its shims, the pods' containers)
//!   is in it; killing its first process ends them all, also when the test process dies.
//! - a **mount namespace** with shared propagation (the kubelet's volume mounts must reach the
//!   containers), a private `tmpfs` over `/run`, and the node's own directories over `/var/lib`
//!   and `/var/log` (the pods' logs, kept with a failed test's), so that nothing the node writes
//!   to its fixed paths lands on the machine; the machine's `/` stays as it is.
//! - a **network namespace**: the CNI bridge (`10.244.0.0/24`) and the node's address
//!   ([`NODE_IP`], on its loopback device) exist only there. The consumer's control plane runs in
//!   it too (see [`crate::cluster::Cluster::start_on_node`]); the test reaches it through a
//!   forward from the machine's loopback, and pods reach the provider through a forward out.
//! - a **cgroup** of its own in each hierarchy (cgroup v1, `cgroupfs` driver), the kubelet's
//!   `cgroupRoot`, removed at the end.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as NodeObject;
use kube::Api;

use crate::cluster::{Cluster, free_port};
use crate::controlplane::Binaries;
pub use crate::netns::NODE_IP;
use crate::netns::{Forwarding, Netns, NodeNet};
use crate::process::ChildProcess;

/// The node's name.
pub const NODE_NAME: &str = "kbind-node";
/// The pods' network (the CNI bridge's range).
const POD_CIDR: &str = "10.244.0.0/24";
/// The pod sandbox image's reference in the node's containerd.
const PAUSE_IMAGE: &str = "localhost/kbind-e2e/pause:1";
/// containerd's state directory inside the node (its /run, a tmpfs of its own).
const CONTAINERD_STATE: &str = "/run/containerd";

/// A running node. Dropping it ends every process in it, its pods' included, and removes its
/// cgroups.
pub struct Node {
    dir: PathBuf,
    net: NodeNet,
    cgroup: String,
    forwards: Vec<Forwarding>,
    // Killed before the holder; those in the node's PID namespace end with it anyway.
    components: Vec<ChildProcess>,
    holder: ChildProcess,
}

/// The cgroup hierarchies of this machine (`/sys/fs/cgroup/<controller>`).
fn cgroup_hierarchies() -> Vec<PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.join("cgroup.procs").is_file())
                .collect()
        })
        .unwrap_or_default()
}

/// Removes a cgroup and every cgroup below it (deepest first); cgroups whose processes are still
/// exiting are retried for a few seconds.
fn remove_cgroup_tree(root: &Path) {
    fn dirs(root: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(entries) = std::fs::read_dir(root) {
            for entry in entries.filter_map(Result::ok) {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs(&entry.path(), out);
                }
            }
        }
        out.push(root.to_path_buf());
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut all = Vec::new();
        dirs(root, &mut all);
        let left = all
            .iter()
            .filter(|d| d.exists() && std::fs::remove_dir(d).is_err())
            .count();
        if left == 0 || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Node {
    /// Creates the node's namespaces and cgroups in `dir` (no component runs yet: start the
    /// consumer's control plane in it, then [`Node::join`]).
    pub async fn create(dir: &Path) -> Result<Self, String> {
        let io = |e: std::io::Error| format!("node: {e}");
        std::fs::create_dir_all(dir).map_err(io)?;
        let holder = ChildProcess::start(
            "node",
            Path::new("unshare"),
            &[
                "--pid",
                "--fork",
                "--kill-child",
                "--mount",
                "--net",
                "--propagation",
                "shared",
                "--mount-proc",
                "sleep",
                "infinity",
            ]
            .map(str::to_owned),
            &[],
            &dir.join("node.log"),
        )?;
        let unshare = holder.pid().ok_or("node: unshare has no pid")?;
        // The node's first process is unshare's child, once it runs `sleep` (its /proc mounted).
        let deadline = Instant::now() + Duration::from_secs(10);
        let pid = loop {
            let children =
                std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
                    .unwrap_or_default();
            let child = children
                .split_whitespace()
                .next()
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(child) = child
                && std::fs::read_to_string(format!("/proc/{child}/comm"))
                    .is_ok_and(|c| c.trim() == "sleep")
            {
                break child;
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "node: its namespaces were not ready within 10s:\n{}",
                    holder.log_tail(20)
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let netns = Netns::open(PathBuf::from(format!("/proc/{pid}/ns/net")))?;
        let cgroup = format!(
            "kbind-node-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        );
        let node = Self {
            dir: dir.to_path_buf(),
            net: NodeNet::new(pid, netns),
            cgroup,
            forwards: Vec::new(),
            components: Vec::new(),
            holder,
        };
        // The node's fixed paths, its own: /run a tmpfs; /var/lib and /var/log directories of the
        // node's (container logs stay readable after a failed test).
        for kept in ["var-lib", "var-log"] {
            std::fs::create_dir_all(dir.join(kept)).map_err(io)?;
        }
        node.net.run(&format!(
            "ip link set lo up\nip addr add {NODE_IP}/32 dev lo\n\
             mount -t tmpfs -o mode=755 kbind-node /run\n\
             mount --bind '{lib}' /var/lib\nmount --bind '{log}' /var/log",
            lib = dir.join("var-lib").display(),
            log = dir.join("var-log").display(),
        ))?;
        for hierarchy in cgroup_hierarchies() {
            std::fs::create_dir_all(hierarchy.join(&node.cgroup)).map_err(io)?;
        }
        Ok(node)
    }

    /// The cgroup of the pod with `uid` in the cgroup v1 hierarchy `controller` (`memory`, `cpu`,
    /// `cpuacct`): the kubelet's cgroupfs layout, `<node>/kubepods[/<QoS class>]/pod<uid>`.
    pub fn pod_cgroup(&self, controller: &str, uid: &str) -> Result<PathBuf, String> {
        let kubepods = Path::new("/sys/fs/cgroup")
            .join(controller)
            .join(&self.cgroup)
            .join("kubepods");
        ["", "burstable", "besteffort"]
            .iter()
            .map(|class| kubepods.join(class).join(format!("pod{uid}")))
            .find(|dir| dir.is_dir())
            .ok_or_else(|| {
                format!(
                    "no {controller} cgroup of pod {uid} under {}",
                    kubepods.display()
                )
            })
    }

    /// The node's namespaces.
    pub fn net(&self) -> &NodeNet {
        &self.net
    }

    /// Forwards `NODE_IP:<port>` inside the node to `127.0.0.1:<port>` on the machine (what pods
    /// use to reach a server outside the node, the provider's API server); returns that address
    /// as a URL authority.
    pub async fn forward_out(&mut self, port: u16) -> Result<String, String> {
        let at = format!("{NODE_IP}:{port}");
        let forwarding = self
            .net
            .netns()
            .forward_out(
                at.parse().map_err(|e| format!("{at}: {e}"))?,
                ([127, 0, 0, 1], port).into(),
            )
            .await?;
        self.forwards.push(forwarding);
        Ok(at)
    }

    fn start_component(
        &mut self,
        name: &str,
        (program, args): (PathBuf, Vec<String>),
    ) -> Result<(), String> {
        let log = self.dir.join(format!("{name}.log"));
        let process = ChildProcess::start(name, &program, &args, &[], &log)?;
        self.components.push(process);
        Ok(())
    }

    fn component(&mut self, name: &str) -> Option<&mut ChildProcess> {
        self.components.iter_mut().find(|p| p.name() == name)
    }

    /// Starts the node's components for `cluster` (which runs in the node's network namespace):
    /// kube-scheduler, containerd (with the pod sandbox image and the OCI archives in `images`
    /// loaded), the kubelet and kube-proxy; returns once the Node is Ready.
    pub async fn join(
        &mut self,
        cluster: &Cluster,
        binaries: &Binaries,
        images: &[PathBuf],
    ) -> Result<(), String> {
        let io = |e: std::io::Error| format!("node: {e}");
        let dir = self.dir.clone();
        let d = |p: &str| dir.join(p).display().to_string();
        let kubeconfig = cluster.admin_kubeconfig_path().display().to_string();

        let scheduler = self.net.net_command(
            &binaries.kube_scheduler,
            &[
                format!("--kubeconfig={kubeconfig}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", free_port()),
                "--leader-elect=false".into(),
            ],
        );
        self.start_component("kube-scheduler", scheduler)?;

        // Unix sockets live at the node's own short paths (its /run, its /var/lib): a socket path
        // may not exceed 104 bytes, and a test directory's path is as long as the checkout's.
        let socket = format!("{CONTAINERD_STATE}/containerd.sock");
        // The same socket as the machine sees it, for the checks and `ctr` run from here.
        let socket_here = format!("/proc/{}/root{socket}", self.net.pid());
        std::fs::create_dir_all(self.dir.join("cni")).map_err(io)?;
        std::fs::write(
            self.dir.join("cni/10-kbind.conflist"),
            serde_json::json!({
                "cniVersion": "0.4.0",
                "name": "kbind",
                "plugins": [
                    {
                        "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
                        "hairpinMode": true,
                        "ipam": {
                            "type": "host-local", "ranges": [[{ "subnet": POD_CIDR }]],
                            "routes": [{ "dst": "0.0.0.0/0" }], "dataDir": d("cni-ipam"),
                        },
                    },
                    { "type": "portmap", "capabilities": { "portMappings": true } },
                ],
            })
            .to_string(),
        )
        .map_err(io)?;
        let containerd_config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # CAP_SYS_RESOURCE is missing here: a negative oom_score_adj would be refused.
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#,
            root = "/var/lib/containerd",
            state = CONTAINERD_STATE,
            opt = "/var/lib/containerd-opt",
            cni = d("cni"),
        );
        std::fs::create_dir_all(self.dir.join("containerd")).map_err(io)?;
        std::fs::write(self.dir.join("containerd.toml"), containerd_config).map_err(io)?;
        let containerd = self.net.node_command(
            Path::new("containerd"),
            &[format!("--config={}", d("containerd.toml"))],
        );
        self.start_component("containerd", containerd)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !Path::new(&socket_here).exists() {
            if Instant::now() >= deadline {
                let tail = self
                    .component("containerd")
                    .map(|p| p.log_tail(30))
                    .unwrap_or_default();
                return Err(format!("containerd did not start within 30s:\n{tail}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let pause = crate::images::pause_archive(&binaries.pause, PAUSE_IMAGE)?;
        for archive in std::iter::once(&pause).chain(images) {
            self.import(&socket_here, archive).await?;
        }

        std::fs::write(
            self.dir.join("kubelet.yaml"),
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://{socket}
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup}
# The machine has cgroup v1 (hybrid), which recent kubelets refuse unless told.
failCgroupV1: false
failSwapOn: false
# The kubelet may not lower its own oom_score_adj here (no CAP_SYS_RESOURCE).
oomScoreAdj: 0
address: {NODE_IP}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
authentication:
  anonymous: {{enabled: true}}
  webhook: {{enabled: false}}
authorization:
  mode: AlwaysAllow
resolvConf: \"\"
makeIPTablesUtilChains: false
evictionHard: {{}}
imageGCHighThresholdPercent: 100
",
                cgroup = self.cgroup,
                healthz = free_port(),
            ),
        )
        .map_err(io)?;
        let kubelet = self.net.node_command(
            &binaries.kubelet,
            &[
                format!("--config={}", d("kubelet.yaml")),
                format!("--kubeconfig={kubeconfig}"),
                "--root-dir=/var/lib/kubelet".into(),
                format!("--node-ip={NODE_IP}"),
                format!("--hostname-override={NODE_NAME}"),
            ],
        );
        self.start_component("kubelet", kubelet)?;

        std::fs::write(
            self.dir.join("kube-proxy.yaml"),
            format!(
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection:
  kubeconfig: {kubeconfig}
hostnameOverride: {NODE_NAME}
bindAddress: {NODE_IP}
healthzBindAddress: 127.0.0.1:{healthz}
metricsBindAddress: 127.0.0.1:{metrics}
clusterCIDR: {POD_CIDR}
nodePortAddresses: [primary]
# The node's network namespace does not let kube-proxy tune the machine's conntrack table.
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
",
                healthz = free_port(),
                metrics = free_port(),
            ),
        )
        .map_err(io)?;
        let proxy = self.net.node_command(
            &binaries.kube_proxy,
            &[format!("--config={}", d("kube-proxy.yaml"))],
        );
        self.start_component("kube-proxy", proxy)?;

        self.wait_ready(cluster, Duration::from_secs(120)).await?;
        self.collect_logs(cluster.admin_kubeconfig());
        Ok(())
    }

    /// Copies the log of every container that runs on the node to `<dir>/pod-logs/<namespace>_<pod>_<container>.log`
    /// as it is written (the kubelet removes a deleted pod's logs: these stay for a failed test).
    pub fn collect_logs(&mut self, kubeconfig: String) {
        let dir = self.dir.join("pod-logs");
        let task = crate::netns::forwards().spawn(async move {
            use futures::{AsyncBufReadExt, StreamExt};
            use kube::runtime::{WatchStreamExt, watcher};
            let Ok(client) = crate::cluster::client_for(&kubeconfig).await else {
                return;
            };
            let _ = std::fs::create_dir_all(&dir);
            let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::all(client.clone());
            let mut followed = std::collections::BTreeSet::new();
            let mut events =
                std::pin::pin!(watcher(pods, watcher::Config::default()).applied_objects());
            while let Some(event) = events.next().await {
                let Ok(pod) = event else { continue };
                let (Some(namespace), Some(name)) =
                    (pod.metadata.namespace.clone(), pod.metadata.name.clone())
                else {
                    continue;
                };
                let statuses = pod
                    .status
                    .and_then(|s| s.container_statuses)
                    .unwrap_or_default();
                for status in statuses {
                    let started = status
                        .state
                        .as_ref()
                        .is_some_and(|s| s.running.is_some() || s.terminated.is_some());
                    let key = (
                        namespace.clone(),
                        name.clone(),
                        status.name.clone(),
                        status.restart_count,
                    );
                    if !started || !followed.insert(key) {
                        continue;
                    }
                    let api: Api<k8s_openapi::api::core::v1::Pod> =
                        Api::namespaced(client.clone(), &namespace);
                    let path = dir.join(format!("{namespace}_{name}_{}.log", status.name));
                    let (name, container) = (name.clone(), status.name.clone());
                    tokio::spawn(async move {
                        let params = kube::api::LogParams {
                            follow: true,
                            container: Some(container),
                            ..Default::default()
                        };
                        let Ok(stream) = api.log_stream(&name, &params).await else {
                            return;
                        };
                        let Ok(mut file) = std::fs::File::options()
                            .create(true)
                            .append(true)
                            .open(&path)
                        else {
                            return;
                        };
                        let mut lines = stream.lines();
                        while let Some(Ok(line)) = lines.next().await {
                            use std::io::Write;
                            let _ = writeln!(file, "{line}");
                        }
                    });
                }
            }
        });
        self.forwards.push(Forwarding(task));
    }

    /// `ctr images import` of one OCI archive into the node's containerd.
    async fn import(&self, socket: &str, archive: &Path) -> Result<(), String> {
        let output = tokio::process::Command::new("ctr")
            .args(["-a", socket, "-n", "k8s.io", "images", "import"])
            .arg(archive)
            .output()
            .await
            .map_err(|e| format!("cannot run ctr: {e}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "ctr images import {} failed ({}): {}",
                archive.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }

    async fn wait_ready(&mut self, cluster: &Cluster, limit: Duration) -> Result<(), String> {
        let nodes: Api<NodeObject> = Api::all(cluster.admin_client().await?);
        let deadline = Instant::now() + limit;
        loop {
            let ready = nodes
                .get_opt(NODE_NAME)
                .await
                .ok()
                .flatten()
                .is_some_and(|n| {
                    n.status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                });
            if ready {
                return Ok(());
            }
            for name in ["containerd", "kubelet", "kube-proxy", "kube-scheduler"] {
                if let Some(process) = self.component(name)
                    && let Some(status) = process.try_status()
                {
                    return Err(format!(
                        "{name} exited ({status}):\n{}",
                        process.log_tail(30)
                    ));
                }
            }
            if Instant::now() >= deadline {
                let tail = self
                    .component("kubelet")
                    .map(|p| p.log_tail(30))
                    .unwrap_or_default();
                return Err(format!(
                    "node {NODE_NAME} not Ready within {limit:?}:\n{tail}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.forwards.clear();
        self.components.clear();
        // The node's first process ends, and with it every process of its PID namespace.
        self.holder.kill();
        let gone = Instant::now() + Duration::from_secs(10);
        while Path::new(&format!("/proc/{}", self.net.pid())).exists() && Instant::now() < gone {
            std::thread::sleep(Duration::from_millis(50));
        }
        for hierarchy in cgroup_hierarchies() {
            remove_cgroup_tree(&hierarchy.join(&self.cgroup));
        }
    }
}
