//! Watch-fed caches (kube-runtime reflectors): one whose stream runs on its own task and reports
//! every event, so that callers can wait for its readiness once and react to change; and the
//! compact forms the caches of synced instances hold — only what decisions read, so that memory
//! per cached object stays a few hundred bytes (issue #15; each transform is tested below for
//! what it drops and for what the decisions still find).

use std::borrow::Cow;
use std::collections::BTreeMap;
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

/// What a typed watch-fed cache holds: a typed Kubernetes object that can be read from the API and
/// shared between tasks.
pub trait Cacheable:
    kube::Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<K> Cacheable for K where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// Starts caching `api` (filtered by `config`) until `stop`; `on_change` runs after every event.
pub fn spawn<K>(
    api: Api<K>,
    config: watcher::Config,
    stop: CancellationToken,
    on_change: impl Fn() + Send + 'static,
) -> Store<K>
where
    K: Cacheable,
{
    let (reader, writer) = reflector::store();
    observe(writer, api, config, stop, move |event| {
        if event.is_ok() {
            on_change();
        }
    });
    reader
}

/// Starts caching `api` (filtered by `config`) until `stop`, each object as `modify` leaves it
/// (e.g. without what no reader needs); `observer` sees every event once the cache holds it.
pub fn spawn_modified<K>(
    api: Api<K>,
    config: watcher::Config,
    stop: CancellationToken,
    modify: impl FnMut(&mut K) + Send + 'static,
    observer: impl Fn(Result<&watcher::Event<K>, &watcher::Error>) + Send + 'static,
) -> Store<K>
where
    K: Cacheable,
{
    let (reader, writer) = reflector::store();
    observe_modified(writer, api, config, stop, modify, observer);
    reader
}

/// Caches only the names and namespaces of `resource`'s objects (a metadata watch; every other
/// field is dropped before the cache holds it, so an object costs its two strings) until `stop`:
/// what a "which namespaces hold objects" question needs. `observer` sees every event once the
/// cache holds it.
pub fn spawn_names(
    client: kube::Client,
    resource: &ApiResource,
    stop: CancellationToken,
    observer: impl Fn(
        Result<
            &watcher::Event<kube::core::PartialObjectMeta<kube::api::DynamicObject>>,
            &watcher::Error,
        >,
    ) + Send
    + 'static,
) -> Store<kube::core::PartialObjectMeta<kube::api::DynamicObject>> {
    let api =
        Api::<kube::core::PartialObjectMeta<kube::api::DynamicObject>>::all_with(client, resource);
    let writer = reflector::store::Writer::new(resource.clone());
    let reader = writer.as_reader();
    let stream = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default()).modify(|o| {
            let meta = std::mem::take(&mut o.metadata);
            o.metadata = ObjectMeta {
                name: meta.name,
                namespace: meta.namespace,
                ..ObjectMeta::default()
            };
        }),
    )
    .default_backoff();
    drive(stream, stop, observer);
    reader
}

/// [`observe`], each object as `modify` leaves it before the cache holds it.
pub fn observe_modified<K>(
    writer: reflector::store::Writer<K>,
    api: Api<K>,
    config: watcher::Config,
    stop: CancellationToken,
    modify: impl FnMut(&mut K) + Send + 'static,
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
    observe_stream(
        writer,
        Box::pin(watcher(api, config).modify(modify)),
        stop,
        observer,
    );
}

/// [`observe`] of watch events already made — one watch, or several namespaces' merged
/// ([`crate::namespaced::Namespaced`]).
pub fn observe_stream<K>(
    writer: reflector::store::Writer<K>,
    events: crate::streaming::Events<K>,
    stop: CancellationToken,
    observer: impl Fn(Result<&watcher::Event<K>, &watcher::Error>) + Send + 'static,
) where
    K: kube::Resource + Clone + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    drive(
        reflector::reflector(writer, events).default_backoff(),
        stop,
        observer,
    );
}

/// [`observe_modified`], whose watch starts again — a fresh list into the same cache — each time
/// `restart` changes: for kbind's own kinds, whose watches an API server stops feeding for up to
/// two request timeouts after their CRD's schema changes (it keeps them on the storage it is
/// tearing down). See [`core_schema_changes`].
pub fn observe_restartable<K>(
    mut writer: reflector::store::Writer<K>,
    api: Api<K>,
    config: watcher::Config,
    stop: CancellationToken,
    mut restart: tokio::sync::watch::Receiver<u64>,
    mut modify: impl FnMut(&mut K) + Send + 'static,
    observer: impl Fn(Result<&watcher::Event<K>, &watcher::Error>) + Send + 'static,
) where
    K: Cacheable,
{
    tokio::spawn(async move {
        loop {
            let stream = watcher(api.clone(), config.clone()).default_backoff();
            let mut stream = std::pin::pin!(stream);
            let again = loop {
                tokio::select! {
                    event = stream.next() => match event {
                        Some(Ok(event)) => {
                            let event = event.modify(&mut modify);
                            writer.apply_watcher_event(&event);
                            observer(Ok(&event));
                        }
                        Some(Err(e)) => observer(Err(&e)),
                        None => break false,
                    },
                    changed = restart.changed() => break changed.is_ok(),
                    _ = stop.cancelled() => break false,
                }
            };
            if !again {
                break;
            }
        }
    });
}

/// kbind's core CRDs (`connections`, `clusterbindings`, `bindings` of `core.kbind.io`).
pub const CORE_CRDS: [&str; 3] = [
    "connections.core.kbind.io",
    "clusterbindings.core.kbind.io",
    "bindings.core.kbind.io",
];

/// Whether a core CRD's schema changed: its `metadata.generation` differs from the one last seen
/// (first sight is no change).
pub fn schema_changed(
    seen: &mut std::collections::HashMap<String, i64>,
    name: &str,
    generation: i64,
) -> bool {
    if !CORE_CRDS.contains(&name) {
        return false;
    }
    seen.insert(name.to_owned(), generation)
        .is_some_and(|before| before != generation)
}

/// A counter that goes up, a couple of seconds after the API server saw it, each time one of
/// kbind's core CRDs changes its schema — what [`observe_restartable`] caches restart on. One
/// metadata-only watch of CRDs (names and generations: a few strings per CRD).
pub fn core_schema_changes(
    client: kube::Client,
    stop: CancellationToken,
) -> tokio::sync::watch::Receiver<u64> {
    let (sender, receiver) = tokio::sync::watch::channel(0u64);
    let api = Api::<kube::core::PartialObjectMeta<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    >>::all(client);
    tokio::spawn(async move {
        let mut seen = std::collections::HashMap::new();
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .applied_objects();
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                next = stream.next() => match next {
                    Some(Ok(crd)) => {
                        let name = crd.metadata.name.clone().unwrap_or_default();
                        let generation = crd.metadata.generation.unwrap_or_default();
                        if schema_changed(&mut seen, &name, generation) {
                            // The API server serves the new schema from new storage once its
                            // own watch of the CRD has it: give it that moment.
                            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                            sender.send_modify(|n| *n += 1);
                        }
                    }
                    Some(Err(_)) => {}
                    None => break,
                },
                _ = stop.cancelled() => break,
            }
        }
    });
    receiver
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
    observe_modified(writer, api, config, stop, |_| {}, observer);
}

/// A watch of `api` whose events only `observer` sees (nothing is cached), until `stop`; backs
/// off on errors like a cache's.
pub fn observe_uncached<K>(
    api: Api<K>,
    config: watcher::Config,
    stop: CancellationToken,
    observer: impl Fn(Result<&watcher::Event<K>, &watcher::Error>) + Send + 'static,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    drive(watcher(api, config).default_backoff(), stop, observer);
}

/// An object's namespace (`None`: cluster-scoped) and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Its namespace, if namespaced.
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
}

/// Which objects a watch shows changed, re-lists included: an `Apply` or `Delete` names its
/// object at once; a (re-)list names, at its `InitDone` (when the cache holds it), each object
/// whose resourceVersion differs from the last one seen and each object the list no longer has. A
/// reaction keyed on changes thus never misses one that a watch gap (an expired resourceVersion,
/// an API server restart) delivered only inside a re-list.
#[derive(Debug, Default)]
pub struct ChangedNames {
    /// key → resourceVersion, as the cache holds them.
    seen: std::collections::HashMap<ObjectKey, String>,
    /// The (re-)list in progress, until its `InitDone`.
    listing: Option<std::collections::HashMap<ObjectKey, String>>,
}

impl ChangedNames {
    /// The objects `event` shows changed (sorted; empty while a list is in progress).
    pub fn observe<K: Resource>(&mut self, event: &watcher::Event<K>) -> Vec<ObjectKey> {
        let entry = |o: &K| {
            let meta = o.meta();
            let key = ObjectKey {
                namespace: meta.namespace.clone(),
                name: meta.name.clone().unwrap_or_default(),
            };
            (key, meta.resource_version.clone().unwrap_or_default())
        };
        match event {
            watcher::Event::Apply(o) => {
                let (key, version) = entry(o);
                self.seen.insert(key.clone(), version);
                vec![key]
            }
            watcher::Event::Delete(o) => {
                let (key, _) = entry(o);
                self.seen.remove(&key);
                vec![key]
            }
            watcher::Event::Init => {
                self.listing = Some(Default::default());
                Vec::new()
            }
            watcher::Event::InitApply(o) => {
                let (key, version) = entry(o);
                self.listing
                    .get_or_insert_with(Default::default)
                    .insert(key, version);
                Vec::new()
            }
            watcher::Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                let old = std::mem::replace(&mut self.seen, listed);
                let mut changed: Vec<ObjectKey> = self
                    .seen
                    .iter()
                    .filter(|(key, version)| old.get(*key) != Some(*version))
                    .map(|(key, _)| key.clone())
                    .chain(
                        old.keys()
                            .filter(|key| !self.seen.contains_key(*key))
                            .cloned(),
                    )
                    .collect();
                changed.sort();
                changed
            }
        }
    }
}

/// Polls a reflector's `stream` on its own task until `stop`, showing `observer` each item.
fn drive<K: Send + 'static>(
    stream: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    stop: CancellationToken,
    observer: impl Fn(Result<&watcher::Event<K>, &watcher::Error>) + Send + 'static,
) {
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
/// Two facts are read off the object as it arrives, before its metadata and status are reduced
/// to text: when its spec last changed and its delivery record — what the backlog and the lag are
/// derived from without parsing anything again.
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "RawInstance")]
pub struct Instance {
    /// Metadata.
    pub metadata: ObjectMeta,
    /// `spec`.
    pub spec: Option<Json>,
    /// `status`.
    pub status: Option<Json>,
    /// When its spec last changed, as its API server recorded it ([`crate::delivery::changed_at`]).
    pub changed_at: Option<crate::delivery::Seconds>,
    /// Its delivery record ([`crate::delivery::summary`]).
    pub delivery: Option<crate::delivery::Summary>,
    /// Its labels, compact: what a routed API's selectors read (#36). Kept whether the API is
    /// routed or not, so that it becomes routed without a re-list (#50.3). The import label only
    /// when kbind set it ([`crate::import::evidenced_labels`]).
    pub labels: Labels,
}

/// An object's labels in one allocation — `key\0value\0key\0value…` (neither a label key nor
/// a value can hold a NUL) — instead of a map, which costs hundreds of bytes per object for a
/// single label; none: no allocation at all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels(Option<Box<str>>);

impl Labels {
    /// `labels`, compact.
    pub fn of(labels: Option<&BTreeMap<String, String>>) -> Self {
        let Some(labels) = labels.filter(|l| !l.is_empty()) else {
            return Labels(None);
        };
        let mut text = String::new();
        for (key, value) in labels {
            if !text.is_empty() {
                text.push('\0');
            }
            text.push_str(key);
            text.push('\0');
            text.push_str(value);
        }
        Labels(Some(text.into_boxed_str()))
    }

    /// The value of the label `key`, if the object has it (read in place, no map built).
    pub fn get(&self, key: &str) -> Option<&str> {
        let mut parts = self.0.as_deref()?.split('\0');
        while let (Some(k), Some(value)) = (parts.next(), parts.next()) {
            if k == key {
                return Some(value);
            }
        }
        None
    }

    /// The labels as a map (what a selector matches).
    pub fn map(&self) -> BTreeMap<String, String> {
        let Some(text) = &self.0 else {
            return BTreeMap::new();
        };
        let mut parts = text.split('\0');
        let mut map = BTreeMap::new();
        while let (Some(key), Some(value)) = (parts.next(), parts.next()) {
            map.insert(key.to_owned(), value.to_owned());
        }
        map
    }
}

/// An [`Instance`] as its JSON holds it.
#[derive(Deserialize)]
struct RawInstance {
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<Value>,
    #[serde(default)]
    status: Option<Value>,
}

impl From<RawInstance> for Instance {
    fn from(raw: RawInstance) -> Self {
        let present = |v: Option<Value>| v.filter(|v| !v.is_null());
        let status = present(raw.status);
        Instance {
            changed_at: crate::delivery::changed_at(&raw.metadata)
                .and_then(|t| crate::delivery::Seconds::of(&t)),
            delivery: crate::delivery::summary(status.as_ref()),
            labels: Labels::of(
                crate::import::evidenced_labels(&raw.metadata)
                    .as_ref()
                    .or(raw.metadata.labels.as_ref()),
            ),
            metadata: raw.metadata,
            spec: present(raw.spec).as_ref().map(Json::new),
            status: status.as_ref().map(Json::new),
        }
    }
}

impl Instance {
    /// An instance of `metadata`, `spec` and `status`, with the facts [`Instance`] reads off.
    pub fn new(metadata: ObjectMeta, spec: Option<&Value>, status: Option<&Value>) -> Self {
        Instance {
            changed_at: crate::delivery::changed_at(&metadata)
                .and_then(|t| crate::delivery::Seconds::of(&t)),
            delivery: crate::delivery::summary(status),
            labels: Labels::of(
                crate::import::evidenced_labels(&metadata)
                    .as_ref()
                    .or(metadata.labels.as_ref()),
            ),
            metadata,
            spec: spec.map(Json::new),
            status: status.map(Json::new),
        }
    }
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
const CONSUMER_ANNOTATIONS: [&str; 5] = [
    crate::keys::CLAIM_ANNOTATION,
    crate::keys::CONFLICT_ANNOTATION,
    crate::keys::DELETION_POLICY_ANNOTATION,
    crate::keys::PAUSED_ANNOTATION,
    crate::keys::ROUTE_ANNOTATION,
];

/// What the syncer's consumer cache keeps of an instance's metadata: identity (name, namespace,
/// UID), the resourceVersion a finalizer patch is guarded by, generation (the delivery record),
/// deletion, finalizers, and kbind's annotations ([`CONSUMER_ANNOTATIONS`]). Gone: labels (the
/// instance keeps them compact, [`Labels`]), every other annotation (kubectl's last-applied copy can be as large as the object),
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
    /// Its consumer-cluster UID annotation, against this consumer's (OWN-1).
    pub cluster_marker: ClusterMarker,
    /// Its consumer-object UID annotation (OWN-1).
    pub object_marker: Uid,
    /// It carries kbind's managed label.
    pub managed: bool,
    /// It carries this consumer cluster's UID label (the label a provider watch selects by,
    /// [`crate::keys::CONSUMER_CLUSTER_UID_LABEL`]): a copy written before the label existed
    /// lacks it until its next spec-up.
    pub labelled: bool,
    /// It is being deleted.
    pub terminating: bool,
    /// Its spec.
    pub spec: Option<Json>,
    /// Its status, for status down.
    pub status: Option<Json>,
    /// The size of a status larger than the syncer copies down (`--max-status-bytes`): then
    /// [`Self::status`] is `None`, and the cache never holds the oversized text.
    pub oversized_status: Option<usize>,
    /// When kbind last wrote it (the time of [`crate::delivery::applied_at`]).
    pub applied_at: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// When its status was last written ([`crate::delivery::status_changed_at`]).
    pub status_at: Option<crate::delivery::Seconds>,
}

/// A provider copy's consumer-cluster marker, compared with this consumer's identity once, when
/// the copy is cached (it is the same for every copy a worker sees).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterMarker {
    /// None, or empty.
    Absent,
    /// This consumer cluster's UID.
    Local,
    /// Anything else.
    Other,
}

/// A UID held without an allocation when it has the canonical form (lowercase 8-4-4-4-12 hex,
/// as API servers make them); any other text is kept as it is, so that comparing stays exactly
/// a comparison of the texts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Uid {
    /// None, or empty.
    Absent,
    /// A canonical UUID.
    Uuid(u128),
    /// Any other text.
    Text(Box<str>),
}

impl Uid {
    /// The UID `text` (`None` or empty: absent).
    pub fn new(text: Option<&str>) -> Self {
        match text {
            None | Some("") => Uid::Absent,
            Some(text) => canonical_uuid(text)
                .map(Uid::Uuid)
                .unwrap_or_else(|| Uid::Text(text.into())),
        }
    }

    /// Whether this is exactly the UID `text`.
    pub fn is(&self, text: &str) -> bool {
        *self == Uid::new(Some(text))
    }
}

/// The value of a canonical UUID text: 36 characters, lowercase hex digits in groups of
/// 8-4-4-4-12 separated by `-`.
fn canonical_uuid(text: &str) -> Option<u128> {
    let bytes = text.as_bytes();
    if bytes.len() != 36 {
        return None;
    }
    let mut value: u128 = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if matches!(i, 8 | 13 | 18 | 23) {
            if b != b'-' {
                return None;
            }
            continue;
        }
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => return None,
        };
        value = (value << 4) | u128::from(digit);
    }
    Some(value)
}

impl ProviderCopy {
    /// The facts of a provider object, as a watch delivered it, for the consumer cluster whose
    /// UID is `local_uid`.
    pub fn of(object: Instance, local_uid: &str) -> Self {
        let Instance {
            metadata,
            spec,
            status,
            ..
        } = object;
        let applied_at = crate::delivery::applied_time(&metadata).cloned();
        let status_at = crate::delivery::status_changed_at(&metadata)
            .and_then(|t| crate::delivery::Seconds::of(&t));
        let annotations = metadata.annotations.unwrap_or_default();
        let marker = |key: &str| annotations.get(key).map(String::as_str);
        let label = |key: &str| {
            metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(key))
                .map(String::as_str)
        };
        ProviderCopy {
            cluster_marker: match marker(crate::keys::CONSUMER_CLUSTER_UID_ANNOTATION) {
                None | Some("") => ClusterMarker::Absent,
                Some(uid) if uid == local_uid => ClusterMarker::Local,
                Some(_) => ClusterMarker::Other,
            },
            object_marker: Uid::new(marker(crate::keys::CONSUMER_OBJECT_UID_ANNOTATION)),
            managed: label(crate::keys::MANAGED_LABEL) == Some(crate::keys::TRUE),
            labelled: label(crate::keys::CONSUMER_CLUSTER_UID_LABEL) == Some(local_uid),
            terminating: metadata.deletion_timestamp.is_some(),
            name: metadata.name.unwrap_or_default().into_boxed_str(),
            namespace: metadata.namespace.map(String::into_boxed_str),
            spec,
            status,
            oversized_status: None,
            applied_at,
            status_at,
        }
    }

    /// The same facts with a status of more than `max_bytes` (its compact JSON) dropped and its
    /// size kept instead: what a provider can make the syncer hold is bounded per object.
    pub fn bounded(mut self, max_bytes: usize) -> Self {
        if let Some(status) = &self.status
            && status.as_str().len() > max_bytes
        {
            self.oversized_status = Some(status.as_str().len());
            self.status = None;
        }
        self
    }

    /// OWN-1 (`ownership::classify`): whose it is, for the consumer object `object_uid` of this
    /// consumer cluster.
    pub fn owner(&self, object_uid: &str) -> crate::ownership::Owner {
        use crate::ownership::Owner;
        match (self.cluster_marker, &self.object_marker) {
            (ClusterMarker::Absent, Uid::Absent) => Owner::Unmarked,
            (ClusterMarker::Local, marker) if marker.is(object_uid) => Owner::Ours,
            _ => Owner::Another,
        }
    }

    /// When kbind last wrote it, as the delivery record states it.
    pub fn applied_at(&self) -> Option<String> {
        self.applied_at.as_ref().map(|t| t.0.to_string())
    }

    /// "No write when nothing changed": it already carries exactly what a spec-up
    /// (`ownership::spec_up_body`) would apply: the consumer's `spec`, kbind's labels and both
    /// markers naming this consumer cluster and the consumer object `object_uid`.
    pub fn is_current(&self, spec: Option<&Json>, object_uid: &str) -> bool {
        self.managed
            && self.labelled
            && self.cluster_marker == ClusterMarker::Local
            && self.object_marker.is(object_uid)
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

/// Whether an instance carries a mark the schema manager counts per binding: a conflict
/// annotation, or `core.kbind.io/paused: "true"`.
pub fn marked(meta: &ObjectMeta) -> bool {
    meta.annotations.as_ref().is_some_and(|a| {
        a.contains_key(crate::keys::CONFLICT_ANNOTATION)
            || a.get(crate::keys::PAUSED_ANNOTATION).map(String::as_str) == Some(crate::keys::TRUE)
    })
}

/// What the schema manager's counts keep of an instance's metadata: its name, namespace, conflict
/// annotation and pause mark — nothing else.
pub fn marked_metadata(meta: &mut ObjectMeta) {
    let mut annotations = meta.annotations.take().unwrap_or_default();
    let kept: std::collections::BTreeMap<String, String> = [
        crate::keys::CONFLICT_ANNOTATION,
        crate::keys::PAUSED_ANNOTATION,
    ]
    .into_iter()
    .filter_map(|key| annotations.remove_entry(key))
    .filter(|(key, value)| key != crate::keys::PAUSED_ANNOTATION || value == crate::keys::TRUE)
    .collect();
    *meta = ObjectMeta {
        name: meta.name.take(),
        namespace: meta.namespace.take(),
        annotations: (!kept.is_empty()).then_some(kept),
        ..Default::default()
    };
}

/// Keeps a marks cache down to the instances that carry a mark ([`marked`]; most carry none): a
/// listed instance without one is not cached, and one that loses it is removed as if deleted.
pub fn only_marked<K: Resource>(event: watcher::Event<K>) -> Option<watcher::Event<K>> {
    match event {
        watcher::Event::InitApply(o) if !marked(o.meta()) => None,
        watcher::Event::Apply(o) if !marked(o.meta()) => Some(watcher::Event::Delete(o)),
        event => Some(event),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_core_crds_new_generation_is_a_schema_change() {
        let mut seen = std::collections::HashMap::new();
        assert!(
            !schema_changed(&mut seen, "connections.core.kbind.io", 1),
            "first sight"
        );
        assert!(!schema_changed(&mut seen, "connections.core.kbind.io", 1));
        assert!(schema_changed(&mut seen, "connections.core.kbind.io", 2));
        assert!(!schema_changed(&mut seen, "bindings.core.kbind.io", 7));
        assert!(schema_changed(&mut seen, "bindings.core.kbind.io", 8));
        assert!(!schema_changed(&mut seen, "widgets.example.org", 1));
        assert!(
            !schema_changed(&mut seen, "widgets.example.org", 2),
            "not a core CRD"
        );
    }
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
                { "manager": "provider-controller", "operation": "Update", "time": "2026-12-01T00:00:03Z",
                  "subresource": "status", "fieldsType": "FieldsV1", "fieldsV1": { "f:status": { "f:phase": {} } } },
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
    fn labels_are_kept_compact_and_read_back_whole() {
        let cases: [&[(&str, &str)]; 4] = [
            &[],
            &[("app", "bench")],
            &[
                ("region", "us"),
                ("tier", ""),
                ("app.kubernetes.io/name", "w"),
            ],
            &[("a", "x=y")],
        ];
        for labels in cases {
            let map: BTreeMap<String, String> = labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            let compact = Labels::of(Some(&map));
            assert_eq!(compact.map(), map, "{labels:?}");
            for (key, value) in labels {
                assert_eq!(compact.get(key), Some(*value), "{labels:?}");
            }
            // A value is never taken for a key.
            assert_eq!(compact.get("x=y"), None, "{labels:?}");
            assert_eq!(compact.get("us"), None, "{labels:?}");
            assert_eq!(
                compact == Labels::default(),
                labels.is_empty(),
                "{labels:?}"
            );
        }
        assert_eq!(Labels::of(None).map(), BTreeMap::new());
        let object: Instance = serde_json::from_value(instance()).unwrap();
        assert_eq!(Some(object.labels.map()), object.metadata.labels);
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
        // The user's pause is a decision's fact too.
        let mut paused = meta();
        paused.annotations = Some(
            [
                (keys::PAUSED_ANNOTATION.to_owned(), "true".to_owned()),
                ("a".to_owned(), "b".to_owned()),
            ]
            .into(),
        );
        consumer_metadata(&mut paused);
        assert_eq!(
            paused.annotations,
            Some([(keys::PAUSED_ANNOTATION.to_owned(), "true".to_owned())].into())
        );
        // No spec or status: none, and a null one is none too.
        let bare: Instance =
            serde_json::from_value(json!({ "metadata": { "name": "w" }, "status": null })).unwrap();
        assert_eq!((bare.spec, bare.status), (None, None));
        assert_eq!((bare.changed_at, bare.delivery), (None, None));
        // Read off before the metadata is reduced: when the spec changed (its newest spec
        // owner's entry, after the creation), and the record.
        let mut recorded = instance();
        recorded["metadata"]["creationTimestamp"] = json!("2026-12-01T00:00:00Z");
        recorded["status"]["kbindSync"] = json!({ "state": "Rejected", "generation": 2 });
        let recorded: Instance = serde_json::from_value(recorded).unwrap();
        assert_eq!(
            recorded
                .changed_at
                .map(|t| t.timestamp().to_string())
                .as_deref(),
            Some("2026-12-01T00:00:02Z")
        );
        assert_eq!(
            recorded.delivery.map(|d| (d.state, d.generation)),
            Some((
                crate::delivery::State::Rejected,
                std::num::NonZeroI64::new(2)
            ))
        );
    }

    #[test]
    fn a_provider_copy_keeps_the_facts_a_sync_reads() {
        let copy = ProviderCopy::of(serde_json::from_value(instance()).unwrap(), "c");
        assert_eq!(
            copy,
            ProviderCopy {
                name: "w1".into(),
                namespace: Some("team-a".into()),
                cluster_marker: ClusterMarker::Local,
                object_marker: Uid::Text("o".into()),
                managed: true,
                labelled: false,
                terminating: true,
                spec: Some(Json::new(
                    &json!({ "size": 3, "nested": { "a": "x", "b": [1, 2] } })
                )),
                status: Some(Json::new(&json!({ "phase": "Ready" }))),
                oversized_status: None,
                // kbind's own entry's time, not kubectl's.
                applied_at: serde_json::from_value(json!("2026-12-01T00:00:02Z")).unwrap(),
                // The provider's status write.
                status_at: crate::delivery::Seconds::of(
                    &serde_json::from_value(json!("2026-12-01T00:00:03Z")).unwrap()
                ),
            }
        );
        // The delivery record's time, exactly as it is read from the metadata.
        assert_eq!(copy.applied_at(), crate::delivery::applied_at(&meta()));
        assert_eq!(copy.applied_at().as_deref(), Some("2026-12-01T00:00:02Z"));
        assert_eq!(copy.owner("o"), Owner::Ours);
        assert_eq!(copy.owner("another-object"), Owner::Another);
        let elsewhere = ProviderCopy::of(serde_json::from_value(instance()).unwrap(), "other");
        assert_eq!(elsewhere.cluster_marker, ClusterMarker::Other);
        assert_eq!(elsewhere.owner("o"), Owner::Another);
        let unmarked = ProviderCopy::of(
            serde_json::from_value(json!({ "metadata": { "name": "w" } })).unwrap(),
            "c",
        );
        assert_eq!(unmarked.owner("o"), Owner::Unmarked);
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
    fn an_oversized_provider_status_is_not_held_only_its_size() {
        // #32.2: `{"phase":"Ready"}` is 17 bytes.
        let copy = || ProviderCopy::of(serde_json::from_value(instance()).unwrap(), "c");
        let kept = copy().bounded(17);
        assert_eq!((kept.status.is_some(), kept.oversized_status), (true, None));
        let dropped = copy().bounded(16);
        assert_eq!((dropped.status, dropped.oversized_status), (None, Some(17)));
        // Everything else is the same.
        assert_eq!(
            ProviderCopy {
                status: copy().status,
                oversized_status: None,
                ..dropped
            },
            copy()
        );
    }

    #[test]
    fn a_provider_copy_is_classified_as_ownership_classify_does() {
        // Every combination of the two markers (absent, empty, this, another, a UUID in both
        // cases) against one consumer cluster and object.
        let local = "0b2e4c9a-5d1f-4e8b-9a7c-3f6d2e1b0a98";
        let object = "5e8d1a7c-3b2f-4c9e-a6d0-000000000001";
        let values = [
            None,
            Some(""),
            Some(local),
            Some(object),
            Some("another"),
            Some("5E8D1A7C-3B2F-4C9E-A6D0-000000000001"),
        ];
        for cluster in values {
            for marker in values {
                let mut annotations = std::collections::BTreeMap::new();
                if let Some(v) = cluster {
                    annotations.insert(
                        keys::CONSUMER_CLUSTER_UID_ANNOTATION.to_owned(),
                        v.to_owned(),
                    );
                }
                if let Some(v) = marker {
                    annotations.insert(
                        keys::CONSUMER_OBJECT_UID_ANNOTATION.to_owned(),
                        v.to_owned(),
                    );
                }
                let copy = ProviderCopy::of(
                    Instance::new(
                        ObjectMeta {
                            name: Some("w".into()),
                            annotations: Some(annotations.clone()),
                            ..Default::default()
                        },
                        None,
                        None,
                    ),
                    local,
                );
                assert_eq!(
                    copy.owner(object),
                    crate::ownership::classify(&annotations, local, object),
                    "cluster {cluster:?}, object {marker:?}"
                );
            }
        }
    }

    #[test]
    fn a_uid_compares_as_its_text() {
        let uuid = "5e8d1a7c-3b2f-4c9e-a6d0-00000000000f";
        assert_eq!(
            Uid::new(Some(uuid)),
            Uid::Uuid(0x5e8d1a7c_3b2f_4c9e_a6d0_00000000000f)
        );
        assert!(Uid::new(Some(uuid)).is(uuid));
        // Not the canonical form: kept as text, and unequal to the canonical one.
        for other in [
            "5E8D1A7C-3B2F-4C9E-A6D0-00000000000F",
            "5e8d1a7c3b2f4c9ea6d000000000000f",
            "5e8d1a7c-3b2f-4c9e-a6d0-00000000000",
            "5e8d1a7c-3b2f-4c9e-a6d0_00000000000f",
            "5e8d1a7c-3b2f-4c9e-a6d0-00000000000g",
            "o",
        ] {
            let uid = Uid::new(Some(other));
            assert_eq!(uid, Uid::Text(other.into()), "{other}");
            assert!(uid.is(other));
            assert!(!uid.is(uuid), "{other}");
            assert!(!Uid::new(Some(uuid)).is(other), "{other}");
        }
        assert_eq!(Uid::new(None), Uid::Absent);
        assert_eq!(Uid::new(Some("")), Uid::Absent);
        assert!(Uid::Absent.is(""));
        assert!(!Uid::Absent.is(uuid));
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
            "kbind/p-c",
        );
        applied["status"] = json!({ "phase": "Ready" });
        applied["metadata"]["labels"]["other"] = json!("x");
        let copy = ProviderCopy::of(serde_json::from_value(applied.clone()).unwrap(), "c");
        let consumer = |v: Value| Some(Json::new(&v));
        assert!(copy.is_current(consumer(json!({ "size": 3 })).as_ref(), "o"));
        assert!(!copy.is_current(consumer(json!({ "size": 4 })).as_ref(), "o"));
        assert!(!copy.is_current(None, "o"));
        assert!(!copy.is_current(consumer(spec.clone()).as_ref(), "another-object"));
        // Applied for another consumer cluster.
        let foreign = ProviderCopy::of(serde_json::from_value(applied.clone()).unwrap(), "d");
        assert!(!foreign.is_current(consumer(spec.clone()).as_ref(), "o"));
        // Without kbind's label, a spec-up still has something to apply.
        applied["metadata"]["labels"] = json!({});
        let unlabelled = ProviderCopy::of(serde_json::from_value(applied.clone()).unwrap(), "c");
        assert!(!unlabelled.is_current(consumer(spec.clone()).as_ref(), "o"));
        // A copy written before copies carried the consumer cluster's label (#50.5): its next
        // spec-up adds it, so that the provider watch selecting by it sees the copy.
        applied["metadata"]["labels"] = json!({ "core.kbind.io/managed": "true" });
        let before_the_label =
            ProviderCopy::of(serde_json::from_value(applied.clone()).unwrap(), "c");
        assert!(!before_the_label.labelled);
        assert!(!before_the_label.is_current(consumer(spec.clone()).as_ref(), "o"));
        assert_eq!(before_the_label.owner("o"), Owner::Ours);
        // Labelled for another consumer cluster: not this one's label.
        applied["metadata"]["labels"] =
            json!({ "core.kbind.io/managed": "true", "core.kbind.io/consumer-cluster-uid": "d" });
        let mislabelled = ProviderCopy::of(serde_json::from_value(applied).unwrap(), "c");
        assert!(!mislabelled.labelled);
        // A copy written before copies carried the heartbeat record is current all the same:
        // the record comes with its next change, never with a write of its own.
        let mut unrecorded = crate::ownership::spec_up_body(
            "example.org/v1",
            "Widget",
            Some("ns"),
            "w",
            Some(&spec),
            "c",
            "o",
            "kbind/p-c",
        );
        let annotations = unrecorded["metadata"]["annotations"]
            .as_object_mut()
            .unwrap();
        annotations.remove(crate::keys::HEARTBEAT_ANNOTATION);
        let copy = ProviderCopy::of(serde_json::from_value(unrecorded).unwrap(), "c");
        assert!(copy.is_current(consumer(spec.clone()).as_ref(), "o"));
        // No spec on either side: current.
        let bare = crate::ownership::spec_up_body("v1", "W", None, "w", None, "c", "o", "k/p");
        let copy = ProviderCopy::of(serde_json::from_value(bare).unwrap(), "c");
        assert!(copy.is_current(None, "o"));
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
    fn changed_names_include_what_only_a_relist_shows() {
        use k8s_openapi::api::core::v1::Namespace;
        use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
        let object = |name: &str, version: &str| Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        let mut changes = ChangedNames::default();
        // (event, the names it shows changed)
        let table: Vec<(watcher::Event<Namespace>, &[&str])> = vec![
            // The first list: everything it holds is new, named once the cache holds it.
            (Init, &[]),
            (InitApply(object("a", "1")), &[]),
            (InitApply(object("b", "2")), &[]),
            (InitDone, &["a", "b"]),
            // Watched changes: at once.
            (Apply(object("c", "3")), &["c"]),
            (Apply(object("a", "4")), &["a"]),
            (Delete(object("b", "2")), &["b"]),
            // A re-list after a gap: "a" unchanged, "c" deleted and "d" created in the gap, each
            // named at InitDone.
            (Init, &[]),
            (InitApply(object("a", "4")), &[]),
            (InitApply(object("d", "7")), &[]),
            (InitDone, &["c", "d"]),
            // A re-list that finds nothing new names nothing.
            (Init, &[]),
            (InitApply(object("a", "4")), &[]),
            (InitApply(object("d", "7")), &[]),
            (InitDone, &[]),
            // A re-list in which "a" changed and "d" went.
            (Init, &[]),
            (InitApply(object("a", "9")), &[]),
            (InitDone, &["a", "d"]),
            // An object without a resourceVersion still counts by name.
            (Apply(object("e", "")), &["e"]),
        ];
        for (step, (event, want)) in table.into_iter().enumerate() {
            let names: Vec<String> = changes
                .observe(&event)
                .into_iter()
                .map(|k| k.name)
                .collect();
            assert_eq!(names, want, "step {step}");
        }
    }

    #[test]
    fn changed_names_tell_namespaced_objects_of_one_name_apart() {
        use k8s_openapi::api::core::v1::ConfigMap;
        use watcher::Event::{Apply, Init, InitApply, InitDone};
        let object = |namespace: &str, version: &str| ConfigMap {
            metadata: ObjectMeta {
                name: Some("b".into()),
                namespace: Some(namespace.into()),
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        let key = |namespace: &str| ObjectKey {
            namespace: Some(namespace.into()),
            name: "b".into(),
        };
        let mut changes = ChangedNames::default();
        for event in [
            Init,
            InitApply(object("x", "1")),
            InitApply(object("y", "2")),
        ] {
            assert_eq!(changes.observe(&event), []);
        }
        assert_eq!(
            changes.observe(&InitDone::<ConfigMap>),
            [key("x"), key("y")]
        );
        assert_eq!(changes.observe(&Apply(object("y", "3"))), [key("y")]);
        // A re-list in which only y's changed (x's is as seen).
        changes.observe(&Init::<ConfigMap>);
        changes.observe(&InitApply(object("x", "1")));
        changes.observe(&InitApply(object("y", "4")));
        assert_eq!(changes.observe(&InitDone::<ConfigMap>), [key("y")]);
    }

    #[test]
    fn a_marks_cache_holds_only_conflicting_or_paused_instances() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let object = |annotation: Option<(&str, &str)>| ConfigMap {
            metadata: ObjectMeta {
                name: Some("w".into()),
                annotations: annotation.map(|(k, v)| [(k.to_owned(), v.to_owned())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let conflict = Some((keys::CONFLICT_ANNOTATION, keys::CONFLICT_FOREIGN));
        let paused = Some((keys::PAUSED_ANNOTATION, "true"));
        let not_paused = Some((keys::PAUSED_ANNOTATION, "false"));
        let kind = |e: Option<watcher::Event<ConfigMap>>| match e {
            None => "dropped",
            Some(watcher::Event::Apply(_)) => "apply",
            Some(watcher::Event::Delete(_)) => "delete",
            Some(watcher::Event::InitApply(_)) => "init-apply",
            Some(watcher::Event::Init) => "init",
            Some(watcher::Event::InitDone) => "init-done",
        };
        let cases = [
            (watcher::Event::InitApply(object(conflict)), "init-apply"),
            (watcher::Event::InitApply(object(paused)), "init-apply"),
            (watcher::Event::InitApply(object(not_paused)), "dropped"),
            (watcher::Event::InitApply(object(None)), "dropped"),
            (watcher::Event::Apply(object(conflict)), "apply"),
            (watcher::Event::Apply(object(paused)), "apply"),
            // Resolved or resumed: removed from the cache (a no-op when it was never there).
            (watcher::Event::Apply(object(None)), "delete"),
            (watcher::Event::Apply(object(not_paused)), "delete"),
            (watcher::Event::Delete(object(None)), "delete"),
            (watcher::Event::Delete(object(conflict)), "delete"),
            (watcher::Event::Init, "init"),
            (watcher::Event::InitDone, "init-done"),
        ];
        for (event, want) in cases {
            assert_eq!(kind(only_marked(event)), want);
        }
    }

    #[test]
    fn marked_metadata_keeps_the_key_and_the_marks() {
        let mut slim = meta();
        slim.annotations
            .get_or_insert_default()
            .insert(keys::PAUSED_ANNOTATION.to_owned(), "true".to_owned());
        marked_metadata(&mut slim);
        assert_eq!(
            serde_json::to_value(&slim).unwrap(),
            json!({
                "name": "w1",
                "namespace": "team-a",
                "annotations": {
                    keys::CONFLICT_ANNOTATION: keys::CONFLICT_FOREIGN,
                    keys::PAUSED_ANNOTATION: "true",
                },
            })
        );
        let mut none = meta();
        none.annotations = None;
        marked_metadata(&mut none);
        assert_eq!(
            serde_json::to_value(&none).unwrap(),
            json!({ "name": "w1", "namespace": "team-a" })
        );
        // A pause annotation that does not pause is not a mark.
        let mut other = meta();
        other.annotations = Some([(keys::PAUSED_ANNOTATION.to_owned(), "no".to_owned())].into());
        marked_metadata(&mut other);
        assert_eq!(other.annotations, None);
    }
}
