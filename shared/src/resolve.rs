//! Binding resolution (REFERENCE-BEHAVIOUR §17.1, RES-1 … RES-5): which binding, if any, covers
//! an instance of an API. A pure function over whatever holds the bindings — the syncer passes
//! its reflector stores, not live LISTs (QRK-10).

use kube::ResourceExt;

use crate::api::{
    Binding, BindingSpec, BindingStatus, ClusterBinding, ConflictPolicy, ConnectionAccess,
};
use crate::conditions::{self, types};

/// What both binding kinds offer to resolution and reconciliation.
pub trait BindingObject: crate::cache::Cacheable + serde::Serialize {
    /// Whether the kind is namespaced (Binding) or cluster-scoped (ClusterBinding).
    const NAMESPACED: bool;
    /// The shared spec.
    fn binding_spec(&self) -> &BindingSpec;
    /// The shared status.
    fn binding_status(&self) -> Option<&BindingStatus>;
    /// Replaces the status.
    fn set_binding_status(&mut self, status: BindingStatus);
}

/// The same accessors for both kinds (a ClusterBinding's spec derefs to the shared one).
macro_rules! binding_object {
    ($kind:ty, namespaced: $namespaced:expr) => {
        impl BindingObject for $kind {
            const NAMESPACED: bool = $namespaced;
            fn binding_spec(&self) -> &BindingSpec {
                &self.spec
            }
            fn binding_status(&self) -> Option<&BindingStatus> {
                self.status.as_ref()
            }
            fn set_binding_status(&mut self, status: BindingStatus) {
                self.status = Some(status);
            }
        }
    };
}

binding_object!(Binding, namespaced: true);
binding_object!(ClusterBinding, namespaced: false);

/// The binding that covers an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    /// `None` for a ClusterBinding, else the Binding's namespace.
    pub namespace: Option<String>,
    /// The binding's name.
    pub name: String,
    /// Whether the binding has the API bound (RES-5, per API: its `status.apis` entry says bound
    /// through the Connection it names; a status without entries — written by an older schema
    /// manager — falls back to the binding's `Ready`).
    pub ready: bool,
    /// The Connection it names.
    pub connection: String,
    /// Its conflict policy.
    pub conflict_policy: ConflictPolicy,
    /// It is suspended (`spec.suspend`): everything it covers is paused.
    pub suspended: bool,
    /// Which provider Events it wants copied onto the objects it covers (`spec.providerEvents`).
    pub provider_events: Option<crate::api::ProviderEvents>,
}

impl Resolution {
    /// RES-5: found, and the API bound there.
    pub fn is_bound(&self) -> bool {
        self.ready
    }
}

fn covers<B: BindingObject>(binding: &B, api: &str) -> bool {
    binding.meta().deletion_timestamp.is_none()
        && binding.binding_spec().apis.iter().any(|a| a.name == api)
}

/// Whether `binding` has `api` bound: per API (one bad API never stops the others).
pub fn api_bound<B: BindingObject>(binding: &B, api: &str) -> bool {
    let connection = &binding.binding_spec().connection_ref.name;
    binding.binding_status().is_some_and(|s| {
        if s.apis.is_empty() {
            conditions::is_true(&s.conditions, types::READY)
        } else {
            s.apis
                .iter()
                .any(|a| a.name == api && a.bound && a.connection == *connection)
        }
    })
}

fn resolution<B: BindingObject>(binding: &B, api: &str) -> Resolution {
    let spec = binding.binding_spec();
    Resolution {
        namespace: binding.namespace(),
        name: binding.name_any(),
        ready: api_bound(binding, api),
        connection: spec.connection_ref.name.clone(),
        conflict_policy: spec.conflict_policy,
        suspended: spec.suspend,
        provider_events: spec.provider_events.clone(),
    }
}

/// RES-1 … RES-4: the first (by name) ClusterBinding not being deleted that lists `api`, whether
/// Ready or not; only if none does and the instance is namespaced, the first such Binding in the
/// instance's namespace.
pub fn resolve<'a>(
    api: &str,
    namespace: Option<&str>,
    cluster_bindings: impl IntoIterator<Item = &'a ClusterBinding>,
    bindings: impl IntoIterator<Item = &'a Binding>,
) -> Option<Resolution> {
    resolve_among(api, namespace, None, cluster_bindings, bindings)
}

/// [`resolve`] among the bindings that name `connection`, the Connection whose provider serves
/// the API here (the consumer CRD's marker). A binding naming another Connection cannot take an
/// API over — kbind refuses to re-mark its CRD — so it neither covers nor freezes its instances.
pub fn resolve_served_by<'a>(
    connection: &str,
    api: &str,
    namespace: Option<&str>,
    cluster_bindings: impl IntoIterator<Item = &'a ClusterBinding>,
    bindings: impl IntoIterator<Item = &'a Binding>,
) -> Option<Resolution> {
    resolve_among(api, namespace, Some(connection), cluster_bindings, bindings)
}

fn resolve_among<'a>(
    api: &str,
    namespace: Option<&str>,
    connection: Option<&str>,
    cluster_bindings: impl IntoIterator<Item = &'a ClusterBinding>,
    bindings: impl IntoIterator<Item = &'a Binding>,
) -> Option<Resolution> {
    let serves = |spec: &BindingSpec| connection.is_none_or(|c| spec.connection_ref.name == c);
    let first = |mut found: Vec<Resolution>| {
        found.sort_by(|a, b| a.name.cmp(&b.name));
        found.into_iter().next()
    };
    let cluster_wide: Vec<Resolution> = cluster_bindings
        .into_iter()
        .filter(|b| covers(*b, api) && serves(b.binding_spec()))
        .map(|b| resolution(b, api))
        .collect();
    if let Some(found) = first(cluster_wide) {
        return Some(found);
    }
    let namespace = namespace?;
    let local: Vec<Resolution> = bindings
        .into_iter()
        .filter(|b| {
            b.namespace().as_deref() == Some(namespace)
                && covers(*b, api)
                && serves(b.binding_spec())
        })
        .map(|b| resolution(b, api))
        .collect();
    first(local)
}

/// What the serving Connection's owner allows `resolution` (its `spec.access`; `None` while the
/// Connection is not known): a Binding in a namespace the Connection does not serve is not bound,
/// whatever its status says — anyone allowed to write `bindings/status` could forge that — and a
/// Binding's `Adopt` holds only where the Connection lets Bindings adopt.
pub fn within_access(mut resolution: Resolution, access: Option<&ConnectionAccess>) -> Resolution {
    let Some(access) = access else {
        resolution.ready = false;
        return resolution;
    };
    if let Some(namespace) = &resolution.namespace {
        resolution.ready &= access.allows_bindings_in(namespace);
    }
    resolution.conflict_policy =
        access.conflict_policy(resolution.namespace.is_some(), resolution.conflict_policy);
    resolution
}

/// The Connections other than `served_by` that bindings (not being deleted) offer as routes for
/// `api` (#36): their `status.apis` entry says the API is bound there as a route of the CRD
/// `served_by` serves. What the assignment makes units of, and what makes an API routed.
pub fn route_connections<'a>(
    api: &str,
    served_by: &str,
    cluster_bindings: impl IntoIterator<Item = &'a ClusterBinding>,
    bindings: impl IntoIterator<Item = &'a Binding>,
) -> std::collections::BTreeSet<String> {
    fn routes<'b, B: BindingObject>(
        binding: &'b B,
        api: &'b str,
        served_by: &'b str,
    ) -> impl Iterator<Item = String> + 'b {
        binding
            .binding_status()
            .filter(|_| binding.meta().deletion_timestamp.is_none())
            .into_iter()
            .flat_map(|s| s.apis.iter())
            .filter(move |a| {
                a.name == api
                    && a.bound
                    && a.connection != served_by
                    && a.route.as_ref().is_some_and(|r| r.served_by == served_by)
            })
            .map(|a| a.connection.clone())
    }
    let mut out = std::collections::BTreeSet::new();
    for b in cluster_bindings {
        out.extend(routes(b, api, served_by));
    }
    for b in bindings {
        out.extend(routes(b, api, served_by));
    }
    out
}

/// Every binding (not being deleted) listing `api`, as routing sees it (#36): the route it
/// offers (its Connection and that Connection's pinned provider, from `connection_of`: cluster
/// UID and access rules; `None` while unknown), its object selector, its schema verdict (from
/// its status entry) and whether it is admitted — its status says the API is bound through its
/// Connection, and the Connection's access rules allow it (checked here, not trusted to the
/// status). A selector that does not parse admits nothing.
pub fn offers<'a>(
    api: &str,
    cluster_bindings: impl IntoIterator<Item = &'a ClusterBinding>,
    bindings: impl IntoIterator<Item = &'a Binding>,
    connection_of: impl Fn(&str) -> Option<(String, ConnectionAccess)>,
) -> Vec<crate::routing::Offer> {
    fn offer<B: BindingObject>(
        binding: &B,
        api: &str,
        connection_of: &dyn Fn(&str) -> Option<(String, ConnectionAccess)>,
    ) -> Option<crate::routing::Offer> {
        if !covers(binding, api) {
            return None;
        }
        let spec = binding.binding_spec();
        let connection = &spec.connection_ref.name;
        let known = connection_of(connection);
        let namespace = binding.namespace();
        let allowed = known.as_ref().is_some_and(|(_, access)| {
            namespace
                .as_deref()
                .is_none_or(|ns| access.allows_bindings_in(ns))
        });
        let selector = spec
            .object_selector
            .clone()
            .map(kube::core::Selector::try_from);
        let parsed = !matches!(selector, Some(Err(_)));
        let entry = binding.binding_status().and_then(|s| {
            s.apis
                .iter()
                .find(|a| a.name == api && a.connection == *connection)
        });
        let schema = match entry.and_then(|e| e.route.as_ref()) {
            Some(route) if !route.schema_agrees => {
                crate::routing::Schema::Mismatch(route.schema_message.clone())
            }
            _ => crate::routing::Schema::Agrees,
        };
        Some(crate::routing::Offer {
            binding: match &namespace {
                Some(ns) => format!("{ns}/{}", binding.name_any()),
                None => binding.name_any(),
            },
            namespace,
            apis: [api.to_owned()].into(),
            route: crate::routing::Route {
                connection: connection.clone(),
                cluster: known.map(|(cluster, _)| cluster).unwrap_or_default(),
            },
            selector: selector.and_then(Result::ok),
            schema,
            admitted: allowed && parsed && api_bound(binding, api),
        })
    }
    cluster_bindings
        .into_iter()
        .filter_map(|b| offer(b, api, &connection_of))
        .chain(
            bindings
                .into_iter()
                .filter_map(|b| offer(b, api, &connection_of)),
        )
        .collect()
}

/// Where the provider's Events about an API's objects are wanted: nowhere, in some namespaces
/// (only Bindings ask), or everywhere (a ClusterBinding asks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventsScope {
    /// No binding asks: no watch at all.
    Nowhere,
    /// Only these namespaces' Bindings ask: one watch per namespace (a credential limited to
    /// them suffices).
    Namespaces(std::collections::BTreeSet<String>),
    /// A ClusterBinding asks: one cluster-wide watch.
    Everywhere,
}

/// [`EventsScope`] of the bindings that name `connection` and list `api` (and are not being
/// deleted) and ask for provider Events: the syncer watches the provider's Events only there.
pub fn provider_events_scope<'a>(
    connection: &str,
    api: &str,
    cluster_bindings: impl IntoIterator<Item = &'a ClusterBinding>,
    bindings: impl IntoIterator<Item = &'a Binding>,
) -> EventsScope {
    fn wants<B: BindingObject>(binding: &B, connection: &str, api: &str) -> bool {
        covers(binding, api)
            && binding.binding_spec().connection_ref.name == connection
            && binding.binding_spec().provider_events.is_some()
    }
    if cluster_bindings
        .into_iter()
        .any(|b| wants(b, connection, api))
    {
        return EventsScope::Everywhere;
    }
    let namespaces: std::collections::BTreeSet<String> = bindings
        .into_iter()
        .filter(|b| wants(*b, connection, api))
        .filter_map(|b| b.namespace())
        .collect();
    if namespaces.is_empty() {
        EventsScope::Nowhere
    } else {
        EventsScope::Namespaces(namespaces)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ClusterBindingSpec;
    use crate::conditions::{Desired, reasons};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn spec(connection: &str, apis: &[&str]) -> BindingSpec {
        BindingSpec::new(connection, apis)
    }

    fn ready(status: &mut Option<BindingStatus>) {
        let mut s = BindingStatus::default();
        let now = Time(jiff::Timestamp::UNIX_EPOCH);
        conditions::set(
            &mut s.conditions,
            Desired::new(types::READY, true, reasons::AS_EXPECTED, ""),
            None,
            &now,
        );
        *status = Some(s);
    }

    fn cluster_binding(name: &str, apis: &[&str], is_ready: bool) -> ClusterBinding {
        let mut b = ClusterBinding::new(name, ClusterBindingSpec::from(spec("p", apis)));
        if is_ready {
            ready(&mut b.status);
        }
        b
    }

    fn binding(namespace: &str, name: &str, apis: &[&str], is_ready: bool) -> Binding {
        let mut b = Binding::new(name, spec("p", apis));
        b.metadata.namespace = Some(namespace.into());
        if is_ready {
            ready(&mut b.status);
        }
        b
    }

    const W: &str = "widgets.example.org";

    #[test]
    fn cluster_binding_wins_even_when_not_ready() {
        // RES-2
        let cbs = [cluster_binding("all", &[W], false)];
        let bs = [binding("team-a", "mine", &[W], true)];
        let r = resolve(W, Some("team-a"), &cbs, &bs).unwrap();
        assert_eq!(
            (r.namespace.as_deref(), r.name.as_str(), r.is_bound()),
            (None, "all", false)
        );
    }

    #[test]
    fn binding_covers_only_its_namespace_and_only_namespaced_objects() {
        // RES-3, SYNC-14
        let bs = [binding("team-a", "mine", &[W], true)];
        let none: [ClusterBinding; 0] = [];
        assert!(resolve(W, Some("team-a"), &none, &bs).unwrap().is_bound());
        assert!(resolve(W, Some("team-b"), &none, &bs).is_none());
        assert!(resolve(W, None, &none, &bs).is_none());
        assert!(resolve("gadgets.example.org", Some("team-a"), &none, &bs).is_none());
    }

    #[test]
    fn first_by_name_wins_and_deleting_bindings_are_ignored() {
        // RES-2, RES-4, BCL-1
        let mut doomed = cluster_binding("a-doomed", &[W], true);
        doomed.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        let cbs = [
            cluster_binding("c", &[W], false),
            doomed,
            cluster_binding("b", &[W], true),
        ];
        let none: [Binding; 0] = [];
        assert_eq!(resolve(W, None, &cbs, &none).unwrap().name, "b");
    }

    #[test]
    fn each_api_is_bound_on_its_own_and_an_old_status_falls_back_to_ready() {
        use crate::api::ApiStatus;
        const G: &str = "gadgets.example.org";
        let entry = |name: &str, connection: &str, bound: bool| ApiStatus {
            name: name.into(),
            connection: connection.into(),
            bound,
            reason: String::new(),
            message: String::new(),
            route: None,
        };
        // Not Ready as a whole (G is cluster-scoped in a Binding, say), W still bound.
        let mut b = binding("team-a", "mine", &[W, G], false);
        b.status = Some(BindingStatus {
            apis: vec![entry(W, "p", true), entry(G, "p", false)],
            ..Default::default()
        });
        let none: [ClusterBinding; 0] = [];
        let bs = [b.clone()];
        assert!(resolve(W, Some("team-a"), &none, &bs).unwrap().is_bound());
        assert!(!resolve(G, Some("team-a"), &none, &bs).unwrap().is_bound());
        // An entry recorded for another Connection (a move under way) binds nothing.
        b.status = Some(BindingStatus {
            apis: vec![entry(W, "q", true)],
            ..Default::default()
        });
        assert!(!resolve(W, Some("team-a"), &none, &[b]).unwrap().is_bound());
        // A status an older schema manager wrote (no entries): Ready decides.
        let old = [binding("team-a", "old", &[W], true)];
        assert!(resolve(W, Some("team-a"), &none, &old).unwrap().is_bound());
        let old = [binding("team-a", "old", &[W], false)];
        assert!(!resolve(W, Some("team-a"), &none, &old).unwrap().is_bound());
    }

    #[test]
    fn bindings_naming_another_connection_neither_cover_nor_freeze_an_api() {
        // Safe by default: the CRD serves Connection p; a ClusterBinding for q that sorts first
        // (and is not Ready, its CRD being refused) does not stop p's instances.
        let mut other = cluster_binding("a-other", &[W], false);
        other.spec.binding.connection_ref.name = "q".into();
        let cbs = [other, cluster_binding("b", &[W], true)];
        let mut other_local = binding("team-a", "a-local", &[W], false);
        other_local.spec.connection_ref.name = "q".into();
        let bs = [other_local, binding("team-a", "z-local", &[W], true)];
        let none: [ClusterBinding; 0] = [];
        assert_eq!(resolve(W, None, &cbs, &bs).unwrap().name, "a-other");
        let served = resolve_served_by("p", W, None, &cbs, &bs).unwrap();
        assert_eq!((served.name.as_str(), served.is_bound()), ("b", true));
        let served = resolve_served_by("p", W, Some("team-a"), &none, &bs).unwrap();
        assert_eq!((served.name.as_str(), served.is_bound()), ("z-local", true));
        assert!(resolve_served_by("r", W, Some("team-a"), &cbs, &bs).is_none());
    }

    #[test]
    fn the_connections_access_rules_bound_what_a_binding_may_do() {
        // #32.6, #32.7: (case, binding's namespace, status says bound, asked policy, access,
        // bound, policy)
        let open = ConnectionAccess::default();
        let only_a = ConnectionAccess {
            binding_namespaces: Some(vec!["team-a".into()]),
            ..Default::default()
        };
        let adopting = ConnectionAccess {
            bindings_may_adopt: true,
            ..Default::default()
        };
        let (fail, adopt) = (ConflictPolicy::Fail, ConflictPolicy::Adopt);
        let cases = [
            (
                "ClusterBinding, open",
                None,
                true,
                adopt,
                Some(&open),
                true,
                adopt,
            ),
            (
                "Binding, open",
                Some("team-a"),
                true,
                fail,
                Some(&open),
                true,
                fail,
            ),
            (
                "forged status, namespace not served",
                Some("team-b"),
                true,
                fail,
                Some(&only_a),
                false,
                fail,
            ),
            (
                "served namespace",
                Some("team-a"),
                true,
                fail,
                Some(&only_a),
                true,
                fail,
            ),
            (
                "not bound stays so",
                Some("team-a"),
                false,
                fail,
                Some(&open),
                false,
                fail,
            ),
            (
                "Binding's Adopt, not allowed",
                Some("team-a"),
                true,
                adopt,
                Some(&open),
                true,
                fail,
            ),
            (
                "Binding's Adopt, allowed",
                Some("team-a"),
                true,
                adopt,
                Some(&adopting),
                true,
                adopt,
            ),
            (
                "ClusterBinding's Adopt, restricted",
                None,
                true,
                adopt,
                Some(&only_a),
                true,
                adopt,
            ),
            ("Connection unknown", None, true, fail, None, false, fail),
        ];
        for (case, namespace, ready, asked, access, bound, policy) in cases {
            let r = Resolution {
                namespace: namespace.map(str::to_owned),
                name: "b".into(),
                ready,
                connection: "p".into(),
                conflict_policy: asked,
                suspended: false,
                provider_events: None,
            };
            let r = within_access(r, access);
            assert_eq!((r.is_bound(), r.conflict_policy), (bound, policy), "{case}");
        }
    }

    #[test]
    fn provider_events_are_watched_only_where_a_binding_of_the_api_asks_for_them() {
        let events = Some(crate::api::ProviderEvents {
            types: vec![crate::api::ProviderEventType::Warning],
            reasons: Vec::new(),
        });
        let cluster = |connection: &str, apis: &[&str], wants: bool| {
            let mut spec = spec(connection, apis);
            spec.provider_events = if wants { events.clone() } else { None };
            ClusterBinding::new("c", ClusterBindingSpec::from(spec))
        };
        let namespaced = |namespace: &str, connection: &str, apis: &[&str], wants: bool| {
            let mut spec = spec(connection, apis);
            spec.provider_events = if wants { events.clone() } else { None };
            let mut b = Binding::new("b", spec);
            b.metadata.namespace = Some(namespace.into());
            b
        };
        let api = "widgets.example.org";
        let only = |names: &[&str]| {
            EventsScope::Namespaces(names.iter().map(|n| (*n).to_owned()).collect())
        };
        for (cluster_bindings, bindings, want) in [
            (vec![], vec![], EventsScope::Nowhere),
            (
                vec![cluster("p", &[api], false)],
                vec![namespaced("team-a", "p", &[api], false)],
                EventsScope::Nowhere,
            ),
            (
                vec![cluster("p", &[api], true)],
                vec![],
                EventsScope::Everywhere,
            ),
            (
                vec![cluster("p", &[api], true)],
                vec![namespaced("team-a", "p", &[api], true)],
                EventsScope::Everywhere,
            ),
            (
                vec![],
                vec![
                    namespaced("team-b", "p", &[api], true),
                    namespaced("team-a", "p", &[api], true),
                    namespaced("team-c", "p", &[api], false),
                ],
                only(&["team-a", "team-b"]),
            ),
            // Another API, another Connection.
            (
                vec![cluster("p", &["gadgets.example.org"], true)],
                vec![namespaced("team-a", "p", &["gadgets.example.org"], true)],
                EventsScope::Nowhere,
            ),
            (
                vec![cluster("q", &[api], true)],
                vec![namespaced("team-a", "q", &[api], true)],
                EventsScope::Nowhere,
            ),
        ] {
            assert_eq!(
                provider_events_scope("p", api, &cluster_bindings, &bindings),
                want,
                "{cluster_bindings:?} {bindings:?}"
            );
        }
        let mut deleting = cluster("p", &[api], true);
        deleting.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(
            provider_events_scope("p", api, [&deleting], []),
            EventsScope::Nowhere
        );
    }
}
