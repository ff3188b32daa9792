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
/// Annotation on a syncer's membership Lease: the units it is running right now (JSON list), its
/// acknowledgement that drained units are no longer running.
pub const RUNNING_UNITS_ANNOTATION: &str = "core.kbind.io/running-units";
/// Prefix of each syncer's membership Lease name.
pub const MEMBER_LEASE_PREFIX: &str = "kbind-syncer-";

/// Which member owns which unit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// Format version, [`ASSIGNMENT_FORMAT`].
    pub format: u32,
    /// Unit → member identity. A unit absent here is unowned (being drained or waiting).
    pub units: BTreeMap<String, String>,
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
    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("an assignment serializes")
    }

    /// The units assigned to `member`.
    pub fn units_of(&self, member: &str) -> BTreeSet<String> {
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

/// Rendezvous (highest random weight) hashing: adding or removing one member moves only the units
/// that member wins or held, about 1/N of them.
pub fn rendezvous<'m>(unit: &str, members: &'m BTreeSet<String>) -> Option<&'m str> {
    members
        .iter()
        .max_by_key(|m| score(m, unit))
        .map(String::as_str)
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
        ranked.sort_by_key(|m| std::cmp::Reverse(score(m, unit)));
        if let Some(member) = ranked.into_iter().find(|m| loads[m.as_str()] < cap) {
            *loads.get_mut(member.as_str()).expect("a member") += 1;
            out.insert(unit.clone(), member.clone());
        }
    }
    out
}

/// One assignment round. `live` are members whose Lease is current; `running` is what each live
/// member says it runs. A unit moves in two rounds — first unowned until its old owner no longer
/// runs it (drain, acknowledged in its Lease), then to the new owner — so no unit ever has two
/// active owners. A dead member's units move once its Lease has expired (it fenced itself).
pub fn next(
    units: &BTreeSet<String>,
    live: &BTreeSet<String>,
    running: &BTreeMap<String, BTreeSet<String>>,
    current: &Assignment,
) -> Assignment {
    let mut out = Assignment {
        format: ASSIGNMENT_FORMAT,
        units: BTreeMap::new(),
    };
    let placement = placement(units, live);
    for unit in units {
        let Some(desired) = placement.get(unit) else {
            continue;
        };
        match current.units.get(unit) {
            Some(owner) if owner == desired => {
                out.units.insert(unit.clone(), owner.clone());
            }
            // Drain: take it from a live owner first.
            Some(owner) if live.contains(owner) => {}
            _ => {
                let still_running_elsewhere = running.iter().any(|(member, units)| {
                    member != desired && live.contains(member) && units.contains(unit)
                });
                if !still_running_elsewhere {
                    out.units.insert(unit.clone(), desired.to_owned());
                }
            }
        }
    }
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

    #[test]
    fn plain_rendezvous_moves_only_the_new_members_units() {
        let units: BTreeSet<String> = (0..600)
            .map(|i| unit("p", &format!("r{i}.example.org")))
            .collect();
        let three = set(&["a", "b", "c"]);
        let four = set(&["a", "b", "c", "d"]);
        let moved = units
            .iter()
            .filter(|u| rendezvous(u, &three) != rendezvous(u, &four))
            .count();
        assert!(
            (100..=200).contains(&moved),
            "moved {moved} of 600 (expected about 150)"
        );
        assert!(
            units
                .iter()
                .filter(|u| rendezvous(u, &four) == Some("d"))
                .count()
                == moved,
            "only units won by the new member move"
        );
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

    #[test]
    fn a_unit_moves_only_after_its_old_owner_drained_it() {
        let units = set(&["p/widgets.example.org"]);
        let u = "p/widgets.example.org".to_owned();
        let live = set(&["a", "b"]);
        let desired = placement(&units, &live)[&u].clone();
        let other = if desired == "a" { "b" } else { "a" }.to_owned();
        let current = Assignment {
            format: 1,
            units: [(u.clone(), other.clone())].into(),
        };
        // Round 1: taken from the old owner, given to nobody.
        let running: BTreeMap<String, BTreeSet<String>> =
            [(other.clone(), set(&["p/widgets.example.org"]))].into();
        let round1 = next(&units, &live, &running, &current);
        assert!(!round1.units.contains_key(&u));
        // Still running there: still nobody's.
        assert!(
            !next(&units, &live, &running, &round1)
                .units
                .contains_key(&u)
        );
        // Drained: now the new owner's.
        let drained: BTreeMap<String, BTreeSet<String>> = [(other, BTreeSet::new())].into();
        assert_eq!(
            next(&units, &live, &drained, &round1).units.get(&u),
            Some(&desired)
        );
    }

    #[test]
    fn a_dead_members_units_move_at_once_and_what_it_claims_is_ignored() {
        let u = "p/widgets.example.org".to_owned();
        let current = Assignment {
            format: 1,
            units: [(u.clone(), "dead".to_owned())].into(),
        };
        let running: BTreeMap<String, BTreeSet<String>> =
            [("dead".to_owned(), set(&[u.as_str()]))].into();
        let next = next(&set(&[u.as_str()]), &set(&["alive"]), &running, &current);
        assert_eq!(next.units.get(&u).map(String::as_str), Some("alive"));
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
            units: [("p/x.y".into(), "a".into())].into(),
        };
        assert_eq!(Assignment::decode(&a.encode()).unwrap(), a);
        assert_eq!(a.units_of("a"), set(&["p/x.y"]));
    }
}
