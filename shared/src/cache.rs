//! Watch-fed caches (kube-runtime reflectors): one whose stream runs on its own task and reports
//! every event, so that callers can wait for its readiness once and react to change; and the
//! compact forms the caches of synced instances hold — only what decisions read, so that memory
//! per cached object stays a few hundred bytes (issue #15; each transform is tested below for
//! what it drops and for what the decisions still find).

use std::borrow::Cow;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::ApiResource;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::Deserialize;
use serde_json::Value;
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

/// A JSON value held as compact text — the form a cache keeps a spec or status in. A parsed
/// `serde_json::Value` costs a map node of several hundred bytes per object level; the text costs
/// its length. The text is canonical (it is written from a parsed value: keys sorted, no
/// whitespace), so two `Json`s are equal exactly when their values are.
#[derive(Clone, PartialEq, Eq)]
pub struct Json(Box<str>);

impl Json {
    /// The compact text of `value`.
    pub fn new(value: &Value) -> Self {
        Json(value.to_string().into_boxed_str())
    }

    /// The value, parsed again (for a write that carries it, or a comparison with a value).
    pub fn value(&self) -> Value {
        // The text was written from a value, so it parses; `Null` would only stand for a defect.
        serde_json::from_str(&self.0).unwrap_or(Value::Null)
    }

    /// The compact text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Json {
    /// Only the size: a spec can hold anything a user wrote, and Debug output ends up in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Json({} bytes)", self.0.len())
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Value::deserialize(deserializer).map(|v| Json::new(&v))
    }
}

/// A synced instance as the syncer reads it: metadata, spec and status. Its caches hold the spec
/// and status as compact text ([`Json`]) and only the metadata decisions read
/// ([`consumer_metadata`]); everything else an instance has is not deserialized at all.
#[derive(Clone, Debug, Deserialize)]
pub struct Instance {
    /// Metadata.
    pub metadata: ObjectMeta,
    /// `spec`.
    #[serde(default)]
    pub spec: Option<Json>,
    /// `status`.
    #[serde(default)]
    pub status: Option<Json>,
}

/// The type of an [`Instance`]: its API, shared by every cache key (one pointer each instead of
/// five strings).
pub type InstanceType = Arc<ApiResource>;

impl Resource for Instance {
    type DynamicType = InstanceType;
    type Scope = kube::core::DynamicResourceScope;

    fn kind(dt: &InstanceType) -> Cow<'_, str> {
        Cow::Borrowed(&dt.kind)
    }
    fn group(dt: &InstanceType) -> Cow<'_, str> {
        Cow::Borrowed(&dt.group)
    }
    fn version(dt: &InstanceType) -> Cow<'_, str> {
        Cow::Borrowed(&dt.version)
    }
    fn api_version(dt: &InstanceType) -> Cow<'_, str> {
        Cow::Borrowed(&dt.api_version)
    }
    fn plural(dt: &InstanceType) -> Cow<'_, str> {
        Cow::Borrowed(&dt.plural)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The consumer annotations a sync reads: the conflict it recorded and the deletion policy.
const CONSUMER_ANNOTATIONS: [&str; 2] = [
    crate::keys::CONFLICT_ANNOTATION,
    crate::keys::DELETION_POLICY_ANNOTATION,
];

/// What the syncer's consumer cache keeps of an instance's metadata: identity (name, namespace,
/// UID), the resourceVersion a finalizer patch is guarded by, generation (the delivery record),
/// deletion, finalizers, and kbind's two annotations ([`CONSUMER_ANNOTATIONS`]). Gone: labels,
/// every other annotation (kubectl's last-applied copy can be as large as the object),
/// `managedFields`, owner references, timestamps.
pub fn consumer_metadata(meta: &mut ObjectMeta) {
    let annotations = meta.annotations.take().map(|mut all| {
        all.retain(|k, _| CONSUMER_ANNOTATIONS.contains(&k.as_str()));
        all
    });
    *meta = ObjectMeta {
        name: meta.name.take(),
        namespace: meta.namespace.take(),
        uid: meta.uid.take(),
        resource_version: meta.resource_version.take(),
        generation: meta.generation,
        deletion_timestamp: meta.deletion_timestamp.take(),
        finalizers: meta.finalizers.take().filter(|f| !f.is_empty()),
        annotations: annotations.filter(|a| !a.is_empty()),
        ..Default::default()
    };
}

/// A provider copy as the syncer's provider cache holds it: exactly the facts a sync reads, and
/// nothing of the object's metadata maps (a map node costs hundreds of bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderCopy {
    /// Name.
    pub name: Box<str>,
    /// Namespace.
    pub namespace: Option<Box<str>>,
    /// Its consumer-cluster UID annotation (OWN-1).
    pub cluster_marker: Option<Box<str>>,
    /// Its consumer-object UID annotation (OWN-1).
    pub object_marker: Option<Box<str>>,
    /// It carries kbind's managed label.
    pub managed: bool,
    /// It is being deleted.
    pub terminating: bool,
    /// Its spec.
    pub spec: Option<Json>,
    /// Its status, for status down.
    pub status: Option<Json>,
    /// When kbind last wrote it ([`crate::delivery::applied_at`]).
    pub applied_at: Option<Box<str>>,
}

impl ProviderCopy {
    /// The facts of a provider object, as a watch delivered it.
    pub fn of(object: Instance) -> Self {
        let Instance {
            metadata,
            spec,
            status,
        } = object;
        let applied_at = crate::delivery::applied_at(&metadata).map(String::into_boxed_str);
        let mut annotations = metadata.annotations.unwrap_or_default();
        let mut marker = |key: &str| annotations.remove(key).map(String::into_boxed_str);
        ProviderCopy {
            cluster_marker: marker(crate::keys::CONSUMER_CLUSTER_UID_ANNOTATION),
            object_marker: marker(crate::keys::CONSUMER_OBJECT_UID_ANNOTATION),
            managed: metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(crate::keys::MANAGED_LABEL))
                .is_some_and(|v| v == crate::keys::TRUE),
            terminating: metadata.deletion_timestamp.is_some(),
            name: metadata.name.unwrap_or_default().into_boxed_str(),
            namespace: metadata.namespace.map(String::into_boxed_str),
            spec,
            status,
            applied_at,
        }
    }

    /// OWN-1: whose it is.
    pub fn owner(&self, local_uid: &str, object_uid: &str) -> crate::ownership::Owner {
        crate::ownership::classify_markers(
            self.cluster_marker.as_deref(),
            self.object_marker.as_deref(),
            local_uid,
            object_uid,
        )
    }

    /// "No write when nothing changed": it already carries exactly what a spec-up
    /// (`ownership::spec_up_body`) would apply: the consumer's `spec`, kbind's label and both
    /// markers naming this consumer cluster and object.
    pub fn is_current(&self, spec: Option<&Json>, local_uid: &str, object_uid: &str) -> bool {
        self.managed
            && self.cluster_marker.as_deref() == Some(local_uid)
            && self.object_marker.as_deref() == Some(object_uid)
            && self.spec.as_ref() == spec
    }
}

impl kube::runtime::reflector::Lookup for ProviderCopy {
    type DynamicType = InstanceType;

    fn kind(dt: &InstanceType) -> Cow<'_, str> {
        Cow::Borrowed(&dt.kind)
    }
    fn group(dt: &InstanceType) -> Cow<'_, str> {
        Cow::Borrowed(&dt.group)
    }
    fn version(dt: &InstanceType) -> Cow<'_, str> {
        Cow::Borrowed(&dt.version)
    }
    fn plural(dt: &InstanceType) -> Cow<'_, str> {
        Cow::Borrowed(&dt.plural)
    }
    fn name(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(&self.name))
    }
    fn namespace(&self) -> Option<Cow<'_, str>> {
        self.namespace.as_deref().map(Cow::Borrowed)
    }
    /// Not kept: nothing reads it, and the cache key would copy it.
    fn resource_version(&self) -> Option<Cow<'_, str>> {
        None
    }
    /// Not kept, as above (deletion reads the copy afresh, UID included).
    fn uid(&self) -> Option<Cow<'_, str>> {
        None
    }
}

/// A watch event with its object turned into another form (for a cache that keeps a compact
/// form of what the watch delivers).
pub fn map_event<A, B>(event: watcher::Event<A>, f: impl FnOnce(A) -> B) -> watcher::Event<B> {
    match event {
        watcher::Event::Apply(o) => watcher::Event::Apply(f(o)),
        watcher::Event::Delete(o) => watcher::Event::Delete(f(o)),
        watcher::Event::InitApply(o) => watcher::Event::InitApply(f(o)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// What the schema manager's conflict counts keep of an instance's metadata: its name, namespace
/// and conflict annotation — nothing else.
pub fn conflict_metadata(meta: &mut ObjectMeta) {
    let conflict = meta
        .annotations
        .as_mut()
        .and_then(|a| a.remove(crate::keys::CONFLICT_ANNOTATION));
    *meta = ObjectMeta {
        name: meta.name.take(),
        namespace: meta.namespace.take(),
        annotations: conflict.map(|c| {
            std::collections::BTreeMap::from([(crate::keys::CONFLICT_ANNOTATION.to_owned(), c)])
        }),
        ..Default::default()
    };
}

/// Keeps a conflict cache down to the instances that carry a conflict annotation (most carry
/// none): a listed instance without one is not cached, and one that loses it is removed as if
/// deleted.
pub fn only_conflicting<K: Resource>(event: watcher::Event<K>) -> Option<watcher::Event<K>> {
    let conflicting = |o: &K| {
        o.meta()
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(crate::keys::CONFLICT_ANNOTATION))
    };
    match event {
        watcher::Event::InitApply(o) if !conflicting(&o) => None,
        watcher::Event::Apply(o) if !conflicting(&o) => Some(watcher::Event::Delete(o)),
        event => Some(event),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys;
    use crate::ownership::Owner;
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
                "kubectl.kubernetes.io/last-applied-configuration": "{\"a huge\": \"copy\"}",
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

    /// A full instance as a watch delivers it.
    fn instance() -> Value {
        json!({
            "apiVersion": "example.org/v1",
            "kind": "Widget",
            "metadata": meta(),
            "spec": { "size": 3, "nested": { "b": [1, 2], "a": "x" } },
            "status": { "phase": "Ready" },
            "other": { "top-level": "field" },
        })
    }

    #[test]
    fn json_is_compact_canonical_text_and_never_shows_its_content() {
        let a: Json =
            serde_json::from_str(r#"{ "b": 1,  "a": { "y": [1, 2.5], "x": null } }"#).unwrap();
        let b: Json = serde_json::from_str(r#"{"a":{"x":null,"y":[1,2.5]},"b":1}"#).unwrap();
        assert_eq!(a.as_str(), r#"{"a":{"x":null,"y":[1,2.5]},"b":1}"#);
        // Equal values, whatever the order and spacing they came in: equal texts.
        assert_eq!(a, b);
        assert_eq!(
            a.value(),
            json!({ "a": { "x": null, "y": [1, 2.5] }, "b": 1 })
        );
        let c: Json = serde_json::from_str(r#"{"a":{"x":null,"y":[1,2.5]},"b":2}"#).unwrap();
        assert_ne!(a, c);
        assert_eq!(format!("{a:?}"), "Json(34 bytes)");
    }

    #[test]
    fn a_consumer_instance_keeps_what_a_sync_reads() {
        let mut object: Instance = serde_json::from_value(instance()).unwrap();
        consumer_metadata(&mut object.metadata);
        let full = meta();
        // Spec and status, compact; nothing else of the body.
        assert_eq!(
            object.spec.as_ref().unwrap().value(),
            json!({ "size": 3, "nested": { "b": [1, 2], "a": "x" } })
        );
        assert_eq!(
            object.status.as_ref().unwrap().value(),
            json!({ "phase": "Ready" })
        );
        // What the decisions read is all there: identity, the finalizer patch's guard,
        // generation, deletion, finalizers, the conflict and the deletion policy.
        let kept = &object.metadata;
        assert_eq!(
            (
                &kept.name,
                &kept.namespace,
                &kept.uid,
                &kept.resource_version
            ),
            (
                &full.name,
                &full.namespace,
                &full.uid,
                &full.resource_version
            )
        );
        assert_eq!(kept.generation, Some(3));
        assert_eq!(kept.deletion_timestamp, full.deletion_timestamp);
        assert!(crate::finalizers::has(kept, keys::SYNCER_FINALIZER));
        assert_eq!(
            serde_json::to_value(&kept.annotations).unwrap(),
            json!({
                keys::CONFLICT_ANNOTATION: keys::CONFLICT_FOREIGN,
                keys::DELETION_POLICY_ANNOTATION: keys::DELETION_POLICY_ORPHAN,
            })
        );
        // Gone: labels, other annotations, managedFields, timestamps.
        assert_eq!(
            (&kept.labels, &kept.managed_fields, &kept.creation_timestamp),
            (&None, &None, &None)
        );
        // Nothing of kbind's: no maps at all.
        let mut plain = meta();
        plain.annotations = Some([("a".to_owned(), "b".to_owned())].into());
        plain.finalizers = Some(vec![]);
        consumer_metadata(&mut plain);
        assert_eq!((plain.annotations, plain.finalizers), (None, None));
        // No spec or status: none, and a null one is none too.
        let bare: Instance =
            serde_json::from_value(json!({ "metadata": { "name": "w" }, "status": null })).unwrap();
        assert_eq!((bare.spec, bare.status), (None, None));
    }

    #[test]
    fn a_provider_copy_keeps_the_facts_a_sync_reads() {
        let copy = ProviderCopy::of(serde_json::from_value(instance()).unwrap());
        assert_eq!(
            copy,
            ProviderCopy {
                name: "w1".into(),
                namespace: Some("team-a".into()),
                cluster_marker: Some("c".into()),
                object_marker: Some("o".into()),
                managed: true,
                terminating: true,
                spec: Some(Json::new(
                    &json!({ "size": 3, "nested": { "a": "x", "b": [1, 2] } })
                )),
                status: Some(Json::new(&json!({ "phase": "Ready" }))),
                // kbind's own entry's time, not kubectl's.
                applied_at: Some("2026-12-01T00:00:02Z".into()),
            }
        );
        assert_eq!(
            copy.applied_at.as_deref(),
            crate::delivery::applied_at(&meta()).as_deref()
        );
        assert_eq!(copy.owner("c", "o"), Owner::Ours);
        assert_eq!(copy.owner("c", "another-object"), Owner::Another);
        let unmarked = ProviderCopy::of(
            serde_json::from_value(json!({ "metadata": { "name": "w" } })).unwrap(),
        );
        assert_eq!(unmarked.owner("c", "o"), Owner::Unmarked);
        assert_eq!(
            (unmarked.managed, unmarked.terminating, unmarked.applied_at),
            (false, false, None)
        );
        // The cache key holds name and namespace only.
        use kube::runtime::reflector::Lookup;
        let dt: InstanceType = Arc::new(
            ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
        );
        let key = copy.to_object_ref(dt);
        assert_eq!(
            (key.name.as_str(), key.namespace.as_deref()),
            ("w1", Some("team-a"))
        );
        assert_eq!((key.extra.resource_version, key.extra.uid), (None, None));
    }

    #[test]
    fn a_provider_copy_is_current_when_it_carries_what_a_spec_up_applies() {
        let spec = json!({ "size": 3 });
        let mut applied = crate::ownership::spec_up_body(
            "example.org/v1",
            "Widget",
            Some("ns"),
            "w",
            Some(&spec),
            "c",
            "o",
        );
        applied["status"] = json!({ "phase": "Ready" });
        applied["metadata"]["labels"]["other"] = json!("x");
        let copy = ProviderCopy::of(serde_json::from_value(applied.clone()).unwrap());
        let consumer = |v: Value| Some(Json::new(&v));
        assert!(copy.is_current(consumer(json!({ "size": 3 })).as_ref(), "c", "o"));
        assert!(!copy.is_current(consumer(json!({ "size": 4 })).as_ref(), "c", "o"));
        assert!(!copy.is_current(None, "c", "o"));
        assert!(!copy.is_current(consumer(spec.clone()).as_ref(), "c", "another-object"));
        assert!(!copy.is_current(consumer(spec.clone()).as_ref(), "another-cluster", "o"));
        // Without kbind's label, a spec-up still has something to apply.
        applied["metadata"]["labels"] = json!({});
        let unlabelled = ProviderCopy::of(serde_json::from_value(applied).unwrap());
        assert!(!unlabelled.is_current(consumer(spec).as_ref(), "c", "o"));
        // No spec on either side: current.
        let bare = crate::ownership::spec_up_body("v1", "W", None, "w", None, "c", "o");
        let copy = ProviderCopy::of(serde_json::from_value(bare).unwrap());
        assert!(copy.is_current(None, "c", "o"));
    }

    #[test]
    fn events_map_one_to_one() {
        let double = |n: i32| n * 2;
        assert!(matches!(
            map_event(watcher::Event::Apply(1), double),
            watcher::Event::Apply(2)
        ));
        assert!(matches!(
            map_event(watcher::Event::Delete(2), double),
            watcher::Event::Delete(4)
        ));
        assert!(matches!(
            map_event(watcher::Event::InitApply(3), double),
            watcher::Event::InitApply(6)
        ));
        assert!(matches!(
            map_event(watcher::Event::<i32>::Init, double),
            watcher::Event::Init
        ));
        assert!(matches!(
            map_event(watcher::Event::<i32>::InitDone, double),
            watcher::Event::InitDone
        ));
    }

    #[test]
    fn a_conflict_cache_holds_only_conflicting_instances() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let object = |conflict: bool| ConfigMap {
            metadata: ObjectMeta {
                name: Some("w".into()),
                annotations: conflict.then(|| {
                    [(
                        keys::CONFLICT_ANNOTATION.to_owned(),
                        keys::CONFLICT_FOREIGN.to_owned(),
                    )]
                    .into()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let kind = |e: Option<watcher::Event<ConfigMap>>| match e {
            None => "dropped",
            Some(watcher::Event::Apply(_)) => "apply",
            Some(watcher::Event::Delete(_)) => "delete",
            Some(watcher::Event::InitApply(_)) => "init-apply",
            Some(watcher::Event::Init) => "init",
            Some(watcher::Event::InitDone) => "init-done",
        };
        let cases = [
            (watcher::Event::InitApply(object(true)), "init-apply"),
            (watcher::Event::InitApply(object(false)), "dropped"),
            (watcher::Event::Apply(object(true)), "apply"),
            // Resolved: removed from the cache (a no-op when it was never there).
            (watcher::Event::Apply(object(false)), "delete"),
            (watcher::Event::Delete(object(false)), "delete"),
            (watcher::Event::Delete(object(true)), "delete"),
            (watcher::Event::Init, "init"),
            (watcher::Event::InitDone, "init-done"),
        ];
        for (event, want) in cases {
            assert_eq!(kind(only_conflicting(event)), want);
        }
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
