//! What a binding reconcile found per API, and the conditions and `boundAPIs` that says
//! (REFERENCE-BEHAVIOUR §12, BIND-5 … BIND-11, with QRK-4, QRK-17, BIND-14 and LIM-13 improved).

use kbind_shared::api::{ApiStatus, BoundApi};
use kbind_shared::conditions::{Desired, Status, reasons, types};

use super::ledger::{Going, Left};
use crate::instances::Affected;

/// Reason for an API listed in a namespaced Binding that is cluster-scoped (BIND-14, PGAP-6).
pub const CLUSTER_SCOPED_API: &str = "ClusterScopedAPI";
/// Reason while unbind waits for provider copies to be gone (PGAP-1).
pub const DRAINING_OBJECTS: &str = "DrainingObjects";
/// Reason (per API, still bound) when some provider versions are not served on the consumer.
pub const VERSIONS_OMITTED: &str = "VersionsOmitted";
/// Reason (SchemaInSync, per API) while a breaking provider schema change waits for consent.
pub const BREAKING_CHANGE: &str = "BreakingChange";
/// `status.apis[].reason` of an API this binding's Connection serves as an extra route (#36).
pub const ROUTED: &str = "Routed";

/// A breaking provider schema change that is not applied until the user accepts its hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The new schema's hash, what the user accepts.
    pub hash: String,
    /// The Connection whose `spec.schema.acceptedChanges` takes the consent.
    pub connection: String,
    /// Each breaking change, `path: what` (at most [`crate::evolution::MAX_LISTED`]).
    pub changes: Vec<String>,
    /// How many more there were.
    pub more: usize,
    /// Existing consumer objects the new schema would make invalid, if they could be counted.
    pub affected: Option<Affected>,
}

impl Held {
    /// What the user reads: the changes (provider text, made safe), the impact and how to accept.
    pub fn message(&self, api: &str) -> String {
        let safe: Vec<String> = self
            .changes
            .iter()
            .map(|c| kbind_shared::redact::remote(c))
            .collect();
        let mut changes = safe.join("; ");
        if self.more > 0 {
            changes.push_str(&format!("; and {} more", self.more));
        }
        let impact = match self.affected {
            Some(a) => format!(
                "{at_least}{} of {} existing objects would be invalid and {at_least}{} would lose pruned data (local structural check)",
                a.invalid,
                a.checked,
                a.pruned,
                at_least = if a.complete { "" } else { "at least " },
            ),
            None => "existing objects could not be checked".to_owned(),
        };
        // What to act on first: a long list of changes is what a bounded message cuts.
        format!(
            "the provider's new schema {hash} is not applied: {impact}; to apply it, add {{api: {api}, schemaHash: {hash}}} to Connection {}'s spec.schema.acceptedChanges. Breaking changes: {changes}",
            self.connection,
            hash = self.hash,
        )
    }
}

/// Instances of one API in a binding's scope that carry a mark: a conflict annotation, by kind,
/// or a pause.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marks {
    /// `ForeignObjectExists`
    pub foreign: i32,
    /// `OwnedByAnother`
    pub owned_by_another: i32,
    /// Paused: by their annotation, or all of them while the binding is suspended.
    pub paused: i32,
    /// Held or reported by routing (#36): `AmbiguousRoute`, `NoRoute`, `RouteChanged`,
    /// `SchemaMismatch` — not a provider object in the way.
    pub routing: i32,
}

impl Marks {
    /// Every kind of conflict together.
    pub fn total(&self) -> i32 {
        self.foreign + self.owned_by_another + self.routing
    }
}

/// `Conflicts` reason when only routing holds or reports objects.
pub const ROUTE_CONFLICT: &str = "RouteConflict";

/// The state of one listed API after this reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiState {
    /// Not in the Connection's exported APIs (BIND-5a).
    NotExported,
    /// Cluster-scoped, listed in a namespaced Binding.
    ClusterScopedInBinding,
    /// RBAC denied reading the provider schema; other APIs still proceed (QRK-17 fixed).
    Forbidden(String),
    /// The consumer CRD is not kbind's to change (another owner, another Connection, a reserved
    /// group): the message names the owner and the opt-in. Other APIs still proceed.
    SchemaConflict(String),
    /// Waiting (schema not installable yet, CRD missing under pullPolicy None, …).
    Pending(String),
    /// Moving to the binding's Connection from `from`, whose provider is drained first.
    Moving {
        /// The Connection whose provider still holds copies.
        from: String,
        /// What the drain waits for.
        message: String,
    },
    /// Nothing is installed or synced for the whole binding (its Connection is not Ready, or it
    /// may not use it): the Ready condition says why.
    Gated {
        /// The Ready condition's reason.
        reason: &'static str,
        /// Its message.
        message: String,
    },
    /// Served on the consumer by Connection `served_by`; this binding (which selects objects)
    /// offers its own Connection as an extra route, whose schema agrees or not (#36). The CRD
    /// is never touched for it.
    Route {
        /// The Connection the consumer CRD is marked for.
        served_by: String,
        /// This route's provider schema against the served one.
        schema: kbind_shared::routing::Schema,
    },
    /// Installed; `in_sync` tells whether it matches the provider schema.
    Bound {
        /// The desired schema hash.
        hash: String,
        /// Whether the installed CRD carries that hash.
        in_sync: bool,
        /// Conflicting and paused instances.
        marks: Marks,
        /// A breaking change waiting for consent (then not in sync).
        held: Option<Held>,
        /// Provider versions the consumer does not serve, each `name (why)`.
        omitted: Vec<String>,
    },
}

/// Conditions (in setting order) and `boundAPIs` for a binding whose APIs are in `states`;
/// `suspended`: its `spec.suspend` (everything it covers is paused).
pub fn evaluate(
    states: &[(String, ApiState)],
    suspended: bool,
) -> (Vec<Desired<'static>>, Vec<BoundApi>) {
    let names = |pick: fn(&ApiState) -> bool| -> Vec<&str> {
        states
            .iter()
            .filter(|(_, s)| pick(s))
            .map(|(n, _)| n.as_str())
            .collect()
    };
    let messages = |pick: fn(&ApiState) -> Option<&String>| -> Vec<String> {
        states
            .iter()
            .filter_map(|(n, s)| pick(s).map(|m| format!("{n}: {m}")))
            .collect()
    };
    let not_exported = names(|s| matches!(s, ApiState::NotExported));
    let cluster_scoped = names(|s| matches!(s, ApiState::ClusterScopedInBinding));
    let forbidden = messages(|s| {
        if let ApiState::Forbidden(m) = s {
            Some(m)
        } else {
            None
        }
    });
    let schema_conflicts = messages(|s| {
        if let ApiState::SchemaConflict(m) = s {
            Some(m)
        } else {
            None
        }
    });
    let pending = messages(|s| match s {
        ApiState::Pending(m) | ApiState::Gated { message: m, .. } => Some(m),
        _ => None,
    });
    let moving = messages(|s| {
        if let ApiState::Moving { message, .. } = s {
            Some(message)
        } else {
            None
        }
    });

    let mut bound: Vec<BoundApi> = Vec::new();
    let (mut conflicts, mut out_of_sync) = (Marks::default(), Vec::new());
    let mut breaking: Vec<String> = Vec::new();
    for (name, state) in states {
        if let ApiState::Bound {
            hash,
            in_sync,
            marks: c,
            held,
            ..
        } = state
        {
            bound.push(BoundApi {
                name: name.clone(),
                crd_hash: hash.clone(),
                conflict_count: c.total(),
                paused_count: c.paused,
            });
            conflicts.foreign += c.foreign;
            conflicts.owned_by_another += c.owned_by_another;
            conflicts.routing += c.routing;
            match held {
                Some(held) => breaking.push(format!("{name}: {}", held.message(name))),
                None if !in_sync => out_of_sync.push(name.as_str()),
                None => {}
            }
        }
        if let ApiState::Route {
            schema: kbind_shared::routing::Schema::Mismatch(why),
            ..
        } = state
        {
            breaking.push(format!(
                "{name}: this route's schema does not agree with the served one, its objects are held: {why}"
            ));
        }
    }
    bound.sort_by(|a, b| a.name.cmp(&b.name));

    let mut out = Vec::new();
    out.push(if forbidden.is_empty() {
        Desired::new(types::PERMISSION_DENIED, false, reasons::AS_EXPECTED, "")
    } else {
        Desired::new(
            types::PERMISSION_DENIED,
            true,
            reasons::FORBIDDEN,
            forbidden.join("; "),
        )
    });
    let problem: Option<(&'static str, String)> = if !not_exported.is_empty() {
        Some((
            reasons::API_NOT_EXPORTED,
            format!("not exported by the provider: {}", not_exported.join(", ")),
        ))
    } else if !cluster_scoped.is_empty() {
        Some((
            CLUSTER_SCOPED_API,
            format!(
                "cluster-scoped APIs can only be bound by a ClusterBinding: {}",
                cluster_scoped.join(", ")
            ),
        ))
    } else if !schema_conflicts.is_empty() {
        Some((reasons::SCHEMA_CONFLICT, schema_conflicts.join("; ")))
    } else if !forbidden.is_empty() {
        Some((reasons::FORBIDDEN, forbidden.join("; ")))
    } else if !moving.is_empty() {
        Some((DRAINING_OBJECTS, moving.join("; ")))
    } else if !pending.is_empty() {
        Some((reasons::PENDING, pending.join("; ")))
    } else {
        None
    };
    let total = states.len();
    match &problem {
        Some((reason, message)) => {
            out.push(Desired::new(
                types::SYNCED,
                false,
                reason,
                format!("{} of {total} APIs installed; {message}", bound.len()),
            ));
        }
        None if suspended => {
            let paused: i32 = bound.iter().map(|b| b.paused_count).sum();
            out.push(Desired::new(
                types::SYNCED,
                false,
                reasons::PAUSED,
                format!(
                    "suspended (spec.suspend): {paused} object(s) paused, nothing is written for them until it is resumed; all APIs installed"
                ),
            ));
        }
        None => out.push(Desired::new(
            types::SYNCED,
            true,
            reasons::AS_EXPECTED,
            "all APIs installed",
        )),
    }
    out.push(if !breaking.is_empty() {
        Desired::new(
            types::SCHEMA_IN_SYNC,
            false,
            BREAKING_CHANGE,
            kbind_shared::conditions::bounded(
                &breaking.join(" | "),
                kbind_shared::conditions::MAX_MESSAGE,
            ),
        )
    } else {
        let differ = "installed CRDs differ from the provider (updatePolicy Once): ";
        Desired::schema_in_sync(differ, &out_of_sync)
    });
    out.push(conflicts_condition(&conflicts));
    out.push(match problem {
        Some((reason, message)) => Desired::new(types::READY, false, reason, message),
        None => Desired::new(types::READY, true, reasons::AS_EXPECTED, ""),
    });
    (out, bound)
}

/// The `Conflicts` condition for the objects `marks` counts: each kind named by what is in the
/// way (QRK-4 fixed), routing's holds apart from provider objects.
fn conflicts_condition(marks: &Marks) -> Desired<'static> {
    let (f, o, r) = (marks.foreign, marks.owned_by_another, marks.routing);
    let mut parts = Vec::new();
    if f > 0 {
        parts.push(format!("{f} with provider objects kbind does not own"));
    }
    if o > 0 {
        parts.push(format!(
            "{o} with provider objects owned by another consumer"
        ));
    }
    if r > 0 {
        parts.push(format!(
            "{r} held or reported by routing (AmbiguousRoute, NoRoute, RouteChanged, SchemaMismatch, NotAllowed: see each object's core.kbind.io/conflict)"
        ));
    }
    let reason = match (f, o, r) {
        (0, 0, 0) => return Desired::new(types::CONFLICTS, false, reasons::AS_EXPECTED, ""),
        (_, o, _) if o > 0 => reasons::OWNED_BY_ANOTHER,
        (f, _, _) if f > 0 => reasons::FOREIGN_OBJECT_EXISTS,
        _ => ROUTE_CONFLICT,
    };
    let message = match (f, o, r) {
        (f, 0, 0) => format!("{f} object(s) conflict with provider objects kbind does not own"),
        (0, o, 0) => {
            format!("{o} object(s) conflict with provider objects owned by another consumer")
        }
        _ => format!("{} object(s) conflict: {}", f + o + r, parts.join(", ")),
    };
    Desired::new(types::CONFLICTS, true, reason, message)
}

/// How long a per-API message may be (characters).
const MAX_API_MESSAGE: usize = 500;

/// What an unfinished release or move is waiting for.
pub fn going_message(going: &Going) -> String {
    let what = match &going.to {
        Some(to) => format!("moving from Connection {} to {to}", going.held.connection),
        None => format!(
            "no longer bound; releasing it from Connection {}",
            going.held.connection
        ),
    };
    match &going.left {
        Left::Nothing => what,
        Left::Draining(n) => format!("{what}: waiting for {n} provider object(s) to be deleted"),
        Left::Unreachable(why) => format!("{what}: {why}"),
    }
}

/// What a deleting binding still waits for — `waiting` provider copies being deleted, `related`
/// related copies just deleted, providers that cannot be reached — or `None`: nothing left.
pub fn unbind_wait(waiting: usize, related: usize, unreachable: &[String]) -> Option<String> {
    let mut parts = Vec::new();
    if waiting > 0 {
        parts.push(format!(
            "waiting for {waiting} provider object(s) to be deleted"
        ));
    }
    if related > 0 {
        parts.push(format!("deleting {related} related copy(ies)"));
    }
    parts.extend(unreachable.iter().cloned());
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// `status.apis`: one entry per listed API (judged on its own; the binding's `connection` unless
/// it is still moving from another) and one per API still being released, sorted by name.
pub fn entries(connection: &str, states: &[(String, ApiState)], going: &[Going]) -> Vec<ApiStatus> {
    let entry =
        |name: &str, connection: &str, bound: bool, reason: &str, message: &str| ApiStatus {
            name: name.to_owned(),
            connection: connection.to_owned(),
            bound,
            reason: reason.to_owned(),
            message: kbind_shared::conditions::bounded(message, MAX_API_MESSAGE),
            route: None,
        };
    let mut out: Vec<ApiStatus> = states
        .iter()
        .map(|(name, state)| match state {
            ApiState::NotExported => entry(
                name,
                connection,
                false,
                reasons::API_NOT_EXPORTED,
                "not exported by the provider",
            ),
            ApiState::ClusterScopedInBinding => entry(
                name,
                connection,
                false,
                CLUSTER_SCOPED_API,
                "cluster-scoped: only a ClusterBinding can bind it",
            ),
            ApiState::Forbidden(m) => entry(name, connection, false, reasons::FORBIDDEN, m),
            ApiState::SchemaConflict(m) => {
                entry(name, connection, false, reasons::SCHEMA_CONFLICT, m)
            }
            ApiState::Pending(m) => entry(name, connection, false, reasons::PENDING, m),
            ApiState::Gated { reason, message } => entry(name, connection, false, reason, message),
            ApiState::Moving { from, message } => {
                entry(name, from, false, DRAINING_OBJECTS, message)
            }
            ApiState::Route { served_by, schema } => {
                let (reason, message, agrees, why) = match schema {
                    kbind_shared::routing::Schema::Agrees => (
                        ROUTED,
                        format!("a route for the objects this binding selects; the consumer CRD serves Connection {served_by}"),
                        true,
                        String::new(),
                    ),
                    kbind_shared::routing::Schema::Mismatch(why) => (
                        kbind_shared::routing::Reason::SchemaMismatch.as_str(),
                        format!("a route whose schema does not agree with the one Connection {served_by} serves; its objects are held: {why}"),
                        false,
                        kbind_shared::conditions::bounded(why, MAX_API_MESSAGE),
                    ),
                };
                ApiStatus {
                    route: Some(kbind_shared::api::RouteStatus {
                        served_by: served_by.clone(),
                        schema_agrees: agrees,
                        schema_message: why,
                    }),
                    ..entry(name, connection, true, reason, &message)
                }
            }
            ApiState::Bound {
                held: Some(held), ..
            } => entry(name, connection, true, BREAKING_CHANGE, &held.message(name)),
            ApiState::Bound {
                in_sync, omitted, ..
            } => {
                let mut note = if *in_sync {
                    String::new()
                } else {
                    "the installed CRD differs from the provider's schema (updatePolicy Once)"
                        .to_owned()
                };
                if omitted.is_empty() {
                    entry(name, connection, true, reasons::AS_EXPECTED, &note)
                } else {
                    if !note.is_empty() {
                        note.push_str("; ");
                    }
                    note.push_str(&format!(
                        "not served here: {}",
                        kbind_shared::redact::remote(&omitted.join("; "))
                    ));
                    entry(name, connection, true, VERSIONS_OMITTED, &note)
                }
            }
        })
        .collect();
    out.extend(going.iter().filter(|g| g.to.is_none()).map(|g| {
        entry(
            &g.held.api,
            &g.held.connection,
            false,
            DRAINING_OBJECTS,
            &going_message(g),
        )
    }));
    out.sort_by(|a, b| (&a.name, &a.connection).cmp(&(&b.name, &b.connection)));
    out
}

/// Says, in the Ready and Synced messages, which listed APIs a ClusterBinding already covers
/// (the ClusterBinding takes precedence for their instances, RES-2), so an overlapping Binding
/// is never silently shadowed.
pub fn note_precedence(desired: &mut [Desired<'static>], covered: &[(String, String)]) {
    if covered.is_empty() {
        return;
    }
    let list: Vec<String> = covered
        .iter()
        .map(|(api, by)| format!("{api} (ClusterBinding {by})"))
        .collect();
    let note = format!(
        "covered by a ClusterBinding, which takes precedence for its instances here: {}",
        list.join(", ")
    );
    for d in desired
        .iter_mut()
        .filter(|d| d.type_ == types::READY || d.type_ == types::SYNCED)
    {
        d.message = if d.message.is_empty() {
            note.clone()
        } else {
            format!("{}; {note}", d.message)
        };
    }
}

/// The Ready condition while the binding's Connection is missing or not Ready (BIND-3).
pub fn connection_pending(message: String) -> Desired<'static> {
    Desired {
        type_: types::READY,
        status: Status::False,
        reason: reasons::PENDING,
        message,
    }
}

/// Reason for a Binding in a namespace its Connection does not serve (`spec.access`).
pub const NOT_ALLOWED: &str = "NotAllowed";

/// The Ready condition of a Binding whose namespace the Connection's `spec.access` leaves out;
/// `None` when it may use it. Pure: the gate before anything is installed or synced.
pub fn access_denied(
    connection: &kbind_shared::api::Connection,
    binding_namespace: Option<&str>,
) -> Option<Desired<'static>> {
    let namespace = binding_namespace?;
    if connection.spec.access.allows_bindings_in(namespace) {
        return None;
    }
    Some(Desired {
        type_: types::READY,
        status: Status::False,
        reason: NOT_ALLOWED,
        message: format!(
            "Connection {} does not serve Bindings in namespace {namespace} (its spec.access.bindingNamespaces); ask its owner, or use a Connection that does",
            kube::ResourceExt::name_any(connection)
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unbind_names_everything_it_waits_for() {
        let gone = vec!["cannot reach the provider".to_owned()];
        // (waiting, related, unreachable) → message
        let cases: [(usize, usize, &[String], Option<&str>); 5] = [
            (0, 0, &[], None),
            (
                3,
                0,
                &[],
                Some("waiting for 3 provider object(s) to be deleted"),
            ),
            (0, 2, &[], Some("deleting 2 related copy(ies)")),
            (
                1,
                2,
                &[],
                Some(
                    "waiting for 1 provider object(s) to be deleted; deleting 2 related copy(ies)",
                ),
            ),
            (0, 0, &gone, Some("cannot reach the provider")),
        ];
        for (waiting, related, unreachable, want) in cases {
            assert_eq!(
                unbind_wait(waiting, related, unreachable).as_deref(),
                want,
                "{waiting} {related} {unreachable:?}"
            );
        }
    }

    #[test]
    fn the_conflict_count_adds_both_kinds() {
        let conflicts = |foreign, owned_by_another| Marks {
            foreign,
            owned_by_another,
            paused: 7,
            routing: 0,
        };
        assert_eq!(conflicts(2, 3).total(), 5);
        assert_eq!(conflicts(0, 4).total(), 4);
        assert_eq!(conflicts(0, 0).total(), 0);
    }

    /// A binding that is not suspended.
    fn evaluate(states: &[(String, ApiState)]) -> (Vec<Desired<'static>>, Vec<BoundApi>) {
        super::evaluate(states, false)
    }

    #[test]
    fn a_suspended_binding_is_not_synced_and_counts_what_it_pauses() {
        let paused = |paused| {
            bound(Marks {
                paused,
                ..Marks::default()
            })
        };
        let states = [("a.x".into(), paused(3)), ("b.x".into(), paused(4))];
        let (out, bound) = super::evaluate(&states, true);
        let synced = get(&out, "Synced");
        assert_eq!((synced.status, synced.reason), (Status::False, "Paused"));
        assert!(
            synced.message.contains("7 object(s) paused"),
            "{}",
            synced.message
        );
        assert_eq!(bound[0].paused_count, 3);
        assert_eq!(
            get(&out, "Ready").status,
            Status::True,
            "suspending is not a fault"
        );
        // A problem says more than the pause; not suspended, the same counts are just counts.
        let problem = [
            ("a.x".into(), ApiState::NotExported),
            ("b.x".into(), paused(4)),
        ];
        let (out, _) = super::evaluate(&problem, true);
        assert_eq!(get(&out, "Synced").reason, "APINotExported");
        let (out, bound) = evaluate(&states);
        assert_eq!(get(&out, "Synced").status, Status::True);
        assert_eq!(bound[1].paused_count, 4);
    }

    fn bound(marks: Marks) -> ApiState {
        ApiState::Bound {
            hash: "sha256:1".into(),
            in_sync: true,
            marks,
            held: None,
            omitted: Vec::new(),
        }
    }

    fn get<'a>(out: &'a [Desired<'static>], type_: &str) -> &'a Desired<'static> {
        out.iter().find(|d| d.type_ == type_).unwrap()
    }

    #[test]
    fn waits_conflicts_and_schema_drift_are_summed_and_named() {
        let drifted = ApiState::Bound {
            hash: "sha256:2".into(),
            in_sync: false,
            marks: Marks::default(),
            held: None,
            omitted: Vec::new(),
        };
        let gated = ApiState::Gated {
            reason: "NotAllowed",
            message: "not yet".into(),
        };
        // (states, Ready reason, Ready message part, SchemaInSync, Conflicts message part)
        type Case = (
            Vec<(&'static str, ApiState)>,
            &'static str,
            &'static str,
            Status,
            &'static str,
        );
        let cases: Vec<Case> = vec![
            (
                vec![
                    ("a.x", ApiState::Pending("waiting".into())),
                    ("b.x", bound(Marks::default())),
                ],
                "Pending",
                "a.x: waiting",
                Status::True,
                "",
            ),
            (
                vec![("g.x", gated)],
                "Pending",
                "g.x: not yet",
                Status::True,
                "",
            ),
            (
                vec![
                    (
                        "a.x",
                        bound(Marks {
                            foreign: 2,
                            owned_by_another: 0,
                            paused: 0,
                            routing: 0,
                        }),
                    ),
                    (
                        "b.x",
                        bound(Marks {
                            foreign: 3,
                            owned_by_another: 0,
                            paused: 0,
                            routing: 0,
                        }),
                    ),
                ],
                reasons::AS_EXPECTED,
                "",
                Status::True,
                "5 object(s) conflict with provider objects kbind does not own",
            ),
            (
                vec![
                    (
                        "a.x",
                        bound(Marks {
                            foreign: 0,
                            owned_by_another: 1,
                            paused: 0,
                            routing: 0,
                        }),
                    ),
                    (
                        "b.x",
                        bound(Marks {
                            foreign: 0,
                            owned_by_another: 4,
                            paused: 0,
                            routing: 0,
                        }),
                    ),
                ],
                reasons::AS_EXPECTED,
                "",
                Status::True,
                "5 object(s) conflict with provider objects owned by another consumer",
            ),
            (
                vec![("a.x", drifted), ("b.x", bound(Marks::default()))],
                reasons::AS_EXPECTED,
                "",
                Status::False,
                "",
            ),
        ];
        for (states, reason, message, in_sync, conflicts) in cases {
            let states: Vec<(String, ApiState)> =
                states.into_iter().map(|(n, s)| (n.to_owned(), s)).collect();
            let (out, _) = evaluate(&states);
            let ready = get(&out, "Ready");
            assert_eq!(ready.reason, reason, "{states:?}");
            assert!(
                ready.message.contains(message),
                "{states:?}: {}",
                ready.message
            );
            let schema = get(&out, "SchemaInSync");
            assert_eq!(schema.status, in_sync, "{states:?}");
            if in_sync == Status::False {
                assert!(
                    schema.message.contains("a.x") && !schema.message.contains("b.x"),
                    "{}",
                    schema.message
                );
            }
            assert_eq!(get(&out, "Conflicts").message, conflicts, "{states:?}");
        }
    }

    #[test]
    fn all_bound_is_ready_and_sorted() {
        let (out, bound) = evaluate(&[
            ("widgets.example.org".into(), bound(Marks::default())),
            ("gadgets.example.org".into(), bound(Marks::default())),
        ]);
        assert_eq!(get(&out, "Ready").status, Status::True);
        assert_eq!(get(&out, "Synced").status, Status::True);
        assert_eq!(get(&out, "Conflicts").status, Status::False);
        let names: Vec<&str> = bound.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["gadgets.example.org", "widgets.example.org"]);
    }

    #[test]
    fn not_exported_wins_and_is_left_out_of_bound_apis() {
        // BIND-6, BIND-7
        let (out, bound) = evaluate(&[
            ("a.x".into(), ApiState::NotExported),
            ("b.x".into(), bound(Marks::default())),
        ]);
        let ready = get(&out, "Ready");
        assert_eq!(
            (ready.status, ready.reason),
            (Status::False, "APINotExported")
        );
        assert!(ready.message.contains("a.x"));
        assert_eq!(bound.len(), 1);
    }

    #[test]
    fn forbidden_api_does_not_stop_the_others() {
        // QRK-17 fixed
        let (out, bound) = evaluate(&[
            ("a.x".into(), ApiState::Forbidden("denied".into())),
            ("b.x".into(), bound(Marks::default())),
        ]);
        assert_eq!(get(&out, "PermissionDenied").status, Status::True);
        assert_eq!(get(&out, "Ready").reason, "Forbidden");
        assert_eq!(bound.len(), 1, "the allowed API is still bound");
    }

    #[test]
    fn each_api_has_its_own_entry_and_one_bad_api_stops_no_other() {
        use super::super::ledger::Held;
        let moving = ApiState::Moving {
            from: "a".into(),
            message: "moving".into(),
        };
        let gated = ApiState::Gated {
            reason: "NotAllowed",
            message: "no".into(),
        };
        let huge = ApiState::Pending("x".repeat(10_000));
        let states = vec![
            ("ok.x".to_owned(), bound(Marks::default())),
            ("cs.x".to_owned(), ApiState::ClusterScopedInBinding),
            ("ne.x".to_owned(), ApiState::NotExported),
            ("mv.x".to_owned(), moving),
            ("gt.x".to_owned(), gated),
            ("pd.x".to_owned(), huge),
        ];
        let going = vec![
            Going {
                held: Held {
                    api: "gone.x".into(),
                    connection: "a".into(),
                },
                to: None,
                left: Left::Draining(3),
            },
            // A move is reported through its listed API's state, not twice.
            Going {
                held: Held {
                    api: "mv.x".into(),
                    connection: "a".into(),
                },
                to: Some("b".into()),
                left: Left::Draining(1),
            },
        ];
        let out = entries("b", &states, &going);
        let row = |name: &str| out.iter().find(|e| e.name == name).unwrap();
        // (name, connection, bound, reason)
        let want = [
            ("cs.x", "b", false, CLUSTER_SCOPED_API),
            ("gone.x", "a", false, DRAINING_OBJECTS),
            ("gt.x", "b", false, "NotAllowed"),
            ("mv.x", "a", false, DRAINING_OBJECTS),
            ("ne.x", "b", false, reasons::API_NOT_EXPORTED),
            ("ok.x", "b", true, reasons::AS_EXPECTED),
            ("pd.x", "b", false, reasons::PENDING),
        ];
        assert_eq!(out.len(), want.len());
        for (name, connection, is_bound, reason) in want {
            let e = row(name);
            assert_eq!(
                (e.connection.as_str(), e.bound, e.reason.as_str()),
                (connection, is_bound, reason),
                "{name}"
            );
        }
        let names: Vec<&str> = out.iter().map(|e| e.name.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        assert!(
            row("gone.x")
                .message
                .contains("waiting for 3 provider object(s)")
        );
        assert!(
            row("pd.x").message.chars().count() <= 501,
            "messages are bounded"
        );
        // The binding is not Ready, but the good API's entry is bound all the same.
        let (conds, _) = evaluate(&states);
        assert_eq!(get(&conds, "Ready").status, Status::False);
    }

    #[test]
    fn bindings_only_in_the_namespaces_a_connection_serves() {
        use kbind_shared::api::{Connection, ConnectionAccess, ConnectionSpec};
        let connection = |namespaces: Option<&[&str]>| {
            Connection::new(
                "provider",
                ConnectionSpec {
                    access: ConnectionAccess {
                        binding_namespaces: namespaces
                            .map(|n| n.iter().map(|s| (*s).to_owned()).collect()),
                        secrets_to_provider: false,
                        bindings_may_adopt: false,
                    },
                    ..ConnectionSpec::for_secret("kbind", "p")
                },
            )
        };
        // (allowed namespaces, the binding's namespace) → denied?
        type Case<'a> = (Option<&'a [&'a str]>, Option<&'a str>, bool);
        let cases: [Case; 6] = [
            (None, Some("team-a"), false),
            (Some(&["team-a"]), Some("team-a"), false),
            (Some(&["team-a"]), Some("team-b"), true),
            (Some(&[]), Some("team-a"), true),
            (Some(&[]), None, false),
            (Some(&["team-a"]), None, false),
        ];
        for (allowed, namespace, denied) in cases {
            let got = access_denied(&connection(allowed), namespace);
            assert_eq!(got.is_some(), denied, "{allowed:?} {namespace:?}");
            if let Some(d) = got {
                assert_eq!((d.status, d.reason), (Status::False, NOT_ALLOWED));
                assert!(
                    d.message.contains("does not serve Bindings in namespace"),
                    "{}",
                    d.message
                );
            }
        }
    }

    #[test]
    fn schema_conflict_names_the_owner_and_does_not_stop_the_others() {
        let (out, bound) = evaluate(&[
            (
                "certificates.cert-manager.io".into(),
                ApiState::SchemaConflict(
                    "the consumer CRD certificates.cert-manager.io was not created by kbind".into(),
                ),
            ),
            ("b.x".into(), bound(Marks::default())),
        ]);
        let ready = get(&out, "Ready");
        assert_eq!(
            (ready.status, ready.reason),
            (Status::False, "SchemaConflict")
        );
        assert!(
            ready
                .message
                .contains("certificates.cert-manager.io: the consumer CRD"),
            "{}",
            ready.message
        );
        assert_eq!(get(&out, "Synced").reason, "SchemaConflict");
        assert_eq!(bound.len(), 1, "the other API is still bound");
    }

    #[test]
    fn cluster_scoped_api_in_a_binding_is_reported() {
        // BIND-14 / PGAP-6
        let (out, _) = evaluate(&[("clusters.x".into(), ApiState::ClusterScopedInBinding)]);
        let ready = get(&out, "Ready");
        assert_eq!(
            (ready.status, ready.reason),
            (Status::False, CLUSTER_SCOPED_API)
        );
        assert!(ready.message.contains("ClusterBinding"));
    }

    #[test]
    fn conflict_reason_matches_the_kind_and_does_not_unready() {
        // BIND-10 without QRK-4, BIND-11
        let foreign = Marks {
            foreign: 2,
            owned_by_another: 0,
            paused: 0,
            routing: 0,
        };
        let (out, bound) = evaluate(&[(
            "a.x".into(),
            ApiState::Bound {
                hash: "h".into(),
                in_sync: true,
                marks: foreign,
                held: None,
                omitted: Vec::new(),
            },
        )]);
        assert_eq!(get(&out, "Conflicts").reason, "ForeignObjectExists");
        assert_eq!(get(&out, "Ready").status, Status::True);
        assert_eq!(bound[0].conflict_count, 2);
        let other = Marks {
            foreign: 0,
            owned_by_another: 1,
            paused: 0,
            routing: 0,
        };
        let (out, _) = evaluate(&[(
            "a.x".into(),
            ApiState::Bound {
                hash: "h".into(),
                in_sync: true,
                marks: other,
                held: None,
                omitted: Vec::new(),
            },
        )]);
        assert_eq!(get(&out, "Conflicts").reason, "OwnedByAnother");
        // Routing's holds are not said to be provider objects in the way (#36).
        let routed = Marks {
            routing: 3,
            ..Marks::default()
        };
        let (out, bound) = evaluate(&[("a.x".into(), super::tests::bound(routed))]);
        let c = get(&out, "Conflicts");
        assert_eq!((c.reason, bound[0].conflict_count), ("RouteConflict", 3));
        assert!(
            c.message.contains("3 held or reported by routing") && !c.message.contains("owned"),
            "{}",
            c.message
        );
    }

    #[test]
    fn apis_a_cluster_binding_covers_are_named() {
        let (mut out, _) = evaluate(&[("a.x".into(), bound(Marks::default()))]);
        note_precedence(&mut out, &[("a.x".into(), "everything".into())]);
        let ready = get(&out, "Ready");
        assert_eq!(ready.status, Status::True);
        assert!(
            ready.message.contains("a.x (ClusterBinding everything)"),
            "{}",
            ready.message
        );
        // Synced says it too, after its own message; no other condition does.
        let synced = get(&out, "Synced");
        assert!(
            synced
                .message
                .starts_with("all APIs installed; covered by a ClusterBinding"),
            "{}",
            synced.message
        );
        for other in ["PermissionDenied", "SchemaInSync", "Conflicts"] {
            assert_eq!(get(&out, other).message, "", "{other}");
        }
        let (mut untouched, _) = evaluate(&[("a.x".into(), bound(Marks::default()))]);
        note_precedence(&mut untouched, &[]);
        assert_eq!(get(&untouched, "Ready").message, "");
    }

    #[test]
    fn a_bound_entry_notes_schema_drift_and_omitted_versions_each_once() {
        let state = |in_sync: bool, omitted: &[&str]| ApiState::Bound {
            hash: "sha256:1".into(),
            in_sync,
            marks: Marks::default(),
            held: None,
            omitted: omitted.iter().map(|o| (*o).to_owned()).collect(),
        };
        let drift = "the installed CRD differs from the provider's schema (updatePolicy Once)";
        // (in sync, omitted versions) → (reason, message)
        let cases = [
            (true, &[][..], reasons::AS_EXPECTED, String::new()),
            (false, &[][..], reasons::AS_EXPECTED, drift.to_owned()),
            (
                true,
                &["v2 (why)"][..],
                VERSIONS_OMITTED,
                "not served here: v2 (why)".to_owned(),
            ),
            (
                false,
                &["v2 (why)"][..],
                VERSIONS_OMITTED,
                format!("{drift}; not served here: v2 (why)"),
            ),
        ];
        for (in_sync, omitted, reason, message) in cases {
            let out = entries("c", &[("a.x".to_owned(), state(in_sync, omitted))], &[]);
            assert_eq!(
                (out[0].reason.as_str(), out[0].message.as_str()),
                (reason, message.as_str()),
                "{in_sync} {omitted:?}"
            );
        }
    }

    #[test]
    fn a_held_message_names_more_changes_only_when_there_are_more() {
        let held = |more: usize, complete: bool| Held {
            hash: "sha256:aa".into(),
            connection: "p".into(),
            changes: vec!["spec.size: type integer → string".into()],
            more,
            affected: Some(Affected {
                invalid: 2,
                pruned: 1,
                checked: 5,
                complete,
            }),
        };
        let all = held(0, true).message("widgets.example.org");
        assert!(
            all.ends_with("Breaking changes: spec.size: type integer → string"),
            "{all}"
        );
        assert!(
            all.contains(": 2 of 5 existing objects would be invalid and 1 would lose"),
            "{all}"
        );
        let more = held(3, false).message("widgets.example.org");
        assert!(more.ends_with("; and 3 more"), "{more}");
        assert!(more.contains("at least 2 of 5"), "{more}");
    }

    #[test]
    fn a_held_breaking_change_is_reported_with_its_hash_first_and_stays_bound() {
        let held = |changes: Vec<String>| ApiState::Bound {
            hash: "sha256:00000000000000000000000000000000000000000000000000000000000000aa".into(),
            in_sync: false,
            marks: Marks::default(),
            held: Some(Held {
                hash: "sha256:00000000000000000000000000000000000000000000000000000000000000aa"
                    .into(),
                connection: "p".into(),
                changes,
                more: 7,
                affected: Some(Affected {
                    invalid: 2,
                    pruned: 1,
                    checked: 5,
                    complete: true,
                }),
            }),
            omitted: Vec::new(),
        };
        // A hostile provider: long change texts with control characters.
        let long: Vec<String> = (0..100)
            .map(|i| {
                format!(
                    "spec.f{i}: type \u{1b}[31mstring → integer {}",
                    "x".repeat(200)
                )
            })
            .collect();
        let states = vec![
            ("ok.x".to_owned(), bound(Marks::default())),
            ("w.x".to_owned(), held(long)),
        ];
        let (conds, bound_apis) = evaluate(&states);
        let c = get(&conds, "SchemaInSync");
        assert_eq!((c.status, c.reason), (Status::False, BREAKING_CHANGE));
        assert!(c.message.starts_with("w.x: the provider's new schema sha256:00000000000000000000000000000000000000000000000000000000000000aa is not applied: 2 of 5 existing objects would be invalid"));
        assert!(c.message.contains("add {api: w.x, schemaHash: sha256:00000000000000000000000000000000000000000000000000000000000000aa} to Connection p's spec.schema.acceptedChanges"));
        assert!(c.message.chars().count() <= kbind_shared::conditions::MAX_MESSAGE + 1);
        assert!(!c.message.contains('\u{1b}'), "control characters removed");
        // Still bound and Ready: the old schema keeps serving.
        assert_eq!(get(&conds, "Ready").status, Status::True);
        assert_eq!(bound_apis.len(), 2);
        let out = entries("p", &states, &[]);
        let e = out.iter().find(|e| e.name == "w.x").unwrap();
        assert!(e.bound);
        assert_eq!(e.reason, BREAKING_CHANGE);
        assert!(
            e.message.contains("schemaHash: sha256:00000000000000000000000000000000000000000000000000000000000000aa"),
            "{}",
            e.message
        );
        // Few changes: every one listed, and the rest counted.
        let (conds, _) = evaluate(&[(
            "w.x".to_owned(),
            held(vec!["spec.a: newly required".into()]),
        )]);
        assert!(
            get(&conds, "SchemaInSync")
                .message
                .ends_with("Breaking changes: spec.a: newly required; and 7 more")
        );
    }

    #[test]
    fn schema_out_of_sync_is_reported() {
        // LIM-13
        let (out, _) = evaluate(&[(
            "a.x".into(),
            ApiState::Bound {
                hash: "h".into(),
                in_sync: false,
                marks: Marks::default(),
                held: None,
                omitted: Vec::new(),
            },
        )]);
        assert_eq!(get(&out, "SchemaInSync").status, Status::False);
        assert_eq!(get(&out, "Ready").status, Status::True);
    }
}
