//! Provider objects under a consumer object's name that the provider cache does not show (#50.5).
//!
//! The provider watch selects this consumer cluster's copies by their label
//! (`core.kbind.io/consumer-cluster-uid=<this cluster's UID>`), so another consumer's objects are
//! never listed, watched or held. What else can stand under a consumer object's name — an object
//! without kbind's markers, another consumer's copy, or a copy of ours written before copies carried
//! the label — is met when a create-only spec-up is answered `409` (`kbind_shared::apply`): the
//! sync then reads that one object, keeps only the facts it decides ownership by (no spec, no
//! status), and decides from them like from a cached copy. Nothing tells kbind when such an object
//! changes or goes, so a sync deciding from one reads it again once its entry is stale: one `GET`
//! after 1 s, then after twice the wait each time the object reads the same, at most every 5
//! minutes (a conflict resolves within that wait of the foreign object going). A copy of ours that
//! only lacked the label gets it with its next spec-up and the watch shows it from then on.
//!
//! Pure: the map and its waits; the reads are the sync's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kbind_shared::cache::ProviderCopy;

use super::pending::Key;
use super::record::Stranger;
use super::tracked::Tracked;

/// The wait before an object read the first time is read again.
pub const FIRST_WAIT: Duration = Duration::from_secs(1);
/// The longest wait between two reads of an object that keeps reading the same.
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// What is known of the object under a consumer object's name besides the cache.
#[derive(Debug, Clone, PartialEq)]
pub enum Known {
    /// Nothing: no stranger was met there (or it went).
    Nothing,
    /// Read within its wait: decide from it.
    Fresh(Arc<ProviderCopy>),
    /// Read longer ago than its wait, or expected and not read yet: read it before deciding.
    Stale,
}

impl Tracked {
    /// What is known under `key` at `now`.
    pub fn known_stranger(&self, key: &Key, now: Instant) -> Known {
        match self.busy(key).and_then(|b| b.stranger.as_deref()) {
            None => Known::Nothing,
            Some(Stranger {
                copy: Some(copy),
                read_at,
                wait,
            }) if now.saturating_duration_since(*read_at) < *wait => Known::Fresh(copy.clone()),
            Some(_) => Known::Stale,
        }
    }

    /// The object last read under `key`, however long ago.
    pub fn last_stranger(&self, key: &Key) -> Option<Arc<ProviderCopy>> {
        self.busy(key)?.stranger.as_ref()?.copy.clone()
    }

    /// Something is expected under `key` that the cache does not show (a consumer object that
    /// holds kbind's finalizer or records an ownership conflict, at a (re-)list): the next sync
    /// reads it before deciding, instead of trying a create that would be refused — a copy of
    /// ours written before copies carried the label costs one read and one write, not a refused
    /// write too.
    pub fn expect_stranger(&mut self, key: &Key, now: Instant) {
        self.update(key, |b| {
            b.stranger.get_or_insert_with(|| {
                Box::new(Stranger {
                    copy: None,
                    read_at: now,
                    wait: Duration::ZERO,
                })
            });
        });
    }

    /// The object under `key` was read at `now`: `copy` (its ownership facts), or nothing there.
    /// The same facts again double the wait before the next read; changed facts start it over.
    pub fn stranger_read(&mut self, key: &Key, copy: Option<ProviderCopy>, now: Instant) -> Known {
        let Some(copy) = copy.map(facts_only) else {
            self.forget_stranger(key);
            return Known::Nothing;
        };
        let copy = Arc::new(copy);
        self.update(key, |b| {
            let wait = match b.stranger.as_deref() {
                Some(Stranger {
                    copy: Some(last),
                    wait,
                    ..
                }) if *last == copy => (*wait * 2).clamp(FIRST_WAIT, MAX_WAIT),
                _ => FIRST_WAIT,
            };
            b.stranger = Some(Box::new(Stranger {
                copy: Some(copy.clone()),
                read_at: now,
                wait,
            }));
        });
        Known::Fresh(copy)
    }

    /// The cache shows the object now (ours and labelled), or the consumer object went: nothing
    /// under `key` is a stranger any more.
    pub fn forget_stranger(&mut self, key: &Key) {
        self.update_existing(key, |b| b.stranger = None);
    }

    /// When a sync that decided from the stranger under `key` looks again: when its wait ends.
    pub fn stranger_recheck_in(&self, key: &Key, now: Instant) -> Option<Duration> {
        let stranger = self.busy(key)?.stranger.as_ref()?;
        Some((stranger.read_at + stranger.wait).saturating_duration_since(now))
    }
}

/// The facts ownership is decided by, and nothing of another's data: no spec, no status.
fn facts_only(copy: ProviderCopy) -> ProviderCopy {
    ProviderCopy {
        spec: None,
        status: None,
        oversized_status: None,
        applied_at: None,
        status_at: None,
        ..copy
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kbind_shared::cache::{ClusterMarker, Uid};

    fn copy(cluster_marker: ClusterMarker, terminating: bool) -> ProviderCopy {
        ProviderCopy {
            name: "w".into(),
            namespace: Some("team-a".into()),
            cluster_marker,
            object_marker: Uid::Absent,
            managed: false,
            labelled: false,
            terminating,
            spec: Some(kbind_shared::cache::Json::new(
                &serde_json::json!({ "secret": "x" }),
            )),
            status: Some(kbind_shared::cache::Json::new(
                &serde_json::json!({ "phase": "Ready" }),
            )),
            oversized_status: None,
            applied_at: None,
            status_at: None,
        }
    }

    fn key() -> Key {
        (Some("team-a".into()), "w".into())
    }

    #[test]
    fn a_stranger_is_read_again_after_a_wait_that_doubles_while_it_reads_the_same() {
        let mut strangers = Tracked::default();
        let t0 = Instant::now();
        assert_eq!(strangers.known_stranger(&key(), t0), Known::Nothing);
        assert_eq!(strangers.stranger_recheck_in(&key(), t0), None);
        let foreign = copy(ClusterMarker::Absent, false);
        let mut now = t0;
        let mut waits = Vec::new();
        for _ in 0..12 {
            assert!(matches!(
                strangers.stranger_read(&key(), Some(foreign.clone()), now),
                Known::Fresh(_)
            ));
            let wait = strangers.stranger_recheck_in(&key(), now).unwrap();
            waits.push(wait.as_secs());
            assert!(matches!(
                strangers.known_stranger(&key(), now + wait - Duration::from_millis(1)),
                Known::Fresh(_)
            ));
            assert_eq!(strangers.known_stranger(&key(), now + wait), Known::Stale);
            now += wait;
        }
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        // Changed facts (it began terminating) start the wait over.
        strangers.stranger_read(&key(), Some(copy(ClusterMarker::Absent, true)), now);
        assert_eq!(strangers.stranger_recheck_in(&key(), now), Some(FIRST_WAIT));
        // Gone: nothing is known, nothing is read again.
        assert_eq!(strangers.stranger_read(&key(), None, now), Known::Nothing);
        assert_eq!(strangers.known_stranger(&key(), now), Known::Nothing);
        assert_eq!(strangers.len(), 0, "nothing left of it");
    }

    #[test]
    fn only_the_facts_ownership_is_decided_by_are_kept() {
        let mut strangers = Tracked::default();
        let now = Instant::now();
        let at = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::from_second(1_800_000_000).expect("valid"),
        );
        let another = ProviderCopy {
            oversized_status: Some(300_000),
            status_at: kbind_shared::delivery::Seconds::of(&at),
            applied_at: Some(at),
            ..copy(ClusterMarker::Other, false)
        };
        assert!(another.status_at.is_some());
        let Known::Fresh(kept) = strangers.stranger_read(&key(), Some(another), now) else {
            panic!("read");
        };
        assert_eq!(kept.spec, None);
        assert_eq!(kept.status, None);
        // Nor anything about its status or its writes: another's, not ours to know.
        assert_eq!(kept.oversized_status, None);
        assert_eq!(kept.applied_at, None);
        assert_eq!(kept.status_at, None);
        assert_eq!(kept.cluster_marker, ClusterMarker::Other);
        assert_eq!(strangers.last_stranger(&key()), Some(kept));
        strangers.forget_stranger(&key());
        assert_eq!(strangers.known_stranger(&key(), now), Known::Nothing);
        assert_eq!(strangers.last_stranger(&key()), None);
    }

    #[test]
    fn an_expected_copy_is_read_before_the_first_decision_and_never_replaces_what_was_read() {
        let mut strangers = Tracked::default();
        let now = Instant::now();
        strangers.expect_stranger(&key(), now);
        assert_eq!(strangers.known_stranger(&key(), now), Known::Stale);
        assert_eq!(strangers.last_stranger(&key()), None);
        assert_eq!(
            strangers.stranger_recheck_in(&key(), now),
            Some(Duration::ZERO)
        );
        strangers.stranger_read(&key(), Some(copy(ClusterMarker::Absent, false)), now);
        assert_eq!(strangers.stranger_recheck_in(&key(), now), Some(FIRST_WAIT));
        // Expected again at the next re-list: what was read, and its wait, stay.
        strangers.expect_stranger(&key(), now);
        assert!(matches!(
            strangers.known_stranger(&key(), now),
            Known::Fresh(_)
        ));
        assert_eq!(strangers.stranger_recheck_in(&key(), now), Some(FIRST_WAIT));
    }
}
