//! What to do with a binding's related Secrets and ConfigMaps (REFERENCE-BEHAVIOUR §13, REL-1 …
//! REL-7, with per-entry GC and conflict reporting): pure functions over plain data.

use std::collections::{BTreeMap, BTreeSet};

use kbind_shared::api::{
    ConflictPolicy, RelatedDirection, RelatedResource, RelatedResourceKind, RelatedSelector,
};
use kbind_shared::keys;
use kube::core::{Selector, SelectorExt};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

/// The payload fields a copy carries (REL-4).
pub const PAYLOAD_FIELDS: [&str; 5] = ["data", "stringData", "binaryData", "type", "immutable"];

/// A cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Side {
    /// The consumer (where the bindings live).
    Consumer,
    /// The provider.
    Provider,
}

impl Side {
    /// Lower-case name for messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Consumer => "consumer",
            Side::Provider => "provider",
        }
    }
}

/// (source side, target side) of a direction (REL-2).
pub fn sides(direction: RelatedDirection) -> (Side, Side) {
    match direction {
        RelatedDirection::FromProvider => (Side::Provider, Side::Consumer),
        RelatedDirection::FromConsumer => (Side::Consumer, Side::Provider),
    }
}

/// `Secret` or `ConfigMap`.
pub fn kind_name(kind: RelatedResourceKind) -> &'static str {
    match kind {
        RelatedResourceKind::Secrets => "Secret",
        RelatedResourceKind::Configmaps => "ConfigMap",
    }
}

/// Where a copy lives: kind, side, namespace, name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TargetKey {
    /// The kind.
    pub kind: KindKey,
    /// The cluster.
    pub side: Side,
    /// Namespace (copies keep the source's).
    pub namespace: String,
    /// Name (copies keep the source's).
    pub name: String,
}

impl std::fmt::Display for TargetKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}/{} on the {}",
            kind_name(self.kind.0),
            self.namespace,
            self.name,
            self.side.as_str()
        )
    }
}

/// [`RelatedResourceKind`] with an order, for map keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KindKey(pub RelatedResourceKind);

impl PartialOrd for KindKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for KindKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        kind_name(self.0).cmp(kind_name(other.0))
    }
}

/// A Secret or ConfigMap as copying sees it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Item {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID (a precondition for deletes).
    pub uid: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// The payload fields that are present ([`PAYLOAD_FIELDS`]).
    pub payload: Map<String, Value>,
}

impl Item {
    /// The UID of the binding whose copy this is, if it is one.
    pub fn copied_by(&self) -> Option<&str> {
        self.annotations
            .get(keys::RELATED_BINDING_ANNOTATION)
            .map(String::as_str)
    }

    /// Whether kbind took this object over (`Adopt`) rather than created it: never deleted.
    pub fn adopted(&self) -> bool {
        self.annotations
            .get(keys::RELATED_ADOPTED_ANNOTATION)
            .map(String::as_str)
            == Some(keys::TRUE)
    }
}

/// One `relatedResources` entry, checked.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Stable id from the entry's content: what copies record.
    pub id: String,
    /// The kind.
    pub kind: RelatedResourceKind,
    /// Which way.
    pub direction: RelatedDirection,
    selector: Selector,
    names: BTreeSet<String>,
    /// The namespaces it is limited to (a ClusterBinding's `namespaces`; empty: all).
    namespaces: BTreeSet<String>,
    /// Whether it selects by names or by at least one label requirement (not "everything").
    narrowed: bool,
}

impl Entry {
    /// Checks an entry; an invalid label selector is an error naming the entry. `cluster_wide`:
    /// the entry is a ClusterBinding's, whose `namespaces` apply (a Binding's scope is its own
    /// namespace).
    pub fn parse(
        index: usize,
        entry: &RelatedResource,
        cluster_wide: bool,
    ) -> Result<Self, String> {
        let RelatedSelector {
            label_selector,
            names,
        } = entry.selector.clone().unwrap_or_default();
        let label_selector = label_selector.unwrap_or_default();
        let invalid = |why: String| {
            format!("relatedResources[{index}].selector.labelSelector is invalid: {why}")
        };
        for (key, value) in label_selector.match_labels.iter().flatten() {
            check_label_key(key).map_err(invalid)?;
            check_label_value(value).map_err(invalid)?;
        }
        for requirement in label_selector.match_expressions.iter().flatten() {
            check_label_key(&requirement.key).map_err(invalid)?;
            let values = requirement.values.as_deref().unwrap_or_default();
            match requirement.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(invalid(format!(
                        "operator {} on key {:?} needs at least one value",
                        requirement.operator, requirement.key
                    )));
                }
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(invalid(format!(
                        "operator {} on key {:?} takes no values",
                        requirement.operator, requirement.key
                    )));
                }
                "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
                other => {
                    return Err(invalid(format!(
                        "unknown operator {other:?} (use In, NotIn, Exists or DoesNotExist)"
                    )));
                }
            }
            for value in values {
                check_label_value(value).map_err(invalid)?;
            }
        }
        let narrowed = !names.is_empty()
            || label_selector
                .match_labels
                .as_ref()
                .is_some_and(|m| !m.is_empty())
            || label_selector
                .match_expressions
                .as_ref()
                .is_some_and(|e| !e.is_empty());
        let selector = Selector::try_from(label_selector).map_err(|e| invalid(e.to_string()))?;
        Ok(Self {
            narrowed,
            id: entry_id(entry),
            kind: entry.resource,
            direction: entry.direction,
            selector,
            names: names.into_iter().collect(),
            namespaces: if cluster_wide {
                entry.namespaces.iter().cloned().collect()
            } else {
                BTreeSet::new()
            },
        })
    }

    /// REL-3: the label selector (everything when omitted), when names are given the name, and
    /// when namespaces are given the namespace.
    pub fn selects(&self, labels: &BTreeMap<String, String>, namespace: &str, name: &str) -> bool {
        self.selector.matches(labels)
            && (self.names.is_empty() || self.names.contains(name))
            && (self.namespaces.is_empty() || self.namespaces.contains(namespace))
    }

    /// Whether the entry names its namespaces itself (then the provider's copies may land there).
    pub fn lists_namespaces(&self) -> bool {
        !self.namespaces.is_empty()
    }

    /// The namespaces it is limited to (empty: all).
    pub fn namespaces(&self) -> &BTreeSet<String> {
        &self.namespaces
    }
}

/// Reason when an entry asks for what the Connection does not allow.
pub const NOT_ALLOWED: &str = "NotAllowed";

/// Safe by default: an entry copying Secrets to the provider (`FromConsumer`) needs the
/// Connection's `spec.access.secretsToProvider`, and in a ClusterBinding (`cluster_wide`) a
/// selector — names or labels — so that no Secret of the cluster leaves unless chosen on purpose.
pub fn check_access(
    entries: &[Entry],
    secrets_to_provider: bool,
    connection: &str,
    cluster_wide: bool,
) -> Result<(), String> {
    let named = |pick: &dyn Fn(&Entry) -> bool| -> Vec<String> {
        entries
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                e.kind == RelatedResourceKind::Secrets
                    && e.direction == RelatedDirection::FromConsumer
                    && pick(e)
            })
            .map(|(i, _)| format!("relatedResources[{i}]"))
            .collect()
    };
    let outgoing = named(&|_| true);
    if !secrets_to_provider && !outgoing.is_empty() {
        return Err(format!(
            "{} would copy Secrets to the provider, which Connection {connection} does not allow (spec.access.secretsToProvider); nothing was copied",
            outgoing.join(", ")
        ));
    }
    let unselected = named(&|e| cluster_wide && !e.narrowed);
    if !unselected.is_empty() {
        return Err(format!(
            "{} would copy every Secret of the cluster to the provider; in a ClusterBinding, Secrets going to the provider must be selected by names or labels (spec.relatedResources[].selector); nothing was copied",
            unselected.join(", ")
        ));
    }
    Ok(())
}

/// Namespaces no related copy is ever read from or written to, on either side: `kube-*`, kbind's
/// own namespace and the provider-Secret namespaces (where Connections' kubeconfigs live). A
/// provider cannot plant objects there, and no Secret there leaves the consumer.
#[derive(Debug, Clone, Default)]
pub struct Fence {
    protected: BTreeSet<String>,
}

impl Fence {
    /// The fence for kbind's namespace `own` and the provider-Secret namespaces.
    pub fn new<'a>(
        own: &str,
        provider_secret_namespaces: impl IntoIterator<Item = &'a String>,
    ) -> Self {
        let mut protected: BTreeSet<String> =
            provider_secret_namespaces.into_iter().cloned().collect();
        protected.insert(own.to_owned());
        Self { protected }
    }

    /// Whether `namespace` is protected.
    pub fn protects(&self, namespace: &str) -> bool {
        namespace.starts_with("kube-") || self.protected.contains(namespace)
    }

    /// Splits `wanted` into the copies that may be made and those the fence refuses (copies keep
    /// their source's namespace, so one check covers the source and the target).
    pub fn split(
        &self,
        wanted: BTreeMap<TargetKey, Wanted>,
    ) -> (BTreeMap<TargetKey, Wanted>, Vec<TargetKey>) {
        let (refused, kept): (BTreeMap<TargetKey, Wanted>, BTreeMap<TargetKey, Wanted>) = wanted
            .into_iter()
            .partition(|(k, _)| self.protects(&k.namespace));
        (kept, refused.into_keys().collect())
    }
}

/// Where the provider's objects may land on the consumer for a ClusterBinding: a copy made by a
/// `FromProvider` entry goes only into a namespace that one of its entries lists, or that holds at
/// least one object of the binding's bound APIs (`occupied`). A Binding's copies stay in its own
/// namespace and need no such check. In a Connection's boundary (#51) the provider is read only
/// where the binding's copies may be, so a `FromConsumer` copy lands by the same rule (`in_boundary`).
/// Returns the copies that may be made and those refused.
pub fn landing(
    entries: &[Entry],
    wanted: BTreeMap<TargetKey, Wanted>,
    occupied: &BTreeSet<String>,
    in_boundary: bool,
) -> (BTreeMap<TargetKey, Wanted>, Vec<TargetKey>) {
    let listing: BTreeSet<&str> = entries
        .iter()
        .filter(|e| e.lists_namespaces())
        .map(|e| e.id.as_str())
        .collect();
    let (kept, refused): (BTreeMap<TargetKey, Wanted>, BTreeMap<TargetKey, Wanted>) =
        wanted.into_iter().partition(|(key, want)| {
            (key.side != Side::Consumer && !in_boundary)
                || occupied.contains(&key.namespace)
                || want.entries.iter().any(|id| listing.contains(id.as_str()))
        });
    (kept, refused.into_keys().collect())
}

/// `"; 2 object(s) in protected namespaces … were not copied: …"` (at most three named), else
/// empty.
pub fn fenced_note(refused: &[TargetKey]) -> String {
    left_out_note(
        refused,
        "in protected namespaces (kube-*, kbind's own and the provider-Secret namespaces)",
    )
}

/// `"; 2 object(s) in namespaces … were not copied: …"` for the provider objects [`landing`]
/// refused, else empty.
pub fn homeless_note(refused: &[TargetKey]) -> String {
    left_out_note(
        refused,
        "in namespaces that hold none of the binding's objects and that no entry lists (spec.relatedResources[].namespaces)",
    )
}

/// `"; <n> object(s) <why> were not copied: <up to three>"`, else empty.
pub fn left_out_note(refused: &[TargetKey], why: &str) -> String {
    if refused.is_empty() {
        return String::new();
    }
    let named: Vec<String> = refused.iter().take(3).map(ToString::to_string).collect();
    let more = if refused.len() > 3 { ", …" } else { "" };
    format!(
        "; {} object(s) {why} were not copied: {}{more}",
        refused.len(),
        named.join(", ")
    )
}

/// Reason (`RelatedResourcesSynced=False`) when an entry selects more than its limits copy.
pub const TOO_MANY_OBJECTS: &str = "TooManyObjects";

/// Bounds on what one `relatedResources` entry copies (#32.2): a provider (or a namespace) with
/// thousands of matching objects, or huge ones, cannot make kbind write without bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyLimits {
    /// Copies per entry.
    pub copies_per_entry: usize,
    /// Payload bytes (compact JSON) per entry, all its copies together.
    pub bytes_per_entry: usize,
}

impl Default for CopyLimits {
    fn default() -> Self {
        Self {
            copies_per_entry: 500,
            bytes_per_entry: 16 << 20,
        }
    }
}

impl CopyLimits {
    /// The note naming what the limits left out.
    pub fn note(&self, refused: &[TargetKey]) -> String {
        left_out_note(
            refused,
            &format!(
                "over an entry's limits ({} copies, {} MiB)",
                self.copies_per_entry,
                self.bytes_per_entry >> 20
            ),
        )
    }

    /// Splits `wanted` into the copies within every entry's limits and those over them, in
    /// target order (stable: the same objects stay in from pass to pass). A copy counts against
    /// each entry that selects it.
    pub fn split(
        &self,
        wanted: BTreeMap<TargetKey, Wanted>,
    ) -> (BTreeMap<TargetKey, Wanted>, Vec<TargetKey>) {
        let mut used: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        let mut kept = BTreeMap::new();
        let mut refused = Vec::new();
        for (key, want) in wanted {
            let size = serde_json::to_vec(&want.payload).map_or(usize::MAX, |v| v.len());
            let fits = want.entries.iter().all(|e| {
                let (copies, bytes) = used.get(e).copied().unwrap_or_default();
                copies < self.copies_per_entry && bytes.saturating_add(size) <= self.bytes_per_entry
            });
            if !fits {
                refused.push(key);
                continue;
            }
            for e in &want.entries {
                let entry = used.entry(e.clone()).or_default();
                entry.0 += 1;
                entry.1 = entry.1.saturating_add(size);
            }
            kept.insert(key, want);
        }
        (kept, refused)
    }
}

/// A short, stable id of an entry's content (kind, direction, selector).
pub fn entry_id(entry: &RelatedResource) -> String {
    let mut text = json!({
        "resource": entry.resource,
        "direction": entry.direction,
        "selector": entry.selector,
    });
    // Listed namespaces change the id; entries without them keep the ids they always had.
    if !entry.namespaces.is_empty() {
        text["namespaces"] = json!(entry.namespaces);
    }
    let text = text.to_string();
    let digest = Sha256::digest(text.as_bytes());
    digest[..4].iter().map(|b| format!("{b:02x}")).collect()
}

fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && (prefix.is_empty()
            || prefix.len() > 253
            || !prefix
                .split('.')
                .all(|part| !part.is_empty() && is_dns_label(part)))
    {
        return Err(format!("key {key:?} has an invalid prefix"));
    }
    if name.is_empty() || name.len() > 63 || !is_label_text(name) {
        return Err(format!(
            "key {key:?} must be 1–63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric"
        ));
    }
    Ok(())
}

fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || (value.len() <= 63 && is_label_text(value)) {
        Ok(())
    } else {
        Err(format!(
            "value {value:?} must be at most 63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric"
        ))
    }
}

fn is_label_text(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn is_dns_label(text: &str) -> bool {
    let bytes = text.as_bytes();
    text.len() <= 63
        && bytes
            .first()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && bytes
            .last()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

/// A copy kbind wants to exist.
#[derive(Debug, Clone, PartialEq)]
pub struct Wanted {
    /// The entries that select its source.
    pub entries: BTreeSet<String>,
    /// The source's payload.
    pub payload: Map<String, Value>,
}

/// REL-3 for every entry: the copies that should exist, by target. `sources` gives the objects of
/// one kind on one side (already limited to the binding's scope). kbind's own copies are never
/// sources, so that two opposite entries cannot copy back and forth.
pub fn wanted<'s>(
    entries: &[Entry],
    sources: impl Fn(RelatedResourceKind, Side) -> Vec<&'s Item>,
) -> BTreeMap<TargetKey, Wanted> {
    let mut out: BTreeMap<TargetKey, Wanted> = BTreeMap::new();
    for entry in entries {
        let (from, to) = sides(entry.direction);
        for source in sources(entry.kind, from) {
            if source.copied_by().is_some()
                || !entry.selects(&source.labels, &source.namespace, &source.name)
            {
                continue;
            }
            let key = TargetKey {
                kind: KindKey(entry.kind),
                side: to,
                namespace: source.namespace.clone(),
                name: source.name.clone(),
            };
            out.entry(key)
                .or_insert_with(|| Wanted {
                    entries: BTreeSet::new(),
                    payload: source.payload.clone(),
                })
                .entries
                .insert(entry.id.clone());
        }
    }
    out
}

/// `"; relatedResources[1] selects nothing"` for entries that select no source yet (a typo in a
/// name or label is then visible on the binding), else empty.
pub fn unmatched_note(entries: &[Entry], wanted: &BTreeMap<TargetKey, Wanted>) -> String {
    let used: BTreeSet<&str> = wanted
        .values()
        .flat_map(|w| w.entries.iter().map(String::as_str))
        .collect();
    let unmatched: Vec<String> = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| !used.contains(e.id.as_str()))
        .map(|(i, _)| format!("relatedResources[{i}]"))
        .collect();
    match unmatched.as_slice() {
        [] => String::new(),
        [one] => format!("; {one} selects nothing"),
        many => format!("; {} select nothing", many.join(", ")),
    }
}

/// The identity a copy carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker<'a> {
    /// The binding's UID.
    pub binding_uid: &'a str,
    /// The consumer cluster's identity.
    pub local_uid: &'a str,
    /// The record of the Connection's heartbeat Lease (`kbind_shared::heartbeat::record`).
    pub heartbeat: &'a str,
}

/// REL-4: the object applied for a copy: namespace and name, kbind's label and annotations only,
/// and the source's payload.
/// `adopted` keeps the mark of an object kbind took over rather than created.
pub fn copy_body(key: &TargetKey, wanted: &Wanted, marker: &Marker<'_>, adopted: bool) -> Value {
    let mut annotations = annotations(wanted, marker);
    if adopted {
        annotations.insert(keys::RELATED_ADOPTED_ANNOTATION, keys::TRUE.to_owned());
    }
    let mut body = json!({
        "apiVersion": "v1",
        "kind": kind_name(key.kind.0),
        "metadata": {
            "name": key.name,
            "namespace": key.namespace,
            "labels": labels(key.side, marker),
            "annotations": annotations,
        },
    });
    for (field, value) in &wanted.payload {
        body[field.as_str()] = value.clone();
    }
    body
}

/// kbind's labels on a copy: managed; on the provider also the consumer cluster's UID, which
/// the provider-side target watch selects by — another consumer's copies are never read (#50.5).
fn labels(side: Side, marker: &Marker<'_>) -> BTreeMap<&'static str, String> {
    let mut labels = BTreeMap::from([(keys::MANAGED_LABEL, keys::TRUE.to_owned())]);
    if side == Side::Provider {
        labels.insert(
            keys::CONSUMER_CLUSTER_UID_LABEL,
            marker.local_uid.to_owned(),
        );
    }
    labels
}

fn annotations(wanted: &Wanted, marker: &Marker<'_>) -> BTreeMap<&'static str, String> {
    [
        (
            keys::CONSUMER_CLUSTER_UID_ANNOTATION,
            marker.local_uid.to_owned(),
        ),
        (
            keys::RELATED_BINDING_ANNOTATION,
            marker.binding_uid.to_owned(),
        ),
        (
            keys::RELATED_ENTRIES_ANNOTATION,
            wanted.entries.iter().cloned().collect::<Vec<_>>().join(","),
        ),
        (keys::HEARTBEAT_ANNOTATION, marker.heartbeat.to_owned()),
    ]
    .into()
}

/// What to do for one wanted copy, given the target that exists (if any).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The copy is up to date.
    Nothing,
    /// Nothing exists under the name: create the copy, create-only (something that appeared
    /// meanwhile is classified on the next pass, never forced over).
    Create,
    /// Update our copy with server-side apply.
    Apply,
    /// Take over an unmarked provider object (`conflictPolicy: Adopt`): it is updated from now on
    /// but, not being kbind's creation, never deleted.
    Adopt,
    /// Our copy is immutable (or changes its Secret type) and its payload changed: delete it (with
    /// its UID as precondition) and create it again.
    Replace,
    /// The target exists and is not ours to change; leave it (conflictPolicy Fail, a consumer
    /// object kbind did not create, another binding's copy, an adopted immutable object).
    Conflict(String),
}

/// REL-4 decided, with conflicts reported (PGAP-12) instead of skipped silently. Safe by
/// default: a consumer object kbind did not create is never taken over, whatever the policy.
pub fn step(
    existing: Option<&Item>,
    target_side: Side,
    wanted: &Wanted,
    marker: &Marker<'_>,
    policy: ConflictPolicy,
) -> Step {
    let Some(existing) = existing else {
        return Step::Create;
    };
    match existing.copied_by() {
        Some(uid) if uid == marker.binding_uid => {}
        Some(_) => {
            return Step::Conflict("is a copy made by another binding".to_owned());
        }
        None if target_side == Side::Consumer => {
            return Step::Conflict(
                "exists without kbind's markers (kbind never takes over a consumer object it did not create)"
                    .to_owned(),
            );
        }
        None if policy == ConflictPolicy::Fail => {
            return Step::Conflict(
                "exists without kbind's markers (conflictPolicy Fail)".to_owned(),
            );
        }
        None => return Step::Adopt,
    }
    let payload_same = PAYLOAD_FIELDS
        .iter()
        .all(|f| *f == "stringData" || existing.payload.get(*f) == wanted.payload.get(*f));
    // A copy the Go konnector wrote has no per-entry record (#37): adopted as it is — the record
    // is informational (garbage is decided from what the entries want) and is written with the
    // copy's next change, never as a write of its own.
    let go_copy = !existing
        .annotations
        .contains_key(keys::RELATED_ENTRIES_ANNOTATION);
    let meta_same = labels(target_side, marker)
        .iter()
        .all(|(k, v)| existing.labels.get(*k) == Some(v))
        && annotations(wanted, marker).iter().all(|(k, v)| {
            existing.annotations.get(*k) == Some(v)
                || (go_copy && *k == keys::RELATED_ENTRIES_ANNOTATION)
                // A copy written before copies recorded their Connection's heartbeat gets the
                // record with its next change, never as a write of its own.
                || (*k == keys::HEARTBEAT_ANNOTATION
                    && !existing.annotations.contains_key(keys::HEARTBEAT_ANNOTATION))
        });
    if payload_same && meta_same {
        return Step::Nothing;
    }
    let immutable = existing.payload.get("immutable") == Some(&Value::Bool(true));
    let type_changes = existing.payload.get("type").is_some()
        && existing.payload.get("type") != wanted.payload.get("type");
    match (
        !payload_same && (immutable || type_changes),
        existing.adopted(),
    ) {
        (true, false) => Step::Replace,
        (true, true) => Step::Conflict(
            "is immutable and was adopted, not created, by kbind, so it is not replaced".to_owned(),
        ),
        (false, _) => Step::Apply,
    }
}

/// REL-5 per entry: our copies (by binding UID) that no entry wants any more. `targets` are the
/// labelled objects of one kind on one side. Only what kbind created is ever garbage: an adopted
/// object stays.
pub fn garbage<'t>(
    kind: RelatedResourceKind,
    side: Side,
    targets: impl IntoIterator<Item = &'t Item>,
    wanted: &BTreeMap<TargetKey, Wanted>,
    binding_uid: &str,
) -> Vec<&'t Item> {
    targets
        .into_iter()
        .filter(|t| t.copied_by() == Some(binding_uid) && !t.adopted())
        .filter(|t| {
            !wanted.contains_key(&TargetKey {
                kind: KindKey(kind),
                side,
                namespace: t.namespace.clone(),
                name: t.name.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

    fn entry(
        kind: RelatedResourceKind,
        direction: RelatedDirection,
        labels: &[(&str, &str)],
        names: &[&str],
    ) -> RelatedResource {
        RelatedResource {
            namespaces: Vec::new(),
            group: String::new(),
            resource: kind,
            direction,
            selector: Some(RelatedSelector {
                label_selector: (!labels.is_empty()).then(|| LabelSelector {
                    match_labels: Some(
                        labels
                            .iter()
                            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                            .collect(),
                    ),
                    ..Default::default()
                }),
                names: names.iter().map(|n| (*n).to_owned()).collect(),
            }),
        }
    }

    fn item(namespace: &str, name: &str, labels: &[(&str, &str)], data: &str) -> Item {
        Item {
            namespace: namespace.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            annotations: BTreeMap::new(),
            payload: json!({ "data": { "k": data } })
                .as_object()
                .cloned()
                .unwrap(),
        }
    }

    const SECRETS: RelatedResourceKind = RelatedResourceKind::Secrets;
    /// `entry_id` of a Secrets entry from the provider naming `a`, as kbind has always computed it.
    const PINNED_ID_OF_A: &str = "64882456";
    const CONFIGMAPS: RelatedResourceKind = RelatedResourceKind::Configmaps;
    const MARKER: Marker<'static> = Marker {
        binding_uid: "b-1",
        local_uid: "consumer-1",
        heartbeat: "kbind/provider-consumer-1",
    };

    fn parse(entries: &[RelatedResource]) -> Vec<Entry> {
        entries
            .iter()
            .enumerate()
            .map(|(i, e)| Entry::parse(i, e, true).unwrap())
            .collect()
    }

    #[test]
    fn label_selector_and_names_must_both_match() {
        let entries = parse(&[entry(
            SECRETS,
            RelatedDirection::FromProvider,
            &[("app", "db")],
            &["a", "b"],
        )]);
        let sources = [
            item("ns", "a", &[("app", "db")], "1"),
            item("ns", "b", &[("app", "web")], "2"),
            item("ns", "c", &[("app", "db")], "3"),
        ];
        let wanted = wanted(&entries, |kind, side| {
            assert_eq!((kind, side), (SECRETS, Side::Provider));
            sources.iter().collect()
        });
        let names: Vec<_> = wanted.keys().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["a"]);
        let key = wanted.keys().next().unwrap();
        assert_eq!(key.side, Side::Consumer);
    }

    #[test]
    fn an_empty_selector_selects_everything_in_scope_but_never_kbinds_own_copies() {
        let entries = parse(&[RelatedResource {
            namespaces: Vec::new(),
            group: String::new(),
            resource: SECRETS,
            direction: RelatedDirection::FromConsumer,
            selector: None,
        }]);
        let mut copy = item("ns", "copy", &[], "x");
        copy.annotations
            .insert(keys::RELATED_BINDING_ANNOTATION.into(), "b-9".into());
        let sources = [item("ns", "a", &[], "1"), copy];
        let wanted = wanted(&entries, |_, _| sources.iter().collect());
        assert_eq!(
            wanted.keys().map(|k| k.name.as_str()).collect::<Vec<_>>(),
            ["a"]
        );
    }

    #[test]
    fn two_entries_of_one_kind_keep_each_others_copies() {
        // LIM-18 / REL-5: the reference let these delete each other's copies.
        let entries = parse(&[
            entry(SECRETS, RelatedDirection::FromProvider, &[], &["a"]),
            entry(SECRETS, RelatedDirection::FromProvider, &[], &["b"]),
        ]);
        let sources = [item("ns", "a", &[], "1"), item("ns", "b", &[], "2")];
        let wanted = wanted(&entries, |_, _| sources.iter().collect());
        assert_eq!(wanted.len(), 2);
        let mut targets: Vec<Item> = ["a", "b", "gone"]
            .iter()
            .map(|n| {
                let mut t = item("ns", n, &[], "1");
                t.annotations
                    .insert(keys::RELATED_BINDING_ANNOTATION.into(), "b-1".into());
                t
            })
            .collect();
        // Someone else's copy is never ours to collect.
        let mut foreign = item("ns", "other", &[], "1");
        foreign
            .annotations
            .insert(keys::RELATED_BINDING_ANNOTATION.into(), "b-2".into());
        targets.push(foreign);
        let garbage = garbage(SECRETS, Side::Consumer, &targets, &wanted, "b-1");
        assert_eq!(
            garbage.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
            ["gone"]
        );
    }

    #[test]
    fn removing_an_entry_makes_its_copies_garbage() {
        // REL-6 improved: with the entry gone nothing wants the copy.
        let mut copy = item("ns", "a", &[], "1");
        copy.annotations
            .insert(keys::RELATED_BINDING_ANNOTATION.into(), "b-1".into());
        let garbage = garbage(SECRETS, Side::Consumer, [&copy], &BTreeMap::new(), "b-1");
        assert_eq!(garbage.len(), 1);
    }

    #[test]
    fn copies_carry_only_kbinds_label_and_annotations_and_the_payload() {
        let entries = parse(&[entry(
            SECRETS,
            RelatedDirection::FromProvider,
            &[("app", "db")],
            &[],
        )]);
        let mut source = item("ns", "a", &[("app", "db")], "1");
        source.payload.insert("type".into(), json!("Opaque"));
        source.payload.insert("immutable".into(), json!(true));
        source
            .annotations
            .insert("secret-annotation".into(), "x".into());
        let sources = [source];
        let wanted = wanted(&entries, |_, _| sources.iter().collect());
        let (key, want) = wanted.iter().next().unwrap();
        let body = copy_body(key, want, &MARKER, false);
        assert_eq!(
            copy_body(key, want, &MARKER, true)["metadata"]["annotations"]["core.kbind.io/related-adopted"],
            "true"
        );
        // On the provider, the consumer cluster's label too: its target watch selects by it.
        let on_provider = TargetKey {
            side: Side::Provider,
            ..key.clone()
        };
        assert_eq!(
            copy_body(&on_provider, want, &MARKER, false)["metadata"]["labels"],
            json!({ "core.kbind.io/managed": "true", "core.kbind.io/consumer-cluster-uid": "consumer-1" })
        );
        assert_eq!(
            body,
            json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": "a",
                    "namespace": "ns",
                    "labels": { "core.kbind.io/managed": "true" },
                    "annotations": {
                        "core.kbind.io/consumer-cluster-uid": "consumer-1",
                        "core.kbind.io/related-binding": "b-1",
                        "core.kbind.io/related-entries": entries[0].id,
                        "core.kbind.io/heartbeat": "kbind/provider-consumer-1",
                    },
                },
                "data": { "k": "1" },
                "type": "Opaque",
                "immutable": true,
            })
        );
    }

    fn ours(wanted: &Wanted, data: &str) -> Item {
        let mut t = item(
            "ns",
            "a",
            &[
                (keys::MANAGED_LABEL, keys::TRUE),
                (keys::CONSUMER_CLUSTER_UID_LABEL, MARKER.local_uid),
            ],
            data,
        );
        for (k, v) in annotations(wanted, &MARKER) {
            t.annotations.insert(k.to_owned(), v);
        }
        t
    }

    #[test]
    fn steps_write_only_what_differs_and_report_conflicts() {
        let want = Wanted {
            entries: ["e1".to_owned()].into(),
            payload: json!({ "data": { "k": "1" } })
                .as_object()
                .cloned()
                .unwrap(),
        };
        let (fail, adopt) = (ConflictPolicy::Fail, ConflictPolicy::Adopt);
        let (consumer, provider) = (Side::Consumer, Side::Provider);
        let unmarked = item("ns", "a", &[], "1");
        let (current, drifted) = (ours(&want, "1"), ours(&want, "2"));
        let mut frozen = ours(&want, "2");
        frozen.payload.insert("immutable".into(), json!(true));
        let mut adopted = ours(&want, "2");
        adopted
            .annotations
            .insert(keys::RELATED_ADOPTED_ANNOTATION.into(), keys::TRUE.into());
        let mut adopted_frozen = adopted.clone();
        adopted_frozen
            .payload
            .insert("immutable".into(), json!(true));
        let mut theirs = ours(&want, "1");
        theirs
            .annotations
            .insert(keys::RELATED_BINDING_ANNOTATION.into(), "b-2".into());
        // Managed and current, but a marker annotation (the entries it serves) is stale.
        let mut stale_marker = ours(&want, "1");
        stale_marker
            .annotations
            .insert(keys::RELATED_ENTRIES_ANNOTATION.into(), "e0".into());
        // A data change with the same Secret type, or onto a copy without one: applied in place.
        let mut typed = ours(&want, "2");
        typed.payload.insert("type".into(), json!("Opaque"));
        let mut typed_want = want.clone();
        typed_want.payload.insert("type".into(), json!("Opaque"));
        let untyped = ours(&typed_want, "2");
        // A type change cannot be applied: replaced.
        let mut retyped = ours(&typed_want, "2");
        retyped
            .payload
            .insert("type".into(), json!("kubernetes.io/tls"));
        let mut unlabelled = ours(&want, "1");
        unlabelled.labels.remove(keys::CONSUMER_CLUSTER_UID_LABEL);
        let conflict = Step::Conflict(String::new());
        // (existing, target side, policy) → step; any Conflict matches `conflict`.
        let cases: Vec<(Option<&Item>, Side, ConflictPolicy, Step)> = vec![
            // Absent: created, create-only.
            (None, consumer, fail, Step::Create),
            (None, provider, adopt, Step::Create),
            // Ours and current: nothing; drift is repaired.
            (Some(&current), consumer, fail, Step::Nothing),
            (Some(&current), provider, fail, Step::Nothing),
            // A provider copy without the consumer cluster's label (written before it, or by the
            // Go konnector): the label is applied, once; the consumer side needs none.
            (Some(&unlabelled), provider, fail, Step::Apply),
            (Some(&unlabelled), consumer, fail, Step::Nothing),
            (Some(&drifted), provider, fail, Step::Apply),
            // An immutable copy is replaced, not left stale — unless kbind only adopted it.
            (Some(&frozen), consumer, fail, Step::Replace),
            (Some(&adopted), provider, adopt, Step::Apply),
            (Some(&adopted_frozen), provider, adopt, conflict.clone()),
            // Unmarked: a conflict under Fail; under Adopt taken over on the provider only.
            (Some(&unmarked), provider, fail, conflict.clone()),
            (Some(&unmarked), provider, adopt, Step::Adopt),
            (Some(&unmarked), consumer, fail, conflict.clone()),
            (Some(&unmarked), consumer, adopt, conflict.clone()),
            // Another binding's copy is never taken, whatever the policy.
            (Some(&theirs), provider, adopt, conflict.clone()),
            (Some(&theirs), consumer, adopt, conflict.clone()),
        ];
        let typed_cases = [
            (&typed, Step::Apply),
            (&untyped, Step::Apply),
            (&retyped, Step::Replace),
        ];
        for (existing, want_step) in typed_cases {
            let got = step(Some(existing), provider, &typed_want, &MARKER, fail);
            assert_eq!(got, want_step, "{existing:?}");
        }
        assert_eq!(
            step(Some(&stale_marker), provider, &want, &MARKER, fail),
            Step::Apply
        );
        // The Go konnector's copy (#37): no per-entry record. Current: adopted without a write;
        // its payload changed: applied (the record with it).
        let mut go_copy = ours(&want, "1");
        go_copy.annotations.remove(keys::RELATED_ENTRIES_ANNOTATION);
        assert_eq!(
            step(Some(&go_copy), provider, &want, &MARKER, fail),
            Step::Nothing
        );
        go_copy.payload.insert("data".into(), json!({ "k": "2" }));
        assert_eq!(
            step(Some(&go_copy), provider, &want, &MARKER, fail),
            Step::Apply
        );
        // A copy from before copies recorded their Connection's heartbeat: current without a
        // write of its own; one recording another heartbeat: applied.
        let mut unrecorded = ours(&want, "1");
        unrecorded.annotations.remove(keys::HEARTBEAT_ANNOTATION);
        assert_eq!(
            step(Some(&unrecorded), provider, &want, &MARKER, fail),
            Step::Nothing
        );
        unrecorded
            .annotations
            .insert(keys::HEARTBEAT_ANNOTATION.into(), "elsewhere/x".into());
        assert_eq!(
            step(Some(&unrecorded), provider, &want, &MARKER, fail),
            Step::Apply
        );
        for (existing, side, policy, want_step) in cases {
            let got = step(existing, side, &want, &MARKER, policy);
            match (&got, &want_step) {
                (Step::Conflict(_), Step::Conflict(_)) => {}
                _ => assert_eq!(got, want_step, "{existing:?} {side:?} {policy:?}"),
            }
        }
        let Step::Conflict(why) = step(Some(&unmarked), consumer, &want, &MARKER, adopt) else {
            unreachable!()
        };
        assert!(why.contains("never takes over a consumer object"), "{why}");
    }

    #[test]
    fn secrets_go_to_the_provider_only_when_the_connection_allows_it() {
        let entry = |kind, direction| RelatedResource {
            namespaces: Vec::new(),
            group: String::new(),
            resource: kind,
            direction,
            selector: Default::default(),
        };
        let entries = parse(&[
            entry(SECRETS, RelatedDirection::FromProvider),
            entry(CONFIGMAPS, RelatedDirection::FromConsumer),
        ]);
        assert!(check_access(&entries, false, "p", true).is_ok());
        let entries = parse(&[
            entry(CONFIGMAPS, RelatedDirection::FromConsumer),
            entry(SECRETS, RelatedDirection::FromConsumer),
        ]);
        assert_eq!(
            check_access(&entries, false, "p", false).unwrap_err(),
            "relatedResources[1] would copy Secrets to the provider, which Connection p does not allow (spec.access.secretsToProvider); nothing was copied"
        );
        assert!(check_access(&entries, true, "p", false).is_ok());
    }

    #[test]
    fn a_cluster_binding_sends_secrets_only_when_it_selects_them() {
        // #32.5: (case, selector, cluster-wide, allowed)
        let by_label = RelatedSelector {
            label_selector: Some(LabelSelector {
                match_labels: Some([("app".to_owned(), "db".to_owned())].into()),
                ..Default::default()
            }),
            names: vec![],
        };
        let by_name = RelatedSelector {
            label_selector: None,
            names: vec!["db".into()],
        };
        let everything = RelatedSelector {
            label_selector: Some(LabelSelector::default()),
            names: vec![],
        };
        let cases = [
            ("no selector, ClusterBinding", None, true, false),
            (
                "empty label selector, ClusterBinding",
                Some(everything.clone()),
                true,
                false,
            ),
            ("labels, ClusterBinding", Some(by_label), true, true),
            ("names, ClusterBinding", Some(by_name), true, true),
            ("no selector, Binding (its namespace)", None, false, true),
            (
                "empty label selector, Binding",
                Some(everything),
                false,
                true,
            ),
        ];
        for (case, selector, cluster_wide, allowed) in cases {
            let entries = parse(&[RelatedResource {
                namespaces: Vec::new(),
                group: String::new(),
                resource: SECRETS,
                direction: RelatedDirection::FromConsumer,
                selector,
            }]);
            let result = check_access(&entries, true, "p", cluster_wide);
            assert_eq!(result.is_ok(), allowed, "{case}: {result:?}");
        }
        // ConfigMaps and Secrets from the provider need no selector.
        let entries = parse(&[
            RelatedResource {
                namespaces: Vec::new(),
                group: String::new(),
                resource: CONFIGMAPS,
                direction: RelatedDirection::FromConsumer,
                selector: None,
            },
            RelatedResource {
                namespaces: Vec::new(),
                group: String::new(),
                resource: SECRETS,
                direction: RelatedDirection::FromProvider,
                selector: None,
            },
        ]);
        assert!(check_access(&entries, true, "p", true).is_ok());
    }

    #[test]
    fn each_entry_copies_a_bounded_number_of_objects_and_bytes() {
        // #32.2
        let key = |name: &str| TargetKey {
            kind: KindKey(SECRETS),
            side: Side::Consumer,
            namespace: "team-a".into(),
            name: name.into(),
        };
        let want = |entries: &[&str], bytes: usize| Wanted {
            entries: entries.iter().map(|e| (*e).to_owned()).collect(),
            payload: [("data".to_owned(), json!({ "v": "x".repeat(bytes) }))]
                .into_iter()
                .collect(),
        };
        let limits = CopyLimits {
            copies_per_entry: 3,
            bytes_per_entry: 1000,
        };
        // Five copies of entry e1: the first three (in target order) fit.
        let wanted: BTreeMap<TargetKey, Wanted> = (0..5)
            .map(|i| (key(&format!("s{i}")), want(&["e1"], 10)))
            .collect();
        let (kept, refused) = limits.split(wanted);
        assert_eq!(kept.len(), 3);
        let names: Vec<&str> = refused.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["s3", "s4"]);
        // Bytes: 600 + 600 exceeds 1000; a copy of another entry still fits; a copy selected by
        // both entries counts against both.
        let wanted: BTreeMap<TargetKey, Wanted> = [
            (key("a"), want(&["e1"], 600)),
            (key("b"), want(&["e1"], 600)),
            (key("c"), want(&["e2"], 600)),
            (key("d"), want(&["e2", "e3"], 300)),
        ]
        .into_iter()
        .collect();
        let (kept, refused) = limits.split(wanted);
        let kept: Vec<&str> = kept.keys().map(|k| k.name.as_str()).collect();
        assert_eq!(kept, ["a", "c", "d"]);
        assert_eq!(refused.len(), 1);
        assert!(
            limits
                .note(&refused)
                .contains("over an entry's limits (3 copies, 0 MiB)")
        );
    }

    #[test]
    fn protected_namespaces_are_never_sources_or_targets() {
        // #32.4, #32.5
        let fence = Fence::new("kbind-system", &["secrets".to_owned()]);
        let key = |side, namespace: &str| TargetKey {
            kind: KindKey(SECRETS),
            side,
            namespace: namespace.into(),
            name: "x".into(),
        };
        let want = Wanted {
            entries: ["e1".to_owned()].into(),
            payload: Map::new(),
        };
        let wanted: BTreeMap<TargetKey, Wanted> = [
            key(Side::Consumer, "team-a"),
            key(Side::Consumer, "kube-system"),
            key(Side::Consumer, "kbind-system"),
            key(Side::Provider, "secrets"),
            key(Side::Provider, "kube-public"),
            key(Side::Provider, "kubernetes-dashboard"),
        ]
        .into_iter()
        .map(|k| (k, want.clone()))
        .collect();
        let (kept, refused) = fence.split(wanted);
        let kept: Vec<&str> = kept.keys().map(|k| k.namespace.as_str()).collect();
        assert_eq!(kept, ["team-a", "kubernetes-dashboard"]);
        assert_eq!(refused.len(), 4);
        let note = fenced_note(&refused);
        assert!(
            note.starts_with("; 4 object(s) in protected namespaces"),
            "{note}"
        );
        assert!(note.ends_with(", …"), "{note}");
        assert_eq!(fenced_note(&[]), "");
    }

    #[test]
    fn a_cluster_bindings_provider_objects_land_only_where_it_has_objects_or_lists_namespaces() {
        // #32.4: the provider does not choose where its objects land.
        let mut open = entry(CONFIGMAPS, RelatedDirection::FromProvider, &[], &[]);
        let mut listed = entry(SECRETS, RelatedDirection::FromProvider, &[], &[]);
        listed.namespaces = vec!["team-b".into()];
        let outgoing = entry(CONFIGMAPS, RelatedDirection::FromConsumer, &[], &[]);
        let entries = parse(&[open.clone(), listed.clone(), outgoing]);
        let provider = [
            item("team-a", "cm", &[], "1"),
            item("team-b", "cm", &[], "1"),
            item("team-c", "cm", &[], "1"),
        ];
        let consumer = [item("team-z", "local", &[], "1")];
        let copies = wanted(&entries, |_, side| match side {
            Side::Provider => provider.iter().collect(),
            Side::Consumer => consumer.iter().collect(),
        });
        let occupied: BTreeSet<String> = ["team-a".to_owned()].into();
        let (in_boundary, _) = landing(&entries, copies.clone(), &occupied, true);
        let (kept, refused) = landing(&entries, copies, &occupied, false);
        // In a boundary the copy to the provider in team-z (no object of the binding there, no
        // entry lists it) is refused too.
        assert_eq!(in_boundary.len(), kept.len() - 1);
        assert!(in_boundary.keys().all(|k| k.namespace != "team-z"));
        let kept: Vec<String> = kept.keys().map(ToString::to_string).collect();
        let refused: Vec<String> = refused.iter().map(ToString::to_string).collect();
        // The ConfigMaps entry lands in team-a only (the binding's objects are there); the
        // Secrets entry lists team-b and reads nothing else; what goes to the provider is not
        // this rule's business.
        assert_eq!(
            kept,
            [
                TargetKey {
                    kind: KindKey(CONFIGMAPS),
                    side: Side::Consumer,
                    namespace: "team-a".into(),
                    name: "cm".into()
                }
                .to_string(),
                TargetKey {
                    kind: KindKey(CONFIGMAPS),
                    side: Side::Provider,
                    namespace: "team-z".into(),
                    name: "local".into()
                }
                .to_string(),
                TargetKey {
                    kind: KindKey(SECRETS),
                    side: Side::Consumer,
                    namespace: "team-b".into(),
                    name: "cm".into()
                }
                .to_string(),
            ]
        );
        assert_eq!(refused.len(), 2, "{refused:?}");
        assert!(
            refused
                .iter()
                .all(|r| r.contains("team-b") || r.contains("team-c"))
        );
        assert!(homeless_note(&[]).is_empty());
        // Nothing occupied, nothing listed: nothing lands.
        let entries = parse(&[open.clone()]);
        let copies = wanted(&entries, |_, _| provider.iter().collect());
        let (kept, refused) = landing(&entries, copies, &BTreeSet::new(), false);
        assert!(kept.is_empty());
        assert_eq!(refused.len(), 3);
        // In a Binding the namespaces are ignored (its scope is its own namespace).
        open.namespaces = vec!["elsewhere".into()];
        let in_binding = Entry::parse(0, &open, false).unwrap();
        assert!(in_binding.selects(&BTreeMap::new(), "team-a", "cm"));
        let in_cluster_binding = Entry::parse(0, &open, true).unwrap();
        assert!(!in_cluster_binding.selects(&BTreeMap::new(), "team-a", "cm"));
        assert!(in_cluster_binding.selects(&BTreeMap::new(), "elsewhere", "cm"));
        // Listing namespaces changes an entry's id; an entry without them keeps its old id.
        assert_ne!(
            entry_id(&listed),
            entry_id(&entry(SECRETS, RelatedDirection::FromProvider, &[], &[]))
        );
    }

    #[test]
    fn adopted_objects_are_never_garbage() {
        let want = Wanted {
            entries: ["e1".to_owned()].into(),
            payload: Map::new(),
        };
        let created = ours(&want, "1");
        let mut adopted = ours(&want, "1");
        adopted.name = "b".into();
        adopted
            .annotations
            .insert(keys::RELATED_ADOPTED_ANNOTATION.into(), keys::TRUE.into());
        let garbage = garbage(
            SECRETS,
            Side::Provider,
            [&created, &adopted],
            &BTreeMap::new(),
            "b-1",
        );
        assert_eq!(garbage, vec![&created]);
    }

    #[test]
    fn invalid_selectors_are_refused_with_the_entry_named() {
        let bad = |requirement: LabelSelectorRequirement| RelatedResource {
            namespaces: Vec::new(),
            group: String::new(),
            resource: SECRETS,
            direction: RelatedDirection::FromProvider,
            selector: Some(RelatedSelector {
                label_selector: Some(LabelSelector {
                    match_expressions: Some(vec![requirement]),
                    ..Default::default()
                }),
                names: Vec::new(),
            }),
        };
        for (operator, key, values) in [
            ("Equals", "app", None),
            ("In", "app", None),
            ("Exists", "app", Some(vec!["x".to_owned()])),
            ("Exists", "bad key!", None),
            ("In", "app", Some(vec!["no spaces".to_owned()])),
        ] {
            let error = Entry::parse(
                3,
                &bad(LabelSelectorRequirement {
                    key: key.into(),
                    operator: operator.into(),
                    values,
                }),
                true,
            )
            .unwrap_err();
            assert!(
                error.starts_with("relatedResources[3].selector.labelSelector is invalid"),
                "{error}"
            );
        }
        assert!(
            Entry::parse(
                0,
                &bad(LabelSelectorRequirement {
                    key: "example.org/tier".into(),
                    operator: "NotIn".into(),
                    values: Some(vec!["db".into()]),
                }),
                true,
            )
            .is_ok()
        );
    }

    #[test]
    fn label_keys_and_values_follow_the_api_servers_rules() {
        let label = "a".repeat(63);
        // Three 63-character labels, one of 61 and their dots: exactly 253 characters.
        let prefix = |last: usize| format!("{label}.{label}.{label}.{}", "b".repeat(last));
        // (key, valid?)
        let keys = [
            ("app", true),
            ("example.com/app", true),
            ("a.b-c.d9/x_y.Z", true),
            (&*format!("{label}/x"), true),
            (&*format!("{}/x", prefix(61)), true),
            (&*format!("{}/x", prefix(62)), false),
            (&*format!("{label}a.com/x"), false),
            (&*label, true),
            (&*format!("{label}a"), false),
            ("/app", false),
            ("Example.com/app", false),
            ("ex..com/app", false),
            ("-ex.com/app", false),
            ("ex-.com/app", false),
            ("ex_ample.com/app", false),
            ("example.com/", false),
            ("-app", false),
            ("app-", false),
            ("a b", false),
        ];
        for (key, valid) in keys {
            assert_eq!(check_label_key(key).is_ok(), valid, "key {key:?}");
        }
        let values = [
            ("", true),
            ("v1.2_x-y", true),
            (&*label, true),
            (&*format!("{label}a"), false),
            ("-v", false),
            ("v ", false),
        ];
        for (value, valid) in values {
            assert_eq!(check_label_value(value).is_ok(), valid, "value {value:?}");
        }
    }

    #[test]
    fn operators_say_what_their_values_lack_and_narrowing_is_what_the_entry_names() {
        let with = |requirement: Option<LabelSelectorRequirement>,
                    labels: Option<&[(&str, &str)]>| {
            RelatedResource {
                namespaces: Vec::new(),
                group: String::new(),
                resource: SECRETS,
                direction: RelatedDirection::FromProvider,
                selector: Some(RelatedSelector {
                    label_selector: Some(LabelSelector {
                        match_expressions: requirement.map(|r| vec![r]),
                        match_labels: labels.map(|l| {
                            l.iter()
                                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                                .collect()
                        }),
                    }),
                    names: Vec::new(),
                }),
            }
        };
        let requirement = |operator: &str, values: Option<Vec<String>>| LabelSelectorRequirement {
            key: "app".into(),
            operator: operator.into(),
            values,
        };
        let error = |r| Entry::parse(0, &with(Some(r), None), true).unwrap_err();
        assert!(error(requirement("In", None)).contains("needs at least one value"));
        assert!(error(requirement("NotIn", Some(Vec::new()))).contains("needs at least one value"));
        assert!(error(requirement("Exists", Some(vec!["x".into()]))).contains("takes no values"));
        assert!(error(requirement("Equals", None)).contains("unknown operator"));
        // Narrowed: by names, or by at least one label requirement — an empty matchLabels is not.
        let narrowed = |e: &RelatedResource| Entry::parse(0, e, true).unwrap().narrowed;
        assert!(narrowed(&with(None, Some(&[("app", "x")]))));
        assert!(!narrowed(&with(None, Some(&[]))));
        assert!(narrowed(&with(Some(requirement("Exists", None)), None)));
        assert!(!narrowed(&with(None, None)));
        assert!(narrowed(&entry(
            SECRETS,
            RelatedDirection::FromProvider,
            &[],
            &["a"]
        )));
    }

    #[test]
    fn names_orders_and_notes_of_what_was_left_out() {
        assert_eq!(
            (Side::Consumer.as_str(), Side::Provider.as_str()),
            ("consumer", "provider")
        );
        let (secrets, config_maps) = (KindKey(SECRETS), KindKey(RelatedResourceKind::Configmaps));
        assert_eq!(
            config_maps.partial_cmp(&secrets),
            Some(std::cmp::Ordering::Less)
        );
        let key = |name: &str| TargetKey {
            kind: secrets,
            side: Side::Provider,
            namespace: "ns".into(),
            name: name.into(),
        };
        let three = [key("a"), key("b"), key("c")];
        assert_eq!(
            left_out_note(&three, "somewhere"),
            "; 3 object(s) somewhere were not copied: Secret ns/a on the provider, Secret ns/b on the provider, Secret ns/c on the provider"
        );
        let four = [key("a"), key("b"), key("c"), key("d")];
        assert!(left_out_note(&four, "somewhere").ends_with("ns/c on the provider, …"));
        assert!(homeless_note(&three[..1]).starts_with(
            "; 1 object(s) in namespaces that hold none of the binding's objects and that no entry lists"
        ));
        assert_eq!(homeless_note(&[]), "");
    }

    #[test]
    fn entries_that_select_nothing_are_named() {
        let entries = parse(&[
            entry(SECRETS, RelatedDirection::FromProvider, &[], &["a"]),
            entry(SECRETS, RelatedDirection::FromProvider, &[], &["typo"]),
        ]);
        let sources = [item("ns", "a", &[], "1")];
        let wanted = wanted(&entries, |_, _| sources.iter().collect());
        assert_eq!(
            unmatched_note(&entries, &wanted),
            "; relatedResources[1] selects nothing"
        );
        assert_eq!(unmatched_note(&entries[..1], &wanted), "");
    }

    #[test]
    fn entry_ids_follow_the_entry_content() {
        let a = entry(SECRETS, RelatedDirection::FromProvider, &[], &["a"]);
        let b = entry(SECRETS, RelatedDirection::FromProvider, &[], &["b"]);
        assert_eq!(entry_id(&a), entry_id(&a.clone()));
        assert_ne!(entry_id(&a), entry_id(&b));
        assert_eq!(entry_id(&a).len(), 8);
        // Entries without namespaces keep the ids they always had (copies record them).
        assert_eq!(entry_id(&a), PINNED_ID_OF_A);
        let mut listed = a.clone();
        listed.namespaces = vec!["team-a".into()];
        assert_ne!(entry_id(&listed), entry_id(&a));
    }
}
