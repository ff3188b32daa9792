//! One real Kubernetes cluster: etcd + kube-apiserver + kube-controller-manager on loopback.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kbind_shared::kubeconfig::InlineKubeconfig;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use rand::Rng;

use crate::controlplane::Binaries;
use crate::netns::{Forwarding, NODE_IP, Netns, NodeNet};
use crate::process::ChildProcess;

/// Namespace holding the ServiceAccounts behind [`Cluster::mint_user`].
pub const USERS_NAMESPACE: &str = "kbind-e2e-users";

/// The audit policy's file name in a cluster's directory.
const AUDIT_POLICY: &str = "audit-policy.yaml";
/// The audit log's file name in a cluster's directory.
const AUDIT_LOG: &str = "audit.log";
/// At Metadata level (no bodies): every request of the users [`Cluster::mint_user`] makes (the
/// restricted credentials tests hand kbind — denied ones too, which the API server's request
/// metrics do not count) and of kbind-issuer's ServiceAccounts, writes to the test APIs and to
/// kbind's own objects by anyone, reads of
/// the test APIs and of Secrets and ConfigMaps (a GET, a LIST, or a WATCH — a streaming list is
/// one), and Lease writes in
/// kbind's namespace (the syncers' memberships); nothing else.
const AUDIT_POLICY_YAML: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  userGroups: [\"system:serviceaccounts:kbind-e2e-users\"]
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
  resources:
  - group: example.org
  - group: core.kbind.io
  - group: catalog.kbind.io
  - group: iam.kbind.io
- level: Metadata
  userGroups: [\"system:serviceaccounts:kbind-issuer\"]
- level: Metadata
  verbs: [get, list, watch]
  resources:
  - group: example.org
- level: Metadata
  verbs: [get, list, watch]
  resources:
  - group: \"\"
    resources: [secrets, configmaps]
- level: Metadata
  verbs: [create, update, patch]
  namespaces: [kbind-system]
  resources:
  - group: coordination.k8s.io
    resources: [leases]
- level: None
";

/// One request an API server answered, from its audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Audited {
    /// `create`, `update`, `patch` (a server-side apply too), `delete`, …
    pub verb: String,
    /// The resource (plural).
    pub resource: String,
    /// The subresource ("" for the object itself).
    pub subresource: String,
    /// The namespace ("" for a cluster-scoped object).
    pub namespace: String,
    /// The object's name ("" for a collection).
    pub name: String,
    /// Who made it.
    pub user: String,
    /// The answer's HTTP code.
    pub code: u16,
    /// The client's User-Agent.
    pub user_agent: String,
    /// The request's path and query (a list's or watch's selectors are in it).
    pub request_uri: String,
}

/// A running cluster. Dropping it stops every process it started.
pub struct Cluster {
    name: String,
    dir: PathBuf,
    server: String,
    ca_pem: String,
    admin_token: String,
    // Dropped in this order: controller manager, API server, etcd.
    processes: Vec<ChildProcess>,
    // For a cluster in a node's network namespace: the forward from the machine's loopback.
    _forwarding: Option<Forwarding>,
}

/// A user of a cluster, authenticated by a bearer token. Starts with no permissions beyond
/// discovery; grant it RBAC with [`Cluster::grant`].
#[derive(Clone, Debug)]
pub struct User {
    /// `system:serviceaccount:<namespace>:<name>`
    pub username: String,
    /// The ServiceAccount's name, in [`USERS_NAMESPACE`] unless minted otherwise.
    pub service_account: String,
    /// The ServiceAccount's namespace.
    pub namespace: String,
    /// Bearer token.
    pub token: String,
    /// A self-contained kubeconfig for this user.
    pub kubeconfig: String,
}

impl User {
    /// The user as an RBAC binding's subject: its ServiceAccount.
    fn subject(&self) -> Subject {
        Subject {
            kind: "ServiceAccount".into(),
            name: self.service_account.clone(),
            namespace: Some(self.namespace.clone()),
            ..Default::default()
        }
    }
}

/// A free TCP port on 127.0.0.1 for a process a test starts.
///
/// Ports come from outside the kernel's ephemeral range (`ip_local_port_range`), so no other
/// process's `bind(:0)` or outgoing connection can take one between this call and the child
/// binding it, and this process never hands out the same port twice. Test binaries run one at a
/// time; each starts at a random place in the range, so two that do overlap rarely meet.
pub fn free_port() -> u16 {
    static POOL: std::sync::OnceLock<Option<std::sync::Mutex<PortPool>>> =
        std::sync::OnceLock::new();
    let pool = POOL.get_or_init(|| PortPool::new(ephemeral_range()).map(std::sync::Mutex::new));
    if let Some(pool) = pool {
        let mut pool = pool.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..pool.len {
            let port = pool.next();
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    // Every port outside the ephemeral range is taken: let the OS choose.
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("the OS hands out a loopback port")
}

/// The kernel's ephemeral port range, or Linux's default when it cannot be read.
fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| {
            let mut bounds = text.split_whitespace().map(|n| n.parse::<u16>().ok());
            Some((bounds.next()??, bounds.next()??))
        })
        .unwrap_or((32768, 60999))
}

/// Ports handed out in turn from the largest stretch outside the ephemeral range (never below
/// 10000, where well-known services live).
struct PortPool {
    low: u16,
    len: u16,
    offset: u16,
}

impl PortPool {
    /// `None` when the ephemeral range leaves no room.
    fn new((ephemeral_low, ephemeral_high): (u16, u16)) -> Option<Self> {
        const FLOOR: u16 = 10000;
        let below = ephemeral_low.saturating_sub(FLOOR);
        let above = u16::MAX - ephemeral_high.max(FLOOR - 1);
        let (low, len) = if below >= above {
            (FLOOR, below)
        } else {
            (ephemeral_high.max(FLOOR - 1) + 1, above)
        };
        (len > 0).then(|| Self {
            low,
            len,
            offset: rand::rng().random_range(0..len),
        })
    }

    fn next(&mut self) -> u16 {
        let port = self.low + self.offset;
        self.offset = (self.offset + 1) % self.len;
        port
    }
}

fn random_token() -> String {
    let bytes: [u8; 24] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A self-contained kubeconfig (inline CA and token) with one context, `name`.
pub fn kubeconfig_yaml(
    name: &str,
    server: &str,
    ca_pem: &str,
    token: &str,
    namespace: Option<&str>,
) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let namespace = namespace
        .map(|ns| format!("    namespace: {ns}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: {name}\n\
         clusters:\n- name: {name}\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\n\
         contexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: {name}\n{namespace}\
         users:\n- name: {name}\n  user:\n    token: {token}\n"
    )
}

/// Waits until `127.0.0.1:<port>` accepts connections — on the machine, or inside `netns`.
async fn wait_for_port(
    port: u16,
    netns: Option<&Netns>,
    process: &mut ChildProcess,
    limit: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        let connected = match netns {
            Some(netns) => netns.connect(([127, 0, 0, 1], port).into()).await.is_ok(),
            None => tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok(),
        };
        if connected {
            return Ok(());
        }
        if let Some(status) = process.try_status() {
            return Err(format!(
                "{} exited ({status}):\n{}",
                process.name(),
                process.log_tail(30)
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{} did not listen on {port} within {limit:?}:\n{}",
                process.name(),
                process.log_tail(30)
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Cluster {
    /// Starts a cluster whose files and logs live in `dir`; `apiserver_flags` are added to the
    /// `kube-apiserver`'s own.
    pub async fn start(
        name: &str,
        dir: &Path,
        binaries: &Binaries,
        apiserver_flags: &[String],
    ) -> Result<Self, String> {
        Self::start_like(name, dir, binaries, apiserver_flags, None).await
    }

    /// [`Cluster::start`]; with `like`, the new cluster presents itself to a client exactly as
    /// `like` does — the same serving certificate and the same admin token — while being another
    /// cluster (its own etcd, its own identity): what a credential reaches when the server behind
    /// its address is replaced.
    pub async fn start_like(
        name: &str,
        dir: &Path,
        binaries: &Binaries,
        apiserver_flags: &[String],
        like: Option<&Cluster>,
    ) -> Result<Self, String> {
        Self::start_inner(name, dir, binaries, apiserver_flags, like, None).await
    }

    /// A cluster whose processes run in `node`'s network namespace, where its API server listens
    /// on every address (the node's own, [`NODE_IP`], is the `kubernetes` Service's endpoint) with
    /// a serving certificate for `127.0.0.1`, [`NODE_IP`] and the Service's address and names.
    /// [`Cluster::server`] is `https://127.0.0.1:<port>` both inside the node and on the machine,
    /// where a forward leads into the node.
    pub async fn start_on_node(
        name: &str,
        dir: &Path,
        binaries: &Binaries,
        node: &NodeNet,
    ) -> Result<Self, String> {
        Self::start_inner(name, dir, binaries, &[], None, Some(node)).await
    }

    async fn start_inner(
        name: &str,
        dir: &Path,
        binaries: &Binaries,
        apiserver_flags: &[String],
        like: Option<&Cluster>,
        node: Option<&NodeNet>,
    ) -> Result<Self, String> {
        let io = |e: std::io::Error| format!("cluster {name}: {e}");
        let netns = node.map(NodeNet::netns);
        // How a process starts: itself, or entering the node's network namespace.
        let launch = |program: &Path, args: Vec<String>| match node {
            Some(node) => node.net_command(program, &args),
            None => (program.to_path_buf(), args),
        };
        let certs = dir.join("certs");
        std::fs::create_dir_all(&certs).map_err(io)?;
        if let Some(like) = like {
            // kube-apiserver serves the pair it finds in its --cert-dir instead of making one.
            for file in ["apiserver.crt", "apiserver.key"] {
                std::fs::copy(like.dir.join("certs").join(file), certs.join(file)).map_err(io)?;
            }
        }
        if node.is_some() {
            write_node_serving_certificate(&certs).map_err(|e| format!("cluster {name}: {e}"))?;
        }

        // Service account signing key: lets the API server issue tokens for minted users.
        let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
        std::fs::write(dir.join("sa.key"), key.serialize_pem()).map_err(io)?;
        std::fs::write(dir.join("sa.pub"), key.public_key_pem()).map_err(io)?;
        let admin_token = like.map_or_else(random_token, |c| c.admin_token.clone());
        std::fs::write(
            dir.join("tokens.csv"),
            format!("{admin_token},admin,admin,\"system:masters\"\n"),
        )
        .map_err(io)?;

        let (etcd_port, etcd_peer_port, port) = (free_port(), free_port(), free_port());
        let (program, args) = launch(
            &binaries.etcd,
            vec![
                format!("--name={name}"),
                format!("--data-dir={}", dir.join("etcd").display()),
                format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"),
                format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer_port}"),
                "--unsafe-no-fsync".into(),
            ],
        );
        let mut etcd = ChildProcess::start("etcd", &program, &args, &[], &dir.join("etcd.log"))?;
        wait_for_port(etcd_port, netns, &mut etcd, Duration::from_secs(30)).await?;

        // The audit log: every write to the test APIs (group example.org), with who made it and
        // how it was answered — what a test counts writes per object from.
        std::fs::write(dir.join(AUDIT_POLICY), AUDIT_POLICY_YAML).map_err(io)?;
        let d = |file: &str| dir.join(file).display().to_string();
        let mut apiserver_args = vec![
            format!("--audit-policy-file={}", d(AUDIT_POLICY)),
            format!("--audit-log-path={}", d(AUDIT_LOG)),
            "--audit-log-format=json".into(),
            "--audit-log-mode=blocking".into(),
            format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            "--etcd-prefix=/registry".into(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", certs.display()),
            format!("--token-auth-file={}", d("tokens.csv")),
            "--authorization-mode=RBAC".into(),
            format!("--service-account-issuer=https://{name}.test"),
            format!("--service-account-key-file={}", d("sa.pub")),
            format!("--service-account-signing-key-file={}", d("sa.key")),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
        ];
        apiserver_args.extend(match node {
            // The node's address is the `kubernetes` Service's endpoint (reconciled by the API
            // server); it reaches the node's kubelet (`kubectl logs`) at its InternalIP.
            Some(_) => [
                "--bind-address=0.0.0.0".to_owned(),
                format!("--advertise-address={NODE_IP}"),
                "--kubelet-preferred-address-types=InternalIP".to_owned(),
            ],
            None => [
                "--bind-address=127.0.0.1".to_owned(),
                "--advertise-address=127.0.0.1".to_owned(),
                "--endpoint-reconciler-type=none".to_owned(),
            ],
        });
        apiserver_args.extend_from_slice(apiserver_flags);
        let (program, args) = launch(&binaries.kube_apiserver, apiserver_args);
        let mut apiserver = ChildProcess::start(
            "kube-apiserver",
            &program,
            &args,
            &[],
            &dir.join("kube-apiserver.log"),
        )?;
        wait_for_port(port, netns, &mut apiserver, Duration::from_secs(60)).await?;
        let forwarding = match netns {
            Some(netns) => Some(
                netns
                    .forward_in(port, ([127, 0, 0, 1], port).into())
                    .await?,
            ),
            None => None,
        };
        let ca_pem = std::fs::read_to_string(certs.join("apiserver.crt")).map_err(|e| {
            format!("cluster {name}: the API server wrote no serving certificate: {e}")
        })?;

        let mut cluster = Self {
            name: name.to_owned(),
            dir: dir.to_path_buf(),
            server: format!("https://127.0.0.1:{port}"),
            ca_pem,
            admin_token,
            processes: vec![apiserver, etcd],
            _forwarding: forwarding,
        };
        cluster.wait_ready(Duration::from_secs(60)).await?;

        let admin_kubeconfig = dir.join("admin.kubeconfig");
        std::fs::write(&admin_kubeconfig, cluster.admin_kubeconfig()).map_err(io)?;
        // A cluster with a node runs workloads: every controller (EndpointSlices, the node's
        // lifecycle…); without one, those its API objects need — Deployments and ReplicaSets
        // included, so a Deployment scaled to 0 loses its (never scheduled) pods.
        let controllers = match node {
            Some(_) => "*",
            None => {
                "namespace,garbagecollector,serviceaccount,serviceaccount-token,clusterrole-aggregation,deployment,replicaset"
            }
        };
        let (program, args) = launch(
            &binaries.kube_controller_manager,
            vec![
                format!("--kubeconfig={}", admin_kubeconfig.display()),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", free_port()),
                format!("--controllers={controllers}"),
                format!("--service-account-private-key-file={}", d("sa.key")),
                format!("--root-ca-file={}", certs.join("apiserver.crt").display()),
                "--use-service-account-credentials=false".into(),
                "--leader-elect=false".into(),
            ],
        );
        let controller_manager = ChildProcess::start(
            "kube-controller-manager",
            &program,
            &args,
            &[],
            &dir.join("kube-controller-manager.log"),
        )?;
        cluster.processes.insert(0, controller_manager);
        Ok(cluster)
    }

    /// Waits for `/readyz` and the `kube-system` Namespace.
    async fn wait_ready(&mut self, limit: Duration) -> Result<(), String> {
        let client = self.admin_client().await?;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let deadline = Instant::now() + limit;
        loop {
            let ready = client
                .request_text(
                    http::Request::get("/readyz")
                        .body(Vec::new())
                        .expect("static request"),
                )
                .await
                .is_ok_and(|body| body.trim() == "ok");
            if ready
                && namespaces
                    .get_opt("kube-system")
                    .await
                    .ok()
                    .flatten()
                    .is_some()
            {
                return Ok(());
            }
            let name = self.name.clone();
            let apiserver = self.process_mut("kube-apiserver");
            if let Some(status) = apiserver.try_status() {
                return Err(format!(
                    "kube-apiserver of {} exited ({status}):\n{}",
                    name,
                    apiserver.log_tail(30)
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "kube-apiserver of {} not ready within {limit:?}:\n{}",
                    name,
                    apiserver.log_tail(30)
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The cluster's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The directory holding its files and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `https://127.0.0.1:<port>`
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The API server's serving certificate (self-signed: it is its own CA).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A self-contained kubeconfig for the cluster admin (`system:masters`).
    pub fn admin_kubeconfig(&self) -> String {
        kubeconfig_yaml(
            &self.name,
            &self.server,
            &self.ca_pem,
            &self.admin_token,
            None,
        )
    }

    /// The admin's bearer token.
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// The path of the admin kubeconfig file.
    pub fn admin_kubeconfig_path(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// A client acting as the cluster admin.
    pub async fn admin_client(&self) -> Result<Client, String> {
        client_for(&self.admin_kubeconfig()).await
    }

    /// Creates a new user with no permissions (a ServiceAccount in [`USERS_NAMESPACE`] and a token
    /// for it).
    pub async fn mint_user(&self, name: &str) -> Result<User, String> {
        self.mint_service_account_user(USERS_NAMESPACE, name).await
    }

    /// Creates (if needed) the ServiceAccount `namespace/name` and returns a user with a token for
    /// it — e.g. to act as a component's ServiceAccount.
    pub async fn mint_service_account_user(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<User, String> {
        let client = self.admin_client().await?;
        ensure_namespace(&client, namespace).await?;
        let accounts: Api<ServiceAccount> = Api::namespaced(client, namespace);
        let account = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        };
        match accounts.create(&PostParams::default(), &account).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_already_exists() => {}
            Err(e) => return Err(format!("create ServiceAccount {namespace}/{name}: {e}")),
        }
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(24 * 3600),
                ..Default::default()
            }),
            ..Default::default()
        };
        let token = accounts
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .map_err(|e| format!("token for ServiceAccount {namespace}/{name}: {e}"))?
            .status
            .and_then(|s| s.token)
            .ok_or("the TokenRequest has no token")?;
        Ok(User {
            username: format!("system:serviceaccount:{namespace}:{name}"),
            service_account: name.to_owned(),
            namespace: namespace.to_owned(),
            kubeconfig: kubeconfig_yaml(&self.name, &self.server, &self.ca_pem, &token, None),
            token,
        })
    }

    /// Grants `user` the given cluster-wide rules (a ClusterRole and ClusterRoleBinding named
    /// `<binding>`).
    pub async fn grant(
        &self,
        user: &User,
        binding: &str,
        rules: Vec<PolicyRule>,
    ) -> Result<(), String> {
        self.grant_subject(user.subject(), binding, rules).await
    }

    /// Grants the user named `username` (any authenticator's, e.g. an OIDC user) the given
    /// cluster-wide rules (a ClusterRole and ClusterRoleBinding named `binding`).
    pub async fn grant_user(
        &self,
        username: &str,
        binding: &str,
        rules: Vec<PolicyRule>,
    ) -> Result<(), String> {
        let subject = Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "User".into(),
            name: username.into(),
            ..Default::default()
        };
        self.grant_subject(subject, binding, rules).await
    }

    async fn grant_subject(
        &self,
        subject: Subject,
        binding: &str,
        rules: Vec<PolicyRule>,
    ) -> Result<(), String> {
        let client = self.admin_client().await?;
        let meta = ObjectMeta {
            name: Some(binding.to_owned()),
            ..Default::default()
        };
        let role = ClusterRole {
            metadata: meta.clone(),
            rules: Some(rules),
            ..Default::default()
        };
        Api::<ClusterRole>::all(client.clone())
            .create(&PostParams::default(), &role)
            .await
            .map_err(|e| format!("create ClusterRole {binding}: {e}"))?;
        let role_binding = ClusterRoleBinding {
            metadata: meta,
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "ClusterRole".into(),
                name: binding.into(),
            },
            subjects: Some(vec![subject]),
        };
        Api::<ClusterRoleBinding>::all(client)
            .create(&PostParams::default(), &role_binding)
            .await
            .map_err(|e| format!("create ClusterRoleBinding {binding}: {e}"))?;
        Ok(())
    }

    /// Grants `user` the `rules` in `namespace` only: a Role and a RoleBinding named `binding`
    /// there.
    pub async fn grant_in(
        &self,
        user: &User,
        namespace: &str,
        binding: &str,
        rules: Vec<PolicyRule>,
    ) -> Result<(), String> {
        use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
        let client = self.admin_client().await?;
        let meta = ObjectMeta {
            name: Some(binding.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..Default::default()
        };
        let role = Role {
            metadata: meta.clone(),
            rules: Some(rules),
        };
        Api::<Role>::namespaced(client.clone(), namespace)
            .create(&PostParams::default(), &role)
            .await
            .map_err(|e| format!("create Role {namespace}/{binding}: {e}"))?;
        let role_binding = RoleBinding {
            metadata: meta,
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "Role".into(),
                name: binding.into(),
            },
            subjects: Some(vec![user.subject()]),
        };
        Api::<RoleBinding>::namespaced(client, namespace)
            .create(&PostParams::default(), &role_binding)
            .await
            .map_err(|e| format!("create RoleBinding {namespace}/{binding}: {e}"))?;
        Ok(())
    }

    fn process_mut(&mut self, name: &str) -> &mut ChildProcess {
        self.processes
            .iter_mut()
            .find(|p| p.name() == name)
            .expect("every cluster runs its processes")
    }

    /// The CPU time this cluster's processes (API server, etcd, controller manager) have used so
    /// far, in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        self.processes
            .iter()
            .map(|p| crate::measure::cpu_seconds(p.pid()))
            .sum()
    }

    /// Sends a signal to this cluster's kube-apiserver (`STOP` pauses it: the cluster becomes
    /// unreachable without losing state; `CONT` resumes it).
    pub fn signal_apiserver(&self, signal: &str) -> Result<(), String> {
        self.processes
            .iter()
            .find(|p| p.name() == "kube-apiserver")
            .ok_or("no kube-apiserver")?
            .signal(signal)
    }

    /// The requests this API server has answered so far that its audit log keeps: every request
    /// of a minted user, and the writes to the test APIs (group `example.org`).
    pub fn audited(&self) -> Vec<Audited> {
        // A WATCH is kept from when it started (it completes when it ends, if ever).
        self.audit_events(|stage, verb| {
            stage == "ResponseComplete" && verb != "watch"
                || stage == "ResponseStarted" && verb == "watch"
        })
    }

    /// The WATCHes of [`Cluster::audited`] that have ended (their client went, or the server
    /// closed them).
    pub fn audited_watch_ends(&self) -> Vec<Audited> {
        self.audit_events(|stage, verb| stage == "ResponseComplete" && verb == "watch")
    }

    fn audit_events(&self, keep: impl Fn(&str, &str) -> bool) -> Vec<Audited> {
        let text = std::fs::read_to_string(self.dir.join(AUDIT_LOG)).unwrap_or_default();
        text.lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|event| {
                keep(
                    event["stage"].as_str().unwrap_or_default(),
                    event["verb"].as_str().unwrap_or_default(),
                )
            })
            .map(|event| {
                let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
                Audited {
                    verb: text(&event["verb"]),
                    resource: text(&event["objectRef"]["resource"]),
                    subresource: text(&event["objectRef"]["subresource"]),
                    namespace: text(&event["objectRef"]["namespace"]),
                    name: text(&event["objectRef"]["name"]),
                    user: text(&event["user"]["username"]),
                    code: event["responseStatus"]["code"].as_u64().unwrap_or_default() as u16,
                    user_agent: text(&event["userAgent"]),
                    request_uri: text(&event["requestURI"]),
                }
            })
            .collect()
    }

    /// Logs of this cluster's processes, for a failure message.
    pub fn logs(&self) -> Vec<PathBuf> {
        self.processes
            .iter()
            .map(|p| p.log().to_path_buf())
            .collect()
    }
}

/// Writes the serving certificate of a cluster on a node into its `--cert-dir`: a CA of its own and
/// a certificate it signed for every address and name the cluster is reached by — `127.0.0.1`
/// (the machine, through a forward, and the node's own loopback), [`NODE_IP`], and the
/// `kubernetes` Service (10.96.0.1 and its names), which in-cluster clients use.
/// `apiserver.crt` holds the certificate and the CA (what clients are given as CA data).
fn write_node_serving_certificate(certs: &Path) -> Result<(), String> {
    let e = |e: rcgen::Error| e.to_string();
    let ca_key = rcgen::KeyPair::generate().map_err(e)?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(e)?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kbind-e2e-node-ca");
    let ca = ca_params.self_signed(&ca_key).map_err(e)?;
    let key = rcgen::KeyPair::generate().map_err(e)?;
    let names = [
        "127.0.0.1",
        NODE_IP,
        "10.96.0.1",
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ];
    let mut params = rcgen::CertificateParams::new(names.map(str::to_owned).to_vec()).map_err(e)?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kube-apiserver");
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let certificate = params.signed_by(&key, &issuer).map_err(e)?;
    std::fs::write(
        certs.join("apiserver.crt"),
        format!("{}{}", certificate.pem(), ca.pem()),
    )
    .map_err(|e| e.to_string())?;
    std::fs::write(certs.join("apiserver.key"), key.serialize_pem()).map_err(|e| e.to_string())
}

/// A client from a self-contained kubeconfig, through kbind's own kubeconfig handling.
pub async fn client_for(kubeconfig: &str) -> Result<Client, String> {
    InlineKubeconfig::parse(kubeconfig.as_bytes())
        .map_err(|e| e.to_string())?
        .client()
        .await
        .map_err(|e| e.to_string())
}

/// Creates the namespace unless it exists (checking first, so that it writes nothing when it does).
/// Creates the namespace `name` labelled `key=value` (what a webhook's `namespaceSelector`
/// matches).
pub async fn labelled_namespace(
    client: &Client,
    name: &str,
    (key, value): (&str, &str),
) -> Result<(), String> {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some([(key.to_owned(), value.to_owned())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .map(drop)
        .map_err(|e| format!("create Namespace {name}: {e}"))
}

pub async fn ensure_namespace(client: &Client, name: &str) -> Result<(), String> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces
        .get_opt(name)
        .await
        .map_err(|e| format!("read Namespace {name}: {e}"))?
        .is_some()
    {
        return Ok(());
    }
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    match namespaces.create(&PostParams::default(), &namespace).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(()),
        Err(e) => Err(format!("create Namespace {name}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::PortPool;

    fn ports(range: (u16, u16)) -> Option<(u16, u16)> {
        PortPool::new(range).map(|p| (p.low, p.low + (p.len - 1)))
    }

    #[test]
    fn ports_come_from_outside_the_ephemeral_range() {
        // Linux's default: everything from 10000 up to just below it.
        assert_eq!(ports((32768, 60999)), Some((10000, 32767)));
        // A range starting low leaves the stretch above it.
        assert_eq!(ports((15000, 40000)), Some((40001, 65535)));
        // Nothing left: the caller falls back to the OS.
        assert_eq!(ports((1024, 65535)), None);
    }

    #[test]
    fn every_port_of_the_pool_is_handed_out_once_before_any_repeats() {
        let mut pool = PortPool::new((20000, 65535)).expect("10000..=19999");
        let mut seen: Vec<u16> = (0..pool.len).map(|_| pool.next()).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 10000);
        assert_eq!((seen[0], seen[9999]), (10000, 19999));
    }
}
