//! #50.4: the `Delivery` column never says `Synced` for a generation the provider does not have
//! for longer than [`delivery::PENDING_AFTER`] plus one write. A consumer change that leaves the
//! object's record saying `Synced` for an older generation is looked at again that long after it
//! was seen; if it is still undelivered then — queued behind others, or written to a provider that
//! has not answered (one that hangs, or cannot be reached) — its record says `Pending`, in one
//! write. A change delivered sooner costs nothing here: the sync's own status write carries its
//! `Synced` record.
//!
//! The write races nothing it could undo: it is guarded by the resourceVersion the cache showed
//! (a record written meanwhile wins), a sync waits for its echo like for any write of kbind's,
//! and a sync's record replaces the whole record ([`delivery::set_record_whole`]).

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use kbind_shared::cache::Instance;
use kbind_shared::delivery::{self, State, Summary};
use kbind_shared::sync::Locked;
use kube::ResourceExt;
use serde_json::json;

use super::pending::{self, Key};
use super::state::Worker;
use super::writes::result_label;

/// Records written at once per worker (a burst of late changes is written this many at a time).
const CONCURRENT_WRITES: usize = 8;

/// A change to look at again once it has waited [`delivery::PENDING_AFTER`].
#[derive(Debug)]
pub(super) struct Due {
    key: Key,
    generation: Option<i64>,
    seen: Instant,
}

/// Where the consumer feed sends the changes that may need it.
pub(super) type Sender = UnboundedSender<Due>;
/// What [`run`] reads.
pub(super) type Receiver = UnboundedReceiver<Due>;

/// The changes worth a second look: the record says [`State::Synced`] for another generation
/// than the object's (a cheap test on the cached summary; [`run`] decides with all the facts).
pub(super) fn note(worker: &Worker, object: &Instance, now: Instant, due: &Sender) {
    if !worker.spec.has_delivery || !worker.spec.has_status_subresource {
        return;
    }
    if !worth_a_look(object.delivery.as_ref(), object.metadata.generation) {
        return;
    }
    let _ = due.unbounded_send(Due {
        key: pending::key(object),
        generation: object.metadata.generation,
        seen: now,
    });
}

/// Whether a change to `generation` leaves a `record` that says Synced for another generation.
fn worth_a_look(record: Option<&Summary>, generation: Option<i64>) -> bool {
    record.is_some_and(|r| {
        r.state == State::Synced && r.generation.map(std::num::NonZeroI64::get) != generation
    })
}

/// When a change seen at `seen` is looked at again.
fn look_again_at(seen: Instant) -> Instant {
    seen + delivery::PENDING_AFTER
}

/// Whether a change to `noted` (a generation) is still undelivered when looked at again: the
/// object is still at that generation (a newer change was noted on its own), no spec write
/// delivered it since it was seen (`delivered`; its record follows with the provider's status),
/// and its record still says Synced for an older generation (`says_synced`,
/// [`super::backlog::says_synced_while_waiting`]).
fn still_due(noted: Option<i64>, now: Option<i64>, delivered: bool, says_synced: bool) -> bool {
    noted == now && !delivered && says_synced
}

/// The status merge patch of a `Pending` record for an object whose `status` and
/// `resource_version` the cache shows and whose spec changed at `changed_at`: guarded by that
/// resourceVersion (a record written meanwhile wins), the last delivery kept, the record whole.
fn pending_patch(
    resource_version: Option<&str>,
    status: Option<&serde_json::Value>,
    changed_at: Option<delivery::Seconds>,
) -> serde_json::Value {
    let since = changed_at.map(delivery::Seconds::time);
    let mut record = delivery::awaiting(delivery::record_of(status), since.as_ref());
    if let Some(record) = record.as_object_mut() {
        record.retain(|_, v| !v.is_null());
    }
    let mut status_patch = json!({ delivery::FIELD: record });
    delivery::set_record_whole(&mut status_patch, Some(&record));
    json!({
        "metadata": { "resourceVersion": resource_version },
        "status": status_patch,
    })
}

/// Whether the API server's refusal of the `Pending` record means someone else's write stands:
/// the object changed since the cache showed it (409), or is gone (404).
fn superseded(status: &kube::core::Status) -> bool {
    status.is_conflict() || status.is_not_found()
}

/// Looks at each noted change once it has waited [`delivery::PENDING_AFTER`] (they arrive in the
/// order they were seen, so each waits at most that long after the one before), and records the
/// ones still undelivered as `Pending`. Runs as long as the worker.
pub(super) async fn run(worker: Arc<Worker>, due: Receiver) {
    due.then(|due| {
        let worker = worker.clone();
        async move {
            tokio::time::sleep_until(look_again_at(due.seen).into()).await;
            (worker, due)
        }
    })
    .for_each_concurrent(CONCURRENT_WRITES, |(worker, due)| async move {
        if let Some(object) = still_undelivered(&worker, &due) {
            record(&worker, &object).await;
        }
    })
    .await;
    // The consumer feed ended (the worker is stopping): the worker's end is decided elsewhere.
    std::future::pending::<()>().await;
}

/// The cached object, if the change `due` noted is still undelivered and its record still says
/// `Synced`.
fn still_undelivered(worker: &Worker, due: &Due) -> Option<Arc<Instance>> {
    let object = worker
        .consumer_objects
        .get(&worker.reference(due.key.0.as_deref(), &due.key.1))?;
    let delivered = worker.tracked.locked().applied_since(&due.key, due.seen);
    let bound = worker.binds_in(object.metadata.namespace.as_deref());
    let says_synced = super::backlog::says_synced_while_waiting(&worker.backlog_facts(
        &object,
        bound,
        worker.routing().is_some(),
    ));
    still_due(
        due.generation,
        object.metadata.generation,
        delivered,
        says_synced,
    )
    .then_some(object)
}

/// Writes the `Pending` record, guarded by the resourceVersion the cache shows.
async fn record(worker: &Worker, object: &Instance) {
    if worker.fence().is_err() {
        return;
    }
    let status = object.status.as_ref().map(|s| s.value());
    let patch = pending_patch(
        object.metadata.resource_version.as_deref(),
        status.as_ref(),
        object.changed_at,
    );
    match worker.patch_status(object, &patch).await {
        Ok(written) => {
            worker.count("record", "ok");
            worker.wrote(object, &written);
        }
        // Someone wrote it meanwhile (a sync's record, most likely): theirs stands.
        Err(kube::Error::Api(s)) if superseded(&s) => {}
        Err(e) => {
            worker.count("record", result_label(&e));
            tracing::debug!(api = %worker.spec.api, object = %object.name_any(), error = %e, "cannot record an undelivered change");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_noted_change_is_looked_at_again_after_the_bound_and_only_if_still_due() {
        let seen = Instant::now();
        assert_eq!(look_again_at(seen) - seen, delivery::PENDING_AFTER);
        // (case, noted, now, delivered, says Synced) → due
        let cases = [
            (
                "undelivered, record says Synced",
                Some(2),
                Some(2),
                false,
                true,
                true,
            ),
            (
                "a newer change: noted on its own",
                Some(2),
                Some(3),
                false,
                true,
                false,
            ),
            (
                "delivered since it was seen",
                Some(2),
                Some(2),
                true,
                true,
                false,
            ),
            (
                "the record says something else",
                Some(2),
                Some(2),
                false,
                false,
                false,
            ),
        ];
        for (case, noted, now, delivered, says_synced, want) in cases {
            assert_eq!(
                still_due(noted, now, delivered, says_synced),
                want,
                "{case}"
            );
        }
    }

    #[test]
    fn the_pending_record_is_guarded_by_the_version_the_cache_showed_and_set_whole() {
        let status = json!({
            "phase": "Ready",
            delivery::FIELD: { "state": delivery::SYNCED, "generation": 1, "time": "2026-12-06T00:00:01Z" },
        });
        let changed = delivery::Seconds::of(&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-12-06T00:00:05Z".parse().unwrap(),
        ));
        let patch = pending_patch(Some("42"), Some(&status), changed);
        assert_eq!(patch["metadata"], json!({ "resourceVersion": "42" }));
        let record = &patch["status"][delivery::FIELD];
        assert_eq!(record["state"], delivery::PENDING);
        assert_eq!(record["generation"], 1, "the last delivery is kept");
        assert_eq!(record["time"], "2026-12-06T00:00:01Z");
        assert_eq!(record["since"], "2026-12-06T00:00:05Z");
        assert!(
            record["message"]
                .as_str()
                .is_some_and(|m| m.contains("not delivered yet"))
        );
        assert!(
            patch["status"].get("phase").is_none(),
            "only the record is written"
        );
        // Never delivered before: no generation or time to keep, and nulls say so.
        let first = pending_patch(Some("7"), None, None);
        let record = &first["status"][delivery::FIELD];
        assert_eq!(
            (&record["generation"], &record["time"], &record["since"]),
            (&json!(null), &json!(null), &json!(null))
        );
    }

    #[test]
    fn only_a_write_that_beat_it_or_a_gone_object_supersedes_the_record() {
        let status = |code: u16, reason: &str| kube::core::Status {
            code,
            reason: reason.to_owned(),
            ..Default::default()
        };
        assert!(superseded(&status(409, "Conflict")));
        assert!(superseded(&status(404, "NotFound")));
        assert!(!superseded(&status(500, "InternalError")));
        assert!(!superseded(&status(403, "Forbidden")));
    }

    #[test]
    fn only_a_change_behind_a_synced_record_is_looked_at_again() {
        let record = |state, generation| Summary {
            state,
            generation: std::num::NonZeroI64::new(generation),
            since: None,
        };
        let cases = [
            (
                "Synced 1, now 2",
                Some(record(State::Synced, 1)),
                Some(2),
                true,
            ),
            (
                "Synced 2, still 2 (a label)",
                Some(record(State::Synced, 2)),
                Some(2),
                false,
            ),
            ("no record yet: the column is empty", None, Some(1), false),
            (
                "Pending already",
                Some(record(State::Pending, 1)),
                Some(2),
                false,
            ),
            ("Rejected", Some(record(State::Rejected, 1)), Some(2), false),
            ("Paused", Some(record(State::Paused, 1)), Some(2), false),
        ];
        for (case, record, generation, want) in cases {
            assert_eq!(worth_a_look(record.as_ref(), generation), want, "{case}");
        }
    }
}
