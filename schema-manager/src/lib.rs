//! The schema manager's library: everything `kbind-schema-manager` runs, and the decisions the
//! `kubectl-kbind` plugin reuses to show what the schema manager would do (a dry run computes
//! with the same pure functions the reconcilers act on).
#![forbid(unsafe_code)]

pub mod assignment;
pub mod binding;
pub mod caches;
pub mod changes;
pub mod cli;
pub mod connection;
pub mod consent;
pub mod context;
pub mod discovery;
pub mod evolution;
pub mod identity_watch;
pub mod instances;
pub mod openapi;
pub mod providers;
pub mod schema;
