//! kbind's shared library: the `core.kbind.io/v1alpha1` API types, every key kbind writes,
//! condition helpers, provider kubeconfig handling, cluster identity, and the process plumbing
//! (flags, logging, metrics, probes, shutdown) both programs use.
#![forbid(unsafe_code)]

pub mod api;
pub mod apply;
pub mod backoff;
pub mod binding_cap;
pub mod bound_token;
pub mod boundary;
pub mod cache;
pub mod cli;
pub mod client;
pub mod conditions;
pub mod credential;
pub mod delivery;
pub mod dynamic;
pub mod finalizers;
#[cfg(test)]
mod fuzz;
pub mod heartbeat;
pub mod https;
pub mod identity;
pub mod import;
pub mod keys;
pub mod kubeconfig;
pub mod leader;
pub mod metrics;
pub mod metrics_auth;
pub mod namespaced;
pub mod ownership;
pub mod process;
pub mod rate;
pub mod redact;
pub mod resolve;
pub mod routing;
pub mod shard;
pub mod streaming;
pub mod sync;
pub mod telemetry;
