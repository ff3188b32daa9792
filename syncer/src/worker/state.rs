//! One worker's state: its caches of both sides, what it has seen change and written, where each
//! object stands — and the questions asked of them (has this object work to do? what does the
//! provider hold of it?). The feeds fill it, syncs read and write it, the report reads it.

use kbind_shared::sync::Locked;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use kbind_shared::cache::{Instance, InstanceType, ProviderCopy};
use kbind_shared::kubeconfig::InlineKubeconfig;
use kbind_shared::namespaced::Command;
use kube::api::ApiResource;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use super::buckets::Buckets;
use super::pending;
use super::record::SyncState;
use super::tracked::Tracked;
use crate::context::Context;

/// What a worker syncs, and with which provider.
pub struct WorkerSpec {
    /// `<plural>.<group>`
    pub api: String,
    /// The storage version's resource.
    pub resource: ApiResource,
    /// Whether the consumer CRD has a status subresource.
    pub has_status_subresource: bool,
    /// Whether its status has kbind's delivery record (`status.kbindSync`).
    pub has_delivery: bool,
    /// The Connection.
    pub connection: String,
    /// The consumer's pinned identity.
    pub local_uid: String,
    /// Provider credentials.
    pub kubeconfig: InlineKubeconfig,
    /// Their digest (workers of one Connection with the same digest share one provider client).
    pub digest: String,
    /// Which namespaces' objects this worker syncs.
    pub buckets: Buckets,
    /// How the Connection names consumer namespaces on the provider (its boundary, #51).
    pub namespaces: kbind_shared::boundary::NamespaceMap,
    /// Whether the API's instances are read cluster-wide (a ClusterBinding lists it), or only in
    /// the namespaces whose Bindings list it, on both clusters (#54; which namespaces is followed
    /// live by the worker's `scope`).
    pub cluster_wide: bool,
    /// This worker's route (#36): its Connection and provider, and the Connection serving the
    /// CRD. Whether the API is routed is read live ([`Worker::routing`]).
    pub route: RouteSpec,
}

/// One route's worker of a routed API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    /// This worker's route: its Connection and that Connection's pinned provider.
    pub route: kbind_shared::routing::Route,
    /// The Connection serving the consumer CRD.
    pub served_by: String,
}

impl WorkerSpec {
    /// The finalizer an object holds while this worker's provider has its copy.
    pub fn finalizer(&self) -> std::borrow::Cow<'static, str> {
        if self.connection == self.route.served_by {
            kbind_shared::keys::SYNCER_FINALIZER.into()
        } else {
            kbind_shared::routing::finalizer(&self.connection, &self.route.served_by).into()
        }
    }

    /// The record of this worker's Connection's heartbeat Lease that every provider object it
    /// writes carries (`core.kbind.io/heartbeat`): the provider's reaper judges the copy by that
    /// Connection's liveness alone.
    pub fn heartbeat(&self) -> String {
        kbind_shared::heartbeat::record(
            self.kubeconfig.namespace(),
            &self.connection,
            &self.local_uid,
        )
    }
}

/// One worker: what it syncs, with which clients, and all it holds while it runs.
pub(super) struct Worker {
    pub(super) ctx: Arc<Context>,
    pub(super) spec: WorkerSpec,
    pub(super) provider: Client,
    /// The API, as the caches' keys share it.
    pub(super) dyntype: InstanceType,
    /// This consumer cluster's copies on the provider (selected by their label), as the facts a
    /// sync reads.
    pub(super) provider_objects: Store<ProviderCopy>,
    /// The consumer's objects of the API (this worker's buckets).
    pub(super) consumer_objects: Store<Instance>,
    pub(super) recorder: Recorder,
    pub(super) known_namespaces: Mutex<HashSet<String>>,
    pub(super) warned_no_status: Mutex<bool>,
    /// One record per object of everything tracked besides the caches ([`super::tracked`]):
    /// changes waiting, echoes awaited, strangers, where it stands.
    pub(super) tracked: Mutex<Tracked>,
    /// The syncs in progress ([`super::in_flight`]).
    pub(super) in_flight: super::in_flight::InFlight,
    /// Which sides' caches have listed.
    pub(super) listed: Mutex<Listed>,
    /// In a boundary (#51), or when not cluster-wide (#54), where the provider is watched: one
    /// namespace at a time, those the consumer has objects in ([`kbind_shared::namespaced`]).
    pub(super) provider_namespaces: Option<UnboundedSender<Command>>,
    /// When not cluster-wide (#54), where the consumer is watched: the namespaces whose Bindings
    /// list the API (the worker's `scope` says which).
    pub(super) consumer_namespaces: Option<UnboundedSender<Command>>,
    /// The consumer namespaces read, when read per namespace: only their objects' namespaces are
    /// watched on the provider (an event of a namespace just let go of starts nothing there).
    pub(super) reading: Mutex<std::collections::BTreeSet<String>>,
    /// Wakes the importer (`worker/import`): a mirror changed or went on the consumer, or the
    /// provider's unmarked objects did.
    pub(super) import_wake: tokio::sync::Notify,
    /// The last refusal (RBAC) an import write met, for the importer to announce.
    pub(super) import_refused: Mutex<Option<String>>,
}

/// The writers of a new worker's two caches, for its feeds.
pub(super) struct Writers {
    /// The provider side's.
    pub(super) provider: reflector::store::Writer<ProviderCopy>,
    /// The consumer side's.
    pub(super) consumer: reflector::store::Writer<Instance>,
    /// What the provider watch is told, watched per namespace (the other end of
    /// [`Worker::provider_namespaces`]).
    pub(super) provider_namespaces: Option<UnboundedReceiver<Command>>,
    /// What the consumer watch is told, watched per namespace (the other end of
    /// [`Worker::consumer_namespaces`]).
    pub(super) consumer_namespaces: Option<UnboundedReceiver<Command>>,
}

/// A side of the sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Consumer,
    Provider,
}

/// Which sides' caches have listed at least once.
#[derive(Debug, Default)]
pub(super) struct Listed {
    /// The consumer side's.
    pub(super) consumer: bool,
    /// The provider side's.
    pub(super) provider: bool,
}

impl Listed {
    /// `side` has (re-)listed: whether its objects are to be compared now — only once the other
    /// side has listed too, so that at a start exactly one of the two (the second) compares.
    pub(super) fn done(&mut self, side: Side) -> bool {
        match side {
            Side::Consumer => self.consumer = true,
            Side::Provider => self.provider = true,
        }
        self.consumer && self.provider
    }
}

impl Worker {
    /// This worker's route when the API is routed now (#36) — always for another Connection's
    /// route; for the serving Connection's, while served bindings offer another route — and
    /// `None` while the API has one route: every object in a bound scope syncs with the
    /// Connection serving it (no pin is written). Read live, so a route Binding coming or going
    /// restarts nothing (#50.3).
    pub(super) fn routing(&self) -> Option<&RouteSpec> {
        let route = &self.spec.route;
        (self.spec.connection != route.served_by
            || self.ctx.routed(&self.spec.api, &route.served_by))
        .then_some(route)
    }

    /// A worker for `spec` with the `provider` client: its state, empty, and the writers of its
    /// caches.
    pub(super) fn new(
        ctx: Arc<Context>,
        spec: WorkerSpec,
        provider: Client,
    ) -> (Arc<Self>, Writers) {
        let dyntype: InstanceType = Arc::new(spec.resource.clone());
        let channel = |per_namespace: bool| {
            if !per_namespace {
                return (None, None);
            }
            let (tx, rx) = futures::channel::mpsc::unbounded();
            (Some(tx), Some(rx))
        };
        let (commands, provider_namespaces) =
            channel(spec.namespaces.boundary().is_some() || !spec.cluster_wide);
        let (consumer_commands, consumer_namespaces) = channel(!spec.cluster_wide);
        let writers = Writers {
            provider: reflector::store::Writer::new(dyntype.clone()),
            consumer: reflector::store::Writer::new(dyntype.clone()),
            provider_namespaces,
            consumer_namespaces,
        };
        let worker = Arc::new(Worker {
            recorder: Recorder::new(ctx.client.clone(), ctx.reporter.clone()),
            tracked: Mutex::new(Tracked::new(ctx.limits.status_min_interval)),
            ctx,
            spec,
            provider,
            dyntype,
            provider_objects: writers.provider.as_reader(),
            consumer_objects: writers.consumer.as_reader(),
            known_namespaces: Mutex::default(),
            warned_no_status: Mutex::new(false),
            in_flight: Default::default(),
            listed: Mutex::default(),
            provider_namespaces: commands,
            consumer_namespaces: consumer_commands,
            reading: Mutex::default(),
            import_wake: tokio::sync::Notify::new(),
            import_refused: Mutex::default(),
        });
        (worker, writers)
    }

    /// The key of the object `name` (in `namespace`) in this worker's caches.
    pub(super) fn reference<K>(&self, namespace: Option<&str>, name: &str) -> ObjectRef<K>
    where
        K: kube::runtime::reflector::Lookup<DynamicType = InstanceType>,
    {
        let reference = ObjectRef::new_with(name, self.dyntype.clone());
        match namespace {
            Some(namespace) => reference.within(namespace),
            None => reference,
        }
    }

    /// A consumer watch event (already filtered to this worker's buckets): a change now waits.
    pub(super) fn saw_consumer_event(
        &self,
        event: &Result<watcher::Event<Instance>, watcher::Error>,
    ) {
        self.tell_provider_watch(event);
        if let Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) = event
            && o.labels.get(kbind_shared::keys::IMPORTED_LABEL) == Some(&self.spec.connection)
        {
            // A mirror edited, claimed or deleted: import looks.
            self.import_wake.notify_one();
        }
        let now = std::time::Instant::now();
        match event {
            // (A listed object waits only if the list shows it has work to do: see `run`.)
            Ok(watcher::Event::Apply(o)) => {
                let deleting = o.metadata.deletion_timestamp.is_some();
                self.tracked
                    .locked()
                    .consumer_changed(&pending::key(o), now, deleting);
            }
            // Gone from the consumer: nothing of it is synced any more, nor waits, nor stands
            // anywhere.
            Ok(watcher::Event::Delete(o)) => {
                let counts = self.tracked.locked().gone(&pending::key(o));
                self.publish(counts);
            }
            _ => {}
        }
    }

    /// Watched per namespace, the provider is watched in the namespaces the consumer has objects
    /// in: each consumer object's namespace is watched from when it is seen, and the first
    /// consumer list completes the provider's first.
    fn tell_provider_watch(&self, event: &Result<watcher::Event<Instance>, watcher::Error>) {
        let Some(commands) = &self.provider_namespaces else {
            return;
        };
        let command = match event {
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                let Some(namespace) = o.metadata.namespace.clone() else {
                    return;
                };
                if self.consumer_namespaces.is_some() && !self.reading.locked().contains(&namespace)
                {
                    return;
                }
                Command::Watch(namespace)
            }
            Ok(watcher::Event::InitDone) => Command::Complete,
            _ => return,
        };
        // (The watch is gone only when the worker stops.)
        let _ = commands.unbounded_send(command);
    }

    /// Tells the consumer watch, read per namespace (#54), where to read.
    pub(super) fn tell_consumer_watch(&self, command: Command) {
        if let Some(commands) = &self.consumer_namespaces {
            let _ = commands.unbounded_send(command);
        }
    }

    /// The consumer namespace `namespace` is no longer read (#54): neither is its provider
    /// namespace.
    pub(super) fn unwatch(&self, namespace: &str) {
        for commands in [&self.consumer_namespaces, &self.provider_namespaces]
            .into_iter()
            .flatten()
        {
            let _ = commands.unbounded_send(Command::Unwatch(namespace.to_owned()));
        }
    }

    /// The provider namespace of `namespace` was just created: its watch starts again now
    /// rather than after its backoff.
    pub(super) fn created_provider_namespace(&self, namespace: &str) {
        if let Some(commands) = &self.provider_namespaces {
            let _ = commands.unbounded_send(Command::Created(namespace.to_owned()));
        }
    }

    /// `side` has (re-)listed: whether to compare the objects now ([`Listed::done`]).
    pub(super) fn listed(&self, side: Side) -> bool {
        self.listed.locked().done(side)
    }

    pub(super) fn provider_copy(&self, object: &Instance) -> Option<Arc<ProviderCopy>> {
        self.provider_objects
            .get(&self.reference(object.namespace().as_deref(), &object.name_any()))
    }

    /// What the provider holds under `object`'s name as far as is known without a request: the
    /// cache's copy, else the stranger last read there ([`super::strangers`]), stale or not.
    pub(super) fn known_copy(&self, object: &Instance) -> Option<Arc<ProviderCopy>> {
        self.provider_copy(object)
            .or_else(|| self.tracked.locked().last_stranger(&pending::key(object)))
    }

    /// Records where `object` stands (`None`: neither synced nor conflicting) and updates the
    /// per-API gauges.
    pub(super) fn mark(&self, object: &Instance, state: Option<SyncState>) {
        let counts = self
            .tracked
            .locked()
            .set_state(&pending::key(object), state);
        self.publish(counts);
    }

    /// The per-API gauges of where objects stand.
    fn publish(&self, counts: super::record::Counts) {
        self.ctx.set_object_counts(
            &self.spec.api,
            &self.spec.connection,
            Some([counts.synced, counts.conflicts, counts.paused]),
        );
    }

    /// Stopping: no new sync starts, the ones in flight finish (at most 5 s), then the worker
    /// is done. (kube-runtime's own graceful shutdown sometimes kept the controller alive for
    /// seconds with nothing in flight, and a unit cannot move until its worker has stopped.)
    pub(super) async fn drain(&self, stop: &CancellationToken) {
        stop.cancelled().await;
        if !self.in_flight.drain(Duration::from_secs(5)).await {
            tracing::warn!(api = %self.spec.api, "in-flight syncs did not finish within 5 s; abandoning them");
        }
    }
}

/// `namespace/name` (or `name`) of an object, for retries and logs.
pub(super) fn object_key<K: kube::Resource>(object: &K) -> String {
    match object.namespace() {
        Some(ns) => format!("{ns}/{}", object.name_any()),
        None => object.name_any(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_a_start_only_the_side_that_lists_second_compares_and_a_relist_always_does() {
        for (first, second) in [
            (Side::Consumer, Side::Provider),
            (Side::Provider, Side::Consumer),
        ] {
            let mut listed = Listed::default();
            assert!(!listed.done(first), "{first:?} first");
            assert!(listed.done(second), "{second:?} second");
            assert!(listed.done(first), "{first:?} re-lists");
            assert!(listed.done(second), "{second:?} re-lists");
        }
    }
}
