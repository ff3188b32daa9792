//! The leadership term's caches: exactly one reflector per kind the leader reads (Connections,
//! ClusterBindings, Bindings, consumer CRDs, syncer member Leases, the assignment ConfigMap), each
//! announcing its changes into the one change hub ([`crate::changes`]). The controllers run on these stores
//! (`Controller::for_shared_stream`), so no controller opens a watch of its own; readers that only
//! report read them instead of a request per reconcile; decisions that delete still read fresh.
//!
//! A change is announced once the cache holds it (never from a cache older than the trigger),
//! re-lists included ([`ChangedNames`]).

use std::sync::Arc;

use crate::changes::{Change, Changes, Kind, Topic};
use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_shared::api::{Binding, ClusterBinding, Connection};
use kbind_shared::cache::{ChangedNames, ObjectKey};
use kbind_shared::keys;
use kbind_shared::sync::Locked;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use tokio_util::sync::CancellationToken;

/// What the term's cache shows of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cached<T> {
    /// Outside a leadership term there is no cache to ask: read instead.
    NoTerm,
    /// The cache holds no such object.
    Absent,
    /// The cache's copy.
    Present(T),
}

impl<T> Cached<T> {
    /// What `read` finds in `term`'s caches.
    pub fn from_term(
        term: Option<TermCaches>,
        read: impl FnOnce(&TermCaches) -> Option<T>,
    ) -> Self {
        match term {
            None => Cached::NoTerm,
            Some(caches) => read(&caches).map_or(Cached::Absent, Cached::Present),
        }
    }

    /// The same, borrowing what the copy points to.
    pub fn as_deref(&self) -> Cached<&T::Target>
    where
        T: std::ops::Deref,
    {
        match self {
            Cached::NoTerm => Cached::NoTerm,
            Cached::Absent => Cached::Absent,
            Cached::Present(object) => Cached::Present(object),
        }
    }

    /// The cache's copy, if the cache holds one (outside a term: none).
    pub fn present(self) -> Option<T> {
        match self {
            Cached::Present(object) => Some(object),
            Cached::NoTerm | Cached::Absent => None,
        }
    }
}

/// The term's caches, listed and watched until the term's `stop`.
#[derive(Clone)]
pub struct TermCaches {
    /// Every Connection, without managedFields.
    pub connections: Store<Connection>,
    /// Every ClusterBinding.
    pub cluster_bindings: Store<ClusterBinding>,
    /// Every Binding.
    pub bindings: Store<Binding>,
    /// Every consumer CRD: kbind's managed ones (`core.kbind.io/managed`) whole without
    /// managedFields, what a schema check at rest reads instead of a GET per API per resync; any
    /// other only as its name, labels, annotations and resourceVersion (its schema is not kbind's
    /// business, and costs no memory here). Read them through [`TermCaches::managed_crd`] and
    /// [`TermCaches::managed_crds`].
    crds: Store<CustomResourceDefinition>,
    /// The syncers' membership Leases (in kbind's namespace).
    pub member_leases: Store<Lease>,
    /// The work assignment ConfigMap (in kbind's namespace).
    pub assignment: Store<ConfigMap>,
    /// Where the caches announce their changes.
    changes: Changes,
}

impl TermCaches {
    /// Starts one watch per kind until `stop`, announcing into `changes`; `namespace` is kbind's
    /// own.
    pub fn start(
        client: &Client,
        namespace: &str,
        changes: &Changes,
        stop: &CancellationToken,
    ) -> Self {
        let all = watcher::Config::default;
        let connections = cache(
            (Api::all(client.clone()), all()),
            (Kind::Connection, changes, stop),
            |connection: &mut Connection| connection.metadata.managed_fields = None,
        );
        let cluster_bindings = cache(
            (Api::all(client.clone()), all()),
            (Kind::ClusterBinding, changes, stop),
            |_: &mut ClusterBinding| {},
        );
        let bindings = cache(
            (Api::all(client.clone()), all()),
            (Kind::Binding, changes, stop),
            |_: &mut Binding| {},
        );
        let crds = cache(
            (Api::all(client.clone()), all()),
            (Kind::Crd, changes, stop),
            compact_crd,
        );
        let members = format!("{}={}", keys::SYNCER_MEMBER_LABEL, keys::TRUE);
        let member_leases = cache(
            (
                Api::namespaced(client.clone(), namespace),
                all().labels(&members),
            ),
            (Kind::MemberLease, changes, stop),
            |_: &mut Lease| {},
        );
        let assignment_name = format!(
            "metadata.name={}",
            kbind_shared::shard::ASSIGNMENT_CONFIGMAP
        );
        let assignment = cache(
            (
                Api::namespaced(client.clone(), namespace),
                all().fields(&assignment_name),
            ),
            (Kind::Assignment, changes, stop),
            |_: &mut ConfigMap| {},
        );
        Self {
            connections,
            cluster_bindings,
            bindings,
            crds,
            member_leases,
            assignment,
            changes: changes.clone(),
        }
    }

    /// Waits until every cache has listed.
    pub async fn ready(&self) {
        let _ = self.connections.wait_until_ready().await;
        let _ = self.cluster_bindings.wait_until_ready().await;
        let _ = self.bindings.wait_until_ready().await;
        let _ = self.crds.wait_until_ready().await;
        let _ = self.member_leases.wait_until_ready().await;
        let _ = self.assignment.wait_until_ready().await;
    }

    /// The objects of `kind` in `store` to reconcile: every one at first, then each one a change
    /// names (while the store holds it: a deleted object needs no reconcile), and every one
    /// again after missed changes. What a controller on the shared `store` is triggered by.
    pub fn triggers<K>(
        &self,
        kind: Kind,
        store: Store<K>,
    ) -> impl Stream<Item = Arc<K>> + Send + 'static + use<K>
    where
        K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        // Subscribed before the first snapshot: nothing falls between the two.
        let changes = self.changes.subscribe(&[Topic::Cached(kind)]);
        let first = futures::stream::iter(store.state());
        first.chain(changes.flat_map(move |change| {
            let objects = match change {
                None => store.state(),
                Some(Change::Cached(_, key)) => store.get(&object_ref(&key)).into_iter().collect(),
                Some(_) => Vec::new(),
            };
            futures::stream::iter(objects)
        }))
    }

    /// The managed consumer CRD `name`, if the cache has it.
    pub fn managed_crd(&self, name: &str) -> Option<Arc<CustomResourceDefinition>> {
        self.crds.get(&ObjectRef::new(name)).filter(|c| managed(c))
    }

    /// The core CRD `name` (`*.core.kbind.io`), whole, if the cache has it.
    pub fn core_crd(&self, name: &str) -> Option<Arc<CustomResourceDefinition>> {
        core(name)
            .then(|| self.crds.get(&ObjectRef::new(name)))
            .flatten()
    }

    /// Every managed consumer CRD the cache has.
    pub fn managed_crds(&self) -> Vec<Arc<CustomResourceDefinition>> {
        self.crds
            .state()
            .into_iter()
            .filter(|c| managed(c))
            .collect()
    }
}

/// One reflector of `api` (filtered by its config) until `stop`, each object as `modify` leaves
/// it, announcing each change as `kind` once the cache holds it.
fn cache<K>(
    (api, config): (Api<K>, watcher::Config),
    (kind, changes, stop): (Kind, &Changes, &CancellationToken),
    modify: impl FnMut(&mut K) + Send + 'static,
) -> Store<K>
where
    K: kbind_shared::cache::Cacheable,
{
    kbind_shared::cache::spawn_modified(
        api,
        config,
        stop.clone(),
        modify,
        announce(kind, changes.clone()),
    )
}

/// The reference of the object `key` names.
fn object_ref<K: Resource<DynamicType = ()>>(key: &ObjectKey) -> ObjectRef<K> {
    let reference = ObjectRef::new(&key.name);
    match &key.namespace {
        Some(namespace) => reference.within(namespace),
        None => reference,
    }
}

/// Whether a consumer CRD carries kbind's managed label.
/// Whether the CRD `name` is one of kbind's own API (`*.core.kbind.io`): kept whole, for the
/// check that it keeps every field kbind writes ([`kbind_shared::api::installed`]).
pub fn core(name: &str) -> bool {
    name.strip_suffix(keys::GROUP)
        .is_some_and(|plural| plural.ends_with('.') && plural.len() > 1)
}

fn managed(crd: &CustomResourceDefinition) -> bool {
    crd.labels().get(keys::MANAGED_LABEL).map(String::as_str) == Some(keys::TRUE)
}

/// A CRD as the term's cache keeps it: a managed one without managedFields; any other reduced
/// to its name, labels, annotations and resourceVersion (and deletion mark).
fn compact_crd(crd: &mut CustomResourceDefinition) {
    crd.metadata.managed_fields = None;
    if managed(crd) || core(crd.metadata.name.as_deref().unwrap_or_default()) {
        return;
    }
    let meta = std::mem::take(&mut crd.metadata);
    *crd = CustomResourceDefinition {
        metadata: kube::api::ObjectMeta {
            name: meta.name,
            labels: meta.labels,
            annotations: meta.annotations,
            resource_version: meta.resource_version,
            deletion_timestamp: meta.deletion_timestamp,
            ..Default::default()
        },
        ..Default::default()
    };
}

/// An observer for one cache that sends, once the cache holds it, each object it shows changed.
fn announce<K: Resource>(
    kind: Kind,
    to: Changes,
) -> impl Fn(Result<&watcher::Event<K>, &watcher::Error>) + Send + 'static {
    let changes = std::sync::Mutex::new(ChangedNames::default());
    move |event| {
        if let Ok(event) = event {
            for key in changes.locked().observe(event) {
                to.announce(Change::Cached(kind, key));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn crd(labels: &[(&str, &str)]) -> CustomResourceDefinition {
        let mut crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "widgets.example.org",
                "resourceVersion": "7",
                "annotations": { "core.kbind.io/adopt": "p" },
                "managedFields": [{ "manager": "kubectl" }],
            },
            "spec": {
                "group": "example.org",
                "names": { "kind": "Widget", "plural": "widgets" },
                "scope": "Namespaced",
                "versions": [{ "name": "v1", "served": true, "storage": true }],
            },
        }))
        .unwrap();
        crd.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>(),
        );
        crd
    }

    #[test]
    fn a_managed_crd_is_kept_whole_and_any_other_as_its_metadata() {
        // (labels, keeps the spec)
        let table: [(&[(&str, &str)], bool); 3] = [
            (&[("core.kbind.io/managed", "true")], true),
            (&[("core.kbind.io/managed", "false")], false),
            (&[], false),
        ];
        for (labels, whole) in table {
            let mut kept = crd(labels);
            compact_crd(&mut kept);
            assert_eq!(kept.metadata.managed_fields, None, "{labels:?}");
            assert_eq!(kept.spec.group == "example.org", whole, "{labels:?}");
            // What the triggers and the adopt check read stays.
            assert_eq!(kept.name_any(), "widgets.example.org");
            assert_eq!(kept.resource_version().as_deref(), Some("7"));
            assert_eq!(
                kept.annotations()
                    .get("core.kbind.io/adopt")
                    .map(String::as_str),
                Some("p")
            );
            assert_eq!(managed(&kept), whole, "{labels:?}");
        }
    }

    #[test]
    fn a_key_names_a_namespaced_or_a_cluster_scoped_object() {
        let namespaced = ObjectKey {
            namespace: Some("team-a".into()),
            name: "b".into(),
        };
        let reference: ObjectRef<Binding> = object_ref(&namespaced);
        assert_eq!(reference, ObjectRef::new("b").within("team-a"));
        let cluster = ObjectKey {
            namespace: None,
            name: "c".into(),
        };
        let reference: ObjectRef<Connection> = object_ref(&cluster);
        assert_eq!(reference, ObjectRef::new("c"));
    }
}
