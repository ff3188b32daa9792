//! The steps that end a copy (IDEL-1 … IDEL-3, #36): the object's deletion, and its release
//! when the user moves it to another route — always from a fresh read, never from the cache.

use kbind_shared::sync::Locked;
use std::time::Duration;

use kbind_shared::cache::Instance;
use kbind_shared::delivery;
use kbind_shared::keys;
use kbind_shared::ownership::{self, Owner};
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;

use super::super::pending::{self};
use super::super::state::Worker;
use super::super::writes::{Error, result_label};

/// #36: the user moved `object` to another route. This route's copy goes first — deleted, or
/// with `core.kbind.io/deletion-policy: Orphan` unmarked and left, foreign to kbind — and only
/// once it is gone (or unmarked) is this route's finalizer dropped, which lets the new route's
/// worker write. Never both at once.
pub(in crate::worker) async fn release(
    object: &Instance,
    worker: &Worker,
) -> Result<Action, Error> {
    let Some(released) =
        kbind_shared::finalizers::toggled(&object.metadata, &worker.spec.finalizer(), false)
    else {
        return Ok(Action::await_change());
    };
    let orphan = object
        .annotations()
        .get(keys::DELETION_POLICY_ANNOTATION)
        .map(String::as_str)
        == Some(keys::DELETION_POLICY_ORPHAN);
    // A fresh read: a release must not act on a stale cache.
    if let Some(copy) = our_copy(object, worker).await? {
        worker.fence()?;
        if orphan {
            let copy_uid = copy.metadata.uid.clone().unwrap_or_default();
            match worker
                .provider_api(object.namespace().as_deref())?
                .patch(
                    &object.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(ownership::unmark_patch(&copy_uid)),
                )
                .await
            {
                Ok(_) => worker.count("release", "orphaned"),
                Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => {}
                Err(e) => {
                    worker.count("release", result_label(&e));
                    return Err(Error::Provider(e));
                }
            }
            // Looked at again: dropped only once the copy no longer reads as ours.
            return Ok(Action::requeue(Duration::from_millis(500)));
        }
        delete_copy(object, worker, &copy, "release").await?;
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    worker.set_finalizers(object, released, None).await?;
    worker.mark(object, None);
    Ok(Action::await_change())
}

/// IDEL-1 … IDEL-3.
pub(in crate::worker) async fn delete(object: &Instance, worker: &Worker) -> Result<Action, Error> {
    let Some(released) =
        kbind_shared::finalizers::toggled(&object.metadata, &worker.spec.finalizer(), false)
    else {
        return Ok(Action::await_change());
    };
    let release = || async {
        // Read first: the object can vanish (and its watch event clear the entry) before the
        // release's answer arrives.
        let key = pending::key(object);
        let since = worker.tracked.locked().deletion_started(&key);
        worker
            .set_finalizers(object, released.clone(), None)
            .await?;
        worker.tracked.locked().deleted(&key);
        let deleted_at = object
            .metadata
            .deletion_timestamp
            .as_ref()
            .and_then(delivery::Seconds::of);
        worker.lag("delete", since, deleted_at);
        Ok::<(), Error>(())
    };
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
    match our_copy(object, worker).await? {
        Some(copy) => {
            worker.fence()?;
            delete_copy(object, worker, &copy, "delete").await?;
            Ok(Action::requeue(Duration::from_secs(2)))
        }
        None => {
            release().await?;
            worker.mark(object, None);
            Ok(Action::await_change())
        }
    }
}

/// `object`'s provider copy, read fresh, if it is kbind's copy of it (OWN-1).
pub(in crate::worker) async fn our_copy(
    object: &Instance,
    worker: &Worker,
) -> Result<Option<kube::api::DynamicObject>, Error> {
    let copy = worker
        .provider_api(object.namespace().as_deref())?
        .get_opt(&object.name_any())
        .await
        .map_err(Error::Provider)?;
    let object_uid = object.metadata.uid.clone().unwrap_or_default();
    Ok(copy.filter(|c| {
        ownership::classify(c.annotations(), &worker.spec.local_uid, &object_uid) == Owner::Ours
    }))
}

/// Deletes exactly `copy` (its UID is the precondition: a foreign object re-created under the
/// name since is never deleted), unless its deletion runs already; counted as `op`.
pub(in crate::worker) async fn delete_copy(
    object: &Instance,
    worker: &Worker,
    copy: &kube::api::DynamicObject,
    op: &str,
) -> Result<(), Error> {
    if copy.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: copy.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match worker
        .provider_api(object.namespace().as_deref())?
        .delete(&object.name_any(), &params)
        .await
    {
        Ok(_) => worker.count(op, "ok"),
        Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => {}
        Err(e) => {
            worker.count(op, result_label(&e));
            return Err(Error::Provider(e));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::super::fake;
    use super::super::super::record::SyncState;
    use kbind_shared::keys;
    use kbind_shared::sync::Locked;
    use kube::runtime::controller::Action;
    use serde_json::{Value, json};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    fn deleted(annotations: Value) -> kbind_shared::cache::Instance {
        fake::widget(
            json!({ "finalizers": [keys::SYNCER_FINALIZER], "annotations": annotations,
                "deletionTimestamp": "2026-12-06T00:00:00Z" }),
            Value::Null,
        )
    }

    #[tokio::test]
    async fn a_deleted_object_deletes_exactly_its_copy_then_lets_go() {
        let widget = fake::widget_path("team-a", "w", "");
        let gone = Arc::new(AtomicBool::new(false));
        let copy_gone = gone.clone();
        let provider_widget = widget.clone();
        let (provider, on_provider) = fake::server(move |method, path| {
            if path != provider_widget {
                return None;
            }
            match method {
                "GET" if copy_gone.load(Ordering::SeqCst) => {
                    Some(fake::status(404, "NotFound", "gone"))
                }
                "GET" => Some((200, our_copy())),
                "DELETE" => Some((
                    200,
                    json!({ "kind": "Status", "apiVersion": "v1", "status": "Success" }),
                )),
                _ => None,
            }
        });
        let (consumer, on_consumer) = fake::server(move |method, path| {
            (method == "PATCH" && path == widget)
                .then(|| (200, json!({ "metadata": { "resourceVersion": "11" } })))
        });
        let worker = fake::worker(consumer, provider).await;
        let object = deleted(json!({}));
        worker.mark(&object, Some(SyncState::Synced));

        // The copy first, by its UID (a foreign object created under the name since is safe) …
        let action = super::delete(&object, &worker).await.unwrap();
        assert_eq!(action, Action::requeue(Duration::from_secs(2)));
        let calls = fake::calls(&on_provider);
        let asked: Vec<&str> = calls.iter().map(|c| c.method.as_str()).collect();
        assert_eq!(asked, ["GET", "DELETE"], "a fresh read, then the delete");
        assert_eq!(calls[1].body["preconditions"]["uid"], "copy-uid");
        assert!(
            fake::calls(&on_consumer).is_empty(),
            "the finalizer stays while the copy exists"
        );

        // … and only once it is gone, the finalizer.
        gone.store(true, Ordering::SeqCst);
        let action = super::delete(&object, &worker).await.unwrap();
        assert_eq!(action, Action::await_change());
        let released = fake::calls(&on_consumer);
        assert_eq!(released.len(), 1, "{released:?}");
        assert_eq!(
            released[0].body["metadata"]["finalizers"],
            json!([]),
            "{:?}",
            released[0].body
        );
        assert_eq!(
            fake::calls(&on_provider).len(),
            3,
            "one more read, no more deletes"
        );
        assert_eq!(worker.tracked.locked().counts().synced, 0);
    }

    /// The provider copy of `team-a/w`, marked as this consumer's.
    fn our_copy() -> Value {
        json!({ "apiVersion": "example.org/v1", "kind": "Widget",
            "metadata": { "name": "w", "namespace": "team-a", "uid": "copy-uid",
                "annotations": { keys::CONSUMER_CLUSTER_UID_ANNOTATION: "consumer-uid",
                    keys::CONSUMER_OBJECT_UID_ANNOTATION: "w-uid" } } })
    }

    /// A provider answering the GET of the copy `w` as ours, and `write` (`DELETE` or `PATCH`)
    /// with `code`.
    fn our_copy_answering(write: &'static str, code: u16) -> (kube::Client, fake::Requests) {
        let widget = fake::widget_path("team-a", "w", "");
        fake::server(move |method, path| {
            if path != widget {
                return None;
            }
            match method {
                "GET" => Some((200, our_copy())),
                m if m == write && code < 300 => Some((
                    200,
                    json!({ "kind": "Status", "apiVersion": "v1", "status": "Success" }),
                )),
                m if m == write => {
                    let reason = match code {
                        404 => "NotFound",
                        409 => "Conflict",
                        _ => "InternalError",
                    };
                    Some(fake::status(code, reason, "answered"))
                }
                _ => None,
            }
        })
    }

    #[tokio::test]
    async fn a_copy_gone_or_replaced_meanwhile_is_no_error_and_anything_else_is() {
        // The delete is by UID: NotFound (gone) and Conflict (another object under the name now)
        // both mean ours is not there — looked at again, not failed. A 500 is a failure.
        for (code, fails) in [(404, false), (409, false), (500, true)] {
            let (provider, on_provider) = our_copy_answering("DELETE", code);
            let (consumer, _) = fake::server(|_, _| None);
            let worker = fake::worker(consumer, provider).await;
            let result = super::delete(&deleted(json!({})), &worker).await;
            assert_eq!(result.is_err(), fails, "{code}: {result:?}");
            let asked: Vec<String> = fake::calls(&on_provider)
                .into_iter()
                .map(|c| c.method)
                .collect();
            assert_eq!(asked, ["GET", "DELETE"], "{code}");
        }
    }

    #[tokio::test]
    async fn an_unbound_object_to_orphan_is_unmarked_on_the_provider_never_deleted() {
        // Unbound (not deleted) with the Orphan policy: its copy loses kbind's markers, and the
        // finalizer waits until the copy no longer reads as ours. A copy gone or changed
        // meanwhile is looked at again, not failed; a 500 is a failure.
        for (code, fails) in [(200, false), (404, false), (409, false), (500, true)] {
            let (provider, on_provider) = our_copy_answering("PATCH", code);
            let (consumer, on_consumer) = fake::server(|_, _| None);
            let worker = fake::worker(consumer, provider).await;
            let object = fake::widget(
                json!({ "finalizers": [keys::SYNCER_FINALIZER],
                    "annotations": { keys::DELETION_POLICY_ANNOTATION: keys::DELETION_POLICY_ORPHAN } }),
                Value::Null,
            );
            let result = super::release(&object, &worker).await;
            match result {
                Ok(action) => {
                    assert!(!fails, "{code}");
                    assert_eq!(
                        action,
                        Action::requeue(Duration::from_millis(500)),
                        "{code}"
                    );
                }
                Err(e) => assert!(fails, "{code}: {e}"),
            }
            let calls = fake::calls(&on_provider);
            let asked: Vec<&str> = calls.iter().map(|c| c.method.as_str()).collect();
            assert_eq!(asked, ["GET", "PATCH"], "{code}: unmarked, not deleted");
            assert!(
                fake::calls(&on_consumer).is_empty(),
                "the finalizer stays for now"
            );
        }
    }

    #[tokio::test]
    async fn an_orphaned_object_is_let_go_without_a_word_to_the_provider() {
        let widget = fake::widget_path("team-a", "w", "");
        let (provider, on_provider) = fake::server(|_, _| None);
        let (consumer, on_consumer) = fake::server(move |method, path| {
            (method == "PATCH" && path == widget)
                .then(|| (200, json!({ "metadata": { "resourceVersion": "11" } })))
        });
        let worker = fake::worker(consumer, provider).await;
        let object =
            deleted(json!({ keys::DELETION_POLICY_ANNOTATION: keys::DELETION_POLICY_ORPHAN }));

        let action = super::delete(&object, &worker).await.unwrap();
        assert_eq!(action, Action::await_change());
        assert!(fake::calls(&on_provider).is_empty());
        assert_eq!(fake::calls(&on_consumer).len(), 1);
    }
}
