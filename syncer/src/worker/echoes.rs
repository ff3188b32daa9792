//! kbind's own consumer writes whose echo the cache has not shown yet. A sync that starts in that
//! instant (another change of the object was queued while the write was in flight) would decide
//! from the object as it was before the write, and make the same write again — a second consumer
//! write for one change. Such a sync waits instead: the echo is a watch event, and it syncs the
//! object again with what kbind wrote in the cache.
//!
//! An entry lives from the write's response to the next watch event of the object (or its
//! deletion, or a re-list), so only objects with writes in flight carry one (in their record,
//! [`super::tracked`]).

use std::time::{Duration, Instant};

use super::pending::Key;
use super::tracked::Tracked;

/// Objects kbind wrote, each with the resourceVersion the cache showed when it was written over:
/// a field of each object's record ([`Tracked`]).
impl Tracked {
    /// kbind wrote `key`, which the cache showed at `before`; the write made `after`. (A write
    /// that changed nothing keeps the version, and has no echo to wait for.)
    pub fn wrote(&mut self, key: &Key, before: Option<&str>, after: Option<&str>) {
        if let (Some(before), Some(after)) = (before, after)
            && before != after
        {
            self.update(key, |b| b.written_over = Some(before.into()));
        }
    }

    /// Whether the cache, showing `key` at `version`, is still behind kbind's own last write of
    /// it.
    pub fn behind(&self, key: &Key, version: Option<&str>) -> bool {
        self.busy(key)
            .and_then(|b| b.written_over.as_deref())
            .is_some_and(|before| version == Some(before))
    }

    /// A watch event showed `key` at `version`: any version but the one written over means the
    /// cache has moved on. (Usually it is the echo; a change someone else made in between also
    /// ends the wait — a sync then decides from it, and at worst writes once more.)
    pub fn showed(&mut self, key: &Key, version: Option<&str>) {
        self.update_existing(key, |b| {
            if b.written_over
                .as_deref()
                .is_some_and(|before| version != Some(before))
            {
                b.written_over = None;
            }
        });
    }

    /// A re-list replaced the consumer cache: nothing in it is behind any more.
    pub fn consumer_relisted(&mut self) {
        self.update_all(|b| b.written_over = None);
    }
}

/// How long a provider write's echo is waited for at most.
pub const LAPSE: Duration = Duration::from_secs(2);
/// Versions remembered per provider write in flight (a busy object's events beyond are not its
/// echo's business: the wait then lapses).
const PASSED: usize = 16;

/// kbind's own provider writes (spec up) whose echo the provider cache has not shown yet: the same
/// gap on the other side. A sync that starts in it — the echo of kbind's delivery record on the
/// consumer, or another change, queued it — would find the copy's old spec in the cache and apply
/// the same spec again: a second provider write for one change (seen under churn: about 1 in 150
/// changes). Such a sync waits instead; the echo is a watch event, and it syncs the object again.
///
/// The provider cache keeps no resourceVersion (it would cost every cached copy), so an entry
/// lives from just before the write ([`Tracked::writing`]) and collects the versions the watch
/// shows of the object on their way into the cache ([`Tracked::saw`]) and how many of them the
/// cache holds ([`Tracked::cached`]) — the echo may arrive before the write's answer does. The wait ends once the
/// cache holds the version the write made; a deletion or a re-list ends it too. A write that
/// changed nothing makes no event, so an entry also lapses after [`LAPSE`].
///
/// A field of each object's record ([`Tracked`]).
impl Tracked {
    /// kbind is about to write `key`'s provider copy.
    pub fn writing(&mut self, key: &Key) {
        self.update(key, |b| b.provider_echo = Some(Box::default()));
    }

    /// The provider write of `key` was answered at `answered` with `version` (`None`: it
    /// failed, or made no version to wait for).
    pub fn wrote_provider(&mut self, key: &Key, version: Option<&str>, answered: Instant) {
        self.update_existing(key, |b| {
            let Some(version) = version else {
                b.provider_echo = None;
                return;
            };
            // No echo awaited: a re-list replaced the cache meanwhile, and nothing is waited for.
            if let Some(echo) = &mut b.provider_echo {
                echo.made = Some((version.into(), answered));
                if echo.in_cache() {
                    b.provider_echo = None;
                }
            }
        });
    }

    /// How much longer a sync of `key` waits at `now` for the echo of its provider write to
    /// reach the cache (`None`: it need not). A lapsed wait ends here.
    pub fn provider_echo_wait(&mut self, key: &Key, now: Instant) -> Option<Duration> {
        let (_, answered) = self.busy(key)?.provider_echo.as_ref()?.made.as_ref()?;
        let left = LAPSE.checked_sub(now.saturating_duration_since(*answered));
        if left.is_none_or(|left| left.is_zero()) {
            self.update_existing(key, |b| b.provider_echo = None);
            return None;
        }
        left
    }

    /// A provider watch event showed `key` at `version`, on its way into the cache.
    pub fn saw(&mut self, key: &Key, version: Option<&str>) {
        let Some(version) = version else {
            return;
        };
        self.update_existing(key, |b| {
            if let Some(echo) = &mut b.provider_echo
                && echo.passed.len() < PASSED
            {
                echo.passed.push(version.into());
            }
        });
    }

    /// The provider cache holds the next watch event of `key` that [`Self::saw`] saw.
    pub fn cached(&mut self, key: &Key) {
        self.update_existing(key, |b| {
            if let Some(echo) = &mut b.provider_echo {
                echo.cached = (echo.cached + 1).min(echo.passed.len());
                if echo.in_cache() {
                    b.provider_echo = None;
                }
            }
        });
    }

    /// `key`'s copy is gone from the provider: no echo of it comes.
    pub fn provider_gone(&mut self, key: &Key) {
        self.update_existing(key, |b| b.provider_echo = None);
    }

    /// A re-list replaced the provider cache: nothing in it is behind any more.
    pub fn provider_relisted(&mut self) {
        self.update_all(|b| b.provider_echo = None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::record::test_key as key;

    #[test]
    fn a_provider_write_waits_until_its_echo_is_in_the_cache() {
        let t0 = Instant::now();
        let mut e = Tracked::default();
        e.writing(&key("a"));
        assert_eq!(
            e.provider_echo_wait(&key("a"), t0),
            None,
            "nothing to wait for before the answer"
        );
        // An older event passes into the cache while the write is in flight.
        e.saw(&key("a"), Some("10"));
        e.cached(&key("a"));
        e.wrote_provider(&key("a"), Some("11"), t0);
        assert_eq!(e.provider_echo_wait(&key("a"), t0), Some(LAPSE));
        assert_eq!(e.provider_echo_wait(&key("b"), t0), None, "another object");
        // The echo passes on its way into the cache: still waiting until the cache holds it.
        e.saw(&key("a"), Some("11"));
        assert!(e.provider_echo_wait(&key("a"), t0).is_some());
        e.cached(&key("a"));
        assert_eq!(e.provider_echo_wait(&key("a"), t0), None);
        assert_eq!(e.len(), 0);
    }

    #[test]
    fn an_echo_that_arrives_before_the_answer_ends_the_wait_at_the_answer() {
        let t0 = Instant::now();
        let mut e = Tracked::default();
        // Seen and cached before the answer: nothing to wait for after it.
        e.writing(&key("a"));
        e.saw(&key("a"), Some("11"));
        e.cached(&key("a"));
        e.wrote_provider(&key("a"), Some("11"), t0);
        assert_eq!(e.provider_echo_wait(&key("a"), t0), None);
        assert_eq!(e.len(), 0);
        // Seen but not cached yet at the answer: waits for the cache.
        e.writing(&key("b"));
        e.saw(&key("b"), Some("21"));
        e.wrote_provider(&key("b"), Some("21"), t0);
        assert!(e.provider_echo_wait(&key("b"), t0).is_some());
        e.cached(&key("b"));
        assert_eq!(e.provider_echo_wait(&key("b"), t0), None);
    }

    #[test]
    fn a_provider_write_without_an_echo_lapses_and_failure_deletion_or_re_list_end_the_wait() {
        let t0 = Instant::now();
        let mut e = Tracked::default();
        e.writing(&key("unchanged"));
        e.wrote_provider(&key("unchanged"), Some("5"), t0);
        let half = t0 + LAPSE / 2;
        assert_eq!(
            e.provider_echo_wait(&key("unchanged"), half),
            Some(LAPSE / 2)
        );
        assert_eq!(e.provider_echo_wait(&key("unchanged"), t0 + LAPSE), None);
        assert_eq!(e.len(), 0, "a lapsed entry ends");
        e.writing(&key("failed"));
        e.wrote_provider(&key("failed"), None, t0);
        assert_eq!(e.len(), 0, "a failed write waits for nothing");
        e.wrote_provider(&key("relisted"), Some("9"), t0);
        assert_eq!(e.len(), 0, "an answer after a re-list waits for nothing");
        for k in ["a", "b"] {
            e.writing(&key(k));
            e.wrote_provider(&key(k), Some("1"), t0);
        }
        e.provider_gone(&key("a"));
        assert_eq!(e.provider_echo_wait(&key("a"), t0), None);
        assert!(e.provider_echo_wait(&key("b"), t0).is_some());
        e.provider_relisted();
        assert_eq!(e.provider_echo_wait(&key("b"), t0), None);
    }

    #[test]
    fn a_busy_object_remembers_a_bounded_number_of_versions() {
        let t0 = Instant::now();
        let mut e = Tracked::default();
        e.writing(&key("busy"));
        for v in 0..100 {
            e.saw(&key("busy"), Some(&v.to_string()));
        }
        assert_eq!(
            e.busy(&key("busy"))
                .unwrap()
                .provider_echo
                .as_ref()
                .unwrap()
                .passed
                .len(),
            PASSED
        );
        e.wrote_provider(&key("busy"), Some("99"), t0);
        assert!(
            e.provider_echo_wait(&key("busy"), t0).is_some(),
            "waits, until the lapse at most"
        );
    }

    #[test]
    fn the_cache_is_behind_from_the_write_until_an_event_shows_another_version() {
        let mut e = Tracked::default();
        e.wrote(&key("a"), Some("10"), Some("11"));
        assert!(e.behind(&key("a"), Some("10")), "the cache still shows 10");
        assert!(!e.behind(&key("a"), Some("11")), "the echo is in the cache");
        assert!(!e.behind(&key("b"), Some("10")), "another object");
        e.showed(&key("a"), Some("10"));
        assert!(
            e.behind(&key("a"), Some("10")),
            "an event of the old version"
        );
        e.showed(&key("a"), Some("11"));
        assert!(!e.behind(&key("a"), Some("10")));
        assert_eq!(e.len(), 0, "the echo ends the entry");
    }

    #[test]
    fn a_write_that_changed_nothing_or_has_no_versions_waits_for_nothing() {
        let mut e = Tracked::default();
        e.wrote(&key("same"), Some("10"), Some("10"));
        e.wrote(&key("unknown"), None, Some("11"));
        e.wrote(&key("no-answer"), Some("10"), None);
        assert_eq!(e.len(), 0);
        assert!(!e.behind(&key("same"), Some("10")));
        assert!(!e.behind(&key("unknown"), None));
    }

    #[test]
    fn a_deletion_or_a_re_list_ends_the_wait() {
        let mut e = Tracked::default();
        e.wrote(&key("a"), Some("1"), Some("2"));
        e.wrote(&key("b"), Some("3"), Some("4"));
        e.gone(&key("a"));
        assert!(!e.behind(&key("a"), Some("1")));
        assert!(e.behind(&key("b"), Some("3")));
        e.consumer_relisted();
        assert!(!e.behind(&key("b"), Some("3")));
        assert_eq!(e.len(), 0);
    }

    #[test]
    fn a_second_write_over_the_same_stale_version_keeps_waiting_for_its_echo() {
        // Two writes in one sync (the conflict mark, then the status) both start from the cached
        // object; the first one's echo moves the cache on.
        let mut e = Tracked::default();
        e.wrote(&key("a"), Some("5"), Some("6"));
        e.wrote(&key("a"), Some("5"), Some("7"));
        assert!(e.behind(&key("a"), Some("5")));
        e.showed(&key("a"), Some("6"));
        assert!(!e.behind(&key("a"), Some("5")));
    }
}
