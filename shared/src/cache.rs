//! A watch-fed cache (kube-runtime reflector) whose stream runs on its own task and reports every
//! event, so that callers can wait for its readiness once and react to change.

use futures::StreamExt;
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;

/// Starts caching `api` (filtered by `config`) until `stop`; `on_change` runs after every event.
pub fn spawn<K>(
    api: Api<K>,
    config: watcher::Config,
    stop: CancellationToken,
    on_change: impl Fn() + Send + 'static,
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    observe(writer, api, config, stop, move |event| {
        if event.is_ok() {
            on_change();
        }
    });
    reader
}

/// Feeds `writer` from a watch of `api` until `stop`; `observer` sees every event and every watch
/// error (the watch retries with backoff after an error).
pub fn observe<K>(
    writer: reflector::store::Writer<K>,
    api: Api<K>,
    config: watcher::Config,
    stop: CancellationToken,
    observer: impl Fn(Result<&watcher::Event<K>, &watcher::Error>) + Send + 'static,
) where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    let stream = reflector::reflector(writer, watcher(api, config)).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                event = stream.next() => match event {
                    Some(event) => observer(event.as_ref()),
                    None => break,
                },
                _ = stop.cancelled() => break,
            }
        }
    });
}

/// `kubectl apply`'s copy of the last applied object: as large as the object, read by nothing in
/// kbind.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What the syncer keeps of a synced instance (consumer or provider side) in its caches: all but
/// what no decision reads. Gone: other managers' `managedFields` entries and every entry's field
/// set (kbind reads only the time of its own entry, `delivery::applied_at`), and
/// [`LAST_APPLIED_ANNOTATION`]. Kept: identity, generation, deletion, finalizers, labels, every
/// other annotation (ownership markers, conflicts, deletion policy), spec and status.
pub fn slim_instance(meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
    if let Some(fields) = meta.managed_fields.as_mut() {
        fields.retain(|f| f.manager.as_deref() == Some(crate::keys::FIELD_MANAGER));
        for entry in fields.iter_mut() {
            entry.fields_v1 = None;
        }
        if fields.is_empty() {
            meta.managed_fields = None;
        }
    }
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED_ANNOTATION);
    }
}

/// What the schema manager's conflict counts keep of an instance's metadata: its name, namespace
/// and conflict annotation — nothing else.
pub fn conflict_metadata(meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
    let conflict = meta
        .annotations
        .as_mut()
        .and_then(|a| a.remove(crate::keys::CONFLICT_ANNOTATION));
    *meta = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        name: meta.name.take(),
        namespace: meta.namespace.take(),
        annotations: conflict.map(|c| {
            std::collections::BTreeMap::from([(crate::keys::CONFLICT_ANNOTATION.to_owned(), c)])
        }),
        ..Default::default()
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    fn meta() -> ObjectMeta {
        serde_json::from_value(json!({
            "name": "w1",
            "namespace": "team-a",
            "uid": "u1",
            "generation": 3,
            "resourceVersion": "42",
            "deletionTimestamp": "2026-12-01T00:00:00Z",
            "finalizers": [keys::SYNCER_FINALIZER],
            "labels": { keys::MANAGED_LABEL: keys::TRUE },
            "annotations": {
                LAST_APPLIED_ANNOTATION: "{\"a huge\": \"copy\"}",
                keys::CONFLICT_ANNOTATION: keys::CONFLICT_FOREIGN,
                keys::CONSUMER_CLUSTER_UID_ANNOTATION: "c",
                keys::CONSUMER_OBJECT_UID_ANNOTATION: "o",
                keys::DELETION_POLICY_ANNOTATION: keys::DELETION_POLICY_ORPHAN,
            },
            "managedFields": [
                { "manager": "kubectl", "operation": "Update", "time": "2026-12-01T00:00:01Z",
                  "fieldsType": "FieldsV1", "fieldsV1": { "f:spec": { "f:size": {} } } },
                { "manager": keys::FIELD_MANAGER, "operation": "Apply", "time": "2026-12-01T00:00:02Z",
                  "fieldsType": "FieldsV1", "fieldsV1": { "f:spec": { "f:size": {} } } },
            ],
        }))
        .unwrap()
    }

    #[test]
    fn a_slim_instance_keeps_what_decisions_read() {
        let mut slim = meta();
        slim_instance(&mut slim);
        let full = meta();
        // Dropped: other managers' entries, every field set, kubectl's last-applied copy.
        let fields = slim.managed_fields.clone().unwrap();
        assert_eq!(fields.len(), 1);
        assert_eq!(fields[0].manager.as_deref(), Some(keys::FIELD_MANAGER));
        assert!(fields[0].fields_v1.is_none());
        assert!(
            !slim
                .annotations
                .as_ref()
                .unwrap()
                .contains_key(LAST_APPLIED_ANNOTATION)
        );
        // What decisions need is all still there: the delivery time, identity, generation,
        // deletion, finalizers, labels and kbind's annotations.
        assert_eq!(
            crate::delivery::applied_at(&slim),
            crate::delivery::applied_at(&full)
        );
        assert_eq!(
            crate::delivery::applied_at(&slim).as_deref(),
            Some("2026-12-01T00:00:02Z")
        );
        let mut annotations = full.annotations.clone().unwrap();
        annotations.remove(LAST_APPLIED_ANNOTATION);
        assert_eq!(slim.annotations.clone().unwrap(), annotations);
        assert_eq!(
            (
                &slim.name,
                &slim.namespace,
                &slim.uid,
                slim.generation,
                &slim.resource_version,
                &slim.deletion_timestamp,
                &slim.finalizers,
                &slim.labels
            ),
            (
                &full.name,
                &full.namespace,
                &full.uid,
                full.generation,
                &full.resource_version,
                &full.deletion_timestamp,
                &full.finalizers,
                &full.labels
            )
        );
        // Nothing of kbind's: no managedFields at all.
        let mut foreign = meta();
        foreign.managed_fields.as_mut().unwrap().remove(1);
        slim_instance(&mut foreign);
        assert_eq!(foreign.managed_fields, None);
        assert_eq!(crate::delivery::applied_at(&foreign), None);
    }

    #[test]
    fn conflict_metadata_keeps_the_key_and_the_conflict() {
        let mut slim = meta();
        conflict_metadata(&mut slim);
        assert_eq!(
            serde_json::to_value(&slim).unwrap(),
            json!({
                "name": "w1",
                "namespace": "team-a",
                "annotations": { keys::CONFLICT_ANNOTATION: keys::CONFLICT_FOREIGN },
            })
        );
        let mut none = meta();
        none.annotations = None;
        conflict_metadata(&mut none);
        assert_eq!(
            serde_json::to_value(&none).unwrap(),
            json!({ "name": "w1", "namespace": "team-a" })
        );
    }
}
