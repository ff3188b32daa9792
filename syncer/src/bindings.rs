//! The bindings as the syncer looks them up: indexed by API and namespace, updated on each watch
//! event (never scanned per object or per second), with a namespace's Bindings past the cap
//! ([`kbind_shared::binding_cap`]) left out — a namespace user's flood of Bindings costs one map
//! update per event and wakes nobody.
//!
//! Plain data, no I/O: the context feeds it the watches' events and hands each [`Touched`] to
//! whoever waits on binding changes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use kbind_shared::api::{Binding, ClusterBinding, ConnectionAccess};
use kbind_shared::binding_cap::Seniority;
use kbind_shared::resolve::{self, BindingObject, Resolution};
use kube::ResourceExt;

mod scope;

use scope::Scopes;
pub use scope::WatchScope;

/// What a binding change may alter: the lookups of some APIs in one namespace (or cluster-wide),
/// or everything (a re-list, a Connection's access rules).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Touched {
    /// Every lookup.
    Everything,
    /// The lookups of these APIs for instances in `namespace` (`None`: in every namespace — a
    /// ClusterBinding changed).
    Apis {
        /// The APIs (`<plural>.<group>`) the changed bindings list or hold.
        apis: BTreeSet<String>,
        /// Where their instances live.
        namespace: Option<String>,
    },
}

impl Touched {
    /// Whether it may alter what bindings say in `namespace` (`None`: cluster-wide — only a
    /// ClusterBinding's change, or everything, does).
    pub fn reaches(&self, namespace: Option<&str>) -> bool {
        match self {
            Touched::Everything
            | Touched::Apis {
                namespace: None, ..
            } => true,
            Touched::Apis {
                namespace: Some(touched),
                ..
            } => namespace.is_some_and(|ns| ns == touched),
        }
    }

    /// Whether it may alter any lookup of `api`.
    pub fn concerns_api(&self, api: &str) -> bool {
        match self {
            Touched::Everything => true,
            Touched::Apis { apis, .. } => apis.contains(api),
        }
    }
}

/// Which instances of one API a burst of [`Touched`] may concern.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Reach {
    /// None of them.
    #[default]
    Nothing,
    /// Those in these namespaces.
    Namespaces(BTreeSet<String>),
    /// All of them.
    All,
}

impl Reach {
    /// What `burst` may concern of `api`.
    pub fn of<'a>(api: &str, burst: impl IntoIterator<Item = &'a Touched>) -> Self {
        let mut reach = Reach::Nothing;
        for touched in burst {
            match touched {
                Touched::Apis { apis, .. } if !apis.contains(api) => {}
                Touched::Apis {
                    namespace: Some(namespace),
                    ..
                } => match &mut reach {
                    Reach::All => {}
                    Reach::Namespaces(namespaces) => {
                        namespaces.insert(namespace.clone());
                    }
                    Reach::Nothing => reach = Reach::Namespaces([namespace.clone()].into()),
                },
                Touched::Apis {
                    namespace: None, ..
                }
                | Touched::Everything => return Reach::All,
            }
        }
        reach
    }

    /// Whether an instance in `namespace` is within reach.
    pub fn covers(&self, namespace: Option<&str>) -> bool {
        match self {
            Reach::Nothing => false,
            Reach::All => true,
            Reach::Namespaces(namespaces) => namespace.is_some_and(|ns| namespaces.contains(ns)),
        }
    }
}

/// A served binding's ask to import an API's provider objects (observe-first import, #54).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportRule {
    /// The Binding's namespace; `None`: a ClusterBinding's, every namespace.
    pub namespace: Option<String>,
    /// The binding's name.
    pub binding: String,
    /// At most this many objects are imported under it.
    pub limit: usize,
}

/// The bindings of one API that are served (not being deleted; within the cap).
#[derive(Debug, Default)]
struct ApiBindings {
    cluster: BTreeMap<String, Arc<ClusterBinding>>,
    namespaced: HashMap<String, BTreeMap<String, Arc<Binding>>>,
}

/// The index.
#[derive(Debug)]
pub struct Index {
    cap: u32,
    cluster: BTreeMap<String, Arc<ClusterBinding>>,
    /// Every Binding not being deleted, per namespace, oldest first.
    queues: HashMap<String, BTreeMap<Seniority, Arc<Binding>>>,
    /// Where each Binding of `queues` stands (namespace, name → place).
    places: HashMap<(String, String), Seniority>,
    by_api: HashMap<String, ApiBindings>,
    /// (API, serving Connection) → route Connection → how many served bindings offer it.
    routes: HashMap<(String, String), BTreeMap<String, usize>>,
    /// Where each API's instances are read ([`WatchScope`]): every binding, served or not.
    scopes: Scopes,
}

impl Index {
    /// An empty index serving at most `cap` Bindings per namespace.
    pub fn new(cap: u32) -> Self {
        Self {
            cap,
            cluster: BTreeMap::new(),
            queues: HashMap::new(),
            places: HashMap::new(),
            by_api: HashMap::new(),
            routes: HashMap::new(),
            scopes: Scopes::default(),
        }
    }

    /// Where `api`'s instances are read: cluster-wide while a ClusterBinding lists it, else in
    /// the namespaces whose Bindings do ([`WatchScope`]).
    pub fn watch_scope(&self, api: &str) -> WatchScope {
        self.scopes.of(api)
    }

    /// A ClusterBinding added or changed.
    pub fn apply_cluster(&mut self, binding: Arc<ClusterBinding>) -> Option<Touched> {
        let scoped = self
            .scopes
            .apply(None, &binding.name_any(), binding.as_ref());
        with_scope(self.serve_cluster(binding), scoped, None)
    }

    /// A ClusterBinding gone.
    pub fn remove_cluster(&mut self, name: &str) -> Option<Touched> {
        let scoped = self.scopes.remove(None, name);
        with_scope(self.unserve_cluster(name), scoped, None)
    }

    fn serve_cluster(&mut self, binding: Arc<ClusterBinding>) -> Option<Touched> {
        let name = binding.name_any();
        if binding.metadata.deletion_timestamp.is_some() {
            return self.unserve_cluster(&name);
        }
        let old = self.cluster.insert(name, binding.clone());
        let mut apis = BTreeSet::new();
        if let Some(old) = &old {
            self.unindex_cluster(old, &mut apis);
        }
        self.index_cluster(&binding, &mut apis);
        // An equal version (a label, an annotation) alters no lookup.
        if old.is_some_and(|old| same(old.as_ref(), binding.as_ref())) {
            return None;
        }
        Some(Touched::Apis {
            apis,
            namespace: None,
        })
    }

    fn unserve_cluster(&mut self, name: &str) -> Option<Touched> {
        let old = self.cluster.remove(name)?;
        let mut apis = BTreeSet::new();
        self.unindex_cluster(&old, &mut apis);
        Some(Touched::Apis {
            apis,
            namespace: None,
        })
    }

    /// A Binding added or changed.
    pub fn apply_binding(&mut self, binding: Arc<Binding>) -> Option<Touched> {
        let namespace = binding.namespace().unwrap_or_default();
        let name = binding.name_any();
        let scoped = self.scopes.apply(Some(&namespace), &name, binding.as_ref());
        let place = Seniority::of(&binding.metadata);
        let touched = self.change_namespace(&namespace, |index| {
            let old = index.take_binding(&namespace, &name);
            if let Some(place) = place {
                index
                    .places
                    .insert((namespace.clone(), name.clone()), place.clone());
                index
                    .queues
                    .entry(namespace.clone())
                    .or_default()
                    .insert(place, binding.clone());
            }
            old
        });
        with_scope(touched, scoped, Some(&namespace))
    }

    /// A Binding gone.
    pub fn remove_binding(&mut self, namespace: &str, name: &str) -> Option<Touched> {
        let scoped = self.scopes.remove(Some(namespace), name);
        let touched = self.change_namespace(namespace, |index| index.take_binding(namespace, name));
        with_scope(touched, scoped, Some(namespace))
    }

    /// A re-list of every ClusterBinding: the index holds exactly `all`.
    pub fn relist_cluster(&mut self, all: Vec<Arc<ClusterBinding>>) -> Touched {
        self.scopes.relist(
            false,
            all.iter()
                .map(|b| (None, b.name_any(), scope::listed(b.as_ref()))),
        );
        let old: Vec<String> = self.cluster.keys().cloned().collect();
        for name in old {
            self.unserve_cluster(&name);
        }
        for binding in all {
            self.serve_cluster(binding);
        }
        Touched::Everything
    }

    /// A re-list of every Binding: the index holds exactly `all` (built at once: a re-list of a
    /// namespace's flood costs one insertion per Binding, not a re-index each).
    pub fn relist_bindings(&mut self, all: Vec<Arc<Binding>>) -> Touched {
        self.scopes.relist(
            true,
            all.iter()
                .map(|b| (b.namespace(), b.name_any(), scope::listed(b.as_ref()))),
        );
        let served: Vec<Arc<Binding>> = self
            .queues
            .keys()
            .cloned()
            .collect::<Vec<_>>()
            .iter()
            .flat_map(|ns| self.served(ns).into_values())
            .collect();
        let mut apis = BTreeSet::new();
        for binding in &served {
            self.unindex_binding(binding, &mut apis);
        }
        self.queues.clear();
        self.places.clear();
        for binding in all {
            let Some(place) = Seniority::of(&binding.metadata) else {
                continue;
            };
            let namespace = binding.namespace().unwrap_or_default();
            self.places
                .insert((namespace.clone(), binding.name_any()), place.clone());
            self.queues
                .entry(namespace)
                .or_default()
                .insert(place, binding);
        }
        let namespaces: Vec<String> = self.queues.keys().cloned().collect();
        for namespace in namespaces {
            for binding in self.served(&namespace).into_values() {
                self.index_binding(&binding, &mut apis);
            }
        }
        Touched::Everything
    }

    /// RES over the served bindings: the binding of `connection` covering an instance of `api` in
    /// `namespace` ([`resolve::resolve_served_by`]), within `access` (the serving Connection's
    /// rules; `None` while it is not known).
    pub fn resolve(
        &self,
        connection: &str,
        api: &str,
        namespace: Option<&str>,
        access: Option<&ConnectionAccess>,
    ) -> Option<Resolution> {
        let (cluster, namespaced) = self.of(api, namespace);
        let found = resolve::resolve_served_by(connection, api, namespace, cluster, namespaced)?;
        Some(resolve::within_access(found, access))
    }

    /// Routing's offers ([`resolve::offers`]) for an instance of `api` in `namespace`: the served
    /// ClusterBindings and its namespace's served Bindings — the only ones that can cover it.
    pub fn offers(
        &self,
        api: &str,
        namespace: Option<&str>,
        connection_of: impl Fn(&str) -> Option<(String, ConnectionAccess)>,
    ) -> Vec<kbind_shared::routing::Offer> {
        let (cluster, namespaced) = self.of(api, namespace);
        resolve::offers(api, cluster, namespaced, connection_of)
    }

    /// The Connections other than `served_by` that served bindings offer as routes for `api`
    /// ([`resolve::route_connections`], kept counted as bindings change).
    pub fn route_connections(&self, api: &str, served_by: &str) -> BTreeSet<String> {
        self.routes
            .get(&(api.to_owned(), served_by.to_owned()))
            .map(|routes| routes.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Whether served bindings offer any route for `api` besides `served_by`.
    pub fn routed(&self, api: &str, served_by: &str) -> bool {
        self.routes
            .get(&(api.to_owned(), served_by.to_owned()))
            .is_some_and(|routes| !routes.is_empty())
    }

    /// Where served bindings ask for provider Events ([`resolve::provider_events_scope`]).
    pub fn provider_events_scope(&self, connection: &str, api: &str) -> resolve::EventsScope {
        let Some(of_api) = self.by_api.get(api) else {
            return resolve::EventsScope::Nowhere;
        };
        resolve::provider_events_scope(
            connection,
            api,
            of_api.cluster.values().map(Arc::as_ref),
            of_api
                .namespaced
                .values()
                .flat_map(|bindings| bindings.values().map(Arc::as_ref)),
        )
    }

    /// Where served bindings of `connection` ask to import `api`'s provider objects
    /// (observe-first import, #54): one rule per binding, its namespace's (`None`: a
    /// ClusterBinding, every namespace). Looked up when bindings change, never per object.
    pub fn imports(&self, connection: &str, api: &str) -> Vec<ImportRule> {
        let Some(of_api) = self.by_api.get(api) else {
            return Vec::new();
        };
        let rule =
            |namespace: Option<&str>, name: String, spec: &kbind_shared::api::BindingSpec| {
                let import = spec.import.as_ref()?;
                (spec.connection_ref.name == connection).then(|| ImportRule {
                    namespace: namespace.map(str::to_owned),
                    binding: name,
                    limit: import.limit as usize,
                })
            };
        let cluster = of_api
            .cluster
            .values()
            .filter_map(|b| rule(None, b.name_any(), &b.spec.binding));
        let namespaced = of_api.namespaced.iter().flat_map(|(namespace, bindings)| {
            bindings
                .values()
                .filter_map(|b| rule(Some(namespace), b.name_any(), &b.spec))
        });
        cluster.chain(namespaced).collect()
    }

    /// The namespaces with Bindings past the cap, and how many each.
    pub fn past_cap(&self) -> BTreeMap<String, usize> {
        self.queues
            .iter()
            .filter(|(_, queue)| queue.len() > self.cap as usize)
            .map(|(namespace, queue)| (namespace.clone(), queue.len() - self.cap as usize))
            .collect()
    }

    /// How many Bindings of `namespace` are past the cap.
    pub fn past_cap_in(&self, namespace: &str) -> usize {
        self.queues
            .get(namespace)
            .map_or(0, |queue| queue.len().saturating_sub(self.cap as usize))
    }

    fn of<'a>(
        &'a self,
        api: &str,
        namespace: Option<&str>,
    ) -> (
        impl Iterator<Item = &'a ClusterBinding> + 'a,
        impl Iterator<Item = &'a Binding> + 'a,
    ) {
        let of_api = self.by_api.get(api);
        let cluster = of_api
            .into_iter()
            .flat_map(|a| a.cluster.values().map(Arc::as_ref));
        let namespaced = of_api
            .zip(namespace)
            .and_then(|(a, ns)| a.namespaced.get(ns))
            .into_iter()
            .flat_map(|bindings| bindings.values().map(Arc::as_ref));
        (cluster, namespaced)
    }

    /// Runs `change` on `namespace`'s queue and re-indexes what it altered among the served:
    /// whoever entered or left the first `cap`, and the changed binding itself (`change` returns
    /// its old version).
    fn change_namespace(
        &mut self,
        namespace: &str,
        change: impl FnOnce(&mut Self) -> Option<Arc<Binding>>,
    ) -> Option<Touched> {
        let before = self.served(namespace);
        let old = change(self);
        let after = self.served(namespace);
        let mut apis = BTreeSet::new();
        let mut altered = false;
        for (name, binding) in &before {
            if after.get(name).is_none_or(|now| !Arc::ptr_eq(now, binding)) {
                self.unindex_binding(binding, &mut apis);
                altered = true;
            }
        }
        for (name, binding) in &after {
            if before
                .get(name)
                .is_none_or(|was| !Arc::ptr_eq(was, binding))
            {
                self.index_binding(binding, &mut apis);
                altered = true;
            }
        }
        // A served binding replaced by an equal one (a label, an annotation) alters no lookup.
        if let Some(old) = &old
            && let (Some(was), Some(now)) =
                (before.get(&old.name_any()), after.get(&old.name_any()))
            && same(was.as_ref(), now.as_ref())
        {
            return None;
        }
        altered.then_some(Touched::Apis {
            apis,
            namespace: Some(namespace.to_owned()),
        })
    }

    /// The served Bindings of `namespace` (the first `cap` of its queue), by name.
    fn served(&self, namespace: &str) -> BTreeMap<String, Arc<Binding>> {
        self.queues
            .get(namespace)
            .into_iter()
            .flat_map(|queue| queue.iter().take(self.cap as usize))
            .map(|(place, binding)| (place.name().to_owned(), binding.clone()))
            .collect()
    }

    fn take_binding(&mut self, namespace: &str, name: &str) -> Option<Arc<Binding>> {
        let place = self
            .places
            .remove(&(namespace.to_owned(), name.to_owned()))?;
        let queue = self.queues.get_mut(namespace)?;
        let old = queue.remove(&place);
        if queue.is_empty() {
            self.queues.remove(namespace);
        }
        old
    }

    fn index_cluster(&mut self, binding: &Arc<ClusterBinding>, apis: &mut BTreeSet<String>) {
        for api in listed(binding.as_ref()) {
            self.by_api
                .entry(api.clone())
                .or_default()
                .cluster
                .insert(binding.name_any(), binding.clone());
            apis.insert(api);
        }
        self.count_routes(binding.as_ref(), true, apis);
    }

    fn unindex_cluster(&mut self, binding: &ClusterBinding, apis: &mut BTreeSet<String>) {
        for api in listed(binding) {
            if let Some(of_api) = self.by_api.get_mut(&api) {
                of_api.cluster.remove(&binding.name_any());
                self.forget_if_empty(&api);
            }
            apis.insert(api);
        }
        self.count_routes(binding, false, apis);
    }

    fn index_binding(&mut self, binding: &Arc<Binding>, apis: &mut BTreeSet<String>) {
        let namespace = binding.namespace().unwrap_or_default();
        for api in listed(binding.as_ref()) {
            self.by_api
                .entry(api.clone())
                .or_default()
                .namespaced
                .entry(namespace.clone())
                .or_default()
                .insert(binding.name_any(), binding.clone());
            apis.insert(api);
        }
        self.count_routes(binding.as_ref(), true, apis);
    }

    fn unindex_binding(&mut self, binding: &Binding, apis: &mut BTreeSet<String>) {
        let namespace = binding.namespace().unwrap_or_default();
        for api in listed(binding) {
            if let Some(of_api) = self.by_api.get_mut(&api)
                && let Some(bindings) = of_api.namespaced.get_mut(&namespace)
            {
                bindings.remove(&binding.name_any());
                if bindings.is_empty() {
                    of_api.namespaced.remove(&namespace);
                }
                self.forget_if_empty(&api);
            }
            apis.insert(api);
        }
        self.count_routes(binding, false, apis);
    }

    fn forget_if_empty(&mut self, api: &str) {
        if self
            .by_api
            .get(api)
            .is_some_and(|a| a.cluster.is_empty() && a.namespaced.is_empty())
        {
            self.by_api.remove(api);
        }
    }

    /// Adds (`add`) or takes away the routes `binding`'s status offers.
    fn count_routes<B: BindingObject>(
        &mut self,
        binding: &B,
        add: bool,
        apis: &mut BTreeSet<String>,
    ) {
        let Some(status) = binding.binding_status() else {
            return;
        };
        for entry in &status.apis {
            let Some(route) = entry.route.as_ref().filter(|_| entry.bound) else {
                continue;
            };
            if entry.connection == route.served_by {
                continue;
            }
            apis.insert(entry.name.clone());
            let key = (entry.name.clone(), route.served_by.clone());
            let routes = self.routes.entry(key.clone()).or_default();
            let count = routes.entry(entry.connection.clone()).or_default();
            if add {
                *count += 1;
            } else {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    routes.remove(&entry.connection);
                }
            }
            if routes.is_empty() {
                self.routes.remove(&key);
            }
        }
    }
}

/// The APIs `binding` lists.
fn listed<B: BindingObject>(binding: &B) -> Vec<String> {
    binding
        .binding_spec()
        .apis
        .iter()
        .map(|a| a.name.clone())
        .collect()
}

/// `touched`, reaching also the APIs whose [`WatchScope`] changed (`scoped`) in `namespace`.
fn with_scope(
    touched: Option<Touched>,
    scoped: BTreeSet<String>,
    namespace: Option<&str>,
) -> Option<Touched> {
    if scoped.is_empty() {
        return touched;
    }
    match touched {
        Some(Touched::Everything) => Some(Touched::Everything),
        Some(Touched::Apis { mut apis, .. }) => {
            apis.extend(scoped);
            Some(Touched::Apis {
                apis,
                namespace: namespace.map(str::to_owned),
            })
        }
        None => Some(Touched::Apis {
            apis: scoped,
            namespace: namespace.map(str::to_owned),
        }),
    }
}

/// Whether two versions of a binding look the same to every lookup: spec and status equal.
fn same<B: BindingObject>(a: &B, b: &B) -> bool {
    a.binding_spec() == b.binding_spec() && a.binding_status() == b.binding_status()
}

#[cfg(test)]
mod tests;
