//! Per-object routing (#36): when more than one Connection serves an API, which provider an
//! instance goes to, and the pin that keeps it there. Pure decisions over plain data — the
//! syncer feeds them the bindings covering the instance, its labels, its pin and where its copy
//! is — with one invariant above all: **an object has at most one provider copy owned by kbind**,
//! and it never moves without an explicit user action (removing or changing the pin).
//!
//! The schema manager's side is [`admit`] (which bindings may offer a route at all: a second
//! Connection only through a binding that selects objects) and [`candidates`] (the admitted
//! offers covering an instance's scope).
//!
//! The syncer runs one worker per route of a routed API; each decides with [`gate`] from the same
//! consumer object (its pin, its finalizers, its labels), so exactly one of them acts.

use std::collections::{BTreeMap, BTreeSet};

use kube::core::{Selector, SelectorExt};

use crate::keys;

/// Where an object's copy lives: a Connection and the provider cluster (its UID) that
/// Connection is pinned to. A Connection re-pinned to another cluster is another route.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Route {
    pub connection: String,
    pub cluster: String,
}

impl Route {
    /// The pin's text, as recorded on the instance: `<connection>/<remote cluster UID>`.
    pub fn pin_text(&self) -> String {
        format!("{}/{}", self.connection, self.cluster)
    }

    /// Reads a pin written by [`Route::pin_text`]; a user may edit it, so anything else is an
    /// error naming what is wrong.
    pub fn parse_pin(text: &str) -> Result<Route, String> {
        let (connection, cluster) = text.split_once('/').ok_or_else(|| {
            format!("route pin {text:?} is not <connection>/<provider cluster UID>")
        })?;
        if connection.is_empty() || cluster.is_empty() || cluster.contains('/') {
            return Err(format!(
                "route pin {text:?} is not <connection>/<provider cluster UID>"
            ));
        }
        Ok(Route {
            connection: connection.to_owned(),
            cluster: cluster.to_owned(),
        })
    }
}

/// Whether a route's provider serves the API with a schema that agrees with the one served on
/// the consumer (the breaking-change classifier's verdict).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Schema {
    Agrees,
    /// Why not: objects routed there are held, never written with fields the provider would
    /// prune or reject.
    Mismatch(String),
}

/// A binding that covers the instance's scope and lists its API: the route it offers, and the
/// objects it selects (`None`: every object — the default route).
#[derive(Debug, Clone)]
pub struct Candidate {
    /// `<namespace>/<name>` of a Binding, `<name>` of a ClusterBinding — for messages.
    pub binding: String,
    pub route: Route,
    pub selector: Option<Selector>,
    pub schema: Schema,
}

/// Why an object is not synced where its labels would send it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// More than one route wins.
    AmbiguousRoute,
    /// No binding routes it (or its pin names a route no binding offers).
    NoRoute,
    /// Its labels now choose another route than the one it is pinned to.
    RouteChanged,
    /// Its route's provider serves a schema that does not agree.
    SchemaMismatch,
    /// Its pin names a Connection its namespace may not use (the Connection's
    /// `spec.access.bindingNamespaces`).
    NotAllowed,
}

impl Reason {
    /// Every reason.
    pub const ALL: [Reason; 5] = [
        Reason::AmbiguousRoute,
        Reason::NoRoute,
        Reason::RouteChanged,
        Reason::SchemaMismatch,
        Reason::NotAllowed,
    ];

    /// The reason a conflict annotation names, if it is one of routing's.
    pub fn parse(text: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == text)
    }

    /// The conflict reason's name, as annotations, Events and the delivery column show it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::AmbiguousRoute => "AmbiguousRoute",
            Reason::NoRoute => "NoRoute",
            Reason::RouteChanged => "RouteChanged",
            Reason::SchemaMismatch => "SchemaMismatch",
            Reason::NotAllowed => "NotAllowed",
        }
    }
}

/// The routes the instance's labels choose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    Route(Route),
    NoRoute,
    /// The winning routes (two or more), in order.
    Ambiguous(Vec<Route>),
}

/// Which route an instance with `labels` goes to: among the candidates whose selector matches,
/// those with a selector beat those without (the default route); exactly one route must win.
/// Several candidates offering the same route (a ClusterBinding and a Binding naming one
/// Connection) are one winner, not an ambiguity.
pub fn choose(candidates: &[Candidate], labels: &BTreeMap<String, String>) -> Choice {
    let matching: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| c.selector.as_ref().is_none_or(|s| s.matches(labels)))
        .collect();
    let selected: Vec<&Candidate> = matching
        .iter()
        .copied()
        .filter(|c| c.selector.is_some())
        .collect();
    let pool = if selected.is_empty() {
        matching
    } else {
        selected
    };
    let routes: BTreeSet<&Route> = pool.iter().map(|c| &c.route).collect();
    let mut routes = routes.into_iter().cloned();
    match (routes.next(), routes.next()) {
        (None, _) => Choice::NoRoute,
        (Some(only), None) => Choice::Route(only),
        (Some(first), Some(second)) => {
            let mut all = vec![first, second];
            all.extend(routes);
            Choice::Ambiguous(all)
        }
    }
}

/// The pin on the instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pin {
    None,
    Set(Route),
    /// The annotation is there but unreadable (a user edited it): the message says why.
    Invalid(String),
}

/// kbind's copy of the instance on a provider, as its delivery record and the provider's watch
/// say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copy {
    pub route: Route,
    /// Its deletion was requested and has not finished (a provider finalizer may hold it).
    pub deleting: bool,
}

/// What the syncer does next for the instance. One step at a time: each is carried out, its
/// result observed, and the decision made again (level-triggered).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Write to no provider; report why (a conflict with this reason). Any copy stays as it is.
    Hold(Reason, String),
    /// Record the pin on the instance — before anything is written to the route.
    Pin(Route),
    /// Sync the instance with its copy on the route (spec up, status down); `conflict` is set
    /// when its labels choose another route (`RouteChanged`): reported, nothing moves.
    Sync {
        route: Route,
        conflict: Option<(Reason, String)>,
    },
    /// An explicit move: delete the copy on the old route (`orphan`: strip kbind's markers and
    /// leave it, foreign to kbind) before anything is written to the new one.
    Release { route: Route, orphan: bool },
    /// The old copy's deletion has not finished: nothing is written elsewhere until it has.
    WaitGone(Route),
}

/// The next routing step for an instance: `pin` and `copy` as recorded, `choice` what its labels
/// choose now, `candidates` every binding covering it (to tell whether a route is still
/// offered at all), `orphan` its deletion policy.
pub fn decide(
    pin: &Pin,
    copy: Option<&Copy>,
    choice: &Choice,
    candidates: &[Candidate],
    orphan: bool,
) -> Step {
    if let Some(copy) = copy.filter(|c| c.deleting) {
        return Step::WaitGone(copy.route.clone());
    }
    let offered = |route: &Route| candidates.iter().find(|c| &c.route == route);
    let unrouted = || match choice {
        Choice::Ambiguous(routes) => Step::Hold(
            Reason::AmbiguousRoute,
            format!("routes {} all select it", list(routes)),
        ),
        _ => Step::Hold(
            Reason::NoRoute,
            "no binding routes it (no selector matches and there is no default route)".into(),
        ),
    };
    // Where it is to go: the pin, else the one route its labels choose.
    let target = match pin {
        Pin::Invalid(message) => return Step::Hold(Reason::NoRoute, message.clone()),
        Pin::Set(route) => route.clone(),
        Pin::None => match choice {
            Choice::Route(route) => route.clone(),
            _ => return unrouted(),
        },
    };
    let Some(offer) = offered(&target) else {
        return Step::Hold(
            Reason::NoRoute,
            format!(
                "pinned to {}, which no binding covering it offers",
                target.pin_text()
            ),
        );
    };
    if let Schema::Mismatch(why) = &offer.schema {
        return Step::Hold(
            Reason::SchemaMismatch,
            format!("route {} does not agree: {why}", target.pin_text()),
        );
    }
    match copy {
        // A copy elsewhere: the user moved it explicitly (removed or changed the pin). The old
        // copy goes first.
        Some(copy) if copy.route != target => Step::Release {
            route: copy.route.clone(),
            orphan,
        },
        _ if *pin == Pin::None => Step::Pin(target),
        _ => {
            let conflict = match choice {
                Choice::Route(route) if *route == target => None,
                Choice::Route(route) => Some(format!(
                    "its labels now choose {}; it stays on {} until its pin is removed",
                    route.pin_text(),
                    target.pin_text()
                )),
                Choice::Ambiguous(routes) => Some(format!(
                    "its labels now choose several routes ({}); it stays on {}",
                    list(routes),
                    target.pin_text()
                )),
                Choice::NoRoute => Some(format!(
                    "its labels no longer select {}; it stays there until its pin is removed",
                    target.pin_text()
                )),
            };
            Step::Sync {
                route: target,
                conflict: conflict.map(|m| (Reason::RouteChanged, m)),
            }
        }
    }
}

/// Whether a binding that lists an API may offer its Connection for that API's objects — the
/// schema manager's decision, made before any candidate exists (#36, "must hold" 4). The consumer
/// CRD stays pinned to the Connection that serves it; another Connection never takes it over
/// here (that is `core.kbind.io/adopt`), and becomes a route only through a binding that selects
/// objects explicitly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// The binding's Connection serves the CRD (or will install it): its binding offers the
    /// schema Connection's route, default or selected.
    Serves,
    /// Another Connection serves the CRD and this binding selects objects: its Connection is an
    /// extra route, with its schema's verdict (objects routed to a disagreeing route are held).
    Route(Schema),
    /// Not admitted; the message says whose the API is and how to opt in.
    Refused(String),
}

/// [`Admission`] for a binding of Connection `connection` listing `api`: `selects` whether it
/// carries an object selector, `served_by` the Connection the consumer CRD is marked for
/// (`None`: not installed or not kbind's yet — the schema plan decides that), `schema` the
/// binding's provider's schema against the served one.
pub fn admit(
    api: &str,
    connection: &str,
    selects: bool,
    served_by: Option<&str>,
    schema: Schema,
) -> Admission {
    match served_by {
        None => Admission::Serves,
        Some(owner) if owner == connection => Admission::Serves,
        // The refusal of a second Connection that does not route stays as it always was.
        Some(owner) if !selects => Admission::Refused(format!(
            "the consumer CRD {api} serves Connection {owner}; a binding of Connection \
             {connection} becomes a route for it only with an object selector (objects it selects \
             go to {connection}), or annotate the CRD core.kbind.io/adopt={connection} to move \
             the whole API"
        )),
        Some(_) => Admission::Route(schema),
    }
}

/// A binding as routing sees it: its scope, what it lists, the route it offers and whether it
/// was admitted ([`admit`]).
#[derive(Debug, Clone)]
pub struct Offer {
    /// `<namespace>/<name>` of a Binding, `<name>` of a ClusterBinding.
    pub binding: String,
    /// The Binding's namespace; `None` for a ClusterBinding (every namespace, and cluster-scoped
    /// objects).
    pub namespace: Option<String>,
    pub apis: BTreeSet<String>,
    pub route: Route,
    pub selector: Option<Selector>,
    pub schema: Schema,
    pub admitted: bool,
}

/// The candidates for an instance of `api` in `namespace` (`None`: cluster-scoped): the admitted
/// offers that list the API and cover the instance's scope — a ClusterBinding every instance, a
/// Binding those in its own namespace.
pub fn candidates(offers: &[Offer], api: &str, namespace: Option<&str>) -> Vec<Candidate> {
    offers
        .iter()
        .filter(|o| o.admitted && o.apis.contains(api))
        .filter(|o| match (&o.namespace, namespace) {
            (None, _) => true,
            (Some(own), Some(ns)) => own == ns,
            (Some(_), None) => false,
        })
        .map(|o| Candidate {
            binding: o.binding.clone(),
            route: o.route.clone(),
            selector: o.selector.clone(),
            schema: o.schema.clone(),
        })
        .collect()
}

/// The finalizer an instance holds while its copy lives on `connection`'s provider: kbind's one
/// finalizer ([`keys::SYNCER_FINALIZER`]) for the Connection serving the CRD (`served_by`) — so
/// objects synced before routing existed need no write — and
/// `core.kbind.io/route-<connection>` for another (a Connection name too long for a finalizer
/// is shortened, with a hash of the whole name).
pub fn finalizer(connection: &str, served_by: &str) -> String {
    if connection == served_by {
        return keys::SYNCER_FINALIZER.to_owned();
    }
    // The name part of a qualified name holds at most 63 characters.
    let room = 63 - (keys::ROUTE_FINALIZER_PREFIX.len() - keys::GROUP.len() - 1);
    if connection.len() <= room {
        return format!("{}{connection}", keys::ROUTE_FINALIZER_PREFIX);
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(connection.as_bytes());
    let hash: String = digest.iter().take(5).map(|b| format!("{b:02x}")).collect();
    let head: String = connection.chars().take(room - hash.len() - 1).collect();
    format!(
        "{}{}-{hash}",
        keys::ROUTE_FINALIZER_PREFIX,
        head.trim_end_matches(['.', '-'])
    )
}

/// The pin an instance's annotation states: `<connection>/<cluster UID>`, or a bare
/// `<connection>` completed with `cluster_of` (that Connection's pinned provider), so a user may
/// move an object by naming only the Connection.
pub fn read_pin(text: Option<&str>, cluster_of: impl Fn(&str) -> Option<String>) -> Pin {
    let Some(text) = text else {
        return Pin::None;
    };
    if !text.contains('/') && !text.is_empty() {
        return match cluster_of(text) {
            Some(cluster) => Pin::Set(Route {
                connection: text.to_owned(),
                cluster,
            }),
            None => Pin::Invalid(format!(
                "route pin {text:?} names a Connection whose provider is not known"
            )),
        };
    }
    match Route::parse_pin(text) {
        Ok(route) => Pin::Set(route),
        Err(message) => Pin::Invalid(message),
    }
}

/// What the worker of one route does for an instance of a routed API (one worker per route and
/// API; every worker decides from the same consumer object, so exactly one of them acts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Sync it here (spec up, status down); `changed`: its labels now choose another route
    /// (`RouteChanged` is shown, nothing moves).
    Sync { changed: Option<String> },
    /// Record the pin (with this route's finalizer) before anything is written here.
    Pin(Route),
    /// The user moved it away: delete this route's copy (`orphan`: strip kbind's markers and
    /// leave it), then drop this route's finalizer.
    Release { orphan: bool },
    /// Written nowhere: show why (this worker reports it).
    Hold(Reason, String),
    /// Another route's business, or nothing to do.
    Idle,
    /// No admitted binding covers it, it is pinned nowhere and holds no copy: routing leaves it
    /// alone — no mark, no record, no Event — as if the API were not routed (a tenant's route
    /// Binding elsewhere never touches it).
    Uncovered,
}

/// [`Gate`] for the worker of route `mine`: `served_by` is the Connection serving the CRD,
/// `pin` the instance's pin ([`read_pin`]), `finalizers` its finalizers (which routes hold a
/// copy), `candidates` the bindings covering it and `labels` its labels. An instance without a
/// pin whose copy is held on exactly one route is pinned there (objects synced before routing
/// existed); a move happens only through the pin. `barred` says why the instance's namespace
/// may not use a Connection, if it may not ([`barred`]): a pin to it is held as
/// [`Reason::NotAllowed`], not as a route nobody offers.
#[allow(clippy::too_many_arguments)]
pub fn gate(
    mine: &Route,
    served_by: &str,
    pin: &Pin,
    finalizers: &[String],
    candidates: &[Candidate],
    labels: &BTreeMap<String, String>,
    orphan: bool,
    barred: &dyn Fn(&str) -> Option<String>,
) -> Gate {
    let route_of = |connection: &str| -> Route {
        if connection == mine.connection {
            return mine.clone();
        }
        candidates
            .iter()
            .map(|c| &c.route)
            .find(|r| r.connection == connection)
            .cloned()
            .unwrap_or_else(|| Route {
                connection: connection.to_owned(),
                cluster: String::new(),
            })
    };
    let mut known: Vec<&str> = candidates
        .iter()
        .map(|c| c.route.connection.as_str())
        .chain([mine.connection.as_str(), served_by])
        .collect();
    known.sort_unstable();
    known.dedup();
    let held: Vec<Route> = finalizers
        .iter()
        .filter(|f| *f == keys::SYNCER_FINALIZER || f.starts_with(keys::ROUTE_FINALIZER_PREFIX))
        .map(
            |f| match known.iter().find(|c| finalizer(c, served_by) == *f) {
                Some(connection) => route_of(connection),
                // A route no binding names any more: its copy is somewhere this worker cannot see.
                None => Route {
                    connection: f.clone(),
                    cluster: String::new(),
                },
            },
        )
        .collect();
    if candidates.is_empty() && *pin == Pin::None && held.is_empty() {
        return Gate::Uncovered;
    }
    let pin = match (pin, held.as_slice()) {
        (Pin::None, [only]) => Pin::Set(only.clone()),
        (pin, _) => pin.clone(),
    };
    let target = match &pin {
        Pin::Set(route) => Some(route),
        _ => None,
    };
    // A copy on another route than the target goes first; else the target's own.
    let copy = held
        .iter()
        .find(|r| Some(*r) != target)
        .or_else(|| held.first())
        .map(|route| Copy {
            route: route.clone(),
            deleting: false,
        });
    let choice = choose(candidates, labels);
    let step = match (
        decide(&pin, copy.as_ref(), &choice, candidates, orphan),
        &pin,
    ) {
        (Step::Hold(Reason::NoRoute, message), Pin::Set(route)) => {
            match barred(&route.connection) {
                Some(why) => Step::Hold(Reason::NotAllowed, why),
                None => Step::Hold(Reason::NoRoute, message),
            }
        }
        (step, _) => step,
    };
    match step {
        Step::Hold(reason, message) => {
            let reporter = held.first().map_or(served_by, |r| r.connection.as_str());
            if reporter == mine.connection {
                Gate::Hold(reason, message)
            } else {
                Gate::Idle
            }
        }
        Step::Pin(route) if route == *mine => Gate::Pin(route),
        Step::Sync { route, conflict } if route == *mine => Gate::Sync {
            changed: conflict.map(|(_, message)| message),
        },
        Step::Release { route, orphan } if route == *mine => Gate::Release { orphan },
        _ => Gate::Idle,
    }
}

/// [`Gate`] for an object of an API that is not routed (no binding offers another route), as the
/// serving Connection's worker sees it — `None`: sync it as usual. An object still holding
/// another route's finalizer waits until that copy is released (never two copies); one pinned
/// to another Connection is held (`NoRoute`), never moved back silently.
pub fn unrouted(
    served_by: &str,
    pin: Option<&str>,
    finalizers: &[String],
    barred: &dyn Fn(&str) -> Option<String>,
) -> Option<Gate> {
    if finalizers
        .iter()
        .any(|f| f.starts_with(keys::ROUTE_FINALIZER_PREFIX))
    {
        return Some(Gate::Idle);
    }
    let pin = pin?;
    let connection = pin.split('/').next().unwrap_or_default();
    if connection == served_by {
        return None;
    }
    if let Pin::Set(route) = read_pin(Some(pin), |_| Some(String::new()))
        && let Some(why) = barred(&route.connection)
    {
        return Some(Gate::Hold(Reason::NotAllowed, why));
    }
    let message = match read_pin(Some(pin), |_| Some(String::new())) {
        Pin::Invalid(message) => message,
        _ => format!(
            "pinned to Connection {connection}, which no binding covering it offers; change or \
             remove {} to sync it",
            keys::ROUTE_ANNOTATION
        ),
    };
    Some(Gate::Hold(Reason::NoRoute, message))
}

/// Why an instance in `namespace` may not be pinned to Connection `connection`, whose access
/// rules allow Bindings only in `allowed` (`None`: everywhere) — `None` when it may. Only a
/// namespaced instance can be barred (ClusterBindings, made by cluster administrators, may use
/// any Connection).
pub fn barred(
    connection: &str,
    namespace: Option<&str>,
    allowed: Option<&[String]>,
) -> Option<String> {
    let (namespace, allowed) = (namespace?, allowed?);
    if allowed.iter().any(|n| n == namespace) {
        return None;
    }
    Some(format!(
        "pinned to Connection {connection}, which namespace {namespace} may not use (its \
         spec.access.bindingNamespaces does not list {namespace}); change or remove {} to sync it",
        keys::ROUTE_ANNOTATION
    ))
}

/// Whether an object is on a route already — pinned (its annotation) or holding a copy (kbind's
/// finalizer, or a route's): it stays there whatever a new binding selects.
pub fn placed(annotations: &BTreeMap<String, String>, finalizers: &[String]) -> bool {
    annotations.contains_key(keys::ROUTE_ANNOTATION)
        || finalizers
            .iter()
            .any(|f| f == keys::SYNCER_FINALIZER || f.starts_with(keys::ROUTE_FINALIZER_PREFIX))
}

/// Where an object is, for the routing table: the Connection it is to sync with (its pin, or
/// the one route holding its copy) and the Connections still holding a copy of it elsewhere (a
/// move under way). `served_by` serves the CRD (kbind's plain finalizer is its route).
pub fn placement(
    served_by: &str,
    pin: Option<&str>,
    finalizers: &[String],
) -> (Option<String>, Vec<String>) {
    let held: Vec<String> = finalizers
        .iter()
        .filter_map(|f| {
            if f == keys::SYNCER_FINALIZER {
                Some(served_by.to_owned())
            } else {
                f.strip_prefix(keys::ROUTE_FINALIZER_PREFIX)
                    .map(str::to_owned)
            }
        })
        .collect();
    let target = match pin {
        Some(pin) => Some(pin.split('/').next().unwrap_or_default().to_owned()),
        None if held.len() == 1 => held.first().cloned(),
        None => None,
    };
    let elsewhere = held
        .into_iter()
        .filter(|c| Some(c) != target.as_ref())
        .collect();
    (target, elsewhere)
}

fn list(routes: &[Route]) -> String {
    routes
        .iter()
        .map(Route::pin_text)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn route(connection: &str) -> Route {
        Route {
            connection: connection.into(),
            cluster: format!("uid-{connection}"),
        }
    }

    fn candidate(binding: &str, connection: &str, selector: Option<&str>) -> Candidate {
        Candidate {
            binding: binding.into(),
            route: route(connection),
            // `key=value`
            selector: selector.map(|s| {
                let (k, v) = s.split_once('=').expect("key=value");
                Selector::from_iter([(k.to_owned(), v.to_owned())])
            }),
            schema: Schema::Agrees,
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn pins_read_back_what_they_wrote_and_name_what_is_wrong() {
        let r = route("eu");
        assert_eq!(Route::parse_pin(&r.pin_text()), Ok(r));
        for bad in ["", "eu", "/uid", "eu/", "eu/a/b"] {
            let e = Route::parse_pin(bad).unwrap_err();
            assert!(e.contains("<connection>/<provider cluster UID>"), "{e}");
        }
    }

    #[test]
    fn a_selector_beats_the_default_and_exactly_one_route_must_win() {
        let default_eu = candidate("all", "eu", None);
        let us = candidate("us-only", "us", Some("region=us"));
        let gold = candidate("gold", "gold", Some("tier=gold"));
        let eu_again = candidate("team-a/eu", "eu", None);
        for (name, candidates, object, want) in [
            (
                "the default route",
                vec![default_eu.clone(), us.clone()],
                labels(&[]),
                Choice::Route(route("eu")),
            ),
            (
                "a selector beats the default",
                vec![default_eu.clone(), us.clone()],
                labels(&[("region", "us")]),
                Choice::Route(route("us")),
            ),
            (
                "two selectors match",
                vec![default_eu.clone(), us.clone(), gold.clone()],
                labels(&[("region", "us"), ("tier", "gold")]),
                Choice::Ambiguous(vec![route("gold"), route("us")]),
            ),
            (
                "two defaults on different Connections",
                vec![default_eu.clone(), candidate("other", "us", None)],
                labels(&[]),
                Choice::Ambiguous(vec![route("eu"), route("us")]),
            ),
            (
                "two bindings, one Connection: one route",
                vec![default_eu.clone(), eu_again.clone()],
                labels(&[]),
                Choice::Route(route("eu")),
            ),
            (
                "no default and no match",
                vec![us.clone()],
                labels(&[("region", "eu")]),
                Choice::NoRoute,
            ),
            ("no binding", vec![], labels(&[]), Choice::NoRoute),
        ] {
            assert_eq!(choose(&candidates, &object), want, "{name}");
        }
    }

    #[test]
    fn the_pin_state_machine() {
        let (eu, us) = (route("eu"), route("us"));
        let both = vec![
            candidate("all", "eu", None),
            candidate("us-only", "us", Some("region=us")),
        ];
        let mut mismatched = both.clone();
        mismatched[1].schema = Schema::Mismatch("field spec.size removed".into());
        let at = |r: &Route, deleting: bool| Copy {
            route: r.clone(),
            deleting,
        };
        let hold = |step: Step| match step {
            Step::Hold(reason, _) => Some(reason),
            _ => None,
        };
        let set = |r: &Route| Pin::Set(r.clone());
        let eu_wins = Choice::Route(eu.clone());
        let us_wins = Choice::Route(us.clone());
        let ambiguous = Choice::Ambiguous(vec![eu.clone(), us.clone()]);

        // New objects: pinned first, written nowhere while unrouted.
        assert_eq!(
            decide(&Pin::None, None, &eu_wins, &both, false),
            Step::Pin(eu.clone())
        );
        assert_eq!(
            hold(decide(&Pin::None, None, &ambiguous, &both, false)),
            Some(Reason::AmbiguousRoute)
        );
        assert_eq!(
            hold(decide(&Pin::None, None, &Choice::NoRoute, &both, false)),
            Some(Reason::NoRoute)
        );
        assert_eq!(
            hold(decide(&Pin::None, None, &us_wins, &mismatched, false)),
            Some(Reason::SchemaMismatch)
        );
        // Pinned: synced where pinned; a label change is reported, nothing moves.
        assert_eq!(
            decide(&set(&eu), Some(&at(&eu, false)), &eu_wins, &both, false),
            Step::Sync {
                route: eu.clone(),
                conflict: None
            }
        );
        for choice in [&us_wins, &ambiguous, &Choice::NoRoute] {
            match decide(&set(&eu), Some(&at(&eu, false)), choice, &both, false) {
                Step::Sync {
                    route,
                    conflict: Some((Reason::RouteChanged, _)),
                } => assert_eq!(route, eu),
                other => panic!("{choice:?}: {other:?}"),
            }
        }
        // A route whose schema drifted holds only its own objects.
        assert_eq!(
            hold(decide(
                &set(&us),
                Some(&at(&us, false)),
                &us_wins,
                &mismatched,
                false
            )),
            Some(Reason::SchemaMismatch)
        );
        assert!(matches!(
            decide(
                &set(&eu),
                Some(&at(&eu, false)),
                &eu_wins,
                &mismatched,
                false
            ),
            Step::Sync { .. }
        ));
        // Its route withdrawn (no binding offers it): held where it is.
        assert_eq!(
            hold(decide(
                &set(&us),
                Some(&at(&us, false)),
                &eu_wins,
                &both[..1],
                false
            )),
            Some(Reason::NoRoute)
        );
        // The explicit move: the pin removed → the old copy goes first (deleted or orphaned),
        // its deletion is waited for, then the new route is pinned.
        assert_eq!(
            decide(&Pin::None, Some(&at(&eu, false)), &us_wins, &both, false),
            Step::Release {
                route: eu.clone(),
                orphan: false
            }
        );
        assert_eq!(
            decide(&Pin::None, Some(&at(&eu, false)), &us_wins, &both, true),
            Step::Release {
                route: eu.clone(),
                orphan: true
            }
        );
        assert_eq!(
            decide(&Pin::None, Some(&at(&eu, true)), &us_wins, &both, false),
            Step::WaitGone(eu.clone())
        );
        assert_eq!(
            decide(&Pin::None, None, &us_wins, &both, false),
            Step::Pin(us.clone())
        );
        // The pin removed while its labels still choose the same route: re-pinned, no move.
        assert_eq!(
            decide(&Pin::None, Some(&at(&eu, false)), &eu_wins, &both, false),
            Step::Pin(eu.clone())
        );
        // The pin removed but nowhere to go: the copy stays.
        assert_eq!(
            hold(decide(
                &Pin::None,
                Some(&at(&eu, false)),
                &ambiguous,
                &both,
                false
            )),
            Some(Reason::AmbiguousRoute)
        );
        // The pin changed by hand to another offered route: a move too.
        assert_eq!(
            decide(&set(&us), Some(&at(&eu, false)), &eu_wins, &both, false),
            Step::Release {
                route: eu.clone(),
                orphan: false
            }
        );
        // An unreadable pin: held, the copy stays.
        assert_eq!(
            hold(decide(
                &Pin::Invalid("bad".into()),
                Some(&at(&eu, false)),
                &eu_wins,
                &both,
                false
            )),
            Some(Reason::NoRoute)
        );
    }

    #[test]
    fn a_second_connection_is_a_route_only_through_a_selecting_binding() {
        const W: &str = "widgets.example.org";
        let drift = Schema::Mismatch("spec.size retyped".into());
        // (case, binding's Connection, selects, CRD served by, schema, want)
        for (name, connection, selects, served_by, schema, want) in [
            (
                "not installed yet",
                "eu",
                false,
                None,
                Schema::Agrees,
                Some(Admission::Serves),
            ),
            (
                "its own CRD",
                "eu",
                false,
                Some("eu"),
                Schema::Agrees,
                Some(Admission::Serves),
            ),
            (
                "its own, selecting",
                "eu",
                true,
                Some("eu"),
                Schema::Agrees,
                Some(Admission::Serves),
            ),
            (
                "another's, no selector",
                "us",
                false,
                Some("eu"),
                Schema::Agrees,
                None,
            ),
            (
                "another's, selecting",
                "us",
                true,
                Some("eu"),
                Schema::Agrees,
                Some(Admission::Route(Schema::Agrees)),
            ),
            (
                "another's, selecting, drifted",
                "us",
                true,
                Some("eu"),
                drift.clone(),
                Some(Admission::Route(drift.clone())),
            ),
        ] {
            match (admit(W, connection, selects, served_by, schema), want) {
                (Admission::Refused(message), None) => {
                    assert!(
                        message.contains("serves Connection eu"),
                        "{name}: {message}"
                    );
                    assert!(message.contains("object selector"), "{name}: {message}");
                    assert!(
                        message.contains("core.kbind.io/adopt=us"),
                        "{name}: {message}"
                    );
                }
                (got, want) => assert_eq!(Some(got), want, "{name}"),
            }
        }
    }

    #[test]
    fn candidates_are_the_admitted_offers_covering_the_instance() {
        const W: &str = "widgets.example.org";
        let offer =
            |binding: &str, namespace: Option<&str>, connection: &str, admitted: bool| Offer {
                binding: binding.into(),
                namespace: namespace.map(Into::into),
                apis: BTreeSet::from([W.to_owned()]),
                route: route(connection),
                selector: None,
                schema: Schema::Agrees,
                admitted,
            };
        let mut gadgets = offer("gadgets", None, "ap", true);
        gadgets.apis = BTreeSet::from(["gadgets.example.org".to_owned()]);
        let offers = [
            offer("all", None, "eu", true),
            offer("team-a/us", Some("team-a"), "us", true),
            offer("team-b/us", Some("team-b"), "us", true),
            offer("refused", None, "ap", false),
            gadgets,
        ];
        let names = |namespace: Option<&str>| -> Vec<String> {
            candidates(&offers, W, namespace)
                .into_iter()
                .map(|c| c.binding)
                .collect()
        };
        assert_eq!(names(Some("team-a")), ["all", "team-a/us"]);
        assert_eq!(names(Some("team-c")), ["all"]);
        assert_eq!(names(None), ["all"]);
        assert!(candidates(&offers, "other.example.org", Some("team-a")).is_empty());
    }

    /// A world the decisions run in: three Connections, bindings that come and go with changing
    /// selectors, labels edited, pins removed or set by hand, provider deletions that finish
    /// when they finish. kbind's steps are carried out as the syncer would.
    #[derive(Debug, Clone)]
    enum Event {
        Label(u8),
        Binding(u8, Option<u8>),
        Unbind(u8),
        Drift(u8, bool),
        RemovePin,
        SetPin(u8),
        ProviderDeletes,
        Kbind,
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            (0u8..3).prop_map(Event::Label),
            (0u8..3, prop::option::of(0u8..3)).prop_map(|(c, s)| Event::Binding(c, s)),
            (0u8..3).prop_map(Event::Unbind),
            (0u8..3, any::<bool>()).prop_map(|(c, d)| Event::Drift(c, d)),
            Just(Event::RemovePin),
            (0u8..3).prop_map(Event::SetPin),
            Just(Event::ProviderDeletes),
            Just(Event::Kbind),
            Just(Event::Kbind),
            Just(Event::Kbind),
        ]
    }

    proptest! {
        #[test]
        fn one_object_has_at_most_one_kbind_copy_and_moves_only_when_the_user_says(
            events in prop::collection::vec(event(), 1..80),
            orphan in any::<bool>(),
        ) {
            const CONNECTIONS: [&str; 3] = ["eu", "us", "ap"];
            let mut bindings: BTreeMap<u8, Option<u8>> = BTreeMap::from([(0, None)]);
            let mut drifted = [false; 3];
            let mut object_labels = labels(&[]);
            let mut pin = Pin::None;
            // Provider copies kbind owns: route → deleting; orphaned ones are foreign.
            let mut owned: BTreeMap<Route, bool> = BTreeMap::new();
            let mut foreign: BTreeSet<Route> = BTreeSet::new();
            // Routes the user authorised a move away from (by removing or changing the pin).
            let mut may_leave: BTreeSet<Route> = BTreeSet::new();
            for event in events {
                match event {
                    Event::Label(v) => {
                        object_labels = labels(&[("k", &v.to_string())]);
                    }
                    Event::Binding(c, s) => {
                        bindings.insert(c, s);
                    }
                    Event::Unbind(c) => {
                        bindings.remove(&c);
                    }
                    Event::Drift(c, d) => drifted[c as usize] = d,
                    Event::RemovePin => {
                        if let Pin::Set(r) = &pin {
                            may_leave.insert(r.clone());
                        }
                        pin = Pin::None;
                    }
                    Event::SetPin(c) => {
                        if let Pin::Set(r) = &pin {
                            may_leave.insert(r.clone());
                        }
                        pin = Pin::Set(route(CONNECTIONS[c as usize]));
                    }
                    Event::ProviderDeletes => owned.retain(|_, deleting| !*deleting),
                    Event::Kbind => {
                        let candidates: Vec<Candidate> = bindings
                            .iter()
                            .map(|(c, s)| {
                                let name = CONNECTIONS[*c as usize];
                                let mut cand = candidate(
                                    name,
                                    name,
                                    s.map(|v| format!("k={v}")).as_deref(),
                                );
                                if drifted[*c as usize] {
                                    cand.schema = Schema::Mismatch("drift".into());
                                }
                                cand
                            })
                            .collect();
                        let copy = owned.iter().next().map(|(r, deleting)| Copy {
                            route: r.clone(),
                            deleting: *deleting,
                        });
                        let choice = choose(&candidates, &object_labels);
                        match decide(&pin, copy.as_ref(), &choice, &candidates, orphan) {
                            Step::Hold(..) | Step::WaitGone(_) => {}
                            Step::Pin(r) => pin = Pin::Set(r),
                            Step::Sync { route, .. } => {
                                prop_assert_eq!(&pin, &Pin::Set(route.clone()), "synced unpinned");
                                // A copy it left behind (orphaned) is foreign: the sync's
                                // ownership check reports a conflict and writes nothing.
                                if !foreign.contains(&route) {
                                    owned.entry(route).or_insert(false);
                                }
                            }
                            Step::Release { route, orphan: o } => {
                                prop_assert!(
                                    may_leave.contains(&route),
                                    "moved off {:?} without the user's say", route
                                );
                                if o {
                                    owned.remove(&route);
                                    foreign.insert(route);
                                } else {
                                    owned.insert(route, true);
                                }
                            }
                        }
                    }
                }
                prop_assert!(owned.len() <= 1, "two kbind copies: {:?}", owned);
            }
        }
    }

    #[test]
    fn route_finalizers_are_qualified_names_and_the_served_route_keeps_the_old_one() {
        assert_eq!(finalizer("eu", "eu"), keys::SYNCER_FINALIZER);
        assert_eq!(finalizer("us", "eu"), "core.kbind.io/route-us");
        let long = "a".repeat(200);
        let f = finalizer(&long, "eu");
        let (prefix, name) = f.split_once('/').unwrap();
        assert_eq!(prefix, keys::GROUP);
        assert!(name.len() <= 63, "{f}");
        assert_ne!(f, finalizer(&format!("{long}b"), "eu"));
    }

    #[test]
    fn bare_pins_name_the_connection_and_unknown_ones_say_so() {
        let cluster_of = |c: &str| (c == "us").then(|| "uid-us".to_owned());
        assert_eq!(read_pin(None, cluster_of), Pin::None);
        assert_eq!(read_pin(Some("us"), cluster_of), Pin::Set(route("us")));
        assert_eq!(
            read_pin(Some("us/uid-x"), cluster_of),
            Pin::Set(Route {
                connection: "us".into(),
                cluster: "uid-x".into()
            })
        );
        assert!(
            matches!(read_pin(Some("gone"), cluster_of), Pin::Invalid(m) if m.contains("gone"))
        );
        assert!(matches!(
            read_pin(Some("a/b/c"), cluster_of),
            Pin::Invalid(_)
        ));
    }

    /// Every worker decides from the same object; exactly one acts.
    #[test]
    fn exactly_one_route_worker_acts() {
        let candidates = vec![
            candidate("all", "eu", None),
            candidate("us-only", "us", Some("region=us")),
            candidate("gold", "gold", Some("tier=gold")),
        ];
        let (eu, us) = (route("eu"), route("us"));
        let syncer = keys::SYNCER_FINALIZER.to_owned();
        let us_fin = finalizer("us", "eu");
        let gates = |pin: Pin, finalizers: &[String], object: &[(&str, &str)]| {
            [route("eu"), route("us"), route("gold")]
                .iter()
                .map(|mine| {
                    gate(
                        mine,
                        "eu",
                        &pin,
                        finalizers,
                        &candidates,
                        &labels(object),
                        false,
                        &|_| None,
                    )
                })
                .collect::<Vec<_>>()
        };
        let idle = Gate::Idle;
        let sync = Gate::Sync { changed: None };
        for (name, got, want) in [
            ("new, default", gates(Pin::None, &[], &[]), [Gate::Pin(eu.clone()), idle.clone(), idle.clone()]),
            ("new, selected", gates(Pin::None, &[], &[("region", "us")]), [idle.clone(), Gate::Pin(us.clone()), idle.clone()]),
            ("pinned, synced there", gates(Pin::Set(us.clone()), std::slice::from_ref(&us_fin), &[("region", "us")]), [idle.clone(), sync.clone(), idle.clone()]),
            ("pinned by a user to a route not yet held", gates(Pin::Set(us.clone()), &[], &[]), [idle.clone(), Gate::Sync { changed: Some("its labels now choose eu/uid-eu; it stays on us/uid-us until its pin is removed".into()) }, idle.clone()]),
            ("synced before routing: the old finalizer pins it", gates(Pin::None, std::slice::from_ref(&syncer), &[]), [sync.clone(), idle.clone(), idle.clone()]),
            ("moved by its pin: the old route releases first", gates(Pin::Set(us.clone()), std::slice::from_ref(&syncer), &[]), [Gate::Release { orphan: false }, idle.clone(), idle.clone()]),
            ("both held mid-move: still the old one first", gates(Pin::Set(us.clone()), &[syncer.clone(), us_fin.clone()], &[]), [Gate::Release { orphan: false }, idle.clone(), idle.clone()]),
            ("ambiguous and new: the served route's worker reports", gates(Pin::None, &[], &[("region", "us"), ("tier", "gold")]), [Gate::Hold(Reason::AmbiguousRoute, "routes gold/uid-gold, us/uid-us all select it".into()), idle.clone(), idle.clone()]),
        ] {
            assert_eq!(got.to_vec(), want.to_vec(), "{name}");
        }
        // A label change after the pin: it stays, RouteChanged, on the pinned route only.
        let changed = gates(
            Pin::None,
            std::slice::from_ref(&us_fin),
            &[("tier", "gold")],
        );
        assert!(
            matches!(&changed[1], Gate::Sync { changed: Some(m) } if m.contains("gold")),
            "{changed:?}"
        );
        assert_eq!((&changed[0], &changed[2]), (&idle, &idle));
    }

    /// An object no admitted binding covers, pinned nowhere and holding no copy, is left alone
    /// by every route's worker; one pinned or holding a copy is still routing's business.
    #[test]
    fn routing_touches_only_what_it_covers() {
        let mine = route("eu");
        let gate_of = |pin: &Pin, finalizers: &[String], candidates: &[Candidate]| {
            gate(
                &mine,
                "eu",
                pin,
                finalizers,
                candidates,
                &labels(&[]),
                false,
                &|_| None,
            )
        };
        let selecting = vec![candidate("us-only", "us", Some("region=us"))];
        let syncer = vec![keys::SYNCER_FINALIZER.to_owned()];
        // (case, gate)
        let cases: [(&str, Gate); 4] = [
            ("uncovered", gate_of(&Pin::None, &[], &[])),
            (
                "covered by a selecting binding it does not match: held, reported",
                gate_of(&Pin::None, &[], &selecting),
            ),
            (
                "uncovered but pinned",
                gate_of(&Pin::Set(route("us")), &[], &[]),
            ),
            (
                "uncovered but holding a copy",
                gate_of(&Pin::None, &syncer, &[]),
            ),
        ];
        assert_eq!(cases[0].1, Gate::Uncovered, "{}", cases[0].0);
        for (case, got) in &cases[1..] {
            assert_ne!(*got, Gate::Uncovered, "{case}");
        }
        assert!(
            matches!(&cases[1].1, Gate::Hold(Reason::NoRoute, _)),
            "{:?}",
            cases[1].1
        );
    }

    #[test]
    fn an_unrouted_api_never_syncs_what_another_route_holds_or_is_pinned_to() {
        let fin = |f: &str| vec![f.to_owned()];
        assert_eq!(unrouted("eu", None, &[], &|_| None), None);
        assert_eq!(
            unrouted("eu", None, &fin(keys::SYNCER_FINALIZER), &|_| None),
            None
        );
        assert_eq!(unrouted("eu", Some("eu/uid-eu"), &[], &|_| None), None);
        assert_eq!(unrouted("eu", Some("eu"), &[], &|_| None), None);
        assert_eq!(
            unrouted("eu", None, &fin(&finalizer("us", "eu")), &|_| None),
            Some(Gate::Idle)
        );
        assert!(
            matches!(unrouted("eu", Some("us/uid-us"), &[], &|_| None), Some(Gate::Hold(Reason::NoRoute, m)) if m.contains("Connection us"))
        );
        assert!(
            matches!(unrouted("eu", Some("a/b/c"), &[], &|_| None), Some(Gate::Hold(Reason::NoRoute, m)) if m.contains("not <connection>"))
        );
    }

    /// A pin to a Connection the object's namespace may not use says so, naming the access
    /// rule — routed or not; a pin to one it may use but no binding offers stays `NoRoute`.
    #[test]
    fn a_pin_to_a_connection_the_namespace_may_not_use_is_not_allowed() {
        let only_b = vec!["team-b".to_owned()];
        assert_eq!(barred("us", Some("team-b"), Some(&only_b)), None);
        assert_eq!(barred("us", Some("team-a"), None), None);
        assert_eq!(barred("us", None, Some(&only_b)), None);
        let why = barred("us", Some("team-a"), Some(&only_b)).unwrap();
        assert!(
            why.contains("Connection us")
                && why.contains("namespace team-a may not use")
                && why.contains("spec.access.bindingNamespaces"),
            "{why}"
        );
        let bars = |c: &str| barred(c, Some("team-a"), (c == "us").then_some(only_b.as_slice()));
        // Routed: the served route's worker reports it.
        let held = gate(
            &route("eu"),
            "eu",
            &Pin::Set(route("us")),
            &[],
            &[candidate("all", "eu", None)],
            &labels(&[]),
            false,
            &bars,
        );
        assert!(
            matches!(&held, Gate::Hold(Reason::NotAllowed, m) if *m == why),
            "{held:?}"
        );
        let offered_nowhere = gate(
            &route("eu"),
            "eu",
            &Pin::Set(route("gold")),
            &[],
            &[candidate("all", "eu", None)],
            &labels(&[]),
            false,
            &bars,
        );
        assert!(
            matches!(&offered_nowhere, Gate::Hold(Reason::NoRoute, m) if m.contains("no binding")),
            "{offered_nowhere:?}"
        );
        // Unrouted: the same words.
        assert_eq!(
            unrouted("eu", Some("us"), &[], &bars),
            Some(Gate::Hold(Reason::NotAllowed, why))
        );
        assert!(matches!(
            unrouted("eu", Some("gold"), &[], &bars),
            Some(Gate::Hold(Reason::NoRoute, _))
        ));
    }

    #[test]
    fn the_routing_table_places_each_object_once() {
        let f = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let us = finalizer("us", "eu");
        for (pin, finalizers, want) in [
            (None, f(&[]), (None, vec![])),
            (None, f(&[keys::SYNCER_FINALIZER]), (Some("eu"), vec![])),
            (Some("us/uid"), f(&[&us]), (Some("us"), vec![])),
            (
                Some("us"),
                f(&[keys::SYNCER_FINALIZER]),
                (Some("us"), vec!["eu"]),
            ),
            (Some("eu"), f(&["other.io/x"]), (Some("eu"), vec![])),
        ] {
            let (target, elsewhere) = placement("eu", pin, &finalizers);
            assert_eq!(
                (
                    target.as_deref(),
                    elsewhere.iter().map(String::as_str).collect::<Vec<_>>()
                ),
                want,
                "{pin:?} {finalizers:?}"
            );
        }
        let annotations: BTreeMap<String, String> =
            [(keys::ROUTE_ANNOTATION.to_owned(), "us".to_owned())].into();
        assert!(placed(&annotations, &[]));
        assert!(placed(&BTreeMap::new(), &f(&[keys::SYNCER_FINALIZER])));
        assert!(!placed(&BTreeMap::new(), &f(&["other.io/x"])));
    }
}
