//! The action on a dead heartbeat's targets, within the delete budget, and the whole check of a
//! namespace before it is deleted.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use kbind_shared::api::reaper::ReaperPolicySpec;
use kbind_shared::rate::Bucket;
use kbind_shared::sync::Locked;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, Preconditions,
};
use kube::discovery::{Discovery, Scope};
use kube::{Api, ResourceExt};

use super::super::Action;
use super::super::attribution::Judge;
use super::super::facts;
use super::census::{Census, Group, Kind};
use super::{FIELD_MANAGER, PAGE, Reaper};

/// How long the kinds discovered for a namespace's whole check are reused.
const DISCOVERY_TTL: Duration = Duration::from_secs(300);
/// Objects Kubernetes itself puts in every namespace: never a reason to keep one.
const SYSTEM_OBJECTS: [(&str, &str, &str); 2] = [
    ("", "serviceaccounts", "default"),
    ("", "configmaps", "kube-root-ca.crt"),
];

impl Reaper {
    /// Acts on the targets of the heartbeats in `acting`, within the delete budget; namespaces
    /// only of heartbeats with nothing else left, and only when the namespace holds nothing but
    /// that heartbeat's objects. Acted targets leave `census`. Returns whether work remains (the
    /// budget ran out).
    pub(super) async fn act(
        &self,
        policy: &str,
        spec: &ReaperPolicySpec,
        kinds: &[Kind],
        census: &mut Census,
        judged: &BTreeMap<Group, Judge>,
        acting: &HashMap<&Judge, (Action, bool)>,
    ) -> bool {
        let per_minute = f64::from(spec.deletes_per_minute.max(1));
        let targets = std::mem::take(&mut census.targets);
        let mut remaining = Vec::new();
        let mut out_of_budget = false;
        for target in targets {
            let Some(judge) = judged.get(&target.group) else {
                continue;
            };
            let (Some(&(action, only_namespaces)), Some(kind)) =
                (acting.get(judge), kinds.get(target.kind))
            else {
                continue;
            };
            if out_of_budget {
                remaining.push(target);
                continue;
            }
            let is_namespace = kind.name == "namespaces";
            if is_namespace && !only_namespaces {
                remaining.push(target);
                continue;
            }
            if is_namespace
                && action == Action::Delete
                && !self
                    .namespace_holds_only(&target.name, judge, judged, spec)
                    .await
            {
                continue;
            }
            let allowed = {
                let mut budget = self.budget.locked();
                let now = Instant::now();
                let bucket = budget.get_or_insert_with(|| Bucket::full(per_minute, now));
                bucket.take(now, per_minute, per_minute / 60.0)
            };
            if !allowed {
                out_of_budget = true;
                remaining.push(target);
                continue;
            }
            let api: Api<DynamicObject> = match (&target.namespace, kind.namespaced) {
                (Some(ns), true) => Api::namespaced_with(self.client.clone(), ns, &kind.resource),
                _ => Api::all_with(self.client.clone(), &kind.resource),
            };
            let result = match action {
                Action::Delete => {
                    let params = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: Some(target.object_uid.clone()),
                            resource_version: Some(target.version.clone())
                                .filter(|v| !v.is_empty()),
                        }),
                        ..Default::default()
                    };
                    api.delete(&target.name, &params).await.map(|_| ())
                }
                Action::Orphan => {
                    let patch = orphan_patch(&target.object_uid, &target.version);
                    let params = PatchParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..Default::default()
                    };
                    api.patch(&target.name, &params, &patch).await.map(|_| ())
                }
                // (Grants are revoked by the sweep, never per target.)
                Action::Report | Action::Revoke => Ok(()),
            };
            let action_name = match action {
                Action::Delete => "Delete",
                Action::Orphan => "Orphan",
                Action::Report => "Report",
                Action::Revoke => "Revoke",
            };
            match result {
                Ok(()) => {
                    tracing::info!(policy, consumer = %target.group.0, heartbeat = ?target.group.1, api = %kind.name, namespace = ?target.namespace, name = %target.name, action = action_name, "reaped");
                    self.metrics
                        .reaper_objects_total
                        .with_label_values(&[policy, &kind.name, action_name])
                        .inc();
                    census.acted(&target, &kind.name, action);
                }
                // Gone: nothing to do.
                Err(kube::Error::Api(s)) if s.is_not_found() => {
                    census.acted(&target, &kind.name, Action::Orphan);
                }
                // Replaced by another object of the same name, or written since it was read:
                // the next full read judges it afresh.
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    tracing::debug!(policy, api = %kind.name, namespace = ?target.namespace, name = %target.name, "changed since it was read: left for a fresh read");
                }
                Err(e) => {
                    tracing::warn!(policy, consumer = %target.group.0, api = %kind.name, name = %target.name, error = %e, "could not reap");
                }
            }
        }
        census.targets = remaining;
        out_of_budget
    }

    /// Whether the namespace holds nothing but objects `judge` answers for (unprotected) and
    /// what Kubernetes puts in every namespace — checked whole: every namespaced kind the
    /// provider serves that can be listed, by metadata. Anything else (another consumer's
    /// object, a protected one, a Pod, a kind the reaper may not list) keeps the namespace.
    pub(super) async fn namespace_holds_only(
        &self,
        namespace: &str,
        judge: &Judge,
        judged: &BTreeMap<Group, Judge>,
        spec: &ReaperPolicySpec,
    ) -> bool {
        let resources = match self.namespaced_kinds().await {
            Ok(resources) => resources,
            Err(e) => {
                tracing::warn!(namespace, error = %e, "namespace kept: its kinds could not be discovered");
                return false;
            }
        };
        for resource in &resources {
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), namespace, resource);
            let mut params = ListParams::default().limit(PAGE);
            loop {
                let page = match api.list_metadata(&params).await {
                    Ok(page) => page,
                    Err(e) => {
                        tracing::info!(namespace, kind = %resource.plural, error = %e, "namespace kept: its objects could not be read");
                        return false;
                    }
                };
                let other = page.items.iter().find(|o| {
                    let meta = &o.metadata;
                    let system = SYSTEM_OBJECTS.iter().any(|(group, plural, name)| {
                        resource.group == *group
                            && resource.plural == *plural
                            && meta.name.as_deref() == Some(*name)
                    });
                    let ours = facts::consumer_uid(meta).is_some_and(|uid| {
                        let group = (
                            uid.to_owned(),
                            facts::heartbeat_record(meta).map(str::to_owned),
                        );
                        judged.get(&group) == Some(judge)
                    }) && !facts::is_protected(meta, &spec.protect_label);
                    !system && !ours
                });
                if let Some(other) = other {
                    tracing::info!(namespace, kind = %resource.plural, object = %other.name_any(), "namespace kept: it holds an object that is not the dead heartbeat's, or is protected");
                    return false;
                }
                match page.metadata.continue_ {
                    Some(token) if !token.is_empty() => params = params.continue_token(&token),
                    _ => break,
                }
            }
        }
        true
    }

    /// Every namespaced kind the provider serves that can be listed (Events aside: a record of
    /// what happened, never a reason to keep a namespace), from aggregated discovery, reused for
    /// [`DISCOVERY_TTL`].
    async fn namespaced_kinds(&self) -> Result<Vec<ApiResource>, String> {
        if let Some((at, kinds)) = self.discovered.locked().as_ref()
            && at.elapsed() < DISCOVERY_TTL
        {
            return Ok(kinds.clone());
        }
        let discovery = Discovery::new(self.client.clone())
            .run_aggregated()
            .await
            .map_err(|e| format!("discovery: {e}"))?;
        let kinds: Vec<ApiResource> = discovery
            .groups()
            .flat_map(|group| group.recommended_resources())
            .filter(|(resource, caps)| {
                caps.scope == Scope::Namespaced
                    && caps.supports_operation(kube::discovery::verbs::LIST)
                    && resource.plural != "events"
            })
            .map(|(resource, _)| resource)
            .collect();
        *self.discovered.locked() = Some((Instant::now(), kinds.clone()));
        Ok(kinds)
    }
}

/// The patch that orphans an object ([`kbind_shared::ownership::unmark_patch`]).
fn orphan_patch(object_uid: &str, version: &str) -> Patch<serde_json::Value> {
    let mut patch = kbind_shared::ownership::unmark_patch(object_uid);
    if !version.is_empty() {
        // Optimistic concurrency: an object written since it was read is not orphaned.
        patch["metadata"]["resourceVersion"] = serde_json::json!(version);
    }
    Patch::Merge(patch)
}

/// Whether, of a heartbeat's objects per API, only namespaces (and protected objects, which are
/// never acted on) are left.
pub(super) fn only_namespaces_left(objects: &BTreeMap<String, u64>) -> bool {
    objects
        .iter()
        .all(|(api, n)| *n == 0 || api == "namespaces" || api == "protected")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_orphaning_is_for_the_object_as_it_was_read() {
        let Patch::Merge(patch) = orphan_patch("u-1", "42") else {
            panic!("a merge patch");
        };
        assert_eq!(patch["metadata"]["uid"], "u-1");
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        assert!(patch["metadata"]["labels"][kbind_shared::keys::MANAGED_LABEL].is_null());
        let Patch::Merge(unversioned) = orphan_patch("u-1", "") else {
            panic!("a merge patch");
        };
        assert!(unversioned["metadata"].get("resourceVersion").is_none());
        let mut objects =
            BTreeMap::from([("namespaces".to_owned(), 2), ("protected".to_owned(), 1)]);
        assert!(only_namespaces_left(&objects));
        objects.insert("widgets.example.org".to_owned(), 1);
        assert!(!only_namespaces_left(&objects));
        objects.insert("widgets.example.org".to_owned(), 0);
        assert!(only_namespaces_left(&objects));
    }
}
