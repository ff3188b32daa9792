//! The backlog as the objects themselves say it (#33.4): which consumer objects wait, why, and
//! since when — read off each object (its generation against its delivery record, the record's
//! state and `since`, its deletion) rather than from the worker's memory, so that a worker
//! restart, a unit handover or a syncer restart neither empties the backlog nor makes its oldest
//! entry young again. What only memory knows (a provider status not copied down yet, an API
//! whose CRD has no delivery record) is added from the worker's memory of the changes it saw. Pure.

use std::time::Duration;

use kbind_shared::delivery::{Seconds, State, Summary};

/// Why an object waits: the `state` label of `kbind_sync_backlog`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// Its current spec has not reached the provider: queued, in flight, retrying after the
    /// provider failed to answer, or waiting for a terminating provider copy.
    Pending,
    /// The provider refused the current spec; retried with backoff.
    Rejected,
    /// kbind's credential may not write it; retried with backoff.
    Forbidden,
    /// It is being deleted and kbind still holds its finalizer.
    Deleting,
    /// A provider change (its status) has not been copied down yet.
    Status,
}

impl Waiting {
    /// Every state, in label order.
    pub const ALL: [Waiting; 5] = [
        Waiting::Pending,
        Waiting::Rejected,
        Waiting::Forbidden,
        Waiting::Deleting,
        Waiting::Status,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Waiting::Pending => "pending",
            Waiting::Rejected => "rejected",
            Waiting::Forbidden => "forbidden",
            Waiting::Deleting => "deleting",
            Waiting::Status => "status",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What one consumer object says about itself.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// Its `metadata.generation`.
    pub generation: Option<i64>,
    /// Its deletion timestamp.
    pub deletion: Option<Seconds>,
    /// kbind's finalizer is on it.
    pub has_finalizer: bool,
    /// A binding binds its API for it.
    pub bound: bool,
    /// It carries kbind's conflict annotation (counted by `kbind_conflicts`, not waiting on kbind).
    pub conflict: bool,
    /// Its CRD has kbind's delivery record.
    pub has_delivery: bool,
    /// Its delivery record.
    pub record: Option<&'a Summary>,
    /// When its spec last changed.
    pub changed_at: Option<Seconds>,
}

/// Whether the object waits, why, and since when (`None`: unknown).
pub fn waiting(f: &Facts<'_>) -> Option<(Waiting, Option<Seconds>)> {
    if f.deletion.is_some() {
        return f.has_finalizer.then_some((Waiting::Deleting, f.deletion));
    }
    if !f.bound || f.conflict || !f.has_delivery {
        return None;
    }
    let since = |record: &Summary| record.since.or(f.changed_at);
    match f.record {
        // Never delivered: created while kbind was away, or just now.
        None => Some((Waiting::Pending, f.changed_at)),
        Some(r) => match r.state {
            State::Rejected => Some((Waiting::Rejected, since(r))),
            State::Forbidden => Some((Waiting::Forbidden, since(r))),
            State::Pending => Some((Waiting::Pending, since(r))),
            // The user holds it: not waiting on kbind.
            State::Paused => None,
            State::Synced | State::Held | State::Observed | State::Other
                if r.generation.map(std::num::NonZeroI64::get) != f.generation =>
            {
                Some((Waiting::Pending, f.changed_at))
            }
            State::Synced | State::Held | State::Observed | State::Other => None,
        },
    }
}

/// Whether the object's record says [`State::Synced`] while its current generation waits to
/// reach the provider: the `Delivery` column would say `Synced` for a generation the provider
/// does not have. Once the change has waited [`kbind_shared::delivery::PENDING_AFTER`], the
/// record must say Pending (#50.4). A never-delivered object (no record: the column is empty),
/// a refusal and a pause already say what is true.
pub fn says_synced_while_waiting(f: &Facts<'_>) -> bool {
    matches!(waiting(f), Some((Waiting::Pending, _)))
        && f.record.is_some_and(|r| r.state == State::Synced)
}

/// How long ago `since` was at `now` (zero for a time in the future: clocks differ).
pub fn age(since: Option<Seconds>, now: jiff::Timestamp) -> Duration {
    since
        .and_then(|t| Duration::try_from(now.duration_since(t.timestamp())).ok())
        .unwrap_or_default()
}

/// Objects waiting per state, and how long the oldest has waited.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tally {
    counts: [usize; Waiting::ALL.len()],
    oldest: Duration,
}

impl Tally {
    /// One more object waiting in `state` for `age`.
    pub fn add(&mut self, state: Waiting, age: Duration) {
        self.counts[state.index()] += 1;
        self.oldest = self.oldest.max(age);
    }

    /// How many wait in `state`.
    pub fn count(&self, state: Waiting) -> usize {
        self.counts[state.index()]
    }

    /// How long the oldest has waited.
    pub fn oldest(&self) -> Duration {
        self.oldest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Seconds {
        Seconds::of(&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::from_second(second).unwrap(),
        ))
        .unwrap()
    }

    fn record(state: State, generation: i64, since: Option<i64>) -> Summary {
        Summary {
            state,
            generation: std::num::NonZeroI64::new(generation),
            since: since.map(at),
        }
    }

    #[test]
    fn only_a_synced_record_of_an_older_generation_would_mislead() {
        let base = Facts {
            generation: Some(3),
            deletion: None,
            has_finalizer: true,
            bound: true,
            conflict: false,
            has_delivery: true,
            record: None,
            changed_at: Some(at(1_000)),
        };
        let behind = record(State::Synced, 2, None);
        let current = record(State::Synced, 3, None);
        let pending = record(State::Pending, 2, Some(900));
        let rejected = record(State::Rejected, 2, Some(900));
        let paused = record(State::Paused, 2, None);
        let foreign = record(State::Other, 2, None);
        let cases: Vec<(&str, Facts, bool)> = vec![
            (
                "Synced, an older generation",
                Facts {
                    record: Some(&behind),
                    ..base
                },
                true,
            ),
            (
                "Synced, this generation",
                Facts {
                    record: Some(&current),
                    ..base
                },
                false,
            ),
            ("no record: the column is empty", base, false),
            (
                "Pending already",
                Facts {
                    record: Some(&pending),
                    ..base
                },
                false,
            ),
            (
                "Rejected",
                Facts {
                    record: Some(&rejected),
                    ..base
                },
                false,
            ),
            (
                "Paused",
                Facts {
                    record: Some(&paused),
                    ..base
                },
                false,
            ),
            (
                "someone else's state",
                Facts {
                    record: Some(&foreign),
                    ..base
                },
                false,
            ),
            (
                "unbound",
                Facts {
                    record: Some(&behind),
                    bound: false,
                    ..base
                },
                false,
            ),
            (
                "in conflict",
                Facts {
                    record: Some(&behind),
                    conflict: true,
                    ..base
                },
                false,
            ),
            (
                "being deleted",
                Facts {
                    record: Some(&behind),
                    deletion: Some(at(2_000)),
                    ..base
                },
                false,
            ),
        ];
        for (case, facts, want) in cases {
            assert_eq!(says_synced_while_waiting(&facts), want, "{case}");
        }
    }

    #[test]
    fn each_object_says_whether_it_waits_why_and_since_when() {
        let changed = at(1_000);
        let deletion = at(2_000);
        let base = Facts {
            generation: Some(3),
            deletion: None,
            has_finalizer: true,
            bound: true,
            conflict: false,
            has_delivery: true,
            record: None,
            changed_at: Some(changed),
        };
        let synced = record(State::Synced, 3, None);
        let behind = record(State::Synced, 2, None);
        let pending = record(State::Pending, 2, Some(900));
        let rejected = record(State::Rejected, 2, Some(800));
        let forbidden = record(State::Forbidden, 2, None);
        let foreign = record(State::Other, 3, None);
        let paused = record(State::Paused, 2, None);
        type Want = Option<(Waiting, Option<Seconds>)>;
        let cases: Vec<(&str, Facts, Want)> = vec![
            (
                "delivered",
                Facts {
                    record: Some(&synced),
                    ..base
                },
                None,
            ),
            (
                "paused, a newer generation held back: not waiting on kbind",
                Facts {
                    record: Some(&paused),
                    ..base
                },
                None,
            ),
            (
                "never delivered: since its change",
                base,
                Some((Waiting::Pending, Some(changed))),
            ),
            (
                "a newer generation: since its change",
                Facts {
                    record: Some(&behind),
                    ..base
                },
                Some((Waiting::Pending, Some(changed))),
            ),
            (
                "pending: since the record says",
                Facts {
                    record: Some(&pending),
                    ..base
                },
                Some((Waiting::Pending, pending.since)),
            ),
            (
                "rejected",
                Facts {
                    record: Some(&rejected),
                    ..base
                },
                Some((Waiting::Rejected, rejected.since)),
            ),
            (
                "forbidden, no since: its change",
                Facts {
                    record: Some(&forbidden),
                    ..base
                },
                Some((Waiting::Forbidden, Some(changed))),
            ),
            (
                "someone else's state, same generation",
                Facts {
                    record: Some(&foreign),
                    ..base
                },
                None,
            ),
            (
                "deleting",
                Facts {
                    deletion: Some(deletion),
                    record: Some(&synced),
                    ..base
                },
                Some((Waiting::Deleting, Some(deletion))),
            ),
            (
                "deleting, released",
                Facts {
                    deletion: Some(deletion),
                    has_finalizer: false,
                    ..base
                },
                None,
            ),
            (
                "deleting, even unbound",
                Facts {
                    deletion: Some(deletion),
                    bound: false,
                    ..base
                },
                Some((Waiting::Deleting, Some(deletion))),
            ),
            (
                "unbound",
                Facts {
                    bound: false,
                    ..base
                },
                None,
            ),
            (
                "in conflict",
                Facts {
                    conflict: true,
                    ..base
                },
                None,
            ),
            (
                "no record in its CRD",
                Facts {
                    has_delivery: false,
                    ..base
                },
                None,
            ),
        ];
        for (name, facts, want) in cases {
            assert_eq!(waiting(&facts), want, "{name}");
        }
    }

    #[test]
    fn ages_count_from_the_object_and_the_tally_keeps_the_oldest() {
        let now = jiff::Timestamp::from_second(1_060).unwrap();
        assert_eq!(age(Some(at(1_000)), now), Duration::from_secs(60));
        assert_eq!(age(Some(at(2_000)), now), Duration::ZERO, "a clock ahead");
        assert_eq!(age(None, now), Duration::ZERO);
        let mut tally = Tally::default();
        let total = |t: &Tally| Waiting::ALL.iter().map(|w| t.count(*w)).sum::<usize>();
        assert_eq!((total(&tally), tally.oldest()), (0, Duration::ZERO));
        tally.add(Waiting::Rejected, Duration::from_secs(5));
        tally.add(Waiting::Pending, Duration::from_secs(60));
        tally.add(Waiting::Pending, Duration::from_secs(1));
        assert_eq!(tally.count(Waiting::Pending), 2);
        assert_eq!(tally.count(Waiting::Rejected), 1);
        assert_eq!(tally.count(Waiting::Status), 0);
        assert_eq!(
            (total(&tally), tally.oldest()),
            (3, Duration::from_secs(60))
        );
        let labels: Vec<_> = Waiting::ALL.iter().map(|w| w.label()).collect();
        assert_eq!(
            labels,
            ["pending", "rejected", "forbidden", "deleting", "status"]
        );
    }
}
