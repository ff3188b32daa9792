//! The objects a sweep reads: the kinds a policy covers, the marked objects of each counted per
//! group (consumer UID and heartbeat record) by metadata only, and the targets the action may
//! take — kept between sweeps while the action spends its delete budget.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_shared::api::reaper::{ReaperPolicy, ReaperPolicySpec};
use kbind_shared::keys;
use kbind_shared::sync::Locked;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, ResourceExt};

use super::super::Action;
use super::super::attribution::Heartbeats;
use super::super::facts;
use super::{PAGE, Reaper};

/// At most this many consumer UIDs are followed per sweep; objects of more are counted as
/// untracked (a condition says so) and never acted on.
pub(super) const MAX_CONSUMERS: usize = 10_000;

/// One kind of object the reaper reads: a copy's API, related Secrets/ConfigMaps, namespaces.
#[derive(Clone)]
pub(super) struct Kind {
    /// How it is named in the status and metrics (`widgets.example.com`, `secrets`, …).
    pub(super) name: String,
    pub(super) resource: ApiResource,
    pub(super) namespaced: bool,
    /// Where it is read; empty: everywhere.
    pub(super) namespaces: Vec<String>,
}

/// A group of objects: one consumer UID, and the heartbeat record they carry (if any).
pub(super) type Group = (String, Option<String>);

/// An object the reaper may act on.
#[derive(Clone)]
pub(super) struct Target {
    pub(super) kind: usize,
    pub(super) namespace: Option<String>,
    pub(super) name: String,
    pub(super) object_uid: String,
    /// Its `resourceVersion` when read: the action's precondition, so that an object written
    /// since (re-recorded by a live Connection, say) is left for a fresh read to judge.
    pub(super) version: String,
    pub(super) group: Group,
}

/// What the objects say, per group.
#[derive(Default, Clone)]
pub(super) struct Census {
    pub(super) objects: BTreeMap<Group, BTreeMap<String, u64>>,
    /// Per group, how many of its counted objects are being deleted (not targets any more, but
    /// not gone either).
    pub(super) deleting: HashMap<Group, u64>,
    pub(super) targets: Vec<Target>,
    pub(super) untracked: u64,
}

impl Census {
    fn count(&mut self, group: &Group, what: &str) -> bool {
        if !self.objects.contains_key(group) && self.objects.len() >= MAX_CONSUMERS {
            self.untracked += 1;
            return false;
        }
        *self
            .objects
            .entry(group.clone())
            .or_default()
            .entry(what.to_owned())
            .or_default() += 1;
        true
    }

    /// An object acted on: counted as gone (an orphaned one) or as being deleted.
    pub(super) fn acted(&mut self, target: &Target, kind: &str, action: Action) {
        if let Some(n) = self
            .objects
            .get_mut(&target.group)
            .and_then(|apis| apis.get_mut(kind))
        {
            *n = n.saturating_sub(1);
        }
        if action == Action::Delete {
            *self.deleting.entry(target.group.clone()).or_default() += 1;
        }
    }
}

/// The targets of a full read, kept while they are acted on.
pub(super) struct Pending {
    pub(super) generation: Option<i64>,
    pub(super) read_at: Instant,
    pub(super) kinds: Vec<Kind>,
    pub(super) census: Census,
}

impl Reaper {
    /// The objects of a sweep: the targets kept from the last full read while they may still be
    /// acted on ([`Reaper::kept`]), else a full read of every kind the policy covers; the
    /// targets only of groups `eligible` heartbeats may answer for. Returns the kinds, the
    /// census, when it was read, and what could not be read.
    pub(super) async fn census(
        &self,
        policy: &ReaperPolicy,
        interval: Duration,
        heartbeats: &Heartbeats,
        eligible: &std::collections::BTreeSet<String>,
    ) -> (Vec<Kind>, Census, Instant, Vec<String>) {
        let name = policy.name_any();
        let generation = policy.metadata.generation;
        if let Some(kept) = self.kept(&name, generation, interval, !eligible.is_empty()) {
            return (kept.kinds, kept.census, kept.read_at, Vec::new());
        }
        let mut problems = Vec::new();
        let kinds = match self.kinds(policy).await {
            Ok(kinds) => kinds,
            Err(e) => {
                problems.push(e);
                Vec::new()
            }
        };
        let mut census = Census::default();
        let sole = sole_heartbeats(heartbeats);
        let may_act = |group: &Group| match &group.1 {
            Some(record) => eligible.contains(record.as_str()),
            None => sole
                .get(group.0.as_str())
                .is_some_and(|key| eligible.contains(*key)),
        };
        for (index, kind) in kinds.iter().enumerate() {
            if let Err(e) = self
                .read_objects(index, kind, &policy.spec, &may_act, &mut census)
                .await
            {
                problems.push(e);
            }
        }
        (kinds, census, Instant::now(), problems)
    }

    /// Keeps what is left to act on for the next sweep.
    pub(super) fn keep(&self, policy: &str, pending: Pending) {
        self.pending.locked().insert(policy.to_owned(), pending);
    }

    /// The targets of the last full read, when they may be acted on still: the same policy
    /// generation, read within `interval`, some heartbeat acting, and targets left. Taken: a
    /// sweep that still has work keeps them again.
    fn kept(
        &self,
        policy: &str,
        generation: Option<i64>,
        interval: Duration,
        acting: bool,
    ) -> Option<Pending> {
        let kept = self.pending.locked().remove(policy)?;
        (acting
            && kept.generation == generation
            && kept.read_at.elapsed() < interval
            && !kept.census.targets.is_empty())
        .then_some(kept)
    }

    /// The kinds a policy covers: the copies' APIs (named, or every exported CRD), then
    /// Secrets and ConfigMaps, then namespaces.
    async fn kinds(&self, policy: &ReaperPolicy) -> Result<Vec<Kind>, String> {
        let spec = &policy.spec;
        let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let chosen: Vec<CustomResourceDefinition> = if spec.apis.is_empty() {
            let selector = format!("{}={}", keys::EXPORTED_LABEL, keys::TRUE);
            crds.list(&ListParams::default().labels(&selector))
                .await
                .map_err(|e| format!("list exported CRDs: {e}"))?
                .items
        } else {
            let mut chosen = Vec::new();
            for api in &spec.apis {
                match crds.get_opt(api).await {
                    Ok(Some(crd)) => chosen.push(crd),
                    Ok(None) => {}
                    Err(e) => return Err(format!("read CRD {api}: {e}")),
                }
            }
            chosen
        };
        let mut kinds: Vec<Kind> = chosen
            .iter()
            .filter_map(|crd| {
                let spec = &crd.spec;
                let version = spec
                    .versions
                    .iter()
                    .find(|v| v.storage)
                    .or_else(|| spec.versions.iter().find(|v| v.served))?;
                let gvk =
                    kube::api::GroupVersionKind::gvk(&spec.group, &version.name, &spec.names.kind);
                Some(Kind {
                    name: format!("{}.{}", spec.names.plural, spec.group),
                    resource: ApiResource::from_gvk_with_plural(&gvk, &spec.names.plural),
                    namespaced: spec.scope == "Namespaced",
                    namespaces: Vec::new(),
                })
            })
            .collect();
        if spec.include_related {
            for (name, resource) in [
                ("secrets", ApiResource::erase::<Secret>(&())),
                ("configmaps", ApiResource::erase::<ConfigMap>(&())),
            ] {
                kinds.push(Kind {
                    name: name.into(),
                    resource,
                    namespaced: true,
                    namespaces: spec.related_namespaces.clone(),
                });
            }
        }
        if spec.include_namespaces {
            kinds.push(Kind {
                name: "namespaces".into(),
                resource: ApiResource::erase::<Namespace>(&()),
                namespaced: false,
                namespaces: Vec::new(),
            });
        }
        Ok(kinds)
    }

    /// Counts the marked objects of `kind` per group, page by page (nothing but the counts and
    /// the targets of groups that `may_act` is kept): metadata only, never a payload.
    async fn read_objects(
        &self,
        index: usize,
        kind: &Kind,
        spec: &ReaperPolicySpec,
        may_act: &(dyn Fn(&Group) -> bool + Sync),
        census: &mut Census,
    ) -> Result<(), String> {
        if kind.namespaces.is_empty() {
            let api = Api::all_with(self.client.clone(), &kind.resource);
            return self
                .read_from(api, index, kind, spec, may_act, census)
                .await;
        }
        for namespace in &kind.namespaces {
            let api = Api::namespaced_with(self.client.clone(), namespace, &kind.resource);
            self.read_from(api, index, kind, spec, may_act, census)
                .await?;
        }
        Ok(())
    }

    async fn read_from(
        &self,
        api: Api<DynamicObject>,
        index: usize,
        kind: &Kind,
        spec: &ReaperPolicySpec,
        may_act: &(dyn Fn(&Group) -> bool + Sync),
        census: &mut Census,
    ) -> Result<(), String> {
        let mut params = ListParams::default()
            .labels(&format!("{}={}", keys::MANAGED_LABEL, keys::TRUE))
            .limit(PAGE);
        loop {
            let page = api
                .list_metadata(&params)
                .await
                .map_err(|e| format!("list {}: {e}", kind.name))?;
            for object in &page.items {
                let meta = &object.metadata;
                let Some(consumer) = facts::consumer_uid(meta) else {
                    continue;
                };
                let group: Group = (
                    consumer.to_owned(),
                    facts::heartbeat_record(meta).map(str::to_owned),
                );
                if facts::is_protected(meta, &spec.protect_label) {
                    census.count(&group, "protected");
                    continue;
                }
                if !census.count(&group, &kind.name) {
                    continue;
                }
                if meta.deletion_timestamp.is_some() {
                    *census.deleting.entry(group.clone()).or_default() += 1;
                } else if may_act(&group) {
                    census.targets.push(Target {
                        kind: index,
                        namespace: meta.namespace.clone(),
                        name: object.name_any(),
                        object_uid: meta.uid.clone().unwrap_or_default(),
                        version: meta.resource_version.clone().unwrap_or_default(),
                        group,
                    });
                }
            }
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => return Ok(()),
            }
        }
    }
}

/// The one heartbeat each consumer UID has, for those with exactly one (its unrecorded objects
/// may be that one's: [`Heartbeats::judge`]).
fn sole_heartbeats(heartbeats: &Heartbeats) -> BTreeMap<&str, &str> {
    let mut count: BTreeMap<&str, (usize, &str)> = BTreeMap::new();
    for (key, uid) in &heartbeats.by_key {
        let entry = count.entry(uid.as_str()).or_insert((0, key.as_str()));
        entry.0 += 1;
    }
    count
        .into_iter()
        .filter(|(_, (n, _))| *n == 1)
        .map(|(uid, (_, key))| (uid, key))
        .collect()
}
