//! Everything a worker tracks of its objects besides the two caches: **one record per object**, in
//! one map, under one lock (#50.1). At rest a synced object's record is only where it stands (for
//! the gauges) under an 8-byte key; while something about it is under way — a change waiting, a
//! deletion in progress, a write whose echo is awaited, a stranger under its name, a status write
//! paced, a status too large — the record holds a [`Busy`] part too, dropped as soon as nothing is
//! under way any more.
//!
//! The transitions are named after what happened; each concern keeps its rules in its own module,
//! as methods of [`Tracked`] that read and change only their fields of the record: `pending`
//! (changes waiting, deletions, the delivery record's wait, status pacing), `echoes` (kbind's own
//! writes the caches do not show yet) and `strangers` (provider objects under a consumer object's
//! name the cache does not show); where each object stands, counted, is kept here. The record's
//! data types are in `record`.
//!
//! The key is a hash of the object's namespace and name, keyed at random per worker so that no
//! tenant can choose names that collide. The busy part holds the names too and answers only for
//! its own object: a collision (odds about 1 in 10^10 at 100,000 objects) can at worst merge two
//! objects' states in a gauge, or make one object forget what was under way for the other (an
//! echo not waited for: at most one write more) — never decide one object from another's facts.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use super::record::{Applied, Counts, Key, Name, ProviderEcho, Seen, Stranger, SyncState};
use super::status_delay::StatusDelay;

/// The first wait after a failed sync.
const RETRY_BASE: Duration = Duration::from_secs(1);
/// The longest wait between two tries of a sync that keeps failing.
const RETRY_CAP: Duration = Duration::from_secs(300);

/// The records of one worker's objects, and what is learned across them.
#[derive(Debug)]
pub struct Tracked {
    records: HashMap<u64, Record>,
    ids: RandomState,
    /// How many records have a busy part.
    busy: usize,
    /// How many objects are in each state.
    counts: Counts,
    /// How long the provider has recently taken to answer a spec with a status change.
    pub(super) delay: StatusDelay,
    /// An object's status is written at most once per this interval (#32.2).
    pub(super) status_interval: Duration,
}

/// One object's record.
#[derive(Debug, Default)]
struct Record {
    state: Option<SyncState>,
    busy: Option<Box<Busy>>,
}

/// What is under way for one object.
#[derive(Debug)]
pub(super) struct Busy {
    name: Name,
    /// Changes seen and not synced yet (`pending`).
    pub(super) waiting: Option<Seen>,
    /// When its deletion was first seen.
    pub(super) deleting: Option<std::time::Instant>,
    /// kbind's last spec write whose status change has not been seen yet.
    pub(super) applied: Option<Applied>,
    /// When its status was last written, while pacing applies.
    pub(super) status_written: Option<std::time::Instant>,
    /// The resourceVersion kbind's last consumer write went over, until its echo (`echoes`).
    pub(super) written_over: Option<Box<str>>,
    /// kbind's provider write whose echo the provider cache does not show yet.
    pub(super) provider_echo: Option<Box<ProviderEcho>>,
    /// The provider object under its name the cache does not show (`strangers`).
    pub(super) stranger: Option<Box<Stranger>>,
    /// Its provider status is too large to copy (warned about once).
    pub(super) oversized: bool,
    /// Its syncs' failures in a row, and the last one's message (logged and announced once).
    pub(super) failures: Option<Box<(u32, Box<str>)>>,
}

impl Busy {
    fn new(key: &Key) -> Self {
        Self {
            name: Name::of(key),
            waiting: None,
            deleting: None,
            applied: None,
            status_written: None,
            written_over: None,
            provider_echo: None,
            stranger: None,
            oversized: false,
            failures: None,
        }
    }

    /// The object it is of.
    pub(super) fn name(&self) -> &Name {
        &self.name
    }

    fn idle(&self) -> bool {
        self.waiting.is_none()
            && self.deleting.is_none()
            && self.applied.is_none()
            && self.status_written.is_none()
            && self.written_over.is_none()
            && self.provider_echo.is_none()
            && self.stranger.is_none()
            && !self.oversized
            && self.failures.is_none()
    }
}

impl Default for Tracked {
    fn default() -> Self {
        Self::new(Duration::ZERO)
    }
}

impl Tracked {
    /// No records yet; objects' statuses are written at most once per `status_interval`.
    pub fn new(status_interval: Duration) -> Self {
        Self {
            records: HashMap::new(),
            ids: RandomState::new(),
            busy: 0,
            counts: Counts::default(),
            delay: StatusDelay::default(),
            status_interval,
        }
    }

    fn id(&self, key: &Key) -> u64 {
        self.ids.hash_one(key)
    }

    /// What is under way for `key`, if anything.
    pub(super) fn busy(&self, key: &Key) -> Option<&Busy> {
        let busy = self.records.get(&self.id(key))?.busy.as_deref()?;
        busy.name.is(key).then_some(busy)
    }

    /// Changes what is under way for `key` — begun for it when nothing was — and drops what is
    /// left idle.
    pub(super) fn update<T>(&mut self, key: &Key, change: impl FnOnce(&mut Busy) -> T) -> T {
        let id = self.id(key);
        let record = self.records.entry(id).or_default();
        let busy = match &mut record.busy {
            Some(busy) if busy.name.is(key) => busy,
            // (A collision: the other object's busy part gives way.)
            Some(busy) => {
                **busy = Busy::new(key);
                busy
            }
            empty => {
                self.busy += 1;
                empty.insert(Box::new(Busy::new(key)))
            }
        };
        let out = change(busy);
        self.tidy(id);
        out
    }

    /// Changes what is under way for `key` when something is (`None`: nothing was), and drops
    /// what is left idle.
    pub(super) fn update_existing<T>(
        &mut self,
        key: &Key,
        change: impl FnOnce(&mut Busy) -> T,
    ) -> Option<T> {
        let id = self.id(key);
        let busy = self.records.get_mut(&id)?.busy.as_deref_mut()?;
        if !busy.name.is(key) {
            return None;
        }
        let out = change(busy);
        self.tidy(id);
        Some(out)
    }

    /// Drops the busy part of record `id` once idle, and the record once it holds nothing.
    fn tidy(&mut self, id: u64) {
        let Some(record) = self.records.get_mut(&id) else {
            return;
        };
        if record.busy.as_deref().is_some_and(Busy::idle) {
            record.busy = None;
            self.busy -= 1;
        }
        if record.busy.is_none() && record.state.is_none() {
            self.records.remove(&id);
        }
    }

    /// Everything under way, object by object.
    pub(super) fn busy_parts(&self) -> impl Iterator<Item = &Busy> {
        self.records
            .values()
            .filter_map(|r| r.busy.as_deref())
            // (Nothing to look at when nothing is under way: at rest no record is visited.)
            .take(self.busy)
    }

    /// Changes what is under way for every object with `change`, and drops what is left idle.
    pub(super) fn update_all(&mut self, mut change: impl FnMut(&mut Busy)) {
        if self.busy == 0 {
            return;
        }
        let mut dropped = 0;
        self.records.retain(|_, record| {
            if let Some(busy) = record.busy.as_deref_mut() {
                change(busy);
                if busy.idle() {
                    record.busy = None;
                    dropped += 1;
                }
            }
            record.busy.is_some() || record.state.is_some()
        });
        self.busy -= dropped;
    }

    /// Gives back the room a burst left behind: a hash map keeps its largest size, and after a
    /// start that saw every object change at once (or after many objects went) it would hold
    /// room for all of them for good.
    pub(super) fn shrink(&mut self) {
        if self.records.capacity() > 4 * self.records.len().max(16) {
            self.records.shrink_to_fit();
        }
    }

    /// Records where `key` stands (`None`: neither synced nor conflicting nor paused): the
    /// counts after.
    pub fn set_state(&mut self, key: &Key, state: Option<SyncState>) -> Counts {
        let id = self.id(key);
        let old = match state {
            Some(state) => self.records.entry(id).or_default().state.replace(state),
            None => match self.records.get_mut(&id) {
                Some(record) => {
                    let old = record.state.take();
                    self.tidy(id);
                    old
                }
                None => None,
            },
        };
        self.counts.moved(old, state);
        self.counts
    }

    /// `key` is gone from the consumer: its record goes, and with it all it tracked. The
    /// counts after.
    pub fn gone(&mut self, key: &Key) -> Counts {
        let id = self.id(key);
        let Some(record) = self.records.get_mut(&id) else {
            return self.counts;
        };
        if record.busy.as_deref().is_some_and(|b| b.name.is(key)) {
            record.busy = None;
            self.busy -= 1;
        }
        let old = record.state.take();
        self.counts.moved(old, None);
        self.tidy(id);
        self.counts
    }

    /// How many objects are in each state.
    #[cfg(test)]
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Whether `key`'s provider status is too large to copy: `true` when it just became so.
    pub fn status_too_large(&mut self, key: &Key, too_large: bool) -> bool {
        if !too_large {
            self.update_existing(key, |b| b.oversized = false);
            return false;
        }
        self.update(key, |b| !std::mem::replace(&mut b.oversized, true))
    }

    /// A sync of `key` failed with `message`: how long until the next try (doubling from 1 s to
    /// 5 min, jittered), and whether to log it — once per streak and message.
    pub fn failed(&mut self, key: &Key, message: &str) -> kbind_shared::backoff::Retry {
        let attempt = self.update(key, |b| {
            let (count, last) = &mut **b.failures.get_or_insert_default();
            *count = count.saturating_add(1);
            let log = **last != *message;
            if log {
                *last = message.into();
            }
            (*count, log)
        });
        let name = format!("{}/{}", key.0.as_deref().unwrap_or_default(), key.1);
        kbind_shared::backoff::Retry {
            after: kbind_shared::backoff::jittered(RETRY_BASE, RETRY_CAP, &name, attempt.0),
            log: attempt.1,
        }
    }

    /// Whether a failure of `key` with `message` is news (not the one its streak last had).
    pub fn failure_is_new(&self, key: &Key, message: &str) -> bool {
        self.busy(key)
            .and_then(|b| b.failures.as_deref())
            .is_none_or(|(_, last)| **last != *message)
    }

    /// A sync of `key` succeeded: its streak of failures ends.
    pub fn succeeded(&mut self, key: &Key) {
        self.update_existing(key, |b| b.failures = None);
    }

    /// How many records there are (objects with a state or something under way).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// The map's room.
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.records.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::record::test_key as key;

    #[test]
    fn at_rest_a_record_costs_two_words() {
        // Every synced object has one: its state and an empty pointer (#50.5's memory goal).
        assert_eq!(std::mem::size_of::<Record>(), 16);
        // And while something is under way, one allocation of this size (was 280 bytes).
        assert!(
            std::mem::size_of::<Busy>() <= 168,
            "{}",
            std::mem::size_of::<Busy>()
        );
    }

    #[test]
    fn a_record_lives_while_it_holds_a_state_or_something_under_way() {
        let mut t = Tracked::default();
        t.update(&key("a"), |b| b.oversized = true);
        assert_eq!((t.len(), t.busy), (1, 1));
        t.set_state(&key("a"), Some(SyncState::Synced));
        t.update(&key("a"), |b| b.oversized = false);
        assert_eq!(
            (t.len(), t.busy),
            (1, 0),
            "the state stays, the busy part goes"
        );
        assert!(t.busy(&key("a")).is_none());
        t.set_state(&key("a"), None);
        assert_eq!(t.len(), 0, "nothing left: no record");
        // Asking about nothing begins nothing.
        assert_eq!(t.update_existing(&key("b"), |b| b.oversized = true), None);
        assert_eq!(t.len(), 0);
        assert_eq!(t.set_state(&key("b"), None), Counts::default());
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn an_object_gone_takes_its_whole_record_and_its_count() {
        let mut t = Tracked::default();
        t.set_state(&key("a"), Some(SyncState::Conflict));
        t.update(&key("a"), |b| b.oversized = true);
        t.set_state(&key("b"), Some(SyncState::Conflict));
        t.gone(&key("a"));
        assert_eq!((t.len(), t.busy, t.counts().conflicts), (1, 0, 1));
        t.gone(&key("a"));
        t.gone(&key("c"));
        assert_eq!(
            (t.len(), t.counts().conflicts),
            (1, 1),
            "gone twice, or never there"
        );
    }

    #[test]
    fn a_busy_part_answers_for_its_own_object_only() {
        let mut t = Tracked::default();
        t.update(&key("a"), |b| b.written_over = Some("1".into()));
        // The same record id under another key, as a collision would be.
        let id = t.id(&key("a"));
        let other = t.records.remove(&id).unwrap();
        let id_b = t.id(&key("b"));
        t.records.insert(id_b, other);
        assert!(t.busy(&key("b")).is_none(), "a's busy part is not b's");
        assert_eq!(t.update_existing(&key("b"), |_| ()), None);
        // b's own part replaces it.
        t.update(&key("b"), |b| b.oversized = true);
        let b = t.busy(&key("b")).unwrap();
        assert_eq!((b.written_over.as_deref(), b.oversized), (None, true));
        assert_eq!(t.busy, 1);
    }

    #[test]
    fn updating_everything_drops_what_it_leaves_idle_and_skips_a_world_at_rest() {
        let mut t = Tracked::default();
        for name in ["a", "b", "c"] {
            t.update(&key(name), |b| b.oversized = true);
        }
        t.set_state(&key("c"), Some(SyncState::Paused));
        let mut visited = 0;
        t.update_all(|b| {
            visited += 1;
            b.oversized = b.name().parts().1 == "a";
        });
        assert_eq!(visited, 3);
        assert_eq!((t.len(), t.busy), (2, 1), "a busy, c with its state");
        assert_eq!(t.busy_parts().count(), 1);
        t.update_all(|b| b.oversized = false);
        let mut visited = 0;
        t.update_all(|_| visited += 1);
        assert_eq!(visited, 0, "nothing under way: no record visited");
        assert_eq!(t.counts().paused, 1);
    }

    #[test]
    fn counts_follow_every_transition() {
        use SyncState::*;
        let mut states = Tracked::default();
        type Step<'a> = (
            Option<&'a str>,
            &'a str,
            Option<SyncState>,
            (usize, usize, usize),
        );
        let steps: [Step<'_>; 11] = [
            (Some("a"), "w", Some(Synced), (1, 0, 0)),
            (Some("a"), "w", Some(Synced), (1, 0, 0)),
            (Some("b"), "w", Some(Conflict), (1, 1, 0)),
            (None, "w", Some(Synced), (2, 1, 0)),
            (Some("a"), "w", Some(Conflict), (1, 2, 0)),
            (Some("b"), "w", Some(Synced), (2, 1, 0)),
            (Some("a"), "w", None, (2, 0, 0)),
            // Never recorded: nothing to take away.
            (Some("c"), "w", None, (2, 0, 0)),
            (None, "w", Some(Paused), (1, 0, 1)),
            (None, "w", Some(Synced), (2, 0, 0)),
            (None, "w", None, (1, 0, 0)),
        ];
        for (i, (namespace, name, state, (synced, conflicts, paused))) in
            steps.into_iter().enumerate()
        {
            states.set_state(&(namespace.map(str::to_owned), name.to_owned()), state);
            let want = Counts {
                synced,
                conflicts,
                paused,
            };
            assert_eq!(states.counts(), want, "step {i}");
        }
    }

    #[test]
    fn failures_back_off_are_logged_once_per_message_and_end_with_a_success() {
        let mut t = Tracked::default();
        let logged: Vec<bool> = ["a", "a", "b", "b", "a"]
            .iter()
            .map(|m| t.failed(&key("x"), m).log)
            .collect();
        assert_eq!(logged, [true, false, true, false, true]);
        assert!(t.failed(&key("x"), "a").after >= Duration::from_secs(32).mul_f64(0.8));
        assert!(!t.failure_is_new(&key("x"), "a"));
        assert!(t.failure_is_new(&key("x"), "b"));
        assert!(t.failure_is_new(&key("y"), "a"), "per object");
        t.succeeded(&key("x"));
        assert_eq!(t.len(), 0, "a success leaves nothing behind");
        assert!(t.failed(&key("x"), "a").log, "a new streak logs again");
        assert!(t.failed(&key("y"), "a").after <= Duration::from_secs(1));
    }

    #[test]
    fn namespace_and_name_are_kept_apart() {
        let t = Tracked::default();
        let id = |namespace: Option<&str>, name: &str| {
            t.id(&(namespace.map(str::to_owned), name.to_owned()))
        };
        assert_ne!(id(Some("a"), "bc"), id(Some("ab"), "c"));
        assert_ne!(id(None, "w"), id(Some(""), "w"));
        assert_eq!(id(Some("a"), "w"), id(Some("a"), "w"));
        // The busy part's compact name tells them apart too.
        let keys: Vec<Key> = [
            (Some("a"), "bc"),
            (Some("ab"), "c"),
            (None, "w"),
            (Some(""), "w"),
        ]
        .into_iter()
        .map(|(namespace, name)| (namespace.map(str::to_owned), name.to_owned()))
        .collect();
        for (i, key) in keys.iter().enumerate() {
            let name = Name::of(key);
            assert_eq!(&name.key(), key);
            for (j, other) in keys.iter().enumerate() {
                assert_eq!(name.is(other), i == j, "{key:?} {other:?}");
            }
        }
    }

    #[test]
    fn a_status_too_large_is_news_once() {
        let mut t = Tracked::default();
        assert!(t.status_too_large(&key("a"), true));
        assert!(!t.status_too_large(&key("a"), true));
        assert!(!t.status_too_large(&key("a"), false));
        assert_eq!(t.len(), 0);
        assert!(t.status_too_large(&key("a"), true), "news again");
    }

    #[test]
    fn room_left_by_a_burst_is_given_back() {
        let mut t = Tracked::default();
        for i in 0..1000 {
            t.update(&key(&format!("w{i}")), |b| b.oversized = true);
        }
        t.update_all(|b| b.oversized = b.name().parts().1 == "w0");
        assert!(t.capacity() >= 1000);
        t.shrink();
        assert!(t.capacity() < 100, "{}", t.capacity());
        assert!(t.busy(&key("w0")).is_some(), "entries kept");
    }
}
