//! One sweep of `kbind-reaper` over one policy, on the provider, in stages: read the consumers'
//! heartbeat Leases, take the API server's time from the reaper's own Lease, update the reaper's
//! record of what it observed ([`super::memory`], kept by [`record`]), read the objects kbind
//! marked as a consumer's or keep the targets of the last read while acting ([`census`]), judge
//! each by the heartbeat of the Connection that wrote it ([`super::attribution`]), decide per
//! heartbeat ([`super::decide`]), act within the delete budget ([`act`]), and write the policy's
//! status, the record and the metrics. The I/O edge; the decisions are in `super` and its pure
//! modules.
//!
//! Nothing is acted on after a sweep that could not read everything it needed: a Lease that
//! could not be read must not make a live consumer look dead.

mod act;
mod census;
mod record;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kbind_shared::api::reaper::{ReaperPolicy, ReaperPolicySpec};
use kbind_shared::conditions::{self, Desired};
use kbind_shared::keys;
use kbind_shared::metrics::Metrics;
use kbind_shared::rate::Bucket;
use kbind_shared::sync::Locked;
use kube::api::{ApiResource, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use super::attribution::{Heartbeats, Judge};
use super::facts::{self, ConsumerView, LeaseSeen};
use super::memory::{MAX_REMEMBERED, Memory};
use super::{Action, Facts, Heartbeat, Observed, Policy, State, Step};
use census::{Census, Group, MAX_CONSUMERS, Pending};
pub use record::MEMORY_CONFIGMAP;

/// The reaper's own Lease, whose renewal the API server stamps: the sweep's "now".
pub const CLOCK_LEASE: &str = "kbind-reaper-clock";
/// The field manager of the reaper's writes.
pub const FIELD_MANAGER: &str = "kbind-reaper";
const PAGE: u32 = 500;

/// The reaper: its clients and what it remembers between sweeps.
pub struct Reaper {
    client: Client,
    namespace: String,
    identity: String,
    metrics: Metrics,
    /// Added to the host's clock wherever the reaper reads it (tests: a host hours off must not
    /// change any verdict, since none uses the host's clock).
    host_clock_offset: jiff::SignedDuration,
    /// Per policy: the record of what this reaper observed ([`Memory`]), and the text of it last
    /// written to [`MEMORY_CONFIGMAP`].
    memory: std::sync::Mutex<HashMap<String, (Memory, String)>>,
    /// Per policy: the targets of the last full read, kept while the action runs so that a sweep
    /// spending the delete budget re-reads only the Leases.
    pending: std::sync::Mutex<HashMap<String, Pending>>,
    discovered: std::sync::Mutex<Option<(Instant, Vec<ApiResource>)>>,
    budget: std::sync::Mutex<Option<Bucket>>,
}

/// The heartbeats a sweep read, as the reaper observed them.
struct Seen {
    /// Which Lease speaks for which consumer, and where the policy reads.
    heartbeats: Heartbeats,
    /// Per Lease (`<namespace>/<name>`): what the reaper observed of it, and the Lease.
    observed: BTreeMap<String, (Observed, LeaseSeen)>,
    /// Leases beyond what the record holds (never judged stale).
    unremembered: u64,
    /// Each Grant's boundary (#51) → the Grant and whether it is revoked (`grants: true` only;
    /// a boundary two Grants compute is nobody's to revoke).
    grants: BTreeMap<String, (String, bool)>,
}

impl Seen {
    /// The decision for the heartbeat `key` (a Lease the sweep did not read is gone).
    fn decide(&self, key: &str, objects: u64, now: i64, policy: &Policy) -> Step {
        let heartbeat = match self.observed.get(key) {
            Some((seen, _)) => Heartbeat::Seen(*seen),
            None => Heartbeat::Gone,
        };
        let namespace = key.split_once('/').map(|(ns, _)| ns).unwrap_or_default();
        super::decide(
            &Facts {
                now,
                heartbeat,
                objects,
                grant: self
                    .grants
                    .get(namespace)
                    .map(|(_, revoked)| super::Revoked(*revoked)),
            },
            policy,
        )
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
            memory: Default::default(),
            pending: Default::default(),
            discovered: Default::default(),
            budget: Default::default(),
        }
    }

    /// Drops what this process remembers (a new term as leader): the record is read again from
    /// [`MEMORY_CONFIGMAP`], where the previous leader left it.
    pub fn forget(&self) {
        self.memory.locked().clear();
        self.pending.locked().clear();
    }

    /// Renews the reaper's own Lease and returns the time the API server recorded for it (its
    /// `managedFields` entry), in seconds: every time compared is the server's.
    pub async fn server_now(&self) -> Result<i64, String> {
        let host_now = crate::clock::host_now(self.host_clock_offset);
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
        if let Err(error) = self.restore(&name).await {
            // Without the record, a grace could restart short of where it was: nothing is decided.
            tracing::warn!(policy = %name, %error, "sweep skipped");
            return interval.min(Duration::from_secs(10));
        }
        let spec = &policy.spec;
        // The heartbeats, read before "now" is taken: a renewal seen was written before it.
        let (grants, mut problems) = self.read_grants(spec).await;
        let (leases, complete, unread) = self.read_heartbeats(spec, &grants).await;
        problems.extend(unread);
        let now = match self.server_now().await {
            Ok(now) => now,
            Err(error) => {
                // Without the server's time nothing can be decided, or stamped.
                tracing::warn!(policy = %name, %error, "sweep skipped");
                return interval.min(Duration::from_secs(10));
            }
        };
        let (settings, warning) = match checked(spec, &leases) {
            Ok(checked) => checked,
            Err(message) => {
                let desired = Desired::new("Ready", false, "InvalidPolicy", message);
                self.write_status(policy, &[], now, desired).await;
                return interval;
            }
        };
        let seen = self.observe(&name, spec, leases, &complete, now, grants);
        // Which heartbeats' copies may be acted on, by their Leases alone.
        let eligible: BTreeSet<String> = seen
            .observed
            .keys()
            .filter(|key| seen.decide(key, 1, now, &settings).act.is_some())
            .cloned()
            .collect();
        let (kinds, mut census, read_at, unread) = self
            .census(policy, interval, &seen.heartbeats, &eligible)
            .await;
        problems.extend(unread);
        let judged = self.judge(&name, &seen, &census);
        let mut views = views(&judged, &census, &seen, now, &settings);

        // The action, only on complete facts.
        let mut more_to_do = false;
        if problems.is_empty() {
            self.settle_namespaces(
                &mut views, &judged, &census, &kinds, &seen, now, &settings, spec,
            )
            .await;
            self.revoke(&name, &views, &seen).await;
            let acting: HashMap<&Judge, (Action, bool)> = views
                .iter()
                .filter(|(_, v)| v.step.act != Some(Action::Revoke))
                .filter_map(|(judge, v)| {
                    // Namespaces go last: once nothing else of the heartbeat's is left.
                    Some((judge, (v.step.act?, act::only_namespaces_left(&v.objects))))
                })
                .collect();
            more_to_do = self
                .act(&name, spec, &kinds, &mut census, &judged, &acting)
                .await;
        }
        let untracked = census.untracked;
        if more_to_do {
            let generation = policy.metadata.generation;
            self.keep(
                &name,
                Pending {
                    generation,
                    read_at,
                    kinds,
                    census,
                },
            );
        }

        // The record, with each heartbeat's stale mark; written only when it changed.
        self.mark_stale(&name, &views);
        let unrecorded = self.persist(&name).await.err();
        let views: Vec<ConsumerView> = views.into_iter().map(|(_, v)| v).collect();
        let desired = readiness(&problems, unrecorded, warning, untracked, seen.unremembered);
        self.write_status(policy, &views, now, desired).await;
        self.count(&name, &views, now);

        // When to look again: the next state change, at the exact second; while acting, when
        // the delete budget has a token again.
        if more_to_do {
            let per_minute = f64::from(spec.deletes_per_minute.max(1));
            let refill = Duration::from_secs_f64(60.0 / per_minute);
            return interval.min(refill.max(Duration::from_millis(100)));
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

    /// With `grants: true`, every Grant's boundary (computed from its spec, as the issuer does —
    /// never from a status) with the Grant's name and whether it is revoked; what could not be
    /// read.
    async fn read_grants(
        &self,
        spec: &ReaperPolicySpec,
    ) -> (BTreeMap<String, (String, bool)>, Vec<String>) {
        if !spec.grants {
            return (BTreeMap::new(), Vec::new());
        }
        let api: Api<kbind_shared::api::iam::Grant> = Api::all(self.client.clone());
        let grants = match api.list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(e) => return (BTreeMap::new(), vec![format!("list Grants: {e}")]),
        };
        (boundaries(&grants), Vec::new())
    }

    /// Revokes the Grants of the heartbeats whose step says so (#51): `spec.revoked: true`, one
    /// patch each, naming the reaper as its field manager; nothing else of them is touched.
    async fn revoke(&self, policy: &str, views: &[(Judge, ConsumerView)], seen: &Seen) {
        let api: Api<kbind_shared::api::iam::Grant> = Api::all(self.client.clone());
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        for (judge, view) in views {
            let (Judge::Heartbeat(key), Some(Action::Revoke)) = (judge, view.step.act) else {
                continue;
            };
            let namespace = key.split_once('/').map(|(ns, _)| ns).unwrap_or_default();
            let Some((grant, false)) = seen.grants.get(namespace) else {
                continue;
            };
            let patch = Patch::Merge(json!({ "spec": { "revoked": true } }));
            match api.patch(grant, &params, &patch).await {
                Ok(_) => {
                    tracing::info!(policy, grant = %grant, consumer = %view.uid, "revoked a stale consumer's Grant");
                    self.metrics
                        .reaper_objects_total
                        .with_label_values(&[policy, "grants.iam.kbind.io", "Revoke"])
                        .inc();
                }
                Err(e) => {
                    tracing::warn!(policy, grant = %grant, error = %e, "could not revoke");
                }
            }
        }
    }

    /// Every heartbeat Lease in the policy's namespaces and the Grants' boundaries; the
    /// namespaces read whole; what could not be read.
    async fn read_heartbeats(
        &self,
        spec: &ReaperPolicySpec,
        grants: &BTreeMap<String, (String, bool)>,
    ) -> (Vec<LeaseSeen>, Vec<String>, Vec<String>) {
        let (mut leases, mut complete, mut problems) = (Vec::new(), Vec::new(), Vec::new());
        let namespaces: BTreeSet<&String> =
            spec.lease_namespaces.iter().chain(grants.keys()).collect();
        for namespace in namespaces {
            match self.read_leases(namespace).await {
                Ok(found) => {
                    leases.extend(found);
                    complete.push(namespace.clone());
                }
                Err(e) => problems.push(e),
            }
        }
        (leases, complete, problems)
    }

    /// What the reaper observed of each Lease, by its record (updated with this sweep's reads:
    /// a changed Lease is renewed now; a Lease missing from a namespace read whole is gone).
    fn observe(
        &self,
        policy: &str,
        spec: &ReaperPolicySpec,
        leases: Vec<LeaseSeen>,
        complete: &[String],
        now: i64,
        grants: BTreeMap<String, (String, bool)>,
    ) -> Seen {
        let mut seen = Seen {
            heartbeats: Heartbeats {
                watched: spec
                    .lease_namespaces
                    .iter()
                    .chain(grants.keys())
                    .cloned()
                    .collect(),
                ..Default::default()
            },
            observed: BTreeMap::new(),
            unremembered: 0,
            grants,
        };
        let mut memories = self.memory.locked();
        let (memory, _) = memories.entry(policy.to_owned()).or_default();
        for lease in leases {
            let observation = memory.observe(&lease.key, &lease.version, now);
            seen.unremembered += u64::from(observation.is_none());
            // One the record has no room for is seen afresh each sweep: never stale.
            let (renewed, stale_since) =
                observation.map_or((now, None), |o| (o.renewed, o.stale_since));
            seen.heartbeats
                .by_key
                .insert(lease.key.clone(), lease.uid.clone());
            let observed = Observed {
                renewed,
                stale_since,
                left: lease.left,
            };
            seen.observed.insert(lease.key.clone(), (observed, lease));
        }
        for namespace in complete {
            memory.gone_unless(namespace, &|key| seen.heartbeats.by_key.contains_key(key));
        }
        seen
    }

    /// Who answers for each group of objects ([`Heartbeats::judge`]).
    fn judge(&self, policy: &str, seen: &Seen, census: &Census) -> BTreeMap<Group, Judge> {
        let memories = self.memory.locked();
        let memory = memories.get(policy).map(|(m, _)| m);
        seen.heartbeats.judge(
            census
                .objects
                .keys()
                .map(|(uid, record)| (uid.as_str(), record.as_deref())),
            &|key| memory.is_some_and(|m| m.was_seen(key)),
        )
    }

    /// A heartbeat with only namespaces left, each kept (it holds anything else), has nothing
    /// left to act on: Reaped, not Reaping for ever. Checked again every sweep — a namespace is
    /// acted on once it holds only that heartbeat's objects.
    #[allow(clippy::too_many_arguments)]
    async fn settle_namespaces(
        &self,
        views: &mut [(Judge, ConsumerView)],
        judged: &BTreeMap<Group, Judge>,
        census: &Census,
        kinds: &[census::Kind],
        seen: &Seen,
        now: i64,
        settings: &Policy,
        spec: &ReaperPolicySpec,
    ) {
        for (judge, view) in views.iter_mut().filter(|(_, v)| {
            v.step.act == Some(Action::Delete) && act::only_namespaces_left(&v.objects)
        }) {
            let judge = &*judge;
            let Judge::Heartbeat(key) = judge else {
                continue;
            };
            // A namespace being deleted is not gone yet: still Reaping.
            let mut left: u64 = judged
                .iter()
                .filter(|(_, j)| *j == judge)
                .filter_map(|(group, _)| census.deleting.get(group))
                .sum();
            for target in census.targets.iter().filter(|t| {
                judged.get(&t.group) == Some(judge)
                    && kinds.get(t.kind).is_some_and(|k| k.name == "namespaces")
            }) {
                if self
                    .namespace_holds_only(&target.name, judge, judged, spec)
                    .await
                {
                    left += 1;
                }
            }
            if left == 0 {
                view.step = seen.decide(key, 0, now, settings);
            }
        }
    }

    /// Records each heartbeat's stale mark in the reaper's record.
    fn mark_stale(&self, policy: &str, views: &[(Judge, ConsumerView)]) {
        let mut memories = self.memory.locked();
        if let Some((memory, _)) = memories.get_mut(policy) {
            for (judge, view) in views {
                if let Judge::Heartbeat(key) = judge {
                    memory.judged(key, view.step.stale_since);
                }
            }
        }
    }

    /// The sweep's metrics.
    fn count(&self, policy: &str, views: &[ConsumerView], now: i64) {
        self.metrics
            .reaper_last_sweep_timestamp_seconds
            .with_label_values(&[policy])
            .set(now as f64);
        for state in facts::STATES {
            let n = views.iter().filter(|v| v.step.state == state).count();
            self.metrics
                .reaper_consumers
                .with_label_values(&[policy, facts::state_name(state)])
                .set(n as f64);
        }
        tracing::debug!(policy, heartbeats = views.len(), "swept");
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

/// The policy's timing and action, checked against the heartbeats' Lease durations (too short:
/// acting as Report, with a warning), or what is wrong with it.
fn checked(
    spec: &ReaperPolicySpec,
    leases: &[LeaseSeen],
) -> Result<(Policy, Option<String>), String> {
    let mut settings = super::policy_of(spec)?;
    let longest = leases.iter().map(|l| l.duration_secs).max().unwrap_or(1);
    let lease_duration = Duration::from_secs(u64::try_from(longest).unwrap_or(1));
    match super::validate(&settings, lease_duration) {
        Ok(()) => Ok((settings, None)),
        Err(e) => {
            settings.action = Action::Report;
            Ok((settings, Some(format!("{e}; acting as Report"))))
        }
    }
}

/// One view per judge: each heartbeat read (with its objects, if any), and the objects that
/// answer to a gone, never-seen or no judged heartbeat.
fn views(
    judged: &BTreeMap<Group, Judge>,
    census: &Census,
    seen: &Seen,
    now: i64,
    settings: &Policy,
) -> Vec<(Judge, ConsumerView)> {
    // Per judge: the consumer UID, and its objects per API.
    let mut by_judge: BTreeMap<Judge, (String, BTreeMap<String, u64>)> = BTreeMap::new();
    for (group, apis) in &census.objects {
        let Some(judge) = judged.get(group) else {
            continue;
        };
        let (_, counts) = by_judge
            .entry(judge.clone())
            .or_insert_with(|| (group.0.clone(), BTreeMap::new()));
        for (api, n) in apis {
            *counts.entry(api.clone()).or_default() += n;
        }
    }
    for (key, (_, lease)) in &seen.observed {
        by_judge
            .entry(Judge::Heartbeat(key.clone()))
            .or_insert_with(|| (lease.uid.clone(), BTreeMap::new()));
    }
    by_judge
        .into_iter()
        .map(|(judge, (uid, objects))| {
            let plain = |heartbeat| {
                super::decide(
                    &Facts {
                        now,
                        heartbeat,
                        objects: countable(&objects),
                        grant: None,
                    },
                    settings,
                )
            };
            let step = match &judge {
                Judge::Heartbeat(key) => seen.decide(key, countable(&objects), now, settings),
                Judge::Gone(_) => plain(Heartbeat::Gone),
                Judge::Never(_) => plain(Heartbeat::Never),
                Judge::Unaccounted(_) => Step {
                    state: State::Unaccounted,
                    act: None,
                    next: None,
                    stale_since: None,
                },
            };
            let (leases, lease) = match &judge {
                Judge::Heartbeat(key) => (vec![key.clone()], seen.observed.get(key)),
                Judge::Gone(key) => (vec![key.clone()], None),
                _ => (Vec::new(), None),
            };
            let view = ConsumerView {
                uid,
                step,
                connections: lease
                    .and_then(|(_, l)| l.connection.clone())
                    .into_iter()
                    .collect(),
                leases,
                renewed: lease.map(|(o, _)| o.renewed),
                objects,
            };
            (judge, view)
        })
        .collect()
}

/// The policy's `Ready` condition after a sweep.
fn readiness(
    problems: &[String],
    unrecorded: Option<String>,
    warning: Option<String>,
    untracked: u64,
    unremembered: u64,
) -> Desired<'static> {
    if !problems.is_empty() {
        Desired::new(
            "Ready",
            false,
            "ReadFailed",
            format!(
                "nothing was acted on in this sweep: {}",
                problems.join("; ")
            ),
        )
    } else if let Some(error) = unrecorded {
        // Acting went on: a record not written can only make a restart's graces longer.
        Desired::new(
            "Ready",
            false,
            "RecordNotWritten",
            format!("{error}; a restart now would start the stale heartbeats' graces afresh"),
        )
    } else if let Some(warning) = warning {
        Desired::new("Ready", false, "StaleAfterTooShort", warning)
    } else if untracked > 0 || unremembered > 0 {
        Desired::new(
            "Ready",
            false,
            "TooManyConsumers",
            format!(
                "{untracked} objects of consumers beyond the first {MAX_CONSUMERS}, and {unremembered} heartbeats beyond the first {MAX_REMEMBERED}, were not judged (never acted on)"
            ),
        )
    } else {
        Desired::new("Ready", true, "Swept", "")
    }
}

/// How many of a heartbeat's objects the action may still act on: all but the protected.
fn countable(objects: &BTreeMap<String, u64>) -> u64 {
    objects
        .iter()
        .filter(|(api, _)| api.as_str() != "protected")
        .map(|(_, n)| n)
        .sum()
}

/// Each Grant's boundary, as the issuer computes it from the Grant's spec, with the Grant's name
/// and whether it is revoked; a boundary more than one Grant computes is left out (whose it is
/// only the issuer's claim on the namespace says: nobody's to revoke here).
pub fn boundaries(grants: &[kbind_shared::api::iam::Grant]) -> BTreeMap<String, (String, bool)> {
    let mut out: BTreeMap<String, Option<(String, bool)>> = BTreeMap::new();
    for grant in grants {
        let boundary = crate::issuer::rbac::boundary(
            &grant.spec.consumer.identity,
            grant.spec.consumer.cluster_name.as_deref(),
            &grant.spec.export,
        );
        let entry = (grant.name_any(), grant.spec.revoked);
        out.entry(boundary)
            .and_modify(|e| *e = None)
            .or_insert(Some(entry));
    }
    out.into_iter()
        .filter_map(|(boundary, grant)| Some((boundary, grant?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kbind_shared::api::iam::{Grant, GrantSpec};

    fn grant(name: &str, identity: &str, export: &str, revoked: bool) -> Grant {
        let spec: GrantSpec = serde_json::from_value(json!({
            "export": export,
            "consumer": { "identity": identity },
            "revoked": revoked,
        }))
        .unwrap();
        Grant::new(name, spec)
    }

    #[test]
    fn a_grants_boundary_comes_from_its_spec_and_one_two_grants_share_is_nobodys() {
        let alice = crate::issuer::rbac::boundary("alice", None, "widgets");
        let bob = crate::issuer::rbac::boundary("bob", None, "widgets");
        let got = boundaries(&[
            grant("a", "alice", "widgets", false),
            grant("b", "bob", "widgets", true),
            // Another name for Alice's boundary: ambiguous, so neither is revoked here.
            grant("a-again", "alice", "widgets", false),
        ]);
        assert_eq!(got.get(&bob), Some(&("b".to_owned(), true)));
        assert_eq!(got.get(&alice), None);
        assert_eq!(got.len(), 1);
    }
}
