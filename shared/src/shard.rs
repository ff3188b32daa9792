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
///
/// `units` come in priority order: API units first, then related units (see [`related_admission`]),
/// so related work a namespace user can add never pushes an API out.
pub fn fit<'a>(
    units: impl IntoIterator<Item = &'a String>,
    members: &BTreeSet<String>,
) -> (BTreeSet<String>, usize) {
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

/// A binding with related resources, as the assignment weighs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelatedBinding {
    /// The Binding's namespace; `None` for a ClusterBinding.
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// The Connection it names.
    pub connection: String,
    /// Whether that Connection exists, is Ready and serves Bindings in this namespace.
    pub allowed: bool,
}

impl RelatedBinding {
    /// A binding (`meta`, `spec`) as the admission weighs it, with `connection` the Connection it
    /// names (`None`: not found); `None` when it has no related resources or is being deleted.
    pub fn of(
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        spec: &crate::api::BindingSpec,
        connection: Option<&crate::api::Connection>,
    ) -> Option<Self> {
        if meta.deletion_timestamp.is_some() || spec.related_resources.is_empty() {
            return None;
        }
        let namespace = meta.namespace.clone();
        let allowed = connection.is_some_and(|c| {
            connection_ready(c)
                && namespace
                    .as_deref()
                    .is_none_or(|ns| c.spec.access.allows_bindings_in(ns))
        });
        Some(Self {
            namespace,
            name: meta.name.clone().unwrap_or_default(),
            connection: spec.connection_ref.name.clone(),
            allowed,
        })
    }
}

/// Whether a Connection is Ready (only Ready Connections' work is assigned).
pub fn connection_ready(connection: &crate::api::Connection) -> bool {
    connection
        .status
        .as_ref()
        .is_some_and(|s| crate::conditions::is_true(&s.conditions, crate::conditions::types::READY))
}

/// Why a binding's related resources get no work unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotServed {
    /// Related resources are off in this installation (`--related-resources=false`).
    Disabled,
    /// Its Connection is not Ready or does not serve Bindings in its namespace.
    NotAllowed,
    /// Its namespace already has `cap` Bindings with related resources served (by name).
    NamespaceFull {
        /// `--max-related-bindings-per-namespace`.
        cap: u32,
    },
}

impl NotServed {
    /// A CamelCase reason for the binding's `RelatedResourcesSynced` condition.
    pub fn reason(&self) -> &'static str {
        match self {
            NotServed::Disabled => "RelatedResourcesDisabled",
            NotServed::NotAllowed => "NotAllowed",
            NotServed::NamespaceFull { .. } => "TooManyBindings",
        }
    }

    /// What a person reads.
    pub fn message(&self, namespace: Option<&str>) -> String {
        match self {
            NotServed::Disabled => "related resources are not enabled in this installation (chart value relatedResources.enabled, flag --related-resources); nothing is copied".to_owned(),
            NotServed::NotAllowed => "its Connection is not Ready or does not serve Bindings in this namespace; nothing is copied".to_owned(),
            NotServed::NamespaceFull { cap } => format!(
                "namespace {} has more Bindings with related resources than kbind serves there: the first {cap} by name (--max-related-bindings-per-namespace); nothing of this one is copied",
                namespace.unwrap_or_default()
            ),
        }
    }
}

/// #32.1: which bindings' related resources become work units, one result per binding (in the
/// given order). Nothing when related resources are off; only bindings their Connection allows;
/// and at most `per_namespace` Bindings per namespace, the first by name — so one namespace user's
/// flood of Bindings adds a bounded amount of work. ClusterBindings (made by administrators) are
/// not capped.
pub fn related_admission(
    bindings: &[RelatedBinding],
    enabled: bool,
    per_namespace: u32,
) -> Vec<Result<Unit, NotServed>> {
    let mut order: Vec<usize> = (0..bindings.len()).collect();
    order.sort_by(|a, b| {
        let (a, b) = (&bindings[*a], &bindings[*b]);
        (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name))
    });
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    let mut out: Vec<Option<Result<Unit, NotServed>>> = vec![None; bindings.len()];
    for i in order {
        let b = &bindings[i];
        let result = if !enabled {
            Err(NotServed::Disabled)
        } else if !b.allowed {
            Err(NotServed::NotAllowed)
        } else {
            let full = b.namespace.as_deref().is_some_and(|ns| {
                let n = seen.entry(ns).or_default();
                *n = n.saturating_add(1);
                *n > per_namespace
            });
            if full {
                Err(NotServed::NamespaceFull { cap: per_namespace })
            } else {
                Ok(Unit::Related {
                    connection: b.connection.clone(),
                    namespace: b.namespace.clone(),
                    name: b.name.clone(),
                })
            }
        };
        out[i] = Some(result);
    }
    out.into_iter().flatten().collect()
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
/// Annotation on a syncer's membership Lease: how many objects each unit it runs holds (its
/// consumer cache's count, refreshed every few seconds), `<running_key>=<count>` joined by `,`.
/// The leader places units by these weights, so that replicas hold similar numbers of objects,
/// not only similar numbers of units. At most [`MAX_UNIT_OBJECTS`] entries (the heaviest): with
/// the running-units annotation that stays well under a Lease's 256 KiB of annotations.
pub const UNIT_OBJECTS_ANNOTATION: &str = "core.kbind.io/unit-objects";
/// The most units a unit-objects annotation lists.
pub const MAX_UNIT_OBJECTS: usize = 4096;

/// The unit-objects annotation for `counts` (unit name → objects); see [`UNIT_OBJECTS_ANNOTATION`].
pub fn encode_objects(counts: &BTreeMap<String, u64>) -> String {
    let mut entries: Vec<(u64, String)> = counts
        .iter()
        .map(|(unit, count)| (*count, running_key(unit)))
        .collect();
    // The heaviest MAX_UNIT_OBJECTS, then in key order.
    entries.sort_by(|a, b| b.cmp(a));
    entries.truncate(MAX_UNIT_OBJECTS);
    entries.sort_by(|a, b| a.1.cmp(&b.1));
    entries
        .iter()
        .map(|(count, key)| format!("{key}={count}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The counts of a unit-objects annotation, by [`running_key`]: at most [`MAX_UNIT_OBJECTS`]
/// entries; an unreadable entry is left out (a hostile or newer Lease costs nothing).
pub fn decode_objects(text: &str) -> BTreeMap<String, u64> {
    text.split(',')
        .filter_map(|entry| {
            let (key, count) = entry.split_once('=')?;
            (key.len() == 8 && key.is_ascii()).then_some(())?;
            Some((key.to_owned(), count.parse::<u64>().ok()?))
        })
        .take(MAX_UNIT_OBJECTS)
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
    /// [`UNIT_OBJECTS_ANNOTATION`]: objects per running unit, by [`running_key`].
    pub objects: BTreeMap<String, u64>,
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

/// While the current owners' object loads differ by at most this factor (heaviest ÷ lightest),
/// no unit moves for balance.
pub const BALANCED_SPREAD: f64 = 1.2;
/// Nor while they differ by fewer objects than this: a few dozen objects are not worth a move
/// (each moved unit's worker lists its objects again), and early in a bulk load the counts are
/// too small to say which way the load will lean.
pub const MIN_IMBALANCE: u64 = 32;
/// At most this many swaps per placement (each strictly evens out the two members it touches).
const MAX_SWAPS: usize = 256;

/// How far apart `placement`'s object loads over `members` are: heaviest ÷ lightest, each plus
/// one (an empty member does not divide by zero).
pub fn spread(
    placement: &BTreeMap<String, String>,
    members: &BTreeSet<String>,
    weight: impl Fn(&str) -> u64,
) -> f64 {
    let (max, min) = heaviest_lightest(placement, members, &weight);
    (max as f64 + 1.0) / (min as f64 + 1.0)
}

/// The heaviest and the lightest member's objects.
fn heaviest_lightest(
    placement: &BTreeMap<String, String>,
    members: &BTreeSet<String>,
    weight: &impl Fn(&str) -> u64,
) -> (u64, u64) {
    let loads = loads_of(placement, members, weight);
    let max = loads.values().max().copied().unwrap_or_default();
    let min = loads.values().min().copied().unwrap_or_default();
    (max, min)
}

fn loads_of<'a>(
    placement: &BTreeMap<String, String>,
    members: &'a BTreeSet<String>,
    weight: &impl Fn(&str) -> u64,
) -> BTreeMap<&'a str, u64> {
    let mut loads: BTreeMap<&str, u64> = members.iter().map(|m| (m.as_str(), 0)).collect();
    for (unit, member) in placement {
        if let Some(load) = loads.get_mut(member.as_str()) {
            *load = load.saturating_add(weight(unit));
        }
    }
    loads
}

/// Where every unit should run, by count and by weight: [`placement`] (even unit counts), then
/// swaps of units between the heaviest and the lightest member — counts stay even — while a
/// swap evens their objects out. `weights` are the objects each unit held when last reported
/// (a unit without one weighs nothing); with none at all this is exactly [`placement`] (syncers
/// that report no weights). `kept`: the current owners, when every unit has a live one and the
/// unit counts are still even; they stay while their object loads are within
/// [`BALANCED_SPREAD`] or [`MIN_IMBALANCE`] of each other, or no clearly better placement is
/// found — weights drift all the time, and a unit moves only for a real imbalance.
pub fn balanced_placement(
    units: &BTreeSet<String>,
    members: &BTreeSet<String>,
    weights: &BTreeMap<String, u64>,
    kept: Option<BTreeMap<String, String>>,
) -> BTreeMap<String, String> {
    let base = placement(units, members);
    if weights.is_empty() {
        return base;
    }
    let weight = |unit: &str| weights.get(unit).copied().unwrap_or_default();
    let kept = kept.filter(|k| {
        k.len() == units.len()
            && units
                .iter()
                .all(|u| k.get(u).is_some_and(|m| members.contains(m)))
            && counts_even(k, members, units.len())
    });
    if let Some(kept) = &kept {
        let (max, min) = heaviest_lightest(kept, members, &weight);
        if max - min < MIN_IMBALANCE || spread(kept, members, weight) <= BALANCED_SPREAD {
            return kept.clone();
        }
    }
    let improved = swapped(base, members, &weight);
    match kept {
        // Only a clearly better placement is worth the moves.
        Some(kept)
            if spread(&kept, members, weight) <= spread(&improved, members, weight) * 1.1 =>
        {
            kept
        }
        _ => improved,
    }
}

/// Whether every member holds what [`placement`] would give it by count: at most ⌈units ÷
/// members⌉, and not two fewer than ⌊units ÷ members⌋ (a member that just joined holds none).
fn counts_even(
    placement: &BTreeMap<String, String>,
    members: &BTreeSet<String>,
    units: usize,
) -> bool {
    if members.is_empty() {
        return false;
    }
    let (cap, floor) = (units.div_ceil(members.len()), units / members.len());
    let mut counts: BTreeMap<&str, usize> = members.iter().map(|m| (m.as_str(), 0)).collect();
    for member in placement.values() {
        if let Some(count) = counts.get_mut(member.as_str()) {
            *count += 1;
        }
    }
    counts.values().all(|c| *c <= cap && *c + 1 >= floor)
}

/// `placement` with units swapped between its heaviest and lightest member while a swap brings
/// their loads closer (at most [`MAX_SWAPS`]); deterministic for the same inputs.
fn swapped(
    mut placement: BTreeMap<String, String>,
    members: &BTreeSet<String>,
    weight: &impl Fn(&str) -> u64,
) -> BTreeMap<String, String> {
    for _ in 0..MAX_SWAPS {
        let loads = loads_of(&placement, members, weight);
        let heaviest = loads.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)));
        let lightest = loads.iter().min_by(|a, b| a.1.cmp(b.1).then(a.0.cmp(b.0)));
        let (Some((heavy, high)), Some((light, low))) = (heaviest, lightest) else {
            break;
        };
        if high <= low {
            break;
        }
        let gap = high - low;
        let (heavy, light) = (heavy.to_string(), light.to_string());
        let mut candidates: Vec<(u64, &String)> = placement
            .iter()
            .filter(|(_, m)| **m == light)
            .map(|(u, _)| (weight(u), u))
            .collect();
        candidates.sort();
        // The swap (a from the heaviest, b from the lightest) whose difference is nearest half
        // the gap; 0 < w(a) − w(b) < gap, so both end nearer each other than before.
        let mut best: Option<(u64, &String, &String)> = None;
        for (unit, _) in placement.iter().filter(|(_, m)| **m == heavy) {
            let wa = weight(unit);
            let ideal = wa.saturating_sub(gap / 2);
            let at = candidates.partition_point(|(w, _)| *w < ideal);
            for (wb, other) in [at.checked_sub(1), Some(at)]
                .into_iter()
                .flatten()
                .filter_map(|i| candidates.get(i))
            {
                let Some(delta) = wa.checked_sub(*wb).filter(|d| *d > 0 && *d < gap) else {
                    continue;
                };
                let miss = gap.abs_diff(delta.saturating_mul(2));
                if best.is_none_or(|(m, _, _)| miss < m) {
                    best = Some((miss, unit, other));
                }
            }
        }
        let Some((_, a, b)) = best else { break };
        let (a, b) = (a.clone(), b.clone());
        placement.insert(a, light);
        placement.insert(b, heavy);
    }
    placement
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
    weights: &BTreeMap<String, u64>,
) -> Assignment {
    let generation = current.generation + 1;
    let names: BTreeSet<String> = live.keys().cloned().collect();
    let alive = |owner: &str| {
        live.get(owner).is_some_and(|m| {
            current
                .members
                .get(owner)
                .is_none_or(|i| *i == m.incarnation)
        })
    };
    // The current owners, if every unit has a live one (nothing draining, nobody dead).
    let kept: Option<BTreeMap<String, String>> = units
        .iter()
        .map(|u| {
            current
                .units
                .get(u)
                .filter(|owner| alive(owner))
                .map(|owner| (u.clone(), owner.clone()))
        })
        .collect();
    let placement = balanced_placement(units, &names, weights, kept);
    let running_elsewhere = |key: &str, except: &str| {
        live.iter()
            .any(|(member, m)| member != except && m.running.contains(key))
    };
    // Its generation is set below, once it differs from `current`.
    let mut out = Assignment {
        format: ASSIGNMENT_FORMAT,
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

    #[test]
    fn fit_counts_every_member_and_leaves_out_all_after_the_first_unit_left_out() {
        // 100 members of 10 characters: 256 + 100 × (10 + 32) bytes of overhead, so a budget of
        // 921,600 − 4,456 = 917,144 bytes; units of 910 characters cost 910 + 10 + 80 = 1,000.
        let members: BTreeSet<String> = (0..100).map(|i| format!("member-{i:03}")).collect();
        let mut units: Vec<String> = (0..1000).map(|i| format!("{i:0>910}")).collect();
        // A small unit after the first one left out is left out too: priority order holds.
        units.push("small".to_owned());
        let (kept, left_out) = fit(&units, &members);
        assert_eq!((kept.len(), left_out), (917, 84));
        assert!(!kept.contains("small"));
        assert!(kept.contains(&units[916]) && !kept.contains(&units[917]));
        // Without members the longest name is taken as 64.
        let (kept, left_out) = fit(&units[..3], &BTreeSet::new());
        assert_eq!((kept.len(), left_out), (3, 0));
    }

    #[test]
    fn spread_is_the_heaviest_over_the_lightest_each_plus_one() {
        let members: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
        let placement: BTreeMap<String, String> =
            [("u1", "a"), ("u2", "b"), ("u3", "c"), ("u4", "a")]
                .map(|(u, m)| (u.to_owned(), m.to_owned()))
                .into();
        let weight = |unit: &str| match unit {
            "u1" => 5,
            "u2" => 2,
            "u3" => 7,
            _ => 4,
        };
        // a: 9, b: 2, c: 7 → (9 + 1) / (2 + 1).
        assert!((spread(&placement, &members, weight) - 10.0 / 3.0).abs() < 1e-9);
        // An empty member: (9 + 1) / (0 + 1).
        let four: BTreeSet<String> = ["a", "b", "c", "d"].map(String::from).into();
        assert!((spread(&placement, &four, weight) - 10.0).abs() < 1e-9);
    }

    #[test]
    fn counts_are_even_within_one_of_the_placement() {
        let members = set(&["a", "b", "c"]);
        let placed = |counts: [usize; 3]| -> BTreeMap<String, String> {
            let mut out = BTreeMap::new();
            for (member, count) in ["a", "b", "c"].into_iter().zip(counts) {
                for i in 0..count {
                    out.insert(format!("{member}{i}"), member.to_owned());
                }
            }
            out
        };
        // (counts, units) → even? With 7 units the cap is 3 and the floor 2; with 9, 3 and 3.
        let cases = [
            ([3, 2, 2], 7, true),
            ([3, 3, 1], 7, true),
            ([4, 2, 1], 7, false),
            ([5, 1, 1], 7, false),
            ([3, 3, 3], 9, true),
            ([3, 3, 2], 9, true),
            ([3, 3, 1], 9, false),
        ];
        for (counts, units, even) in cases {
            assert_eq!(
                counts_even(&placed(counts), &members, units),
                even,
                "{counts:?} of {units}"
            );
        }
        assert!(!counts_even(&BTreeMap::new(), &BTreeSet::new(), 0));
    }

    #[test]
    fn kept_owners_stay_only_while_valid_and_not_clearly_worse() {
        let members = set(&["a", "b"]);
        let units = set(&["u1", "u2", "u3", "u4"]);
        let place = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(u, m)| ((*u).to_owned(), (*m).to_owned()))
                .collect()
        };
        let loads = |placement: &BTreeMap<String, String>, weights: &BTreeMap<String, u64>| {
            let weight = |u: &str| weights.get(u).copied().unwrap_or_default();
            loads_of(placement, &members, &weight)
                .into_values()
                .collect::<Vec<u64>>()
        };
        // Exactly MIN_IMBALANCE apart and far beyond BALANCED_SPREAD: the kept owners give way
        // to an even split of the two heavy units.
        let weights: BTreeMap<String, u64> = [("u1", 16), ("u2", 16), ("u3", 0), ("u4", 0)]
            .map(|(u, w)| (u.to_owned(), w))
            .into();
        let kept = place(&[("u1", "a"), ("u2", "a"), ("u3", "b"), ("u4", "b")]);
        let out = balanced_placement(&units, &members, &weights, Some(kept));
        assert_eq!(loads(&out, &weights), [16, 16]);

        // A kept owner that left the membership invalidates the kept placement, however light.
        let light: BTreeMap<String, u64> = [("u1", 1)].map(|(u, w)| (u.to_owned(), w)).into();
        let departed = place(&[("u1", "a"), ("u2", "a"), ("u3", "gone"), ("u4", "b")]);
        let out = balanced_placement(&units, &members, &light, Some(departed));
        assert!(out.values().all(|m| members.contains(m)), "{out:?}");

        // Imbalanced (39 objects apart, spread 1.6) but no better split exists: the kept owners
        // stay, even mirrored from what a fresh placement would choose.
        let weights: BTreeMap<String, u64> = [("u1", 100), ("u2", 60), ("u3", 1), ("u4", 0)]
            .map(|(u, w)| (u.to_owned(), w))
            .into();
        let fresh = balanced_placement(&units, &members, &weights, None);
        let mut fresh_loads = loads(&fresh, &weights);
        fresh_loads.sort();
        assert_eq!(fresh_loads, [61, 100], "{fresh:?}");
        let mirrored: BTreeMap<String, String> = fresh
            .iter()
            .map(|(u, m)| (u.clone(), if m == "a" { "b" } else { "a" }.to_owned()))
            .collect();
        let out = balanced_placement(&units, &members, &weights, Some(mirrored.clone()));
        assert_eq!(out, mirrored);
    }

    #[test]
    fn not_served_reasons_name_the_cause() {
        let cases = [
            (NotServed::Disabled, "RelatedResourcesDisabled"),
            (NotServed::NotAllowed, "NotAllowed"),
            (NotServed::NamespaceFull { cap: 16 }, "TooManyBindings"),
        ];
        for (cause, reason) in cases {
            assert_eq!(cause.reason(), reason, "{cause:?}");
        }
    }

    #[test]
    fn running_units_stay_a_plain_list_up_to_32_kib() {
        // About 20 KiB of unit names: plain; about 40 KiB: keys.
        let units =
            |n: usize| -> BTreeSet<String> { (0..n).map(|i| format!("{i:0>100}")).collect() };
        let small = encode_running(&units(200));
        assert!(
            small.starts_with('[') && small.len() > 20_000,
            "{}",
            small.len()
        );
        assert!(small.len() <= RUNNING_PLAIN_LIMIT);
        let large = encode_running(&units(400));
        assert!(large.starts_with("k:"), "{}", &large[..10]);
    }

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

    /// 6 APIs × 4 namespace buckets whose buckets hold `per_bucket` objects each (the same
    /// namespaces in every API: the heavy buckets line up, as in the sharding benchmark).
    fn bucketed(per_bucket: [u64; 4]) -> (BTreeSet<String>, BTreeMap<String, u64>) {
        let mut weights = BTreeMap::new();
        for api in [
            "alphas", "bravos", "charlies", "deltas", "echos", "foxtrots",
        ] {
            for (k, objects) in per_bucket.iter().enumerate() {
                weights.insert(format!("p/{api}.example.org#{k}/4"), *objects);
            }
        }
        (weights.keys().cloned().collect(), weights)
    }

    fn counts(placement: &BTreeMap<String, String>) -> Vec<usize> {
        loads(placement)
    }

    #[test]
    fn placement_by_weight_evens_out_objects_and_keeps_unit_counts_even() {
        let members = set(&["syncer-0", "syncer-1", "syncer-2"]);
        // (objects per bucket, the spread by weight must be at most)
        let cases: [([u64; 4], f64); 5] = [
            ([500, 250, 125, 125], 1.1), // 8 namespaces hashed 4 / 2 / 1 / 1
            ([375, 375, 125, 125], 1.1),
            ([1000, 0, 0, 0], 1.1), // 6 heavy units over 3 members: 2 each
            ([100, 100, 100, 100], 1.0),
            ([7, 3, 1, 0], 1.25),
        ];
        for (per_bucket, most) in cases {
            let (units, weights) = bucketed(per_bucket);
            let weight = |u: &str| weights[u];
            let by_count = placement(&units, &members);
            let by_weight = balanced_placement(&units, &members, &weights, None);
            assert_eq!(
                counts(&by_weight),
                [8, 8, 8],
                "{per_bucket:?}: unit counts stay even"
            );
            let (before, after) = (
                spread(&by_count, &members, weight),
                spread(&by_weight, &members, weight),
            );
            assert!(
                after <= most && after <= before,
                "{per_bucket:?}: spread {before:.2} by count, {after:.2} by weight"
            );
            // Any leader computes the same.
            assert_eq!(
                balanced_placement(&units, &members, &weights, None),
                by_weight
            );
        }
        // Hostile counts (a Lease says anything) neither panic nor unbalance the unit counts.
        let (units, weights) = bucketed([u64::MAX, u64::MAX / 2 + 1, u64::MAX - 1, 0]);
        let hostile = balanced_placement(&units, &members, &weights, None);
        assert_eq!(counts(&hostile), [8, 8, 8]);
        // The benchmark's case is uneven by count alone: the weights are what evens it out.
        let (units, weights) = bucketed([500, 250, 125, 125]);
        let by_count = placement(&units, &members);
        assert!(spread(&by_count, &members, |u| weights[u]) > 1.25);
    }

    #[test]
    fn placement_by_weight_keeps_current_owners_unless_clearly_uneven() {
        let members = set(&["syncer-0", "syncer-1", "syncer-2"]);
        let (units, weights) = bucketed([500, 250, 125, 125]);
        let balanced = balanced_placement(&units, &members, &weights, None);
        // Weights drift (objects come and go): within the tolerance nothing moves, even where a
        // fresh placement of the new weights would differ.
        for drift in [0.9, 0.95, 1.05, 1.1] {
            let drifted: BTreeMap<String, u64> = weights
                .iter()
                .enumerate()
                .map(|(i, (u, w))| {
                    let factor = if i % 2 == 0 { drift } else { 1.0 };
                    (u.clone(), (*w as f64 * factor) as u64)
                })
                .collect();
            assert_eq!(
                balanced_placement(&units, &members, &drifted, Some(balanced.clone())),
                balanced,
                "drift {drift}"
            );
        }
        // Owners placed by count alone are clearly uneven: re-placed by weight.
        let by_count = placement(&units, &members);
        assert_eq!(
            balanced_placement(&units, &members, &weights, Some(by_count.clone())),
            balanced
        );
        // The same unevenness in a handful of objects is not worth a move.
        let (_, few) = bucketed([4, 2, 1, 1]);
        assert!(spread(&by_count, &members, |u| few[u]) > BALANCED_SPREAD);
        assert_eq!(
            balanced_placement(&units, &members, &few, Some(by_count.clone())),
            by_count
        );
        // No weights reported (syncers of an earlier version): exactly the placement by count.
        assert_eq!(
            balanced_placement(&units, &members, &BTreeMap::new(), Some(balanced.clone())),
            by_count
        );
        // Current owners that cannot stay: a member joined (it holds nothing), or one is gone.
        let four = set(&["syncer-0", "syncer-1", "syncer-2", "syncer-3"]);
        let joined = balanced_placement(&units, &four, &weights, Some(balanced.clone()));
        assert_eq!(counts(&joined), [6, 6, 6, 6]);
        let two = set(&["syncer-0", "syncer-1"]);
        let left = balanced_placement(&units, &two, &weights, Some(balanced.clone()));
        assert!(left.values().all(|m| two.contains(m)));
        assert_eq!(counts(&left), [12, 12]);
        // A unit without an owner (draining): a fresh placement.
        let mut draining = balanced.clone();
        draining.remove(units.first().unwrap());
        assert_eq!(
            balanced_placement(&units, &members, &weights, Some(draining)),
            balanced
        );
    }

    #[test]
    fn an_uneven_assignment_is_evened_out_through_drains() {
        let (units, weights) = bucketed([500, 250, 125, 125]);
        let names = set(&["syncer-0", "syncer-1", "syncer-2"]);
        let by_count = placement(&units, &names);
        assert!(spread(&by_count, &names, |u| weights[u]) > 1.25);
        fn owned<'a>(placement: &'a BTreeMap<String, String>, m: &str) -> Vec<&'a str> {
            placement
                .iter()
                .filter(|(_, o)| *o == m)
                .map(|(u, _)| u.as_str())
                .collect()
        }
        let current = Assignment {
            format: 1,
            generation: 4,
            units: by_count.clone(),
            members: names.iter().map(|m| (m.clone(), 1)).collect(),
            draining: BTreeMap::new(),
        };
        let live: BTreeMap<String, Member> = names
            .iter()
            .map(|m| (m.clone(), member(1, 4, &owned(&by_count, m))))
            .collect();
        // Without weights nothing moves; with them, the units to swap are drained first.
        assert_eq!(next(&units, &live, &current, &BTreeMap::new()), current);
        let round = next(&units, &live, &current, &weights);
        assert_eq!(round.generation, 5);
        assert!(!round.draining.is_empty() && round.draining.len().is_multiple_of(2));
        assert!(round.draining.keys().all(|u| !round.units.contains_key(u)));
    }

    #[test]
    fn unit_objects_fit_a_lease_and_hostile_text_reads_as_nothing() {
        let units: BTreeMap<String, u64> = (0..5000u64)
            .map(|i| {
                (
                    format!(
                        "{}/{}{i:05}.example.org#3/4",
                        "c".repeat(63),
                        "r".repeat(100)
                    ),
                    i,
                )
            })
            .collect();
        let text = encode_objects(&units);
        let running = encode_running(&units.keys().cloned().collect());
        assert!(
            text.len() + running.len() < 200 * 1024,
            "both annotations: {} bytes",
            text.len() + running.len()
        );
        let decoded = decode_objects(&text);
        assert_eq!(decoded.len(), MAX_UNIT_OBJECTS);
        // The heaviest are the ones listed.
        assert_eq!(
            decoded.get(&running_key(units.keys().last().unwrap())),
            Some(&4999)
        );
        assert_eq!(
            decoded.values().min(),
            Some(&(5000 - MAX_UNIT_OBJECTS as u64))
        );
        let few: BTreeMap<String, u64> =
            [("p/a.b".to_owned(), 3), ("p/c.d#1/2".to_owned(), 0)].into();
        assert_eq!(
            decode_objects(&encode_objects(&few)),
            few.iter().map(|(u, c)| (running_key(u), *c)).collect()
        );
        for hostile in [
            "",
            "garbage",
            "abcdefgh=-1",
            "abc=4",
            "abcdefgh=99999999999999999999999",
            "abcdéfg=1",
            ",,,=,=",
        ] {
            assert!(decode_objects(hostile).is_empty(), "{hostile:?}");
        }
        let flood = "abcdefgh=1,".repeat(100_000);
        assert!(decode_objects(&flood).len() <= MAX_UNIT_OBJECTS);
    }

    #[test]
    fn next_moves_a_dead_owners_unit_only_when_no_other_member_runs_it() {
        // The owner `gone` is not live; whichever member the placement wants, the other live
        // member still reports running the unit: it waits, unassigned. Once nobody else runs it,
        // it goes to the wanted member, in an assignment of the current format.
        let units: BTreeSet<String> = ["u".to_owned()].into();
        let names: BTreeSet<String> = ["a".to_owned(), "b".to_owned()].into();
        let desired = placement(&units, &names)["u"].clone();
        let other = if desired == "a" { "b" } else { "a" };
        let current = Assignment {
            format: ASSIGNMENT_FORMAT,
            generation: 7,
            units: [("u".to_owned(), "gone".to_owned())].into(),
            ..Default::default()
        };
        let live: BTreeMap<String, Member> = [
            (desired.clone(), member(1, 7, &[])),
            (other.to_owned(), member(1, 7, &["u"])),
        ]
        .into();
        let out = next(&units, &live, &current, &BTreeMap::new());
        assert!(out.units.is_empty() && out.draining.is_empty(), "{out:?}");
        assert_eq!((out.format, out.generation), (ASSIGNMENT_FORMAT, 8));
        let live: BTreeMap<String, Member> = [
            (desired.clone(), member(1, 7, &[])),
            (other.to_owned(), member(1, 7, &[])),
        ]
        .into();
        let out = next(&units, &live, &current, &BTreeMap::new());
        assert_eq!(out.units.get("u"), Some(&desired));
    }

    #[test]
    fn a_drain_from_an_owner_that_lapsed_is_acknowledged_at_once() {
        // The unit drains from `a` (incarnation 1) since generation 5; `a` came back as
        // incarnation 2 — it fenced itself, so it runs nothing of the old one — and has not yet
        // observed generation 5. The drain is over: the unit goes to its new owner.
        let units: BTreeSet<String> = ["u".to_owned()].into();
        let names: BTreeSet<String> = ["a".to_owned(), "b".to_owned()].into();
        let desired = placement(&units, &names)["u"].clone();
        let from = if desired == "a" { "b" } else { "a" };
        let current = Assignment {
            format: ASSIGNMENT_FORMAT,
            generation: 5,
            draining: [(
                "u".to_owned(),
                Drain {
                    from: from.to_owned(),
                    incarnation: 1,
                    since: 5,
                },
            )]
            .into(),
            ..Default::default()
        };
        let live: BTreeMap<String, Member> = [
            (desired.clone(), member(1, 5, &[])),
            (from.to_owned(), member(2, 0, &[])),
        ]
        .into();
        let out = next(&units, &live, &current, &BTreeMap::new());
        assert_eq!(out.units.get("u"), Some(&desired), "{out:?}");
        // The same owner, same incarnation, not yet past the drain: it keeps draining.
        let live: BTreeMap<String, Member> = [
            (desired.clone(), member(1, 5, &[])),
            (from.to_owned(), member(1, 0, &[])),
        ]
        .into();
        let out = next(&units, &live, &current, &BTreeMap::new());
        assert!(
            out.units.is_empty() && out.draining.contains_key("u"),
            "{out:?}"
        );
    }

    #[test]
    fn a_swap_takes_the_pair_nearest_half_the_gap() {
        // a holds 10 + 7, b holds 0 + 3: the gap is 14. Swapping the 10 for the 3 moves exactly
        // half of it (7), and so does the 7 for the 0 — the first found, from the heaviest
        // member's units in name order, wins: one swap, 10 and 10.
        let members = set(&["a", "b"]);
        let weights: BTreeMap<&str, u64> = [("a10", 10), ("a7", 7), ("b0", 0), ("b3", 3)].into();
        let weight = |u: &str| weights.get(u).copied().unwrap_or_default();
        let start: BTreeMap<String, String> = [("a10", "a"), ("a7", "a"), ("b0", "b"), ("b3", "b")]
            .map(|(u, m)| (u.to_owned(), m.to_owned()))
            .into();
        let want: BTreeMap<String, String> = [("a10", "b"), ("a7", "a"), ("b0", "b"), ("b3", "a")]
            .map(|(u, m)| (u.to_owned(), m.to_owned()))
            .into();
        assert_eq!(swapped(start, &members, &weight), want);
    }

    #[test]
    fn overlaps_count_units_run_by_more_than_one_live_member() {
        let running = |pairs: &[(&str, &[&str])]| -> BTreeMap<String, BTreeSet<String>> {
            pairs
                .iter()
                .map(|(m, units)| {
                    (
                        (*m).to_owned(),
                        units.iter().map(|u| (*u).to_owned()).collect(),
                    )
                })
                .collect()
        };
        let live: BTreeSet<String> = ["a".to_owned(), "b".to_owned(), "c".to_owned()].into();
        let none = running(&[("a", &["u1"]), ("b", &["u2"])]);
        assert_eq!(overlaps(&live, &none), 0);
        let two = running(&[
            ("a", &["u1", "u2"]),
            ("b", &["u1"]),
            ("c", &["u2", "u3"]),
            ("dead", &["u3"]),
        ]);
        assert_eq!(
            overlaps(&live, &two),
            2,
            "u1 and u2; u3 only with a dead member"
        );
    }

    fn member(incarnation: u64, observed: u64, running: &[&str]) -> Member {
        Member {
            incarnation,
            observed,
            running: running.iter().map(|u| running_key(u)).collect(),
            objects: BTreeMap::new(),
        }
    }

    #[test]
    fn a_flood_of_related_units_never_pushes_an_api_out() {
        // #32.1: 3,000 Bindings with the longest names in one namespace, 20 APIs of a Connection
        // whose name sorts after them: every API unit is placed, the flood is capped.
        let long = "b".repeat(253);
        let flood: Vec<RelatedBinding> = (0..3000)
            .map(|i| RelatedBinding {
                namespace: Some("flood".into()),
                name: format!("{}{i:04}", &long[..249]),
                connection: "a".into(),
                allowed: true,
            })
            .collect();
        let admitted = related_admission(&flood, true, 16);
        let served: Vec<&Unit> = admitted.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(served.len(), 16);
        assert!(
            admitted
                .iter()
                .skip(16)
                .all(|r| r == &Err(NotServed::NamespaceFull { cap: 16 }))
        );
        let apis: Vec<String> = (0..20)
            .map(|i| format!("zz-later/widgets{i:02}.example.org"))
            .collect();
        let members: BTreeSet<String> = ["syncer-0".to_owned()].into();
        // Even uncapped, API units go first: the flood fills what is left.
        let uncapped: Vec<String> = related_admission(&flood, true, u32::MAX)
            .into_iter()
            .filter_map(Result::ok)
            .map(|u| u.to_string())
            .collect();
        let (kept, left_out) = fit(apis.iter().chain(&uncapped), &members);
        assert!(apis.iter().all(|a| kept.contains(a)));
        assert!(
            left_out > 0,
            "the flood was meant to overflow the assignment"
        );
    }

    #[test]
    fn a_binding_counts_for_related_admission_only_with_entries_and_an_allowing_ready_connection() {
        use crate::api::{BindingSpec, Connection, ConnectionSpec};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
        fn allowed(meta: &ObjectMeta, spec: &BindingSpec, c: Option<&Connection>) -> Option<bool> {
            RelatedBinding::of(meta, spec, c).map(|r| r.allowed)
        }
        let mut spec = BindingSpec::new("p", &["widgets.example.org"]);
        let in_t = ObjectMeta {
            name: Some("b".into()),
            namespace: Some("t".into()),
            ..Default::default()
        };
        let cluster_wide = ObjectMeta {
            name: Some("b".into()),
            ..Default::default()
        };
        let mut connection = Connection::new("p", ConnectionSpec::for_secret("kbind", "p"));
        // No entries: nothing to admit.
        assert_eq!(RelatedBinding::of(&in_t, &spec, Some(&connection)), None);
        spec.related_resources = serde_json::from_value(serde_json::json!([
            { "resource": "configmaps", "direction": "FromProvider" }
        ]))
        .unwrap();
        // Not Ready, or not found: counted, not allowed.
        assert_eq!(allowed(&in_t, &spec, Some(&connection)), Some(false));
        assert_eq!(allowed(&in_t, &spec, None), Some(false));
        let mut status = crate::api::ConnectionStatus::default();
        crate::conditions::set(
            &mut status.conditions,
            crate::conditions::Desired::new(
                crate::conditions::types::READY,
                true,
                "AsExpected",
                "",
            ),
            None,
            &Time(jiff::Timestamp::UNIX_EPOCH),
        );
        connection.status = Some(status);
        assert_eq!(allowed(&in_t, &spec, Some(&connection)), Some(true));
        connection.spec.access.binding_namespaces = Some(vec!["u".into()]);
        assert_eq!(allowed(&in_t, &spec, Some(&connection)), Some(false));
        // ClusterBindings may always use it.
        assert_eq!(allowed(&cluster_wide, &spec, Some(&connection)), Some(true));
    }

    #[test]
    fn related_admission_table() {
        let b = |ns: Option<&str>, name: &str, allowed: bool| RelatedBinding {
            namespace: ns.map(str::to_owned),
            name: name.into(),
            connection: "p".into(),
            allowed,
        };
        let bindings = [
            b(Some("t"), "c", true),
            b(Some("t"), "a", true),
            b(Some("t"), "b", false),
            b(Some("u"), "z", true),
            b(None, "cluster-1", true),
            b(None, "cluster-2", true),
            b(None, "cluster-3", true),
        ];
        let got: Vec<Result<String, NotServed>> = related_admission(&bindings, true, 1)
            .into_iter()
            .map(|r| r.map(|u| u.to_string()))
            .collect();
        let full = NotServed::NamespaceFull { cap: 1 };
        assert_eq!(
            got,
            vec![
                Err(full),
                Ok("p/binding:t/a".into()),
                Err(NotServed::NotAllowed),
                Ok("p/binding:u/z".into()),
                Ok("p/clusterbinding:cluster-1".into()),
                Ok("p/clusterbinding:cluster-2".into()),
                Ok("p/clusterbinding:cluster-3".into()),
            ]
        );
        assert!(
            related_admission(&bindings, false, 16)
                .iter()
                .all(|r| r == &Err(NotServed::Disabled))
        );
        let message = NotServed::NamespaceFull { cap: 1 }.message(Some("t"));
        assert!(
            message.contains("namespace t has more Bindings"),
            "{message}"
        );
        assert!(message.contains("the first 1 by name"), "{message}");
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
        let assignment = next(&kept, &live, &Assignment::default(), &BTreeMap::new());
        assert_eq!(assignment.units.len(), 5000);
        let text = assignment.encode();
        assert!(text.len() <= MAX_ASSIGNMENT_BYTES, "{} bytes", text.len());
        assert_eq!(Assignment::decode(&text).unwrap(), assignment);
        // 5000 units of the longest names: what fits is assigned, the rest is counted, and the
        // ConfigMap never exceeds the limit — not even if every unit were draining.
        let (kept, left_out) = fit(&units, &members);
        assert!(left_out > 0 && kept.len() + left_out == 5000);
        let assignment = next(&kept, &live, &Assignment::default(), &BTreeMap::new());
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
        let round1 = next(&units, &live(7, &[u.as_str()]), &current, &BTreeMap::new());
        assert_eq!(round1.generation, 8);
        assert!(!round1.units.contains_key(&u));
        assert_eq!(round1.draining[&u].since, 8);
        // The old owner has not applied generation 8 yet (even if it does not run the unit: it may
        // be about to start it from generation 7): still nobody's, and nothing changes.
        assert_eq!(
            next(&units, &live(7, &[]), &round1, &BTreeMap::new()),
            round1
        );
        // Applied, but still running: nobody's.
        assert_eq!(
            next(&units, &live(8, &[u.as_str()]), &round1, &BTreeMap::new()),
            round1
        );
        // Applied and stopped: now the new owner's, with its incarnation.
        let round2 = next(&units, &live(8, &[]), &round1, &BTreeMap::new());
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
        let next = next(&set(&[u.as_str()]), &live, &current, &BTreeMap::new());
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
        let next = next(&units, &live, &current, &BTreeMap::new());
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
