//! One sync worker: all instances of one managed consumer CRD, synced with the provider of its
//! Connection (REFERENCE-BEHAVIOUR §17: SYNC, OWN, IDEL). The provider side is read from a
//! watch-fed cache; a write happens only when something differs.

use kbind_shared::sync::Locked;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kbind_shared::cache::{Instance, InstanceType, ProviderCopy};
use kbind_shared::keys;
use kbind_shared::kubeconfig::InlineKubeconfig;
use kube::api::{ApiResource, DynamicObject, ObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::context::Context;

mod backlog;
mod buckets;
mod decide;
mod echoes;
mod pending;
mod states;
mod status_delay;
mod sync;

use crate::namespaces;
pub use buckets::Buckets;
use states::SyncState;

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
}

/// Why an object sync did not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A consumer request failed.
    #[error("consumer: {0}")]
    Consumer(#[source] kube::Error),
    /// A provider request failed.
    #[error("provider: {0}")]
    Provider(#[source] kube::Error),
    /// This replica's membership is not current: it may no longer own the work, so it writes
    /// nothing (checked immediately before every write).
    #[error("fenced: the membership Lease was not renewed in time")]
    Fenced,
}

impl Error {
    /// A low-cardinality label for logs and `kbind_reconcile_errors_total`; `None` for the
    /// fence, which is this replica stepping back (its workers stop within a second, and the
    /// object is synced by whoever owns it next), not a failed sync — like a sync that starts
    /// fenced (#33.9).
    pub fn metric_label(&self) -> Option<&'static str> {
        match self {
            Error::Consumer(_) => Some("consumer"),
            Error::Provider(_) => Some("provider"),
            Error::Fenced => None,
        }
    }
}

struct Worker {
    ctx: Arc<Context>,
    spec: WorkerSpec,
    provider: Client,
    /// The API, as the caches' keys share it.
    dyntype: InstanceType,
    provider_objects: Store<ProviderCopy>,
    recorder: Recorder,
    known_namespaces: Mutex<HashSet<String>>,
    warned_no_status: Mutex<bool>,
    /// Objects whose provider status is too large to copy, warned about once each.
    oversized: Mutex<HashSet<pending::Key>>,
    states: Mutex<states::States>,
    in_flight: std::sync::atomic::AtomicI64,
    /// Set when the worker stops: no new sync starts.
    stopping: std::sync::atomic::AtomicBool,
    /// Backoff and log-once for objects whose sync keeps failing.
    retries: kbind_shared::backoff::Retries,
    /// Changes seen and not yet synced: the backlog, and what lag is measured from.
    pending: Arc<Mutex<pending::Pending>>,
    /// Which sides' caches have listed.
    listed: Mutex<Listed>,
    /// kbind's consumer writes the cache does not show yet.
    echoes: Mutex<echoes::Echoes>,
    /// kbind's provider writes the provider cache does not show yet.
    provider_echoes: Arc<Mutex<echoes::ProviderEchoes>>,
}

/// A side of the sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Consumer,
    Provider,
}

/// Which sides' caches have listed at least once.
#[derive(Debug, Default)]
struct Listed {
    consumer: bool,
    provider: bool,
}

impl Listed {
    /// `side` has (re-)listed: whether its objects are to be compared now — only once the other
    /// side has listed too, so that at a start exactly one of the two (the second) compares.
    fn done(&mut self, side: Side) -> bool {
        match side {
            Side::Consumer => self.consumer = true,
            Side::Provider => self.provider = true,
        }
        self.consumer && self.provider
    }
}

/// Runs the worker until `stop`.
pub async fn run(ctx: Arc<Context>, spec: WorkerSpec, stop: CancellationToken) {
    let Some(provider) = ctx
        .provider_client(&spec.kubeconfig, &spec.digest, &spec.connection, &spec.api)
        .await
    else {
        return;
    };
    let resource: InstanceType = Arc::new(spec.resource.clone());
    let api = spec.api.clone();

    // Provider side: a cache of the API's objects, each kept as the facts a sync reads
    // (`ProviderCopy`); events on them re-sync the consumer object with the same namespace/name
    // (drift repair, SYNC-12, and conflict re-evaluation, QRK-19).
    let writer = reflector::store::Writer::<ProviderCopy>::new(resource.clone());
    let provider_objects = writer.as_reader();
    let provider_api: Api<Instance> = Api::all_with(provider.clone(), &resource);
    // One watch feeds both the cache and the triggers; it runs on its own so that the cache can
    // be waited for once, before any decision reads it. (Waiting inside reconciles is not an
    // option: a Store's readiness wakes only the last of several concurrent waiters.)
    let buckets = spec.buckets.clone();
    // The consumer side's cache, made first: a provider change counts as waiting only for an
    // object the consumer has (nothing else is ever synced, so nothing else may wait).
    let consumer_writer = reflector::store::Writer::<Instance>::new(resource.clone());
    let consumer_objects = consumer_writer.as_reader();
    let pending = Arc::new(Mutex::new(pending::Pending::new(
        ctx.limits.status_min_interval,
    )));
    let (seen_consumer, seen_pending) = (consumer_objects.clone(), pending.clone());
    let seen_resource = resource.clone();
    let local_uid = spec.local_uid.clone();
    let max_status_bytes = ctx.limits.max_status_bytes;
    let provider_echoes = Arc::new(Mutex::new(echoes::ProviderEchoes::default()));
    let seen_echoes = provider_echoes.clone();
    // A change is recorded as waiting before the cache shows it, so that a sync that sees it in
    // the cache also finds when it was first seen.
    let provider_events = reflector::reflector(
        writer,
        kbind_shared::streaming::instances(provider_api, watcher::Config::default())
            .filter(move |e| std::future::ready(buckets.keep(e)))
            .inspect(move |event| {
                // (A re-list's objects are compared once it is complete, below.)
                if let Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) = event {
                    seen_echoes
                        .locked()
                        .saw(&pending_key(o), o.metadata.resource_version.as_deref());
                    let mut reference = ObjectRef::new_with(&o.name_any(), seen_resource.clone());
                    if let Some(namespace) = o.namespace() {
                        reference = reference.within(&namespace);
                    }
                    if seen_consumer.get(&reference).is_some() {
                        seen_pending
                            .locked()
                            .provider_changed(pending_key(o), std::time::Instant::now());
                    }
                }
            })
            .map_ok(move |event| {
                kbind_shared::cache::map_event(event, |o| {
                    ProviderCopy::of(o, &local_uid).bounded(max_status_bytes)
                })
            }),
    )
    .default_backoff();
    let worker = Arc::new(Worker {
        recorder: Recorder::new(ctx.client.clone(), ctx.reporter.clone()),
        ctx: ctx.clone(),
        spec,
        provider,
        dyntype: resource.clone(),
        provider_objects: provider_objects.clone(),
        known_namespaces: Mutex::default(),
        warned_no_status: Mutex::new(false),
        oversized: Mutex::default(),
        states: Mutex::default(),
        in_flight: Default::default(),
        stopping: Default::default(),
        retries: kbind_shared::backoff::Retries::new(
            Duration::from_secs(1),
            Duration::from_secs(300),
        ),
        pending: pending.clone(),
        listed: Mutex::default(),
        echoes: Mutex::default(),
        provider_echoes,
    });
    let (trigger, provider_triggers) = futures::channel::mpsc::unbounded();
    let trigger_resource = resource.clone();
    let (relisted, relisted_consumer) = (worker.clone(), consumer_objects.clone());
    let feeder = tokio::spawn(async move {
        let mut events = std::pin::pin!(provider_events);
        while let Some(event) = events.next().await {
            let object = match event {
                // The cache holds the event now: a write's echo among those seen ends its wait.
                Ok(watcher::Event::Apply(o)) => {
                    let key = (
                        o.namespace.as_deref().map(str::to_owned),
                        o.name.to_string(),
                    );
                    relisted.provider_echoes.locked().cached(&key);
                    o
                }
                Ok(watcher::Event::Delete(o)) => {
                    let key = (
                        o.namespace.as_deref().map(str::to_owned),
                        o.name.to_string(),
                    );
                    relisted.provider_echoes.locked().forget(&key);
                    o
                }
                // A (re-)list is complete and the cache holds it: only the consumer objects it
                // leaves with work to do are synced, not every object again.
                Ok(watcher::Event::InitDone) => {
                    relisted.provider_echoes.locked().clear();
                    if !relisted.listed(Side::Provider) {
                        continue;
                    }
                    let now = std::time::Instant::now();
                    for object in relisted.with_work(&relisted_consumer) {
                        relisted
                            .pending
                            .locked()
                            .provider_changed(pending_key(object.as_ref()), now);
                        let reference =
                            ObjectRef::from_obj_with(object.as_ref(), trigger_resource.clone());
                        if trigger.unbounded_send(reference).is_err() {
                            return;
                        }
                    }
                    continue;
                }
                _ => continue,
            };
            let mut reference =
                ObjectRef::<Instance>::new_with(&object.name, trigger_resource.clone());
            if let Some(namespace) = object.namespace.as_deref() {
                reference = reference.within(namespace);
            }
            if trigger.unbounded_send(reference).is_err() {
                break;
            }
        }
    });
    let consumer_api: Api<Instance> = Api::all_with(ctx.client.clone(), &resource);
    let buckets = worker.spec.buckets.clone();
    let seen = worker.clone();
    let consumer_events = reflector::reflector(
        consumer_writer,
        kbind_shared::streaming::instances(consumer_api, watcher::Config::default())
            .filter(move |e| std::future::ready(buckets.keep(e)))
            .modify(|o| kbind_shared::cache::consumer_metadata(&mut o.metadata))
            .inspect(move |event| seen.saw_consumer_event(event)),
    )
    .default_backoff();
    // The consumer side lists at the same time as the provider side (a restart waits for the
    // longer of the two lists, not for both). A change syncs; a (re-)list is compared with the
    // other side's cache — at a start by whichever side finishes listing second — and only the
    // objects with work to do sync: the others are recorded where they stand, and do not queue
    // ahead of the changes (a restart at 100,000 objects would otherwise sync every one of them
    // before a change made meanwhile).
    let (consumer_sender, consumer_received) = futures::channel::mpsc::unbounded();
    let (listed, listed_consumer) = (worker.clone(), consumer_objects.clone());
    let consumer_feeder = tokio::spawn(async move {
        let mut events = std::pin::pin!(consumer_events);
        while let Some(event) = events.next().await {
            let changed = match event {
                Ok(watcher::Event::Apply(o)) => {
                    listed
                        .echoes
                        .locked()
                        .showed(&pending_key(&o), o.metadata.resource_version.as_deref());
                    o
                }
                Ok(watcher::Event::Delete(o)) => {
                    listed.echoes.locked().forget(&pending_key(&o));
                    continue;
                }
                Ok(watcher::Event::InitDone) => {
                    listed.echoes.locked().clear();
                    if !listed.listed(Side::Consumer) {
                        continue;
                    }
                    let now = std::time::Instant::now();
                    for object in listed.with_work(&listed_consumer) {
                        let deleting = object.metadata.deletion_timestamp.is_some();
                        listed.pending.locked().consumer_changed(
                            pending_key(object.as_ref()),
                            now,
                            deleting,
                        );
                        if consumer_sender
                            .unbounded_send(Ok(object.as_ref().clone()))
                            .is_err()
                        {
                            return;
                        }
                    }
                    continue;
                }
                Ok(_) => continue,
                Err(e) => {
                    tracing::debug!(api = %listed.spec.api, error = %e, "consumer watch");
                    continue;
                }
            };
            if consumer_sender.unbounded_send(Ok(changed)).is_err() {
                return;
            }
        }
    });
    tokio::select! {
        ready = provider_objects.wait_until_ready() => {
            if ready.is_err() {
                tracing::warn!(api = %api, "the provider watch ended before it listed");
                feeder.abort();
                consumer_feeder.abort();
                return;
            }
        }
        _ = stop.cancelled() => {
            feeder.abort();
            consumer_feeder.abort();
            return;
        }
    }

    // A binding change (which may bind or unbind the API for any object) and the periodic
    // backstop resync look at every object, and sync the ones with work to do. (A burst of
    // binding events is one look.)
    let consumer_objects_for_count = consumer_objects.clone();
    let (scanner, scanned) = (worker.clone(), consumer_objects.clone());
    let scan_resource = resource.clone();
    let rescans = futures::stream::select(ctx.binding_changes(), resync_ticks(ctx.resync_interval))
        .ready_chunks(1024)
        .flat_map(move |_| {
            let references: Vec<ObjectRef<Instance>> = scanner
                .with_work(&scanned)
                .iter()
                .map(|o| ObjectRef::from_obj_with(o.as_ref(), scan_resource.clone()))
                .collect();
            futures::stream::iter(references)
        });
    let graceful = stop.clone();
    let worker_for_stop = worker.clone();
    let controller = Controller::for_stream_with(consumer_received, consumer_objects, resource)
        .with_config(kube::runtime::controller::Config::default().concurrency(ctx.workers))
        .reconcile_on(provider_triggers)
        .reconcile_on(rescans)
        .graceful_shutdown_on(async move { graceful.cancelled().await })
        .run(reconcile, error_policy, worker)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "sync");
            }
        });
    // Stopping: no new sync starts, the ones in flight finish (at most 5 s), then the controller
    // is dropped. (kube-runtime's own graceful shutdown sometimes kept the controller alive for
    // seconds with nothing in flight, and a unit cannot move until its worker has stopped.)
    let drained = async {
        use std::sync::atomic::Ordering;
        stop.cancelled().await;
        worker_for_stop.stopping.store(true, Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while worker_for_stop.in_flight.load(Ordering::SeqCst) > 0 {
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(api = %worker_for_stop.spec.api, "in-flight syncs did not finish within 5 s; abandoning them");
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    // The backlog gauges, refreshed every second (the oldest entry ages between events); and
    // every few seconds, once the consumer cache has listed, the objects per unit for the
    // membership Lease (the leader places units by them).
    let counted_objects = consumer_objects_for_count;
    let backlog = async {
        let worker = &worker_for_stop;
        let labels = [worker.spec.connection.as_str(), worker.spec.api.as_str()];
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut ticks: u64 = 0;
        loop {
            tick.tick().await;
            if ticks.is_multiple_of(OBJECT_COUNT_TICKS) && worker.listed.locked().consumer {
                let objects = counted_objects.state();
                ctx.membership
                    .set_objects(worker.spec.buckets.objects_per_unit(
                        &worker.spec.connection,
                        &worker.spec.api,
                        objects.iter().map(|o| o.metadata.namespace.as_deref()),
                    ));
            }
            ticks += 1;
            let record_wait = {
                let mut pending = worker.pending.locked();
                pending.compact(std::time::Instant::now());
                pending.record_wait()
            };
            ctx.metrics
                .delivery_record_wait_seconds
                .with_label_values(&labels)
                .set(record_wait.as_secs_f64());
            let tally = worker.backlog(&counted_objects);
            for state in backlog::Waiting::ALL {
                ctx.metrics
                    .sync_backlog
                    .with_label_values(&[labels[0], labels[1], state.label()])
                    .set(tally.count(state) as f64);
            }
            ctx.metrics
                .sync_backlog_oldest_seconds
                .with_label_values(&labels)
                .set(tally.oldest().as_secs_f64());
        }
    };
    tokio::select! {
        _ = controller => {}
        _ = drained => {}
        _ = backlog => {}
    }
    feeder.abort();
    consumer_feeder.abort();
    let units = worker_for_stop.spec.buckets.objects_per_unit(
        &worker_for_stop.spec.connection,
        &api,
        std::iter::empty(),
    );
    ctx.membership.forget_objects(units.keys());
    for gauge in [
        &ctx.metrics.synced_objects,
        &ctx.metrics.conflicts,
        &ctx.metrics.work_queue_depth,
    ] {
        let _ = gauge.remove_label_values(&[api.as_str()]);
    }
    for gauge in [
        &ctx.metrics.sync_backlog_oldest_seconds,
        &ctx.metrics.delivery_record_wait_seconds,
    ] {
        let _ =
            gauge.remove_label_values(&[worker_for_stop.spec.connection.as_str(), api.as_str()]);
    }
    for state in backlog::Waiting::ALL {
        let _ = ctx.metrics.sync_backlog.remove_label_values(&[
            worker_for_stop.spec.connection.as_str(),
            api.as_str(),
            state.label(),
        ]);
    }
}

/// Objects per unit are counted every this many backlog ticks (seconds).
const OBJECT_COUNT_TICKS: u64 = 5;

/// One tick per `period`, the first after one period: the backstop resync of every object.
fn resync_ticks(period: Duration) -> impl futures::Stream<Item = ()> + Send + 'static {
    futures::stream::unfold((), move |()| async move {
        tokio::time::sleep(period).await;
        Some(((), ()))
    })
}

/// The `result` label of `kbind_sync_operations_total` for a failed request: `forbidden` (RBAC),
/// `rejected` (the API server's admission or validation said no: 400, 422), `conflict` (409),
/// `transient` (unavailable, overloaded, timed out, unreachable — retrying helps), `error`
/// (anything else).
pub fn result_label(error: &kube::Error) -> &'static str {
    use kbind_shared::delivery::{Refusal, refusal};
    match error {
        kube::Error::Api(s) if refusal(s.code, &s.message) == Some(Refusal::Forbidden) => {
            "forbidden"
        }
        kube::Error::Api(s) if s.is_conflict() => "conflict",
        kube::Error::Api(s) if refusal(s.code, &s.message) == Some(Refusal::Rejected) => "rejected",
        kube::Error::Api(s) if s.code >= 500 || s.code == 429 || s.code == 408 => "transient",
        kube::Error::Api(_) => "error",
        kube::Error::HyperError(_) | kube::Error::Service(_) => "transient",
        _ => "error",
    }
}

/// The backlog key of an object.
fn pending_key<K: Resource>(object: &K) -> pending::Key {
    (object.namespace(), object.name_any())
}

/// `namespace/name` (or `name`) of an object, for retries and logs.
fn object_key<K: Resource>(object: &K) -> String {
    match object.namespace() {
        Some(ns) => format!("{ns}/{}", object.name_any()),
        None => object.name_any(),
    }
}

fn error_policy(object: Arc<Instance>, error: &Error, worker: Arc<Worker>) -> Action {
    if let Some(reason) = error.metric_label() {
        worker
            .ctx
            .metrics
            .reconcile_errors_total
            .with_label_values(&["sync", reason])
            .inc();
    }
    if let Error::Fenced = error {
        return Action::requeue(Duration::from_secs(1));
    }
    if let Error::Consumer(kube::Error::Api(s)) = error
        && s.is_conflict()
    {
        // A write raced with another: the fresh object is on its way through the watch.
        tracing::debug!(api = %worker.spec.api, object = %object.name_any(), "write conflict; retrying");
        return Action::requeue(Duration::from_millis(200));
    }
    let key = object_key(object.as_ref());
    let retry = worker.retries.failed(&key, &error.to_string());
    if retry.log {
        tracing::warn!(api = %worker.spec.api, object = %key, error = %kbind_shared::redact::remote(&error.to_string()), kind = error.metric_label(), retry_in = ?retry.after, "sync failed");
    } else {
        tracing::debug!(api = %worker.spec.api, object = %key, error = %kbind_shared::redact::remote(&error.to_string()), retry_in = ?retry.after, "sync failed again");
    }
    Action::requeue(retry.after)
}

impl Worker {
    /// A consumer watch event (already filtered to this worker's buckets): a change now waits.
    fn saw_consumer_event(&self, event: &Result<watcher::Event<Instance>, watcher::Error>) {
        let now = std::time::Instant::now();
        match event {
            // (A listed object waits only if the list shows it has work to do: see `run`.)
            Ok(watcher::Event::Apply(o)) => {
                let deleting = o.metadata.deletion_timestamp.is_some();
                self.pending
                    .locked()
                    .consumer_changed(pending_key(o), now, deleting);
            }
            // Gone from the consumer: nothing of it is synced any more, nor waits.
            Ok(watcher::Event::Delete(o)) => {
                self.pending.locked().deleted(&pending_key(o));
            }
            _ => {}
        }
    }

    /// `side` has (re-)listed: whether to compare the objects now ([`Listed::done`]).
    fn listed(&self, side: Side) -> bool {
        self.listed.locked().done(side)
    }

    /// Whether a sync of `object` has anything to do; when not, where it stands is recorded.
    fn has_work(&self, object: &Instance) -> bool {
        if self.echoes.locked().behind(
            &pending_key(object),
            object.metadata.resource_version.as_deref(),
        ) {
            // Its echo syncs it.
            return false;
        }
        let copy = self.provider_copy(object);
        match sync::at_rest(self, object, copy.as_deref()) {
            decide::Rest::Work => true,
            decide::Rest::Unbound => false,
            decide::Rest::Stands(state) => {
                self.mark(object, Some(state));
                false
            }
        }
    }

    /// The backlog (#33.4): what the objects of `consumer` say of themselves
    /// ([`backlog::waiting`]), and what only the worker's memory knows — changes seen that the
    /// objects do not show as waiting (a provider status not copied down yet, a CRD without the
    /// delivery record).
    fn backlog(&self, consumer: &Store<Instance>) -> backlog::Tally {
        let wall = jiff::Timestamp::now();
        let now = std::time::Instant::now();
        let objects = consumer.state();
        // Whether a binding binds the API, asked once per namespace.
        let mut bound = Default::default();
        let mut tally = backlog::Tally::default();
        for object in &objects {
            if let Some((state, age)) = self.waits(object, &mut bound, wall) {
                tally.add(state, age);
            }
        }
        for (key, seen) in self.pending.locked().entries() {
            let mut reference = ObjectRef::new_with(&key.1, self.dyntype.clone());
            if let Some(namespace) = key.0.as_deref() {
                reference = reference.within(namespace);
            }
            if let Some(object) = consumer.get(&reference)
                && self.waits(&object, &mut Default::default(), wall).is_some()
            {
                // Counted above.
                continue;
            }
            let state = if seen.consumer.is_some() {
                backlog::Waiting::Pending
            } else {
                backlog::Waiting::Status
            };
            let age = seen
                .first()
                .map(|t| now.saturating_duration_since(t))
                .unwrap_or_default();
            tally.add(state, age);
        }
        tally
    }

    /// Whether `object` waits ([`backlog::waiting`]), why and for how long at `wall`; `bound`
    /// remembers per namespace whether a binding binds the API there.
    fn waits<'a>(
        &self,
        object: &'a Instance,
        bound: &mut std::collections::HashMap<Option<&'a str>, bool>,
        wall: jiff::Timestamp,
    ) -> Option<(backlog::Waiting, Duration)> {
        let namespace = object.metadata.namespace.as_deref();
        let bound = *bound.entry(namespace).or_insert_with(|| {
            self.ctx
                .resolve(&self.spec.connection, &self.spec.api, namespace)
                .is_some_and(|r| r.is_bound())
        });
        backlog::waiting(&backlog::Facts {
            generation: object.metadata.generation,
            deletion: object
                .metadata
                .deletion_timestamp
                .as_ref()
                .and_then(kbind_shared::delivery::Seconds::of),
            has_finalizer: kbind_shared::finalizers::has(&object.metadata, keys::SYNCER_FINALIZER),
            bound,
            conflict: object.annotations().contains_key(keys::CONFLICT_ANNOTATION),
            has_delivery: self.spec.has_delivery,
            record: object.delivery.as_ref(),
            changed_at: object.changed_at,
        })
        .map(|(state, since)| (state, backlog::age(since, wall)))
    }

    /// The objects of `consumer` (this worker's cache of them) whose sync has something to do.
    fn with_work(&self, consumer: &Store<Instance>) -> Vec<Arc<Instance>> {
        consumer
            .state()
            .into_iter()
            .filter(|o| self.has_work(o))
            .collect()
    }

    /// Records, for the write of `op` that just delivered a change, the delay from the change to
    /// now in `kbind_sync_lag_seconds` and `kbind_sync_latency_seconds`: one observation per
    /// delivering write. The change began at the earlier of kbind's `receipt` of it and the API
    /// server's `recorded` time of it ([`pending::change_start`]); neither known (a drift repaired
    /// at a resync): zero.
    fn lag(
        &self,
        op: &str,
        receipt: Option<std::time::Instant>,
        recorded: Option<kbind_shared::delivery::Seconds>,
    ) {
        let now = std::time::Instant::now();
        let since = pending::change_start(receipt, recorded, now, jiff::Timestamp::now());
        let seconds = since
            .map(|t| now.saturating_duration_since(t).as_secs_f64())
            .unwrap_or_default();
        self.ctx
            .metrics
            .sync_lag_seconds
            .with_label_values(&[self.spec.connection.as_str(), self.spec.api.as_str(), op])
            .observe(seconds);
        self.ctx
            .metrics
            .sync_latency_seconds
            .with_label_values(&[op])
            .observe(seconds);
    }

    /// The write fence, checked right before each write.
    fn fence(&self) -> Result<(), Error> {
        if self.ctx.membership.is_current() {
            Ok(())
        } else {
            Err(Error::Fenced)
        }
    }

    fn consumer_api(&self, namespace: Option<&str>) -> Api<DynamicObject> {
        kbind_shared::dynamic::scoped(&self.ctx.client, namespace, &self.spec.resource)
    }

    fn provider_api(&self, namespace: Option<&str>) -> Api<DynamicObject> {
        kbind_shared::dynamic::scoped(&self.provider, namespace, &self.spec.resource)
    }

    fn provider_copy(&self, object: &Instance) -> Option<Arc<ProviderCopy>> {
        let mut reference = ObjectRef::new_with(&object.name_any(), self.dyntype.clone());
        if let Some(namespace) = object.namespace() {
            reference = reference.within(&namespace);
        }
        self.provider_objects.get(&reference)
    }

    /// Records where `object` stands (`None`: neither synced nor conflicting) and updates the
    /// per-API gauges.
    fn mark(&self, object: &Instance, state: Option<SyncState>) {
        let (synced, conflicts) = {
            let mut states = self.states.locked();
            states.set(
                object.metadata.namespace.as_deref(),
                object.metadata.name.as_deref().unwrap_or_default(),
                state,
            );
            states.counts()
        };
        let api = self.spec.api.as_str();
        self.ctx
            .metrics
            .synced_objects
            .with_label_values(&[api])
            .set(synced as f64);
        self.ctx
            .metrics
            .conflicts
            .with_label_values(&[api])
            .set(conflicts as f64);
    }

    fn count(&self, op: &str, result: &str) {
        self.ctx
            .metrics
            .sync_operations_total
            .with_label_values(&[self.spec.api.as_str(), op, result])
            .inc();
    }

    async fn warn(&self, object: &Instance, reason: &str, note: String) {
        let event = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note),
            action: "Sync".into(),
            secondary: None,
        };
        if let Err(e) = self
            .recorder
            .publish(&event, &object.object_ref(&self.dyntype))
            .await
        {
            tracing::debug!(error = %e, "cannot publish Event");
        }
    }

    async fn set_finalizers(
        &self,
        object: &Instance,
        finalizers: Vec<String>,
    ) -> Result<(), Error> {
        let patch = kbind_shared::finalizers::patch(&object.metadata, &finalizers);
        self.fence()?;
        match self
            .consumer_api(object.namespace().as_deref())
            .patch(
                &object.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(written) => {
                self.wrote(object, &written);
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
            Err(e) => Err(Error::Consumer(e)),
        }
    }

    async fn set_conflict(&self, object: &Instance, reason: Option<&str>) -> Result<(), Error> {
        let current = object
            .annotations()
            .get(keys::CONFLICT_ANNOTATION)
            .map(String::as_str);
        if current == reason {
            return Ok(());
        }
        let patch = json!({ "metadata": { "annotations": { keys::CONFLICT_ANNOTATION: reason } } });
        self.fence()?;
        self.consumer_api(object.namespace().as_deref())
            .patch(
                &object.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map(|written| self.wrote(object, &written))
            .map_err(Error::Consumer)
    }

    /// kbind wrote `object` (as the cache showed it), and the API server answered `written`.
    fn wrote(&self, object: &Instance, written: &kube::api::DynamicObject) {
        self.echoes.locked().wrote(
            pending_key(object),
            object.metadata.resource_version.as_deref(),
            written.metadata.resource_version.as_deref(),
        );
    }

    /// Whether the provider's status of `object` is too large to copy (`Some(size)`): a Warning
    /// Event the first time, and counted; nothing once it fits again.
    async fn note_oversized(&self, object: &Instance, size: Option<usize>) {
        let key = pending_key(object);
        let Some(size) = size else {
            self.oversized.locked().remove(&key);
            return;
        };
        if !self.oversized.locked().insert(key) {
            return;
        }
        self.count("status_down", "too_large");
        let limit = self.ctx.limits.max_status_bytes;
        self.warn(
            object,
            "StatusTooLarge",
            format!("the provider's status is {size} bytes, more than the {limit} kbind copies (--max-status-bytes); the status here is left as it was"),
        )
        .await;
    }

    /// The provider namespace went away: create it again before the next write there.
    fn forget_namespace(&self, namespace: &str) {
        self.known_namespaces.locked().remove(namespace);
    }

    /// LIM-26: create the provider namespace only when it does not exist.
    async fn ensure_provider_namespace(&self, namespace: &str) -> Result<(), kube::Error> {
        if self.known_namespaces.locked().contains(namespace) {
            return Ok(());
        }
        // KEY-4: on instance-created provider namespaces the consumer UID is a label.
        let object = Namespace {
            metadata: ObjectMeta {
                name: Some(namespace.to_owned()),
                labels: Some(
                    [
                        (keys::MANAGED_LABEL.to_owned(), keys::TRUE.to_owned()),
                        (
                            keys::CONSUMER_CLUSTER_UID_ANNOTATION.to_owned(),
                            self.spec.local_uid.clone(),
                        ),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces::create_if_missing(&self.provider, &object).await?;
        self.known_namespaces.locked().insert(namespace.to_owned());
        Ok(())
    }
}

/// One object sync, with `kbind_work_queue_depth` counting syncs in progress.
async fn reconcile(object: Arc<Instance>, worker: Arc<Worker>) -> Result<Action, Error> {
    use std::sync::atomic::Ordering;
    let gauge = worker
        .ctx
        .metrics
        .work_queue_depth
        .with_label_values(&[worker.spec.api.as_str()]);
    gauge.set((worker.in_flight.fetch_add(1, Ordering::SeqCst) + 1) as f64);
    // Counted first, then checked: a stop that sees no sync in flight has seen every sync that
    // got past this check.
    if worker.stopping.load(Ordering::SeqCst) {
        gauge.set((worker.in_flight.fetch_sub(1, Ordering::SeqCst) - 1) as f64);
        return Ok(Action::await_change());
    }
    let name = object.name_any();
    tracing::trace!(object = %name, "sync start");
    let key = object_key(object.as_ref());
    let waiting = pending_key(object.as_ref());
    if worker
        .echoes
        .locked()
        .behind(&waiting, object.metadata.resource_version.as_deref())
    {
        // The echo of kbind's own write syncs it again (`echoes`); its changes wait until then.
        tracing::trace!(object = %name, "the cache does not show kbind's last write yet");
        gauge.set((worker.in_flight.fetch_sub(1, Ordering::SeqCst) - 1) as f64);
        return Ok(Action::await_change());
    }
    let provider_wait = worker
        .provider_echoes
        .locked()
        .waits(&waiting, std::time::Instant::now());
    if let Some(wait) = provider_wait {
        // The same on the provider side: the echo of kbind's spec-up syncs it again, or, if the
        // write changed nothing (no echo), the wait lapses.
        tracing::trace!(object = %name, "the provider cache does not show kbind's last write yet");
        gauge.set((worker.in_flight.fetch_sub(1, Ordering::SeqCst) - 1) as f64);
        return Ok(Action::requeue(wait));
    }
    let seen = worker.pending.locked().take(&waiting);
    let result = sync::sync(object, worker.clone(), seen).await;
    if result.is_ok() {
        worker.retries.succeeded(&key);
    } else {
        worker.pending.locked().give_back(waiting, seen);
    }
    tracing::trace!(object = %name, ok = result.is_ok(), "sync end");
    gauge.set((worker.in_flight.fetch_sub(1, Ordering::SeqCst) - 1) as f64);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            reason: reason.into(),
            ..kube::core::Status::failure(reason, reason)
        }))
    }

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

    #[test]
    fn results_tell_forbidden_rejected_conflict_and_transient_apart() {
        let cases = [
            (
                api(
                    403,
                    r#"widgets.example.org "w" is forbidden: User "kbind" cannot create resource "widgets""#,
                ),
                "forbidden",
            ),
            (
                api(
                    403,
                    r#"admission webhook "deny.example.org" denied the request: no"#,
                ),
                "rejected",
            ),
            (api(409, "Conflict"), "conflict"),
            (api(422, "Invalid"), "rejected"),
            (api(400, "BadRequest"), "rejected"),
            (api(500, "InternalError"), "transient"),
            (api(503, "ServiceUnavailable"), "transient"),
            (api(429, "TooManyRequests"), "transient"),
            (api(504, "Timeout"), "transient"),
            (api(404, "NotFound"), "error"),
            (
                kube::Error::Service("connection refused".into()),
                "transient",
            ),
            (
                kube::Error::SerdeError(serde_json::from_str::<u8>("x").unwrap_err()),
                "error",
            ),
        ];
        for (error, want) in cases {
            assert_eq!(result_label(&error), want, "{error}");
        }
    }
}
