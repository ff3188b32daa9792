//! A worker's two feeds: one watch of each side fills that side's cache and turns its events into
//! syncs. A change syncs; a (re-)list is compared with the other side's cache — at a start by
//! whichever side finishes listing second — and only the objects with work to do sync: the others
//! are recorded where they stand and do not queue ahead of the changes (a restart at 100,000
//! objects would otherwise sync every one of them before a change made meanwhile). Both sides list
//! at the same time (a restart waits for the longer of the two lists, not for both).

use kbind_shared::sync::Locked;
use std::sync::Arc;

use futures::channel::mpsc::{UnboundedReceiver, unbounded};
use futures::{StreamExt, TryStreamExt};
use kbind_shared::cache::{Instance, ProviderCopy};
use kbind_shared::namespaced::{Command, Namespaced};
use kbind_shared::streaming::Events;
use kube::Api;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::task::JoinHandle;

use super::state::{Side, Worker, Writers};
use super::{overdue, pending};

/// The consumer objects to sync, as the consumer feed delivers them (the controller's own stream).
pub(super) type ConsumerChanges = UnboundedReceiver<Result<Instance, watcher::Error>>;
/// The consumer objects a provider change syncs.
pub(super) type ProviderTriggers = UnboundedReceiver<ObjectRef<Instance>>;

/// Both feeds' tasks; dropping them stops both watches.
pub(super) struct Feeds([JoinHandle<()>; 2]);

impl Drop for Feeds {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Starts both feeds of `worker` into the caches `writers` write.
/// `overdue` receives the consumer changes to look at again if they stay undelivered
/// ([`overdue::note`]).
pub(super) fn start(
    worker: &Arc<Worker>,
    writers: Writers,
    overdue: overdue::Sender,
) -> (Feeds, ConsumerChanges, ProviderTriggers) {
    let (provider, triggers) = provider(
        worker.clone(),
        writers.provider,
        writers.provider_namespaces,
    );
    let (consumer, changes) = consumer(
        worker.clone(),
        writers.consumer,
        writers.consumer_namespaces,
        overdue,
    );
    (Feeds([provider, consumer]), changes, triggers)
}

/// The provider watch's selection: this consumer cluster's copies, by the label every spec-up
/// writes (#50.5) — another consumer's objects are never listed, watched or held. Whatever else
/// stands under a consumer object's name is read when met ([`super::strangers`]).
fn own_copies(local_uid: &str) -> watcher::Config {
    watcher::Config::default().labels(&format!(
        "{}={local_uid}",
        kbind_shared::keys::CONSUMER_CLUSTER_UID_LABEL
    ))
}

/// The provider side: a cache of this consumer cluster's copies of the API's objects, each kept as the facts a sync reads
/// (`ProviderCopy`); events on them re-sync the consumer object with the same namespace/name
/// (drift repair, SYNC-12, and conflict re-evaluation, QRK-19). A change is recorded as waiting
/// before the cache shows it, so that a sync that sees it in the cache also finds when it was
/// first seen — and only for an object the consumer has (nothing else is ever synced, so nothing
/// else may wait).
fn provider(
    worker: Arc<Worker>,
    writer: reflector::store::Writer<ProviderCopy>,
    namespaces: Option<UnboundedReceiver<Command>>,
) -> (JoinHandle<()>, ProviderTriggers) {
    let source = match namespaces {
        Some(commands) => provider_per_namespace(&worker, commands),
        None => kbind_shared::streaming::instances(
            Api::all_with(worker.provider.clone(), &worker.dyntype),
            own_copies(&worker.spec.local_uid),
        ),
    };
    let buckets = worker.spec.buckets.clone();
    let (seen, copied) = (worker.clone(), worker.clone());
    let events = reflector::reflector(
        writer,
        source
            .filter(move |e| std::future::ready(buckets.keep(e)))
            .inspect(move |event| {
                // (A re-list's objects are compared once it is complete, below.)
                if let Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) = event {
                    let key = pending::key(o);
                    seen.tracked
                        .locked()
                        .saw(&key, o.metadata.resource_version.as_deref());
                    let reference = seen.reference(key.0.as_deref(), &key.1);
                    if seen.consumer_objects.get(&reference).is_some() {
                        seen.tracked
                            .locked()
                            .provider_changed(&key, std::time::Instant::now());
                    }
                }
            })
            .map_ok(move |event| {
                let (uid, max_bytes) = (&copied.spec.local_uid, copied.ctx.limits.max_status_bytes);
                kbind_shared::cache::map_event(event, |o| {
                    ProviderCopy::of(o, uid).bounded(max_bytes)
                })
            }),
    )
    .default_backoff();
    let (trigger, triggers) = unbounded();
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            for reference in provider_cached(&worker, event) {
                if trigger.unbounded_send(reference).is_err() {
                    return;
                }
            }
        }
    });
    (task, triggers)
}

/// A provider watch event, now in the cache: what it ends, and the consumer objects to sync.
fn provider_cached(
    worker: &Worker,
    event: Result<watcher::Event<ProviderCopy>, watcher::Error>,
) -> Vec<ObjectRef<Instance>> {
    let key = |o: &ProviderCopy| {
        (
            o.namespace.as_deref().map(str::to_owned),
            o.name.to_string(),
        )
    };
    let object = match event {
        // The cache holds the event now: a write's echo among those seen ends its wait.
        Ok(watcher::Event::Apply(o)) => {
            let mut tracked = worker.tracked.locked();
            tracked.cached(&key(&o));
            // Shown by the watch: ours and labelled, no stranger any more.
            tracked.forget_stranger(&key(&o));
            o
        }
        Ok(watcher::Event::Delete(o)) => {
            worker.tracked.locked().provider_gone(&key(&o));
            o
        }
        // A (re-)list is complete and the cache holds it: only the consumer objects it leaves
        // with work to do are synced, not every object again.
        Ok(watcher::Event::InitDone) => {
            worker.tracked.locked().provider_relisted();
            if !worker.listed(Side::Provider) {
                return Vec::new();
            }
            let now = std::time::Instant::now();
            let objects = worker.with_work(&crate::bindings::Reach::All);
            let mut tracked = worker.tracked.locked();
            return objects
                .iter()
                .map(|object| {
                    tracked.provider_changed(&pending::key(object.as_ref()), now);
                    ObjectRef::from_obj_with(object.as_ref(), worker.dyntype.clone())
                })
                .collect();
        }
        _ => return Vec::new(),
    };
    vec![worker.reference(object.namespace.as_deref(), &object.name)]
}

/// In a boundary (#51) the credential reads only the boundary's namespaces, and when the API is
/// not read cluster-wide (#54) kbind reads only where it syncs: the provider is watched in each
/// namespace the consumer has objects in, mapped (`<boundary>-N` in a boundary), and its objects
/// are held under the consumer's namespace — everything the worker keeps and decides is keyed as
/// on the consumer.
fn provider_per_namespace(
    worker: &Worker,
    commands: UnboundedReceiver<Command>,
) -> Events<Instance> {
    let (client, dyntype) = (worker.provider.clone(), worker.dyntype.clone());
    let (map, selection) = (
        worker.spec.namespaces.clone(),
        own_copies(&worker.spec.local_uid),
    );
    let open = kbind_shared::namespaced::in_boundary(map, move |namespace| {
        kbind_shared::streaming::instances(
            Api::namespaced_with(client.clone(), namespace, &dyntype),
            selection.clone(),
        )
    });
    Namespaced::new(open, commands, tombstone).boxed()
}

/// When the API is not read cluster-wide (#54), the consumer is watched in each namespace whose
/// Bindings list it ([`super::scope`]), as one watch would deliver them.
fn consumer_per_namespace(
    worker: &Worker,
    commands: UnboundedReceiver<Command>,
) -> Events<Instance> {
    let (client, dyntype) = (worker.ctx.client.clone(), worker.dyntype.clone());
    let open: kbind_shared::namespaced::Open<Instance> = Box::new(move |namespace: &str| {
        kbind_shared::streaming::instances(
            Api::namespaced_with(client.clone(), namespace, &dyntype),
            watcher::Config::default(),
        )
        .default_backoff()
        // Slim as it arrives: the first list holds every namespace's objects until all listed.
        .modify(|o: &mut Instance| kbind_shared::cache::consumer_metadata(&mut o.metadata))
        .boxed()
    });
    Namespaced::new(open, commands, tombstone).boxed()
}

/// What stands for an object no longer listed in its namespace (its name is all a delete needs).
pub(super) fn tombstone(namespace: &str, name: &str) -> Instance {
    let metadata = kube::api::ObjectMeta {
        namespace: Some(namespace.to_owned()),
        name: Some(name.to_owned()),
        ..Default::default()
    };
    Instance::new(metadata, None, None)
}

/// The consumer side: the cache the controller runs on, each object as slim as decisions allow.
fn consumer(
    worker: Arc<Worker>,
    writer: reflector::store::Writer<Instance>,
    namespaces: Option<UnboundedReceiver<Command>>,
    overdue: overdue::Sender,
) -> (JoinHandle<()>, ConsumerChanges) {
    let source = match namespaces {
        Some(commands) => consumer_per_namespace(&worker, commands),
        None => kbind_shared::streaming::instances(
            Api::all_with(worker.ctx.client.clone(), &worker.dyntype),
            watcher::Config::default(),
        ),
    };
    let buckets = worker.spec.buckets.clone();
    let seen = worker.clone();
    let events = reflector::reflector(
        writer,
        source
            .filter(move |e| std::future::ready(buckets.keep(e)))
            .modify(|o| kbind_shared::cache::consumer_metadata(&mut o.metadata))
            .inspect(move |event| seen.saw_consumer_event(event)),
    )
    .default_backoff();
    let (sender, changes) = unbounded();
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            let changed = match event {
                Ok(watcher::Event::Apply(o)) => {
                    worker
                        .tracked
                        .locked()
                        .showed(&pending::key(&o), o.metadata.resource_version.as_deref());
                    overdue::note(&worker, &o, std::time::Instant::now(), &overdue);
                    o
                }
                // (Its record went as the event passed: `Worker::saw_consumer_event`.)
                Ok(watcher::Event::Delete(_)) => continue,
                Ok(watcher::Event::InitDone) => {
                    worker.tracked.locked().consumer_relisted();
                    if !worker.listed(Side::Consumer) {
                        continue;
                    }
                    let now = std::time::Instant::now();
                    for object in worker.with_work(&crate::bindings::Reach::All) {
                        let deleting = object.metadata.deletion_timestamp.is_some();
                        worker.tracked.locked().consumer_changed(
                            &pending::key(object.as_ref()),
                            now,
                            deleting,
                        );
                        overdue::note(&worker, &object, now, &overdue);
                        if sender.unbounded_send(Ok(object.as_ref().clone())).is_err() {
                            return;
                        }
                    }
                    continue;
                }
                Ok(_) => continue,
                Err(e) => {
                    tracing::debug!(api = %worker.spec.api, error = %e, "consumer watch");
                    continue;
                }
            };
            if sender.unbounded_send(Ok(changed)).is_err() {
                return;
            }
        }
    });
    (task, changes)
}
