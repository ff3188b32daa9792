//! The steps that say where an object stands and write nothing to the provider: unbound (the
//! marks go), held by routing, in conflict, paused, waiting for a terminating copy — and the
//! delivery record of a refusal.

use kbind_shared::sync::Locked;
use std::time::Duration;

use kbind_shared::cache::{Instance, Json};
use kbind_shared::delivery;
use kbind_shared::keys;
use kbind_shared::ownership::Owner;
use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::super::pending::{self};
use super::super::record::SyncState;
use super::super::state::Worker;
use super::super::writes::Error;
use super::status_down::status_down;

/// `Step::Unmark`: no binding binds the object any more; kbind's conflict annotation goes, and
/// with it routing's record: `Delivery` must not go on saying why kbind holds it.
pub(in crate::worker) async fn unmark(worker: &Worker, object: &Instance) -> Result<Action, Error> {
    if object.annotations().contains_key(keys::CONFLICT_ANNOTATION) {
        worker.set_conflict(object, None).await?;
    }
    if let Some(status) = without_hold_record(object.status.as_ref().map(Json::value)) {
        status_down(worker, object, status, "record").await?;
    }
    worker.mark(object, None);
    Ok(Action::await_change())
}

/// `Step::Held` (#36): written to no provider; the annotation and the record say why, and a
/// Warning Event when it is new.
pub(in crate::worker) async fn held(
    worker: &Worker,
    object: &Instance,
    reason: &str,
    message: &str,
    announce: bool,
) -> Result<Action, Error> {
    worker.set_conflict(object, Some(reason)).await?;
    record_refusal(worker, object, reason, message).await?;
    if announce {
        worker
            .warn(object, reason, format!("written to no provider: {message}"))
            .await;
        worker.count("route", reason);
    }
    worker.mark(object, Some(SyncState::Conflict));
    Ok(Action::await_change())
}

/// `Step::Conflict` (OWN): the provider object is not this consumer object's; `policy` leaves
/// it alone. The annotation says so, and a Warning Event when it is new.
pub(in crate::worker) async fn conflict(
    worker: &Worker,
    object: &Instance,
    policy: kbind_shared::api::ConflictPolicy,
    reason: &str,
    owner: Owner,
    announce: bool,
) -> Result<Action, Error> {
    worker.set_conflict(object, Some(reason)).await?;
    if announce {
        let owner_text = if owner == Owner::Unmarked {
            "exists without kbind's markers"
        } else {
            "is owned by another consumer object or cluster"
        };
        let namespace = object
            .namespace()
            .map(|n| format!("{n}/"))
            .unwrap_or_default();
        worker
            .warn(object, reason, format!("the provider object {namespace}{} {owner_text}; conflictPolicy {policy:?} leaves it alone", object.name_any()))
            .await;
        worker.count("spec_up", "conflict");
    }
    worker.mark(object, Some(SyncState::Conflict));
    // A stranger's conflict is looked at again when its read goes stale: no watch event tells
    // when it goes ([`super::strangers`]).
    let recheck = worker
        .tracked
        .locked()
        .stranger_recheck_in(&pending::key(object), std::time::Instant::now());
    Ok(recheck.map_or_else(Action::await_change, Action::requeue))
}

/// `Step::Paused`: the one write a pause costs is the record saying so (none once it does).
pub(in crate::worker) async fn paused(
    worker: &Worker,
    object: &Instance,
    record: Option<&serde_json::Value>,
) -> Result<Action, Error> {
    if let Some(status) = record {
        status_down(worker, object, status.clone(), "record").await?;
    }
    worker.mark(object, Some(SyncState::Paused));
    Ok(Action::await_change())
}

/// `Step::WaitForTerminatingCopy`: said once on the object (the same record again writes
/// nothing), not per poll.
pub(in crate::worker) async fn wait_for_terminating_copy(
    worker: &Worker,
    object: &Instance,
) -> Result<Action, Error> {
    record_refusal(
        worker,
        object,
        delivery::PENDING,
        "waiting for the provider's previous copy to finish terminating",
    )
    .await?;
    Ok(Action::requeue(Duration::from_secs(1)))
}

/// The conflict annotation a `Step::Sync` wants: none, or `RouteChanged` (#36) — announced
/// with the warning the step carries, once (the annotation changes only then).
pub(in crate::worker) async fn show_route_changed(
    worker: &Worker,
    object: &Instance,
    route_changed: Option<&str>,
) -> Result<(), Error> {
    let wanted = route_changed.map(|_| super::super::decide::ROUTE_CHANGED);
    worker.set_conflict(object, wanted).await?;
    if let (Some(reason), Some(message)) = (wanted, route_changed) {
        worker.warn(object, reason, message.to_owned()).await;
        worker.count("route", reason);
    }
    Ok(())
}

/// The delivery record says the current spec did not reach the provider (refused, or
/// [`delivery::PENDING`]), why, and since when the change waits — written once per cause (a
/// retry that fails the same way writes nothing).
pub(in crate::worker) async fn record_refusal(
    worker: &Worker,
    object: &Instance,
    state: &str,
    message: &str,
) -> Result<(), Error> {
    if !worker.spec.has_delivery || !worker.spec.has_status_subresource {
        return Ok(());
    }
    let current_status = object.status.as_ref().map(Json::value);
    let current = delivery::record_of(current_status.as_ref());
    let since = object.changed_at.map(delivery::Seconds::time);
    let record = delivery::refused(current, state, message, since.as_ref());
    let status = delivery::with_record(current_status.as_ref(), &record);
    if current_status.as_ref() == Some(&status) {
        return Ok(());
    }
    status_down(worker, object, status, "record").await
}

/// The status that records `object` as paused, when it does not say so already (`None`: nothing
/// to write — the record says so, or its CRD keeps no record).
pub(in crate::worker) fn paused_record(
    worker: &Worker,
    object: &Instance,
    message: &str,
) -> Option<serde_json::Value> {
    if !worker.spec.has_delivery || !worker.spec.has_status_subresource {
        return None;
    }
    let current = object.status.as_ref().map(Json::value);
    let record = delivery::paused(delivery::record_of(current.as_ref()), message);
    let status = delivery::with_record(current.as_ref(), &record);
    (current.as_ref() != Some(&status)).then_some(status)
}

/// The status without kbind's record, when the record says routing held the object (`None`:
/// it does not, nothing to write).
pub(in crate::worker) fn without_hold_record(
    status: Option<serde_json::Value>,
) -> Option<serde_json::Value> {
    let held = delivery::summary(status.as_ref())?.state == delivery::State::Held;
    let mut status = status?;
    held.then(|| {
        if let Some(map) = status.as_object_mut() {
            map.remove(delivery::FIELD);
        }
        status
    })
}

/// Why the user paused `object`, if they did: its own `core.kbind.io/paused: "true"`, else its
/// binding's `spec.suspend`.
pub(in crate::worker) fn pause_message(
    object: &Instance,
    resolution: Option<&kbind_shared::resolve::Resolution>,
) -> Option<String> {
    let annotated = object
        .annotations()
        .get(keys::PAUSED_ANNOTATION)
        .map(String::as_str);
    if annotated == Some(keys::TRUE) {
        return Some(format!(
            "paused by its {} annotation: kbind neither writes its spec to the provider nor copies the provider's status until the annotation is removed",
            keys::PAUSED_ANNOTATION
        ));
    }
    let binding = resolution.filter(|r| r.suspended)?;
    let described = match &binding.namespace {
        Some(namespace) => format!("Binding {namespace}/{}", binding.name),
        None => format!("ClusterBinding {}", binding.name),
    };
    Some(format!(
        "{described} is suspended (spec.suspend): kbind writes nothing for the objects it covers until it is resumed"
    ))
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn a_pause_or_a_refusal_is_recorded_only_where_the_crd_keeps_a_record() {
        use serde_json::json;
        let object = fake::widget(json!({}), json!({ "phase": "Ready" }));
        for (delivery, subresource, kept) in [
            (true, true, true),
            (false, true, false),
            (true, false, false),
            (false, false, false),
        ] {
            let (consumer, on_consumer) = fake::server(|_, _| None);
            let (provider, _) = fake::server(|_, _| None);
            let (worker, _) = fake::worker_with(consumer, provider, |spec| {
                spec.has_delivery = delivery;
                spec.has_status_subresource = subresource;
            })
            .await;
            let record = super::paused_record(&worker, &object, "paused by its annotation");
            assert_eq!(
                record.is_some(),
                kept,
                "{delivery} {subresource}: {record:?}"
            );
            // A refusal: one status write where a record is kept (the fake answers it 404).
            let _ = super::record_refusal(&worker, &object, "Rejected", "no").await;
            let writes = fake::calls(&on_consumer)
                .into_iter()
                .filter(|c| c.method == "PATCH")
                .count();
            assert_eq!(writes, usize::from(kept), "{delivery} {subresource}");
        }
    }

    #[test]
    fn only_routings_record_goes_with_its_mark() {
        use serde_json::json;
        let held = json!({ "phase": "Ready", "kbindSync": { "state": "NoRoute", "message": "x" } });
        assert_eq!(
            super::without_hold_record(Some(held)),
            Some(json!({ "phase": "Ready" }))
        );
        for kept in [
            json!({ "kbindSync": { "state": "Synced", "generation": 1 } }),
            json!({ "kbindSync": { "state": "Pending" } }),
            json!({ "phase": "Ready" }),
        ] {
            assert_eq!(
                super::without_hold_record(Some(kept.clone())),
                None,
                "{kept}"
            );
        }
        assert_eq!(super::without_hold_record(None), None);
    }

    use super::super::super::fake;
    use super::super::super::pending;
    use kbind_shared::keys;
    use kbind_shared::sync::Locked;
    use kube::runtime::controller::Action;
    use serde_json::{Value, json};

    /// The consumer's answer to a write of the widget: it, at resourceVersion `version`.
    fn written(version: &str) -> (u16, Value) {
        let mut object = json!({ "apiVersion": "example.org/v1", "kind": "Widget",
            "metadata": { "name": "w", "namespace": "team-a", "uid": "w-uid" } });
        object["metadata"]["resourceVersion"] = json!(version);
        (200, object)
    }

    #[tokio::test]
    async fn a_pause_is_recorded_once_on_the_object_and_nothing_reaches_the_provider() {
        let status = fake::widget_path("team-a", "w", "/status");
        let (consumer, on_consumer) = fake::server(move |method, path| {
            (method == "PATCH" && path == status).then(|| written("11"))
        });
        let (provider, on_provider) = fake::server(|_, _| None);
        let worker = fake::worker(consumer, provider).await;
        let paused = json!({ "annotations": { keys::PAUSED_ANNOTATION: "true" } });
        let object = fake::widget(paused.clone(), Value::Null);
        // What the sync's facts carry to the step: the record of why it is paused.
        let to_record = |object| {
            let message = super::pause_message(object, None).unwrap();
            super::paused_record(&worker, object, &message)
        };
        let record = to_record(&object);
        assert!(record.is_some());

        let action = super::paused(&worker, &object, record.as_ref())
            .await
            .unwrap();
        assert_eq!(action, Action::await_change());
        let calls = fake::calls(&on_consumer);
        assert_eq!(calls.len(), 1, "{calls:?}");
        assert_eq!(
            (calls[0].method.as_str(), calls[0].path.as_str()),
            (
                "PATCH",
                fake::widget_path("team-a", "w", "/status").as_str()
            )
        );
        let record = &calls[0].body["status"]["kbindSync"];
        assert_eq!(record["state"], "Paused", "{record}");
        assert!(
            record["message"]
                .as_str()
                .unwrap()
                .contains(keys::PAUSED_ANNOTATION),
            "{record}"
        );
        assert!(fake::calls(&on_provider).is_empty());
        // The record: the write's echo is awaited (the cache still shows 10), and it stands
        // paused.
        let key = pending::key(&object);
        assert!(worker.tracked.locked().behind(&key, Some("10")));
        assert!(!worker.tracked.locked().behind(&key, Some("11")));
        assert_eq!(worker.tracked.locked().counts().paused, 1);

        // The object as written says so already: nothing more is written.
        let mut recorded = paused;
        recorded["resourceVersion"] = json!("11");
        let object = fake::widget(recorded, fake::merged(&calls[0].body["status"]));
        let record = to_record(&object);
        assert_eq!(record, None, "recorded already");
        super::paused(&worker, &object, record.as_ref())
            .await
            .unwrap();
        assert_eq!(fake::calls(&on_consumer).len(), 1);
        assert_eq!(worker.tracked.locked().counts().paused, 1);
    }

    #[tokio::test]
    async fn an_unbound_object_loses_kbinds_mark_and_routings_record_in_two_writes_and_its_state() {
        let (object_path, status) = (
            fake::widget_path("team-a", "w", ""),
            fake::widget_path("team-a", "w", "/status"),
        );
        let (consumer, on_consumer) = fake::server(move |method, path| {
            (method == "PATCH" && (path == object_path || path == status)).then(|| written("11"))
        });
        let (provider, on_provider) = fake::server(|_, _| None);
        let worker = fake::worker(consumer, provider).await;
        let object = fake::widget(
            json!({ "annotations": { keys::CONFLICT_ANNOTATION: "NoRoute" } }),
            json!({ "phase": "Ready", "kbindSync": { "state": "NoRoute", "message": "m" } }),
        );
        worker.mark(
            &object,
            Some(super::super::super::record::SyncState::Conflict),
        );

        super::unmark(&worker, &object).await.unwrap();
        let calls = fake::calls(&on_consumer);
        assert_eq!(calls.len(), 2, "{calls:?}");
        assert_eq!(
            calls[0].body["metadata"]["annotations"][keys::CONFLICT_ANNOTATION],
            Value::Null
        );
        assert_eq!(
            calls[1].body["status"]["kbindSync"],
            Value::Null,
            "{:?}",
            calls[1].body
        );
        assert!(fake::calls(&on_provider).is_empty());
        assert_eq!(worker.tracked.locked().counts().conflicts, 0);
    }

    /// The notes of the Warning Events the consumer was sent, in order.
    fn warnings(on_consumer: &fake::Requests) -> Vec<String> {
        fake::calls(on_consumer)
            .into_iter()
            .filter(|c| c.method == "POST" && c.path.contains("/events"))
            .map(|c| c.body["note"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    #[tokio::test]
    async fn a_conflicts_warning_says_whether_the_provider_object_is_unmarked_or_anothers() {
        use kbind_shared::api::ConflictPolicy;
        use kbind_shared::ownership::Owner;
        for (owner, said) in [
            (Owner::Unmarked, "exists without kbind's markers"),
            (
                Owner::Another,
                "is owned by another consumer object or cluster",
            ),
        ] {
            let object_path = fake::widget_path("team-a", "w", "");
            let (consumer, on_consumer) = fake::server(move |method, path| {
                (method == "PATCH" && path == object_path).then(|| written("11"))
            });
            let (provider, _) = fake::server(|_, _| None);
            let worker = fake::worker(consumer, provider).await;
            let object = fake::widget(json!({}), Value::Null);
            super::conflict(
                &worker,
                &object,
                ConflictPolicy::Fail,
                keys::CONFLICT_FOREIGN,
                owner,
                true,
            )
            .await
            .unwrap();
            assert_eq!(
                warnings(&on_consumer),
                [format!(
                    "the provider object team-a/w {said}; conflictPolicy Fail leaves it alone"
                )]
            );
        }
    }

    #[tokio::test]
    async fn a_route_change_is_shown_with_its_warning_and_cleared_silently() {
        let object_path = fake::widget_path("team-a", "w", "");
        let (consumer, on_consumer) = fake::server(move |method, path| {
            (method == "PATCH" && path == object_path).then(|| written("11"))
        });
        let (provider, _) = fake::server(|_, _| None);
        let worker = fake::worker(consumer, provider).await;
        let route_changed = super::super::super::decide::ROUTE_CHANGED;
        let conflict_marks = || -> Vec<Value> {
            fake::calls(&on_consumer)
                .into_iter()
                .filter(|c| c.method == "PATCH")
                .map(|c| c.body["metadata"]["annotations"][keys::CONFLICT_ANNOTATION].clone())
                .collect()
        };
        let plain = fake::widget(json!({}), Value::Null);
        super::show_route_changed(&worker, &plain, Some("its labels now choose r/cl-r"))
            .await
            .unwrap();
        assert_eq!(conflict_marks(), [json!(route_changed)]);
        assert_eq!(warnings(&on_consumer), ["its labels now choose r/cl-r"]);
        // The labels choose its route again (the step clears a shown mark): it goes, silently.
        let shown = fake::widget(
            json!({ "annotations": { keys::CONFLICT_ANNOTATION: route_changed } }),
            Value::Null,
        );
        super::show_route_changed(&worker, &shown, None)
            .await
            .unwrap();
        assert_eq!(conflict_marks(), [json!(route_changed), Value::Null]);
        assert_eq!(warnings(&on_consumer).len(), 1);
    }
}
