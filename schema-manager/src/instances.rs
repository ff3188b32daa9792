//! What the binding reconciles read of the consumer's instances of bound APIs: how many existing
//! objects a held schema change would invalidate (a bounded, paged LIST, reused briefly), and one
//! metadata watch per API and scope that keeps the instances carrying a mark (a conflict
//! annotation, a pause) and counts all of them per namespace, announcing when either changes.
//! Both read only the scope of the binding that asks (#54): a Binding's namespace, or the cluster
//! for a ClusterBinding.

use kbind_shared::sync::Locked;
use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kbind_shared::cache::{marked_metadata, only_marked};
use kube::api::{ApiResource, DynamicObject, PartialObjectMeta};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

use crate::changes::{Change, Changes};

/// How long an instance metadata cache lives without being read.
pub const METADATA_CACHE_IDLE: Duration = Duration::from_secs(600);
/// How long a count of the objects a held schema change would invalidate is reused.
pub const IMPACT_TTL: Duration = Duration::from_secs(60);
/// The most objects one such count reads (then it says "at least").
pub const IMPACT_MAX_OBJECTS: u64 = 100_000;

/// The result of the local structural check of existing objects against a held schema (what
/// [`Instances::affected_objects`] counts and a binding's `SchemaInSync` message reports).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Affected {
    /// Objects the new schema would reject.
    pub invalid: u64,
    /// Objects holding data the new schema would prune (silently lost, not rejected).
    pub pruned: u64,
    /// Objects checked.
    pub checked: u64,
    /// Whether every object was checked (false: the count stopped at a bound).
    pub complete: bool,
}

/// How often, at most, a change in how many instances an API has is announced (a bulk create
/// is one announcement a second, not one per object).
const TOTALS_ANNOUNCED_EVERY: Duration = Duration::from_secs(1);

/// One API's instance metadata cache.
pub struct MetadataCache {
    marked: Marked,
    task: tokio::task::JoinHandle<()>,
    used: std::time::Instant,
}

impl Drop for MetadataCache {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the binding counts read of one API's instances.
#[derive(Clone)]
pub struct Marked {
    /// The instances that carry a mark, as [`marked_metadata`] leaves them.
    pub store: Store<PartialObjectMeta<DynamicObject>>,
    totals: Arc<Mutex<Totals>>,
}

impl Marked {
    /// How many instances the API has in `namespace` (`None`: everywhere).
    pub fn total(&self, namespace: Option<&str>) -> usize {
        self.totals.locked().count(namespace)
    }
}

/// The instances of one API that carry a mark, with their marks, kept only to notice when that
/// changes (it holds only marked objects, so it stays small).
#[derive(Default)]
struct MarkedSet(Relisted<MarksByObject>);

/// What a watch shows (`current`), and what a re-list under way has found so far.
#[derive(Default)]
struct Relisted<T> {
    current: T,
    relisting: Option<T>,
}

impl<T: Default + PartialEq> Relisted<T> {
    /// A re-list begins.
    fn begin(&mut self) {
        self.relisting = Some(T::default());
    }

    /// What the re-list under way has found.
    fn relisting(&mut self) -> &mut T {
        self.relisting.get_or_insert_with(T::default)
    }

    /// The re-list is done and becomes what the watch shows: true when that differs from before.
    fn done(&mut self) -> bool {
        let listed = self.relisting.take().unwrap_or_default();
        let changed = listed != self.current;
        self.current = listed;
        changed
    }
}

/// The marks (annotation key and value) of each marked instance, by namespace and name.
type MarksByObject = HashMap<(Option<String>, String), Vec<(String, String)>>;

impl MarkedSet {
    /// Records one event of the marks cache; true when the marked instances or their marks changed.
    fn observe(&mut self, event: &watcher::Event<PartialObjectMeta<DynamicObject>>) -> bool {
        let key = |o: &PartialObjectMeta<DynamicObject>| {
            (
                o.metadata.namespace.clone(),
                o.metadata.name.clone().unwrap_or_default(),
            )
        };
        let marks = |o: &PartialObjectMeta<DynamicObject>| -> Vec<(String, String)> {
            let mut o = o.metadata.clone();
            marked_metadata(&mut o);
            o.annotations.unwrap_or_default().into_iter().collect()
        };
        let set = &mut self.0;
        match event {
            watcher::Event::Apply(o) => {
                let marks = marks(o);
                if marks.is_empty() {
                    set.current.remove(&key(o)).is_some()
                } else {
                    set.current.insert(key(o), marks.clone()) != Some(marks)
                }
            }
            watcher::Event::Delete(o) => set.current.remove(&key(o)).is_some(),
            watcher::Event::Init => {
                set.begin();
                false
            }
            watcher::Event::InitApply(o) => {
                let marks = marks(o);
                if !marks.is_empty() {
                    set.relisting().insert(key(o), marks);
                }
                false
            }
            watcher::Event::InitDone => set.done(),
        }
    }
}

/// How many instances of one API each namespace holds, each instance kept as an 8-byte hash of
/// its name (the watch sees every instance; only the marked ones are cached).
#[derive(Default)]
struct Totals(Relisted<HashMap<Option<String>, HashSet<u64>>>);

impl Totals {
    /// Records one watch event; true when a namespace's count changed.
    fn observe<K: kube::Resource>(&mut self, event: &watcher::Event<K>) -> bool {
        let at = |o: &K| {
            let mut hasher = DefaultHasher::new();
            o.meta().name.hash(&mut hasher);
            (o.meta().namespace.clone(), hasher.finish())
        };
        let totals = &mut self.0;
        match event {
            watcher::Event::Apply(o) => {
                let (namespace, name) = at(o);
                totals.current.entry(namespace).or_default().insert(name)
            }
            watcher::Event::Delete(o) => {
                let (namespace, name) = at(o);
                let removed = totals
                    .current
                    .get_mut(&namespace)
                    .is_some_and(|names| names.remove(&name));
                totals.current.retain(|_, names| !names.is_empty());
                removed
            }
            watcher::Event::Init => {
                totals.begin();
                false
            }
            watcher::Event::InitApply(o) => {
                let (namespace, name) = at(o);
                totals
                    .relisting()
                    .entry(namespace)
                    .or_default()
                    .insert(name);
                false
            }
            watcher::Event::InitDone => totals.done(),
        }
    }

    /// How many instances `namespace` holds (`None`: all namespaces, and cluster-scoped ones).
    fn count(&self, namespace: Option<&str>) -> usize {
        match namespace {
            Some(namespace) => self
                .0
                .current
                .get(&Some(namespace.to_owned()))
                .map_or(0, HashSet::len),
            None => self.0.current.values().map(HashSet::len).sum(),
        }
    }
}

/// The consumer's instances, as the binding reconciles read them.
pub struct Instances {
    client: Client,
    changes: Changes,
    metadata: Mutex<HashMap<String, MetadataCache>>,
    impacts: Mutex<HashMap<String, (Instant, Affected)>>,
}

impl Instances {
    /// Reads through `client`; conflict caches announce into `changes`.
    pub fn new(client: Client, changes: Changes) -> Self {
        Self {
            client,
            changes,
            metadata: Default::default(),
            impacts: Default::default(),
        }
    }

    /// How many existing consumer objects of `desired`'s API its storage version's schema would
    /// reject (the local structural check, [`crate::evolution::invalid_under`]): a paged LIST,
    /// at most [`IMPACT_MAX_OBJECTS`] objects, reused for [`IMPACT_TTL`] per schema hash. `None`
    /// when the objects cannot be listed (e.g. the new storage version is not served yet).
    pub async fn affected_objects(
        &self,
        desired: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        hash: &str,
        namespace: Option<&str>,
    ) -> Option<Affected> {
        use kube::ResourceExt;
        let key = format!(
            "{}/{hash}/{}",
            desired.name_any(),
            namespace.unwrap_or_default()
        );
        let now = Instant::now();
        {
            let mut impacts = self.impacts.locked();
            impacts.retain(|_, (at, _)| now.duration_since(*at) < IMPACT_TTL);
            if let Some((_, affected)) = impacts.get(&key) {
                return Some(*affected);
            }
        }
        let resource = kbind_shared::dynamic::instance_resource(desired)?;
        let schema = kbind_shared::dynamic::storage_version(&desired.spec.versions)?
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .and_then(|s| serde_json::to_value(s).ok())?;
        // A Binding's count covers its own namespace only.
        let api = kbind_shared::dynamic::scoped(&self.client, namespace, &resource);
        let mut affected = Affected {
            complete: true,
            ..Default::default()
        };
        let mut params = kube::api::ListParams::default().limit(500);
        loop {
            let page = match api.list(&params).await {
                Ok(page) => page,
                Err(e) => {
                    tracing::debug!(api = %desired.name_any(), error = %e, "cannot list objects to count a schema change's impact");
                    return None;
                }
            };
            for object in &page.items {
                affected.checked += 1;
                let value = serde_json::to_value(object).unwrap_or_default();
                if crate::evolution::invalid_under(&value, &schema) {
                    affected.invalid += 1;
                } else if crate::evolution::pruned_under(&value, &schema) {
                    affected.pruned += 1;
                }
            }
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => {
                    if affected.checked >= IMPACT_MAX_OBJECTS {
                        affected.complete = false;
                        break;
                    }
                    params = params.continue_token(&token);
                }
                _ => break,
            }
        }
        self.impacts.locked().insert(key, (now, affected));
        Some(affected)
    }

    /// A metadata-only cache of the instances of a bound API in `namespace` (`None`: everywhere,
    /// for a ClusterBinding) that carry a mark (the rest are counted, not kept:
    /// [`only_marked`]), started on first use (conflict and pause counts read it instead of
    /// listing, LIM-16). A change of the marks is announced at once ([`Change::Marked`]), a
    /// change of how many instances there are at most every [`TOTALS_ANNOUNCED_EVERY`]
    /// ([`Change::Instances`]). Caches unused for [`METADATA_CACHE_IDLE`] (an API no longer
    /// bound there, a CRD gone) are stopped: a namespace no Binding reads is not read.
    pub fn marked(&self, resource: &ApiResource, namespace: Option<&str>) -> Marked {
        let key = format!(
            "{}/{}/{}/{}",
            resource.group,
            resource.version,
            resource.plural,
            namespace.unwrap_or("*")
        );
        let now = Instant::now();
        let mut caches = self.metadata.locked();
        caches.retain(|k, cache| {
            let keep = *k == key || now.duration_since(cache.used) < METADATA_CACHE_IDLE;
            if !keep {
                tracing::debug!(api = %k, "stopping an unused instance metadata cache");
            }
            keep
        });
        let cache = caches.entry(key).or_insert_with(|| {
            let writer =
                reflector::store::Writer::<PartialObjectMeta<DynamicObject>>::new(resource.clone());
            let store = writer.as_reader();
            let totals = Arc::new(Mutex::new(Totals::default()));
            let api: Api<PartialObjectMeta<DynamicObject>> = match namespace {
                Some(ns) => Api::namespaced_with(self.client.clone(), ns, resource),
                None => Api::all_with(self.client.clone(), resource),
            };
            let counted = totals.clone();
            let counts_changed = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let changed = counts_changed.clone();
            let events = watcher(api, watcher::Config::default()).inspect_ok(move |event| {
                if counted.locked().observe(event) {
                    changed.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            });
            let stream = reflector::reflector(
                writer,
                events
                    .try_filter_map(|e| std::future::ready(Ok(only_marked(e))))
                    .modify(|o| marked_metadata(&mut o.metadata)),
            )
            .default_backoff();
            let api_name = format!("{}.{}", resource.plural, resource.group);
            let task = tokio::spawn(announce_changes(
                stream,
                counts_changed,
                api_name,
                self.changes.clone(),
            ));
            MetadataCache {
                marked: Marked { store, totals },
                task,
                used: now,
            }
        });
        cache.used = now;
        cache.marked.clone()
    }
}

/// Drives one API's marks cache: announces a change of its marked instances at once, and a
/// change of how many instances there are (`counts_changed`) at most every
/// [`TOTALS_ANNOUNCED_EVERY`].
async fn announce_changes(
    stream: impl futures::Stream<
        Item = Result<watcher::Event<PartialObjectMeta<DynamicObject>>, watcher::Error>,
    >,
    counts_changed: Arc<std::sync::atomic::AtomicBool>,
    api: String,
    changes: Changes,
) {
    let mut stream = std::pin::pin!(stream);
    let mut marked = MarkedSet::default();
    // When the next count change is announced: armed by a change, so that nothing runs at rest.
    let mut due: Option<tokio::time::Instant> = None;
    loop {
        let announce = async {
            match due {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            event = stream.next() => {
                match event {
                    None => return,
                    Some(Ok(event)) if marked.observe(&event) => {
                        changes.announce(Change::Marked(api.clone()));
                    }
                    Some(_) => {}
                }
                if due.is_none() && counts_changed.swap(false, std::sync::atomic::Ordering::Relaxed) {
                    due = Some(tokio::time::Instant::now() + TOTALS_ANNOUNCED_EVERY);
                }
            }
            () = announce => {
                // What the announcement's readers count includes every change up to now.
                due = None;
                counts_changed.store(false, std::sync::atomic::Ordering::Relaxed);
                changes.announce(Change::Instances(api.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kbind_shared::keys;

    const FOREIGN: &[(&str, &str)] = &[(keys::CONFLICT_ANNOTATION, keys::CONFLICT_FOREIGN)];
    const ANOTHER: &[(&str, &str)] =
        &[(keys::CONFLICT_ANNOTATION, keys::CONFLICT_OWNED_BY_ANOTHER)];
    const PAUSED: &[(&str, &str)] = &[(keys::PAUSED_ANNOTATION, "true")];
    const NONE: &[(&str, &str)] = &[];

    fn in_namespace(
        namespace: Option<&str>,
        name: &str,
        marks: &[(&str, &str)],
    ) -> PartialObjectMeta<DynamicObject> {
        let metadata = kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: namespace.map(str::to_owned),
            annotations: (!marks.is_empty()).then(|| {
                marks
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect()
            }),
            ..Default::default()
        };
        PartialObjectMeta {
            types: None,
            metadata,
            _phantom: std::marker::PhantomData,
        }
    }

    fn object(name: &str, marks: &[(&str, &str)]) -> PartialObjectMeta<DynamicObject> {
        in_namespace(Some("team-a"), name, marks)
    }

    #[test]
    fn only_changes_of_the_marked_set_are_reported() {
        let mut set = MarkedSet::default();
        // (event, changed?)
        let steps = [
            (watcher::Event::Init, false),
            (watcher::Event::InitApply(object("a", FOREIGN)), false),
            (watcher::Event::InitApply(object("b", NONE)), false),
            (watcher::Event::InitDone, true),
            (watcher::Event::Apply(object("b", NONE)), false),
            (watcher::Event::Apply(object("a", FOREIGN)), false),
            (watcher::Event::Apply(object("b", FOREIGN)), true),
            // The kind of conflict changed, or a pause came or went.
            (watcher::Event::Apply(object("b", ANOTHER)), true),
            (watcher::Event::Apply(object("c", PAUSED)), true),
            (watcher::Event::Apply(object("c", PAUSED)), false),
            (watcher::Event::Apply(object("c", NONE)), true),
            (watcher::Event::Apply(object("a", NONE)), true),
            (watcher::Event::Delete(object("b", ANOTHER)), true),
            (watcher::Event::Delete(object("c", NONE)), false),
            (watcher::Event::Init, false),
            (watcher::Event::InitDone, false),
        ];
        for (i, (event, changed)) in steps.iter().enumerate() {
            assert_eq!(set.observe(event), *changed, "step {i}");
        }
    }

    #[test]
    fn totals_count_every_instance_per_namespace_through_relists() {
        let mut totals = Totals::default();
        let a = |name: &str| in_namespace(Some("a"), name, NONE);
        let b = |name: &str| in_namespace(Some("b"), name, PAUSED);
        // (event, changed?, in a, in b, everywhere)
        let steps = [
            (watcher::Event::Init, false, 0, 0, 0),
            (watcher::Event::InitApply(a("x")), false, 0, 0, 0),
            (watcher::Event::InitApply(b("x")), false, 0, 0, 0),
            (watcher::Event::InitDone, true, 1, 1, 2),
            // An update is no new instance.
            (watcher::Event::Apply(a("x")), false, 1, 1, 2),
            (watcher::Event::Apply(a("y")), true, 2, 1, 3),
            (watcher::Event::Delete(b("x")), true, 2, 0, 2),
            (watcher::Event::Delete(b("x")), false, 2, 0, 2),
            // A re-list that finds one instance gone while the watch was down.
            (watcher::Event::Init, false, 2, 0, 2),
            (watcher::Event::InitApply(a("y")), false, 2, 0, 2),
            (watcher::Event::InitDone, true, 1, 0, 1),
        ];
        for (i, (event, changed, in_a, in_b, all)) in steps.into_iter().enumerate() {
            assert_eq!(totals.observe(&event), changed, "step {i}");
            assert_eq!(
                (
                    totals.count(Some("a")),
                    totals.count(Some("b")),
                    totals.count(None)
                ),
                (in_a, in_b, all),
                "step {i}"
            );
        }
    }
}
