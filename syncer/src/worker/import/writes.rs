//! Import's writes on the consumer: creating a mirror, bringing one back to its provider object,
//! deleting one — each fenced, guarded by the version read, counted, and saying what it left.

use std::sync::Arc;

use kbind_shared::cache::{Instance, Json, ProviderCopy};
use kbind_shared::sync::Locked;
use kbind_shared::{delivery, keys};
use kube::api::{DeleteParams, DynamicObject, Patch, PostParams, Preconditions, TypeMeta};
use serde_json::json;

use super::super::pending::{self, Key};
use super::super::state::Worker;
use super::super::writes::{consumer_patch, result_label};

/// A write done: the object's key, what it left, and — when every request succeeded — the digest
/// it wrote with the resourceVersion that left.
pub(super) type Done = (Key, Left, Option<(u64, String)>);

/// What a write leaves for the next look to know of the object.
pub(super) enum Left {
    /// Import wrote its spec: the generation that left.
    Spec(Option<i64>),
    /// Nothing new (a status write, a failure: the next look tries again).
    Same,
    /// Its creation was refused: tried again after [`plan::RETRY_AFTER`].
    Refused,
    /// It is gone.
    Gone,
}

/// One write of a plan, with what it needs.
pub(super) enum Op {
    /// Create the mirror of a provider object, with its status (and the digest of both).
    Create(Arc<ProviderCopy>, Option<serde_json::Value>, u64),
    /// Bring a mirror back to its provider object: the spec and the status to write, if any.
    Mirror {
        object: Arc<Instance>,
        spec: Option<Option<serde_json::Value>>,
        status: Option<Option<serde_json::Value>>,
        revert: bool,
        digest: u64,
    },
    /// Delete a mirror, if it is still the one read (UID and resourceVersion).
    Delete(Arc<Instance>),
}

impl Op {
    /// Makes the write; returns the object's key, what it left, and — when every request
    /// succeeded — the digest it wrote with the resourceVersion that left.
    pub(super) async fn run(self, worker: &Worker) -> Done {
        match self {
            Op::Create(copy, status, digest) => {
                let (key, left, version) = create(worker, &copy, status).await;
                (key, left, version.map(|v| (digest, v)))
            }
            Op::Mirror {
                object,
                spec,
                status,
                revert,
                digest,
            } => {
                let (key, left, version) = mirror(worker, &object, spec, status, revert).await;
                (key, left, version.map(|v| (digest, v)))
            }
            Op::Delete(object) => {
                let left = if delete(worker, &object).await {
                    Left::Gone
                } else {
                    Left::Same
                };
                (pending::key(object.as_ref()), left, None)
            }
        }
    }
}

/// Logs and counts a write's outcome.
fn counted<T>(
    worker: &Worker,
    what: &str,
    name: &str,
    result: Result<T, kube::Error>,
) -> Option<T> {
    match result {
        Ok(value) => {
            worker.count("import", "ok");
            Some(value)
        }
        Err(e) => {
            let label = result_label(&e);
            worker.count("import", label);
            tracing::debug!(api = %worker.spec.api, object = %name, error = %e, "import: {what} failed; the next look tries again");
            if label == "forbidden" {
                *worker.import_refused.locked() = Some(format!(
                    "kbind may not {what} imported {} on the consumer: {}",
                    worker.spec.api,
                    kbind_shared::conditions::bounded(&e.to_string(), 300)
                ));
            }
            None
        }
    }
}

/// What a creation or a mirror's update leaves: the object's key, what is known of it, and the
/// resourceVersion its last write left when every request succeeded.
type Wrote = (Key, Left, Option<String>);

async fn create(worker: &Worker, copy: &ProviderCopy, status: Option<serde_json::Value>) -> Wrote {
    let key = (
        copy.namespace.as_deref().map(str::to_owned),
        copy.name.to_string(),
    );
    let spec = &worker.spec;
    let mut body = json!({
        "metadata": {
            "name": &*copy.name,
            "labels": { keys::IMPORTED_LABEL: spec.connection },
        },
    });
    if let Some(namespace) = &copy.namespace {
        body["metadata"]["namespace"] = json!(namespace);
    }
    if let Some(s) = &copy.spec {
        body["spec"] = s.value();
    }
    if !spec.has_status_subresource
        && let Some(status) = &status
    {
        body["status"] = status.clone();
    }
    let mut object: DynamicObject = match serde_json::from_value(body) {
        Ok(object) => object,
        Err(e) => {
            tracing::warn!(api = %spec.api, error = %e, "import: cannot build the mirror");
            return (key, Left::Same, None);
        }
    };
    object.types = Some(TypeMeta {
        api_version: spec.resource.api_version.clone(),
        kind: spec.resource.kind.clone(),
    });
    if worker.fence().is_err() {
        return (key, Left::Same, None);
    }
    let params = PostParams {
        field_manager: Some(keys::FIELD_MANAGER.into()),
        ..Default::default()
    };
    let api = worker.consumer_api(copy.namespace.as_deref());
    let result = api.create(&params, &object).await;
    // Someone made it meanwhile (this look's cache was behind): the next look sees it.
    let exists = matches!(&result, Err(kube::Error::Api(s)) if s.reason == "AlreadyExists");
    let Some(created) = counted(worker, "create", &copy.name, result) else {
        let left = if exists { Left::Same } else { Left::Refused };
        return (key, left, None);
    };
    let left = Left::Spec(created.metadata.generation);
    let mut version = created.metadata.resource_version;
    if spec.has_status_subresource
        && let Some(status) = status
    {
        let patch = json!({
            "metadata": { "resourceVersion": version },
            "status": status,
        });
        let written = api
            .patch_status(&copy.name, &consumer_patch(), &Patch::Merge(&patch))
            .await;
        version = counted(worker, "status", &copy.name, written)
            .and_then(|w| w.metadata.resource_version);
    }
    (key, left, version)
}

async fn mirror(
    worker: &Worker,
    object: &Instance,
    spec: Option<Option<serde_json::Value>>,
    status: Option<Option<serde_json::Value>>,
    revert: bool,
) -> Wrote {
    let key = pending::key(object);
    let name = object.metadata.name.as_deref().unwrap_or_default();
    let api = worker.consumer_api(object.metadata.namespace.as_deref());
    let mut version = object.metadata.resource_version.clone();
    let mut left = Left::Same;
    if let Some(desired) = spec {
        let current = object.spec.as_ref().map(Json::value).unwrap_or(json!({}));
        let diff = kbind_shared::ownership::merge_patch(&current, &desired.unwrap_or(json!({})));
        let patch = json!({ "metadata": { "resourceVersion": version }, "spec": diff });
        if worker.fence().is_err() {
            return (key, left, None);
        }
        let written = api
            .patch(name, &consumer_patch(), &Patch::Merge(&patch))
            .await;
        let Some(written) = counted(worker, "spec", name, written) else {
            return (key, left, None);
        };
        version = written.metadata.resource_version;
        left = Left::Spec(written.metadata.generation);
        if revert {
            worker
                .warn(
                    object,
                    "ImportedObjectReverted",
                    format!(
                        "this object mirrors the provider's and is read-only until claimed: the edit was reverted (annotate {}=true to take it over)",
                        keys::CLAIM_ANNOTATION
                    ),
                )
                .await;
        }
    }
    if let Some(desired) = status
        && worker.spec.has_status_subresource
    {
        let current = object.status.as_ref().map(Json::value).unwrap_or(json!({}));
        let desired = desired.unwrap_or(json!({}));
        let mut diff = kbind_shared::ownership::merge_patch(&current, &desired);
        delivery::set_record_whole(&mut diff, delivery::record_of(Some(&desired)));
        let patch = json!({ "metadata": { "resourceVersion": version }, "status": diff });
        if worker.fence().is_err() {
            return (key, left, None);
        }
        let written = api
            .patch_status(name, &consumer_patch(), &Patch::Merge(&patch))
            .await;
        version =
            counted(worker, "status", name, written).and_then(|w| w.metadata.resource_version);
    }
    (key, left, version)
}

/// Whether the mirror is gone.
async fn delete(worker: &Worker, object: &Instance) -> bool {
    let name = object.metadata.name.as_deref().unwrap_or_default();
    let params = DeleteParams {
        // Only the mirror read: not one claimed (or re-created) since.
        preconditions: Some(Preconditions {
            uid: object.metadata.uid.clone(),
            resource_version: object.metadata.resource_version.clone(),
        }),
        ..Default::default()
    };
    if worker.fence().is_err() {
        return false;
    }
    let deleted = worker
        .consumer_api(object.metadata.namespace.as_deref())
        .delete(name, &params)
        .await;
    counted(worker, "delete", name, deleted.map(|_| ())).is_some()
}
