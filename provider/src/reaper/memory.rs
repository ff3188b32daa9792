//! The reaper's own record of what it observed of each heartbeat Lease: the version it last saw,
//! the server time of the sweep at which it saw it change (or first saw it), and when it first
//! saw it stale. Liveness is what the reaper saw, not what a Lease claims: any change to a Lease
//! between two sweeps counts as a renewal (a co-tenant who writes a Lease can keep a consumer
//! looking alive, never make it look dead), and the grace before any action counts from the
//! sweep that first saw the heartbeat stale.
//!
//! What must survive a restart or a change of leader — the stale heartbeats' records, and the
//! Leases seen that are gone — is kept in the reaper's own ConfigMap ([`Memory::persisted`],
//! [`Memory::restore`]), in its namespace, which only the reaper's ServiceAccount (and the
//! provider's admins) may write. A live heartbeat's record is not kept: after a restart it is
//! seen afresh, which can only lengthen a grace. Pure; table-tested.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// At most this many Leases are remembered (per policy); one beyond them is seen afresh at
/// every sweep, so it never goes stale (never acted on, and the sweep says so).
pub const MAX_REMEMBERED: usize = 20_000;

/// What the reaper saw of one Lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    /// The Lease's `resourceVersion` when last seen; empty once it is gone.
    #[serde(rename = "v")]
    pub version: String,
    /// The server time of the sweep that saw it change, or first saw it.
    #[serde(rename = "r")]
    pub renewed: i64,
    /// The server time of the sweep that first saw it stale, since that change.
    #[serde(rename = "s", default, skip_serializing_if = "Option::is_none")]
    pub stale_since: Option<i64>,
}

/// What a sweep makes of a Lease it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// The server time of the sweep that last saw it change, or first saw it.
    pub renewed: i64,
    /// The server time of the sweep that first saw it stale since then.
    pub stale_since: Option<i64>,
}

/// The record, keyed by the Lease's `<namespace>/<name>`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Memory {
    leases: BTreeMap<String, Seen>,
}

impl Memory {
    /// The Lease `key` read at `version` by the sweep at server time `now`: a Lease not seen
    /// before, or seen at another version (written since — by anyone), counts as renewed now and
    /// its stale record is dropped. `None` when the record is full and the Lease is new to it.
    pub fn observe(&mut self, key: &str, version: &str, now: i64) -> Option<Observation> {
        if let Some(seen) = self.leases.get_mut(key) {
            if seen.version != version {
                *seen = Seen {
                    version: version.to_owned(),
                    renewed: now,
                    stale_since: None,
                };
            }
            return Some(Observation {
                renewed: seen.renewed,
                stale_since: seen.stale_since,
            });
        }
        if self.leases.len() >= MAX_REMEMBERED {
            return None;
        }
        self.leases.insert(
            key.to_owned(),
            Seen {
                version: version.to_owned(),
                renewed: now,
                stale_since: None,
            },
        );
        Some(Observation {
            renewed: now,
            stale_since: None,
        })
    }

    /// Records when the decision says the heartbeat was first seen stale (`None`: it is not).
    pub fn judged(&mut self, key: &str, stale_since: Option<i64>) {
        if let Some(seen) = self.leases.get_mut(key) {
            seen.stale_since = stale_since;
        }
    }

    /// Leases of `namespace` that a complete read did not find: gone (their copies are then
    /// Stale and never acted on, rather than never having had a heartbeat).
    pub fn gone_unless(&mut self, namespace: &str, present: &dyn Fn(&str) -> bool) {
        let prefix = format!("{namespace}/");
        for (key, seen) in self.leases.iter_mut() {
            if key.starts_with(&prefix) && !present(key) {
                seen.version.clear();
                seen.stale_since = None;
            }
        }
    }

    /// Whether the Lease `key` was ever seen (and is gone, if it is not read now).
    pub fn was_seen(&self, key: &str) -> bool {
        self.leases.contains_key(key)
    }

    /// The part that must survive a restart, as compact JSON: the stale heartbeats' records and
    /// the Leases seen that are gone.
    pub fn persisted(&self) -> String {
        let kept: BTreeMap<&String, &Seen> = self
            .leases
            .iter()
            .filter(|(_, seen)| seen.stale_since.is_some() || seen.version.is_empty())
            .collect();
        serde_json::to_string(&kept).unwrap_or_else(|_| "{}".to_owned())
    }

    /// The record a previous leader persisted; what cannot be read is said, and the reaper then
    /// starts with nothing remembered (every grace starts afresh: longer, never shorter).
    pub fn restore(text: &str) -> Result<Memory, String> {
        let leases: BTreeMap<String, Seen> = serde_json::from_str(text)
            .map_err(|e| format!("the reaper's record cannot be read: {e}"))?;
        Ok(Memory {
            leases: leases.into_iter().take(MAX_REMEMBERED).collect(),
        })
    }

    /// How many Leases are remembered.
    pub fn len(&self) -> usize {
        self.leases.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observed(renewed: i64, stale_since: Option<i64>) -> Option<Observation> {
        Some(Observation {
            renewed,
            stale_since,
        })
    }

    #[test]
    fn a_lease_is_renewed_when_the_reaper_sees_it_change_and_only_then() {
        let mut memory = Memory::default();
        // First seen: renewed at this sweep, whatever the Lease says of itself.
        assert_eq!(memory.observe("kbind/a", "10", 100), observed(100, None));
        // The same version later: no renewal seen.
        assert_eq!(memory.observe("kbind/a", "10", 130), observed(100, None));
        memory.judged("kbind/a", Some(140));
        assert_eq!(
            memory.observe("kbind/a", "10", 150),
            observed(100, Some(140))
        );
        // Any write since (the consumer's renewal, or anyone else's — a cleared managedFields
        // included): renewed at this sweep, the stale record dropped.
        assert_eq!(memory.observe("kbind/a", "11", 160), observed(160, None));
        // Gone, then back: a renewal when seen again.
        memory.gone_unless("kbind", &|_| false);
        assert!(memory.was_seen("kbind/a"));
        assert!(!memory.was_seen("kbind/never"));
        assert_eq!(memory.observe("kbind/a", "12", 200), observed(200, None));
        // Other namespaces are not touched by a read of one.
        memory.observe("team/b", "1", 200);
        memory.gone_unless("kbind", &|_| true);
        assert_eq!(memory.observe("team/b", "1", 210), observed(200, None));
    }

    #[test]
    fn the_stale_records_and_gone_leases_survive_a_restart_and_live_ones_are_seen_afresh() {
        let mut memory = Memory::default();
        memory.observe("kbind/live", "1", 100);
        memory.observe("kbind/stale", "7", 100);
        memory.judged("kbind/stale", Some(130));
        memory.observe("kbind/gone", "3", 100);
        memory.gone_unless("kbind", &|key| key != "kbind/gone");
        let text = memory.persisted();
        assert_eq!(
            text,
            r#"{"kbind/gone":{"v":"","r":100},"kbind/stale":{"v":"7","r":100,"s":130}}"#
        );
        let mut restored = Memory::restore(&text).unwrap();
        // The stale heartbeat's grace goes on from its record, not from the restart.
        assert_eq!(
            restored.observe("kbind/stale", "7", 500),
            observed(100, Some(130))
        );
        // A live one is first seen again: later, never earlier.
        assert_eq!(
            restored.observe("kbind/live", "1", 500),
            observed(500, None)
        );
        assert!(restored.was_seen("kbind/gone"));
        assert!(Memory::restore("not json").is_err());
    }

    #[test]
    fn the_record_is_bounded() {
        let mut memory = Memory::default();
        assert!(memory.is_empty());
        for i in 0..MAX_REMEMBERED {
            memory.observe(&format!("kbind/l{i}"), "1", 100);
        }
        assert_eq!(memory.observe("kbind/one-too-many", "1", 100), None);
        assert_eq!(memory.len(), MAX_REMEMBERED);
        assert!(!memory.is_empty());
        assert!(memory.observe("kbind/l0", "2", 120).is_some());
    }
}
