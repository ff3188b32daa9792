//! What the reaper reads off the provider's objects, as plain data: whose an object is (both
//! marker forms), when the API server recorded a Lease's renewal and disconnect mark, a
//! consumer's Leases taken together, and the policy's status. Pure; table-tested.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kbind_shared::api::reaper::{
    ApiCount, ConsumerCounts, ConsumerStatus, MAX_LISTED_CONSUMERS, ReaperPolicyStatus,
};
use kbind_shared::keys;

use super::{LeaseFacts, State, Step};

/// The newest time the API server recorded for a write (by any manager) that owns the field at
/// `path` (`["f:spec", "f:renewTime"]`), in seconds since the epoch.
pub fn written_at(meta: &ObjectMeta, path: &[&str]) -> Option<i64> {
    meta.managed_fields
        .iter()
        .flatten()
        .filter(|entry| {
            let mut at = entry.fields_v1.as_ref().map(|f| &f.0);
            for key in path {
                at = at.and_then(|v| v.get(*key));
            }
            at.is_some()
        })
        .filter_map(|entry| entry.time.as_ref())
        .map(|t| t.0.as_second())
        .max()
}

/// The consumer cluster an object on the provider belongs to: the
/// `core.kbind.io/consumer-cluster-uid` annotation (copies, related copies, Leases), else the
/// label of the same key (the namespaces a syncer creates, and other implementations' objects).
pub fn consumer_uid(meta: &ObjectMeta) -> Option<&str> {
    let key = keys::CONSUMER_CLUSTER_UID_ANNOTATION;
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .or_else(|| meta.labels.as_ref().and_then(|l| l.get(key)))
        .map(String::as_str)
        .filter(|uid| !uid.is_empty())
}

/// Whether an object carries the policy's protect label (any value).
pub fn is_protected(meta: &ObjectMeta, protect_label: &str) -> bool {
    meta.labels
        .as_ref()
        .is_some_and(|l| l.contains_key(protect_label))
}

/// One heartbeat Lease as the reaper reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSeen {
    /// The consumer cluster's UID.
    pub uid: String,
    /// The Connection it is for (the annotation; the older form has none).
    pub connection: Option<String>,
    /// `<namespace>/<name>`.
    pub name: String,
    /// The heartbeat with server-stamped times.
    pub facts: LeaseFacts,
    /// `leaseDurationSeconds`.
    pub duration_secs: i64,
}

/// A heartbeat Lease's facts: the renewal's time is that of the newest write owning
/// `spec.renewTime` (else the Lease's creation), the disconnect mark's that of the write owning
/// `core.kbind.io/disconnected` — both the API server's clock, never the writer's. `None` for a
/// Lease that names no consumer.
pub fn lease_seen(namespace: &str, lease: &Lease) -> Option<LeaseSeen> {
    let meta = &lease.metadata;
    let spec = lease.spec.as_ref();
    let uid = consumer_uid(meta)
        .map(str::to_owned)
        .or_else(|| spec.and_then(|s| s.holder_identity.clone()))
        .filter(|uid| !uid.is_empty())?;
    let renewed = written_at(meta, &["f:spec", "f:renewTime"])
        .or_else(|| meta.creation_timestamp.as_ref().map(|t| t.0.as_second()))?;
    let mark = format!("f:{}", keys::DISCONNECTED_ANNOTATION);
    let marked = meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(keys::DISCONNECTED_ANNOTATION));
    let disconnected = marked
        .then(|| written_at(meta, &["f:metadata", "f:annotations", &mark]))
        .flatten();
    Some(LeaseSeen {
        uid,
        connection: meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(keys::CONNECTION_ANNOTATION))
            .cloned(),
        name: format!("{namespace}/{}", meta.name.as_deref().unwrap_or_default()),
        facts: LeaseFacts {
            renewed,
            disconnected,
        },
        duration_secs: spec
            .and_then(|s| s.lease_duration_seconds)
            .map(i64::from)
            .unwrap_or(60),
    })
}

/// A consumer's Leases (one per Connection to this provider) taken together: alive when any is —
/// the newest renewal counts — and left only when every one of them was marked disconnected
/// after its last renewal.
pub fn combine<'a>(leases: impl IntoIterator<Item = &'a LeaseSeen>) -> Option<LeaseFacts> {
    let mut renewed = None::<i64>;
    let mut all_left = true;
    let mut last_mark = None::<i64>;
    for lease in leases {
        let facts = lease.facts;
        renewed = Some(renewed.map_or(facts.renewed, |r| r.max(facts.renewed)));
        match facts.disconnected {
            Some(at) if at >= facts.renewed => {
                last_mark = Some(last_mark.map_or(at, |m| m.max(at)));
            }
            _ => all_left = false,
        }
    }
    let renewed = renewed?;
    Some(LeaseFacts {
        renewed,
        disconnected: if all_left { last_mark } else { None },
    })
}

/// One consumer in a sweep's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerView {
    /// The consumer cluster's UID.
    pub uid: String,
    /// The decision.
    pub step: Step,
    /// Its Connections (from its Leases).
    pub connections: Vec<String>,
    /// Its Leases, `<namespace>/<name>`.
    pub leases: Vec<String>,
    /// The newest server-recorded renewal, if it has a Lease.
    pub renewed: Option<i64>,
    /// Its objects per API.
    pub objects: BTreeMap<String, u64>,
}

/// The state's name in the status and the metric.
pub fn state_name(state: State) -> &'static str {
    match state {
        State::Live => "Live",
        State::Stale => "Stale",
        State::Reaping => "Reaping",
        State::Reaped => "Reaped",
        State::NoLease => "NoLease",
        State::Left => "Left",
    }
}

/// Every state, in the status's order: the most urgent first.
pub const STATES: [State; 6] = [
    State::Reaping,
    State::Stale,
    State::NoLease,
    State::Left,
    State::Live,
    State::Reaped,
];

fn urgency(state: State) -> usize {
    STATES
        .iter()
        .position(|s| *s == state)
        .unwrap_or(STATES.len())
}

/// The policy's status after a sweep at server time `now`: counts of every consumer by state,
/// and at most [`MAX_LISTED_CONSUMERS`] of them, the most urgent first (then by UID, so the list
/// is stable from sweep to sweep).
pub fn status(
    consumers: &[ConsumerView],
    now: i64,
    generation: Option<i64>,
    conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
) -> ReaperPolicyStatus {
    let mut counts = ConsumerCounts::default();
    for consumer in consumers {
        let slot = match consumer.step.state {
            State::Live => &mut counts.live,
            State::Stale => &mut counts.stale,
            State::Reaping => &mut counts.reaping,
            State::Reaped => &mut counts.reaped,
            State::NoLease => &mut counts.no_lease,
            State::Left => &mut counts.left,
        };
        *slot = slot.saturating_add(1);
    }
    let mut listed: Vec<&ConsumerView> = consumers.iter().collect();
    listed.sort_by(|a, b| (urgency(a.step.state), &a.uid).cmp(&(urgency(b.step.state), &b.uid)));
    listed.truncate(MAX_LISTED_CONSUMERS);
    ReaperPolicyStatus {
        observed_generation: generation,
        conditions,
        last_sweep: time(now),
        counts,
        consumers: listed
            .into_iter()
            .map(|c| ConsumerStatus {
                uid: c.uid.clone(),
                state: state_name(c.step.state).to_owned(),
                connections: c.connections.clone(),
                leases: c.leases.clone(),
                last_renewal: c.renewed.and_then(time),
                next_change: c.step.next.and_then(time),
                objects: c
                    .objects
                    .iter()
                    .filter(|(_, n)| **n > 0)
                    .map(|(api, count)| ApiCount {
                        api: api.clone(),
                        count: *count,
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// Seconds since the epoch as an API [`Time`].
pub fn time(seconds: i64) -> Option<Time> {
    jiff::Timestamp::from_second(seconds).ok().map(Time)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
    use serde_json::json;

    fn entry(manager: &str, fields: serde_json::Value, second: i64) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Apply".into()),
            fields_v1: Some(FieldsV1(fields)),
            time: time(second),
            ..Default::default()
        }
    }

    fn lease(annotations: &[(&str, &str)], entries: Vec<ManagedFieldsEntry>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("provider-0123456789".into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                managed_fields: Some(entries),
                creation_timestamp: time(100),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("holder-uid".into()),
                lease_duration_seconds: Some(1),
                // The writer's clock: hours off, and never read.
                renew_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                    jiff::Timestamp::from_second(99_999_999).unwrap(),
                )),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_leases_times_are_the_api_servers_not_the_writers() {
        let renewal = json!({"f:spec": {"f:renewTime": {}, "f:holderIdentity": {}}});
        let mark = json!({"f:metadata": {"f:annotations": {"f:core.kbind.io/disconnected": {}}}});
        for (annotations, entries, want) in [
            // The renewal's time is the entry owning renewTime; the renewTime text is ignored.
            (
                vec![(keys::CONSUMER_CLUSTER_UID_ANNOTATION, "uid-a")],
                vec![entry("kbind-schema-manager", renewal.clone(), 500)],
                Some(("uid-a", 500, None)),
            ),
            // Another manager's newer write of other fields does not count as a renewal.
            (
                vec![(keys::CONSUMER_CLUSTER_UID_ANNOTATION, "uid-a")],
                vec![
                    entry("kbind-schema-manager", renewal.clone(), 500),
                    entry("kubectl", json!({"f:metadata": {"f:labels": {}}}), 900),
                ],
                Some(("uid-a", 500, None)),
            ),
            // Marked disconnected: the mark's time is its write's.
            (
                vec![
                    (keys::CONSUMER_CLUSTER_UID_ANNOTATION, "uid-a"),
                    (keys::DISCONNECTED_ANNOTATION, "2000-01-01T00:00:00Z"),
                ],
                vec![
                    entry("kbind-schema-manager", renewal.clone(), 500),
                    entry("kbind-schema-manager", mark.clone(), 510),
                ],
                Some(("uid-a", 500, Some(510))),
            ),
            // An entry says it owned the mark, but the annotation is gone: not disconnected.
            (
                vec![(keys::CONSUMER_CLUSTER_UID_ANNOTATION, "uid-a")],
                vec![
                    entry("kbind-schema-manager", renewal.clone(), 500),
                    entry("x", mark, 510),
                ],
                Some(("uid-a", 500, None)),
            ),
            // No managedFields: the creation time (also the server's).
            (vec![], vec![], Some(("holder-uid", 100, None))),
        ] {
            let seen = lease_seen("kbind", &lease(&annotations, entries));
            let got = seen
                .as_ref()
                .map(|s| (s.uid.as_str(), s.facts.renewed, s.facts.disconnected));
            assert_eq!(got, want, "{annotations:?}");
        }
    }

    #[test]
    fn both_marker_forms_name_the_consumer() {
        let meta = |labels: &[(&str, &str)], annotations: &[(&str, &str)]| ObjectMeta {
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..Default::default()
        };
        let key = keys::CONSUMER_CLUSTER_UID_ANNOTATION;
        for (labels, annotations, want) in [
            (vec![], vec![(key, "a")], Some("a")),
            (vec![(key, "b")], vec![], Some("b")),
            (vec![(key, "b")], vec![(key, "a")], Some("a")),
            (vec![], vec![(key, "")], None),
            (vec![(keys::MANAGED_LABEL, "true")], vec![], None),
        ] {
            assert_eq!(consumer_uid(&meta(&labels, &annotations)), want);
        }
        assert!(is_protected(
            &meta(&[("reaper.kbind.io/protect", "")], &[]),
            "reaper.kbind.io/protect"
        ));
        assert!(!is_protected(&meta(&[], &[]), "reaper.kbind.io/protect"));
    }

    #[test]
    fn a_consumer_with_several_leases_is_alive_while_any_is_and_left_only_when_all_left() {
        let seen = |renewed, disconnected| LeaseSeen {
            uid: "u".into(),
            connection: None,
            name: "kbind/x".into(),
            facts: LeaseFacts {
                renewed,
                disconnected,
            },
            duration_secs: 60,
        };
        for (leases, want) in [
            (vec![], None),
            (
                vec![seen(10, None), seen(50, None)],
                Some(LeaseFacts {
                    renewed: 50,
                    disconnected: None,
                }),
            ),
            // One Connection left, the other still renews: not left.
            (
                vec![seen(10, Some(20)), seen(50, None)],
                Some(LeaseFacts {
                    renewed: 50,
                    disconnected: None,
                }),
            ),
            // Both left.
            (
                vec![seen(10, Some(20)), seen(15, Some(30))],
                Some(LeaseFacts {
                    renewed: 15,
                    disconnected: Some(30),
                }),
            ),
            // A mark older than the renewal (connected again): not left.
            (
                vec![seen(40, Some(20))],
                Some(LeaseFacts {
                    renewed: 40,
                    disconnected: None,
                }),
            ),
        ] {
            assert_eq!(combine(&leases), want, "{leases:?}");
        }
    }

    #[test]
    fn the_status_counts_everyone_and_lists_the_most_urgent_first_bounded() {
        let view = |uid: &str, state| ConsumerView {
            uid: uid.into(),
            step: Step {
                state,
                act: None,
                next: None,
            },
            connections: vec![],
            leases: vec![],
            renewed: None,
            objects: [
                ("widgets.example.com".to_owned(), 2),
                ("secrets".to_owned(), 0),
            ]
            .into(),
        };
        let mut consumers: Vec<ConsumerView> = (0..150)
            .map(|i| view(&format!("live-{i:03}"), State::Live))
            .collect();
        consumers.push(view("z-stale", State::Stale));
        consumers.push(view("y-reaping", State::Reaping));
        consumers.push(view("x-nolease", State::NoLease));
        let status = status(&consumers, 1_000, Some(3), vec![]);
        assert_eq!(status.counts.live, 150);
        assert_eq!(
            (
                status.counts.stale,
                status.counts.reaping,
                status.counts.no_lease
            ),
            (1, 1, 1)
        );
        assert_eq!(status.consumers.len(), MAX_LISTED_CONSUMERS);
        let first: Vec<(&str, &str)> = status
            .consumers
            .iter()
            .take(4)
            .map(|c| (c.uid.as_str(), c.state.as_str()))
            .collect();
        assert_eq!(
            first,
            [
                ("y-reaping", "Reaping"),
                ("z-stale", "Stale"),
                ("x-nolease", "NoLease"),
                ("live-000", "Live")
            ]
        );
        // Empty counts are left out of the per-API list.
        assert_eq!(
            status.consumers[0].objects,
            [ApiCount {
                api: "widgets.example.com".into(),
                count: 2
            }]
        );
        assert_eq!(status.last_sweep, time(1_000));
    }
}
