//! The related worker's writes: a copy created, updated, replaced or deleted, and the provider
//! namespace a copy needs. Each is decided by `plan` first.

use k8s_openapi::api::core::v1::Namespace;
use kbind_shared::api::RelatedResourceKind;
use kbind_shared::identity::describe_error;
use kbind_shared::keys;
use kbind_shared::sync::Locked;
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, Preconditions};

use super::plan::{self, Entry, Item, Marker, Side, Step, TargetKey, Wanted};
use super::state::{KINDS, SIDES, Worker};
use super::summary::Outcome;
use super::watch::{item, resource};
use crate::namespaces;

impl Worker {
    pub(super) async fn copy(
        &self,
        key: &TargetKey,
        want: &Wanted,
        marker: &Marker<'_>,
        policy: kbind_shared::api::ConflictPolicy,
        outcome: &mut Outcome,
    ) {
        let mut existing = self.target(key);
        let mut decided = plan::step(existing.as_ref(), key.side, want, marker, policy);
        if existing.is_none() {
            // Not among our labelled copies: it may still exist without our label.
            let read = match self.api(key.kind.0, key.side, &key.namespace) {
                Ok(api) => api.get_opt(&key.name).await,
                Err(e) => Err(e),
            };
            match read {
                Ok(Some(mut found)) => {
                    // Held under the consumer's namespace, as the caches hold copies (#51).
                    found.metadata.namespace = Some(key.namespace.clone());
                    existing = Some(item(&found));
                    decided = plan::step(existing.as_ref(), key.side, want, marker, policy);
                }
                Ok(None) => {}
                Err(e) => return self.failed(outcome, format!("read {key}"), &e),
            }
        }
        if !self.ctx.membership.is_current() {
            return;
        }
        match decided {
            Step::Nothing => outcome.in_sync += 1,
            Step::Conflict(why) => {
                outcome.conflicts.insert(key.clone(), why);
            }
            Step::Create => {
                if let Err(e) = self.ensure_namespace(key.side, &key.namespace).await {
                    return self.failed(
                        outcome,
                        format!(
                            "prepare namespace {} on the {}",
                            key.namespace,
                            key.side.as_str()
                        ),
                        &e,
                    );
                }
                match self.apply(key, want, marker, Write::CreateOnly).await {
                    Ok(()) => outcome.in_sync += 1,
                    // Something appeared under the name since the read: the next pass classifies
                    // it; it is never forced over.
                    Err(e) if kbind_shared::apply::exists(&e) => {
                        outcome.errors.push((
                            false,
                            format!(
                                "{key} appeared while kbind was creating it; checking it again"
                            ),
                        ));
                    }
                    Err(kube::Error::Api(s)) if s.is_not_found() && key.side == Side::Consumer => {
                        outcome.errors.push((
                            false,
                            format!(
                                "{key} waits for namespace {} to exist on the consumer (kbind creates no consumer namespaces)",
                                key.namespace
                            ),
                        ));
                    }
                    Err(e) => {
                        if matches!(&e, kube::Error::Api(s) if s.is_not_found()) {
                            // The provider namespace went away: create it again next time.
                            self.known_namespaces
                                .locked()
                                .remove(&(key.side, key.namespace.clone()));
                        }
                        self.failed(outcome, format!("write {key}"), &e)
                    }
                }
            }
            Step::Adopt | Step::Apply => {
                let adopted =
                    decided == Step::Adopt || existing.as_ref().is_some_and(plan::Item::adopted);
                let write = if adopted { Write::Adopted } else { Write::Ours };
                match self.apply(key, want, marker, write).await {
                    Ok(()) => outcome.in_sync += 1,
                    // A field the API server will not change in place (an immutable Secret's
                    // data, a Secret's type): replace our copy — only one kbind created.
                    Err(kube::Error::Api(s))
                        if s.code == 422
                            && !adopted
                            && existing
                                .as_ref()
                                .is_some_and(|e| e.copied_by() == Some(marker.binding_uid)) =>
                    {
                        self.replace(key, want, marker, existing.as_ref(), outcome)
                            .await
                    }
                    Err(e) => self.failed(outcome, format!("write {key}"), &e),
                }
            }
            Step::Replace => {
                self.replace(key, want, marker, existing.as_ref(), outcome)
                    .await
            }
        }
    }

    async fn apply(
        &self,
        key: &TargetKey,
        want: &Wanted,
        marker: &Marker<'_>,
        write: Write,
    ) -> Result<(), kube::Error> {
        let mut body = plan::copy_body(key, want, marker, write == Write::Adopted);
        if write == Write::CreateOnly {
            kbind_shared::apply::create_only(&mut body);
        }
        if key.side == Side::Provider {
            body["metadata"]["namespace"] =
                serde_json::Value::from(self.on_side(key.side, &key.namespace)?);
        }
        self.api(key.kind.0, key.side, &key.namespace)?
            .patch(
                &key.name,
                &PatchParams::apply(keys::RELATED_FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map(drop)
    }

    /// An immutable copy whose source changed is deleted (only that very object: its UID is the
    /// precondition) and created again from the source.
    async fn replace(
        &self,
        key: &TargetKey,
        want: &Wanted,
        marker: &Marker<'_>,
        existing: Option<&Item>,
        outcome: &mut Outcome,
    ) {
        if let Some(existing) = existing {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(existing.uid.clone()),
                    resource_version: None,
                }),
                ..Default::default()
            };
            let deleted = match self.api(key.kind.0, key.side, &key.namespace) {
                Ok(api) => api.delete(&key.name, &params).await.map(|_| ()),
                Err(e) => Err(e),
            };
            match deleted {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.is_not_found() => {}
                Err(e) => return self.failed(outcome, format!("replace {key}"), &e),
            }
        }
        tracing::info!(target = %key, "replaced an immutable related copy whose source changed");
        match self.apply(key, want, marker, Write::CreateOnly).await {
            Ok(()) => outcome.in_sync += 1,
            Err(e) => self.failed(outcome, format!("write {key}"), &e),
        }
    }

    pub(super) async fn delete(
        &self,
        kind: RelatedResourceKind,
        side: Side,
        garbage: &Item,
        outcome: &mut Outcome,
    ) {
        if !self.ctx.membership.is_current() {
            return;
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(garbage.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        let deleted = match self.api(kind, side, &garbage.namespace) {
            Ok(api) => api.delete(&garbage.name, &params).await.map(|_| ()),
            Err(e) => Err(e),
        };
        match deleted {
            Ok(_) => tracing::info!(
                kind = plan::kind_name(kind),
                side = side.as_str(),
                namespace = %garbage.namespace,
                name = %garbage.name,
                "deleted a related copy no entry selects any more"
            ),
            Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => {}
            Err(e) => self.failed(
                outcome,
                format!(
                    "delete {} {}/{} on the {}",
                    plan::kind_name(kind),
                    garbage.namespace,
                    garbage.name,
                    side.as_str()
                ),
                &e,
            ),
        }
    }

    /// Copies of kinds and sides that no entry targets any more (an entry was removed) are not
    /// watched; they are found by one labelled LIST when the worker starts (it restarts on every
    /// spec change) and on later passes until that succeeds.
    pub(super) async fn sweep_unused_kinds(&self, entries: &[Entry], outcome: &mut Outcome) {
        if *self.swept_unused.locked() {
            return;
        }
        let mut complete = true;
        for kind in KINDS {
            for side in SIDES {
                let targeted = entries
                    .iter()
                    .any(|e| e.kind == kind && plan::sides(e.direction).1 == side);
                if targeted {
                    continue;
                }
                let scope = match self.spec.namespace.as_deref() {
                    Some(namespace) => match self.on_side(side, namespace) {
                        Ok(mapped) => Some(mapped),
                        Err(_) => continue,
                    },
                    None => None,
                };
                let api = kbind_shared::dynamic::scoped(
                    self.client(side),
                    scope.as_deref(),
                    &resource(kind),
                );
                let list = api
                    .list(
                        &ListParams::default()
                            .labels(&super::watch::target_selector(side, &self.spec.local_uid)),
                    )
                    .await;
                match list {
                    Ok(list) => {
                        for mut object in list.items {
                            if side == Side::Provider {
                                // Held under the consumer's namespace (#51).
                                let namespace =
                                    object.metadata.namespace.clone().unwrap_or_default();
                                let Some(consumer) = self.spec.namespaces.consumer(&namespace)
                                else {
                                    continue;
                                };
                                object.metadata.namespace = Some(consumer.to_owned());
                            }
                            let copy = item(&object);
                            if copy.copied_by() == Some(self.spec.uid.as_str()) && !copy.adopted() {
                                self.delete(kind, side, &copy, outcome).await;
                            }
                        }
                    }
                    // Credentials that may not list a kind no entry uses cannot have made copies
                    // of it either.
                    Err(kube::Error::Api(s)) if s.is_forbidden() => {}
                    Err(e) => {
                        tracing::debug!(error = %describe_error(&e), "cannot look for copies of removed entries");
                        complete = false;
                    }
                }
            }
        }
        *self.swept_unused.locked() = complete;
    }

    /// LIM-26-like: a provider namespace is created only when a GET says it is missing. Consumer
    /// namespaces are never created (safe by default): a copy waits until its namespace exists.
    async fn ensure_namespace(&self, side: Side, namespace: &str) -> Result<(), kube::Error> {
        if side == Side::Consumer {
            return Ok(());
        }
        let known = (side, namespace.to_owned());
        if self.known_namespaces.locked().contains(&known) {
            return Ok(());
        }
        let mapped = self.on_side(side, namespace)?;
        let object = Namespace {
            metadata: ObjectMeta {
                name: Some(mapped),
                labels: Some(
                    self.spec
                        .namespaces
                        .labelled([(keys::MANAGED_LABEL.to_owned(), keys::TRUE.to_owned())]),
                ),
                annotations: Some(
                    [
                        (
                            keys::CONSUMER_CLUSTER_UID_ANNOTATION.to_owned(),
                            self.spec.local_uid.clone(),
                        ),
                        (
                            keys::HEARTBEAT_ANNOTATION.to_owned(),
                            kbind_shared::heartbeat::record(
                                self.spec.kubeconfig.namespace(),
                                &self.spec.connection,
                                &self.spec.local_uid,
                            ),
                        ),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces::create_if_missing(self.client(side), &object).await?;
        self.known_namespaces.locked().insert(known);
        Ok(())
    }
}

/// How a related copy is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Write {
    /// Nothing exists under the name: create only (see `kbind_shared::apply`).
    CreateOnly,
    /// Update kbind's own copy.
    Ours,
    /// Update an object kbind took over under `Adopt`, keeping that mark.
    Adopted,
}
