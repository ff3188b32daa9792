//! The provider-side reaper's decision for one consumer (#38): whether a consumer that keeps a
//! heartbeat Lease on the provider is alive, and what may be done with its copies. Pure: the
//! program around it reads the Leases and the copies and acts on the [`Step`].
//!
//! Guards against a false "dead", each a rule below:
//! - **The API server's clock only.** Every time compared is one the provider's API server
//!   stamped: when the consumer's renewal was written (its `managedFields` time), and "now" as
//!   the time of the reaper's own latest Lease renewal. Neither the reaper's host clock nor the
//!   consumer's (a Lease's `renewTime` is the writer's clock) can make a live consumer look stale.
//! - **A renewal cancels everything**: Stale, and Reaping part-way, go back to Live.
//! - **No Lease ever seen** for a consumer UID whose copies exist: `NoLease`, reported, never
//!   reaped — kbind cannot know that consumer's heartbeat, so it does not guess.
//! - **Left cleanly** (the Lease marked `core.kbind.io/disconnected` after its last renewal): the
//!   consumer drained its bindings; what it left behind it left on purpose (an `Orphan` policy).
//!   Reported, never reaped.
//! - **Report first**: the default action only reports; `Orphan` and `Delete` act only a second
//!   grace (`delete_after`) after the consumer became Stale.

use std::time::Duration;

use kbind_shared::api::reaper::{ReapAction, ReaperPolicySpec};

pub mod facts;
pub mod sweep;

/// What the reaper may do with a dead consumer's copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Only report (the default).
    Report,
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

/// What the provider shows about one consumer, in the API server's seconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// The reaper's "now": when the API server recorded the reaper's own latest renewal.
    pub now: i64,
    /// The consumer's heartbeat, if a Lease for its UID exists.
    pub lease: Option<LeaseFacts>,
    /// Whether a Lease for the consumer UID was ever seen (by this reaper, or recorded in the
    /// policy's status): a Lease deleted since still means the consumer had a heartbeat.
    pub lease_ever_seen: bool,
    /// How many of the consumer's copies (and related copies, and namespaces it created) remain
    /// for the action: protected objects, and namespaces kept because they hold another's or a
    /// protected object, are not counted.
    pub objects: u64,
}

/// A consumer's heartbeat Lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseFacts {
    /// When the API server recorded its latest renewal.
    pub renewed: i64,
    /// When the API server recorded the write that marked it disconnected (the `managedFields`
    /// time of the entry owning `core.kbind.io/disconnected` — not the mark's own text, which is
    /// the consumer's clock), if it was.
    pub disconnected: Option<i64>,
}

/// Where a consumer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Renewed within `stale_after`.
    Live,
    /// Not renewed for `stale_after`; nothing is done (yet).
    Stale,
    /// The action runs: its copies are being orphaned or deleted.
    Reaping,
    /// The action ran: nothing it may act on is left (protected objects, and namespaces holding
    /// another's or a protected object, stay — the status counts them).
    Reaped,
    /// Copies of a consumer UID that never had a Lease here: reported, never touched.
    NoLease,
    /// It deleted its Connection in an orderly way: reported, never touched.
    Left,
}

/// What the reaper does now, and when to look again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// The consumer's state.
    pub state: State,
    /// Act on its copies now (only in [`State::Reaping`]).
    pub act: Option<Action>,
    /// The API-server time at which the state changes by itself (the reaper requeues for then),
    /// if it does.
    pub next: Option<i64>,
}

/// The decision for one consumer.
pub fn decide(facts: &Facts, policy: &Policy) -> Step {
    let step = |state, act, next| Step { state, act, next };
    let Some(lease) = facts.lease else {
        // A Lease that existed and went away: Stale, and never acted on — without the Lease's
        // times there is no grace to count. A consumer never seen with a Lease: NoLease.
        return if facts.lease_ever_seen {
            step(State::Stale, None, None)
        } else if facts.objects > 0 {
            step(State::NoLease, None, None)
        } else {
            step(State::Reaped, None, None)
        };
    };
    if lease.disconnected.is_some_and(|at| at >= lease.renewed) {
        return step(State::Left, None, None);
    }
    let stale_at = lease.renewed.saturating_add(secs(policy.stale_after));
    if facts.now < stale_at {
        return step(State::Live, None, Some(stale_at));
    }
    let act_at = stale_at.saturating_add(secs(policy.delete_after));
    match policy.action {
        Action::Report => step(State::Stale, None, None),
        _ if facts.now < act_at => step(State::Stale, None, Some(act_at)),
        _ if facts.objects == 0 => step(State::Reaped, None, None),
        action => step(State::Reaping, Some(action), None),
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

    fn facts(now: i64, renewed: Option<i64>, objects: u64) -> Facts {
        Facts {
            now,
            lease: renewed.map(|renewed| LeaseFacts {
                renewed,
                disconnected: None,
            }),
            lease_ever_seen: renewed.is_some(),
            objects,
        }
    }

    #[test]
    fn a_consumer_goes_stale_then_is_reaped_only_after_both_graces() {
        let t0 = 1_000_000;
        let stale_at = t0 + 30 * MIN;
        let act_at = stale_at + 24 * 60 * MIN;
        for (now, action, objects, want) in [
            // Renewed a minute ago: Live, look again when it would go stale.
            (
                t0 + MIN,
                Action::Delete,
                5,
                (State::Live, None, Some(stale_at)),
            ),
            // One second before stale: still Live.
            (
                stale_at - 1,
                Action::Delete,
                5,
                (State::Live, None, Some(stale_at)),
            ),
            // Stale: reported, nothing done until the second grace ends.
            (
                stale_at,
                Action::Delete,
                5,
                (State::Stale, None, Some(act_at)),
            ),
            (
                act_at - 1,
                Action::Orphan,
                5,
                (State::Stale, None, Some(act_at)),
            ),
            // Then the action runs while copies remain, and it is Reaped when none do.
            (
                act_at,
                Action::Delete,
                5,
                (State::Reaping, Some(Action::Delete), None),
            ),
            (
                act_at,
                Action::Orphan,
                1,
                (State::Reaping, Some(Action::Orphan), None),
            ),
            (act_at + MIN, Action::Delete, 0, (State::Reaped, None, None)),
            // Report (the default) never acts, however long it has been.
            (act_at * 2, Action::Report, 5, (State::Stale, None, None)),
        ] {
            let step = decide(&facts(now, Some(t0), objects), &policy(action));
            assert_eq!(
                (step.state, step.act, step.next),
                want,
                "now {now}, {action:?}, {objects} objects"
            );
        }
    }

    #[test]
    fn a_renewal_cancels_stale_and_reaping() {
        let t0 = 1_000_000;
        let late = t0 + 30 * MIN + 24 * 60 * MIN + 5;
        let reaping = decide(&facts(late, Some(t0), 3), &policy(Action::Delete));
        assert_eq!(reaping.state, State::Reaping);
        // The Lease flaps back: renewed a second ago (server time), everything is off.
        let back = decide(&facts(late, Some(late - 1), 3), &policy(Action::Delete));
        assert_eq!(
            (back.state, back.act),
            (State::Live, None),
            "a renewal cancels the reaping"
        );
    }

    #[test]
    fn only_the_api_servers_clock_counts() {
        // The reaper's host clock is hours ahead: irrelevant, "now" is the API server's time of
        // the reaper's own renewal. A consumer renewed by the server's clock a minute ago is Live
        // whatever either host believes.
        let server_now = 5_000_000;
        let step = decide(
            &facts(server_now, Some(server_now - MIN), 9),
            &policy(Action::Delete),
        );
        assert_eq!(step.state, State::Live);
        // A renewal the server stamped "after now" (the reaper's own renewal is older than the
        // consumer's newest one): Live, never stale.
        let step = decide(
            &facts(server_now, Some(server_now + MIN), 9),
            &policy(Action::Delete),
        );
        assert_eq!(step.state, State::Live);
    }

    #[test]
    fn consumers_without_a_lease_or_that_left_are_never_reaped() {
        let never = Facts {
            now: 10_000_000,
            lease: None,
            lease_ever_seen: false,
            objects: 4,
        };
        assert_eq!(
            decide(&never, &policy(Action::Delete)),
            Step {
                state: State::NoLease,
                act: None,
                next: None
            }
        );
        let left = Facts {
            now: 10_000_000,
            lease: Some(LeaseFacts {
                renewed: 1_000,
                disconnected: Some(1_001),
            }),
            lease_ever_seen: true,
            objects: 4,
        };
        assert_eq!(decide(&left, &policy(Action::Delete)).state, State::Left);
        // Connected again after leaving: the renewal supersedes the mark.
        let back = Facts {
            lease: Some(LeaseFacts {
                renewed: 9_999_990,
                disconnected: Some(1_001),
            }),
            ..left
        };
        assert_eq!(decide(&back, &policy(Action::Delete)).state, State::Live);
        // A Lease that was seen and is gone: Stale, never acted on without the Lease's times.
        let gone = Facts {
            lease: None,
            lease_ever_seen: true,
            ..never
        };
        assert_eq!(
            decide(&gone, &policy(Action::Delete)),
            Step {
                state: State::Stale,
                act: None,
                next: None
            }
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
    }
}
