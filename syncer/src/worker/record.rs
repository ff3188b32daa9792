//! What one object's record holds (`tracked`): the data only — the rules that change it live
//! with their concerns (`pending`, `echoes`, `strangers`) and in `tracked` itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kbind_shared::cache::ProviderCopy;

/// `(namespace, name)` of a consumer object: the key of its record.
pub type Key = (Option<String>, String);

/// The backlog key of an object.
pub(super) fn key<K: kube::Resource>(object: &K) -> Key {
    use kube::ResourceExt;
    (object.namespace(), object.name_any())
}

/// The key of the object `name` in namespace `ns`, for the record's unit tests.
#[cfg(test)]
pub(super) fn test_key(name: &str) -> Key {
    (Some("ns".to_owned()), name.to_owned())
}

/// A [`Key`] in one allocation, as a record's busy part keeps it: `N<namespace>\0<name>` or
/// `C<name>` (a namespace or a name never holds a NUL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Name(Box<str>);

impl Name {
    /// `key`, compact.
    pub fn of(key: &Key) -> Self {
        Name(
            match &key.0 {
                Some(namespace) => format!("N{namespace}\0{}", key.1),
                None => format!("C{}", key.1),
            }
            .into_boxed_str(),
        )
    }

    /// Whether this is `key`.
    pub fn is(&self, key: &Key) -> bool {
        self.parts() == (key.0.as_deref(), key.1.as_str())
    }

    /// The namespace and name.
    pub fn parts(&self) -> (Option<&str>, &str) {
        match self
            .0
            .strip_prefix('N')
            .and_then(|rest| rest.split_once('\0'))
        {
            Some((namespace, name)) => (Some(namespace), name),
            None => (None, self.0.get(1..).unwrap_or_default()),
        }
    }

    /// The key.
    pub fn key(&self) -> Key {
        let (namespace, name) = self.parts();
        (namespace.map(str::to_owned), name.to_owned())
    }
}

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

    pub(super) fn merge(&mut self, other: Seen) {
        let earliest = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.consumer = earliest(self.consumer, other.consumer);
        self.provider = earliest(self.provider, other.provider);
        self.provider_latest = self.provider_latest.max(other.provider_latest);
    }
}

/// A spec write whose status change has not been seen yet.
#[derive(Debug, Clone, Copy)]
pub(super) struct Applied {
    pub(super) at: Instant,
    /// The delivery record stopped waiting and was written on its own; the status change is
    /// still watched for, as a measure of how long the provider takes.
    pub(super) alone: bool,
}

/// kbind's provider write whose echo the provider cache does not show yet (`echoes`).
#[derive(Debug, Default)]
pub(super) struct ProviderEcho {
    /// The version the write made, once answered, and when.
    pub(super) made: Option<(Box<str>, Instant)>,
    /// Versions the watch showed since the write started, oldest first (a few at most).
    pub(super) passed: Vec<Box<str>>,
    /// How many of `passed` the cache holds.
    pub(super) cached: usize,
}

impl ProviderEcho {
    /// Whether the cache holds the version the write made.
    pub(super) fn in_cache(&self) -> bool {
        self.made
            .as_ref()
            .is_some_and(|(made, _)| self.passed[..self.cached].contains(made))
    }
}

/// The provider object read under a consumer object's name because a create-only spec-up found
/// it (or expected there): a field of that object's record (`Tracked`).
#[derive(Debug)]
pub(super) struct Stranger {
    /// What was read (`None`: nothing read yet — a copy is expected, `Tracked::expect_stranger`).
    pub(super) copy: Option<Arc<ProviderCopy>>,
    pub(super) read_at: Instant,
    pub(super) wait: Duration,
}

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

impl Counts {
    /// An object moved from `old` to `new`.
    pub fn moved(&mut self, old: Option<SyncState>, new: Option<SyncState>) {
        self.count(old, false);
        self.count(new, true);
    }

    fn count(&mut self, state: Option<SyncState>, add: bool) {
        let counter = match state {
            Some(SyncState::Synced) => &mut self.synced,
            Some(SyncState::Conflict) => &mut self.conflicts,
            Some(SyncState::Paused) => &mut self.paused,
            None => return,
        };
        if add {
            *counter += 1;
        } else {
            *counter = counter.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[test]
    fn an_objects_key_is_its_namespace_and_name() {
        let mut object = ConfigMap::default();
        object.metadata.name = Some("w".into());
        assert_eq!(key(&object), (None, "w".to_owned()), "cluster-scoped");
        object.metadata.namespace = Some("team-a".into());
        assert_eq!(key(&object), (Some("team-a".to_owned()), "w".to_owned()));
    }
}
