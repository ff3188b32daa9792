//! What the binding reconciles read of the consumer's instances of bound APIs: how many existing
//! objects a held schema change would invalidate (a bounded, paged LIST, reused briefly), and one
//! metadata cache per API of the instances that carry a conflict annotation (announcing when that
//! set changes).

use kbind_shared::sync::Locked;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
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

/// One API's instance metadata cache.
pub struct MetadataCache {
    store: Store<PartialObjectMeta<DynamicObject>>,
    task: tokio::task::JoinHandle<()>,
    used: std::time::Instant,
}

impl Drop for MetadataCache {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The instances of one API that carry a conflict annotation, kept only to notice when that set
/// changes (it holds only conflicting objects, so it stays small).
#[derive(Default)]
struct ConflictingSet {
    current: std::collections::HashSet<(Option<String>, String)>,
    relisting: Option<std::collections::HashSet<(Option<String>, String)>>,
}

impl ConflictingSet {
    /// Records one watch event; true when the set of conflicting instances changed.
    fn observe(&mut self, event: &watcher::Event<PartialObjectMeta<DynamicObject>>) -> bool {
        let key = |o: &PartialObjectMeta<DynamicObject>| {
            (
                o.metadata.namespace.clone(),
                o.metadata.name.clone().unwrap_or_default(),
            )
        };
        let conflicting = |o: &PartialObjectMeta<DynamicObject>| {
            o.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(kbind_shared::keys::CONFLICT_ANNOTATION))
        };
        match event {
            watcher::Event::Apply(o) => {
                if conflicting(o) {
                    self.current.insert(key(o))
                } else {
                    self.current.remove(&key(o))
                }
            }
            watcher::Event::Delete(o) => self.current.remove(&key(o)),
            watcher::Event::Init => {
                self.relisting = Some(Default::default());
                false
            }
            watcher::Event::InitApply(o) => {
                if conflicting(o) {
                    self.relisting
                        .get_or_insert_with(Default::default)
                        .insert(key(o));
                }
                false
            }
            watcher::Event::InitDone => {
                let listed = self.relisting.take().unwrap_or_default();
                let changed = listed != self.current;
                self.current = listed;
                changed
            }
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

    /// A metadata-only cache of the instances of a bound API that carry a conflict annotation
    /// (the rest are watched, not kept: `cache::only_conflicting`), started on first use
    /// (conflict counts read it instead of listing, LIM-16). Caches unused for [`METADATA_CACHE_IDLE`] (an
    /// API no longer bound, a CRD gone) are stopped.
    pub fn conflicting(&self, resource: &ApiResource) -> Store<PartialObjectMeta<DynamicObject>> {
        let key = format!(
            "{}/{}/{}",
            resource.group, resource.version, resource.plural
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
            let api: Api<PartialObjectMeta<DynamicObject>> =
                Api::all_with(self.client.clone(), resource);
            let stream = reflector::reflector(
                writer,
                watcher(api, watcher::Config::default())
                    .try_filter_map(|e| {
                        std::future::ready(Ok(kbind_shared::cache::only_conflicting(e)))
                    })
                    .modify(|o| kbind_shared::cache::conflict_metadata(&mut o.metadata)),
            )
            .default_backoff();
            let mut conflicting = ConflictingSet::default();
            let (changes, api_name) = (
                self.changes.clone(),
                format!("{}.{}", resource.plural, resource.group),
            );
            let task = tokio::spawn(async move {
                stream
                    .for_each(|event| {
                        if let Ok(event) = event
                            && conflicting.observe(&event)
                        {
                            changes.announce(Change::Conflicts(api_name.clone()));
                        }
                        async {}
                    })
                    .await
            });
            MetadataCache {
                store,
                task,
                used: now,
            }
        });
        cache.used = now;
        cache.store.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(name: &str, conflict: bool) -> PartialObjectMeta<DynamicObject> {
        let mut metadata = kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some("team-a".into()),
            ..Default::default()
        };
        if conflict {
            metadata.annotations = Some(
                [(
                    kbind_shared::keys::CONFLICT_ANNOTATION.to_owned(),
                    "ForeignObjectExists".to_owned(),
                )]
                .into(),
            );
        }
        PartialObjectMeta {
            types: None,
            metadata,
            _phantom: std::marker::PhantomData,
        }
    }

    #[test]
    fn only_changes_of_the_conflicting_set_are_reported() {
        let mut set = ConflictingSet::default();
        // (event, changed?)
        let steps = [
            (watcher::Event::Init, false),
            (watcher::Event::InitApply(object("a", true)), false),
            (watcher::Event::InitApply(object("b", false)), false),
            (watcher::Event::InitDone, true),
            (watcher::Event::Apply(object("b", false)), false),
            (watcher::Event::Apply(object("a", true)), false),
            (watcher::Event::Apply(object("b", true)), true),
            (watcher::Event::Apply(object("a", false)), true),
            (watcher::Event::Delete(object("b", true)), true),
            (watcher::Event::Delete(object("c", false)), false),
            (watcher::Event::Init, false),
            (watcher::Event::InitDone, false),
        ];
        for (i, (event, changed)) in steps.iter().enumerate() {
            assert_eq!(set.observe(event), *changed, "step {i}");
        }
    }
}
