//! What every part of a syncer replica shares: the consumer client, binding caches, metrics.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kbind_shared::api::{
    Binding, BindingSpec, BindingStatus, ClusterBinding, Connection, ConnectionAccess,
};
use kbind_shared::metrics::Metrics;
use kbind_shared::resolve::BindingObject;
use kbind_shared::resolve::{self, Resolution};
use kbind_shared::sync::Locked;
use kube::Resource;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::bindings::{Index, Touched, WatchScope};
use crate::membership::Membership;

/// Bounds on what a provider can make this replica write to the consumer (#32.2).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The largest provider status copied down, in bytes (`--max-status-bytes`).
    pub max_status_bytes: usize,
    /// The least time between two status writes to one object (`--status-min-interval`).
    pub status_min_interval: Duration,
    /// What one related-resources entry copies at most.
    pub related: crate::related::plan::CopyLimits,
}

/// How this replica works, from its flags.
pub struct Settings {
    /// Backstop resync per object.
    pub resync_interval: Duration,
    /// Concurrent object syncs per worker.
    pub workers: u16,
    /// Where provider kubeconfig Secrets may live (`--provider-secret-namespaces`).
    pub provider_secrets: kbind_shared::credential::SecretPolicy,
    /// What a provider can make it write.
    pub limits: Limits,
    /// The most Bindings served per namespace (`--max-bindings-per-namespace`).
    pub max_bindings_per_namespace: u32,
}

/// Shared by the workers of this replica.
pub struct Context {
    /// The consumer cluster.
    pub client: Client,
    /// Metrics.
    pub metrics: Metrics,
    /// Event reporter.
    pub reporter: Reporter,
    /// Backstop resync per object.
    pub resync_interval: Duration,
    /// Concurrent object syncs per worker.
    pub workers: u16,
    /// This replica's membership (and its write fence).
    pub membership: Arc<Membership>,
    /// Where provider kubeconfig Secrets may live (`--provider-secret-namespaces`).
    pub provider_secrets: kbind_shared::credential::SecretPolicy,
    /// What a provider can make it write.
    pub limits: Limits,
    cluster_bindings: Store<ClusterBinding>,
    bindings: Store<Binding>,
    /// The served bindings by API and namespace: what every lookup reads.
    index: Arc<std::sync::Mutex<Index>>,
    connections: Store<Connection>,
    connection_changes: Arc<tokio::sync::Notify>,
    binding_changes: broadcast::Sender<Touched>,
    /// One provider client per Connection and credential digest, shared by its workers (one
    /// connection pool and TLS setup per provider, not per API).
    provider_clients: std::sync::Mutex<std::collections::HashMap<String, (String, Client)>>,
    /// Objects synced, in conflict and paused per (API, route Connection), as each running
    /// worker last counted them: the per-API gauges are their sums (#36: an API's routes may
    /// run side by side in one replica).
    object_counts: std::sync::Mutex<std::collections::BTreeMap<(String, String), [usize; 3]>>,
}

impl Context {
    /// Starts the binding caches (reflectors) and returns once both have listed.
    pub async fn start(
        client: Client,
        metrics: Metrics,
        reporter: Reporter,
        membership: Arc<Membership>,
        Settings {
            resync_interval,
            workers,
            provider_secrets,
            limits,
            max_bindings_per_namespace,
        }: Settings,
    ) -> Self {
        let (binding_changes, _) = broadcast::channel(1024);
        let index = Arc::new(std::sync::Mutex::new(Index::new(
            max_bindings_per_namespace,
        )));
        let feed = Feed {
            index: index.clone(),
            changes: binding_changes.clone(),
            metrics: metrics.clone(),
        };
        // kbind's own kinds: their watches start again when their CRD's schema changes (an API
        // server stops feeding the old ones for up to two request timeouts meanwhile).
        let core =
            kbind_shared::cache::core_schema_changes(client.clone(), CancellationToken::new());
        let cluster_bindings = indexed_cache::<ClusterBinding>(
            Api::all(client.clone()),
            feed.clone(),
            index_cluster,
            core.clone(),
        );
        let bindings = indexed_cache::<Binding>(
            Api::all(client.clone()),
            feed.clone(),
            index_binding,
            core.clone(),
        );
        // A Connection's access rules decide what its bindings may do: a change of them is a
        // binding change too (every worker rescans its objects); any other Connection change only
        // wakes whoever waits on `connection_changes` (which workers should run).
        let connection_changes = Arc::new(tokio::sync::Notify::new());
        let connections = {
            let (changes, woken) = (binding_changes.clone(), connection_changes.clone());
            let access = std::sync::Mutex::new(std::collections::HashMap::new());
            let (reader, writer) = kube::runtime::reflector::store();
            kbind_shared::cache::observe_restartable(
                writer,
                Api::<Connection>::all(client.clone()),
                watcher::Config::default(),
                CancellationToken::new(),
                core,
                |_| {},
                move |event| {
                    let Ok(event) = event else { return };
                    woken.notify_one();
                    if access_changed(&mut access.locked(), event) {
                        let _ = changes.send(Touched::Everything);
                    }
                },
            );
            reader
        };
        let _ = cluster_bindings.wait_until_ready().await;
        let _ = bindings.wait_until_ready().await;
        let _ = connections.wait_until_ready().await;
        // The index's re-list may run just after the caches report ready: fill it here too.
        feed.relist(|index| index.relist_cluster(cluster_bindings.state()));
        feed.relist(|index| index.relist_bindings(bindings.state()));
        Self {
            client,
            metrics,
            reporter,
            resync_interval,
            workers,
            membership,
            provider_secrets,
            limits,
            cluster_bindings,
            bindings,
            index,
            connections,
            connection_changes,
            binding_changes,
            provider_clients: Default::default(),
            object_counts: Default::default(),
        }
    }

    /// The provider client for `connection`'s verified `kubeconfig` (whose digest is `digest`),
    /// its requests counted in `kbind_api_requests_total`; `None` (logged, naming `who`) when it
    /// cannot be built. Workers of one Connection share it; a new digest (a rotated credential)
    /// builds a new one in its place.
    pub async fn provider_client(
        &self,
        kubeconfig: &kbind_shared::kubeconfig::InlineKubeconfig,
        digest: &str,
        connection: &str,
        who: &str,
    ) -> Option<Client> {
        use kbind_shared::sync::Locked;
        if let Some((known, client)) = self.provider_clients.locked().get(connection)
            && known == digest
        {
            return Some(client.clone());
        }
        match kubeconfig
            .counted_client(connection, Some(&self.metrics.api_requests_total))
            .await
        {
            Ok(client) => {
                self.provider_clients
                    .locked()
                    .insert(connection.to_owned(), (digest.to_owned(), client.clone()));
                Some(client)
            }
            Err(e) => {
                tracing::warn!(worker = %who, error = %e, "cannot build the provider client");
                None
            }
        }
    }

    /// Records the objects synced, in conflict and paused that the worker of `api` on the route
    /// of `connection` counts now (`None`: it stopped), and sets the per-route gauges and the
    /// per-API ones (summed over the routes running here).
    pub fn set_object_counts(&self, api: &str, connection: &str, counts: Option<[usize; 3]>) {
        use kbind_shared::sync::Locked;
        const STATES: [&str; 3] = ["synced", "conflict", "paused"];
        let mut all = self.object_counts.locked();
        let key = (api.to_owned(), connection.to_owned());
        match counts {
            Some(counts) => {
                all.insert(key, counts);
                for (state, count) in STATES.iter().zip(counts) {
                    self.metrics
                        .route_objects
                        .with_label_values(&[connection, api, state])
                        .set(count as f64);
                }
            }
            None => {
                all.remove(&key);
                for state in STATES {
                    let _ = self
                        .metrics
                        .route_objects
                        .remove_label_values(&[connection, api, state]);
                }
            }
        }
        let routes: Vec<[usize; 3]> = all
            .iter()
            .filter(|((a, _), _)| a == api)
            .map(|(_, c)| *c)
            .collect();
        let gauges = [
            &self.metrics.synced_objects,
            &self.metrics.conflicts,
            &self.metrics.paused_objects,
        ];
        for (i, gauge) in gauges.into_iter().enumerate() {
            if routes.is_empty() {
                let _ = gauge.remove_label_values(&[api]);
            } else {
                gauge
                    .with_label_values(&[api])
                    .set(routes.iter().map(|c| c[i]).sum::<usize>() as f64);
            }
        }
    }

    /// Keeps only the provider clients of the Connections `in_use` says yes to.
    pub fn retain_provider_clients(&self, in_use: impl Fn(&str) -> bool) {
        use kbind_shared::sync::Locked;
        self.provider_clients
            .locked()
            .retain(|connection, _| in_use(connection));
    }

    /// RES over the binding index: the served binding of `connection` (the one serving `api`
    /// here) covering an instance of `api` in `namespace`, within what the Connection's access
    /// rules allow (checked here, not trusted to the binding's status).
    pub fn resolve(
        &self,
        connection: &str,
        api: &str,
        namespace: Option<&str>,
    ) -> Option<Resolution> {
        let serving = self.connection(connection);
        self.index.locked().resolve(
            connection,
            api,
            namespace,
            serving.as_ref().map(|c| &c.spec.access),
        )
    }

    /// The Connections other than `served_by` that served bindings offer as routes for `api`
    /// ([`resolve::route_connections`]): none, and the API is not routed.
    pub fn route_connections(
        &self,
        api: &str,
        served_by: &str,
    ) -> std::collections::BTreeSet<String> {
        self.index.locked().route_connections(api, served_by)
    }

    /// Where `api`'s instances are read (#54): cluster-wide while a ClusterBinding lists it,
    /// else in the namespaces whose Bindings do ([`WatchScope`]).
    pub fn watch_scope(&self, api: &str) -> WatchScope {
        self.index.locked().watch_scope(api)
    }

    /// Where served bindings of `connection` import `api`'s provider objects (#54).
    pub fn imports(&self, connection: &str, api: &str) -> Vec<crate::bindings::ImportRule> {
        self.index.locked().imports(connection, api)
    }

    /// Whether `api` is routed: served bindings offer a route besides `served_by` (as it stands
    /// now — a running worker reads it live, #50.3).
    pub fn routed(&self, api: &str, served_by: &str) -> bool {
        self.index.locked().routed(api, served_by)
    }

    /// The offers routing weighs for an instance of `api` in `namespace` ([`resolve::offers`]),
    /// the Connections' pinned providers and access rules from the cache.
    pub fn route_offers(
        &self,
        api: &str,
        namespace: Option<&str>,
    ) -> Vec<kbind_shared::routing::Offer> {
        self.index
            .locked()
            .offers(api, namespace, |name| self.pinned_provider(name))
    }

    /// The cluster UID a Connection is pinned to, and its access rules (`None` while unknown).
    pub fn pinned_provider(&self, name: &str) -> Option<(String, ConnectionAccess)> {
        let connection = self.connection(name)?;
        let cluster = connection.status.as_ref()?.remote_cluster_uid.clone();
        (!cluster.is_empty()).then(|| (cluster, connection.spec.access.clone()))
    }

    /// Where served bindings ask for the provider's Events about `api`'s objects served through
    /// `connection` ([`resolve::provider_events_scope`]).
    pub fn provider_events_scope(&self, connection: &str, api: &str) -> resolve::EventsScope {
        self.index.locked().provider_events_scope(connection, api)
    }

    /// The Connection `name`, from the cache.
    pub fn connection(&self, name: &str) -> Option<Arc<Connection>> {
        self.connections.get(&ObjectRef::new(name))
    }

    /// Every Connection's cache (watched once per replica).
    pub fn connections(&self) -> &Store<Connection> {
        &self.connections
    }

    /// Notified on every Connection change (readiness, credentials, access, …).
    pub fn connection_changes(&self) -> Arc<tokio::sync::Notify> {
        self.connection_changes.clone()
    }

    /// A binding by namespace (`None` for a ClusterBinding) and name, from the caches.
    pub fn binding(&self, namespace: Option<&str>, name: &str) -> Option<AnyBinding> {
        match namespace {
            None => self
                .cluster_bindings
                .get(&ObjectRef::new(name))
                .map(AnyBinding::Cluster),
            Some(namespace) => self
                .bindings
                .get(&ObjectRef::new(name).within(namespace))
                .map(AnyBinding::Namespaced),
        }
    }

    /// A stream of what binding changes alter (SCTL-6 binding triggers); a change of a binding
    /// past its namespace's cap, or one no lookup sees, yields nothing.
    pub fn binding_changes(&self) -> impl futures::Stream<Item = Touched> + Send + 'static + use<> {
        let receiver = self.binding_changes.subscribe();
        // A lagged receiver missed some changes: they may have touched anything.
        futures::stream::unfold(receiver, |mut receiver| async move {
            match receiver.recv().await {
                Ok(touched) => Some((touched, receiver)),
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    Some((Touched::Everything, receiver))
                }
                Err(broadcast::error::RecvError::Closed) => None,
            }
        })
    }
}

/// Whether `event` changes the access rules `known` remembers per Connection (and remembers the
/// new ones): a re-list, a Connection gone, or its `spec.access` edited.
fn access_changed(
    known: &mut std::collections::HashMap<String, kbind_shared::api::ConnectionAccess>,
    event: &watcher::Event<Connection>,
) -> bool {
    use kube::ResourceExt;
    match event {
        watcher::Event::Apply(c) | watcher::Event::InitApply(c) => {
            let access = c.spec.access.clone();
            known.insert(c.name_any(), access.clone()) != Some(access)
        }
        watcher::Event::Delete(c) => known.remove(&c.name_any()).is_some(),
        watcher::Event::Init => false,
        watcher::Event::InitDone => true,
    }
}

/// Where binding events go: the index, the announcements of what they altered, and the gauge of
/// Bindings past the cap.
#[derive(Clone)]
struct Feed {
    index: Arc<std::sync::Mutex<Index>>,
    changes: broadcast::Sender<Touched>,
    metrics: Metrics,
}

impl Feed {
    /// Applies one change to the index and announces what it altered.
    fn change(&self, change: impl FnOnce(&mut Index) -> Option<Touched>, namespace: Option<&str>) {
        let (touched, past) = {
            let mut index = self.index.locked();
            let touched = change(&mut index);
            (touched, namespace.map(|ns| index.past_cap_in(ns)))
        };
        if let (Some(namespace), Some(past)) = (namespace, past) {
            let gauge = &self.metrics.bindings_past_cap;
            if past == 0 {
                let _ = gauge.remove_label_values(&[namespace]);
            } else {
                gauge.with_label_values(&[namespace]).set(past as f64);
            }
        }
        if let Some(touched) = touched {
            let _ = self.changes.send(touched);
        }
    }

    /// Applies a re-list and announces it.
    fn relist(&self, relist: impl FnOnce(&mut Index) -> Touched) {
        let past = {
            let mut index = self.index.locked();
            relist(&mut index);
            index.past_cap()
        };
        let gauge = &self.metrics.bindings_past_cap;
        gauge.reset();
        for (namespace, count) in past {
            gauge.with_label_values(&[&namespace]).set(count as f64);
        }
        let _ = self.changes.send(Touched::Everything);
    }
}

/// A cache of all `K` whose events `apply` feeds to the binding index once the cache holds them.
fn indexed_cache<K>(
    api: Api<K>,
    feed: Feed,
    apply: fn(&Feed, &Store<K>, &watcher::Event<K>),
    restart: tokio::sync::watch::Receiver<u64>,
) -> Store<K>
where
    K: kbind_shared::cache::Cacheable,
{
    let (reader, writer) = kube::runtime::reflector::store();
    let store = reader.clone();
    kbind_shared::cache::observe_restartable(
        writer,
        api,
        watcher::Config::default(),
        CancellationToken::new(),
        restart,
        |_| {},
        move |event| {
            if let Ok(event) = event {
                apply(&feed, &store, event);
            }
        },
    );
    reader
}

/// A ClusterBinding event into the index (the store's copy: no second one is kept).
fn index_cluster(
    feed: &Feed,
    store: &Store<ClusterBinding>,
    event: &watcher::Event<ClusterBinding>,
) {
    use kube::ResourceExt;
    match event {
        watcher::Event::Apply(b) => {
            let held = store
                .get(&ObjectRef::from_obj(b))
                .unwrap_or_else(|| Arc::new(b.clone()));
            feed.change(|index| index.apply_cluster(held), None);
        }
        watcher::Event::Delete(b) => feed.change(|index| index.remove_cluster(&b.name_any()), None),
        watcher::Event::InitDone => feed.relist(|index| index.relist_cluster(store.state())),
        watcher::Event::Init | watcher::Event::InitApply(_) => {}
    }
}

/// A Binding event into the index.
fn index_binding(feed: &Feed, store: &Store<Binding>, event: &watcher::Event<Binding>) {
    use kube::ResourceExt;
    match event {
        watcher::Event::Apply(b) => {
            let held = store
                .get(&ObjectRef::from_obj(b))
                .unwrap_or_else(|| Arc::new(b.clone()));
            let namespace = b.namespace().unwrap_or_default();
            feed.change(|index| index.apply_binding(held), Some(&namespace));
        }
        watcher::Event::Delete(b) => {
            let namespace = b.namespace().unwrap_or_default();
            feed.change(
                |index| index.remove_binding(&namespace, &b.name_any()),
                Some(&namespace),
            );
        }
        watcher::Event::InitDone => feed.relist(|index| index.relist_bindings(store.state())),
        watcher::Event::Init | watcher::Event::InitApply(_) => {}
    }
}

/// A ClusterBinding or a Binding, from the caches.
#[derive(Debug, Clone)]
pub enum AnyBinding {
    /// A ClusterBinding.
    Cluster(Arc<ClusterBinding>),
    /// A Binding.
    Namespaced(Arc<Binding>),
}

impl AnyBinding {
    /// The shared spec.
    pub fn spec(&self) -> &BindingSpec {
        match self {
            AnyBinding::Cluster(b) => b.binding_spec(),
            AnyBinding::Namespaced(b) => b.binding_spec(),
        }
    }

    /// The shared status.
    pub fn status(&self) -> Option<&BindingStatus> {
        match self {
            AnyBinding::Cluster(b) => b.binding_status(),
            AnyBinding::Namespaced(b) => b.binding_status(),
        }
    }

    /// Metadata.
    pub fn meta(&self) -> &kube::api::ObjectMeta {
        match self {
            AnyBinding::Cluster(b) => b.meta(),
            AnyBinding::Namespaced(b) => b.meta(),
        }
    }

    /// A reference for Events.
    pub fn object_ref(&self) -> ObjectReference {
        match self {
            AnyBinding::Cluster(b) => b.object_ref(&()),
            AnyBinding::Namespaced(b) => b.object_ref(&()),
        }
    }

    /// `ClusterBinding` or `Binding`.
    pub fn kind(&self) -> &'static str {
        match self {
            AnyBinding::Cluster(_) => "ClusterBinding",
            AnyBinding::Namespaced(_) => "Binding",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kbind_shared::api::ConnectionSpec;

    #[test]
    fn only_an_access_change_is_a_binding_change() {
        let connection = |allowed: Option<&str>| {
            let mut c = Connection::new("p", ConnectionSpec::for_secret("kbind", "p"));
            c.spec.access.binding_namespaces = allowed.map(|ns| vec![ns.to_owned()]);
            c
        };
        let mut known = std::collections::HashMap::new();
        assert!(access_changed(
            &mut known,
            &watcher::Event::Apply(connection(None))
        ));
        // A status change (readiness, exports, heartbeat…) leaves the access as it was.
        let mut ready = connection(None);
        ready.status = Some(Default::default());
        assert!(!access_changed(&mut known, &watcher::Event::Apply(ready)));
        assert!(access_changed(
            &mut known,
            &watcher::Event::Apply(connection(Some("a")))
        ));
        assert!(!access_changed(
            &mut known,
            &watcher::Event::InitApply(connection(Some("a")))
        ));
        assert!(access_changed(&mut known, &watcher::Event::InitDone));
        assert!(access_changed(
            &mut known,
            &watcher::Event::Delete(connection(Some("a")))
        ));
        assert!(!access_changed(
            &mut known,
            &watcher::Event::Delete(connection(Some("a")))
        ));
    }
}
