//! The backlog of one worker: objects whose change a watch showed and that are not synced yet,
//! with when each kind of change was first seen. What the lag histograms measure from and what
//! `kbind_sync_backlog` counts. A reconcile takes an object's entry when it starts and gives it
//! back if it fails, so an object that keeps failing stays in the backlog and ages.

use std::time::{Duration, Instant};

use super::record::Applied;
pub(super) use super::record::{Key, Seen, key};
use super::status_delay;
use super::tracked::Tracked;

/// When the change a delivering write delivers began (#33.3): the earliest of kbind's `receipt`
/// of it and the API server's own `recorded` time of it (a `managedFields` entry, a creation or
/// deletion timestamp). The API server records to the second, so its record says the change
/// happened before `recorded` + 1 s; that bound is what is compared — a change kbind saw at once
/// is timed from its receipt, one it learned of late (a restart, a binding change, a resync, a
/// watch gap) from the API server's record, understated by less than a second and never
/// overstated. `now` and `wall` are the same moment on both clocks.
pub fn change_start(
    receipt: Option<Instant>,
    recorded: Option<kbind_shared::delivery::Seconds>,
    now: Instant,
    wall: jiff::Timestamp,
) -> Option<Instant> {
    let recorded = recorded.map(|t| {
        let bound = t.timestamp() + jiff::SignedDuration::from_secs(1);
        let ago = Duration::try_from(wall.duration_since(bound)).unwrap_or_default();
        now.checked_sub(ago).unwrap_or(now)
    });
    match (receipt, recorded) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The backlog's transitions, and when each deletion in progress was first seen (a deletion
/// takes several reconciles: delete the copy, wait until it is gone, release the finalizer) —
/// fields of each object's record ([`Tracked`]).
impl Tracked {
    /// How much longer a status write to `key` must wait at `now`; `None` when it may go.
    pub fn status_write_wait(&self, key: &Key, now: Instant) -> Option<Duration> {
        let last = self.busy(key)?.status_written?;
        let left = self
            .status_interval
            .saturating_sub(now.saturating_duration_since(last));
        (!left.is_zero()).then_some(left)
    }

    /// The status of `key` was written at `now`.
    pub fn status_written(&mut self, key: &Key, now: Instant) {
        if !self.status_interval.is_zero() {
            self.update(key, |b| b.status_written = Some(now));
        }
    }

    /// A watch showed a consumer change of `key` at `now`; `deleting`: it is being deleted.
    pub fn consumer_changed(&mut self, key: &Key, now: Instant, deleting: bool) {
        self.update(key, |b| {
            if deleting {
                b.deleting.get_or_insert(now);
            }
            b.waiting.get_or_insert_default().merge(Seen {
                consumer: Some(now),
                ..Seen::default()
            });
        });
    }

    /// A watch showed a provider change of the copy of `key` at `now`.
    pub fn provider_changed(&mut self, key: &Key, now: Instant) {
        self.update(key, |b| {
            b.waiting.get_or_insert_default().merge(Seen {
                consumer: None,
                provider: Some(now),
                provider_latest: Some(now),
            });
        });
    }

    /// A sync of `key` starts: what it is about (nothing for a periodic resync).
    pub fn take(&mut self, key: &Key) -> Seen {
        self.update_existing(key, |b| b.waiting.take())
            .flatten()
            .unwrap_or_default()
    }

    /// That sync failed: its changes are waiting again, as old as they were.
    pub fn give_back(&mut self, key: &Key, seen: Seen) {
        if seen.first().is_some() {
            self.update(key, |b| b.waiting.get_or_insert_default().merge(seen));
        }
    }

    /// When the deletion of `key` was first seen, if it is being deleted.
    pub fn deletion_started(&self, key: &Key) -> Option<Instant> {
        self.busy(key)?.deleting
    }

    /// The deletion of `key` finished (or the object is gone): when it was first seen.
    pub fn deleted(&mut self, key: &Key) -> Option<Instant> {
        self.update_existing(key, |b| {
            b.waiting = None;
            b.applied = None;
            b.deleting.take()
        })
        .flatten()
    }

    /// kbind wrote the spec of `key` to the provider at `now`.
    pub fn spec_applied(&mut self, key: &Key, now: Instant) {
        self.update(key, |b| {
            b.applied = Some(Applied {
                at: now,
                alone: false,
            });
        });
    }

    /// Whether kbind wrote the spec of `key` to the provider at or after `at` (and no status
    /// change for it has been written since).
    pub fn applied_since(&self, key: &Key, at: Instant) -> bool {
        self.busy(key)
            .and_then(|b| b.applied)
            .is_some_and(|a| a.at >= at)
    }

    /// How much longer a delivery record for `key` should wait for the provider's status change
    /// ([`Self::record_wait`] after the spec was written); `None` once it need not.
    pub fn record_wait_left(&mut self, key: &Key, now: Instant) -> Option<Duration> {
        let wait = self.delay.wait();
        self.update_existing(key, |b| {
            let applied = b.applied.as_mut()?;
            if applied.alone {
                return None;
            }
            let left = wait.saturating_sub(now.saturating_duration_since(applied.at));
            if left.is_zero() {
                applied.alone = true;
                None
            } else {
                Some(left)
            }
        })
        .flatten()
    }

    /// How long a delivery record waits after its spec was written, as learned from the
    /// provider's recent answers.
    pub fn record_wait(&self) -> Duration {
        self.delay.wait()
    }

    /// The provider's status change for `key`, first seen at `seen`, is being written (with the
    /// record): how long it took after the spec write teaches the wait.
    pub fn status_carried(&mut self, key: &Key, seen: Instant) {
        if let Some(applied) = self.update_existing(key, |b| b.applied.take()).flatten() {
            self.delay
                .observe(seen.saturating_duration_since(applied.at));
        }
    }

    /// The objects waiting, and when their changes were seen.
    pub fn waiting(&self) -> impl Iterator<Item = (Key, Seen)> {
        self.busy_parts()
            .filter_map(|b| Some((b.name().key(), *b.waiting.as_ref()?)))
    }

    /// Objects waiting, and how long the oldest has waited at `now` (what memory alone says; the
    /// gauges also read the objects).
    #[cfg(test)]
    pub fn backlog(&self, now: Instant) -> (usize, Duration) {
        let oldest = self
            .waiting()
            .filter_map(|(_, seen)| seen.first())
            .min()
            .map(|t| now.saturating_duration_since(t))
            .unwrap_or_default();
        (self.waiting().count(), oldest)
    }

    /// Forgets spec writes no status change has answered for [`status_delay::REMEMBERED`] and
    /// status writes older than the pacing interval, and gives back the room a burst left
    /// behind. Called once a second.
    pub fn compact(&mut self, now: Instant) {
        let interval = self.status_interval;
        self.update_all(|b| {
            if b.applied
                .is_some_and(|a| now.saturating_duration_since(a.at) >= status_delay::REMEMBERED)
            {
                b.applied = None;
            }
            if b.status_written
                .is_some_and(|at| now.saturating_duration_since(at) >= interval)
            {
                b.status_written = None;
            }
        });
        self.shrink();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_timed_from_the_earlier_of_its_receipt_and_the_api_servers_record() {
        let now = Instant::now();
        let wall = jiff::Timestamp::from_second(1_000).unwrap();
        let at = |second: i64| {
            kbind_shared::delivery::Seconds::of(
                &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    jiff::Timestamp::from_second(second).unwrap(),
                ),
            )
        };
        let secs = |n: u64| Duration::from_secs(n);
        // Seen at once (the record, 990 s, allows up to 991 s; the receipt at 995 s is later):
        // the record's bound.
        let late = now - secs(5);
        assert_eq!(
            change_start(Some(late), at(990), now, wall),
            Some(now - secs(9))
        );
        // Seen within the record's second: the receipt, which is earlier than the bound.
        let prompt = now - Duration::from_millis(300);
        assert_eq!(change_start(Some(prompt), at(999), now, wall), Some(prompt));
        // Only one of them known.
        assert_eq!(change_start(None, at(900), now, wall), Some(now - secs(99)));
        assert_eq!(change_start(Some(late), None, now, wall), Some(late));
        assert_eq!(change_start(None, None, now, wall), None);
        // A record ahead of this clock: no earlier than now.
        assert_eq!(change_start(None, at(2_000), now, wall), Some(now));
    }

    use super::super::record::test_key as key;

    #[test]
    fn changes_wait_until_a_sync_takes_them_and_failures_give_them_back() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut p = Tracked::default();
        assert_eq!(p.backlog(at(0)), (0, Duration::ZERO));

        // Two consumer events before a sync: the first one counts.
        p.consumer_changed(&key("a"), at(10), false);
        p.consumer_changed(&key("a"), at(20), false);
        p.provider_changed(&key("b"), at(30));
        assert_eq!(p.backlog(at(110)), (2, Duration::from_millis(100)));

        // A sync takes a's changes; b still waits.
        let seen = p.take(&key("a"));
        assert_eq!(seen.consumer, Some(at(10)));
        assert_eq!(seen.provider, None);
        assert_eq!(p.backlog(at(110)), (1, Duration::from_millis(80)));

        // A change during the sync, then the sync fails: the earliest time survives.
        p.provider_changed(&key("a"), at(50));
        p.give_back(&key("a"), seen);
        let again = p.take(&key("a"));
        assert_eq!(
            (again.consumer, again.provider),
            (Some(at(10)), Some(at(50)))
        );
        // Two provider changes waiting as one: the first for the lag, the latest for the answer.
        p.provider_changed(&key("d"), at(60));
        p.provider_changed(&key("d"), at(90));
        let both = p.take(&key("d"));
        assert_eq!(
            (both.provider, both.provider_latest),
            (Some(at(60)), Some(at(90)))
        );
        assert_eq!(again.first(), Some(at(10)));

        // A periodic resync takes nothing, and giving nothing back adds nothing.
        let none = p.take(&key("c"));
        assert_eq!(none, Seen::default());
        p.give_back(&key("c"), none);
        assert_eq!(p.backlog(at(200)).0, 1);
    }

    #[test]
    fn a_delivery_record_waits_a_while_after_the_spec_was_written_then_not_at_all() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut p = Tracked::default();
        assert_eq!(p.record_wait(), status_delay::FLOOR, "nothing learned yet");
        assert_eq!(
            p.record_wait_left(&key("a"), t0),
            None,
            "nothing written, nothing to wait for"
        );
        p.spec_applied(&key("a"), t0);
        assert_eq!(
            p.record_wait_left(&key("a"), at(500)),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(p.record_wait_left(&key("a"), at(2000)), None);
        assert_eq!(
            p.record_wait_left(&key("a"), t0),
            None,
            "written on its own once the wait is over"
        );

        // The status comes 3 s after the spec, after the record was written alone: the wait
        // learns from it (first answer: 3 s + 4 × 1.5 s).
        p.status_carried(&key("a"), at(3000));
        assert_eq!(p.record_wait(), Duration::from_secs(9));
        p.spec_applied(&key("b"), at(4000));
        assert_eq!(
            p.record_wait_left(&key("b"), at(6000)),
            Some(Duration::from_secs(7)),
            "the next record waits longer"
        );
        // Carried: forgotten; quick answers shorten the wait again.
        p.status_carried(&key("b"), at(4100));
        assert_eq!(p.record_wait_left(&key("b"), at(4200)), None);
        for i in 0..20 {
            let name = format!("q{i}");
            p.spec_applied(&key(&name), at(5000));
            p.status_carried(&key(&name), at(5100));
        }
        assert!(
            p.record_wait() < Duration::from_secs(3),
            "{:?}",
            p.record_wait()
        );
        let learned = p.record_wait();
        p.status_carried(&key("b"), at(60_000));
        assert_eq!(
            p.record_wait(),
            learned,
            "a status change nothing waited for teaches nothing"
        );

        p.spec_applied(&key("c"), t0);
        p.deleted(&key("c"));
        assert_eq!(p.record_wait_left(&key("c"), t0), None, "gone");

        // A spec write no status change answers is forgotten after a while, and teaches nothing.
        p.spec_applied(&key("d"), at(10_000));
        p.compact(at(10_000) + status_delay::REMEMBERED - Duration::from_millis(1));
        assert!(p.busy(&key("d")).is_some_and(|b| b.applied.is_some()));
        p.compact(at(10_000) + status_delay::REMEMBERED);
        assert!(p.busy(&key("d")).is_none());
        p.status_carried(&key("d"), at(100_000));
        assert_eq!(p.record_wait(), learned);
    }

    #[test]
    fn room_left_by_a_burst_is_given_back_and_entries_kept() {
        let t0 = Instant::now();
        let mut p = Tracked::default();
        for i in 0..1000 {
            p.consumer_changed(&key(&format!("w{i}")), t0, false);
        }
        for i in 1..1000 {
            let _ = p.take(&key(&format!("w{i}")));
        }
        let burst = p.capacity();
        assert!(burst >= 1000);
        p.compact(t0);
        assert!(p.capacity() < 100, "{}", p.capacity());
        assert_eq!(p.backlog(t0).0, 1);
        assert_eq!(p.take(&key("w0")).consumer, Some(t0));
        // Not shrunk when the room is in use.
        for i in 0..1000 {
            p.consumer_changed(&key(&format!("w{i}")), t0, false);
        }
        let full = p.capacity();
        p.compact(t0);
        assert_eq!(p.capacity(), full);
    }

    #[test]
    fn status_writes_to_one_object_are_paced_and_forgotten_once_the_interval_passed() {
        // #32.2
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut p = Tracked::new(Duration::from_secs(1));
        assert_eq!(p.status_write_wait(&key("a"), t0), None);
        p.status_written(&key("a"), t0);
        assert_eq!(
            p.status_write_wait(&key("a"), ms(300)),
            Some(Duration::from_millis(700))
        );
        assert_eq!(p.status_write_wait(&key("b"), ms(300)), None, "per object");
        assert_eq!(p.status_write_wait(&key("a"), ms(1000)), None);
        p.compact(ms(999));
        assert!(
            p.busy(&key("a"))
                .is_some_and(|b| b.status_written.is_some())
        );
        p.compact(ms(1000));
        assert_eq!(p.len(), 0, "nothing kept past the interval");
        // A zero interval keeps nothing at all.
        let mut unpaced = Tracked::new(Duration::ZERO);
        unpaced.status_written(&key("a"), t0);
        assert_eq!(unpaced.status_write_wait(&key("a"), t0), None);
        assert_eq!(unpaced.len(), 0);
    }

    #[test]
    fn a_spec_write_counts_as_delivering_only_changes_seen_before_it() {
        let mut p = Tracked::default();
        let t0 = Instant::now();
        assert!(!p.applied_since(&key("a"), t0));
        p.spec_applied(&key("a"), t0 + Duration::from_millis(500));
        assert!(p.applied_since(&key("a"), t0));
        assert!(!p.applied_since(&key("a"), t0 + Duration::from_secs(1)));
        assert!(!p.applied_since(&key("b"), t0));
        p.status_carried(&key("a"), t0 + Duration::from_secs(2));
        assert!(!p.applied_since(&key("a"), t0));
    }

    #[test]
    fn a_deletion_is_timed_from_its_first_sighting_across_syncs() {
        let t0 = Instant::now();
        let mut p = Tracked::default();
        p.consumer_changed(&key("a"), t0, true);
        let _ = p.take(&key("a"));
        // The copy's deletion shows up as a provider event, later.
        p.consumer_changed(&key("a"), t0 + Duration::from_secs(1), true);
        p.provider_changed(&key("a"), t0 + Duration::from_secs(2));
        assert_eq!(p.deletion_started(&key("a")), Some(t0));
        assert_eq!(p.deleted(&key("a")), Some(t0));
        assert_eq!(p.backlog(t0).0, 0, "a finished deletion leaves no backlog");
        assert_eq!(p.deleted(&key("a")), None);
    }
}
