//! Where each synced object stands, for `kbind_synced_objects`, `kbind_conflicts` and
//! `kbind_paused_objects`: the counts
//! follow each change in O(1) (a recount per sync would cost O(objects) and make a bulk sync
//! quadratic), and each object costs one 8-byte key — a hash of its namespace and name — instead
//! of two strings. Two objects with the same hash (odds about 1 in 10^10 at 100,000 objects) would
//! share one entry: a gauge off by one, nothing else.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

/// Where an object stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncState {
    /// Synced.
    Synced,
    /// Its provider object is not kbind's to write.
    Conflict,
    /// The user paused it.
    Paused,
}

/// Every object's state, and how many are in each.
#[derive(Debug, Default)]
pub struct States {
    by_object: HashMap<u64, SyncState>,
    counts: Counts,
}

/// How many objects are in each state.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Synced.
    pub synced: usize,
    /// In conflict.
    pub conflicts: usize,
    /// Paused.
    pub paused: usize,
}

impl States {
    /// Records where the object `namespace/name` stands (`None`: neither synced nor conflicting).
    pub fn set(&mut self, namespace: Option<&str>, name: &str, state: Option<SyncState>) {
        let key = key(namespace, name);
        let old = match state {
            Some(state) => self.by_object.insert(key, state),
            None => self.by_object.remove(&key),
        };
        self.count(old, false);
        self.count(state, true);
    }

    /// How many objects are in each state.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    fn count(&mut self, state: Option<SyncState>, add: bool) {
        let counter = match state {
            Some(SyncState::Synced) => &mut self.counts.synced,
            Some(SyncState::Conflict) => &mut self.counts.conflicts,
            Some(SyncState::Paused) => &mut self.counts.paused,
            None => return,
        };
        if add {
            *counter += 1;
        } else {
            *counter = counter.saturating_sub(1);
        }
    }
}

fn key(namespace: Option<&str>, name: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    (namespace, name).hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_every_transition() {
        use SyncState::*;
        let mut states = States::default();
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
            states.set(namespace, name, state);
            let want = Counts {
                synced,
                conflicts,
                paused,
            };
            assert_eq!(states.counts(), want, "step {i}");
        }
    }

    #[test]
    fn namespace_and_name_are_kept_apart() {
        assert_ne!(key(Some("a"), "bc"), key(Some("ab"), "c"));
        assert_ne!(key(None, "w"), key(Some(""), "w"));
        assert_eq!(key(Some("a"), "w"), key(Some("a"), "w"));
    }
}
