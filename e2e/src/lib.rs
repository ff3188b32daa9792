//! kbind's end-to-end test environment: real, independent Kubernetes clusters (etcd +
//! kube-apiserver + kube-controller-manager built from the official Go modules) started on this
//! machine, and kbind's own programs run as real processes against them.
//!
//! ```no_run
//! # async fn demo() -> Result<(), String> {
//! let env = kbind_e2e::TestEnv::start("my_test", &["consumer", "provider"]).await?;
//! let consumer = env.cluster("consumer");
//! let client = consumer.admin_client().await?;
//! # Ok(()) }
//! ```
//!
//! Every process is killed and reaped when the [`TestEnv`] drops, also when the test panics; the
//! logs of a failed test are kept and their directory printed.
#![forbid(unsafe_code)]

pub mod browser;
pub mod chaos;
pub mod chart;
pub mod cluster;
pub mod controlplane;
pub mod env;
pub mod fixtures;
pub mod forward;
pub mod images;
pub mod kbind;
pub mod measure;
pub mod minimal;
pub mod netns;
pub mod node;
pub mod process;
pub mod sharding;
pub mod tools;
pub mod wait;
pub mod webhook;

pub use cluster::{Cluster, User};
pub use env::TestEnv;
pub use process::ChildProcess;
pub use wait::eventually;
