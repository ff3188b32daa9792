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

use super::{State, Step};

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

/// The heartbeat record on a provider object (`core.kbind.io/heartbeat`): the Lease of the
/// Connection that wrote it, `<namespace>/<name>`.
pub fn heartbeat_record(meta: &ObjectMeta) -> Option<&str> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(keys::HEARTBEAT_ANNOTATION))
        .map(String::as_str)
        .filter(|r| {
            r.split_once('/')
                .is_some_and(|(ns, n)| !ns.is_empty() && !n.is_empty())
        })
}

/// One heartbeat Lease as the reaper reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSeen {
    /// The consumer cluster's UID.
    pub uid: String,
    /// The Connection it is for (the annotation; the Go konnector's form has none).
    pub connection: Option<String>,
    /// `<namespace>/<name>`.
    pub key: String,
    /// Its `resourceVersion`: a change between two sweeps is a renewal the reaper saw.
    pub version: String,
    /// Marked `core.kbind.io/disconnected` after its last renewal (by the API server's stamps of
    /// the two writes): the consumer left.
    pub left: bool,
    /// `leaseDurationSeconds`.
    pub duration_secs: i64,
}

/// A heartbeat Lease, if it speaks for a consumer: named as kbind (or the Go konnector) derives
/// the name from the consumer's UID and Connection, and held by that UID
/// ([`kbind_shared::heartbeat::speaks_for`]). `None` for any other Lease, whatever it claims.
pub fn lease_seen(namespace: &str, lease: &Lease) -> Option<LeaseSeen> {
    let meta = &lease.metadata;
    let spec = lease.spec.as_ref();
    let name = meta.name.as_deref()?;
    let holder = spec.and_then(|s| s.holder_identity.as_deref());
    let uid = consumer_uid(meta).or(holder)?;
    let connection = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::CONNECTION_ANNOTATION))
        .cloned();
    if !kbind_shared::heartbeat::speaks_for(name, holder, uid, connection.as_deref()) {
        return None;
    }
    let marked = meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(keys::DISCONNECTED_ANNOTATION));
    let mark = format!("f:{}", keys::DISCONNECTED_ANNOTATION);
    let left = marked
        && match (
            written_at(meta, &["f:metadata", "f:annotations", &mark]),
            written_at(meta, &["f:spec", "f:renewTime"]),
        ) {
            (Some(marked_at), Some(renewed_at)) => marked_at >= renewed_at,
            // Whoever cleared the times: the mark stands (leaving is never reaped).
            (_, None) => true,
            (None, Some(_)) => false,
        };
    Some(LeaseSeen {
        uid: uid.to_owned(),
        connection,
        key: format!("{namespace}/{name}"),
        version: meta.resource_version.clone()?,
        left,
        duration_secs: spec
            .and_then(|s| s.lease_duration_seconds)
            .map(i64::from)
            .unwrap_or(60),
    })
}

/// One heartbeat (or one consumer's objects no heartbeat accounts for) in a sweep's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerView {
    /// The consumer cluster's UID.
    pub uid: String,
    /// The decision.
    pub step: Step,
    /// Its Connection (from its Lease).
    pub connections: Vec<String>,
    /// Its Lease, `<namespace>/<name>`.
    pub leases: Vec<String>,
    /// When the reaper last saw the Lease renewed (server time), if it has one.
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
        State::Revoked => "Revoked",
        State::Unaccounted => "Unaccounted",
    }
}

/// Every state, in the status's order: the most urgent first.
pub const STATES: [State; 8] = [
    State::Reaping,
    State::Revoked,
    State::Stale,
    State::Unaccounted,
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
            State::Revoked => &mut counts.revoked,
            State::Unaccounted => &mut counts.unaccounted,
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

    fn lease(
        name: &str,
        holder: &str,
        annotations: &[(&str, &str)],
        entries: Vec<ManagedFieldsEntry>,
    ) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some("42".into()),
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
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(1),
                // The writer's clock: hours off, and never read.
                renew_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                    jiff::Timestamp::from_second(99_999_999).unwrap(),
                )),
                ..Default::default()
            }),
        }
    }

    const UID: &str = "0123456789abcdef";
    const CONSUMER: &str = keys::CONSUMER_CLUSTER_UID_ANNOTATION;
    const CONNECTION: &str = keys::CONNECTION_ANNOTATION;

    #[test]
    fn a_lease_speaks_for_a_consumer_only_under_its_derived_name_and_holder() {
        let renewal = json!({"f:spec": {"f:renewTime": {}}});
        for (name, holder, annotations, want) in [
            // kbind's form.
            (
                "provider-0123456789",
                UID,
                vec![(CONSUMER, UID), (CONNECTION, "provider")],
                Some((UID, Some("provider"))),
            ),
            // The Go konnector's form: no connection, the UID from the holder.
            ("consumer-0123456789abcdef", UID, vec![], Some((UID, None))),
            // A co-tenant's copy of a live consumer's Lease under a name of its own.
            (
                "provider-0123456789-copy",
                UID,
                vec![(CONSUMER, UID), (CONNECTION, "provider")],
                None,
            ),
            // The annotation claims a UID the holder does not agree with.
            (
                "provider-0123456789",
                "someone",
                vec![(CONSUMER, UID), (CONNECTION, "provider")],
                None,
            ),
            // A Lease that names no consumer at all.
            ("kube-scheduler", "", vec![], None),
        ] {
            let seen = lease_seen(
                "kbind",
                &lease(
                    name,
                    holder,
                    &annotations,
                    vec![entry("m", renewal.clone(), 5)],
                ),
            );
            assert_eq!(
                seen.as_ref()
                    .map(|s| (s.uid.as_str(), s.connection.as_deref())),
                want,
                "{name}"
            );
            if let Some(seen) = seen {
                assert_eq!(seen.key, format!("kbind/{name}"));
                assert_eq!(seen.version, "42");
            }
        }
    }

    #[test]
    fn a_consumer_left_when_the_server_stamped_its_mark_after_its_last_renewal() {
        let renewal = json!({"f:spec": {"f:renewTime": {}, "f:holderIdentity": {}}});
        let mark = json!({"f:metadata": {"f:annotations": {"f:core.kbind.io/disconnected": {}}}});
        let marked = vec![
            (CONSUMER, UID),
            (CONNECTION, "provider"),
            (keys::DISCONNECTED_ANNOTATION, "2000-01-01T00:00:00Z"),
        ];
        let plain = vec![(CONSUMER, UID), (CONNECTION, "provider")];
        for (annotations, entries, want) in [
            (
                marked.clone(),
                vec![
                    entry("kbind-schema-manager", renewal.clone(), 500),
                    entry("kbind-schema-manager", mark.clone(), 510),
                ],
                true,
            ),
            // Renewed after the mark (connected again): not left.
            (
                marked.clone(),
                vec![
                    entry("kbind-schema-manager", renewal.clone(), 520),
                    entry("kbind-schema-manager", mark.clone(), 510),
                ],
                false,
            ),
            // An entry says it owned the mark, but the annotation is gone: not left.
            (
                plain,
                vec![
                    entry("kbind-schema-manager", renewal.clone(), 500),
                    entry("x", mark, 510),
                ],
                false,
            ),
            // The times cleared by someone: the mark stands (leaving is never reaped).
            (marked, vec![], true),
        ] {
            let seen = lease_seen(
                "kbind",
                &lease("provider-0123456789", UID, &annotations, entries),
            )
            .unwrap();
            assert_eq!(seen.left, want, "{annotations:?}");
        }
    }

    #[test]
    fn the_heartbeat_record_names_a_lease() {
        let meta = |value: &str| ObjectMeta {
            annotations: Some([(keys::HEARTBEAT_ANNOTATION.to_owned(), value.to_owned())].into()),
            ..Default::default()
        };
        assert_eq!(heartbeat_record(&meta("kbind/p-u")), Some("kbind/p-u"));
        for bad in ["", "kbind", "/p-u", "kbind/"] {
            assert_eq!(heartbeat_record(&meta(bad)), None, "{bad:?}");
        }
        assert_eq!(heartbeat_record(&ObjectMeta::default()), None);
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
    fn the_status_counts_everyone_and_lists_the_most_urgent_first_bounded() {
        let view = |uid: &str, state| ConsumerView {
            uid: uid.into(),
            step: Step {
                state,
                act: None,
                next: None,
                stale_since: None,
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
