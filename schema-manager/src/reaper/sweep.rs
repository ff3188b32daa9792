//! One sweep of `kbind-reaper` over one policy, on the provider: read the consumers' heartbeat
//! Leases, take the API server's time from the reaper's own Lease, update the reaper's record of
//! what it observed ([`super::memory`]), read the objects kbind marked as a consumer's (or, while
//! acting, keep the targets of the last read), judge each by the heartbeat of the Connection that
//! wrote it ([`super::attribution`]), decide per heartbeat ([`super::decide`]), act within the
//! delete budget, and write the policy's status, the record and the metrics. The I/O edge; the
//! decisions are in `super` and its pure modules.
//!
//! Nothing is acted on after a sweep that could not read everything it needed: a Lease that
//! could not be read must not make a live consumer look dead.

use std::collections::{BTreeMap, BTreeSet, HashMap};
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
use kube::discovery::{Discovery, Scope};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use super::attribution::{Heartbeats, Judge};
use super::facts::{self, ConsumerView, LeaseSeen};
use super::memory::Memory;
use super::{Action, Facts, Heartbeat, Observed, State};

/// The reaper's own Lease, whose renewal the API server stamps: the sweep's "now".
pub const CLOCK_LEASE: &str = "kbind-reaper-clock";
/// The field manager of the reaper's writes.
pub const FIELD_MANAGER: &str = "kbind-reaper";
const PAGE: u32 = 500;
/// At most this many consumer UIDs are followed per sweep; objects of more are counted as
/// untracked (a condition says so) and never acted on.
const MAX_CONSUMERS: usize = 10_000;
/// The reaper's own ConfigMap (in its namespace) holding its record per policy
/// ([`super::memory`]): a key `<policy>.json` each.
pub const MEMORY_CONFIGMAP: &str = "kbind-reaper-memory";
/// How long the kinds discovered for a namespace's whole check are reused.
const DISCOVERY_TTL: Duration = Duration::from_secs(300);
/// Objects Kubernetes itself puts in every namespace: never a reason to keep one.
const SYSTEM_OBJECTS: [(&str, &str, &str); 2] = [
    ("", "serviceaccounts", "default"),
    ("", "configmaps", "kube-root-ca.crt"),
];

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

/// One kind of object the reaper reads: a copy's API, related Secrets/ConfigMaps, namespaces.
#[derive(Clone)]
struct Kind {
    /// How it is named in the status and metrics (`widgets.example.com`, `secrets`, …).
    name: String,
    resource: ApiResource,
    namespaced: bool,
    /// Where it is read; empty: everywhere.
    namespaces: Vec<String>,
}

/// A group of objects: one consumer UID, and the heartbeat record they carry (if any).
type Group = (String, Option<String>);

/// An object the reaper may act on.
#[derive(Clone)]
struct Target {
    kind: usize,
    namespace: Option<String>,
    name: String,
    object_uid: String,
    group: Group,
}

/// What the objects say, per group.
#[derive(Default, Clone)]
struct Census {
    objects: BTreeMap<Group, BTreeMap<String, u64>>,
    /// Per group, how many of its counted objects are being deleted (not targets any more, but
    /// not gone either).
    deleting: HashMap<Group, u64>,
    targets: Vec<Target>,
    untracked: u64,
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
    fn acted(&mut self, target: &Target, kind: &str, action: Action) {
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
struct Pending {
    generation: Option<i64>,
    read_at: Instant,
    kinds: Vec<Kind>,
    census: Census,
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
        if let Err(error) = self.restore(&name).await {
            // Without the record, a grace could restart short of where it was: nothing is decided.
            tracing::warn!(policy = %name, %error, "sweep skipped");
            return interval.min(Duration::from_secs(10));
        }
        let generation = policy.metadata.generation;
        let spec = &policy.spec;
        let mut problems: Vec<String> = Vec::new();

        // The heartbeats, read before "now" is taken: a renewal seen was written before it.
        let mut leases: Vec<LeaseSeen> = Vec::new();
        let mut complete_namespaces = Vec::new();
        for namespace in &spec.lease_namespaces {
            match self.read_leases(namespace).await {
                Ok(found) => {
                    leases.extend(found);
                    complete_namespaces.push(namespace.clone());
                }
                Err(e) => problems.push(e),
            }
        }
        let now = match self.server_now().await {
            Ok(now) => now,
            Err(error) => {
                // Without the server's time nothing can be decided, or stamped.
                tracing::warn!(policy = %name, %error, "sweep skipped");
                return interval.min(Duration::from_secs(10));
            }
        };
        let settings = match super::policy_of(spec) {
            Ok(settings) => settings,
            Err(message) => {
                let desired = Desired::new("Ready", false, "InvalidPolicy", message);
                self.write_status(policy, &[], now, desired).await;
                return interval;
            }
        };
        let longest = leases.iter().map(|l| l.duration_secs).max().unwrap_or(1);
        let mut policy_checked = settings;
        let mut warning = None;
        let lease_duration = Duration::from_secs(u64::try_from(longest).unwrap_or(1));
        if let Err(e) = super::validate(&settings, lease_duration) {
            // Too short for these heartbeats: reported only, never acted on.
            policy_checked.action = Action::Report;
            warning = Some(format!("{e}; acting as Report"));
        }

        // What the reaper observed of each heartbeat, by its own record.
        let mut heartbeats = Heartbeats {
            watched: spec.lease_namespaces.iter().cloned().collect(),
            ..Default::default()
        };
        let mut observed: BTreeMap<String, (Observed, &LeaseSeen)> = BTreeMap::new();
        let mut unremembered = 0u64;
        {
            let mut memories = self.memory.locked();
            let (memory, _) = memories.entry(name.clone()).or_default();
            for lease in &leases {
                let seen = memory.observe(&lease.key, &lease.version, now);
                unremembered += u64::from(seen.is_none());
                // One the record has no room for is seen afresh each sweep: never stale.
                let seen = seen.map_or((now, None), |s| (s.renewed, s.stale_since));
                heartbeats
                    .by_key
                    .insert(lease.key.clone(), lease.uid.clone());
                observed.insert(
                    lease.key.clone(),
                    (
                        Observed {
                            renewed: seen.0,
                            stale_since: seen.1,
                            left: lease.left,
                        },
                        lease,
                    ),
                );
            }
            for namespace in &complete_namespaces {
                memory.gone_unless(namespace, &|key| heartbeats.by_key.contains_key(key));
            }
        }
        let decide = |key: &str, objects: u64| {
            let heartbeat = match observed.get(key) {
                Some((seen, _)) => Heartbeat::Seen(*seen),
                None => Heartbeat::Gone,
            };
            super::decide(
                &Facts {
                    now,
                    heartbeat,
                    objects,
                },
                &policy_checked,
            )
        };
        // Which heartbeats' copies may be acted on, by their Leases alone.
        let eligible: BTreeSet<&str> = observed
            .keys()
            .filter(|key| decide(key, 1).act.is_some())
            .map(String::as_str)
            .collect();

        // The objects: a full read, or the targets of the last one while acting on them.
        let kept = self.kept(&name, generation, interval, !eligible.is_empty());
        let (kinds, mut census) = match kept {
            Some(kept) => kept,
            None => {
                let kinds = match self.kinds(policy).await {
                    Ok(kinds) => kinds,
                    Err(e) => {
                        problems.push(e);
                        Vec::new()
                    }
                };
                let mut census = Census::default();
                let sole: BTreeMap<&str, &str> = sole_heartbeats(&heartbeats);
                for (index, kind) in kinds.iter().enumerate() {
                    let may_act = |group: &Group| match &group.1 {
                        Some(record) => eligible.contains(record.as_str()),
                        None => sole
                            .get(group.0.as_str())
                            .is_some_and(|key| eligible.contains(key)),
                    };
                    if let Err(e) = self
                        .read_objects(index, kind, spec, &may_act, &mut census)
                        .await
                    {
                        problems.push(e);
                    }
                }
                (kinds, census)
            }
        };

        // Who answers for what.
        let judged = {
            let memories = self.memory.locked();
            let memory = memories.get(&name).map(|(m, _)| m);
            heartbeats.judge(
                census
                    .objects
                    .keys()
                    .map(|(uid, record)| (uid.as_str(), record.as_deref())),
                &|key| memory.is_some_and(|m| m.was_seen(key)),
            )
        };
        let mut by_judge: BTreeMap<Judge, BTreeMap<String, u64>> = BTreeMap::new();
        for (group, apis) in &census.objects {
            let Some(judge) = judged.get(group) else {
                continue;
            };
            let counts = by_judge.entry(judge.clone()).or_default();
            for (api, n) in apis {
                *counts.entry(api.clone()).or_default() += n;
            }
        }
        for key in observed.keys() {
            by_judge.entry(Judge::Heartbeat(key.clone())).or_default();
        }
        let countable = |objects: &BTreeMap<String, u64>| -> u64 {
            objects
                .iter()
                .filter(|(api, _)| api.as_str() != "protected")
                .map(|(_, n)| n)
                .sum()
        };
        let mut views: Vec<(Judge, ConsumerView)> = by_judge
            .iter()
            .map(|(judge, objects)| {
                let (uid, step, lease) = match judge {
                    Judge::Heartbeat(key) => {
                        let lease = observed.get(key).map(|(_, l)| *l);
                        let uid = lease.map(|l| l.uid.clone()).unwrap_or_default();
                        (uid, decide(key, countable(objects)), lease)
                    }
                    Judge::Gone(key) => {
                        let uid = judged
                            .iter()
                            .find(|(_, j)| *j == judge)
                            .map(|((uid, _), _)| uid.clone())
                            .unwrap_or_default();
                        let _ = key;
                        (
                            uid,
                            decide_plain(Heartbeat::Gone, now, objects, &policy_checked, countable),
                            None,
                        )
                    }
                    Judge::Never(uid) => (
                        uid.clone(),
                        decide_plain(Heartbeat::Never, now, objects, &policy_checked, countable),
                        None,
                    ),
                    Judge::Unaccounted(uid) => (
                        uid.clone(),
                        super::Step {
                            state: State::Unaccounted,
                            act: None,
                            next: None,
                            stale_since: None,
                        },
                        None,
                    ),
                };
                let leases = match judge {
                    Judge::Heartbeat(key) | Judge::Gone(key) => vec![key.clone()],
                    _ => Vec::new(),
                };
                let view = ConsumerView {
                    uid,
                    step,
                    connections: lease
                        .and_then(|l| l.connection.clone())
                        .into_iter()
                        .collect(),
                    leases,
                    renewed: match judge {
                        Judge::Heartbeat(key) => observed.get(key).map(|(o, _)| o.renewed),
                        _ => None,
                    },
                    objects: objects.clone(),
                };
                (judge.clone(), view)
            })
            .collect();

        // The action, only on complete facts.
        let complete = problems.is_empty();
        // A heartbeat with only namespaces left, each kept (it holds anything else), has nothing
        // left to act on: Reaped, not Reaping for ever. Checked only then, and again every sweep
        // — the namespace is acted on once it holds only that heartbeat's objects.
        if complete {
            for (judge, view) in views.iter_mut().filter(|(_, v)| {
                v.step.act == Some(Action::Delete) && only_namespaces_left(&v.objects)
            }) {
                let being_deleted: u64 = judged
                    .iter()
                    .filter(|(_, j)| *j == judge)
                    .filter_map(|(group, _)| census.deleting.get(group))
                    .sum();
                let mut left = being_deleted;
                for target in census.targets.iter().filter(|t| {
                    judged.get(&t.group) == Some(judge)
                        && kinds.get(t.kind).is_some_and(|k| k.name == "namespaces")
                }) {
                    if self
                        .namespace_holds_only(&target.name, judge, &judged, spec)
                        .await
                    {
                        left += 1;
                    }
                }
                if left == 0
                    && let Judge::Heartbeat(key) = judge
                {
                    view.step = decide(key, 0);
                }
            }
        }
        let mut more_to_do = false;
        if complete {
            let acting: HashMap<&Judge, (Action, bool)> = views
                .iter()
                .filter_map(|(judge, v)| {
                    let action = v.step.act?;
                    // Namespaces go last: once nothing else of the heartbeat's is left.
                    Some((judge, (action, only_namespaces_left(&v.objects))))
                })
                .collect();
            more_to_do = self
                .act(&name, spec, &kinds, &mut census, &judged, &acting)
                .await;
        }
        self.keep(&name, generation, kinds, census.clone(), more_to_do);

        // The record, with each heartbeat's stale mark; written only when it changed.
        {
            let mut memories = self.memory.locked();
            if let Some((memory, _)) = memories.get_mut(&name) {
                for (judge, view) in &views {
                    if let Judge::Heartbeat(key) = judge {
                        memory.judged(key, view.step.stale_since);
                    }
                }
            }
        }
        if let Err(e) = self.persist(&name).await {
            problems.push(e);
        }

        // The status and the metrics.
        let views: Vec<ConsumerView> = views.into_iter().map(|(_, v)| v).collect();
        let desired = if !problems.is_empty() {
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
        } else if census.untracked > 0 || unremembered > 0 {
            Desired::new(
                "Ready",
                false,
                "TooManyConsumers",
                format!(
                    "{} objects of consumers beyond the first {MAX_CONSUMERS}, and {unremembered} heartbeats beyond the first {}, were not judged (never acted on)",
                    census.untracked,
                    super::memory::MAX_REMEMBERED
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
        tracing::debug!(policy = %name, heartbeats = views.len(), generation, "swept");

        // When to look again: the next state change, at the exact second; while acting, when
        // the delete budget has a token again.
        if more_to_do {
            let per_minute = f64::from(spec.deletes_per_minute.max(1));
            return interval
                .min(Duration::from_secs_f64(60.0 / per_minute).max(Duration::from_millis(100)));
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

    /// Reads the record of `policy` from [`MEMORY_CONFIGMAP`] once per term as leader.
    async fn restore(&self, policy: &str) -> Result<(), String> {
        if self.memory.locked().contains_key(policy) {
            return Ok(());
        }
        let maps: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let found = maps.get_opt(MEMORY_CONFIGMAP).await.map_err(|e| {
            format!(
                "read the reaper's record {}/{MEMORY_CONFIGMAP}: {e}",
                self.namespace
            )
        })?;
        let text = found
            .and_then(|m| m.data)
            .and_then(|mut d| d.remove(&memory_key(policy)));
        let memory = match text.as_deref().map(Memory::restore) {
            Some(Ok(memory)) => memory,
            Some(Err(error)) => {
                // Every grace starts afresh: longer, never shorter.
                tracing::warn!(policy, %error, "the reaper's record is unreadable; starting anew");
                Memory::default()
            }
            None => Memory::default(),
        };
        tracing::info!(
            policy,
            remembered = memory.len(),
            "the reaper's record read"
        );
        self.memory
            .locked()
            .insert(policy.to_owned(), (memory, text.unwrap_or_default()));
        Ok(())
    }

    /// Writes the record of `policy` when what must survive a restart changed.
    async fn persist(&self, policy: &str) -> Result<(), String> {
        let text = {
            let memories = self.memory.locked();
            let Some((memory, written)) = memories.get(policy) else {
                return Ok(());
            };
            let text = memory.persisted();
            if text == *written || (written.is_empty() && text == "{}") {
                return Ok(());
            }
            text
        };
        let body = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": { "name": MEMORY_CONFIGMAP },
            "data": { memory_key(policy): text },
        });
        Api::<ConfigMap>::namespaced(self.client.clone(), &self.namespace)
            .patch(
                MEMORY_CONFIGMAP,
                &PatchParams::apply(&format!("{FIELD_MANAGER}-{policy}")).force(),
                &Patch::Apply(&body),
            )
            .await
            .map_err(|e| {
                format!(
                    "write the reaper's record {}/{MEMORY_CONFIGMAP}: {e}",
                    self.namespace
                )
            })?;
        if let Some((_, written)) = self.memory.locked().get_mut(policy) {
            *written = text;
        }
        Ok(())
    }

    /// The targets of the last full read, when they may be acted on still: the same policy
    /// generation, read within `interval`, some heartbeat acting, and targets left.
    fn kept(
        &self,
        policy: &str,
        generation: Option<i64>,
        interval: Duration,
        acting: bool,
    ) -> Option<(Vec<Kind>, Census)> {
        let mut pending = self.pending.locked();
        let kept = pending.remove(policy)?;
        (acting
            && kept.generation == generation
            && kept.read_at.elapsed() < interval
            && !kept.census.targets.is_empty())
        .then_some((kept.kinds, kept.census))
    }

    fn keep(
        &self,
        policy: &str,
        generation: Option<i64>,
        kinds: Vec<Kind>,
        census: Census,
        more_to_do: bool,
    ) {
        let mut pending = self.pending.locked();
        if more_to_do {
            let read_at = pending.get(policy).map_or_else(Instant::now, |p| p.read_at);
            pending.insert(
                policy.to_owned(),
                Pending {
                    generation,
                    read_at,
                    kinds,
                    census,
                },
            );
        } else {
            pending.remove(policy);
        }
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
        spec: &kbind_shared::api::reaper::ReaperPolicySpec,
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
        spec: &kbind_shared::api::reaper::ReaperPolicySpec,
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

    /// Acts on the targets of the heartbeats in `acting`, within the delete budget; namespaces
    /// only of heartbeats with nothing else left, and only when the namespace holds nothing but
    /// that heartbeat's objects. Acted targets leave `census`. Returns whether work remains (the
    /// budget ran out).
    async fn act(
        &self,
        policy: &str,
        spec: &kbind_shared::api::reaper::ReaperPolicySpec,
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
                    tracing::info!(policy, consumer = %target.group.0, heartbeat = ?target.group.1, api = %kind.name, namespace = ?target.namespace, name = %target.name, action = action_name, "reaped");
                    self.metrics
                        .reaper_objects_total
                        .with_label_values(&[policy, &kind.name, action_name])
                        .inc();
                    census.acted(&target, &kind.name, action);
                }
                // Gone, or replaced by another object of the same name: nothing to do.
                Err(kube::Error::Api(s)) if s.is_not_found() || s.code == 409 => {
                    census.acted(&target, &kind.name, Action::Orphan);
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
    async fn namespace_holds_only(
        &self,
        namespace: &str,
        judge: &Judge,
        judged: &BTreeMap<Group, Judge>,
        spec: &kbind_shared::api::reaper::ReaperPolicySpec,
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

/// The decision for objects with no Lease to read (`Gone`, `Never`).
fn decide_plain(
    heartbeat: Heartbeat,
    now: i64,
    objects: &BTreeMap<String, u64>,
    policy: &super::Policy,
    countable: impl Fn(&BTreeMap<String, u64>) -> u64,
) -> super::Step {
    super::decide(
        &Facts {
            now,
            heartbeat,
            objects: countable(objects),
        },
        policy,
    )
}

/// The data key of a policy's record in [`MEMORY_CONFIGMAP`].
fn memory_key(policy: &str) -> String {
    format!("{policy}.json")
}

/// Whether, of a heartbeat's objects per API, only namespaces (and protected objects, which are
/// never acted on) are left.
fn only_namespaces_left(objects: &BTreeMap<String, u64>) -> bool {
    objects
        .iter()
        .all(|(api, n)| *n == 0 || api == "namespaces" || api == "protected")
}
