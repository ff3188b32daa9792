//! One sync worker: all instances of one managed consumer CRD, synced with the provider of its
//! Connection (REFERENCE-BEHAVIOUR §17: SYNC, OWN, IDEL). The provider side is read from a
//! watch-fed cache; a write happens only when something differs.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kbind_shared::keys;
use kbind_shared::kubeconfig::InlineKubeconfig;
use kbind_shared::shard::{self, Unit};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams, Preconditions,
};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::namespaces;
use kbind_shared::ownership::{self, Decision, Owner};

/// What a worker syncs, and with which provider.
pub struct WorkerSpec {
    /// `<plural>.<group>`
    pub api: String,
    /// The storage version's resource.
    pub resource: ApiResource,
    /// Whether the consumer CRD has a status subresource.
    pub has_status_subresource: bool,
    /// The Connection.
    pub connection: String,
    /// The consumer's pinned identity.
    pub local_uid: String,
    /// Provider credentials.
    pub kubeconfig: InlineKubeconfig,
    /// Which namespaces' objects this worker syncs.
    pub buckets: Buckets,
}

/// The namespace buckets of an API a worker serves (see `kbind_shared::shard::Unit`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Buckets {
    /// Every object.
    All,
    /// Objects whose namespace hashes into `mine` of `of` buckets.
    Some {
        /// How many buckets the API is split into.
        of: u32,
        /// The buckets assigned here.
        mine: BTreeSet<u32>,
    },
}

impl Buckets {
    /// From the units of one API assigned here; `None` when there are none.
    pub fn of(units: &[&Unit]) -> Option<Self> {
        let mut buckets: Option<Self> = None;
        for unit in units {
            let Unit::Api { bucket, .. } = unit else {
                continue;
            };
            match (bucket, &mut buckets) {
                (None, _) => return Some(Buckets::All),
                (Some((k, n)), None) => {
                    buckets = Some(Buckets::Some {
                        of: *n,
                        mine: [*k].into(),
                    })
                }
                (Some((k, n)), Some(Buckets::Some { of, mine })) if of == n => {
                    mine.insert(*k);
                }
                // A split that is being changed: the other size's units wait for the next round.
                (Some(_), _) => {}
            }
        }
        buckets
    }

    /// Whether an object in `namespace` is served here.
    pub fn contains(&self, namespace: Option<&str>) -> bool {
        match self {
            Buckets::All => true,
            Buckets::Some { of, mine } => mine.contains(&shard::namespace_bucket(namespace, *of)),
        }
    }

    /// Keeps only the watch events of objects served here (the caches then hold only those).
    fn keep<K: Resource>(&self, event: &Result<watcher::Event<K>, watcher::Error>) -> bool {
        match event {
            Ok(
                watcher::Event::Apply(o) | watcher::Event::Delete(o) | watcher::Event::InitApply(o),
            ) => self.contains(o.meta().namespace.as_deref()),
            _ => true,
        }
    }
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

struct Worker {
    ctx: Arc<Context>,
    spec: WorkerSpec,
    provider: Client,
    provider_objects: Store<DynamicObject>,
    recorder: Recorder,
    known_namespaces: Mutex<HashSet<String>>,
    warned_no_status: Mutex<bool>,
    states: Mutex<HashMap<(Option<String>, String), SyncState>>,
    in_flight: std::sync::atomic::AtomicI64,
    /// Set when the worker stops: no new sync starts.
    stopping: std::sync::atomic::AtomicBool,
}

/// Where an object stands, for `kbind_synced_objects` and `kbind_conflicts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SyncState {
    Synced,
    Conflict,
}

/// Runs the worker until `stop`.
pub async fn run(ctx: Arc<Context>, spec: WorkerSpec, stop: CancellationToken) {
    let provider = match spec
        .kubeconfig
        .counted_client(&spec.connection, Some(&ctx.metrics.api_requests_total))
        .await
    {
        Ok(client) => client,
        Err(e) => {
            tracing::warn!(api = %spec.api, error = %e, "cannot build the provider client");
            return;
        }
    };
    let resource = spec.resource.clone();
    let api = spec.api.clone();

    // Provider side: a cache of the API's objects; events on them re-sync the consumer object with
    // the same namespace/name (drift repair, SYNC-12, and conflict re-evaluation, QRK-19).
    let writer = reflector::store::Writer::<DynamicObject>::new(resource.clone());
    let provider_objects = writer.as_reader();
    let provider_api: Api<DynamicObject> = Api::all_with(provider.clone(), &resource);
    // One watch feeds both the cache and the triggers; it runs on its own so that the cache can
    // be waited for once, before any decision reads it. (Waiting inside reconciles is not an
    // option: a Store's readiness wakes only the last of several concurrent waiters.)
    let buckets = spec.buckets.clone();
    let provider_events = reflector::reflector(
        writer,
        watcher(provider_api, watcher::Config::default())
            .filter(move |e| std::future::ready(buckets.keep(e))),
    )
    .default_backoff();
    let (trigger, provider_triggers) = futures::channel::mpsc::unbounded();
    let trigger_resource = resource.clone();
    let feeder = tokio::spawn(async move {
        let mut events = std::pin::pin!(provider_events);
        while let Some(event) = events.next().await {
            let object = match event {
                Ok(
                    watcher::Event::Apply(o)
                    | watcher::Event::Delete(o)
                    | watcher::Event::InitApply(o),
                ) => o,
                _ => continue,
            };
            let mut reference = ObjectRef::new_with(&object.name_any(), trigger_resource.clone());
            if let Some(namespace) = object.namespace() {
                reference = reference.within(&namespace);
            }
            if trigger.unbounded_send(reference).is_err() {
                break;
            }
        }
    });
    tokio::select! {
        ready = provider_objects.wait_until_ready() => {
            if ready.is_err() {
                tracing::warn!(api = %spec.api, "the provider watch ended before it listed");
                return;
            }
        }
        _ = stop.cancelled() => {
            feeder.abort();
            return;
        }
    }

    let worker = Arc::new(Worker {
        recorder: Recorder::new(ctx.client.clone(), ctx.reporter.clone()),
        ctx: ctx.clone(),
        spec,
        provider,
        provider_objects: provider_objects.clone(),
        known_namespaces: Mutex::default(),
        warned_no_status: Mutex::new(false),
        states: Mutex::default(),
        in_flight: Default::default(),
        stopping: Default::default(),
    });
    let consumer_api: Api<DynamicObject> = Api::all_with(ctx.client.clone(), &resource);
    let consumer_writer = reflector::store::Writer::<DynamicObject>::new(resource.clone());
    let consumer_objects = consumer_writer.as_reader();
    let buckets = worker.spec.buckets.clone();
    let consumer_events = reflector::reflector(
        consumer_writer,
        watcher(consumer_api, watcher::Config::default())
            .filter(move |e| std::future::ready(buckets.keep(e))),
    )
    .default_backoff()
    .applied_objects();
    let graceful = stop.clone();
    let worker_for_stop = worker.clone();
    let controller = Controller::for_stream_with(consumer_events, consumer_objects, resource)
        .with_config(kube::runtime::controller::Config::default().concurrency(ctx.workers))
        .reconcile_on(provider_triggers)
        .reconcile_all_on(ctx.binding_changes())
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
    tokio::select! {
        _ = controller => {}
        _ = drained => {}
    }
    feeder.abort();
    for gauge in [
        &ctx.metrics.synced_objects,
        &ctx.metrics.conflicts,
        &ctx.metrics.work_queue_depth,
    ] {
        let _ = gauge.remove_label_values(&[api.as_str()]);
    }
}

fn error_policy(object: Arc<DynamicObject>, error: &Error, worker: Arc<Worker>) -> Action {
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
    tracing::warn!(api = %worker.spec.api, object = %object.name_any(), namespace = ?object.namespace(), error = %error, "sync failed");
    Action::requeue(Duration::from_secs(5))
}

impl Worker {
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

    fn provider_copy(&self, object: &DynamicObject) -> Option<Arc<DynamicObject>> {
        let mut reference = ObjectRef::new_with(&object.name_any(), self.spec.resource.clone());
        if let Some(namespace) = object.namespace() {
            reference = reference.within(&namespace);
        }
        self.provider_objects.get(&reference)
    }

    /// Records where `object` stands (`None`: neither synced nor conflicting) and updates the
    /// per-API gauges.
    fn mark(&self, object: &DynamicObject, state: Option<SyncState>) {
        let key = (object.namespace(), object.name_any());
        let mut states = self.states.lock().expect("not poisoned");
        match state {
            Some(state) => states.insert(key, state),
            None => states.remove(&key),
        };
        let count = |wanted: SyncState| states.values().filter(|s| **s == wanted).count() as f64;
        let api = self.spec.api.as_str();
        self.ctx
            .metrics
            .synced_objects
            .with_label_values(&[api])
            .set(count(SyncState::Synced));
        self.ctx
            .metrics
            .conflicts
            .with_label_values(&[api])
            .set(count(SyncState::Conflict));
    }

    fn count(&self, op: &str, result: &str) {
        self.ctx
            .metrics
            .sync_operations_total
            .with_label_values(&[self.spec.api.as_str(), op, result])
            .inc();
    }

    async fn warn(&self, object: &DynamicObject, reason: &str, note: String) {
        let event = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note),
            action: "Sync".into(),
            secondary: None,
        };
        if let Err(e) = self
            .recorder
            .publish(&event, &object.object_ref(&self.spec.resource))
            .await
        {
            tracing::debug!(error = %e, "cannot publish Event");
        }
    }

    async fn set_finalizers(
        &self,
        object: &DynamicObject,
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
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
            Err(e) => Err(Error::Consumer(e)),
        }
    }

    async fn set_conflict(
        &self,
        object: &DynamicObject,
        reason: Option<&str>,
    ) -> Result<(), Error> {
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
            .map(drop)
            .map_err(Error::Consumer)
    }

    /// LIM-26: create the provider namespace only when it does not exist.
    async fn ensure_provider_namespace(&self, namespace: &str) -> Result<(), kube::Error> {
        if self
            .known_namespaces
            .lock()
            .expect("not poisoned")
            .contains(namespace)
        {
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
        self.known_namespaces
            .lock()
            .expect("not poisoned")
            .insert(namespace.to_owned());
        Ok(())
    }
}

/// One object sync, with `kbind_work_queue_depth` counting syncs in progress.
async fn reconcile(object: Arc<DynamicObject>, worker: Arc<Worker>) -> Result<Action, Error> {
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
    let result = sync(object, worker.clone()).await;
    tracing::trace!(object = %name, ok = result.is_ok(), "sync end");
    gauge.set((worker.in_flight.fetch_sub(1, Ordering::SeqCst) - 1) as f64);
    result
}

async fn sync(object: Arc<DynamicObject>, worker: Arc<Worker>) -> Result<Action, Error> {
    // The fence: a replica whose membership is not current writes nothing.
    if !worker.ctx.membership.is_current() {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let spec = &worker.spec;
    let namespace = object.namespace();
    let resolution = worker
        .ctx
        .resolve(&spec.connection, &spec.api, namespace.as_deref());

    // SYNC-3: deletion, bound or not.
    if object.metadata.deletion_timestamp.is_some() {
        return delete(&object, &worker).await;
    }
    // SYNC-4
    let Some(resolution) = resolution.filter(|r| r.is_bound()) else {
        return Ok(Action::await_change());
    };
    // SYNC-14: cluster-scoped instances sync only under a ClusterBinding (the resolver ensures it).
    let object_uid = object.metadata.uid.clone().unwrap_or_default();
    let provider_copy = worker.provider_copy(&object);

    // OWN: decide before any write. QRK-18 decided: a conflicting object gets no finalizer, since
    // kbind will never write or delete its provider counterpart.
    if let Some(copy) = &provider_copy {
        let owner = ownership::classify(copy.annotations(), &spec.local_uid, &object_uid);
        if let Decision::Conflict(reason) = ownership::decide(owner, resolution.conflict_policy) {
            let changed = object
                .annotations()
                .get(keys::CONFLICT_ANNOTATION)
                .map(String::as_str)
                != Some(reason);
            worker.set_conflict(&object, Some(reason)).await?;
            if changed {
                let owner_text = if owner == Owner::Unmarked {
                    "exists without kbind's markers"
                } else {
                    "is owned by another consumer object or cluster"
                };
                worker
                    .warn(&object, reason, format!("the provider object {}{} {owner_text}; conflictPolicy {:?} leaves it alone", namespace.as_deref().map(|n| format!("{n}/")).unwrap_or_default(), object.name_any(), resolution.conflict_policy))
                    .await;
                worker.count("spec_up", "conflict");
            }
            worker.mark(&object, Some(SyncState::Conflict));
            return Ok(Action::await_change());
        }
        // QRK-13: wait for a terminating copy to be gone before recreating it.
        if copy.metadata.deletion_timestamp.is_some() {
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
    }

    // KEY-10: the finalizer before the first provider write.
    if let Some(finalizers) =
        kbind_shared::finalizers::toggled(&object.metadata, keys::SYNCER_FINALIZER, true)
    {
        worker.set_finalizers(&object, finalizers).await?;
        return Ok(Action::await_change());
    }
    // SYNC-7
    worker.set_conflict(&object, None).await?;

    // SYNC-8: spec up, only when the provider copy differs.
    let consumer_spec = object.data.get("spec");
    let current = provider_copy
        .as_ref()
        .and_then(|copy| serde_json::to_value(copy.as_ref()).ok())
        .is_some_and(|copy| {
            ownership::provider_is_current(&copy, consumer_spec, &spec.local_uid, &object_uid)
        });
    let mut provider_status = provider_copy
        .as_ref()
        .and_then(|c| c.data.get("status").cloned());
    if !current {
        let started = Instant::now();
        if let Some(ns) = namespace.as_deref()
            && let Err(e) = worker.ensure_provider_namespace(ns).await
        {
            return forbidden_or(&worker, &object, "create the provider namespace", e).await;
        }
        let mut body = ownership::spec_up_body(
            &spec.resource.api_version,
            &spec.resource.kind,
            namespace.as_deref(),
            &object.name_any(),
            consumer_spec,
            &spec.local_uid,
            &object_uid,
        );
        // OWN on fresh facts: with no copy in the cache, the first write only creates. Anything
        // that exists under the name (created in the instant the cache has not seen yet) answers
        // 409, and the next sync classifies it from the cache — it is never forced over.
        let creating = provider_copy.is_none();
        if creating {
            kbind_shared::apply::create_only(&mut body);
        }
        worker.fence()?;
        let applied = worker
            .provider_api(namespace.as_deref())
            .patch(
                &object.name_any(),
                &PatchParams::apply(keys::FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await;
        match applied {
            Ok(applied) => {
                worker.count("spec_up", "ok");
                worker
                    .ctx
                    .metrics
                    .sync_latency_seconds
                    .with_label_values(&["spec_up"])
                    .observe(started.elapsed().as_secs_f64());
                provider_status = applied.data.get("status").cloned();
            }
            Err(e) if creating && kbind_shared::apply::exists(&e) => {
                tracing::debug!(api = %spec.api, object = %object.name_any(), "a provider object appeared before the first spec-up; classifying it");
                return Ok(Action::requeue(Duration::from_millis(200)));
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => {
                // The provider namespace went away under us: forget it, create it next time.
                if let Some(ns) = namespace.as_deref() {
                    worker
                        .known_namespaces
                        .lock()
                        .expect("not poisoned")
                        .remove(ns);
                }
                return Err(Error::Provider(kube::Error::Api(s)));
            }
            Err(e) => {
                return forbidden_or(&worker, &object, "apply the spec to the provider", e).await;
            }
        }
    }

    // SYNC-9: status down, only when it differs.
    if let Some(status) = provider_status
        && object.data.get("status") != Some(&status)
    {
        status_down(&worker, &object, status).await?;
    }
    worker.mark(&object, Some(SyncState::Synced));
    Ok(Action::requeue(worker.ctx.resync_interval))
}

async fn status_down(
    worker: &Worker,
    object: &DynamicObject,
    status: serde_json::Value,
) -> Result<(), Error> {
    if !worker.spec.has_status_subresource {
        // QRK-12: one clear Warning, not an endless error loop.
        let first = !std::mem::replace(
            &mut *worker.warned_no_status.lock().expect("not poisoned"),
            true,
        );
        if first {
            worker
                .warn(object, "NoStatusSubresource", format!("the consumer CRD {} has no status subresource, so the provider's status cannot be copied back", worker.spec.api))
                .await;
        }
        return Ok(());
    }
    let current = object.data.get("status").cloned().unwrap_or(json!({}));
    let patch = json!({ "status": ownership::merge_patch(&current, &status) });
    worker.fence()?;
    match worker
        .consumer_api(object.namespace().as_deref())
        .patch_status(
            &object.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {
            worker.count("status_down", "ok");
            Ok(())
        }
        Err(e) => {
            worker.count("status_down", "error");
            Err(Error::Consumer(e))
        }
    }
}

/// SYNC-10: Forbidden gets a Warning Event and a 30 s retry; anything else is an error.
async fn forbidden_or(
    worker: &Worker,
    object: &DynamicObject,
    operation: &str,
    error: kube::Error,
) -> Result<Action, Error> {
    match error {
        kube::Error::Api(s) if s.is_forbidden() => {
            worker.count("spec_up", "forbidden");
            worker
                .warn(
                    object,
                    "Forbidden",
                    format!("cannot {operation}: {}", s.message),
                )
                .await;
            Ok(Action::requeue(Duration::from_secs(30)))
        }
        kube::Error::Api(s) if s.is_invalid() => {
            // The provider's admission said no: tell the user why, retry with backoff; other
            // objects are unaffected.
            worker.count("spec_up", "error");
            worker
                .warn(
                    object,
                    "ProviderRejected",
                    format!("the provider rejected the object: {}", s.message),
                )
                .await;
            Ok(Action::requeue(Duration::from_secs(30)))
        }
        e => {
            worker.count("spec_up", "error");
            Err(Error::Provider(e))
        }
    }
}

/// IDEL-1 … IDEL-3.
async fn delete(object: &DynamicObject, worker: &Worker) -> Result<Action, Error> {
    let Some(released) =
        kbind_shared::finalizers::toggled(&object.metadata, keys::SYNCER_FINALIZER, false)
    else {
        return Ok(Action::await_change());
    };
    let release = || worker.set_finalizers(object, released.clone());
    if object
        .annotations()
        .get(keys::DELETION_POLICY_ANNOTATION)
        .map(String::as_str)
        == Some(keys::DELETION_POLICY_ORPHAN)
    {
        release().await?;
        return Ok(Action::await_change());
    }
    // A fresh read: deletion must not act on a stale cache.
    let namespace = object.namespace();
    let api = worker.provider_api(namespace.as_deref());
    let copy = api
        .get_opt(&object.name_any())
        .await
        .map_err(Error::Provider)?;
    let object_uid = object.metadata.uid.clone().unwrap_or_default();
    match copy {
        Some(copy)
            if ownership::classify(copy.annotations(), &worker.spec.local_uid, &object_uid)
                == Owner::Ours =>
        {
            if copy.metadata.deletion_timestamp.is_none() {
                worker.fence()?;
                // Exactly the copy just classified as ours: its UID is the precondition.
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: copy.metadata.uid.clone(),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                match api.delete(&object.name_any(), &params).await {
                    Ok(_) => worker.count("delete", "ok"),
                    Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => {}
                    Err(e) => {
                        worker.count("delete", "error");
                        return Err(Error::Provider(e));
                    }
                }
            }
            Ok(Action::requeue(Duration::from_secs(2)))
        }
        _ => {
            release().await?;
            worker.mark(object, None);
            Ok(Action::await_change())
        }
    }
}
