//! The status down (SYNC-9): the provider's status with kbind's delivery record, copied only
//! when it differs, paced per object, and a record alone waiting a while for the provider's
//! status change to carry it.

use kbind_shared::sync::Locked;

use kbind_shared::cache::{Instance, Json, ProviderCopy};
use kbind_shared::delivery;
use kbind_shared::ownership::{self};
use kube::runtime::controller::Action;
use serde_json::json;

use super::super::pending::{self, Seen};
use super::super::record::SyncState;
use super::super::state::{Worker, WorkerSpec};
use super::super::writes::{Error, result_label};

/// What the provider has of the object after a sync's spec step: its status (within the size
/// limit), the size of one too large to copy, and when kbind last wrote its spec.
#[derive(Debug)]
pub(in crate::worker) struct Delivered {
    pub(in crate::worker) provider_status: Option<serde_json::Value>,
    pub(in crate::worker) oversized: Option<usize>,
    pub(in crate::worker) at: Option<String>,
}

impl Delivered {
    /// As the provider cache shows the copy (no spec write this sync).
    pub(in crate::worker) fn as_cached(object: &Instance, copy: Option<&ProviderCopy>) -> Self {
        Delivered {
            provider_status: provider_side_status(copy, object),
            oversized: copy.and_then(|c| c.oversized_status),
            at: copy.and_then(ProviderCopy::applied_at),
        }
    }
}

/// SYNC-9: the status down, only when it differs — with kbind's delivery record, which says the
/// current generation reached the provider; paced per object, and a record alone waits a while
/// for the provider's status change to carry it.
pub(in crate::worker) async fn copy_status(
    worker: &Worker,
    object: &Instance,
    provider_copy: Option<&ProviderCopy>,
    delivered: Delivered,
    seen: Seen,
) -> Result<Action, Error> {
    let current = object.status.as_ref().map(Json::value);
    let current = current.as_ref();
    let desired = desired_status(
        &worker.spec,
        object,
        delivered.provider_status,
        delivered.at,
    );
    let Some(status) = desired.filter(|status| current != Some(status)) else {
        worker.mark(object, Some(SyncState::Synced));
        // The backstop resync is one periodic pass over the whole cache (`resync_ticks` in the
        // worker), not a timer per object: at rest a synced object costs no scheduler entry.
        return Ok(Action::await_change());
    };
    let key = pending::key(object);
    let now = std::time::Instant::now();
    // A provider rewriting a status faster than --status-min-interval is copied at that pace;
    // the next sync copies whatever is latest then.
    let paced = worker.tracked.locked().status_write_wait(&key, now);
    if let Some(wait) = paced {
        worker.tracked.locked().give_back(&key, seen);
        return Ok(Action::requeue(wait));
    }
    if !delivery::differs_beyond_record(current, Some(&status)) {
        // A Pending record (a late change's, or a failure's that a retry overcame) is corrected
        // at once: it would go on saying the spec has not arrived. Any other waits to be carried
        // (a Paused record after a resume: one write, as always).
        let says_pending = object
            .delivery
            .as_ref()
            .is_some_and(|r| r.state == delivery::State::Pending);
        let wait = (!says_pending)
            .then(|| worker.tracked.locked().record_wait_left(&key, now))
            .flatten();
        if let Some(wait) = wait {
            // Only the record is new: the status change the provider makes for this spec will
            // carry it, in the one consumer write a change costs. If none comes soon (how soon
            // is learned from the provider's recent answers), the record is written on its own.
            worker.mark(object, Some(SyncState::Synced));
            return Ok(Action::requeue(wait));
        }
        status_down(worker, object, status, "record").await?;
    } else {
        status_down(worker, object, status, "status_down").await?;
        worker
            .tracked
            .locked()
            .status_carried(&key, seen.provider_latest.unwrap_or(now));
        // A provider change (or one learned of late: a restart, a resync) is timed from the
        // provider's API server's record of its status write too; a consumer-side trigger (a
        // status someone else edited, restored) from its receipt.
        let provider_side = seen.provider.is_some() || seen.first().is_none();
        worker.lag(
            "status_down",
            seen.provider.or(seen.consumer),
            provider_copy
                .and_then(|c| c.status_at)
                .filter(|_| provider_side),
        );
    }
    worker.mark(object, Some(SyncState::Synced));
    Ok(Action::await_change())
}

/// The status a sync leaves on `object` (SYNC-9): the provider's `provider_status` with, where
/// the CRD has one, kbind's delivery record of the spec kbind applied at `delivered_at`.
/// `None`: the provider has none and the CRD has no record to keep.
pub(in crate::worker) fn desired_status(
    spec: &WorkerSpec,
    object: &Instance,
    provider_status: Option<serde_json::Value>,
    delivered_at: Option<String>,
) -> Option<serde_json::Value> {
    if spec.has_delivery {
        let record = delivery::delivered(object.metadata.generation, delivered_at);
        Some(delivery::with_record(provider_status.as_ref(), &record))
    } else {
        provider_status
    }
}

/// The provider's status as a sync copies it down: the copy's — or, when the provider's is larger
/// than `--max-status-bytes` (the cache then holds only its size), what the consumer object holds
/// already: an oversized status is never copied, and nothing of the last good one is lost.
pub(in crate::worker) fn provider_side_status(
    copy: Option<&ProviderCopy>,
    object: &Instance,
) -> Option<serde_json::Value> {
    let copy = copy?;
    if copy.oversized_status.is_some() {
        return object.status.as_ref().map(Json::value);
    }
    copy.status.as_ref().map(Json::value)
}

/// `status` if its compact JSON is at most `max_bytes`, else its size.
pub(in crate::worker) fn bounded(
    status: Option<&serde_json::Value>,
    max_bytes: usize,
) -> Result<Option<serde_json::Value>, usize> {
    let Some(status) = status else {
        return Ok(None);
    };
    match serde_json::to_vec(status).map(|v| v.len()) {
        Ok(size) if size > max_bytes => Err(size),
        _ => Ok(Some(status.clone())),
    }
}

/// Writes `status` (the provider's, and kbind's record) to the consumer object, counted as `op`:
/// `status_down`, or `record` when only kbind's delivery record changes.
pub(in crate::worker) async fn status_down(
    worker: &Worker,
    object: &Instance,
    status: serde_json::Value,
    op: &str,
) -> Result<(), Error> {
    if !worker.spec.has_status_subresource {
        // QRK-12: one clear Warning, not an endless error loop.
        let first = !std::mem::replace(&mut *worker.warned_no_status.locked(), true);
        if first {
            worker
                .warn(object, "NoStatusSubresource", format!("the consumer CRD {} has no status subresource, so the provider's status cannot be copied back", worker.spec.api))
                .await;
        }
        return Ok(());
    }
    let current = object.status.as_ref().map(Json::value).unwrap_or(json!({}));
    let mut status_patch = ownership::merge_patch(&current, &status);
    delivery::set_record_whole(&mut status_patch, delivery::record_of(Some(&status)));
    let patch = json!({ "status": status_patch });
    worker.fence()?;
    match worker.patch_status(object, &patch).await {
        Ok(written) => {
            worker.count(op, "ok");
            worker.wrote(object, &written);
            worker
                .tracked
                .locked()
                .status_written(&pending::key(object), std::time::Instant::now());
            Ok(())
        }
        Err(e) => {
            worker.count(op, result_label(&e));
            Err(Error::Consumer(e))
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_status_over_the_limit_is_refused_by_its_size() {
        let status = serde_json::json!({ "phase": "Ready" }); // 17 bytes
        assert_eq!(super::bounded(Some(&status), 17), Ok(Some(status.clone())));
        assert_eq!(super::bounded(Some(&status), 16), Err(17));
        assert_eq!(super::bounded(None, 0), Ok(None));
    }

    #[tokio::test]
    async fn without_a_status_subresource_nothing_is_written_and_one_warning_said() {
        let (consumer, on_consumer) = fake::server(|_, _| None);
        let (provider, _) = fake::server(|_, _| None);
        let (worker, _) = fake::worker_with(consumer, provider, |spec| {
            spec.has_status_subresource = false;
        })
        .await;
        let object = fake::bound_widget();
        for _ in 0..3 {
            super::status_down(&worker, &object, json!({ "phase": "Ready" }), "status_down")
                .await
                .unwrap();
            // Said at the first, and never again.
            let calls = fake::calls(&on_consumer);
            assert!(calls.iter().all(|c| c.method != "PATCH"), "{calls:?}");
            let warnings: Vec<_> = calls
                .iter()
                .filter(|c| c.path.contains("/events"))
                .map(|c| c.body["reason"].clone())
                .collect();
            assert_eq!(warnings, [json!("NoStatusSubresource")], "once: {calls:?}");
        }
    }

    use super::super::super::fake;
    use super::super::super::pending::{self, Seen};
    use super::Delivered;
    use kbind_shared::cache::ProviderCopy;
    use kbind_shared::keys;
    use kbind_shared::sync::Locked;
    use kube::runtime::controller::Action;
    use serde_json::{Value, json};
    use std::time::Instant;

    fn provider_copy(status: Value) -> ProviderCopy {
        let copy = fake::widget(
            json!({ "annotations": { keys::CONSUMER_CLUSTER_UID_ANNOTATION: "consumer-uid",
                keys::CONSUMER_OBJECT_UID_ANNOTATION: "w-uid" } }),
            status,
        );
        ProviderCopy::of(copy, "consumer-uid")
    }

    /// `object`'s spec was just applied, and its copy's status is `phase: Ready`: the copy.
    fn applied_just_now(
        worker: &super::super::super::state::Worker,
        object: &kbind_shared::cache::Instance,
    ) -> ProviderCopy {
        worker
            .tracked
            .locked()
            .spec_applied(&pending::key(object), Instant::now());
        provider_copy(json!({ "phase": "Ready" }))
    }

    /// A consumer that takes patches of `team-a/w`'s status, and what it was sent.
    fn status_patches() -> (kube::Client, fake::Requests) {
        let status = fake::widget_path("team-a", "w", "/status");
        fake::server(move |method, path| {
            (method == "PATCH" && path == status)
                .then(|| (200, json!({ "metadata": { "resourceVersion": "11" } })))
        })
    }

    #[tokio::test]
    async fn the_providers_status_comes_down_with_the_record_in_one_write() {
        let (consumer, on_consumer) = status_patches();
        let (provider, on_provider) = fake::server(|_, _| None);
        let worker = fake::worker(consumer, provider).await;
        let object = fake::bound_widget();
        let copy = provider_copy(json!({ "phase": "Ready" }));
        let delivered = Delivered::as_cached(&object, Some(&copy));
        let now = Instant::now();
        let seen = Seen {
            consumer: None,
            provider: Some(now),
            provider_latest: Some(now),
        };

        let action = super::copy_status(&worker, &object, Some(&copy), delivered, seen)
            .await
            .unwrap();
        assert_eq!(action, Action::await_change());
        let calls = fake::calls(&on_consumer);
        assert_eq!(calls.len(), 1, "{calls:?}");
        let written = &calls[0].body["status"];
        assert_eq!(written["phase"], "Ready");
        assert_eq!(written["kbindSync"]["state"], "Synced", "{written}");
        assert_eq!(written["kbindSync"]["generation"], 2);
        assert!(fake::calls(&on_provider).is_empty());
        let key = pending::key(&object);
        assert_eq!(worker.tracked.locked().counts().synced, 1);
        assert!(worker.tracked.locked().behind(&key, Some("10")));
    }

    #[tokio::test]
    async fn a_pending_record_is_corrected_at_once_not_left_to_wait() {
        // The record says Pending (a late change's, or a failure a retry overcame): it would go
        // on saying the spec has not arrived, so it is written now, on its own.
        let (consumer, on_consumer) = status_patches();
        let (provider, _) = fake::server(|_, _| None);
        let worker = fake::worker(consumer, provider).await;
        let object = fake::widget(
            json!({ "finalizers": [keys::SYNCER_FINALIZER] }),
            json!({ "phase": "Ready",
                kbind_shared::delivery::FIELD: { "state": "Pending", "generation": 1,
                    "message": "the provider did not answer" } }),
        );
        assert_eq!(
            object.delivery.as_ref().map(|r| r.state),
            Some(kbind_shared::delivery::State::Pending),
            "the fixture's record reads as Pending"
        );
        let copy = applied_just_now(&worker, &object);
        let delivered = Delivered::as_cached(&object, Some(&copy));

        super::copy_status(&worker, &object, Some(&copy), delivered, Seen::default())
            .await
            .unwrap();
        let written = fake::calls(&on_consumer);
        assert_eq!(written.len(), 1, "written at once: {written:?}");
        assert_eq!(
            written[0].body["status"][kbind_shared::delivery::FIELD]["state"],
            "Synced",
            "{:?}",
            written[0].body
        );
    }

    #[tokio::test]
    async fn a_record_alone_waits_for_the_providers_status_change_to_carry_it() {
        let (consumer, on_consumer) = fake::server(|_, _| None);
        let (provider, _) = fake::server(|_, _| None);
        let worker = fake::worker(consumer, provider).await;
        let object = fake::widget(
            json!({ "finalizers": [keys::SYNCER_FINALIZER] }),
            json!({ "phase": "Ready" }),
        );
        // The spec was just applied: its status change is expected to carry the record.
        let copy = applied_just_now(&worker, &object);
        let delivered = Delivered::as_cached(&object, Some(&copy));

        let action = super::copy_status(&worker, &object, Some(&copy), delivered, Seen::default())
            .await
            .unwrap();
        assert_ne!(
            action,
            Action::await_change(),
            "looked at again after the wait"
        );
        assert!(fake::calls(&on_consumer).is_empty(), "nothing written yet");
        assert_eq!(worker.tracked.locked().counts().synced, 1);
    }

    #[tokio::test]
    async fn a_provider_status_change_is_timed_from_its_write_and_a_consumer_trigger_from_its_receipt()
     {
        let minute_ago = (jiff::Timestamp::now() - jiff::SignedDuration::from_secs(60)).to_string();
        // The provider's API server recorded its status write a minute ago.
        let copy = ProviderCopy::of(
            fake::widget(
                json!({ "annotations": { keys::CONSUMER_CLUSTER_UID_ANNOTATION: "consumer-uid",
                        keys::CONSUMER_OBJECT_UID_ANNOTATION: "w-uid" },
                    "managedFields": [{ "manager": "provider", "operation": "Update",
                        "subresource": "status", "time": minute_ago, "fieldsType": "FieldsV1",
                        "fieldsV1": { "f:status": {} } }] }),
                json!({ "phase": "Ready" }),
            ),
            "consumer-uid",
        );
        assert!(copy.status_at.is_some(), "the fixture's status time reads");
        let now = Instant::now();
        for (seen, from_the_write) in [
            // Its watch event: the provider changed it.
            (
                Seen {
                    consumer: None,
                    provider: Some(now),
                    provider_latest: Some(now),
                },
                true,
            ),
            // Learned of late (a restart, a resync): nothing was received.
            (Seen::default(), true),
            // Someone edited the consumer's status; it is restored.
            (
                Seen {
                    consumer: Some(now),
                    provider: None,
                    provider_latest: None,
                },
                false,
            ),
        ] {
            let (consumer, _) = status_patches();
            let (provider, _) = fake::server(|_, _| None);
            let worker = fake::worker(consumer, provider).await;
            let object = fake::bound_widget();
            let delivered = Delivered::as_cached(&object, Some(&copy));
            super::copy_status(&worker, &object, Some(&copy), delivered, seen)
                .await
                .unwrap();
            let lag = worker
                .ctx
                .metrics
                .sync_lag_seconds
                .with_label_values(&["c", "widgets.example.org", "status_down"])
                .get_sample_sum();
            assert_eq!(
                (58.0..120.0).contains(&lag),
                from_the_write,
                "{seen:?}: {lag}"
            );
        }
    }
}
