//! The steps that deliver a spec (SYNC-7/8, OWN): kbind's finalizer first, then the spec by
//! server-side apply (create-only when no copy is cached), and what a refusal or a stranger
//! under the name leaves behind.

use kbind_shared::sync::Locked;
use std::time::Duration;

use kbind_shared::cache::{Instance, Json, ProviderCopy};
use kbind_shared::delivery;
use kbind_shared::keys;
use kbind_shared::ownership::{self, Owner};
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;

use super::super::decide::SpecUp;
use super::super::pending::{self, Seen};
use super::super::state::Worker;
use super::super::strangers::Known;
use super::super::writes::{Error, result_label};
use super::marks::record_refusal;
use super::status_down::{Delivered, bounded};

/// `Step::AddFinalizer`: kbind's finalizer before anything is written to the provider — and a
/// routed object's pin to this route in the same write (#36).
pub(in crate::worker) async fn add_finalizer(
    worker: &Worker,
    object: &Instance,
    seen: Seen,
) -> Result<Action, Error> {
    let finalizers =
        kbind_shared::finalizers::toggled(&object.metadata, &worker.spec.finalizer(), true)
            .unwrap_or_default();
    let pin = worker
        .routing()
        .filter(|_| !object.annotations().contains_key(keys::ROUTE_ANNOTATION))
        .map(|r| r.route.pin_text());
    worker.set_finalizers(object, finalizers, pin).await?;
    // The change still waits for its spec-up (which the finalizer's echo starts): its lag runs
    // from when it was first seen, the creation, not from the echo (#33.3).
    worker
        .tracked
        .locked()
        .give_back(&pending::key(object), seen);
    Ok(Action::await_change())
}

/// SYNC-7/8: the spec up, by server-side apply — create only when no copy is cached. `Ok(Err)`:
/// the sync ends here with that action (a copy appeared meanwhile: classified next time).
pub(in crate::worker) async fn push_spec(
    worker: &Worker,
    object: &Instance,
    how: SpecUp,
    seen: Seen,
) -> Result<Result<Delivered, Action>, Error> {
    let spec = &worker.spec;
    let namespace = object.namespace();
    if let Some(ns) = namespace.as_deref()
        && let Err(e) = worker.ensure_provider_namespace(ns).await
    {
        return forbidden_or(worker, object, "create the provider namespace", e)
            .await
            .map(Err);
    }
    let mut body = ownership::spec_up_body(
        &spec.resource.api_version,
        &spec.resource.kind,
        worker.provider_namespace(namespace.as_deref())?.as_deref(),
        &object.name_any(),
        object.spec.as_ref().map(Json::value).as_ref(),
        &spec.local_uid,
        object.metadata.uid.as_deref().unwrap_or_default(),
        &spec.heartbeat(),
    );
    // OWN on fresh facts: with no copy in the cache, the first write only creates. Anything that
    // exists under the name (created in the instant the cache has not seen yet) answers 409, and
    // the next sync classifies it from the cache — it is never forced over.
    let creating = how == SpecUp::Create;
    if creating {
        kbind_shared::apply::create_only(&mut body);
    }
    worker.fence()?;
    let key = pending::key(object);
    worker.tracked.locked().writing(&key);
    let applied = worker
        .provider_api(namespace.as_deref())?
        .patch(
            &object.name_any(),
            &PatchParams::apply(keys::FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await;
    let now = std::time::Instant::now();
    let written = applied.as_ref().ok();
    worker.tracked.locked().wrote_provider(
        &key,
        written.and_then(|a| a.metadata.resource_version.as_deref()),
        now,
    );
    match applied {
        Ok(applied) => Ok(Ok(spec_applied(worker, object, &key, seen, &applied, now))),
        Err(e) if creating && kbind_shared::apply::exists(&e) => {
            tracing::debug!(api = %spec.api, object = %object.name_any(), "a provider object exists under the name; classifying it");
            // Ours and labelled: the cache shows it shortly. Anything else: decided from what was
            // read, at once.
            let wait = match read_stranger(worker, object).await? {
                Known::Fresh(_) => Duration::from_millis(10),
                _ => Duration::from_millis(200),
            };
            Ok(Err(Action::requeue(wait)))
        }
        Err(kube::Error::Api(s)) if s.is_not_found() => {
            // The provider namespace went away under us: forget it, create it next time.
            if let Some(ns) = namespace.as_deref() {
                worker.forget_namespace(ns);
            }
            Err(Error::Provider(kube::Error::Api(s)))
        }
        Err(e) => forbidden_or(worker, object, "apply the spec to the provider", e)
            .await
            .map(Err),
    }
}

/// The provider took the spec (`applied` is its answer at `now`): counted and timed, and what the
/// provider has of the object now.
fn spec_applied(
    worker: &Worker,
    object: &Instance,
    key: &pending::Key,
    seen: Seen,
    applied: &kube::api::DynamicObject,
    now: std::time::Instant,
) -> Delivered {
    worker.count("spec_up", "ok");
    // Adopted, or labelled: ours now, and the watch shows it.
    worker.tracked.locked().forget_stranger(key);
    // A new generation is timed from its change as the consumer's API server recorded it; a
    // drift repair (the same generation again) from its receipt.
    let new_generation = object
        .delivery
        .as_ref()
        .is_none_or(|d| d.generation.map(std::num::NonZeroI64::get) != object.metadata.generation);
    worker.lag(
        "spec_up",
        seen.first(),
        object.changed_at.filter(|_| new_generation),
    );
    worker.tracked.locked().spec_applied(key, now);
    let (provider_status, oversized) = match bounded(
        applied.data.get("status"),
        worker.ctx.limits.max_status_bytes,
    ) {
        Ok(status) => (status, None),
        Err(size) => (object.status.as_ref().map(Json::value), Some(size)),
    };
    Delivered {
        provider_status,
        oversized,
        at: delivery::applied_at(&applied.metadata),
    }
}

/// SYNC-10: a Forbidden or rejected write is recorded on the object, gets a Warning Event once
/// per refusal (not per retry), and is retried with the same exponential backoff as any error
/// (`error_policy`); anything else is an error.
pub(in crate::worker) async fn forbidden_or(
    worker: &Worker,
    object: &Instance,
    operation: &str,
    error: kube::Error,
) -> Result<Action, Error> {
    // Told apart by what the provider says: a webhook's 403 is a rejection, not RBAC (#33.2).
    let refusal = match &error {
        kube::Error::Api(s) => match delivery::refusal(s.code, &s.message) {
            Some(delivery::Refusal::Forbidden) => Some((
                "forbidden",
                delivery::FORBIDDEN,
                delivery::Refusal::Forbidden.event_reason(),
                format!("cannot {operation}"),
            )),
            // The provider's validation or admission said no: tell the user why; other objects
            // are unaffected.
            Some(delivery::Refusal::Rejected) => Some((
                "rejected",
                delivery::REJECTED,
                delivery::Refusal::Rejected.event_reason(),
                "the provider rejected the object".to_owned(),
            )),
            None => None,
        },
        _ => None,
    };
    let (kube::Error::Api(s), Some((result, state, reason, what))) = (&error, refusal) else {
        worker.count("spec_up", result_label(&error));
        // #33.1: the provider did not take the spec (an outage, a 5xx, a timeout): the object
        // says so — Pending, with the answer — instead of keeping the last state.
        let answer = match &error {
            kube::Error::Api(s) => format!("the provider answered {}: {}", s.code, s.message),
            other => format!("the provider did not answer: {other}"),
        };
        record_refusal(
            worker,
            object,
            delivery::PENDING,
            &format!("cannot {operation}: {answer}"),
        )
        .await?;
        return Err(Error::Provider(error));
    };
    worker.count("spec_up", result);
    record_refusal(worker, object, state, &s.message).await?;
    let news = worker.tracked.locked().failure_is_new(
        &pending::key(object),
        &Error::Provider(error_copy(s)).to_string(),
    );
    if news {
        let message = format!("{what}: {}", kbind_shared::redact::remote(&s.message));
        worker.warn(object, reason, message).await;
    }
    Err(Error::Provider(error))
}

/// The same API error again (a `kube::Error` is not `Clone`).
pub(in crate::worker) fn error_copy(status: &kube::core::Status) -> kube::Error {
    kube::Error::Api(Box::new(status.clone()))
}

/// Reads the provider object under `object`'s name and records it as a stranger — unless it is
/// this consumer cluster's labelled copy (the cache shows it shortly) or nothing is there.
pub(in crate::worker) async fn read_stranger(
    worker: &Worker,
    object: &Instance,
) -> Result<Known, Error> {
    let api: kube::Api<Instance> = match worker.provider_namespace(object.namespace().as_deref())? {
        Some(namespace) => {
            kube::Api::namespaced_with(worker.provider.clone(), &namespace, &worker.dyntype)
        }
        None => kube::Api::all_with(worker.provider.clone(), &worker.dyntype),
    };
    let mut read = api
        .get_opt(&object.name_any())
        .await
        .map_err(Error::Provider)?;
    // Held under the consumer's namespace, as the cache holds copies (#51).
    if let Some(read) = &mut read {
        read.metadata.namespace = object.namespace();
    }
    let object_uid = object.metadata.uid.as_deref().unwrap_or_default();
    let copy = read
        .map(|o| ProviderCopy::of(o, &worker.spec.local_uid))
        .filter(|c| !(c.labelled && c.owner(object_uid) == Owner::Ours));
    Ok(worker.tracked.locked().stranger_read(
        &pending::key(object),
        copy,
        std::time::Instant::now(),
    ))
}

#[cfg(test)]
mod tests {
    use super::super::super::decide::SpecUp;
    use super::super::super::fake;
    use super::super::super::pending::{self, Seen};
    use super::super::super::strangers::Known;
    use kbind_shared::cache::ClusterMarker;
    use kbind_shared::keys;
    use kbind_shared::sync::Locked;
    use kube::runtime::controller::Action;
    use serde_json::{Value, json};
    use std::time::{Duration, Instant};

    /// The provider's copy as it answers an apply or a read: `annotations` its markers.
    fn copy(annotations: Value, version: &str) -> Value {
        json!({ "apiVersion": "example.org/v1", "kind": "Widget",
            "metadata": { "name": "w", "namespace": "team-a", "uid": "copy-uid",
                "resourceVersion": version, "annotations": annotations },
            "spec": { "size": 3 }, "status": { "phase": "Ready" } })
    }

    fn ours() -> Value {
        json!({ keys::CONSUMER_CLUSTER_UID_ANNOTATION: "consumer-uid",
            keys::CONSUMER_OBJECT_UID_ANNOTATION: "w-uid" })
    }

    #[tokio::test]
    async fn a_new_object_is_created_with_its_markers_create_only_and_its_echo_awaited() {
        let widget = fake::widget_path("team-a", "w", "");
        let (provider, on_provider) = fake::server(move |method, path| match (method, path) {
            ("POST", "/api/v1/namespaces") => {
                Some((201, json!({ "metadata": { "name": "team-a" } })))
            }
            ("PATCH", p) if p == widget => Some((201, copy(ours(), "5"))),
            _ => None,
        });
        let (consumer, _) = fake::server(|_, _| None);
        let worker = fake::worker(consumer, provider).await;
        let object = fake::bound_widget();
        let before = Instant::now();

        let delivered = super::push_spec(&worker, &object, SpecUp::Create, Seen::default())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(delivered.provider_status, Some(json!({ "phase": "Ready" })));
        assert_eq!(delivered.oversized, None);
        let calls = fake::calls(&on_provider);
        let asked: Vec<(&str, &str)> = calls
            .iter()
            .map(|c| (c.method.as_str(), c.path.as_str()))
            .collect();
        assert_eq!(
            asked,
            [
                ("POST", "/api/v1/namespaces"),
                ("PATCH", fake::widget_path("team-a", "w", "").as_str())
            ]
        );
        let apply = &calls[1];
        assert!(
            apply.query.contains("fieldManager=kbind"),
            "{}",
            apply.query
        );
        assert!(apply.query.contains("force=true"), "{}", apply.query);
        assert_eq!(apply.body["spec"], json!({ "size": 3 }));
        assert_eq!(
            apply.body["metadata"]["annotations"][keys::CONSUMER_OBJECT_UID_ANNOTATION],
            "w-uid"
        );
        assert_eq!(
            apply.body["metadata"]["labels"][keys::CONSUMER_CLUSTER_UID_LABEL],
            "consumer-uid"
        );
        assert_eq!(
            apply.body["metadata"]["resourceVersion"],
            kbind_shared::apply::CREATE_ONLY_RESOURCE_VERSION,
            "a create only: never over something the cache did not show"
        );
        // The record: the spec was applied (a status change may carry the delivery record), and
        // a sync waits for the write's echo in the provider cache.
        let key = pending::key(&object);
        let mut tracked = worker.tracked.locked();
        assert!(tracked.applied_since(&key, before));
        assert!(tracked.provider_echo_wait(&key, Instant::now()).is_some());
        tracked.saw(&key, Some("5"));
        tracked.cached(&key);
        assert_eq!(tracked.provider_echo_wait(&key, Instant::now()), None);
    }

    #[tokio::test]
    async fn an_object_found_under_the_name_is_read_and_never_written_over() {
        let widget = fake::widget_path("team-a", "w", "");
        let (provider, on_provider) = fake::server(move |method, path| match (method, path) {
            ("POST", "/api/v1/namespaces") => Some(fake::status(409, "AlreadyExists", "exists")),
            ("PATCH", p) if p == widget => Some(fake::status(
                409,
                "Conflict",
                "the object has been modified",
            )),
            ("GET", p) if p == widget => Some((200, copy(json!({}), "7"))),
            _ => None,
        });
        let (consumer, on_consumer) = fake::server(|_, _| None);
        let worker = fake::worker(consumer, provider).await;
        let object = fake::bound_widget();

        let action = super::push_spec(&worker, &object, SpecUp::Create, Seen::default())
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(
            action,
            Action::requeue(Duration::from_millis(10)),
            "decided from what was read, at once"
        );
        let writes: Vec<_> = fake::calls(&on_provider)
            .into_iter()
            .filter(|c| c.path.contains("/widgets/"))
            .map(|c| c.method)
            .collect();
        assert_eq!(
            writes,
            ["PATCH", "GET"],
            "one refused create, one read; nothing forced"
        );
        assert!(fake::calls(&on_consumer).is_empty());
        let key = pending::key(&object);
        let Known::Fresh(found) = worker.tracked.locked().known_stranger(&key, Instant::now())
        else {
            panic!("the stranger is known");
        };
        assert_eq!(found.cluster_marker, ClusterMarker::Absent);
        assert_eq!(found.spec, None, "nothing of another's data is kept");
    }

    /// What an API server's RBAC answers.
    const RBAC: &str = "widgets.example.org \"w\" is forbidden: User \"system:serviceaccount:kbind:c\" cannot patch resource \"widgets\" in API group \"example.org\" in the namespace \"team-a\"";

    #[tokio::test]
    async fn a_refused_spec_is_recorded_on_the_object_and_announced_once() {
        let widget = fake::widget_path("team-a", "w", "");
        let status = fake::widget_path("team-a", "w", "/status");
        let (provider, _) = fake::server(move |method, path| match (method, path) {
            ("POST", "/api/v1/namespaces") => Some(fake::status(409, "AlreadyExists", "exists")),
            ("PATCH", p) if p == widget => Some(fake::status(403, "Forbidden", RBAC)),
            _ => None,
        });
        let (consumer, on_consumer) = fake::server(move |method, path| {
            (method == "PATCH" && path == status)
                .then(|| (200, json!({ "metadata": { "resourceVersion": "11" } })))
        });
        let worker = fake::worker(consumer, provider).await;
        let object = fake::bound_widget();

        for _ in 0..2 {
            let refused = super::push_spec(&worker, &object, SpecUp::Apply, Seen::default()).await;
            let Err(error) = refused else {
                panic!("refused: {refused:?}");
            };
            assert!(matches!(error, super::Error::Provider(_)), "{error:?}");
            // What the worker's error policy records of it before the retry.
            worker
                .tracked
                .locked()
                .failed(&pending::key(&object), &error.to_string());
        }
        let calls = fake::calls(&on_consumer);
        let records: Vec<&Value> = calls
            .iter()
            .filter(|c| c.path.ends_with("/status"))
            .map(|c| &c.body["status"]["kbindSync"])
            .collect();
        assert_eq!(
            records.len(),
            2,
            "the object (as the cache shows it) says so each time"
        );
        assert_eq!(records[0]["state"], "Forbidden", "{}", records[0]);
        let events: Vec<&Value> = calls
            .iter()
            .filter(|c| c.path.contains("/events"))
            .map(|c| &c.body)
            .collect();
        assert_eq!(
            events.len(),
            1,
            "one Warning per refusal, not per retry: {events:?}"
        );
        assert_eq!(events[0]["type"], "Warning");
        assert!(
            events[0]["note"].as_str().unwrap().contains("forbidden"),
            "{}",
            events[0]
        );
    }

    #[tokio::test]
    async fn an_apply_answered_not_found_forgets_the_namespace_and_a_conflict_is_no_create() {
        let widget = fake::widget_path("team-a", "w", "");
        for (code, reason) in [(404, "NotFound"), (409, "Conflict")] {
            let path = widget.clone();
            let (provider, on_provider) = fake::server(move |method, p| match (method, p) {
                ("POST", "/api/v1/namespaces") => {
                    Some((201, json!({ "metadata": { "name": "team-a" } })))
                }
                ("PATCH", p) if p == path => Some(fake::status(code, reason, "no")),
                _ => None,
            });
            let (consumer, _) = fake::server(|_, _| None);
            let worker = fake::worker(consumer, provider).await;
            let object = fake::bound_widget();
            let result = super::push_spec(&worker, &object, SpecUp::Apply, Seen::default()).await;
            let reads = fake::calls(&on_provider)
                .iter()
                .filter(|c| c.method == "GET" && c.path == widget)
                .count();
            assert_eq!(
                reads, 0,
                "{code}: an apply is no create: nothing to classify"
            );
            let known = worker.known_namespaces.locked().contains("team-a");
            if code == 404 {
                assert!(result.is_err(), "{code}");
                assert!(
                    !known,
                    "the provider namespace went away: made again next time"
                );
            } else {
                assert!(known, "{code}: the namespace stays known");
            }
        }
    }

    #[tokio::test]
    async fn a_copy_of_ours_the_watch_selects_is_no_stranger_and_one_it_does_not_is() {
        let ours_labelled = {
            let mut c = copy(ours(), "5");
            c["metadata"]["labels"] = json!({ keys::CONSUMER_CLUSTER_UID_LABEL: "consumer-uid" });
            c
        };
        let another_labelled = {
            let mut c = copy(
                json!({ keys::CONSUMER_CLUSTER_UID_ANNOTATION: "consumer-uid",
                    keys::CONSUMER_OBJECT_UID_ANNOTATION: "another-object" }),
                "5",
            );
            c["metadata"]["labels"] = json!({ keys::CONSUMER_CLUSTER_UID_LABEL: "consumer-uid" });
            c
        };
        for (answer, stranger) in [
            (ours_labelled, false),
            (copy(ours(), "5"), true),
            (another_labelled, true),
        ] {
            let widget = fake::widget_path("team-a", "w", "");
            let body = answer.clone();
            let (provider, _) = fake::server(move |method, p| {
                (method == "GET" && p == widget).then(|| (200, body.clone()))
            });
            let (consumer, _) = fake::server(|_, _| None);
            let worker = fake::worker(consumer, provider).await;
            let known = super::read_stranger(&worker, &fake::bound_widget())
                .await
                .unwrap();
            assert_eq!(
                matches!(known, Known::Fresh(_)),
                stranger,
                "{answer}: {known:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_routed_objects_finalizer_carries_its_pin_to_this_route_unless_it_has_one() {
        let (consumer, on_consumer) = fake::routed_consumer(|_, _| None);
        let (provider, _) = fake::server(|_, _| None);
        let worker = fake::route_worker(consumer, provider, false).await;
        let finalizer = kbind_shared::routing::finalizer("r", "c");
        let written = |object: &kbind_shared::cache::Instance| {
            let worker = worker.clone();
            let object = object.clone();
            let on_consumer = on_consumer.clone();
            async move {
                on_consumer.lock().unwrap().clear();
                super::add_finalizer(&worker, &object, Seen::default())
                    .await
                    .unwrap();
                let patches: Vec<Value> = fake::calls(&on_consumer)
                    .into_iter()
                    .filter(|c| c.method == "PATCH")
                    .map(|c| c.body)
                    .collect();
                assert_eq!(patches.len(), 1, "one write: {patches:?}");
                patches[0].clone()
            }
        };
        let unpinned = fake::widget(json!({}), Value::Null);
        let patch = written(&unpinned).await;
        assert_eq!(patch["metadata"]["finalizers"], json!([finalizer]));
        assert_eq!(
            patch["metadata"]["annotations"],
            json!({ keys::ROUTE_ANNOTATION: "r/cl-r" }),
            "pinned to this route in the finalizer's write"
        );
        let pinned = fake::widget(
            json!({ "annotations": { keys::ROUTE_ANNOTATION: "r" } }),
            Value::Null,
        );
        let patch = written(&pinned).await;
        assert_eq!(patch["metadata"]["finalizers"], json!([finalizer]));
        assert_eq!(
            patch["metadata"].get("annotations"),
            None,
            "the user's pin is left as written"
        );
    }

    #[tokio::test]
    async fn a_new_generation_is_timed_from_its_change_and_a_repair_from_its_receipt() {
        let (consumer, _) = fake::server(|_, _| None);
        let (provider, _) = fake::server(|_, _| None);
        let worker = fake::worker(consumer, provider).await;
        // Changed (created) a minute ago, generation 2; the provider has generation 1 or 2.
        let created = (jiff::Timestamp::now() - jiff::SignedDuration::from_secs(60)).to_string();
        let object = |delivered: i64| {
            fake::widget(
                json!({ "creationTimestamp": created }),
                json!({ "kbindSync": { "state": "Synced", "generation": delivered } }),
            )
        };
        let applied: kube::api::DynamicObject = serde_json::from_value(copy(ours(), "5")).unwrap();
        let lag = || {
            worker
                .ctx
                .metrics
                .sync_lag_seconds
                .with_label_values(&["c", "widgets.example.org", "spec_up"])
                .get_sample_sum()
        };
        let applied_now = |object: &kbind_shared::cache::Instance| {
            super::spec_applied(
                &worker,
                object,
                &pending::key(object),
                Seen::default(),
                &applied,
                Instant::now(),
            );
        };
        applied_now(&object(1));
        let new_generation = lag();
        assert!(
            (58.0..120.0).contains(&new_generation),
            "timed from its change: {new_generation}"
        );
        applied_now(&object(2));
        let repair = lag() - new_generation;
        assert!(repair < 5.0, "timed from its receipt: {repair}");
    }
}
