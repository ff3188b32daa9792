//! The provider-side reaper's decision for one heartbeat (one Connection of one consumer): whether
//! it is alive, and what may be done with the copies that Connection wrote. Pure: the program
//! around it reads the Leases and the copies and acts on the [`Step`].
//!
//! Guards against a false "dead", each a rule below:
//! - **Observed, not claimed.** A consumer's liveness is what the reaper itself saw: the server
//!   time of the sweep at which it last saw the Lease change (any write to it — a co-tenant's
//!   too — counts as life, never as death), or first saw it at all. No time written *in* a Lease
//!   (its `renewTime`, or a `managedFields` time a client can clear or rewrite) is used.
//! - **The API server's clock only.** "now" is the time of the reaper's own latest Lease renewal
//!   as the API server stamped it; the reaper's host clock is never read for a verdict.
//! - **Its own record of the grace** ([`memory`]): `deleteAfter` counts from the sweep at which
//!   the reaper first saw the heartbeat stale, kept where only the reaper writes, so neither a
//!   restart nor a forged time can shorten it. A renewal it observes cancels everything.
//! - **Per Connection** ([`attribution`]): a copy is judged by the heartbeat of the Connection
//!   that wrote it; copies no judged heartbeat accounts for are `Unaccounted`, never reaped.
//! - **No Lease ever seen**: `NoLease`, reported, never reaped. **Left cleanly** (the Lease marked
//!   `core.kbind.io/disconnected` after its last renewal): reported, never reaped.
//! - **Report first**: the default action only reports; `Revoke`, `Orphan` and `Delete` act only a
//!   second grace (`delete_after`) after the heartbeat was first seen stale.
//! - **Revoke before anything is deleted** (#51): a heartbeat in a Grant's boundary is that
//!   Grant's consumer's — nobody else may write there — and a Stale Grant is revoked first
//!   (`Revoke` stops there); its copies are orphaned or deleted only once it is revoked.

use std::time::Duration;

use kbind_shared::api::reaper::{ReapAction, ReaperPolicySpec};

pub mod attribution;
pub mod facts;
pub mod memory;
pub mod sweep;

/// What the reaper may do with a dead consumer's copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Only report (the default).
    Report,
    /// Revoke the consumer's Grant (`spec.revoked`): its credential stops working; its copies
    /// stay. First step of `Orphan` and `Delete` for a consumer with a Grant.
    Revoke,
    /// Remove kbind's markers from the copies and leave them (foreign to every consumer after).
    Orphan,
    /// Delete the copies (normal deletes with UID preconditions; a provider finalizer is waited
    /// for, never stripped).
    Delete,
}

/// The policy's timing and action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// A consumer whose last renewal is older than this is Stale (default 30 min; at least ten
    /// Lease durations).
    pub stale_after: Duration,
    /// How long after becoming Stale the action starts (default 24 h).
    pub delete_after: Duration,
    /// What to do then.
    pub action: Action,
}

/// What the reaper knows of one heartbeat, in the API server's seconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// The reaper's "now": when the API server recorded the reaper's own latest renewal.
    pub now: i64,
    /// The heartbeat as the reaper observed it.
    pub heartbeat: Heartbeat,
    /// How many of the copies it accounts for (and related copies, and namespaces it created)
    /// remain for the action: protected objects, and namespaces kept because they hold anything
    /// else, are not counted.
    pub objects: u64,
    /// The heartbeat is in a Grant's boundary (#51): whether that Grant is revoked.
    pub grant: Option<Revoked>,
}

/// Whether a Grant is revoked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Revoked(pub bool);

/// A heartbeat Lease as the reaper observed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heartbeat {
    /// The Lease is there.
    Seen(Observed),
    /// A Lease the reaper saw before is gone: without it there is no grace to count.
    Gone,
    /// No such Lease was ever seen.
    Never,
}

/// What the reaper observed of a Lease that is there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observed {
    /// The server time of the sweep at which the reaper last saw the Lease change, or first saw
    /// it (never a time written in the Lease).
    pub renewed: i64,
    /// The server time of the sweep at which the reaper first saw it stale, if it did since its
    /// last observed change ([`memory`] keeps it across restarts).
    pub stale_since: Option<i64>,
    /// Marked `core.kbind.io/disconnected` after its last renewal.
    pub left: bool,
}

/// Where a heartbeat (and the copies it accounts for) stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Seen renewed within `stale_after`.
    Live,
    /// Not seen renewed for `stale_after`; nothing is done (yet).
    Stale,
    /// The action runs: its copies are being orphaned or deleted.
    Reaping,
    /// The action ran: nothing it may act on is left (protected objects, and namespaces holding
    /// anything else, stay — the status counts them).
    Reaped,
    /// Copies naming a heartbeat that was never seen: reported, never touched.
    NoLease,
    /// Its Connection was deleted in an orderly way: reported, never touched.
    Left,
    /// Its Grant is revoked (its credential works no more); its copies are left as they are.
    Revoked,
    /// Copies no Lease the reaper can judge accounts for (written by a Connection whose Lease is
    /// outside the policy's namespaces, or by one of several Connections it cannot tell apart):
    /// reported, never touched.
    Unaccounted,
}

/// What the reaper does now, and when to look again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// The heartbeat's state.
    pub state: State,
    /// Act on its copies now (only in [`State::Reaping`]).
    pub act: Option<Action>,
    /// The API-server time at which the state changes by itself (the reaper requeues for then),
    /// if it does.
    pub next: Option<i64>,
    /// The server time at which the reaper first saw it stale, for its record (`None` while Live).
    pub stale_since: Option<i64>,
}

/// The decision for one heartbeat.
pub fn decide(facts: &Facts, policy: &Policy) -> Step {
    let step = |state, act, next, stale_since| Step {
        state,
        act,
        next,
        stale_since,
    };
    let seen = match facts.heartbeat {
        Heartbeat::Seen(seen) => seen,
        Heartbeat::Gone => return step(State::Stale, None, None, None),
        Heartbeat::Never if facts.objects > 0 => return step(State::NoLease, None, None, None),
        Heartbeat::Never => return step(State::Reaped, None, None, None),
    };
    if seen.left {
        return step(State::Left, None, None, None);
    }
    let stale_at = seen.renewed.saturating_add(secs(policy.stale_after));
    if facts.now < stale_at {
        return step(State::Live, None, Some(stale_at), None);
    }
    // The grace counts from the first sweep that saw it stale — never from before it could be.
    let first = seen.stale_since.unwrap_or(facts.now).max(stale_at);
    let act_at = first.saturating_add(secs(policy.delete_after));
    let stale = Some(first);
    match (policy.action, facts.grant) {
        (Action::Report, _) => step(State::Stale, None, None, stale),
        _ if facts.now < act_at => step(State::Stale, None, Some(act_at), stale),
        // Nothing to revoke without a Grant: reported only.
        (Action::Revoke, None) => step(State::Stale, None, None, stale),
        (Action::Revoke, Some(Revoked(true))) => step(State::Revoked, None, None, stale),
        (Action::Revoke, Some(Revoked(false))) => {
            step(State::Revoked, Some(Action::Revoke), None, stale)
        }
        // The credential first: nothing of it is touched while it may still write.
        (_, Some(Revoked(false))) => step(State::Reaping, Some(Action::Revoke), None, stale),
        _ if facts.objects == 0 => step(State::Reaped, None, None, stale),
        (action, _) => step(State::Reaping, Some(action), None, stale),
    }
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// The timing and action of a policy object, or what is wrong with it.
pub fn policy_of(spec: &ReaperPolicySpec) -> Result<Policy, String> {
    let duration = |field: &str, text: &str| {
        humantime::parse_duration(text.trim())
            .map_err(|e| format!("spec.{field} {text:?} is not a duration such as 30m: {e}"))
    };
    let policy = Policy {
        stale_after: duration("staleAfter", &spec.stale_after)?,
        delete_after: duration("deleteAfter", &spec.delete_after)?,
        action: match spec.action {
            ReapAction::Report => Action::Report,
            ReapAction::Revoke => Action::Revoke,
            ReapAction::Orphan => Action::Orphan,
            ReapAction::Delete => Action::Delete,
        },
    };
    if policy.stale_after.is_zero() {
        return Err("spec.staleAfter must be more than 0".into());
    }
    if spec.lease_namespaces.is_empty() {
        return Err("spec.leaseNamespaces names no namespace".into());
    }
    if spec.protect_label.trim().is_empty() {
        return Err("spec.protectLabel is empty".into());
    }
    if spec.deletes_per_minute == 0 && policy.action != Action::Report {
        return Err(format!(
            "spec.deletesPerMinute is 0: action {:?} could never act",
            spec.action
        ));
    }
    Ok(policy)
}

/// Whether `policy` may be used with heartbeats of `lease_duration`: `stale_after` at least ten
/// Lease durations (a consumer missing nine renewals in a row is not yet Stale).
pub fn validate(policy: &Policy, lease_duration: Duration) -> Result<(), String> {
    let floor = lease_duration.saturating_mul(10);
    if policy.stale_after < floor {
        return Err(format!(
            "staleAfter {}s is shorter than ten Lease durations ({}s)",
            policy.stale_after.as_secs(),
            floor.as_secs()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60;

    fn policy(action: Action) -> Policy {
        Policy {
            stale_after: Duration::from_secs(30 * 60),
            delete_after: Duration::from_secs(24 * 3600),
            action,
        }
    }

    fn seen(renewed: i64, stale_since: Option<i64>) -> Heartbeat {
        Heartbeat::Seen(Observed {
            renewed,
            stale_since,
            left: false,
        })
    }

    fn facts(now: i64, heartbeat: Heartbeat, objects: u64) -> Facts {
        Facts {
            now,
            heartbeat,
            objects,
            grant: None,
        }
    }

    #[test]
    fn a_stale_grant_is_revoked_before_anything_of_it_is_orphaned_or_deleted() {
        let t0 = 1_000_000;
        let stale_at = t0 + 30 * MIN;
        let act_at = stale_at + 24 * 60 * MIN;
        let granted = |revoked: bool, now: i64| Facts {
            grant: Some(Revoked(revoked)),
            ..facts(now, seen(t0, Some(stale_at)), 3)
        };
        for (action, revoked, now, want) in [
            // Within the grace: Stale, whatever the action.
            (Action::Revoke, false, act_at - 1, (State::Stale, None)),
            (Action::Delete, false, act_at - 1, (State::Stale, None)),
            // Revoke: the Grant is revoked, and that is all.
            (
                Action::Revoke,
                false,
                act_at,
                (State::Revoked, Some(Action::Revoke)),
            ),
            (Action::Revoke, true, act_at, (State::Revoked, None)),
            // Orphan and Delete: revoked first, then the copies.
            (
                Action::Delete,
                false,
                act_at,
                (State::Reaping, Some(Action::Revoke)),
            ),
            (
                Action::Delete,
                true,
                act_at,
                (State::Reaping, Some(Action::Delete)),
            ),
            (
                Action::Orphan,
                false,
                act_at,
                (State::Reaping, Some(Action::Revoke)),
            ),
            (
                Action::Orphan,
                true,
                act_at,
                (State::Reaping, Some(Action::Orphan)),
            ),
            // Report never revokes.
            (Action::Report, false, act_at, (State::Stale, None)),
        ] {
            let step = decide(&granted(revoked, now), &policy(action));
            assert_eq!((step.state, step.act), want, "{action:?} revoked={revoked}");
        }
        // Revoke without a Grant: nothing to revoke, reported as Stale.
        let step = decide(
            &facts(act_at, seen(t0, Some(stale_at)), 3),
            &policy(Action::Revoke),
        );
        assert_eq!((step.state, step.act), (State::Stale, None));
        // A renewal seen cancels it all, Grant or not.
        let live = Facts {
            grant: Some(Revoked(false)),
            ..facts(act_at, seen(act_at - MIN, None), 3)
        };
        assert_eq!(decide(&live, &policy(Action::Delete)).state, State::Live);
    }

    fn at(step: Step) -> (State, Option<Action>, Option<i64>, Option<i64>) {
        (step.state, step.act, step.next, step.stale_since)
    }

    #[test]
    fn a_heartbeat_goes_stale_then_is_reaped_only_after_both_graces_from_when_the_reaper_saw_it() {
        let t0 = 1_000_000;
        let stale_at = t0 + 30 * MIN;
        let act_at = stale_at + 24 * 60 * MIN;
        for (now, stale_since, action, objects, want) in [
            // Seen renewed a minute ago: Live, look again when it would go stale.
            (
                t0 + MIN,
                None,
                Action::Delete,
                5,
                (State::Live, None, Some(stale_at), None),
            ),
            (
                stale_at - 1,
                None,
                Action::Delete,
                5,
                (State::Live, None, Some(stale_at), None),
            ),
            // First seen stale now: the record starts now, nothing done until the second grace.
            (
                stale_at,
                None,
                Action::Delete,
                5,
                (State::Stale, None, Some(act_at), Some(stale_at)),
            ),
            // The reaper was away: first seen stale an hour late, the grace counts from then.
            (
                stale_at + 60 * MIN,
                None,
                Action::Delete,
                5,
                (
                    State::Stale,
                    None,
                    Some(act_at + 60 * MIN),
                    Some(stale_at + 60 * MIN),
                ),
            ),
            // The record says when it was first seen stale: the grace goes on from there.
            (
                act_at - 1,
                Some(stale_at),
                Action::Orphan,
                5,
                (State::Stale, None, Some(act_at), Some(stale_at)),
            ),
            (
                act_at,
                Some(stale_at),
                Action::Delete,
                5,
                (State::Reaping, Some(Action::Delete), None, Some(stale_at)),
            ),
            (
                act_at,
                Some(stale_at),
                Action::Orphan,
                1,
                (State::Reaping, Some(Action::Orphan), None, Some(stale_at)),
            ),
            (
                act_at + MIN,
                Some(stale_at),
                Action::Delete,
                0,
                (State::Reaped, None, None, Some(stale_at)),
            ),
            // A record older than the heartbeat could have been stale (a forged or mistaken one)
            // never shortens the grace.
            (
                stale_at + MIN,
                Some(0),
                Action::Delete,
                5,
                (State::Stale, None, Some(act_at), Some(stale_at)),
            ),
            // Report (the default) never acts, however long it has been.
            (
                act_at * 2,
                Some(stale_at),
                Action::Report,
                5,
                (State::Stale, None, None, Some(stale_at)),
            ),
        ] {
            let step = decide(&facts(now, seen(t0, stale_since), objects), &policy(action));
            assert_eq!(
                at(step),
                want,
                "now {now}, record {stale_since:?}, {action:?}, {objects} objects"
            );
        }
    }

    #[test]
    fn an_observed_renewal_cancels_stale_and_reaping() {
        let t0 = 1_000_000;
        let late = t0 + 30 * MIN + 24 * 60 * MIN + 5;
        let reaping = decide(
            &facts(late, seen(t0, Some(t0 + 30 * MIN)), 3),
            &policy(Action::Delete),
        );
        assert_eq!(reaping.state, State::Reaping);
        // The reaper saw the Lease change at this sweep: everything is off, the record too.
        let back = decide(&facts(late, seen(late, None), 3), &policy(Action::Delete));
        assert_eq!(
            at(back),
            (State::Live, None, Some(late + 30 * MIN), None),
            "a renewal cancels the reaping"
        );
    }

    #[test]
    fn only_the_api_servers_clock_counts() {
        // "now" is the API server's time of the reaper's own renewal; an observation is stamped
        // with the server time of the sweep that made it. An observation "after now" (a record
        // from a later sweep of a previous leader) is Live.
        let server_now = 5_000_000;
        for renewed in [server_now - MIN, server_now, server_now + MIN] {
            let step = decide(
                &facts(server_now, seen(renewed, None), 9),
                &policy(Action::Delete),
            );
            assert_eq!(step.state, State::Live, "renewed {renewed}");
        }
    }

    #[test]
    fn heartbeats_never_seen_gone_or_that_left_are_never_acted_on() {
        let now = 10_000_000;
        let never = decide(&facts(now, Heartbeat::Never, 4), &policy(Action::Delete));
        assert_eq!(at(never), (State::NoLease, None, None, None));
        let nothing = decide(&facts(now, Heartbeat::Never, 0), &policy(Action::Delete));
        assert_eq!(nothing.state, State::Reaped);
        let left = Heartbeat::Seen(Observed {
            renewed: 1_000,
            stale_since: Some(2_000),
            left: true,
        });
        assert_eq!(
            at(decide(&facts(now, left, 4), &policy(Action::Delete))),
            (State::Left, None, None, None)
        );
        // A Lease that was seen and is gone: Stale, never acted on without the Lease.
        assert_eq!(
            at(decide(
                &facts(now, Heartbeat::Gone, 4),
                &policy(Action::Delete)
            )),
            (State::Stale, None, None, None)
        );
    }

    #[test]
    fn a_policy_object_reads_as_timing_and_action_or_says_what_is_wrong() {
        let spec: ReaperPolicySpec = serde_json::from_value(serde_json::json!({})).unwrap();
        assert_eq!(
            policy_of(&spec),
            Ok(policy(Action::Report)),
            "the defaults: 30m, 24h, Report"
        );
        for (patch, error) in [
            (
                serde_json::json!({"staleAfter": "soon"}),
                "spec.staleAfter \"soon\"",
            ),
            (
                serde_json::json!({"deleteAfter": "1 fortnight"}),
                "spec.deleteAfter",
            ),
            (serde_json::json!({"staleAfter": "0s"}), "more than 0"),
            (
                serde_json::json!({"leaseNamespaces": []}),
                "names no namespace",
            ),
            (
                serde_json::json!({"action": "Delete", "deletesPerMinute": 0}),
                "could never act",
            ),
        ] {
            let spec: ReaperPolicySpec = serde_json::from_value(patch.clone()).unwrap();
            let got = policy_of(&spec).unwrap_err();
            assert!(got.contains(error), "{patch}: {got}");
        }
        let spec: ReaperPolicySpec = serde_json::from_value(
            serde_json::json!({"staleAfter": "12s", "deleteAfter": "8s", "action": "Delete"}),
        )
        .unwrap();
        assert_eq!(
            policy_of(&spec),
            Ok(Policy {
                stale_after: Duration::from_secs(12),
                delete_after: Duration::from_secs(8),
                action: Action::Delete
            })
        );
    }

    #[test]
    fn stale_after_must_cover_ten_lease_durations() {
        let lease = Duration::from_secs(60);
        assert!(validate(&policy(Action::Delete), lease).is_ok());
        let short = Policy {
            stale_after: Duration::from_secs(599),
            ..policy(Action::Delete)
        };
        let error = validate(&short, lease).unwrap_err();
        assert!(error.contains("ten Lease durations (600s)"), "{error}");
        // Exactly ten Lease durations is enough.
        let exact = Policy {
            stale_after: Duration::from_secs(600),
            ..policy(Action::Delete)
        };
        assert!(validate(&exact, lease).is_ok());
    }
}
