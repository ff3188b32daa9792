//! Ownership of provider objects (REFERENCE-BEHAVIOUR §17.3, OWN-1 … OWN-3) and the spec-up body
//! (SYNC-8): pure functions over plain data.

use std::collections::BTreeMap;

use crate::api::ConflictPolicy;
use crate::keys;
use serde_json::{Value, json};

/// OWN-1: who a provider object belongs to, from its annotations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// Both markers name this consumer cluster and this consumer object.
    Ours,
    /// No markers at all.
    Unmarked,
    /// Anything else: partial markers, another cluster, or a stale object UID.
    Another,
}

/// OWN-1.
pub fn classify(
    annotations: &BTreeMap<String, String>,
    local_uid: &str,
    object_uid: &str,
) -> Owner {
    let get = |key: &str| annotations.get(key).map(String::as_str);
    classify_markers(
        get(keys::CONSUMER_CLUSTER_UID_ANNOTATION),
        get(keys::CONSUMER_OBJECT_UID_ANNOTATION),
        local_uid,
        object_uid,
    )
}

/// OWN-1 from the two marker annotations' values (`cluster`, `object`).
pub fn classify_markers(
    cluster: Option<&str>,
    object: Option<&str>,
    local_uid: &str,
    object_uid: &str,
) -> Owner {
    let (cluster, object) = (cluster.unwrap_or_default(), object.unwrap_or_default());
    if cluster.is_empty() && object.is_empty() {
        Owner::Unmarked
    } else if cluster == local_uid && object == object_uid {
        Owner::Ours
    } else {
        Owner::Another
    }
}

/// OWN-2/OWN-3: whether to write, or which conflict to record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Apply the spec (ours, or adopting an unmarked object).
    Write,
    /// Leave the provider object alone and record this conflict reason.
    Conflict(&'static str),
}

/// OWN-2: `Fail` never writes a non-ours object; `Adopt` takes only unmarked ones; nobody takes
/// an object owned by another.
pub fn decide(owner: Owner, policy: ConflictPolicy) -> Decision {
    match (owner, policy) {
        (Owner::Ours, _) | (Owner::Unmarked, ConflictPolicy::Adopt) => Decision::Write,
        (Owner::Unmarked, ConflictPolicy::Fail) => Decision::Conflict(keys::CONFLICT_FOREIGN),
        (Owner::Another, _) => Decision::Conflict(keys::CONFLICT_OWNED_BY_ANOTHER),
    }
}

/// SYNC-8: the server-side apply body: the consumer's spec plus kbind's labels (managed, and the
/// consumer cluster's UID a provider watch selects by), both UID annotations and the record of the writing Connection's heartbeat Lease
/// ([`keys::HEARTBEAT_ANNOTATION`], `heartbeat::record`), and nothing else.
#[allow(clippy::too_many_arguments)]
pub fn spec_up_body(
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
    name: &str,
    spec: Option<&Value>,
    local_uid: &str,
    object_uid: &str,
    heartbeat: &str,
) -> Value {
    let mut metadata = json!({
        "name": name,
        "labels": {
            keys::MANAGED_LABEL: keys::TRUE,
            keys::CONSUMER_CLUSTER_UID_LABEL: local_uid,
        },
        "annotations": {
            keys::CONSUMER_CLUSTER_UID_ANNOTATION: local_uid,
            keys::CONSUMER_OBJECT_UID_ANNOTATION: object_uid,
            keys::HEARTBEAT_ANNOTATION: heartbeat,
        },
    });
    if let Some(namespace) = namespace {
        metadata["namespace"] = json!(namespace);
    }
    let mut body = json!({ "apiVersion": api_version, "kind": kind, "metadata": metadata });
    if let Some(spec) = spec {
        body["spec"] = spec.clone();
    }
    body
}

/// The merge patch that orphans a provider copy: kbind's markers removed (both forms: labels and
/// annotations), applied only if it is still the object whose UID was read (`object_uid`; the
/// API server refuses a patch naming another UID). Afterwards the copy is foreign to kbind.
pub fn unmark_patch(object_uid: &str) -> Value {
    json!({
        "metadata": {
            "uid": object_uid,
            "labels": {
                keys::MANAGED_LABEL: null,
                keys::CONSUMER_CLUSTER_UID_ANNOTATION: null,
            },
            "annotations": {
                keys::CONSUMER_CLUSTER_UID_ANNOTATION: null,
                keys::CONSUMER_OBJECT_UID_ANNOTATION: null,
                keys::RELATED_BINDING_ANNOTATION: null,
                keys::HEARTBEAT_ANNOTATION: null,
            },
        },
    })
}

/// An RFC 7386 merge patch that turns `current` into `desired`: changed and new keys are set,
/// keys `desired` lacks are set to `null`, nested objects are diffed, anything else is replaced.
/// Status down uses it so that the consumer's status becomes exactly the provider's without an
/// optimistic-lock round trip.
pub fn merge_patch(current: &Value, desired: &Value) -> Value {
    match (current, desired) {
        (Value::Object(current), Value::Object(desired)) => {
            let mut patch = serde_json::Map::new();
            for (key, value) in desired {
                match current.get(key) {
                    Some(old) if old == value => {}
                    // (A non-object `value` comes back whole from the inner call.)
                    Some(old @ Value::Object(_)) => {
                        patch.insert(key.clone(), merge_patch(old, value));
                    }
                    _ => {
                        patch.insert(key.clone(), value.clone());
                    }
                }
            }
            for key in current.keys().filter(|k| !desired.contains_key(*k)) {
                patch.insert(key.clone(), Value::Null);
            }
            Value::Object(patch)
        }
        _ => desired.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn markers(cluster: Option<&str>, object: Option<&str>) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        if let Some(c) = cluster {
            m.insert(
                keys::CONSUMER_CLUSTER_UID_ANNOTATION.to_owned(),
                c.to_owned(),
            );
        }
        if let Some(o) = object {
            m.insert(
                keys::CONSUMER_OBJECT_UID_ANNOTATION.to_owned(),
                o.to_owned(),
            );
        }
        m
    }

    #[test]
    fn classification_follows_both_markers() {
        // OWN-1
        assert_eq!(classify(&markers(None, None), "c", "o"), Owner::Unmarked);
        assert_eq!(
            classify(&markers(Some(""), Some("")), "c", "o"),
            Owner::Unmarked
        );
        assert_eq!(
            classify(&markers(Some("c"), Some("o")), "c", "o"),
            Owner::Ours
        );
        assert_eq!(
            classify(&markers(Some("c"), None), "c", "o"),
            Owner::Another,
            "partial markers"
        );
        assert_eq!(
            classify(&markers(Some("other"), Some("o")), "c", "o"),
            Owner::Another,
            "another cluster"
        );
        assert_eq!(
            classify(&markers(Some("c"), Some("stale")), "c", "o"),
            Owner::Another,
            "recreated consumer object"
        );
    }

    #[test]
    fn adopt_never_takes_an_object_owned_by_another() {
        // OWN-2
        assert_eq!(decide(Owner::Ours, ConflictPolicy::Fail), Decision::Write);
        assert_eq!(
            decide(Owner::Unmarked, ConflictPolicy::Adopt),
            Decision::Write
        );
        assert_eq!(
            decide(Owner::Unmarked, ConflictPolicy::Fail),
            Decision::Conflict("ForeignObjectExists")
        );
        assert_eq!(
            decide(Owner::Another, ConflictPolicy::Adopt),
            Decision::Conflict("OwnedByAnother")
        );
        assert_eq!(
            decide(Owner::Another, ConflictPolicy::Fail),
            Decision::Conflict("OwnedByAnother")
        );
    }

    #[test]
    fn spec_up_body_carries_only_spec_and_markers() {
        // SYNC-8
        let spec = json!({ "size": 3 });
        let body = spec_up_body(
            "example.org/v1",
            "Widget",
            Some("team-a"),
            "w",
            Some(&spec),
            "c",
            "o",
            "kbind/p-c",
        );
        assert_eq!(
            body,
            json!({
                "apiVersion": "example.org/v1", "kind": "Widget",
                "metadata": {
                    "name": "w", "namespace": "team-a",
                    "labels": {
                        "core.kbind.io/managed": "true",
                        "core.kbind.io/consumer-cluster-uid": "c",
                    },
                    "annotations": {
                        "core.kbind.io/consumer-cluster-uid": "c",
                        "core.kbind.io/consumer-object-uid": "o",
                        "core.kbind.io/heartbeat": "kbind/p-c",
                    },
                },
                "spec": { "size": 3 },
            })
        );
        assert!(
            spec_up_body(
                "example.org/v1",
                "Widget",
                None,
                "w",
                None,
                "c",
                "o",
                "kbind/p-c"
            )
            .get("spec")
            .is_none()
        );
    }

    #[test]
    fn merge_patch_makes_the_status_exactly_the_desired_one() {
        let current =
            json!({ "phase": "Pending", "gone": 1, "nested": { "a": 1, "b": 2 }, "list": [1, 2] });
        let desired = json!({ "phase": "Ready", "nested": { "a": 1, "c": 3 }, "list": [3] });
        let patch = merge_patch(&current, &desired);
        assert_eq!(
            patch,
            json!({ "phase": "Ready", "gone": null, "nested": { "b": null, "c": 3 }, "list": [3] })
        );
        assert_eq!(merge_patch(&desired, &desired), json!({}));
        // An object that becomes a scalar or a list is replaced whole.
        assert_eq!(
            merge_patch(&json!({ "a": { "x": 1 } }), &json!({ "a": "s" })),
            json!({ "a": "s" })
        );
        assert_eq!(
            merge_patch(&json!({ "a": { "x": 1 } }), &json!({ "a": [1] })),
            json!({ "a": [1] })
        );
        // Applying the patch (RFC 7386) yields the desired value.
        fn apply(target: &mut Value, patch: &Value) {
            if let (Value::Object(t), Value::Object(p)) = (&mut *target, patch) {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else if v.is_object() && t.get(k).is_some_and(Value::is_object) {
                        apply(t.get_mut(k).unwrap(), v);
                    } else {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        let mut applied = current.clone();
        apply(&mut applied, &patch);
        assert_eq!(applied, desired);
    }
}
