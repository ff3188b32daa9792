//! Sockets in another network namespace: a thread that has moved into it opens them, and they
//! keep that namespace wherever they are used afterwards — so a test process on the machine's
//! loopback connects into the test node's network namespace, listens inside it, and forwards TCP
//! between the two without any address outside 127.0.0.0/8 on the machine.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A request to the namespace's thread.
enum Request {
    Connect(
        SocketAddr,
        tokio::sync::oneshot::Sender<std::io::Result<std::net::TcpStream>>,
    ),
    Bind(
        SocketAddr,
        tokio::sync::oneshot::Sender<std::io::Result<std::net::TcpListener>>,
    ),
}

/// A network namespace (named by a `/proc/<pid>/ns/net` path) in which this process opens sockets.
/// Cheap to clone; its thread ends when the last clone drops.
#[derive(Clone)]
pub struct Netns {
    requests: mpsc::Sender<Request>,
}

impl Netns {
    /// Joins the network namespace at `path` on a thread of its own (a thread's namespace is its
    /// own: the rest of the process, the async runtime's threads included, stays where it is).
    pub fn open(path: PathBuf) -> Result<Self, String> {
        let file = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let (requests, inbox) = mpsc::channel::<Request>();
        let (ready, entered) = mpsc::channel();
        std::thread::Builder::new()
            .name("netns".into())
            .spawn(move || {
                use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};
                use std::os::fd::AsFd;
                let joined =
                    move_into_link_name_space(file.as_fd(), Some(LinkNameSpaceType::Network))
                        .map_err(|e| format!("setns {}: {e}", path.display()));
                let failed = joined.is_err();
                let _ = ready.send(joined);
                if failed {
                    return;
                }
                for request in inbox {
                    match request {
                        Request::Connect(addr, reply) => {
                            let stream =
                                std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5));
                            let _ = reply.send(stream);
                        }
                        Request::Bind(addr, reply) => {
                            let _ = reply.send(std::net::TcpListener::bind(addr));
                        }
                    }
                }
            })
            .map_err(|e| format!("netns thread: {e}"))?;
        entered
            .recv()
            .map_err(|_| "the netns thread ended".to_owned())??;
        Ok(Self { requests })
    }

    /// Connects to `addr` from inside the namespace.
    pub async fn connect(&self, addr: SocketAddr) -> std::io::Result<TcpStream> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.requests
            .send(Request::Connect(addr, reply))
            .map_err(|_| std::io::Error::other("the netns thread ended"))?;
        let stream = answer
            .await
            .map_err(|_| std::io::Error::other("the netns thread ended"))??;
        stream.set_nonblocking(true)?;
        TcpStream::from_std(stream)
    }

    /// Listens on `addr` inside the namespace (a non-blocking listener).
    pub async fn bind(&self, addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.requests
            .send(Request::Bind(addr, reply))
            .map_err(|_| std::io::Error::other("the netns thread ended"))?;
        let listener = answer
            .await
            .map_err(|_| std::io::Error::other("the netns thread ended"))??;
        listener.set_nonblocking(true)?;
        Ok(listener)
    }

    /// Forwards connections to `127.0.0.1:<host_port>` on the machine's loopback to `to` inside
    /// the namespace, until the returned task is dropped.
    pub async fn forward_in(&self, host_port: u16, to: SocketAddr) -> Result<Forwarding, String> {
        let listener = std::net::TcpListener::bind(("127.0.0.1", host_port))
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| format!("forward into the node: bind 127.0.0.1:{host_port}: {e}"))?;
        let netns = self.clone();
        Ok(Forwarding(forwards().spawn(async move {
            let Ok(listener) = TcpListener::from_std(listener) else {
                return;
            };
            while let Ok((inbound, _)) = listener.accept().await {
                let netns = netns.clone();
                tokio::spawn(async move {
                    if let Ok(outbound) = netns.connect(to).await {
                        pipe(inbound, outbound).await;
                    }
                });
            }
        })))
    }

    /// Forwards connections to `at` inside the namespace to `to` on the machine's loopback, until
    /// the returned task is dropped.
    pub async fn forward_out(&self, at: SocketAddr, to: SocketAddr) -> Result<Forwarding, String> {
        let listener = self
            .bind(at)
            .await
            .map_err(|e| format!("forward out of the node: bind {at}: {e}"))?;
        Ok(Forwarding(forwards().spawn(async move {
            let Ok(listener) = TcpListener::from_std(listener) else {
                return;
            };
            while let Ok((inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(outbound) = TcpStream::connect(to).await {
                        pipe(inbound, outbound).await;
                    }
                });
            }
        })))
    }
}

/// The runtime every forward runs on: one of its own, so that a test blocking its own runtime's
/// thread (waiting for `helm`, say) never stalls the connections it is waiting on.
pub(crate) fn forwards() -> &'static tokio::runtime::Handle {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("forwards")
                .enable_all()
                .build()
                .expect("a runtime for the forwards")
        })
        .handle()
}

async fn pipe(mut a: TcpStream, mut b: TcpStream) {
    let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
}

/// A running forward (or another task of the node's); it stops when dropped.
pub struct Forwarding(pub(crate) JoinHandle<()>);

impl Drop for Forwarding {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The node's address, inside its network namespace only: its `InternalIP`, where its kubelet
/// serves, where the consumer's API server is advertised (the `kubernetes` Service's endpoint),
/// and where pods reach forwards out of the node.
pub const NODE_IP: &str = "10.100.0.1";

/// The node's namespaces, as other processes join them.
#[derive(Clone)]
pub struct NodeNet {
    /// The PID of the node's first process, whose namespaces others join.
    pid: u32,
    netns: Netns,
}

impl NodeNet {
    /// The namespaces of process `pid`, with `netns` opened in its network namespace.
    pub(crate) fn new(pid: u32, netns: Netns) -> Self {
        Self { pid, netns }
    }

    /// The PID of the node's first process.
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Opens sockets in the node's network namespace.
    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    /// `nsenter` running `program args…` in the node's network namespace only; nsenter executes
    /// it in place, so the process started is the program itself.
    pub fn net_command(&self, program: &Path, args: &[String]) -> (PathBuf, Vec<String>) {
        self.command(&["--net"], program, args)
    }

    /// `nsenter` running `program args…` in all of the node's namespaces (PID, mount, network):
    /// nsenter forks it, and it ends when the node does.
    pub(crate) fn node_command(&self, program: &Path, args: &[String]) -> (PathBuf, Vec<String>) {
        self.command(&["--pid", "--mount", "--net"], program, args)
    }

    fn command(&self, spaces: &[&str], program: &Path, args: &[String]) -> (PathBuf, Vec<String>) {
        let mut all = vec!["-t".to_owned(), self.pid.to_string()];
        all.extend(spaces.iter().map(|s| (*s).to_owned()));
        all.push("--".into());
        all.push(program.display().to_string());
        all.extend_from_slice(args);
        (PathBuf::from("nsenter"), all)
    }

    /// Runs a short command in the node's mount and network namespaces; its error output on
    /// failure.
    pub(crate) fn run(&self, script: &str) -> Result<(), String> {
        let (program, args) = self.command(
            &["--mount", "--net"],
            Path::new("sh"),
            &["-ec".into(), script.into()],
        );
        let output = Command::new(program)
            .args(args)
            .output()
            .map_err(|e| format!("nsenter: {e}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "in the node: `{script}` failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }
}
