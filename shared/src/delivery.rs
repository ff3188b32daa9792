//! Per-object delivery, visible with `kubectl get`: `status.kbindSync` on each synced consumer
//! object says which generation of its spec reached the provider and when — or, if the provider
//! refused it, why. The schema manager adds the field and printer columns to the CRDs it installs
//! ([`status_schema`], [`printer_columns`]); the syncer writes the record in the status write a
//! change already causes ([`with_record`]). Pure functions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde_json::{Value, json};

/// The status field kbind owns on consumer objects.
pub const FIELD: &str = "kbindSync";
/// The generation in `generation` reached the provider at `time`.
pub const SYNCED: &str = "Synced";
/// The provider's validation or admission refused the current spec (`message` says why).
pub const REJECTED: &str = "Rejected";
/// kbind's credential may not write the provider copy (`message` says what).
pub const FORBIDDEN: &str = "Forbidden";
/// The current spec has not reached the provider yet and kbind is retrying (`message` says why:
/// the provider did not answer, answered with an error, or still holds a terminating copy).
pub const PENDING: &str = "Pending";
/// The user paused the object (its `core.kbind.io/paused` annotation, or its binding's
/// `spec.suspend`): kbind writes neither its spec nor its status (`message` says which).
pub const PAUSED: &str = "Paused";
/// An imported object not claimed yet (observe-first import, #54): its spec and status mirror
/// the provider's, and kbind writes nothing to the provider for it (`message` says how to claim).
pub const OBSERVED: &str = "Observed";
/// Why a provider refused a write, from its API server's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// RBAC: kbind's credential may not make the request.
    Forbidden,
    /// Validation or admission (a webhook, a ValidatingAdmissionPolicy, a quota) said no.
    Rejected,
}

impl Refusal {
    /// The delivery record's `state`.
    pub fn state(self) -> &'static str {
        match self {
            Refusal::Forbidden => FORBIDDEN,
            Refusal::Rejected => REJECTED,
        }
    }

    /// The reason of the Warning Event the syncer records on the consumer object for it (once
    /// per refusal): what `kubectl kbind diff` looks for as the last refusal.
    pub fn event_reason(self) -> &'static str {
        match self {
            Refusal::Forbidden => "Forbidden",
            Refusal::Rejected => "ProviderRejected",
        }
    }

    /// Every refusal.
    pub const ALL: [Refusal; 2] = [Refusal::Forbidden, Refusal::Rejected];
}

/// Tells an API server's refusal apart by what it says, not by its code alone: admission
/// webhooks answer 403 by default (and 400 or any code they choose), quota and admission
/// policies answer 403 too, while RBAC's 403 always reads `… is forbidden: User "…" cannot …`
/// (the authorizer's own wording). `None`: not a refusal (a conflict, an outage, …).
pub fn refusal(code: u16, message: &str) -> Option<Refusal> {
    let rbac = message.contains("User \"") && message.contains(" cannot ");
    match code {
        403 if rbac && !message.contains("denied the request") => Some(Refusal::Forbidden),
        400 | 403 | 422 => Some(Refusal::Rejected),
        _ => None,
    }
}

/// The longest `message` kept.
pub const MAX_MESSAGE: usize = 300;

/// The schema of [`FIELD`], added to a consumer CRD's `status`.
pub fn status_schema() -> Value {
    json!({
        "type": "object",
        "description": "Written by kbind: which generation of this object's spec reached the provider, when, and why not if not.",
        "properties": {
            "generation": { "type": "integer", "format": "int64", "description": "The metadata.generation whose spec the provider has." },
            "state": { "type": "string", "description": "Synced, Pending, Rejected or Forbidden: where the current generation's spec stands once kbind has tried to deliver it (generation says which generation the provider has); Paused, a routing hold, or Observed (imported from the provider, not claimed)." },
            "time": { "type": "string", "format": "date-time", "description": "When kbind last wrote the spec to the provider." },
            "message": { "type": "string", "maxLength": 400, "description": "Why the current spec did not reach the provider." },
            "since": { "type": "string", "format": "date-time", "description": "When the change that has not reached the provider was made (as the consumer's API server recorded it, to the second)." },
        },
    })
}

/// kbind's printer columns: `kubectl get` shows, beside the provider's columns, the spec's
/// generation next to the generation the provider has — the user's own write of a change flips
/// the pair, with no write by kbind — and the state of the last delivery attempt (`-o wide` adds
/// the message and since when the change waits).
pub fn printer_columns() -> Vec<Value> {
    vec![
        json!({ "name": "Generation", "type": "integer", "jsonPath": ".metadata.generation", "description": "The spec's generation" }),
        json!({ "name": "Synced-Generation", "type": "integer", "jsonPath": ".status.kbindSync.generation", "description": "The generation the provider has: the current spec reached the provider only when this equals Generation" }),
        json!({ "name": "Delivery", "type": "string", "jsonPath": ".status.kbindSync.state", "description": "Synced, or why the current spec has not reached the provider: Pending, Rejected, Forbidden, Paused, a routing hold, or Observed (imported, not claimed)" }),
        json!({ "name": "Delivered", "type": "date", "jsonPath": ".status.kbindSync.time", "description": "When kbind last wrote the spec to the provider" }),
        json!({ "name": "Route", "type": "string", "jsonPath": ".metadata.annotations.core\\.kbind\\.io/route", "description": "The route (Connection/provider cluster) the object is pinned to, when several Connections serve its API; empty: the Connection serving the CRD" }),
        json!({ "name": "Message", "type": "string", "jsonPath": ".status.kbindSync.message", "priority": 1, "description": "Why the spec did not reach the provider" }),
        json!({ "name": "Waiting-Since", "type": "date", "jsonPath": ".status.kbindSync.since", "priority": 1, "description": "How long the undelivered change has waited" }),
        json!({ "name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp" }),
    ]
}

/// When kbind's field manager last wrote the provider copy (its `managedFields` entry), as the
/// API server recorded it.
pub fn applied_at(copy: &ObjectMeta) -> Option<String> {
    applied_time(copy).map(|t| t.0.to_string())
}

/// The time of kbind's field manager's `managedFields` entry, as [`applied_at`] states it.
pub fn applied_time(copy: &ObjectMeta) -> Option<&Time> {
    copy.managed_fields
        .as_ref()?
        .iter()
        .find(|f| f.manager.as_deref() == Some(crate::keys::FIELD_MANAGER))
        .and_then(|f| f.time.as_ref())
}

/// The record of a delivered generation.
pub fn delivered(generation: Option<i64>, time: Option<String>) -> Value {
    json!({ "state": SYNCED, "generation": generation, "time": time })
}

/// The record of a spec that did not reach the provider — refused ([`REJECTED`], [`FORBIDDEN`])
/// or [`PENDING`] — with why, and `since` when the change was made; the last delivered
/// generation and time kept.
pub fn refused(current: Option<&Value>, state: &str, message: &str, since: Option<&Time>) -> Value {
    let keep = |key: &str| kept(current, key);
    json!({
        "state": state,
        "generation": keep("generation"),
        "time": keep("time"),
        "message": crate::conditions::bounded(&crate::redact::remote(message), MAX_MESSAGE),
        "since": since.map(|t| t.0.to_string()),
    })
}

/// `key` of the record `current`, if it has one: what a new record keeps of the last delivery.
fn kept(current: Option<&Value>, key: &str) -> Value {
    current
        .and_then(|c| c.get(key))
        .cloned()
        .unwrap_or(Value::Null)
}

/// The record of a paused object: why (`message`), with the last delivered generation and time
/// kept — and no `since`: nothing waits for delivery, the user stopped it.
pub fn paused(current: Option<&Value>, message: &str) -> Value {
    let keep = |key: &str| kept(current, key);
    json!({
        "state": PAUSED,
        "generation": keep("generation"),
        "time": keep("time"),
        "message": crate::conditions::bounded(message, MAX_MESSAGE),
    })
}

/// The record of an imported object not claimed yet ([`OBSERVED`]): no generation reached the
/// provider from this consumer, nothing waits.
pub fn observed() -> Value {
    json!({
        "state": OBSERVED,
        "message": format!(
            "imported from the provider and read-only: annotate {}=true to take it over",
            crate::keys::CLAIM_ANNOTATION
        ),
    })
}

/// When the consumer object's current spec was last changed, as its API server recorded it (to
/// the second): the newest `managedFields` time of a manager that owns a field of `spec`, or —
/// for an object no such entry describes — its creation. Status writes (kbind's record, the
/// provider's status) and metadata-only managers do not count.
pub fn changed_at(meta: &ObjectMeta) -> Option<Time> {
    let spec_change = meta
        .managed_fields
        .iter()
        .flatten()
        .filter(|f| f.subresource.as_deref().unwrap_or_default().is_empty())
        .filter(|f| {
            f.fields_v1
                .as_ref()
                .and_then(|v| v.0.get("f:spec"))
                .is_some()
        })
        .filter_map(|f| f.time.clone())
        .max_by_key(|t| t.0);
    match (spec_change, meta.creation_timestamp.clone()) {
        (Some(a), Some(b)) => Some(if a.0 >= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// When the provider object's status was last written, as its API server recorded it (to the
/// second): the newest `managedFields` time of a `status` subresource entry.
pub fn status_changed_at(meta: &ObjectMeta) -> Option<Time> {
    meta.managed_fields
        .iter()
        .flatten()
        .filter(|f| f.subresource.as_deref() == Some("status"))
        .filter_map(|f| f.time.clone())
        .max_by_key(|t| t.0)
}

/// A time as an API server records it — whole seconds since the Unix epoch — in 8 bytes (a
/// [`Time`] takes 16, its option 24): what the syncer's caches keep per object. The epoch's own
/// second is not representable (no object is that old).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Seconds(std::num::NonZeroI64);

impl Seconds {
    /// `time`, to the second (an API server's times have no finer part).
    pub fn of(time: &Time) -> Option<Self> {
        std::num::NonZeroI64::new(time.0.as_second()).map(Seconds)
    }

    /// As a [`Time`].
    pub fn time(self) -> Time {
        Time(jiff::Timestamp::from_second(self.0.get()).unwrap_or_default())
    }

    /// As a timestamp.
    pub fn timestamp(self) -> jiff::Timestamp {
        self.time().0
    }
}

/// What the syncer's cache keeps of a consumer object's delivery record: enough to tell, without
/// parsing its status again, whether the object waits and since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The record's state.
    pub state: State,
    /// The generation the provider has (generations start at 1).
    pub generation: Option<std::num::NonZeroI64>,
    /// When the waiting change was made (`since`), if the record says.
    pub since: Option<Seconds>,
}

/// A record's `state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// [`SYNCED`].
    Synced,
    /// [`PENDING`].
    Pending,
    /// [`REJECTED`].
    Rejected,
    /// [`FORBIDDEN`].
    Forbidden,
    /// [`PAUSED`].
    Paused,
    /// A routing reason ([`crate::routing::Reason`]): written to no provider, and why (#36).
    Held,
    /// [`OBSERVED`].
    Observed,
    /// Anything else (written by someone else).
    Other,
}

/// The summary of the record in a consumer `status`, if it has one.
pub fn summary(status: Option<&Value>) -> Option<Summary> {
    let record = record_of(status)?;
    let state = match record.get("state").and_then(Value::as_str) {
        Some(SYNCED) => State::Synced,
        Some(PENDING) => State::Pending,
        Some(REJECTED) => State::Rejected,
        Some(FORBIDDEN) => State::Forbidden,
        Some(PAUSED) => State::Paused,
        Some(OBSERVED) => State::Observed,
        Some(held) if crate::routing::Reason::parse(held).is_some() => State::Held,
        _ => State::Other,
    };
    Some(Summary {
        state,
        generation: record
            .get("generation")
            .and_then(Value::as_i64)
            .and_then(std::num::NonZeroI64::new),
        since: record
            .get("since")
            .cloned()
            .and_then(|v| serde_json::from_value::<Time>(v).ok())
            .and_then(|t| Seconds::of(&t)),
    })
}

/// The consumer status kbind wants: the provider's status (an object, or none) with `record` as
/// [`FIELD`]. Nulls are left out, so that the record compares equal to what the API server
/// stores.
pub fn with_record(provider_status: Option<&Value>, record: &Value) -> Value {
    let mut status = match provider_status {
        Some(Value::Object(map)) => map.clone(),
        _ => serde_json::Map::new(),
    };
    let record: serde_json::Map<String, Value> = record
        .as_object()
        .map(|r| {
            r.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    status.insert(FIELD.to_owned(), Value::Object(record));
    Value::Object(status)
}

/// Every field a record may have ([`status_schema`]).
pub const RECORD_FIELDS: [&str; 5] = ["generation", "state", "time", "message", "since"];

/// How long a change may wait undelivered while its record still says [`SYNCED`] for an older
/// generation: after this, the record says [`PENDING`] ([`awaiting`]), written once and only
/// for a change still undelivered then — a change delivered sooner costs no write for it.
pub const PENDING_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// The record of a change that has not reached the provider after [`PENDING_AFTER`]: queued
/// behind others, or written and not answered yet (a provider that hangs or cannot be reached).
pub fn awaiting(current: Option<&Value>, since: Option<&Time>) -> Value {
    refused(
        current,
        PENDING,
        "not delivered yet: waiting for its turn, or for the provider to answer",
        since,
    )
}

/// Makes the `status` merge `patch` set kbind's record whole, when it touches the record at
/// all: every field of `record`, and a null for each field it lacks. The patch is a diff
/// against the object as a cache saw it, and a record written meanwhile (a [`PENDING`] record
/// written while a delivery was under way) must not survive in the fields the diff left out.
pub fn set_record_whole(patch: &mut Value, record: Option<&Value>) {
    let (Some(patch), Some(Value::Object(record))) = (patch.as_object_mut(), record) else {
        return;
    };
    if !patch.contains_key(FIELD) {
        return;
    }
    let whole: serde_json::Map<String, Value> = RECORD_FIELDS
        .iter()
        .map(|k| {
            (
                (*k).to_owned(),
                record.get(*k).cloned().unwrap_or(Value::Null),
            )
        })
        .chain(
            record
                .iter()
                .filter(|(k, _)| !RECORD_FIELDS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone())),
        )
        .collect();
    patch.insert(FIELD.to_owned(), Value::Object(whole));
}

/// The record in a consumer status, if any.
pub fn record_of(status: Option<&Value>) -> Option<&Value> {
    status.and_then(|s| s.get(FIELD))
}

/// Whether the two statuses differ in anything but kbind's record.
pub fn differs_beyond_record(a: Option<&Value>, b: Option<&Value>) -> bool {
    let strip = |s: Option<&Value>| match s {
        Some(Value::Object(map)) => {
            let mut map = map.clone();
            map.remove(FIELD);
            map
        }
        _ => serde_json::Map::new(),
    };
    strip(a) != strip(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_told_apart_by_what_the_api_server_says() {
        // #33.2: real API server answers (kube-apiserver 1.3x wording).
        let cases = [
            // RBAC: the authorizer's message.
            (
                403,
                r#"widgets.example.org "w" is forbidden: User "system:serviceaccount:kbind:p" cannot create resource "widgets" in API group "example.org" in the namespace "team-a""#,
                Some(Refusal::Forbidden),
            ),
            (
                403,
                r#"widgets.example.org is forbidden: User "alice" cannot list resource "widgets" in API group "example.org" at the cluster scope"#,
                Some(Refusal::Forbidden),
            ),
            // A validating webhook's denial: 403 by default, any code it sets.
            (
                403,
                r#"admission webhook "deny.example.org" denied the request: size must be below 100"#,
                Some(Refusal::Rejected),
            ),
            (
                400,
                r#"admission webhook "deny.example.org" denied the request: bad size"#,
                Some(Refusal::Rejected),
            ),
            // A webhook quoting a user and "cannot" is still a webhook.
            (
                403,
                r#"admission webhook "deny.example.org" denied the request: User "bob" cannot own this"#,
                Some(Refusal::Rejected),
            ),
            // ValidatingAdmissionPolicy with reason Forbidden; and its default, Invalid.
            (
                403,
                r#"widgets.example.org "w" is forbidden: ValidatingAdmissionPolicy 'small' with binding 'small' denied request: too big"#,
                Some(Refusal::Rejected),
            ),
            (
                422,
                r#"widgets.example.org "w" is invalid: ValidatingAdmissionPolicy 'small' with binding 'small' denied request: too big"#,
                Some(Refusal::Rejected),
            ),
            // Schema validation.
            (
                422,
                r#"Widget.example.org "w" is invalid: spec.size: Invalid value: 50: spec.size in body should be less than or equal to 10"#,
                Some(Refusal::Rejected),
            ),
            // Quota.
            (
                403,
                r#"widgets.example.org "w" is forbidden: exceeded quota: q, requested: count/widgets.example.org=1, used: count/widgets.example.org=1, limited: count/widgets.example.org=1"#,
                Some(Refusal::Rejected),
            ),
            // Not refusals.
            (409, "Operation cannot be fulfilled", None),
            (
                500,
                r#"Internal error occurred: failed calling webhook "down.example.org""#,
                None,
            ),
            (404, "not found", None),
        ];
        for (code, message, want) in cases {
            assert_eq!(refusal(code, message), want, "{code} {message}");
        }
        assert_eq!(Refusal::Forbidden.state(), FORBIDDEN);
        assert_eq!(Refusal::Rejected.state(), REJECTED);
    }
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};

    #[test]
    fn a_change_is_dated_by_the_manager_that_changed_the_spec() {
        let at = |second: i64| Time(jiff::Timestamp::from_second(second).unwrap());
        let entry =
            |manager: &str, sub: Option<&str>, fields: Value, second: i64| ManagedFieldsEntry {
                manager: Some(manager.into()),
                subresource: sub.map(Into::into),
                fields_v1: Some(FieldsV1(fields)),
                time: Some(at(second)),
                ..Default::default()
            };
        let spec = json!({ "f:spec": { "f:size": {} } });
        let meta = |entries: Vec<ManagedFieldsEntry>| ObjectMeta {
            creation_timestamp: Some(at(100)),
            managed_fields: Some(entries),
            ..Default::default()
        };
        // Created, never changed since: the creation.
        assert_eq!(changed_at(&meta(vec![])), Some(at(100)));
        assert_eq!(
            changed_at(&meta(vec![entry("kubectl", None, spec.clone(), 100)])),
            Some(at(100))
        );
        // The newest spec owner's time; status writes and metadata-only writes do not count.
        let entries = vec![
            entry("kubectl", None, spec.clone(), 150),
            entry("ci", None, json!({ "f:spec": { "f:colour": {} } }), 200),
            entry("kbind", Some("status"), json!({ "f:status": {} }), 300),
            entry(
                "labeller",
                None,
                json!({ "f:metadata": { "f:labels": {} } }),
                400,
            ),
            entry(
                "kbind",
                None,
                json!({ "f:metadata": { "f:finalizers": {} } }),
                500,
            ),
        ];
        assert_eq!(changed_at(&meta(entries.clone())), Some(at(200)));
        // The status's own time: its newest status entry.
        assert_eq!(status_changed_at(&meta(entries)), Some(at(300)));
        assert_eq!(status_changed_at(&meta(vec![])), None);
        assert_eq!(changed_at(&ObjectMeta::default()), None);
    }

    #[test]
    fn a_patch_that_touches_the_record_sets_it_whole() {
        let synced = json!({ "state": SYNCED, "generation": 2, "time": "2026-12-06T00:00:02Z" });
        let cases = [
            // The cache saw Synced 1; a Pending record was written meanwhile: the diff alone
            // would leave its state, message and since.
            (
                json!({ "kbindSync": { "generation": 2, "time": "2026-12-06T00:00:02Z" } }),
                Some(
                    json!({ "state": SYNCED, "generation": 2, "time": "2026-12-06T00:00:02Z",
                             "message": null, "since": null }),
                ),
            ),
            // A patch of the provider's status alone leaves the record be.
            (json!({ "phase": "Ready" }), None),
        ];
        for (patch, want) in cases {
            let mut patch = patch;
            set_record_whole(&mut patch, Some(&synced));
            assert_eq!(patch.get(FIELD).cloned(), want, "{patch}");
        }
        let mut untouched = json!({ "kbindSync": { "state": PENDING } });
        set_record_whole(&mut untouched, None);
        assert_eq!(untouched, json!({ "kbindSync": { "state": PENDING } }));
    }

    #[test]
    fn a_late_change_is_recorded_as_pending_with_the_last_delivery_kept() {
        let current = json!({ "state": SYNCED, "generation": 1, "time": "2026-12-06T00:00:01Z" });
        let since = Time("2026-12-06T00:00:05Z".parse().unwrap());
        let record = awaiting(Some(&current), Some(&since));
        assert_eq!(record["state"], PENDING);
        assert_eq!(record["generation"], 1);
        assert_eq!(record["time"], "2026-12-06T00:00:01Z");
        assert_eq!(record["since"], "2026-12-06T00:00:05Z");
        assert!(
            record["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("not delivered yet")),
            "{record}"
        );
    }

    #[test]
    fn a_summary_reads_the_record_a_sync_wrote() {
        let since = Time(jiff::Timestamp::from_second(1_900_000_000).unwrap());
        let pending = refused(
            Some(&delivered(Some(3), None)),
            PENDING,
            "the provider answered 500",
            Some(&since),
        );
        let status = with_record(Some(&json!({ "phase": "Ready" })), &pending);
        assert_eq!(
            summary(Some(&status)),
            Some(Summary {
                state: State::Pending,
                generation: std::num::NonZeroI64::new(3),
                since: Seconds::of(&since)
            })
        );
        let synced = with_record(None, &delivered(Some(4), None));
        assert_eq!(
            summary(Some(&synced)),
            Some(Summary {
                state: State::Synced,
                generation: std::num::NonZeroI64::new(4),
                since: None
            })
        );
        for (state, want) in [
            (REJECTED, State::Rejected),
            (FORBIDDEN, State::Forbidden),
            (PAUSED, State::Paused),
            ("NoRoute", State::Held),
            ("NotAllowed", State::Held),
            ("Paused?", State::Other),
        ] {
            let record = with_record(None, &refused(None, state, "x", None));
            assert_eq!(summary(Some(&record)).unwrap().state, want);
        }
        assert_eq!(summary(Some(&json!({ "phase": "Ready" }))), None);
        assert_eq!(summary(None), None);
        // Seconds: 8 bytes, to the second, as an API server records times.
        assert_eq!(std::mem::size_of::<Option<Seconds>>(), 8);
        assert_eq!(Seconds::of(&since).map(Seconds::time), Some(since));
        assert_eq!(Seconds::of(&Time(jiff::Timestamp::UNIX_EPOCH)), None);
    }

    #[test]
    fn the_record_joins_the_providers_status_and_compares_as_stored() {
        let provider = json!({ "phase": "Ready", "observedSize": 3 });
        let record = delivered(Some(2), Some("2026-12-01T00:00:00Z".into()));
        let status = with_record(Some(&provider), &record);
        assert_eq!(
            status,
            json!({ "phase": "Ready", "observedSize": 3, "kbindSync": { "state": "Synced", "generation": 2, "time": "2026-12-01T00:00:00Z" } })
        );
        // No provider status, no time yet: only what is known.
        assert_eq!(
            with_record(None, &delivered(Some(1), None)),
            json!({ "kbindSync": { "state": "Synced", "generation": 1 } })
        );
        assert!(!differs_beyond_record(Some(&status), Some(&provider)));
        assert!(differs_beyond_record(
            Some(&status),
            Some(&json!({ "phase": "Pending" }))
        ));
        assert_eq!(record_of(Some(&status)).unwrap()["generation"], 2);
    }

    #[test]
    fn a_refusal_keeps_the_last_delivery_and_a_safe_bounded_message() {
        let current = delivered(Some(4), Some("2026-12-01T00:00:00Z".into()));
        let hostile = format!("spec.size: Invalid value \u{1b}[31m{}", "x".repeat(5000));
        let record = refused(Some(&current), REJECTED, &hostile, None);
        assert_eq!(record["state"], REJECTED);
        assert_eq!(record["generation"], 4);
        assert_eq!(record["time"], "2026-12-01T00:00:00Z");
        let message = record["message"].as_str().unwrap();
        assert!(message.chars().count() <= MAX_MESSAGE + 1);
        assert!(!message.contains('\u{1b}'));
        assert_eq!(
            refused(None, FORBIDDEN, "no", None)["generation"],
            Value::Null
        );
    }

    #[test]
    fn a_pause_keeps_the_last_delivery_and_waits_for_nothing() {
        let current = delivered(Some(4), Some("2026-12-01T00:00:00Z".into()));
        let record = paused(Some(&current), "held by the user");
        let status = with_record(Some(&json!({ "phase": "Ready" })), &record);
        assert_eq!(
            status,
            json!({ "phase": "Ready", "kbindSync": {
                "state": "Paused",
                "generation": 4,
                "time": "2026-12-01T00:00:00Z",
                "message": "held by the user",
            } })
        );
        let summary = summary(Some(&status)).unwrap();
        assert_eq!((summary.state, summary.since), (State::Paused, None));
        // Never delivered: nothing to keep.
        assert_eq!(
            with_record(None, &paused(None, "x")),
            json!({ "kbindSync": { "state": "Paused", "message": "x" } })
        );
    }

    #[test]
    fn the_delivery_time_is_kbinds_own_write() {
        let entry = |manager: &str, second: i64| ManagedFieldsEntry {
            manager: Some(manager.into()),
            time: Some(Time(jiff::Timestamp::from_second(second).unwrap())),
            ..Default::default()
        };
        let meta = ObjectMeta {
            managed_fields: Some(vec![
                entry("provider-controller", 2_000_000_000),
                entry(crate::keys::FIELD_MANAGER, 1_900_000_000),
            ]),
            ..Default::default()
        };
        assert_eq!(applied_at(&meta).as_deref(), Some("2030-03-17T17:46:40Z"));
        assert_eq!(applied_at(&ObjectMeta::default()), None);
    }
}
