//! A worker's writes and what each leaves behind: the fence checked right before each, the
//! consumer's finalizer and conflict annotation, the provider namespace, Events, and the counts
//! and lags of `kbind_sync_operations_total` / `kbind_sync_lag_seconds`.

use kbind_shared::sync::Locked;

use k8s_openapi::api::core::v1::Namespace;
use kbind_shared::cache::Instance;
use kbind_shared::keys;
use kube::api::{Api, DynamicObject, ObjectMeta, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::pending;
use super::state::Worker;
use crate::namespaces;

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

    /// Every [`Error::metric_label`].
    pub const REASONS: [&'static str; 2] = ["consumer", "provider"];
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

/// The parameters of kbind's merge patches of consumer objects (finalizer, conflict annotation,
/// status): its own field manager, so that `managedFields` — and `kubectl kbind diff` — tell
/// kbind's fields apart from those of the user's clients.
pub(super) fn consumer_patch() -> PatchParams {
    PatchParams {
        field_manager: Some(keys::FIELD_MANAGER.into()),
        ..Default::default()
    }
}

impl Worker {
    /// Records, for the write of `op` that just delivered a change, the delay from the change to
    /// now in `kbind_sync_lag_seconds` and `kbind_sync_latency_seconds`: one observation per
    /// delivering write. The change began at the earlier of kbind's `receipt` of it and the API
    /// server's `recorded` time of it ([`pending::change_start`]); neither known (a drift repaired
    /// at a resync): zero.
    pub(super) fn lag(
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
    pub(super) fn fence(&self) -> Result<(), Error> {
        if self.ctx.membership.is_current() {
            Ok(())
        } else {
            Err(Error::Fenced)
        }
    }

    pub(super) fn consumer_api(&self, namespace: Option<&str>) -> Api<DynamicObject> {
        kbind_shared::dynamic::scoped(&self.ctx.client, namespace, &self.spec.resource)
    }

    /// A merge patch of `object`'s status subresource (`patch` holds `status`, and may hold a
    /// `metadata.resourceVersion` precondition), as kbind's field manager.
    pub(super) async fn patch_status(
        &self,
        object: &Instance,
        patch: &serde_json::Value,
    ) -> Result<DynamicObject, kube::Error> {
        self.consumer_api(object.metadata.namespace.as_deref())
            .patch_status(
                object.metadata.name.as_deref().unwrap_or_default(),
                &consumer_patch(),
                &Patch::Merge(patch),
            )
            .await
    }

    /// The API of the provider copies of consumer objects in `namespace` (mapped into the
    /// Connection's boundary, #51).
    pub(super) fn provider_api(
        &self,
        namespace: Option<&str>,
    ) -> Result<Api<DynamicObject>, Error> {
        let namespace = self.provider_namespace(namespace)?;
        Ok(kbind_shared::dynamic::scoped(
            &self.provider,
            namespace.as_deref(),
            &self.spec.resource,
        ))
    }

    /// The provider namespace of consumer namespace `namespace`. A name too long to map is
    /// refused as the provider's API server would refuse the namespace (422), naming the limit.
    pub(super) fn provider_namespace(
        &self,
        namespace: Option<&str>,
    ) -> Result<Option<String>, Error> {
        self.spec
            .namespaces
            .provider_opt(namespace)
            .map_err(|e| Error::Provider(e.to_error()))
    }

    pub(super) fn count(&self, op: &str, result: &str) {
        self.ctx
            .metrics
            .sync_operations_total
            .with_label_values(&[self.spec.api.as_str(), op, result])
            .inc();
    }

    pub(super) async fn warn(&self, object: &Instance, reason: &str, note: String) {
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

    /// Sets the object's finalizers — recording `pin` as its route in the same write, when given
    /// (#36: before the first write to a route).
    pub(super) async fn set_finalizers(
        &self,
        object: &Instance,
        finalizers: Vec<String>,
        pin: Option<String>,
    ) -> Result<(), Error> {
        let mut patch = kbind_shared::finalizers::patch(&object.metadata, &finalizers);
        if let Some(pin) = pin {
            patch["metadata"]["annotations"] = json!({ keys::ROUTE_ANNOTATION: pin });
        }
        self.fence()?;
        match self
            .consumer_api(object.namespace().as_deref())
            .patch(&object.name_any(), &consumer_patch(), &Patch::Merge(&patch))
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

    pub(super) async fn set_conflict(
        &self,
        object: &Instance,
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
            .patch(&object.name_any(), &consumer_patch(), &Patch::Merge(&patch))
            .await
            .map(|written| self.wrote(object, &written))
            .map_err(Error::Consumer)
    }

    /// kbind wrote `object` (as the cache showed it), and the API server answered `written`.
    pub(super) fn wrote(&self, object: &Instance, written: &kube::api::DynamicObject) {
        self.tracked.locked().wrote(
            &pending::key(object),
            object.metadata.resource_version.as_deref(),
            written.metadata.resource_version.as_deref(),
        );
    }

    /// Whether the provider's status of `object` is too large to copy (`Some(size)`): a Warning
    /// Event the first time, and counted; nothing once it fits again.
    pub(super) async fn note_oversized(&self, object: &Instance, size: Option<usize>) {
        let news = self
            .tracked
            .locked()
            .status_too_large(&pending::key(object), size.is_some());
        let (true, Some(size)) = (news, size) else {
            return;
        };
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
    pub(super) fn forget_namespace(&self, namespace: &str) {
        self.known_namespaces.locked().remove(namespace);
    }

    /// LIM-26: create the provider namespace of consumer namespace `namespace` only when it
    /// does not exist. In a boundary (#51) it carries the boundary's label, and once kbind has
    /// created it, the first write waits (at most 10 s) until the issuer has granted it —
    /// and its watch starts at once.
    pub(super) async fn ensure_provider_namespace(
        &self,
        namespace: &str,
    ) -> Result<(), kube::Error> {
        if self.known_namespaces.locked().contains(namespace) {
            return Ok(());
        }
        let consumer = namespace;
        let mapped = self
            .spec
            .namespaces
            .provider(namespace)
            .map_err(|e| e.to_error())?;
        let namespace = mapped.as_str();
        // KEY-4: on instance-created provider namespaces the consumer UID is a label.
        let object = Namespace {
            metadata: ObjectMeta {
                name: Some(namespace.to_owned()),
                labels: Some(self.spec.namespaces.labelled([
                    (keys::MANAGED_LABEL.to_owned(), keys::TRUE.to_owned()),
                    (
                        keys::CONSUMER_CLUSTER_UID_ANNOTATION.to_owned(),
                        self.spec.local_uid.clone(),
                    ),
                ])),
                annotations: Some(
                    [(keys::HEARTBEAT_ANNOTATION.to_owned(), self.spec.heartbeat())].into(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        let created = namespaces::create_if_missing(&self.provider, &object).await?;
        if created && self.spec.namespaces.boundary().is_some() {
            self.until_granted(namespace).await;
            self.created_provider_namespace(consumer);
        }
        self.known_namespaces.locked().insert(consumer.to_owned());
        Ok(())
    }

    /// Waits (at most 10 s) until the credential may list the API in `namespace` — a boundary's
    /// namespace is granted by the issuer once it exists.
    async fn until_granted(&self, namespace: &str) {
        let api =
            kbind_shared::dynamic::scoped(&self.provider, Some(namespace), &self.spec.resource);
        let params = kube::api::ListParams::default().limit(1);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match api.list_metadata(&params).await {
                Err(kube::Error::Api(s)) if s.is_forbidden() => {}
                _ => return,
            }
            if tokio::time::Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_failed_sync_is_counted_under_a_reason_initialized_at_start() {
        for error in [
            Error::Consumer(api(500, "InternalError")),
            Error::Provider(api(500, "InternalError")),
        ] {
            let label = error.metric_label().unwrap();
            assert!(Error::REASONS.contains(&label), "{label}");
        }
        assert_eq!(Error::Fenced.metric_label(), None);
    }

    fn api(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            reason: reason.into(),
            ..kube::core::Status::failure(reason, reason)
        }))
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
