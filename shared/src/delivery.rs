//! Per-object delivery, visible with `kubectl get`: `status.kbindSync` on each synced consumer
//! object says which generation of its spec reached the provider and when — or, if the provider
//! refused it, why. The schema manager adds the field and printer columns to the CRDs it installs
//! ([`status_schema`], [`printer_columns`]); the syncer writes the record in the status write a
//! change already causes ([`with_record`]). Pure functions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

/// The status field kbind owns on consumer objects.
pub const FIELD: &str = "kbindSync";
/// The generation in `generation` reached the provider at `time`.
pub const SYNCED: &str = "Synced";
/// The provider's validation or admission refused the current spec (`message` says why).
pub const REJECTED: &str = "Rejected";
/// kbind's credential may not write the provider copy (`message` says what).
pub const FORBIDDEN: &str = "Forbidden";
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
            "state": { "type": "string", "description": "Synced, Rejected or Forbidden." },
            "time": { "type": "string", "format": "date-time", "description": "When kbind last wrote the spec to the provider." },
            "message": { "type": "string", "maxLength": 400, "description": "Why the current spec did not reach the provider." },
        },
    })
}

/// kbind's printer columns: `kubectl get` shows the delivery state beside the provider's columns
/// (`-o wide` adds the generation and the message).
pub fn printer_columns() -> Vec<Value> {
    vec![
        json!({ "name": "Synced", "type": "string", "jsonPath": ".status.kbindSync.state", "description": "Whether the current spec reached the provider" }),
        json!({ "name": "Delivered", "type": "date", "jsonPath": ".status.kbindSync.time", "description": "When kbind last wrote the spec to the provider" }),
        json!({ "name": "Generation", "type": "integer", "jsonPath": ".metadata.generation", "priority": 1, "description": "The spec's generation" }),
        json!({ "name": "Synced-Generation", "type": "integer", "jsonPath": ".status.kbindSync.generation", "priority": 1, "description": "The generation the provider has" }),
        json!({ "name": "Message", "type": "string", "jsonPath": ".status.kbindSync.message", "priority": 1, "description": "Why the spec did not reach the provider" }),
        json!({ "name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp" }),
    ]
}

/// When kbind's field manager last wrote the provider copy (its `managedFields` entry), as the
/// API server recorded it.
pub fn applied_at(copy: &ObjectMeta) -> Option<String> {
    applied_time(copy).map(|t| t.0.to_string())
}

/// The time of kbind's field manager's `managedFields` entry, as [`applied_at`] states it.
pub fn applied_time(
    copy: &ObjectMeta,
) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time> {
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

/// The record of a refused spec: the state and why; the last delivered generation and time kept.
pub fn refused(current: Option<&Value>, state: &str, message: &str) -> Value {
    let keep = |key: &str| {
        current
            .and_then(|c| c.get(key))
            .cloned()
            .unwrap_or(Value::Null)
    };
    json!({
        "state": state,
        "generation": keep("generation"),
        "time": keep("time"),
        "message": crate::conditions::bounded(&crate::redact::remote(message), MAX_MESSAGE),
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
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, Time};

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
        let record = refused(Some(&current), REJECTED, &hostile);
        assert_eq!(record["state"], REJECTED);
        assert_eq!(record["generation"], 4);
        assert_eq!(record["time"], "2026-12-01T00:00:00Z");
        let message = record["message"].as_str().unwrap();
        assert!(message.chars().count() <= MAX_MESSAGE + 1);
        assert!(!message.contains('\u{1b}'));
        assert_eq!(refused(None, FORBIDDEN, "no")["generation"], Value::Null);
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
