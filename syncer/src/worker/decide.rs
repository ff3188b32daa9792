//! What one sync of one consumer object does next (REFERENCE-BEHAVIOUR §17: SYNC-3 … SYNC-9,
//! OWN-1 … OWN-3, KEY-10, QRK-13, QRK-18), decided from plain facts gathered from the caches.
//! The sync executes the step; every write it makes is decided here first.

use kbind_shared::api::ConflictPolicy;
use kbind_shared::ownership::{self, Decision, Owner};

use super::record::SyncState;

/// The provider copy the cache holds under the consumer object's namespace and name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copy {
    /// Whose it is (OWN-1).
    pub owner: Owner,
    /// It is being deleted.
    pub terminating: bool,
    /// It already carries exactly what a spec-up would apply.
    pub current: bool,
}

/// What a sync knows before it writes anything — and what its writes would say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts<'a> {
    /// The consumer object is being deleted.
    pub deleting: bool,
    /// The conflict policy of the binding that has this API bound for the object, if one does.
    pub bound: Option<ConflictPolicy>,
    /// The provider copy, if the cache has one.
    pub copy: Option<Copy>,
    /// The consumer object carries kbind's finalizer.
    pub has_finalizer: bool,
    /// The conflict annotation the consumer object carries.
    pub conflict: Option<&'a str>,
    /// The user paused the object (its annotation, or its binding's `spec.suspend`).
    pub paused: Option<Paused<'a>>,
    /// What routing says when several Connections serve the API (#36; `None`: sync as usual —
    /// the API has one route, or this worker's route is the object's). A route that is not the
    /// object's reaches here as `bound: None`.
    pub routing: Option<Routing<'a>>,
    /// This worker speaks for the object when no binding has it bound (the API is not routed,
    /// or it is and no route covers, pins or holds it, and this is the serving Connection's
    /// worker): a mark kbind left on it is this worker's to clear.
    pub speaks_when_unbound: bool,
    /// Its delivery record says routing held it (`NoRoute`, …): a mark too, once nothing binds it.
    pub hold_recorded: bool,
}

/// Routing's word on an object of a routed API, for this worker's route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing<'a> {
    /// Written to no provider: the conflict annotation says why (`AmbiguousRoute`, `NoRoute`,
    /// `SchemaMismatch`, `NotAllowed`), and the message the record and the Event say.
    Hold(&'static str, &'a str),
    /// The user moved it elsewhere: this route's copy goes (deleted or orphaned), then this
    /// route's finalizer.
    Release,
    /// Synced here, its pinned route, while its labels choose another: `RouteChanged` is shown,
    /// and this message announced.
    Changed(&'a str),
}

/// A paused object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Paused<'a> {
    /// The status that records the pause (`None`: its delivery record says so already, or its
    /// CRD keeps no record — nothing to write).
    pub record: Option<&'a serde_json::Value>,
}

/// How the spec goes up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecUp {
    /// No copy is cached: create only (a copy that appeared meanwhile answers 409, never forced).
    Create,
    /// Apply over our (or an adopted) copy.
    Apply,
}

/// The next step, with what its writes say: its executor computes nothing but the requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step<'a> {
    /// SYNC-3: the object is being deleted (bound or not): run the deletion.
    Delete,
    /// SYNC-4: no binding has the API bound for it: nothing to do.
    Idle,
    /// No binding has the API bound for it any more, and it still carries kbind's conflict
    /// annotation from when one had: the annotation goes (it says nothing true now).
    Unmark,
    /// OWN-2: the provider object is not ours to write: record `reason` on the consumer object,
    /// announcing it (Warning Event, metric) when it is new. No finalizer (QRK-18).
    Conflict {
        /// The conflict annotation's value.
        reason: &'static str,
        /// Who owns the provider object.
        owner: Owner,
        /// The binding's conflict policy, which leaves it alone.
        policy: ConflictPolicy,
        /// The annotation did not say so yet.
        announce: bool,
    },
    /// The user paused it: no write on either side but the delivery record saying so, once.
    Paused(Paused<'a>),
    /// QRK-13: the copy is terminating; look again once it is gone.
    WaitForTerminatingCopy,
    /// KEY-10: the finalizer goes on before the first provider write.
    AddFinalizer,
    /// SYNC-7 … SYNC-9: clear a stale conflict annotation, spec up when the copy differs, then
    /// status down when it differs.
    Sync {
        /// The conflict annotation is not what it should be (a stale one is left from before,
        /// or `RouteChanged` is not shown yet).
        clear_conflict: bool,
        /// `None`: the copy is current, no provider write.
        spec_up: Option<SpecUp>,
        /// Its labels choose another route than the one it is pinned to: the annotation says
        /// `RouteChanged` (#36), and a Warning this message when it is new.
        route_changed: Option<&'a str>,
    },
    /// #36: held by routing — written to no provider; `reason` recorded on the object, with
    /// `message`, announced when new.
    Held {
        /// The conflict annotation's value.
        reason: &'static str,
        /// Why, as the record and the Event say.
        message: &'a str,
        /// The annotation did not say so yet.
        announce: bool,
    },
    /// #36: the user moved the object to another route: release this route's copy first.
    Release,
}

/// Decides the next step.
pub fn decide<'a>(facts: &Facts<'a>) -> Step<'a> {
    if facts.deleting {
        return Step::Delete;
    }
    match facts.routing {
        Some(Routing::Release) => return Step::Release,
        Some(Routing::Hold(reason, message)) => {
            return Step::Held {
                reason,
                message,
                announce: facts.conflict != Some(reason),
            };
        }
        _ => {}
    }
    let Some(policy) = facts.bound else {
        return if (facts.conflict.is_some() || facts.hold_recorded) && facts.speaks_when_unbound {
            Step::Unmark
        } else {
            Step::Idle
        };
    };
    // Paused wins over everything but a deletion: no finalizer, no conflict annotation, no
    // provider write while the user holds it.
    if let Some(paused) = facts.paused {
        return Step::Paused(paused);
    }
    if let Some(copy) = facts.copy {
        if let Decision::Conflict(reason) = ownership::decide(copy.owner, policy) {
            return Step::Conflict {
                reason,
                owner: copy.owner,
                policy,
                announce: facts.conflict != Some(reason),
            };
        }
        if copy.terminating {
            return Step::WaitForTerminatingCopy;
        }
    }
    if !facts.has_finalizer {
        return Step::AddFinalizer;
    }
    let spec_up = match facts.copy {
        None => Some(SpecUp::Create),
        Some(copy) if !copy.current => Some(SpecUp::Apply),
        Some(_) => None,
    };
    let route_changed = match facts.routing {
        Some(Routing::Changed(message)) => Some(message),
        _ => None,
    };
    let wanted = route_changed.map(|_| ROUTE_CHANGED);
    Step::Sync {
        clear_conflict: facts.conflict != wanted,
        spec_up,
        route_changed,
    }
}

/// The conflict annotation of an object synced on its pinned route while its labels choose
/// another.
pub const ROUTE_CHANGED: &str = kbind_shared::routing::Reason::RouteChanged.as_str();

/// Where an object stands, told without running its sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rest {
    /// Something to write, wait for or announce: the object needs a sync.
    Work,
    /// No binding has its API bound for it: a sync does nothing and records nothing.
    Unbound,
    /// A sync would write nothing and record that the object stands here.
    Stands(SyncState),
}

/// Whether the sync that `step` starts would write nothing. `status_current`: whether the
/// consumer object already has the status that sync would leave on it (asked only when the
/// step gets that far). A restart or a re-list shows every object again; those at rest are
/// recorded where they stand instead of each taking a turn in the queue.
pub fn rest(step: Step<'_>, status_current: impl FnOnce() -> bool) -> Rest {
    match step {
        Step::Idle => Rest::Unbound,
        Step::Conflict {
            announce: false, ..
        }
        | Step::Held {
            announce: false, ..
        } => Rest::Stands(SyncState::Conflict),
        Step::Paused(Paused { record: None }) => Rest::Stands(SyncState::Paused),
        Step::Sync {
            clear_conflict: false,
            spec_up: None,
            ..
        } if status_current() => Rest::Stands(SyncState::Synced),
        _ => Rest::Work,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kbind_shared::keys::{CONFLICT_FOREIGN, CONFLICT_OWNED_BY_ANOTHER};

    const FAIL: Option<ConflictPolicy> = Some(ConflictPolicy::Fail);
    const ADOPT: Option<ConflictPolicy> = Some(ConflictPolicy::Adopt);

    fn copy(owner: Owner, terminating: bool, current: bool) -> Option<Copy> {
        Some(Copy {
            owner,
            terminating,
            current,
        })
    }

    fn facts<'a>(
        deleting: bool,
        bound: Option<ConflictPolicy>,
        copy: Option<Copy>,
        has_finalizer: bool,
        conflict: Option<&'a str>,
    ) -> Facts<'a> {
        Facts {
            deleting,
            bound,
            copy,
            has_finalizer,
            conflict,
            paused: None,
            routing: None,
            speaks_when_unbound: true,
            hold_recorded: false,
        }
    }

    /// The status a pause still has to write.
    static RECORD: std::sync::LazyLock<serde_json::Value> =
        std::sync::LazyLock::new(|| serde_json::json!({ "kbindSync": { "state": "Paused" } }));

    /// A pause not recorded yet (`true`: its record to write) or recorded.
    fn pause(to_record: bool) -> Paused<'static> {
        Paused {
            record: to_record.then_some(&*RECORD),
        }
    }

    fn paused(facts: Facts<'_>, recorded: bool) -> Facts<'_> {
        Facts {
            paused: Some(pause(!recorded)),
            ..facts
        }
    }

    fn sync(clear_conflict: bool, spec_up: Option<SpecUp>) -> Step<'static> {
        Step::Sync {
            clear_conflict,
            spec_up,
            route_changed: None,
        }
    }

    fn routed<'a>(facts: Facts<'a>, routing: Routing<'a>) -> Facts<'a> {
        Facts {
            routing: Some(routing),
            ..facts
        }
    }

    /// #36: routing's word comes after a deletion and before anything else; a route change is
    /// shown once and then rests.
    #[test]
    fn routing_steps() {
        let ours = copy(Owner::Ours, false, true);
        let synced = facts(false, FAIL, ours, true, None);
        let cases: Vec<(&str, Facts<'_>, Step)> = vec![
            (
                "a deletion still runs",
                routed(facts(true, FAIL, ours, true, None), Routing::Release),
                Step::Delete,
            ),
            (
                "moved away: release",
                routed(synced, Routing::Release),
                Step::Release,
            ),
            (
                "moved away, even when this route's binding is gone",
                routed(facts(false, None, ours, true, None), Routing::Release),
                Step::Release,
            ),
            (
                "held: announced once",
                routed(
                    facts(false, None, None, false, None),
                    Routing::Hold("AmbiguousRoute", "why"),
                ),
                Step::Held {
                    reason: "AmbiguousRoute",
                    message: "why",
                    announce: true,
                },
            ),
            (
                "held: said already",
                routed(
                    facts(false, None, None, false, Some("AmbiguousRoute")),
                    Routing::Hold("AmbiguousRoute", "why"),
                ),
                Step::Held {
                    reason: "AmbiguousRoute",
                    message: "why",
                    announce: false,
                },
            ),
            (
                "route changed: shown",
                routed(synced, Routing::Changed("moved")),
                Step::Sync {
                    clear_conflict: true,
                    spec_up: None,
                    route_changed: Some("moved"),
                },
            ),
            (
                "route changed: shown already",
                routed(
                    facts(false, FAIL, ours, true, Some(ROUTE_CHANGED)),
                    Routing::Changed("moved"),
                ),
                Step::Sync {
                    clear_conflict: false,
                    spec_up: None,
                    route_changed: Some("moved"),
                },
            ),
            (
                "back on its route: the annotation goes",
                facts(false, FAIL, ours, true, Some(ROUTE_CHANGED)),
                sync(true, None),
            ),
        ];
        for (name, facts, want) in cases {
            assert_eq!(decide(&facts), want, "{name}");
        }
        assert_eq!(
            rest(
                decide(&routed(
                    facts(false, FAIL, ours, true, Some(ROUTE_CHANGED)),
                    Routing::Changed("moved")
                )),
                || true
            ),
            Rest::Stands(SyncState::Synced)
        );
        assert_eq!(
            rest(
                decide(&routed(
                    facts(false, None, None, false, Some("NoRoute")),
                    Routing::Hold("NoRoute", "why")
                )),
                || true
            ),
            Rest::Stands(SyncState::Conflict)
        );
    }

    fn conflict(reason: &'static str, owner: Owner, announce: bool) -> Step<'static> {
        Step::Conflict {
            reason,
            owner,
            policy: ConflictPolicy::Fail,
            announce,
        }
    }

    #[test]
    fn every_branch_of_a_sync() {
        let ours = |current| copy(Owner::Ours, false, current);
        let cases: Vec<(&str, Facts<'_>, Step)> = vec![
            (
                "deleting, bound or not",
                facts(true, None, None, true, None),
                Step::Delete,
            ),
            (
                "deleting wins over a conflict",
                facts(true, FAIL, copy(Owner::Unmarked, false, false), false, None),
                Step::Delete,
            ),
            (
                "not bound",
                facts(false, None, ours(false), true, None),
                Step::Idle,
            ),
            (
                "not bound any more, kbind's mark left: it goes",
                facts(
                    false,
                    None,
                    ours(false),
                    true,
                    Some(CONFLICT_OWNED_BY_ANOTHER),
                ),
                Step::Unmark,
            ),
            (
                "not bound any more, only routing's record left: it goes too",
                Facts {
                    hold_recorded: true,
                    ..facts(false, None, None, false, None)
                },
                Step::Unmark,
            ),
            (
                "routing's record on a bound object is not Unmark's",
                Facts {
                    hold_recorded: true,
                    ..facts(false, FAIL, None, true, None)
                },
                sync(false, Some(SpecUp::Create)),
            ),
            (
                "not bound here, another route's worker speaks for it: its mark stays",
                Facts {
                    speaks_when_unbound: false,
                    ..facts(false, None, None, false, Some("NoRoute"))
                },
                Step::Idle,
            ),
            (
                "new object: finalizer first",
                facts(false, FAIL, None, false, None),
                Step::AddFinalizer,
            ),
            (
                "new object: created only",
                facts(false, FAIL, None, true, None),
                sync(false, Some(SpecUp::Create)),
            ),
            (
                "our copy differs",
                facts(false, FAIL, ours(false), true, None),
                sync(false, Some(SpecUp::Apply)),
            ),
            (
                "our copy current: no provider write",
                facts(false, FAIL, ours(true), true, None),
                sync(false, None),
            ),
            (
                "a stale conflict annotation is cleared",
                facts(false, FAIL, ours(true), true, Some(CONFLICT_FOREIGN)),
                sync(true, None),
            ),
            (
                "unmarked under Fail: conflict, announced",
                facts(
                    false,
                    FAIL,
                    copy(Owner::Unmarked, false, false),
                    false,
                    None,
                ),
                conflict(CONFLICT_FOREIGN, Owner::Unmarked, true),
            ),
            (
                "unmarked under Fail, already recorded",
                facts(
                    false,
                    FAIL,
                    copy(Owner::Unmarked, false, false),
                    false,
                    Some(CONFLICT_FOREIGN),
                ),
                conflict(CONFLICT_FOREIGN, Owner::Unmarked, false),
            ),
            (
                "unmarked under Adopt: taken over",
                facts(
                    false,
                    ADOPT,
                    copy(Owner::Unmarked, false, false),
                    true,
                    None,
                ),
                sync(false, Some(SpecUp::Apply)),
            ),
            (
                "another's under Adopt: never taken",
                facts(false, ADOPT, copy(Owner::Another, false, true), true, None),
                Step::Conflict {
                    reason: CONFLICT_OWNED_BY_ANOTHER,
                    owner: Owner::Another,
                    policy: ConflictPolicy::Adopt,
                    announce: true,
                },
            ),
            (
                "the kind of conflict changed: announced",
                facts(
                    false,
                    FAIL,
                    copy(Owner::Another, false, false),
                    false,
                    Some(CONFLICT_FOREIGN),
                ),
                conflict(CONFLICT_OWNED_BY_ANOTHER, Owner::Another, true),
            ),
            (
                "paused: nothing but the record, however far the sync got",
                paused(facts(false, FAIL, ours(false), true, None), false),
                Step::Paused(pause(true)),
            ),
            (
                "paused before the finalizer: none is added",
                paused(facts(false, FAIL, None, false, None), true),
                Step::Paused(pause(false)),
            ),
            (
                "paused over a conflict: the annotation stays as it is",
                paused(
                    facts(
                        false,
                        FAIL,
                        copy(Owner::Unmarked, false, false),
                        false,
                        Some(CONFLICT_OWNED_BY_ANOTHER),
                    ),
                    true,
                ),
                Step::Paused(pause(false)),
            ),
            (
                "paused and deleted: the deletion runs",
                paused(facts(true, FAIL, ours(true), true, None), true),
                Step::Delete,
            ),
            (
                "paused but not bound: idle",
                paused(facts(false, None, ours(true), true, None), false),
                Step::Idle,
            ),
            (
                "our copy terminating: wait",
                facts(false, FAIL, copy(Owner::Ours, true, false), true, None),
                Step::WaitForTerminatingCopy,
            ),
            (
                "a foreign terminating copy is still a conflict",
                facts(false, FAIL, copy(Owner::Another, true, false), false, None),
                conflict(CONFLICT_OWNED_BY_ANOTHER, Owner::Another, true),
            ),
            (
                "terminating before the finalizer",
                facts(false, FAIL, copy(Owner::Ours, true, false), false, None),
                Step::WaitForTerminatingCopy,
            ),
        ];
        for (name, facts, want) in cases {
            assert_eq!(decide(&facts), want, "{name}");
        }
    }

    #[test]
    fn only_a_sync_that_writes_nothing_is_at_rest() {
        use kbind_shared::keys::CONFLICT_FOREIGN;
        let synced = Rest::Stands(SyncState::Synced);
        let cases: Vec<(&str, Step, bool, Rest)> = vec![
            ("deleting", Step::Delete, true, Rest::Work),
            ("not bound", Step::Idle, false, Rest::Unbound),
            (
                "not bound, a mark to clear",
                Step::Unmark,
                false,
                Rest::Work,
            ),
            (
                "a recorded conflict",
                conflict(CONFLICT_FOREIGN, Owner::Unmarked, false),
                false,
                Rest::Stands(SyncState::Conflict),
            ),
            (
                "a new conflict is announced",
                conflict(CONFLICT_FOREIGN, Owner::Unmarked, true),
                true,
                Rest::Work,
            ),
            (
                "a terminating copy",
                Step::WaitForTerminatingCopy,
                true,
                Rest::Work,
            ),
            ("no finalizer", Step::AddFinalizer, true, Rest::Work),
            (
                "paused, recorded",
                Step::Paused(pause(false)),
                false,
                Rest::Stands(SyncState::Paused),
            ),
            (
                "paused, not recorded yet",
                Step::Paused(pause(true)),
                false,
                Rest::Work,
            ),
            (
                "create",
                sync(false, Some(SpecUp::Create)),
                true,
                Rest::Work,
            ),
            ("apply", sync(false, Some(SpecUp::Apply)), true, Rest::Work),
            (
                "a stale conflict annotation",
                sync(true, None),
                true,
                Rest::Work,
            ),
            (
                "copy current, status differs",
                sync(false, None),
                false,
                Rest::Work,
            ),
            (
                "copy current, status current",
                sync(false, None),
                true,
                synced,
            ),
        ];
        for (name, step, status_current, want) in cases {
            let asked = std::cell::Cell::new(false);
            let got = rest(step, || {
                asked.set(true);
                status_current
            });
            assert_eq!(got, want, "{name}");
            // The status (two JSON documents) is compared only for a sync that writes no spec.
            assert_eq!(
                asked.get(),
                step == sync(false, None),
                "{name}: status asked"
            );
        }
    }
}
