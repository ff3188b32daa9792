//! Sharding sync work across syncer replicas: work units, rendezvous hashing, and the
//! drain-then-reassign step that never gives one unit two active owners. Pure functions; the
//! schema manager writes the result into a versioned ConfigMap that syncers watch.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The ConfigMap (in kbind's namespace) holding the assignment.
pub const ASSIGNMENT_CONFIGMAP: &str = "kbind-syncer-assignment";
/// Its data key.
pub const ASSIGNMENT_KEY: &str = "assignment.json";
/// The assignment format this build reads and writes. A syncer refuses a newer one.
pub const ASSIGNMENT_FORMAT: u32 = 1;
/// Annotation on a syncer's membership Lease: the units it is running right now, its
/// acknowledgement that drained units are no longer running. A JSON list of unit names while
/// that is small; beyond [`RUNNING_PLAIN_LIMIT`], `k:` and each unit's [`running_key`] (8
/// characters a unit), so that even tens of thousands of units stay within the API server's
/// 256 KiB for all of a Lease's annotations.
pub const RUNNING_UNITS_ANNOTATION: &str = "core.kbind.io/running-units";
/// The largest running-units annotation written as a plain JSON list.
pub const RUNNING_PLAIN_LIMIT: usize = 32 * 1024;

/// The most bytes the assignment may take in its ConfigMap (the API server allows 1 MiB for all
/// of a ConfigMap's data; the rest is headroom).
pub const MAX_ASSIGNMENT_BYTES: usize = 900 * 1024;

/// The units (in order) that an assignment to `members` can hold within
/// [`MAX_ASSIGNMENT_BYTES`] — each counted at its worst encoding (as a drain) — and how many are
/// left out. A flood of units (say, Bindings a namespace user creates) then leaves some
/// unassigned and reported, instead of an assignment the API server refuses, which would freeze
/// every unit.
pub fn fit(units: &BTreeSet<String>, members: &BTreeSet<String>) -> (BTreeSet<String>, usize) {
    let longest = members.iter().map(String::len).max().unwrap_or(64);
    let mut budget = MAX_ASSIGNMENT_BYTES.saturating_sub(256 + members.len() * (longest + 32));
    let mut kept = BTreeSet::new();
    let mut left_out = 0;
    for unit in units {
        // `"<unit>":{"from":"<member>","incarnation":<u64>,"since":<u64>},`
        let cost = unit.len() + longest + 80;
        match budget.checked_sub(cost) {
            Some(left) if left_out == 0 => {
                budget = left;
                kept.insert(unit.clone());
            }
            _ => left_out += 1,
        }
    }
    (kept, left_out)
}

/// A unit's short key: 6 bytes of its SHA-256, base64url (8 characters). What the leader compares
/// running units by.
pub fn running_key(unit: &str) -> String {
    use base64::Engine;
    let digest = Sha256::digest(unit.as_bytes());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&digest[..6])
}

/// The running-units annotation for `units` (see [`RUNNING_UNITS_ANNOTATION`]).
pub fn encode_running(units: &BTreeSet<String>) -> String {
    let plain = serde_json::Value::from(
        units
            .iter()
            .map(|u| serde_json::Value::from(u.as_str()))
            .collect::<Vec<_>>(),
    )
    .to_string();
    if plain.len() <= RUNNING_PLAIN_LIMIT {
        return plain;
    }
    let mut out = String::with_capacity(2 + units.len() * 8);
    out.push_str("k:");
    for unit in units {
        out.push_str(&running_key(unit));
    }
    out
}

/// The [`running_key`]s of a running-units annotation, either form; anything unreadable is
/// nothing.
pub fn decode_running(text: &str) -> BTreeSet<String> {
    if let Some(keys) = text.strip_prefix("k:") {
        if keys.len() % 8 != 0 || !keys.is_ascii() {
            return BTreeSet::new();
        }
        return keys
            .as_bytes()
            .chunks(8)
            .filter_map(|c| std::str::from_utf8(c).ok().map(str::to_owned))
            .collect();
    }
    serde_json::from_str::<BTreeSet<String>>(text)
        .unwrap_or_default()
        .iter()
        .map(|u| running_key(u))
        .collect()
}
/// Prefix of each syncer's membership Lease name.
pub const MEMBER_LEASE_PREFIX: &str = "kbind-syncer-";

/// Annotation on a syncer's membership Lease: its incarnation, a number that changes whenever it
/// (re)joins — at start and after a lapse (a pause longer than its fence). Units assigned to an
/// earlier incarnation are not its own.
pub const INCARNATION_ANNOTATION: &str = "core.kbind.io/incarnation";
/// Annotation on a syncer's membership Lease: the generation of the newest assignment it has
/// applied — nothing it runs lies outside that assignment. A drained unit moves only once its old
/// owner has applied the generation that drained it.
pub const OBSERVED_ASSIGNMENT_ANNOTATION: &str = "core.kbind.io/observed-assignment";

/// Which member owns which unit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// Format version, [`ASSIGNMENT_FORMAT`].
    pub format: u32,
    /// Increases with every change.
    #[serde(default)]
    pub generation: u64,
    /// Unit → member identity. A unit absent here is unowned (being drained or waiting).
    pub units: BTreeMap<String, String>,
    /// The incarnation of each member that owns units: a member runs its units only while it is
    /// that incarnation.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub members: BTreeMap<String, u64>,
    /// Units taken from a live owner and not yet given to anyone.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub draining: BTreeMap<String, Drain>,
}

/// A unit being taken from a live owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drain {
    /// The owner it is taken from.
    pub from: String,
    /// That owner's incarnation.
    pub incarnation: u64,
    /// The assignment generation that took it.
    pub since: u64,
}

/// What the leader knows of a live member, from its Lease.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Member {
    /// [`INCARNATION_ANNOTATION`].
    pub incarnation: u64,
    /// [`OBSERVED_ASSIGNMENT_ANNOTATION`].
    pub observed: u64,
    /// The [`running_key`]s of [`RUNNING_UNITS_ANNOTATION`].
    pub running: BTreeSet<String>,
}

/// Why an assignment cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AssignmentError {
    /// Written by a newer kbind.
    #[error(
        "the assignment has format {0}, but this kbind-syncer reads format {ASSIGNMENT_FORMAT} at most: upgrade the syncers"
    )]
    TooNew(u32),
    /// Not valid JSON of the expected shape.
    #[error("the assignment is malformed: {0}")]
    Malformed(String),
}

impl Assignment {
    /// Parses the ConfigMap data.
    pub fn decode(text: &str) -> Result<Self, AssignmentError> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| AssignmentError::Malformed(e.to_string()))?;
        let format = value
            .get("format")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or_default() as u32;
        if format > ASSIGNMENT_FORMAT {
            return Err(AssignmentError::TooNew(format));
        }
        serde_json::from_value(value).map_err(|e| AssignmentError::Malformed(e.to_string()))
    }

    /// The ConfigMap data.
    #[allow(
        clippy::expect_used,
        reason = "string-keyed maps of strings always serialize to JSON"
    )]
    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("an assignment serializes")
    }

    /// The units assigned to `member` as `incarnation` (none for any other incarnation).
    pub fn units_of(&self, member: &str, incarnation: u64) -> BTreeSet<String> {
        if self.members.get(member) != Some(&incarnation) {
            return BTreeSet::new();
        }
        self.units
            .iter()
            .filter(|(_, m)| *m == member)
            .map(|(u, _)| u.clone())
            .collect()
    }
}

/// A work unit: one API of one Connection.
pub fn unit(connection: &str, api: &str) -> String {
    Unit::Api {
        connection: connection.to_owned(),
        api: api.to_owned(),
        bucket: None,
    }
    .to_string()
}

/// One piece of sync work, as named in the assignment.
///
/// * `<connection>/<api>`: every instance of one API;
/// * `<connection>/<api>#<k>/<n>`: the instances of one API whose namespace hashes to bucket `k`
///   of `n` (one API with very many objects spread over several replicas);
/// * `<connection>/binding:<namespace>/<name>` and `<connection>/clusterbinding:<name>`: the
///   related Secrets and ConfigMaps of one binding.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Unit {
    /// Instances of one API, all of them or one namespace bucket.
    Api {
        /// The Connection.
        connection: String,
        /// `<plural>.<group>`.
        api: String,
        /// `(k, n)`: bucket `k` of `n`; `None` for all namespaces.
        bucket: Option<(u32, u32)>,
    },
    /// The related resources of one binding.
    Related {
        /// The Connection.
        connection: String,
        /// The Binding's namespace; `None` for a ClusterBinding.
        namespace: Option<String>,
        /// The binding's name.
        name: String,
    },
}

impl std::fmt::Display for Unit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unit::Api {
                connection,
                api,
                bucket: None,
            } => write!(f, "{connection}/{api}"),
            Unit::Api {
                connection,
                api,
                bucket: Some((k, n)),
            } => write!(f, "{connection}/{api}#{k}/{n}"),
            Unit::Related {
                connection,
                namespace: Some(namespace),
                name,
            } => write!(f, "{connection}/binding:{namespace}/{name}"),
            Unit::Related {
                connection,
                namespace: None,
                name,
            } => write!(f, "{connection}/clusterbinding:{name}"),
        }
    }
}

impl std::str::FromStr for Unit {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || format!("not a work unit: {text:?}");
        let (connection, rest) = text.split_once('/').ok_or_else(bad)?;
        let connection = connection.to_owned();
        if let Some(rest) = rest.strip_prefix("binding:") {
            let (namespace, name) = rest.split_once('/').ok_or_else(bad)?;
            return Ok(Unit::Related {
                connection,
                namespace: Some(namespace.to_owned()),
                name: name.to_owned(),
            });
        }
        if let Some(name) = rest.strip_prefix("clusterbinding:") {
            return Ok(Unit::Related {
                connection,
                namespace: None,
                name: name.to_owned(),
            });
        }
        let (api, bucket) = match rest.split_once('#') {
            None => (rest, None),
            Some((api, bucket)) => {
                let (k, n) = bucket.split_once('/').ok_or_else(bad)?;
                let (k, n) = (
                    k.parse::<u32>().map_err(|_| bad())?,
                    n.parse::<u32>().map_err(|_| bad())?,
                );
                if n == 0 || k >= n {
                    return Err(bad());
                }
                (api, Some((k, n)))
            }
        };
        if connection.is_empty() || api.is_empty() {
            return Err(bad());
        }
        Ok(Unit::Api {
            connection,
            api: api.to_owned(),
            bucket,
        })
    }
}

/// The units of one API of one Connection split into `buckets` namespace buckets (one unit, not
/// split, when `buckets` is 1).
pub fn api_units(connection: &str, api: &str, buckets: u32) -> Vec<Unit> {
    if buckets <= 1 {
        return vec![Unit::Api {
            connection: connection.to_owned(),
            api: api.to_owned(),
            bucket: None,
        }];
    }
    (0..buckets)
        .map(|k| Unit::Api {
            connection: connection.to_owned(),
            api: api.to_owned(),
            bucket: Some((k, buckets)),
        })
        .collect()
}

/// The bucket (of `n`) an object's namespace falls in; cluster-scoped objects hash the empty
/// namespace. Stable across processes and versions.
pub fn namespace_bucket(namespace: Option<&str>, n: u32) -> u32 {
    if n <= 1 {
        return 0;
    }
    let digest = Sha256::digest(namespace.unwrap_or_default().as_bytes());
    let mut head = [0; 8];
    head.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(head) % u64::from(n)) as u32
}

fn score(member: &str, unit: &str) -> [u8; 8] {
    let digest = Sha256::digest(format!("{member}\u{0}{unit}").as_bytes());
    let mut out = [0; 8];
    out.copy_from_slice(&digest[..8]);
    out
}

/// Where every unit should run: rendezvous hashing with bounded loads. Units are placed in the
/// order of their own hash; each goes to the highest-scoring member that holds fewer than
/// ⌈units / members⌉, so loads differ by at most one unit while a membership change still moves
/// only a little more than 1/N of the units (plain rendezvous hashing left one member of three
/// with twice the units of another at two dozen units).
pub fn placement(units: &BTreeSet<String>, members: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if members.is_empty() {
        return out;
    }
    let cap = units.len().div_ceil(members.len());
    let mut loads: BTreeMap<&str, usize> = members.iter().map(|m| (m.as_str(), 0)).collect();
    let mut order: Vec<&String> = units.iter().collect();
    order.sort_by_cached_key(|u| Sha256::digest(u.as_bytes()));
    for unit in order {
        let mut ranked: Vec<&String> = members.iter().collect();
        ranked.sort_by_cached_key(|m| std::cmp::Reverse(score(m, unit)));
        if let Some(member) = ranked.into_iter().find(|m| loads[m.as_str()] < cap) {
            if let Some(load) = loads.get_mut(member.as_str()) {
                *load += 1;
            }
            out.insert(unit.clone(), member.clone());
        }
    }
    out
}

/// One assignment round over the live members (current Leases). A unit moves from a live owner
/// in two steps: it is marked draining (nobody's), and given to its new owner only once the old
/// owner has applied that assignment generation and no longer runs it — so a unit never has two
/// active owners, even if the old owner had not yet started it when the move began. A dead
/// owner's units (Lease expired, or a new incarnation after a lapse: it fenced itself) move at
/// once, unless some live member still reports running them.
pub fn next(
    units: &BTreeSet<String>,
    live: &BTreeMap<String, Member>,
    current: &Assignment,
) -> Assignment {
    let generation = current.generation + 1;
    let names: BTreeSet<String> = live.keys().cloned().collect();
    let placement = placement(units, &names);
    let alive = |owner: &str| {
        live.get(owner).is_some_and(|m| {
            current
                .members
                .get(owner)
                .is_none_or(|i| *i == m.incarnation)
        })
    };
    let running_elsewhere = |key: &str, except: &str| {
        live.iter()
            .any(|(member, m)| member != except && m.running.contains(key))
    };
    let mut out = Assignment {
        format: ASSIGNMENT_FORMAT,
        generation: current.generation,
        ..Default::default()
    };
    for unit in units {
        let Some(desired) = placement.get(unit) else {
            continue;
        };
        let key = running_key(unit);
        if let Some(owner) = current.units.get(unit) {
            if owner == desired && alive(owner) {
                out.units.insert(unit.clone(), owner.clone());
            } else if alive(owner) {
                let incarnation = live.get(owner).map(|m| m.incarnation).unwrap_or_default();
                out.draining.insert(
                    unit.clone(),
                    Drain {
                        from: owner.clone(),
                        incarnation,
                        since: generation,
                    },
                );
            } else if !running_elsewhere(&key, desired) {
                out.units.insert(unit.clone(), desired.clone());
            }
        } else if let Some(drain) = current.draining.get(unit) {
            let acknowledged = match live.get(&drain.from) {
                None => true,
                Some(m) if m.incarnation != drain.incarnation => true,
                Some(m) => m.observed >= drain.since && !m.running.contains(&key),
            };
            if acknowledged && !running_elsewhere(&key, desired) {
                out.units.insert(unit.clone(), desired.clone());
            } else {
                out.draining.insert(unit.clone(), drain.clone());
            }
        } else if !running_elsewhere(&key, desired) {
            out.units.insert(unit.clone(), desired.clone());
        }
    }
    out.members = out
        .units
        .values()
        .filter_map(|m| live.get(m).map(|s| (m.clone(), s.incarnation)))
        .collect();
    if out.units == current.units
        && out.draining == current.draining
        && out.members == current.members
    {
        return current.clone();
    }
    out.generation = generation;
    out
}

/// Units that more than one live member reports running (must always be none).
pub fn overlaps(live: &BTreeSet<String>, running: &BTreeMap<String, BTreeSet<String>>) -> usize {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for units in running
        .iter()
        .filter(|(m, _)| live.contains(*m))
        .map(|(_, u)| u)
    {
        for unit in units {
            *seen.entry(unit).or_default() += 1;
        }
    }
    seen.values().filter(|n| **n > 1).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    fn loads(placement: &BTreeMap<String, String>) -> Vec<usize> {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for member in placement.values() {
            *counts.entry(member).or_default() += 1;
        }
        counts.into_values().collect()
    }

    #[test]
    fn placement_is_even_and_moves_little_more_than_one_nth_on_a_change() {
        for (count, slack) in [(24usize, 3usize), (600, 20)] {
            let units: BTreeSet<String> = (0..count)
                .map(|i| format!("p/r{}.example.org#{}/4", i / 4, i % 4))
                .collect();
            let sizes = [1usize, 2, 3, 4, 5];
            let members: Vec<BTreeSet<String>> = sizes
                .iter()
                .map(|n| (0..*n).map(|i| format!("syncer-{i}")).collect())
                .collect();
            let placements: Vec<_> = members.iter().map(|m| placement(&units, m)).collect();
            for (n, p) in sizes.iter().zip(&placements) {
                assert_eq!(p.len(), count, "every unit placed");
                let loads = loads(p);
                assert_eq!(loads.len(), *n);
                let (max, min) = (loads.iter().max().unwrap(), loads.iter().min().unwrap());
                assert!(max - min <= 1, "{n} members: loads {loads:?}");
            }
            for i in 0..sizes.len() - 1 {
                let moved = units
                    .iter()
                    .filter(|u| placements[i][*u] != placements[i + 1][*u])
                    .count();
                let ideal = count / sizes[i + 1];
                assert!(
                    moved <= ideal + slack,
                    "{} → {} members moved {moved} of {count} (ideal {ideal})",
                    sizes[i],
                    sizes[i + 1]
                );
            }
            // The same inputs always give the same placement (any leader computes the same).
            assert_eq!(placement(&units, &members[2]), placements[2]);
        }
    }

    fn member(incarnation: u64, observed: u64, running: &[&str]) -> Member {
        Member {
            incarnation,
            observed,
            running: running.iter().map(|u| running_key(u)).collect(),
        }
    }

    #[test]
    fn five_thousand_units_fit_the_lease_and_the_assignment() {
        // Long but valid names: a 63-character Connection, 120-character APIs.
        let connection = "c".repeat(63);
        let units: BTreeSet<String> = (0..5000)
            .map(|i| format!("{connection}/{}{i:05}.example.org", "r".repeat(100)))
            .collect();
        let running = encode_running(&units);
        assert!(running.starts_with("k:") && running.len() <= 2 + 8 * 5000);
        assert!(
            running.len() < 256 * 1024,
            "a Lease's annotations stay under 256 KiB"
        );
        let keys = decode_running(&running);
        assert_eq!(keys.len(), 5000, "no two of 5000 units share a key");
        assert!(units.iter().all(|u| keys.contains(&running_key(u))));
        // Few units stay readable names.
        let few: BTreeSet<String> = units.iter().take(3).cloned().collect();
        let plain = encode_running(&few);
        assert!(plain.starts_with('['));
        assert_eq!(
            decode_running(&plain),
            few.iter().map(|u| running_key(u)).collect()
        );
        for garbage in ["k:abc", "k:\u{e9}\u{e9}\u{e9}\u{e9}", "nonsense", "{}"] {
            assert!(decode_running(garbage).is_empty(), "{garbage}");
        }
        // 5000 units of ordinary names to 50 members fit the assignment ConfigMap (1 MiB) whole.
        let members: BTreeSet<String> = (0..50)
            .map(|i| format!("kbind-syncer-{i:02}-abcdef"))
            .collect();
        let live: BTreeMap<String, Member> = members
            .iter()
            .map(|m| (m.clone(), member(1, 0, &[])))
            .collect();
        let ordinary: BTreeSet<String> = (0..5000)
            .map(|i| format!("provider-{}/widgets{i:04}.example.org", i % 7))
            .collect();
        let (kept, left_out) = fit(&ordinary, &members);
        assert_eq!((kept.len(), left_out), (5000, 0));
        let assignment = next(&kept, &live, &Assignment::default());
        assert_eq!(assignment.units.len(), 5000);
        let text = assignment.encode();
        assert!(text.len() <= MAX_ASSIGNMENT_BYTES, "{} bytes", text.len());
        assert_eq!(Assignment::decode(&text).unwrap(), assignment);
        // 5000 units of the longest names: what fits is assigned, the rest is counted, and the
        // ConfigMap never exceeds the limit — not even if every unit were draining.
        let (kept, left_out) = fit(&units, &members);
        assert!(left_out > 0 && kept.len() + left_out == 5000);
        let assignment = next(&kept, &live, &Assignment::default());
        assert!(assignment.encode().len() <= MAX_ASSIGNMENT_BYTES);
        let draining = Assignment {
            format: ASSIGNMENT_FORMAT,
            generation: 2,
            units: BTreeMap::new(),
            members: live.keys().map(|m| (m.clone(), u64::MAX)).collect(),
            draining: kept
                .iter()
                .map(|u| {
                    let from = members.iter().next().cloned().unwrap_or_default();
                    (
                        u.clone(),
                        Drain {
                            from,
                            incarnation: u64::MAX,
                            since: u64::MAX,
                        },
                    )
                })
                .collect(),
        };
        assert!(
            draining.encode().len() <= MAX_ASSIGNMENT_BYTES,
            "{}",
            draining.encode().len()
        );
    }

    #[test]
    fn a_unit_moves_only_after_its_old_owner_applied_the_drain_and_stopped_it() {
        let u = "p/widgets.example.org".to_owned();
        let units = set(&[u.as_str()]);
        let names = set(&["a", "b"]);
        let desired = placement(&units, &names)[&u].clone();
        let other = if desired == "a" { "b" } else { "a" }.to_owned();
        let current = Assignment {
            format: 1,
            generation: 7,
            units: [(u.clone(), other.clone())].into(),
            members: [(other.clone(), 1)].into(),
            draining: BTreeMap::new(),
        };
        let live = |observed: u64, running: &[&str]| -> BTreeMap<String, Member> {
            [
                (other.clone(), member(1, observed, running)),
                (desired.clone(), member(1, observed, &[])),
            ]
            .into()
        };
        // Round 1: taken from the old owner (draining since generation 8), given to nobody.
        let round1 = next(&units, &live(7, &[u.as_str()]), &current);
        assert_eq!(round1.generation, 8);
        assert!(!round1.units.contains_key(&u));
        assert_eq!(round1.draining[&u].since, 8);
        // The old owner has not applied generation 8 yet (even if it does not run the unit: it may
        // be about to start it from generation 7): still nobody's, and nothing changes.
        assert_eq!(next(&units, &live(7, &[]), &round1), round1);
        // Applied, but still running: nobody's.
        assert_eq!(next(&units, &live(8, &[u.as_str()]), &round1), round1);
        // Applied and stopped: now the new owner's, with its incarnation.
        let round2 = next(&units, &live(8, &[]), &round1);
        assert_eq!(round2.units.get(&u), Some(&desired));
        assert_eq!(round2.members.get(&desired), Some(&1));
        assert!(round2.draining.is_empty());
        assert_eq!(round2.units_of(&desired, 1), set(&[u.as_str()]));
        assert!(
            round2.units_of(&desired, 2).is_empty(),
            "another incarnation"
        );
    }

    #[test]
    fn a_dead_members_units_move_at_once_and_what_it_claims_is_ignored() {
        let u = "p/widgets.example.org".to_owned();
        let current = Assignment {
            format: 1,
            generation: 3,
            units: [(u.clone(), "dead".to_owned())].into(),
            members: [("dead".to_owned(), 1)].into(),
            draining: BTreeMap::new(),
        };
        let live: BTreeMap<String, Member> = [("alive".to_owned(), member(5, 0, &[]))].into();
        let next = next(&set(&[u.as_str()]), &live, &current);
        assert_eq!(next.units.get(&u).map(String::as_str), Some("alive"));
        assert_eq!(next.members.get("alive"), Some(&5));
    }

    #[test]
    fn a_member_that_lapsed_and_rejoined_does_not_keep_its_old_units() {
        // A new incarnation (restart, or a pause past the fence) means the old one stopped: its
        // units are reassigned at once — possibly to the same member, as its new incarnation.
        let u = "p/widgets.example.org".to_owned();
        let units = set(&[u.as_str()]);
        let current = Assignment {
            format: 1,
            generation: 3,
            units: [(u.clone(), "a".to_owned())].into(),
            members: [("a".to_owned(), 1)].into(),
            draining: BTreeMap::new(),
        };
        let live: BTreeMap<String, Member> = [("a".to_owned(), member(2, 3, &[]))].into();
        assert!(current.units_of("a", 2).is_empty());
        let next = next(&units, &live, &current);
        assert_eq!(next.units_of("a", 2), units);
    }

    #[test]
    fn overlaps_are_counted_among_live_members_only() {
        let running: BTreeMap<String, BTreeSet<String>> = [
            ("a".into(), set(&["u1", "u2"])),
            ("b".into(), set(&["u2"])),
            ("dead".into(), set(&["u1"])),
        ]
        .into();
        assert_eq!(overlaps(&set(&["a", "b"]), &running), 1);
        let keyed: BTreeMap<String, BTreeSet<String>> = running
            .into_iter()
            .map(|(m, units)| (m, units.iter().map(|u| running_key(u)).collect()))
            .collect();
        assert_eq!(overlaps(&set(&["a", "b"]), &keyed), 1);
    }

    #[test]
    fn units_round_trip_through_their_names() {
        for text in [
            "p/widgets.example.org",
            "p/widgets.example.org#3/8",
            "p/binding:team-a/mine",
            "p/clusterbinding:all",
        ] {
            let unit: Unit = text.parse().unwrap();
            assert_eq!(unit.to_string(), text);
        }
        for bad in [
            "p",
            "/x.y",
            "p/x.y#8/8",
            "p/x.y#1",
            "p/x.y#a/2",
            "p/binding:nons",
        ] {
            assert!(bad.parse::<Unit>().is_err(), "{bad}");
        }
        assert_eq!(unit("p", "x.y"), "p/x.y");
        assert_eq!(api_units("p", "x.y", 1).len(), 1);
        assert_eq!(
            api_units("p", "x.y", 4)
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["p/x.y#0/4", "p/x.y#1/4", "p/x.y#2/4", "p/x.y#3/4"]
        );
    }

    #[test]
    fn namespaces_spread_over_buckets() {
        let mut counts = [0; 4];
        for i in 0..400 {
            counts[namespace_bucket(Some(&format!("ns-{i}")), 4) as usize] += 1;
        }
        assert!(counts.iter().all(|c| (60..=140).contains(c)), "{counts:?}");
        assert_eq!(namespace_bucket(Some("x"), 1), 0);
        assert_eq!(
            namespace_bucket(None, 7),
            namespace_bucket(None, 7),
            "stable"
        );
    }

    #[test]
    fn a_newer_format_is_refused_clearly() {
        assert_eq!(
            Assignment::decode(r#"{"format":2,"units":{}}"#),
            Err(AssignmentError::TooNew(2))
        );
        assert!(Assignment::decode("nope").is_err());
        let a = Assignment {
            format: 1,
            generation: 4,
            units: [("p/x.y".into(), "a".into())].into(),
            members: [("a".into(), 9)].into(),
            draining: BTreeMap::new(),
        };
        assert_eq!(Assignment::decode(&a.encode()).unwrap(), a);
        assert_eq!(a.units_of("a", 9), set(&["p/x.y"]));
        // An assignment written before generations and incarnations still reads.
        let old = Assignment::decode(r#"{"format":1,"units":{"p/x.y":"a"}}"#).unwrap();
        assert_eq!(old.generation, 0);
        assert!(old.units_of("a", 9).is_empty(), "no incarnation recorded");
    }
}
