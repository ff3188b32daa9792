//! One sync worker: all instances of one managed consumer CRD, synced with the provider of its
//! Connection (REFERENCE-BEHAVIOUR §17: SYNC, OWN, IDEL). The provider side is read from a
//! watch-fed cache; a write happens only when something differs.
//!
//! Its parts: [`state`] (the caches and the clients), [`tracked`] (one record per object of
//! everything else the worker keeps — changes waiting ([`pending`]), its own writes' echoes
//! ([`echoes`]), strangers under an object's name ([`strangers`]), where each object stands —
//! with the record's data in [`record`]), [`feeds`] (the two watches that fill the caches and
//! start syncs), [`sync`] (one object's sync: the facts, [`decide`], and the dispatch to its
//! step's executor in [`steps`]), [`writes`] (each write and what it leaves behind), [`report`]
//! (the backlog gauges and objects per unit), [`events`] (provider Events copied onto consumer
//! objects, for the bindings that ask), [`overdue`] (a change still undelivered after a second
//! says so), [`in_flight`] (the syncs in progress, each ended by a guard, and the stop that waits
//! for them), [`scope`] (where it reads when its API is not read cluster-wide, #54), [`import`]
//! (mirrors of provider objects nobody marked, for the bindings that import them, #54).
//!
//! The path of one consumer change: the consumer feed notes it in the object's record
//! (`consumer_changed`) and queues the object; the controller calls [`reconcile`], which waits
//! out an echo of kbind's own last write if the record says one is due, takes what waits from the
//! record and calls [`sync::sync`]; that gathers the facts from the caches (and a stranger's from
//! the record), [`decide`] names the step, and the step's executor writes — each write noting
//! what it leaves behind in the same record (`wrote`, `writing`/`wrote_provider`,
//! `spec_applied`, `status_written`) — and says where the object stands (`set_state`).

use kbind_shared::sync::Locked;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kbind_shared::cache::Instance;
use kube::ResourceExt;
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use tokio_util::sync::CancellationToken;

use crate::bindings::Reach;
use crate::context::Context;

mod backlog;
mod buckets;
mod decide;
mod echoes;
mod events;
#[cfg(test)]
mod fake;
mod feeds;
mod import;
mod in_flight;
mod overdue;
mod pending;
mod record;
mod report;
mod scope;
mod state;
mod status_delay;
mod steps;
mod strangers;
mod sync;
mod tracked;
mod writes;

pub use buckets::Buckets;
pub use state::{RouteSpec, WorkerSpec};
pub use writes::Error;

use state::Worker;

/// Runs the worker until `stop`.
pub async fn run(ctx: Arc<Context>, spec: WorkerSpec, stop: CancellationToken) {
    let Some(provider) = ctx
        .provider_client(&spec.kubeconfig, &spec.digest, &spec.connection, &spec.api)
        .await
    else {
        return;
    };
    let metrics = &ctx.metrics;
    kbind_shared::metrics::Metrics::init_counters(
        &metrics.reconcile_errors_total,
        "sync",
        &Error::REASONS,
    );
    kbind_shared::metrics::Metrics::init_counters(
        &metrics.provider_events_total,
        &spec.api,
        &events::RESULTS,
    );
    let (worker, writers) = Worker::new(ctx.clone(), spec, provider);
    let (overdue_tx, overdue_rx) = futures::channel::mpsc::unbounded();
    let (_feeds, consumer_changes, provider_triggers) = feeds::start(&worker, writers, overdue_tx);
    // Where to read, when not cluster-wide (#54): told before anything waits on the caches.
    let scope = scope::follow(&worker);
    // Decisions read the provider cache: nothing syncs before it has listed (waited for once
    // here; a Store's readiness wakes only the last of several concurrent waiters).
    tokio::select! {
        ready = worker.provider_objects.wait_until_ready() => {
            if ready.is_err() {
                tracing::warn!(api = %worker.spec.api, "the provider watch ended before it listed");
                return;
            }
        }
        _ = stop.cancelled() => return,
    }
    let graceful = stop.clone();
    let controller = Controller::for_stream_with(
        consumer_changes,
        worker.consumer_objects.clone(),
        worker.dyntype.clone(),
    )
    .with_config(kube::runtime::controller::Config::default().concurrency(ctx.workers))
    .reconcile_on(provider_triggers)
    .reconcile_on(rescans(&worker))
    .graceful_shutdown_on(async move { graceful.cancelled().await })
    .run(reconcile, error_policy, worker.clone())
    .for_each(|result| async move {
        if let Err(e) = result {
            tracing::debug!(error = %e, "sync");
        }
    });
    tokio::select! {
        _ = controller => {}
        _ = worker.drain(&stop) => {}
        _ = report::gauges(&worker) => {}
        _ = events::mirror(worker.clone()) => {}
        _ = overdue::run(worker.clone(), overdue_rx) => {}
        _ = scope => {}
        // (Import ends only with the worker.)
        _ = async { import::run(worker.clone()).await; std::future::pending::<()>().await } => {}
    }
    report::forget(&worker);
}

/// A binding change (which may bind or unbind the API for some objects) looks at the objects it
/// may concern — in the changed binding's namespace, or all for a ClusterBinding — and the
/// periodic backstop resync at every object; each syncs the ones with work to do. (A burst of
/// binding events is one look; a change of another API's bindings, or of a Binding past its
/// namespace's cap, none.)
fn rescans(
    worker: &Arc<Worker>,
) -> impl futures::Stream<Item = ObjectRef<Instance>> + Send + use<> {
    let worker = worker.clone();
    let api = worker.spec.api.clone();
    let bindings = worker
        .ctx
        .binding_changes()
        .ready_chunks(1024)
        .map(move |burst| Reach::of(&api, &burst));
    let ticks = resync_ticks(worker.ctx.resync_interval).map(|()| Reach::All);
    futures::stream::select(bindings, ticks).flat_map(move |reach| {
        let references: Vec<ObjectRef<Instance>> = worker
            .with_work(&reach)
            .iter()
            .map(|o| ObjectRef::from_obj_with(o.as_ref(), worker.dyntype.clone()))
            .collect();
        futures::stream::iter(references)
    })
}

/// One tick per `period`, the first after one period: the backstop resync of every object.
fn resync_ticks(period: Duration) -> impl futures::Stream<Item = ()> + Send + 'static {
    futures::stream::unfold((), move |()| async move {
        tokio::time::sleep(period).await;
        Some(((), ()))
    })
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
    let key = state::object_key(object.as_ref());
    let retry = worker
        .tracked
        .locked()
        .failed(&pending::key(object.as_ref()), &error.to_string());
    if retry.log {
        tracing::warn!(api = %worker.spec.api, object = %key, error = %kbind_shared::redact::remote(&error.to_string()), kind = error.metric_label(), retry_in = ?retry.after, "sync failed");
    } else {
        tracing::debug!(api = %worker.spec.api, object = %key, error = %kbind_shared::redact::remote(&error.to_string()), retry_in = ?retry.after, "sync failed again");
    }
    Action::requeue(retry.after)
}

/// One object sync, with `kbind_work_queue_depth` counting syncs in progress (added to and taken
/// from, so that the routes of one API running side by side add up, #36).
async fn reconcile(object: Arc<Instance>, worker: Arc<Worker>) -> Result<Action, Error> {
    let gauge = worker
        .ctx
        .metrics
        .work_queue_depth
        .with_label_values(&[worker.spec.api.as_str()]);
    // Ends the sync (and its count in the gauge) on every way out.
    let Some(_sync) = worker.in_flight.start(Some(gauge)) else {
        return Ok(Action::await_change());
    };
    let name = object.name_any();
    tracing::trace!(object = %name, "sync start");
    let waiting = pending::key(object.as_ref());
    if worker
        .tracked
        .locked()
        .behind(&waiting, object.metadata.resource_version.as_deref())
    {
        // The echo of kbind's own write syncs it again (`echoes`); its changes wait until then.
        tracing::trace!(object = %name, "the cache does not show kbind's last write yet");
        return Ok(Action::await_change());
    }
    let provider_wait = worker
        .tracked
        .locked()
        .provider_echo_wait(&waiting, std::time::Instant::now());
    if let Some(wait) = provider_wait {
        // The same on the provider side: the echo of kbind's spec-up syncs it again, or, if the
        // write changed nothing (no echo), the wait lapses.
        tracing::trace!(object = %name, "the provider cache does not show kbind's last write yet");
        return Ok(Action::requeue(wait));
    }
    let seen = worker.tracked.locked().take(&waiting);
    let result = sync::sync(object, worker.clone(), seen).await;
    if result.is_ok() {
        worker.tracked.locked().succeeded(&waiting);
    } else {
        worker.tracked.locked().give_back(&waiting, seen);
    }
    tracing::trace!(object = %name, ok = result.is_ok(), "sync end");
    result
}
