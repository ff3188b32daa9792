//! What a worker reports while it runs, and takes back when it stops: the backlog gauges (#33.4),
//! refreshed every second (the oldest entry ages between events), and every few seconds the
//! objects per unit for the membership Lease (the leader places units by them).

use kbind_shared::sync::Locked;
use std::time::Duration;

use kbind_shared::cache::Instance;
use kbind_shared::keys;
use kube::ResourceExt;

use super::backlog;
use super::pending;
use super::state::Worker;

/// Objects per unit are counted every this many ticks (seconds).
const OBJECT_COUNT_TICKS: u64 = 5;

/// Refreshes the worker's gauges every second, for as long as it runs.
pub(super) async fn gauges(worker: &Worker) {
    let ctx = &worker.ctx;
    let labels = [worker.spec.connection.as_str(), worker.spec.api.as_str()];
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut ticks: u64 = 0;
    loop {
        tick.tick().await;
        if ticks.is_multiple_of(OBJECT_COUNT_TICKS) && worker.listed.locked().consumer {
            let objects = worker.consumer_objects.state();
            ctx.membership
                .set_objects(worker.spec.buckets.objects_per_unit(
                    &worker.spec.connection,
                    &worker.spec.api,
                    objects.iter().map(|o| o.metadata.namespace.as_deref()),
                ));
        }
        ticks += 1;
        let record_wait = {
            let mut tracked = worker.tracked.locked();
            tracked.compact(std::time::Instant::now());
            tracked.record_wait()
        };
        ctx.metrics
            .delivery_record_wait_seconds
            .with_label_values(&labels)
            .set(record_wait.as_secs_f64());
        let tally = worker.backlog();
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
}

/// The worker stopped: its objects per unit and its gauges go (a unit that moves is reported by
/// its next runner).
pub(super) fn forget(worker: &Worker) {
    let ctx = &worker.ctx;
    let (connection, api) = (worker.spec.connection.as_str(), worker.spec.api.as_str());
    let units = worker
        .spec
        .buckets
        .objects_per_unit(connection, api, std::iter::empty());
    ctx.membership.forget_objects(units.keys());
    ctx.set_object_counts(api, connection, None);
    // A routed API's other routes may still count syncs in this gauge (this one's are drained).
    if worker.routing().is_none() {
        let _ = ctx.metrics.work_queue_depth.remove_label_values(&[api]);
    }
    for gauge in [
        &ctx.metrics.sync_backlog_oldest_seconds,
        &ctx.metrics.delivery_record_wait_seconds,
    ] {
        let _ = gauge.remove_label_values(&[connection, api]);
    }
    for state in backlog::Waiting::ALL {
        let _ = ctx
            .metrics
            .sync_backlog
            .remove_label_values(&[connection, api, state.label()]);
    }
}

impl Worker {
    /// The backlog (#33.4): what the objects of `consumer` say of themselves
    /// ([`backlog::waiting`]), and what only the worker's memory knows — changes seen that the
    /// objects do not show as waiting (a provider status not copied down yet, a CRD without the
    /// delivery record).
    pub(super) fn backlog(&self) -> backlog::Tally {
        let wall = jiff::Timestamp::now();
        let now = std::time::Instant::now();
        let consumer = &self.consumer_objects;
        let objects = consumer.state();
        // Whether a binding binds the API, asked once per namespace.
        let mut bound = Default::default();
        let mut tally = backlog::Tally::default();
        // Asked once per pass, not per object.
        let routed = self.routing().is_some();
        for object in &objects {
            if let Some((state, age)) = self.waits(object, &mut bound, routed, wall) {
                tally.add(state, age);
            }
        }
        // (Copied out: the lock is not held while the objects are looked at.)
        let waiting: Vec<(pending::Key, pending::Seen)> = self.tracked.locked().waiting().collect();
        for (key, seen) in waiting {
            if let Some(object) = consumer.get(&self.reference(key.0.as_deref(), &key.1))
                && self
                    .waits(&object, &mut Default::default(), routed, wall)
                    .is_some()
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
        routed: bool,
        wall: jiff::Timestamp,
    ) -> Option<(backlog::Waiting, Duration)> {
        let namespace = object.metadata.namespace.as_deref();
        let bound = *bound
            .entry(namespace)
            .or_insert_with(|| self.binds_in(namespace));
        backlog::waiting(&self.backlog_facts(object, bound, routed))
            .map(|(state, since)| (state, backlog::age(since, wall)))
    }

    /// Whether a binding binds the API in `namespace` for this worker's Connection.
    pub(super) fn binds_in(&self, namespace: Option<&str>) -> bool {
        self.ctx
            .resolve(&self.spec.connection, &self.spec.api, namespace)
            .is_some_and(|r| r.is_bound())
    }

    /// What `object` says about itself for the backlog; `bound`: a binding binds its API in its
    /// namespace ([`Self::binds_in`]); `routed`: the API is routed ([`Worker::routing`], asked
    /// once by the caller for many objects).
    pub(super) fn backlog_facts<'a>(
        &self,
        object: &'a Instance,
        bound: bool,
        routed: bool,
    ) -> backlog::Facts<'a> {
        // A mirror of an imported object (#54) waits on nobody: nothing of it is delivered.
        let bound = bound
            && !matches!(
                super::import::standing_of(self, object),
                kbind_shared::import::Standing::Observed
                    | kbind_shared::import::Standing::Elsewhere
            )
            && (!routed
                // A routed API's object waits on its own route only (#36).
                || matches!(
                    super::sync::gate_of(self, object),
                    Some(
                        kbind_shared::routing::Gate::Sync { .. }
                            | kbind_shared::routing::Gate::Pin(_)
                    )
                ));
        backlog::Facts {
            generation: object.metadata.generation,
            deletion: object
                .metadata
                .deletion_timestamp
                .as_ref()
                .and_then(kbind_shared::delivery::Seconds::of),
            has_finalizer: kbind_shared::finalizers::has(&object.metadata, &self.spec.finalizer()),
            bound,
            conflict: object.annotations().contains_key(keys::CONFLICT_ANNOTATION),
            has_delivery: self.spec.has_delivery,
            record: object.delivery.as_ref(),
            changed_at: object.changed_at,
        }
    }
}
