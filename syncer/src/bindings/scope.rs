//! Where the syncer reads an API's instances (#54: least privilege): cluster-wide while any
//! ClusterBinding lists it, else only in the namespaces whose Bindings do.
//!
//! "Lists" counts every binding that may still have objects to sync or to let go of: served or
//! past its namespace's cap, being deleted or not, by its spec's APIs and by its status's entries
//! (an API removed from a binding keeps its entry until its objects are released — reading stops
//! only once the binding no longer holds it anywhere, so no object is left with kbind's
//! finalizer). Plain data, no I/O; kept in step with the binding index by the same events.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use kbind_shared::resolve::BindingObject;

/// Where one API's instances are read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchScope {
    /// Everywhere: a ClusterBinding lists it.
    Cluster,
    /// In these namespaces only (none: nothing is read).
    Namespaces(BTreeSet<String>),
}

impl WatchScope {
    /// Whether it is cluster-wide.
    pub fn is_cluster(&self) -> bool {
        matches!(self, WatchScope::Cluster)
    }
}

/// The bindings that list each API, by name: what [`WatchScope`] is computed from.
#[derive(Debug, Default)]
pub struct Scopes {
    /// API → the ClusterBindings listing it.
    cluster: HashMap<String, BTreeSet<String>>,
    /// API → namespace → the Bindings there listing it.
    namespaced: HashMap<String, BTreeMap<String, BTreeSet<String>>>,
    /// What each binding lists, as last seen ((namespace, name); `None`: a ClusterBinding).
    listing: HashMap<(Option<String>, String), BTreeSet<String>>,
}

impl Scopes {
    /// Where `api`'s instances are read.
    pub fn of(&self, api: &str) -> WatchScope {
        if self.cluster.get(api).is_some_and(|b| !b.is_empty()) {
            return WatchScope::Cluster;
        }
        WatchScope::Namespaces(
            self.namespaced
                .get(api)
                .map(|n| n.keys().cloned().collect())
                .unwrap_or_default(),
        )
    }

    /// A binding (namespace `None`: a ClusterBinding) seen as `binding`; the APIs whose scope
    /// changed.
    pub fn apply<B: BindingObject>(
        &mut self,
        namespace: Option<&str>,
        name: &str,
        binding: &B,
    ) -> BTreeSet<String> {
        let lists = listed(binding);
        let mut apis = self.lists(namespace, name);
        apis.extend(lists.iter().cloned());
        let before = self.reach_of(&apis, namespace);
        self.set(namespace, name, lists);
        self.changed(before, apis, namespace)
    }

    /// A binding gone; the APIs whose scope changed.
    pub fn remove(&mut self, namespace: Option<&str>, name: &str) -> BTreeSet<String> {
        let apis = self.lists(namespace, name);
        let before = self.reach_of(&apis, namespace);
        self.set(namespace, name, BTreeSet::new());
        self.changed(before, apis, namespace)
    }

    /// Every binding of one kind (`namespaced` or not) re-listed as `all` ((namespace, name,
    /// what it lists)).
    pub fn relist(
        &mut self,
        namespaced: bool,
        all: impl IntoIterator<Item = (Option<String>, String, BTreeSet<String>)>,
    ) {
        let old: Vec<(Option<String>, String)> = self
            .listing
            .keys()
            .filter(|(ns, _)| ns.is_some() == namespaced)
            .cloned()
            .collect();
        for (namespace, name) in old {
            self.set(namespace.as_deref(), &name, BTreeSet::new());
        }
        for (namespace, name, lists) in all {
            self.set(namespace.as_deref(), &name, lists);
        }
    }

    fn lists(&self, namespace: Option<&str>, name: &str) -> BTreeSet<String> {
        self.listing
            .get(&(namespace.map(str::to_owned), name.to_owned()))
            .cloned()
            .unwrap_or_default()
    }

    /// What one binding's change can alter of `api`'s scope: whether it is cluster-wide, and
    /// whether the binding's own `namespace` is read — two lookups, not a copy of every
    /// namespace read (a binding changes its own namespace's place in the scope, no other's).
    fn reach(&self, api: &str, namespace: Option<&str>) -> (bool, bool) {
        let cluster = self.cluster.get(api).is_some_and(|b| !b.is_empty());
        // (While it is cluster-wide, which namespaces have Bindings changes nothing.)
        let here = !cluster
            && namespace
                .is_some_and(|ns| self.namespaced.get(api).is_some_and(|n| n.contains_key(ns)));
        (cluster, here)
    }

    fn reach_of(
        &self,
        apis: &BTreeSet<String>,
        namespace: Option<&str>,
    ) -> BTreeMap<String, (bool, bool)> {
        apis.iter()
            .map(|api| (api.clone(), self.reach(api, namespace)))
            .collect()
    }

    fn changed(
        &self,
        before: BTreeMap<String, (bool, bool)>,
        apis: BTreeSet<String>,
        namespace: Option<&str>,
    ) -> BTreeSet<String> {
        apis.into_iter()
            .filter(|api| before.get(api) != Some(&self.reach(api, namespace)))
            .collect()
    }

    /// Records that the binding lists `apis` now (none: it is forgotten).
    fn set(&mut self, namespace: Option<&str>, name: &str, apis: BTreeSet<String>) {
        let key = (namespace.map(str::to_owned), name.to_owned());
        for api in self.listing.remove(&key).unwrap_or_default() {
            match namespace {
                None => {
                    if let Some(names) = self.cluster.get_mut(&api) {
                        names.remove(name);
                        if names.is_empty() {
                            self.cluster.remove(&api);
                        }
                    }
                }
                Some(ns) => {
                    if let Some(namespaces) = self.namespaced.get_mut(&api) {
                        if let Some(names) = namespaces.get_mut(ns) {
                            names.remove(name);
                            if names.is_empty() {
                                namespaces.remove(ns);
                            }
                        }
                        if namespaces.is_empty() {
                            self.namespaced.remove(&api);
                        }
                    }
                }
            }
        }
        if apis.is_empty() {
            return;
        }
        for api in &apis {
            match namespace {
                None => {
                    self.cluster
                        .entry(api.clone())
                        .or_default()
                        .insert(name.to_owned());
                }
                Some(ns) => {
                    self.namespaced
                        .entry(api.clone())
                        .or_default()
                        .entry(ns.to_owned())
                        .or_default()
                        .insert(name.to_owned());
                }
            }
        }
        self.listing.insert(key, apis);
    }
}

/// The APIs a binding lists or still holds: its spec's and its status's entries.
pub fn listed<B: BindingObject>(binding: &B) -> BTreeSet<String> {
    let mut apis: BTreeSet<String> = binding
        .binding_spec()
        .apis
        .iter()
        .map(|a| a.name.clone())
        .collect();
    if let Some(status) = binding.binding_status() {
        apis.extend(status.apis.iter().map(|a| a.name.clone()));
    }
    apis
}

#[cfg(test)]
mod tests {
    use super::*;
    use kbind_shared::api::{
        ApiStatus, Binding, BindingSpec, BindingStatus, ClusterBinding, ClusterBindingSpec,
    };

    /// A Binding listing `spec` whose status still holds `status`'s entries.
    fn binding(namespace: &str, name: &str, spec: &[&str], status: &[&str]) -> Binding {
        let mut b = Binding::new(name, BindingSpec::new("c", spec));
        b.metadata.namespace = Some(namespace.into());
        b.status = Some(BindingStatus {
            apis: status
                .iter()
                .map(|a| ApiStatus {
                    name: (*a).into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        });
        b
    }

    fn cluster(name: &str, spec: &[&str]) -> ClusterBinding {
        ClusterBinding::new(name, ClusterBindingSpec::from(BindingSpec::new("c", spec)))
    }

    fn namespaces(names: &[&str]) -> WatchScope {
        WatchScope::Namespaces(names.iter().map(|n| n.to_string()).collect())
    }

    fn set(apis: &[&str]) -> BTreeSet<String> {
        apis.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn an_api_only_bindings_list_is_read_in_their_namespaces_and_nothing_read_nowhere() {
        let mut scopes = Scopes::default();
        assert_eq!(scopes.of("w.x"), namespaces(&[]));
        assert!(!scopes.of("w.x").is_cluster());
        assert!(WatchScope::Cluster.is_cluster());
        let changed = scopes.apply(Some("a"), "b1", &binding("a", "b1", &["w.x"], &[]));
        assert_eq!(changed, set(&["w.x"]));
        assert_eq!(scopes.of("w.x"), namespaces(&["a"]));
        // A second Binding in the same namespace changes no scope.
        let changed = scopes.apply(Some("a"), "b2", &binding("a", "b2", &["w.x", "v.x"], &[]));
        assert_eq!(changed, set(&["v.x"]));
        scopes.apply(Some("b"), "b1", &binding("b", "b1", &["w.x"], &[]));
        assert_eq!(scopes.of("w.x"), namespaces(&["a", "b"]));
        // The namespace is read until its last Binding listing the API goes.
        assert!(scopes.remove(Some("a"), "b1").is_empty());
        assert_eq!(scopes.of("w.x"), namespaces(&["a", "b"]));
        assert_eq!(scopes.remove(Some("a"), "b2"), set(&["w.x", "v.x"]));
        assert_eq!(scopes.of("w.x"), namespaces(&["b"]));
        assert_eq!(scopes.of("v.x"), namespaces(&[]));
    }

    #[test]
    fn a_cluster_binding_makes_its_apis_cluster_wide_until_it_goes() {
        let mut scopes = Scopes::default();
        scopes.apply(Some("a"), "b1", &binding("a", "b1", &["w.x"], &[]));
        assert_eq!(
            scopes.apply(None, "all", &cluster("all", &["w.x"])),
            set(&["w.x"])
        );
        assert_eq!(scopes.of("w.x"), WatchScope::Cluster);
        // A Binding's namespace and a ClusterBinding of the same name are different bindings.
        assert!(scopes.remove(Some("a"), "all").is_empty());
        assert!(
            scopes.remove(Some("a"), "b1").is_empty(),
            "still cluster-wide"
        );
        assert_eq!(scopes.remove(None, "all"), set(&["w.x"]));
        assert_eq!(scopes.of("w.x"), namespaces(&[]));
    }

    #[test]
    fn an_api_a_binding_still_lets_go_of_keeps_its_namespace_read() {
        let mut scopes = Scopes::default();
        scopes.apply(Some("a"), "b1", &binding("a", "b1", &["w.x"], &["w.x"]));
        // Removed from the spec, still in the status (its objects being released): still read.
        assert!(
            scopes
                .apply(Some("a"), "b1", &binding("a", "b1", &[], &["w.x"]))
                .is_empty()
        );
        assert_eq!(scopes.of("w.x"), namespaces(&["a"]));
        // Released: the entry goes, and the namespace with it.
        assert_eq!(
            scopes.apply(Some("a"), "b1", &binding("a", "b1", &[], &[])),
            set(&["w.x"])
        );
        assert_eq!(scopes.of("w.x"), namespaces(&[]));
    }

    #[test]
    fn a_relist_replaces_one_kind_and_keeps_the_other() {
        let mut scopes = Scopes::default();
        scopes.apply(Some("a"), "b1", &binding("a", "b1", &["w.x"], &[]));
        scopes.apply(None, "all", &cluster("all", &["v.x"]));
        scopes.relist(
            true,
            [(Some("c".to_owned()), "b9".to_owned(), set(&["w.x"]))],
        );
        assert_eq!(scopes.of("w.x"), namespaces(&["c"]));
        assert_eq!(scopes.of("v.x"), WatchScope::Cluster);
        scopes.relist(false, []);
        assert_eq!(scopes.of("v.x"), namespaces(&[]));
        assert_eq!(scopes.of("w.x"), namespaces(&["c"]));
    }
}
