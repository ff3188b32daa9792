//! One sweep of `kbind-reaper` over one policy, on the provider: take the API server's time from
//! the reaper's own Lease, read the consumers' heartbeat Leases and the objects kbind marked as
//! theirs, decide per consumer ([`super::decide`]), act within the delete budget, and write the
//! policy's status and the metrics. The I/O edge; the decisions are in `super` and
//! [`super::facts`].
//!
//! Nothing is acted on after a sweep that could not read everything it needed: a Lease that
//! could not be read must not make a live consumer look dead.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_shared::api::reaper::ReaperPolicy;
use kbind_shared::conditions::{self, Desired};
use kbind_shared::keys;
use kbind_shared::metrics::Metrics;
use kbind_shared::rate::Bucket;
use kbind_shared::sync::Locked;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, Preconditions,
};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use super::facts::{self, ConsumerView, LeaseSeen};
use super::{Action, Facts, State};

/// The reaper's own Lease, whose renewal the API server stamps: the sweep's "now".
pub const CLOCK_LEASE: &str = "kbind-reaper-clock";
/// The field manager of the reaper's writes.
pub const FIELD_MANAGER: &str = "kbind-reaper";
const PAGE: u32 = 500;
/// At most this many consumer UIDs are followed per sweep; objects of more are counted as
/// untracked (a condition says so) and never acted on.
const MAX_CONSUMERS: usize = 10_000;
/// At most this many UIDs are remembered as having had a Lease.
const MAX_REMEMBERED: usize = 100_000;

/// The reaper: its clients and what it remembers between sweeps.
pub struct Reaper {
    client: Client,
    namespace: String,
    identity: String,
    metrics: Metrics,
    /// Added to the host's clock wherever the reaper reads it (tests: a host hours off must not
    /// change any verdict, since none uses the host's clock).
    host_clock_offset: jiff::SignedDuration,
    /// Consumer UIDs seen with a Lease: a Lease deleted since still means "had a heartbeat".
    had_lease: std::sync::Mutex<HashSet<String>>,
    budget: std::sync::Mutex<Option<Bucket>>,
}

/// One kind of object the reaper reads: a copy's API, related Secrets/ConfigMaps, namespaces.
struct Kind {
    /// How it is named in the status and metrics (`widgets.example.com`, `secrets`, …).
    name: String,
    resource: ApiResource,
    namespaced: bool,
    /// A copy's API (a namespace's occupancy is checked against these).
    copy: bool,
}

/// An object the reaper may act on.
struct Target {
    kind: usize,
    namespace: Option<String>,
    name: String,
    object_uid: String,
    consumer: String,
}

/// What the objects say, per consumer.
#[derive(Default)]
struct Census {
    objects: HashMap<String, BTreeMap<String, u64>>,
    /// Per consumer, how many of its counted objects are being deleted (not targets any more,
    /// but not gone either).
    deleting: HashMap<String, u64>,
    targets: Vec<Target>,
    untracked: u64,
}

impl Census {
    fn count(&mut self, consumer: &str, what: &str) {
        if !self.objects.contains_key(consumer) && self.objects.len() >= MAX_CONSUMERS {
            self.untracked += 1;
            return;
        }
        *self
            .objects
            .entry(consumer.to_owned())
            .or_default()
            .entry(what.to_owned())
            .or_default() += 1;
    }
}

impl Reaper {
    /// A reaper acting through `client` (the provider), its clock Lease in `namespace`.
    pub fn new(
        client: Client,
        namespace: String,
        identity: String,
        metrics: Metrics,
        host_clock_offset: jiff::SignedDuration,
    ) -> Self {
        Self {
            client,
            namespace,
            identity,
            metrics,
            host_clock_offset,
            had_lease: Default::default(),
            budget: Default::default(),
        }
    }

    /// Renews the reaper's own Lease and returns the time the API server recorded for it (its
    /// `managedFields` entry), in seconds: every time compared is the server's.
    pub async fn server_now(&self) -> Result<i64, String> {
        let host_now = jiff::Timestamp::now()
            .checked_add(self.host_clock_offset)
            .map_err(|e| format!("host clock: {e}"))?;
        let body = json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": { "name": CLOCK_LEASE },
            "spec": {
                "holderIdentity": self.identity,
                // The host's clock, written for people; never read back as a time.
                "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(host_now),
            },
        });
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let lease = leases
            .patch(
                CLOCK_LEASE,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map_err(|e| format!("renew Lease {}/{CLOCK_LEASE}: {e}", self.namespace))?;
        facts::written_at(&lease.metadata, &["f:spec", "f:renewTime"]).ok_or_else(|| {
            format!(
                "Lease {}/{CLOCK_LEASE} came back without a server-stamped time",
                self.namespace
            )
        })
    }

    /// Sweeps `policy` once; returns when to sweep again (at most `interval`).
    pub async fn sweep(&self, policy: &ReaperPolicy, interval: Duration) -> Duration {
        let name = policy.name_any();
        let now = match self.server_now().await {
            Ok(now) => now,
            Err(error) => {
                // Without the server's time nothing can be decided, or stamped.
                tracing::warn!(policy = %name, %error, "sweep skipped");
                return interval.min(Duration::from_secs(10));
            }
        };
        let generation = policy.metadata.generation;
        let settings = match super::policy_of(&policy.spec) {
            Ok(settings) => settings,
            Err(message) => {
                let desired = Desired::new("Ready", false, "InvalidPolicy", message);
                self.write_status(policy, &[], now, desired).await;
                return interval;
            }
        };
        let spec = &policy.spec;
        let mut problems: Vec<String> = Vec::new();

        // The heartbeats.
        let mut leases: Vec<LeaseSeen> = Vec::new();
        for namespace in &spec.lease_namespaces {
            match self.read_leases(namespace).await {
                Ok(found) => leases.extend(found),
                Err(e) => problems.push(e),
            }
        }
        let mut by_consumer: BTreeMap<String, Vec<LeaseSeen>> = BTreeMap::new();
        for lease in leases {
            by_consumer
                .entry(lease.uid.clone())
                .or_default()
                .push(lease);
        }
        self.remember(by_consumer.keys());
        let longest = by_consumer
            .values()
            .flatten()
            .map(|l| l.duration_secs)
            .max()
            .unwrap_or(1);
        let mut policy_checked = settings;
        let mut warning = None;
        let lease_duration = Duration::from_secs(u64::try_from(longest).unwrap_or(1));
        if let Err(e) = super::validate(&settings, lease_duration) {
            // Too short for these heartbeats: reported only, never acted on.
            policy_checked.action = Action::Report;
            warning = Some(format!("{e}; acting as Report"));
        }

        // Who may be acted on, by their Leases alone.
        let lease_facts: BTreeMap<&str, super::LeaseFacts> = by_consumer
            .iter()
            .filter_map(|(uid, leases)| facts::combine(leases).map(|f| (uid.as_str(), f)))
            .collect();
        let eligible: HashSet<&str> = lease_facts
            .iter()
            .filter(|(_, lease)| {
                let probe = Facts {
                    now,
                    lease: Some(**lease),
                    lease_ever_seen: true,
                    objects: 1,
                };
                super::decide(&probe, &policy_checked).act.is_some()
            })
            .map(|(uid, _)| *uid)
            .collect();

        // The objects.
        let kinds = match self.kinds(policy).await {
            Ok(kinds) => kinds,
            Err(e) => {
                problems.push(e);
                Vec::new()
            }
        };
        let mut census = Census::default();
        for (index, kind) in kinds.iter().enumerate() {
            if let Err(e) = self
                .read_objects(index, kind, spec, &eligible, &mut census)
                .await
            {
                problems.push(e);
            }
        }

        // The decisions.
        let uids: BTreeSet<&str> = by_consumer
            .keys()
            .map(String::as_str)
            .chain(census.objects.keys().map(String::as_str))
            .collect();
        let had_lease = self.had_lease.locked().clone();
        let mut views: Vec<ConsumerView> = uids
            .into_iter()
            .map(|uid| {
                let objects = census.objects.get(uid).cloned().unwrap_or_default();
                let count: u64 = objects
                    .iter()
                    .filter(|(api, _)| api.as_str() != "protected")
                    .map(|(_, n)| n)
                    .sum();
                let leases = by_consumer.get(uid).map(Vec::as_slice).unwrap_or_default();
                let step = super::decide(
                    &Facts {
                        now,
                        lease: lease_facts.get(uid).copied(),
                        lease_ever_seen: had_lease.contains(uid),
                        objects: count,
                    },
                    &policy_checked,
                );
                ConsumerView {
                    uid: uid.to_owned(),
                    step,
                    connections: leases.iter().filter_map(|l| l.connection.clone()).collect(),
                    leases: leases.iter().map(|l| l.name.clone()).collect(),
                    renewed: lease_facts.get(uid).map(|l| l.renewed),
                    objects,
                }
            })
            .collect();

        // The action, only on complete facts.
        let complete = problems.is_empty();
        // A consumer with only namespaces left, each kept (it holds another's or a protected
        // object), has nothing left to act on: Reaped, not Reaping for ever. Checked only then,
        // and again every sweep — the namespace is acted on once it holds only the consumer's.
        if complete {
            for view in views
                .iter_mut()
                .filter(|v| v.step.act == Some(Action::Delete) && only_namespaces_left(&v.objects))
            {
                // A namespace being deleted is not gone yet: still Reaping.
                let mut left = census.deleting.get(&view.uid).copied().unwrap_or(0);
                for target in census.targets.iter().filter(|t| {
                    t.consumer == view.uid
                        && kinds.get(t.kind).is_some_and(|k| k.name == "namespaces")
                }) {
                    if self
                        .namespace_holds_only(&kinds, &target.name, &view.uid, spec)
                        .await
                    {
                        left += 1;
                    }
                }
                if left == 0 {
                    view.step = super::decide(
                        &Facts {
                            now,
                            lease: lease_facts.get(view.uid.as_str()).copied(),
                            lease_ever_seen: had_lease.contains(view.uid.as_str()),
                            objects: 0,
                        },
                        &policy_checked,
                    );
                }
            }
        }
        let mut more_to_do = false;
        if complete {
            let acting: HashMap<&str, (Action, bool)> = views
                .iter()
                .filter_map(|v| {
                    let action = v.step.act?;
                    // Namespaces go last: once nothing else of the consumer is left.
                    Some((v.uid.as_str(), (action, only_namespaces_left(&v.objects))))
                })
                .collect();
            more_to_do = self
                .act(&name, spec, &kinds, &census.targets, &acting)
                .await;
        }

        // The status and the metrics.
        let desired = if !complete {
            Desired::new(
                "Ready",
                false,
                "ReadFailed",
                format!(
                    "nothing was acted on in this sweep: {}",
                    problems.join("; ")
                ),
            )
        } else if let Some(warning) = warning {
            Desired::new("Ready", false, "StaleAfterTooShort", warning)
        } else if census.untracked > 0 {
            Desired::new(
                "Ready",
                false,
                "TooManyConsumers",
                format!(
                    "{} objects of consumers beyond the first {MAX_CONSUMERS} were not looked at",
                    census.untracked
                ),
            )
        } else {
            Desired::new("Ready", true, "Swept", "")
        };
        self.write_status(policy, &views, now, desired).await;
        self.metrics
            .reaper_last_sweep_timestamp_seconds
            .with_label_values(&[&name])
            .set(now as f64);
        for state in facts::STATES {
            let n = views.iter().filter(|v| v.step.state == state).count();
            self.metrics
                .reaper_consumers
                .with_label_values(&[&name, facts::state_name(state)])
                .set(n as f64);
        }
        tracing::debug!(policy = %name, consumers = views.len(), generation, "swept");

        // When to look again: the next state change, at the exact second; soon while acting.
        if more_to_do {
            return interval.min(Duration::from_secs(1));
        }
        let next = views
            .iter()
            .filter_map(|v| v.step.next)
            .map(|at| at.saturating_sub(now))
            .min();
        match next {
            Some(secs) => {
                interval.min(Duration::from_secs(u64::try_from(secs).unwrap_or(0).max(1)))
            }
            None => interval,
        }
    }

    fn remember<'a>(&self, uids: impl Iterator<Item = &'a String>) {
        let mut had = self.had_lease.locked();
        for uid in uids {
            if had.len() < MAX_REMEMBERED {
                had.insert(uid.clone());
            }
        }
    }

    /// Remembers the consumers a policy's status says had a Lease (after a restart).
    pub fn seed(&self, policy: &ReaperPolicy) {
        let listed = policy.status.iter().flat_map(|s| &s.consumers);
        let had: Vec<String> = listed
            .filter(|c| c.state != facts::state_name(State::NoLease))
            .map(|c| c.uid.clone())
            .collect();
        self.remember(had.iter());
    }

    async fn read_leases(&self, namespace: &str) -> Result<Vec<LeaseSeen>, String> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), namespace);
        let mut params = ListParams::default()
            .labels(&format!("{}={}", keys::MANAGED_LABEL, keys::TRUE))
            .limit(PAGE);
        let mut found = Vec::new();
        loop {
            let page = api
                .list(&params)
                .await
                .map_err(|e| format!("list Leases in {namespace}: {e}"))?;
            found.extend(
                page.items
                    .iter()
                    .filter_map(|l| facts::lease_seen(namespace, l)),
            );
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => return Ok(found),
            }
        }
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
                    copy: true,
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
                    copy: false,
                });
            }
        }
        if spec.include_namespaces {
            kinds.push(Kind {
                name: "namespaces".into(),
                resource: ApiResource::erase::<Namespace>(&()),
                namespaced: false,
                copy: false,
            });
        }
        Ok(kinds)
    }

    /// Counts the marked objects of `kind` per consumer, page by page (nothing but the counts and
    /// the eligible consumers' targets is kept).
    async fn read_objects(
        &self,
        index: usize,
        kind: &Kind,
        spec: &kbind_shared::api::reaper::ReaperPolicySpec,
        eligible: &HashSet<&str>,
        census: &mut Census,
    ) -> Result<(), String> {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &kind.resource);
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
                if facts::is_protected(meta, &spec.protect_label) {
                    census.count(consumer, "protected");
                    continue;
                }
                census.count(consumer, &kind.name);
                if meta.deletion_timestamp.is_some() && census.objects.contains_key(consumer) {
                    *census.deleting.entry(consumer.to_owned()).or_default() += 1;
                }
                if eligible.contains(consumer) && meta.deletion_timestamp.is_none() {
                    census.targets.push(Target {
                        kind: index,
                        namespace: meta.namespace.clone(),
                        name: object.name_any(),
                        object_uid: meta.uid.clone().unwrap_or_default(),
                        consumer: consumer.to_owned(),
                    });
                }
            }
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => return Ok(()),
            }
        }
    }

    /// Acts on the targets of the consumers in `acting`, within the delete budget; namespaces
    /// only of consumers with nothing else left, and only when no copy there is another's,
    /// unmarked or protected. Returns whether work remains (the budget ran out).
    async fn act(
        &self,
        policy: &str,
        spec: &kbind_shared::api::reaper::ReaperPolicySpec,
        kinds: &[Kind],
        targets: &[Target],
        acting: &HashMap<&str, (Action, bool)>,
    ) -> bool {
        let per_minute = f64::from(spec.deletes_per_minute.max(1));
        for target in targets {
            let Some(&(action, only_namespaces)) = acting.get(target.consumer.as_str()) else {
                continue;
            };
            let Some(kind) = kinds.get(target.kind) else {
                continue;
            };
            let is_namespace = kind.name == "namespaces";
            if is_namespace && !only_namespaces {
                continue;
            }
            if is_namespace
                && action == Action::Delete
                && !self
                    .namespace_holds_only(kinds, &target.name, &target.consumer, spec)
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
                return true;
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
                            resource_version: None,
                        }),
                        ..Default::default()
                    };
                    api.delete(&target.name, &params).await.map(|_| ())
                }
                Action::Orphan => {
                    let patch = orphan_patch(&target.object_uid);
                    let params = PatchParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..Default::default()
                    };
                    api.patch(&target.name, &params, &patch).await.map(|_| ())
                }
                Action::Report => Ok(()),
            };
            let action_name = match action {
                Action::Delete => "Delete",
                Action::Orphan => "Orphan",
                Action::Report => "Report",
            };
            match result {
                Ok(()) => {
                    tracing::info!(policy, consumer = %target.consumer, api = %kind.name, namespace = ?target.namespace, name = %target.name, action = action_name, "reaped");
                    self.metrics
                        .reaper_objects_total
                        .with_label_values(&[policy, &kind.name, action_name])
                        .inc();
                }
                // Gone, or replaced by another object of the same name: nothing to do.
                Err(kube::Error::Api(s)) if s.is_not_found() || s.code == 409 => {}
                Err(e) => {
                    tracing::warn!(policy, consumer = %target.consumer, api = %kind.name, name = %target.name, error = %e, "could not reap");
                }
            }
        }
        false
    }

    /// Whether the namespace holds, among the copies' APIs, nothing but `consumer`'s unprotected
    /// objects — and is not protected itself.
    async fn namespace_holds_only(
        &self,
        kinds: &[Kind],
        namespace: &str,
        consumer: &str,
        spec: &kbind_shared::api::reaper::ReaperPolicySpec,
    ) -> bool {
        for kind in kinds.iter().filter(|k| k.copy && k.namespaced) {
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), namespace, &kind.resource);
            let mut params = ListParams::default().limit(PAGE);
            loop {
                let page = match api.list_metadata(&params).await {
                    Ok(page) => page,
                    Err(e) => {
                        tracing::warn!(namespace, api = %kind.name, error = %e, "namespace kept: its objects could not be read");
                        return false;
                    }
                };
                let foreign = page.items.iter().find(|o| {
                    facts::consumer_uid(&o.metadata) != Some(consumer)
                        || facts::is_protected(&o.metadata, &spec.protect_label)
                });
                if let Some(other) = foreign {
                    tracing::info!(namespace, api = %kind.name, object = %other.name_any(), "namespace kept: it holds an object that is not the dead consumer's, or is protected");
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

    async fn write_status(
        &self,
        policy: &ReaperPolicy,
        views: &[ConsumerView],
        now: i64,
        desired: Desired<'_>,
    ) {
        let generation = policy.metadata.generation;
        let mut conditions = policy
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        if let Some(at) = facts::time(now) {
            conditions::set(&mut conditions, desired, generation, &at);
        }
        let status = facts::status(views, now, generation, conditions);
        let mut value = serde_json::to_value(&status).unwrap_or_default();
        if let Some(object) = value.as_object_mut() {
            // A merge patch keeps what it does not mention: an emptied list is written as such.
            for key in ["observedGeneration", "conditions", "lastSweep", "consumers"] {
                object.entry(key).or_insert(serde_json::Value::Null);
            }
        }
        let api: Api<ReaperPolicy> = Api::all(self.client.clone());
        if let Err(e) = api
            .patch_status(
                &policy.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": value })),
            )
            .await
        {
            tracing::warn!(policy = %policy.name_any(), error = %e, "status not written");
        }
    }
}

/// The patch that orphans an object ([`kbind_shared::ownership::unmark_patch`]).
fn orphan_patch(object_uid: &str) -> Patch<serde_json::Value> {
    Patch::Merge(kbind_shared::ownership::unmark_patch(object_uid))
}

/// Whether, of a consumer's objects per API, only namespaces (and protected objects, which are
/// never acted on) are left.
fn only_namespaces_left(objects: &BTreeMap<String, u64>) -> bool {
    objects
        .iter()
        .all(|(api, n)| *n == 0 || api == "namespaces" || api == "protected")
}
