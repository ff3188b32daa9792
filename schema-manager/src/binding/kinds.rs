//! What both binding kinds share: why a reconcile did not finish, and how to reach each kind
//! (ClusterBinding, cluster-wide; Binding, one namespace).

use kbind_shared::api::{Binding, ClusterBinding};
use kbind_shared::resolve::BindingObject;
use kube::runtime::finalizer;
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};

use crate::caches::TermCaches;
use crate::changes::Kind;

/// Why a binding reconcile did not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A consumer request failed.
    #[error("consumer API: {0}")]
    Consumer(#[from] kube::Error),
    /// A provider request failed while letting go of an API (`action` names it).
    #[error("{action}: {}", kbind_shared::identity::describe_error(.source))]
    Provider {
        /// What was being done.
        action: String,
        /// The failed request.
        #[source]
        source: kube::Error,
    },
    /// Unbind waits for provider copies (or related copies) to be deleted: a wait, not a
    /// failure; the message says what for.
    #[error("{0}")]
    Draining(String),
    /// The finalizer helper failed.
    #[error("finalizer: {0}")]
    Finalizer(#[from] Box<finalizer::Error<Error>>),
}

/// Every reason a failed binding reconcile is counted under ([`Error`]'s metric labels).
pub const REASONS: [&str; 3] = ["consumer", "provider", "finalizer"];

impl crate::context::ReconcileError for Error {
    fn metric_label(&self) -> Option<&'static str> {
        Some(match self {
            Error::Draining(_) => return None,
            Error::Consumer(e) if crate::context::raced(e) => return None,
            Error::Consumer(_) => "consumer",
            Error::Provider { .. } => "provider",
            Error::Finalizer(_) => "finalizer",
        })
    }
}

/// How to reach a binding kind's API for one object.
pub trait Scoped: BindingObject + Sized {
    /// The controller's name in metrics.
    const CONTROLLER: &'static str;
    /// Its kind among the term's caches.
    const KIND: Kind;
    /// The term's cache of this kind.
    fn store(caches: &TermCaches) -> Store<Self>;
    /// The Api for this object's scope.
    fn api(client: &Client, object: &Self) -> Api<Self>;
    /// The namespace whose instances it covers (`None`: all).
    fn covered_namespace(&self) -> Option<String>;
    /// `kind/[namespace/]name`, for messages.
    fn describe(&self) -> String;
}

impl Scoped for Binding {
    const CONTROLLER: &'static str = "binding";
    const KIND: Kind = Kind::Binding;
    fn store(caches: &TermCaches) -> Store<Self> {
        caches.bindings.clone()
    }
    fn api(client: &Client, object: &Self) -> Api<Self> {
        Api::namespaced(client.clone(), &object.namespace().unwrap_or_default())
    }
    fn covered_namespace(&self) -> Option<String> {
        self.namespace()
    }
    fn describe(&self) -> String {
        format!(
            "Binding {}/{}",
            self.namespace().unwrap_or_default(),
            self.name_any()
        )
    }
}

impl Scoped for ClusterBinding {
    const CONTROLLER: &'static str = "clusterbinding";
    const KIND: Kind = Kind::ClusterBinding;
    fn store(caches: &TermCaches) -> Store<Self> {
        caches.cluster_bindings.clone()
    }
    fn api(client: &Client, _: &Self) -> Api<Self> {
        Api::all(client.clone())
    }
    fn covered_namespace(&self) -> Option<String> {
        None
    }
    fn describe(&self) -> String {
        format!("ClusterBinding {}", self.name_any())
    }
}

#[cfg(test)]
mod reason_tests {
    use super::*;
    use crate::context::ReconcileError;

    #[test]
    fn every_failed_reconcile_is_counted_under_a_reason_initialized_at_start() {
        let api = crate::context::api_error;
        for error in [
            Error::Consumer(api(500)),
            Error::Provider {
                action: "delete a copy".into(),
                source: api(500),
            },
            Error::Finalizer(Box::new(kube::runtime::finalizer::Error::UnnamedObject)),
        ] {
            let label = error.metric_label().unwrap();
            assert!(REASONS.contains(&label), "{label}");
        }
        assert_eq!(Error::Consumer(api(409)).metric_label(), None);
        assert_eq!(Error::Draining("x".into()).metric_label(), None);
    }
}
