//! The backlog of one worker: objects whose change a watch showed and that are not synced yet,
//! with when each kind of change was first seen. What the lag histograms measure from and what
//! `kbind_sync_backlog` counts. A reconcile takes an object's entry when it starts and gives it
//! back if it fails, so an object that keeps failing stays in the backlog and ages.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::status_delay::{self, StatusDelay};

/// The backlog key of an object.
pub(super) fn key<K: kube::Resource>(object: &K) -> Key {
    use kube::ResourceExt;
    (object.namespace(), object.name_any())
}

/// `(namespace, name)` of a consumer object.
pub type Key = (Option<String>, String);

/// When the changes waiting for one object were first seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seen {
    /// A consumer change (spec, metadata or deletion).
    pub consumer: Option<Instant>,
    /// A provider change (its status, or drift).
    pub provider: Option<Instant>,
    /// The latest provider change: when the provider's newest status was seen, for how long the
    /// provider took to answer (several changes can wait as one — the copy created, then its
    /// status set — and the first is not the answer).
    pub provider_latest: Option<Instant>,
}

impl Seen {
    /// The earliest change.
    pub fn first(&self) -> Option<Instant> {
        match (self.consumer, self.provider) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn merge(&mut self, other: Seen) {
        let earliest = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.consumer = earliest(self.consumer, other.consumer);
        self.provider = earliest(self.provider, other.provider);
        self.provider_latest = self.provider_latest.max(other.provider_latest);
    }
}

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

/// The backlog, and when each deletion in progress was first seen (a deletion takes several
/// reconciles: delete the copy, wait until it is gone, release the finalizer).
#[derive(Debug, Default)]
pub struct Pending {
    waiting: HashMap<Key, Seen>,
    deleting: HashMap<Key, Instant>,
    /// When kbind last wrote an object's spec to the provider, until the provider's status
    /// change for it is seen (or [`status_delay::REMEMBERED`] has passed).
    applied: HashMap<Key, Applied>,
    /// How long the provider has recently taken to answer a spec with a status change.
    delay: StatusDelay,
    /// When each object's status was last written, while that is less than `status_interval`
    /// ago: a provider cannot make kbind write one object's status faster than that (#32.2).
    status_written: HashMap<Key, Instant>,
    status_interval: Duration,
}

/// A spec write whose status change has not been seen yet.
#[derive(Debug, Clone, Copy)]
struct Applied {
    at: Instant,
    /// The delivery record stopped waiting and was written on its own; the status change is
    /// still watched for, as a measure of how long the provider takes.
    alone: bool,
}

impl Pending {
    /// A backlog whose objects' statuses are written at most once per `status_interval`.
    pub fn new(status_interval: Duration) -> Self {
        Self {
            status_interval,
            ..Self::default()
        }
    }

    /// How much longer a status write to `key` must wait at `now`; `None` when it may go.
    pub fn status_write_wait(&self, key: &Key, now: Instant) -> Option<Duration> {
        let last = self.status_written.get(key)?;
        let left = self
            .status_interval
            .saturating_sub(now.saturating_duration_since(*last));
        (!left.is_zero()).then_some(left)
    }

    /// The status of `key` was written at `now`.
    pub fn status_written(&mut self, key: Key, now: Instant) {
        if !self.status_interval.is_zero() {
            self.status_written.insert(key, now);
        }
    }

    /// A watch showed a consumer change of `key` at `now`; `deleting`: it is being deleted.
    pub fn consumer_changed(&mut self, key: Key, now: Instant, deleting: bool) {
        if deleting {
            self.deleting.entry(key.clone()).or_insert(now);
        }
        self.waiting.entry(key).or_default().merge(Seen {
            consumer: Some(now),
            ..Seen::default()
        });
    }

    /// A watch showed a provider change of the copy of `key` at `now`.
    pub fn provider_changed(&mut self, key: Key, now: Instant) {
        self.waiting.entry(key).or_default().merge(Seen {
            consumer: None,
            provider: Some(now),
            provider_latest: Some(now),
        });
    }

    /// A sync of `key` starts: what it is about (nothing for a periodic resync).
    pub fn take(&mut self, key: &Key) -> Seen {
        self.waiting.remove(key).unwrap_or_default()
    }

    /// That sync failed: its changes are waiting again, as old as they were.
    pub fn give_back(&mut self, key: Key, seen: Seen) {
        if seen.first().is_some() {
            self.waiting.entry(key).or_default().merge(seen);
        }
    }

    /// When the deletion of `key` was first seen, if it is being deleted.
    pub fn deletion_started(&self, key: &Key) -> Option<Instant> {
        self.deleting.get(key).copied()
    }

    /// The deletion of `key` finished (or the object is gone): when it was first seen.
    pub fn deleted(&mut self, key: &Key) -> Option<Instant> {
        self.waiting.remove(key);
        self.applied.remove(key);
        self.deleting.remove(key)
    }

    /// kbind wrote the spec of `key` to the provider at `now`.
    pub fn spec_applied(&mut self, key: Key, now: Instant) {
        self.applied.insert(
            key,
            Applied {
                at: now,
                alone: false,
            },
        );
    }

    /// Whether kbind wrote the spec of `key` to the provider at or after `at` (and no status
    /// change for it has been written since).
    pub fn applied_since(&self, key: &Key, at: Instant) -> bool {
        self.applied.get(key).is_some_and(|a| a.at >= at)
    }

    /// How much longer a delivery record for `key` should wait for the provider's status change
    /// ([`Self::record_wait`] after the spec was written); `None` once it need not.
    pub fn record_wait_left(&mut self, key: &Key, now: Instant) -> Option<Duration> {
        let wait = self.delay.wait();
        let applied = self.applied.get_mut(key)?;
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
    }

    /// How long a delivery record waits after its spec was written, as learned from the
    /// provider's recent answers.
    pub fn record_wait(&self) -> Duration {
        self.delay.wait()
    }

    /// The provider's status change for `key`, first seen at `seen`, is being written (with the
    /// record): how long it took after the spec write teaches the wait.
    pub fn status_carried(&mut self, key: &Key, seen: Instant) {
        if let Some(applied) = self.applied.remove(key) {
            self.delay
                .observe(seen.saturating_duration_since(applied.at));
        }
    }

    /// The objects waiting, and when their changes were seen.
    pub fn entries(&self) -> impl Iterator<Item = (&Key, &Seen)> {
        self.waiting.iter()
    }

    /// Objects waiting, and how long the oldest has waited at `now` (what memory alone says; the
    /// gauges also read the objects).
    #[cfg(test)]
    pub fn backlog(&self, now: Instant) -> (usize, Duration) {
        let oldest = self
            .waiting
            .values()
            .filter_map(Seen::first)
            .min()
            .map(|t| now.saturating_duration_since(t))
            .unwrap_or_default();
        (self.waiting.len(), oldest)
    }

    /// Gives back the room a burst left behind (a hash map keeps its largest size: after a start
    /// that saw every object change at once, the backlog's maps would hold room for all of them
    /// for good), and forgets spec writes no status change has answered for
    /// [`status_delay::REMEMBERED`]. Called once a second.
    pub fn compact(&mut self, now: Instant) {
        self.applied
            .retain(|_, a| now.saturating_duration_since(a.at) < status_delay::REMEMBERED);
        let interval = self.status_interval;
        self.status_written
            .retain(|_, at| now.saturating_duration_since(*at) < interval);
        fn shrink<V>(map: &mut HashMap<Key, V>) {
            if map.capacity() > 4 * map.len().max(16) {
                map.shrink_to_fit();
            }
        }
        shrink(&mut self.waiting);
        shrink(&mut self.deleting);
        shrink(&mut self.applied);
        shrink(&mut self.status_written);
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

    fn key(name: &str) -> Key {
        (Some("ns".into()), name.into())
    }

    #[test]
    fn changes_wait_until_a_sync_takes_them_and_failures_give_them_back() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut p = Pending::default();
        assert_eq!(p.backlog(at(0)), (0, Duration::ZERO));

        // Two consumer events before a sync: the first one counts.
        p.consumer_changed(key("a"), at(10), false);
        p.consumer_changed(key("a"), at(20), false);
        p.provider_changed(key("b"), at(30));
        assert_eq!(p.backlog(at(110)), (2, Duration::from_millis(100)));

        // A sync takes a's changes; b still waits.
        let seen = p.take(&key("a"));
        assert_eq!(seen.consumer, Some(at(10)));
        assert_eq!(seen.provider, None);
        assert_eq!(p.backlog(at(110)), (1, Duration::from_millis(80)));

        // A change during the sync, then the sync fails: the earliest time survives.
        p.provider_changed(key("a"), at(50));
        p.give_back(key("a"), seen);
        let again = p.take(&key("a"));
        assert_eq!(
            (again.consumer, again.provider),
            (Some(at(10)), Some(at(50)))
        );
        // Two provider changes waiting as one: the first for the lag, the latest for the answer.
        p.provider_changed(key("d"), at(60));
        p.provider_changed(key("d"), at(90));
        let both = p.take(&key("d"));
        assert_eq!(
            (both.provider, both.provider_latest),
            (Some(at(60)), Some(at(90)))
        );
        assert_eq!(again.first(), Some(at(10)));

        // A periodic resync takes nothing, and giving nothing back adds nothing.
        let none = p.take(&key("c"));
        assert_eq!(none, Seen::default());
        p.give_back(key("c"), none);
        assert_eq!(p.backlog(at(200)).0, 1);
    }

    #[test]
    fn a_delivery_record_waits_a_while_after_the_spec_was_written_then_not_at_all() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut p = Pending::default();
        assert_eq!(p.record_wait(), status_delay::FLOOR, "nothing learned yet");
        assert_eq!(
            p.record_wait_left(&key("a"), t0),
            None,
            "nothing written, nothing to wait for"
        );
        p.spec_applied(key("a"), t0);
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
        p.spec_applied(key("b"), at(4000));
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
            p.spec_applied(key(&name), at(5000));
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

        p.spec_applied(key("c"), t0);
        p.deleted(&key("c"));
        assert_eq!(p.record_wait_left(&key("c"), t0), None, "gone");

        // A spec write no status change answers is forgotten after a while, and teaches nothing.
        p.spec_applied(key("d"), at(10_000));
        p.compact(at(10_000) + status_delay::REMEMBERED - Duration::from_millis(1));
        assert!(p.applied.contains_key(&key("d")));
        p.compact(at(10_000) + status_delay::REMEMBERED);
        assert!(p.applied.is_empty());
        p.status_carried(&key("d"), at(100_000));
        assert_eq!(p.record_wait(), learned);
    }

    #[test]
    fn room_left_by_a_burst_is_given_back_and_entries_kept() {
        let t0 = Instant::now();
        let mut p = Pending::default();
        for i in 0..1000 {
            p.consumer_changed(key(&format!("w{i}")), t0, false);
        }
        for i in 1..1000 {
            let _ = p.take(&key(&format!("w{i}")));
        }
        let burst = p.waiting.capacity();
        assert!(burst >= 1000);
        p.compact(t0);
        assert!(p.waiting.capacity() < 100, "{}", p.waiting.capacity());
        assert_eq!(p.backlog(t0).0, 1);
        assert_eq!(p.take(&key("w0")).consumer, Some(t0));
        // Not shrunk when the room is in use.
        for i in 0..1000 {
            p.consumer_changed(key(&format!("w{i}")), t0, false);
        }
        let full = p.waiting.capacity();
        p.compact(t0);
        assert_eq!(p.waiting.capacity(), full);
    }

    #[test]
    fn status_writes_to_one_object_are_paced_and_forgotten_once_the_interval_passed() {
        // #32.2
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut p = Pending::new(Duration::from_secs(1));
        assert_eq!(p.status_write_wait(&key("a"), t0), None);
        p.status_written(key("a"), t0);
        assert_eq!(
            p.status_write_wait(&key("a"), ms(300)),
            Some(Duration::from_millis(700))
        );
        assert_eq!(p.status_write_wait(&key("b"), ms(300)), None, "per object");
        assert_eq!(p.status_write_wait(&key("a"), ms(1000)), None);
        p.compact(ms(999));
        assert_eq!(p.status_written.len(), 1);
        p.compact(ms(1000));
        assert!(
            p.status_written.is_empty(),
            "nothing kept past the interval"
        );
        // A zero interval keeps nothing at all.
        let mut unpaced = Pending::new(Duration::ZERO);
        unpaced.status_written(key("a"), t0);
        assert_eq!(unpaced.status_write_wait(&key("a"), t0), None);
        assert!(unpaced.status_written.is_empty());
    }

    #[test]
    fn a_spec_write_counts_as_delivering_only_changes_seen_before_it() {
        let mut p = Pending::default();
        let t0 = Instant::now();
        assert!(!p.applied_since(&key("a"), t0));
        p.spec_applied(key("a"), t0 + Duration::from_millis(500));
        assert!(p.applied_since(&key("a"), t0));
        assert!(!p.applied_since(&key("a"), t0 + Duration::from_secs(1)));
        assert!(!p.applied_since(&key("b"), t0));
        p.status_carried(&key("a"), t0 + Duration::from_secs(2));
        assert!(!p.applied_since(&key("a"), t0));
    }

    #[test]
    fn a_deletion_is_timed_from_its_first_sighting_across_syncs() {
        let t0 = Instant::now();
        let mut p = Pending::default();
        p.consumer_changed(key("a"), t0, true);
        let _ = p.take(&key("a"));
        // The copy's deletion shows up as a provider event, later.
        p.consumer_changed(key("a"), t0 + Duration::from_secs(1), true);
        p.provider_changed(key("a"), t0 + Duration::from_secs(2));
        assert_eq!(p.deletion_started(&key("a")), Some(t0));
        assert_eq!(p.deleted(&key("a")), Some(t0));
        assert_eq!(p.backlog(t0).0, 0, "a finished deletion leaves no backlog");
        assert_eq!(p.deleted(&key("a")), None);
    }
}
