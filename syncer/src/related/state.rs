//! What one binding's related-resources worker is given and holds.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use kbind_shared::api::RelatedResourceKind;
use kbind_shared::kubeconfig::InlineKubeconfig;
use kube::Client;
use kube::runtime::events::Recorder;

use super::plan::{KindKey, Side, TargetKey};
use super::watch::{self, Role, Watched};
use crate::context::Context;

/// Which binding, and with which provider.
pub struct RelatedSpec {
    /// The Binding's namespace; `None` for a ClusterBinding.
    pub namespace: Option<String>,
    /// The binding's name.
    pub name: String,
    /// The binding's UID (the worker ends if the binding is replaced).
    pub uid: String,
    /// The binding's generation the worker was built for: its watches follow that spec, so a
    /// newer spec waits for the worker to be rebuilt.
    pub generation: i64,
    /// The Connection.
    pub connection: String,
    /// The Connection's access rules (`spec.access`): whether Secrets may go to the provider, and
    /// whether a Binding may adopt.
    pub access: kbind_shared::api::ConnectionAccess,
    /// The consumer's pinned identity.
    pub local_uid: String,
    /// Provider credentials.
    pub kubeconfig: InlineKubeconfig,
    /// Their digest (workers of one Connection with the same digest share one provider client).
    pub digest: String,
    /// A ClusterBinding with `FromProvider` entries, or any ClusterBinding of a Connection with a
    /// boundary: its bound APIs (name, consumer resource), whose objects' namespaces are where the
    /// provider's copies may land — and, in a boundary, where the provider is watched. Empty
    /// otherwise.
    pub bound_apis: Vec<(String, kube::api::ApiResource)>,
    /// How the Connection names consumer namespaces on the provider (its boundary, #51).
    pub namespaces: kbind_shared::boundary::NamespaceMap,
}

/// One binding's related-resources worker: what it copies, with which clients, and what it
/// holds while it runs.
pub(super) struct Worker {
    pub(super) ctx: Arc<Context>,
    pub(super) spec: RelatedSpec,
    pub(super) provider: Client,
    pub(super) watched: HashMap<(KindKey, Side, Role), Watched>,
    /// Where the bound APIs' objects are (a ClusterBinding with `FromProvider` entries only).
    pub(super) occupancy: Vec<watch::Occupancy>,
    pub(super) recorder: Recorder,
    pub(super) known_namespaces: Mutex<HashSet<(Side, String)>>,
    pub(super) conflicts: Mutex<BTreeSet<TargetKey>>,
    pub(super) swept_unused: Mutex<bool>,
}

/// The kinds of related objects.
pub(super) const KINDS: [RelatedResourceKind; 2] = [
    RelatedResourceKind::Secrets,
    RelatedResourceKind::Configmaps,
];
/// Both sides.
pub(super) const SIDES: [Side; 2] = [Side::Consumer, Side::Provider];
