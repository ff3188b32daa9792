//! Related Secrets and ConfigMaps of one binding (REFERENCE-BEHAVIOUR §13, improved): watch-driven
//! copies in either direction, per-entry garbage collection, conflicts reported on the binding.
//!
//! One worker runs per binding that lists `relatedResources`, on the syncer replica the
//! assignment gives that binding's unit to, so the work spreads with the replicas and never has
//! two writers. The worker watches, in the binding's scope only (its namespace on both clusters
//! for a Binding), the sources its entries read and the labelled copies on the target side; every
//! event leads to one pass that compares wanted and actual copies and writes only what differs.

pub mod plan;
mod state;
mod summary;
mod watch;
mod writes;

use kbind_shared::sync::Locked;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kbind_shared::api::RelatedResourceKind;
use kbind_shared::conditions::{self, Desired, reasons, types};
use kbind_shared::identity::describe_error;
use kbind_shared::keys;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::context::{AnyBinding, Context};
use plan::{Entry, Item, KindKey, Marker, Side, TargetKey};
pub use state::RelatedSpec;
use state::Worker;
use summary::Outcome;
use watch::{Role, item, occupancy, resource, source_filter};

/// The backstop when nothing happens.
const RESYNC: Duration = Duration::from_secs(30);
/// How soon to look again while something is wrong (a conflict may be resolved by deleting the
/// foreign object, which no watch of ours sees).
const RETRY: Duration = Duration::from_secs(5);
/// How long to gather a burst of events into one pass.
const DEBOUNCE: Duration = Duration::from_millis(50);

/// Runs until `stop`, or until the binding is gone or replaced.
pub async fn run(ctx: Arc<Context>, spec: RelatedSpec, stop: CancellationToken) {
    let namespace = spec.namespace.clone();
    let who = describe(&spec);
    let Some(provider) = ctx
        .provider_client(&spec.kubeconfig, &spec.digest, &spec.connection, &who)
        .await
    else {
        return;
    };
    let Some(binding) = ctx.binding(spec.namespace.as_deref(), &spec.name) else {
        return;
    };
    let entries = binding.spec().related_resources.clone();
    let changes = Arc::new(Notify::new());
    let worker_stop = stop.child_token();
    let mut watched = HashMap::new();
    let mut provider_watches = Vec::new();
    // The entries as this worker's watches read them (it is rebuilt when the spec changes).
    let parsed: Vec<Entry> = entries
        .iter()
        .enumerate()
        .filter_map(|(i, e)| Entry::parse(i, e, spec.namespace.is_none()).ok())
        .collect();
    for entry in &entries {
        let (from, to) = plan::sides(entry.direction);
        for (side, role) in [(from, Role::Source), (to, Role::Target)] {
            let key = (KindKey(entry.resource), side, role);
            if watched.contains_key(&key) {
                continue;
            }
            let client = match side {
                Side::Consumer => ctx.client.clone(),
                Side::Provider => provider.clone(),
            };
            // In a boundary the provider is read one namespace at a time (#51).
            let scope = if side == Side::Provider && spec.namespaces.boundary().is_some() {
                let (tx, rx) = futures::channel::mpsc::unbounded();
                provider_watches.push(tx);
                watch::Scope::Namespaces(rx, spec.namespaces.clone())
            } else {
                watch::Scope::Plain(spec.namespace.clone())
            };
            watched.insert(
                key,
                watch::watch(
                    client,
                    entry.resource,
                    scope,
                    match role {
                        Role::Source => source_filter(&entries, entry.resource, from),
                        Role::Target => Some(watch::target_selector(side, &spec.local_uid)),
                    },
                    {
                        // A source keeps its payload only when an entry reads it; kbind's
                        // copies always do (they are compared with what is wanted).
                        let reading: Vec<Entry> = parsed
                            .iter()
                            .filter(|e| {
                                e.kind == entry.resource && plan::sides(e.direction).0 == side
                            })
                            .cloned()
                            .collect();
                        move |o: &DynamicObject| {
                            role == Role::Target
                                || reading.iter().any(|e| {
                                    e.selects(
                                        o.labels(),
                                        o.namespace().as_deref().unwrap_or_default(),
                                        &o.name_any(),
                                    )
                                })
                        }
                    },
                    worker_stop.clone(),
                    changes.clone(),
                ),
            );
        }
    }
    // In a boundary: a Binding's provider watches read its namespace; a ClusterBinding's those
    // its entries list and those its bound objects are in (where its copies may land).
    let told = (!provider_watches.is_empty()).then(|| {
        let (occupancies, listed) = match &spec.namespace {
            Some(namespace) => (0, vec![namespace.clone()]),
            None => (
                spec.bound_apis.len(),
                parsed
                    .iter()
                    .flat_map(|e| e.namespaces().iter().cloned())
                    .collect(),
            ),
        };
        watch::Told::new(provider_watches, occupancies, listed)
    });
    let occupancy = spec
        .bound_apis
        .iter()
        .map(|(api, resource)| {
            occupancy(
                ctx.client.clone(),
                api.clone(),
                resource,
                worker_stop.clone(),
                changes.clone(),
                told.clone(),
            )
        })
        .collect();
    let worker = Worker {
        occupancy,
        recorder: Recorder::new(ctx.client.clone(), ctx.reporter.clone()),
        ctx: ctx.clone(),
        spec,
        provider,
        watched,
        known_namespaces: Mutex::default(),
        conflicts: Mutex::default(),
        swept_unused: Mutex::new(false),
    };
    tracing::info!(binding = %who, entries = entries.len(), "related resources worker started");
    // Only what may alter its binding's namespace (a change of another namespace's Bindings
    // wakes nobody here).
    let bindings = futures::StreamExt::filter(ctx.binding_changes(), move |touched| {
        std::future::ready(touched.reaches(namespace.as_deref()))
    });
    let mut bindings = std::pin::pin!(bindings);
    loop {
        let wait = worker.pass().await;
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = changes.notified() => tokio::time::sleep(DEBOUNCE).await,
            _ = futures::StreamExt::next(&mut bindings) => tokio::time::sleep(DEBOUNCE).await,
            _ = tokio::time::sleep(wait) => {}
        }
    }
    worker_stop.cancel();
    tracing::info!(binding = %who, "related resources worker stopped");
}

fn describe(spec: &RelatedSpec) -> String {
    match &spec.namespace {
        Some(ns) => format!("Binding {ns}/{}", spec.name),
        None => format!("ClusterBinding {}", spec.name),
    }
}

impl Worker {
    fn client(&self, side: Side) -> &Client {
        match side {
            Side::Consumer => &self.ctx.client,
            Side::Provider => &self.provider,
        }
    }

    /// The namespace on `side` of (consumer) namespace `namespace`: in a Connection's boundary the
    /// provider's is mapped (#51); a name too long to map is refused as the API server would.
    fn on_side(&self, side: Side, namespace: &str) -> Result<String, kube::Error> {
        match side {
            Side::Consumer => Ok(namespace.to_owned()),
            Side::Provider => self
                .spec
                .namespaces
                .provider(namespace)
                .map_err(|e| e.to_error()),
        }
    }

    fn api(
        &self,
        kind: RelatedResourceKind,
        side: Side,
        namespace: &str,
    ) -> Result<Api<DynamicObject>, kube::Error> {
        Ok(Api::namespaced_with(
            self.client(side).clone(),
            &self.on_side(side, namespace)?,
            &resource(kind),
        ))
    }

    /// The binding this worker serves, unless it is gone, replaced or being deleted (its cleanup
    /// removes the copies).
    fn binding(&self) -> Option<AnyBinding> {
        self.ctx
            .binding(self.spec.namespace.as_deref(), &self.spec.name)
            .filter(|b| b.meta().uid.as_deref() == Some(self.spec.uid.as_str()))
            .filter(|b| b.meta().generation.unwrap_or_default() == self.spec.generation)
            .filter(|b| b.meta().deletion_timestamp.is_none())
    }

    /// One pass; returns how long to wait without events.
    async fn pass(&self) -> Duration {
        if !self.ctx.membership.is_current() {
            return Duration::from_secs(1);
        }
        let Some(binding) = self.binding() else {
            return RESYNC;
        };
        let spec = binding.spec();
        // Suspended: nothing copied, nothing deleted, until it is resumed.
        if spec.suspend {
            let message = "the binding is suspended (spec.suspend): no related copy is written or deleted until it is resumed";
            self.report(
                &binding,
                Desired::new(
                    types::RELATED_RESOURCES_SYNCED,
                    false,
                    reasons::PAUSED,
                    message,
                ),
                0,
            )
            .await;
            return RESYNC;
        }
        let entries: Result<Vec<Entry>, String> = spec
            .related_resources
            .iter()
            .enumerate()
            .map(|(i, e)| Entry::parse(i, e, self.spec.namespace.is_none()))
            .collect();
        let entries = match entries {
            Ok(entries) => entries,
            Err(message) => {
                // Nothing copied, nothing deleted.
                self.report(
                    &binding,
                    Desired::new(
                        types::RELATED_RESOURCES_SYNCED,
                        false,
                        reasons::INVALID_SELECTOR,
                        message,
                    ),
                    0,
                )
                .await;
                return RESYNC;
            }
        };
        // Safe by default: Secrets leave this cluster only if the Connection's owner allowed it.
        // Nothing copied, nothing deleted.
        if let Err(message) = plan::check_access(
            &entries,
            self.spec.access.secrets_to_provider,
            &self.spec.connection,
            self.spec.namespace.is_none(),
        ) {
            self.report(
                &binding,
                Desired::new(
                    types::RELATED_RESOURCES_SYNCED,
                    false,
                    plan::NOT_ALLOWED,
                    message,
                ),
                0,
            )
            .await;
            return RESYNC;
        }
        // Every watch must have listed: deciding on a partial view could delete good copies.
        for ((kind, side, _), watched) in &self.watched {
            let (listed, error, forbidden) = {
                let health = watched.health.locked();
                (health.listed, health.error.clone(), health.forbidden)
            };
            if listed {
                continue;
            }
            let Some(error) = error else {
                return Duration::from_secs(1);
            };
            let (reason, what) = if forbidden {
                (reasons::FORBIDDEN, "are not allowed to list and watch")
            } else {
                (reasons::ERROR, "cannot list and watch")
            };
            let message = format!(
                "the {} credentials {what} {} in {}: {error}",
                side.as_str(),
                plan::kind_name(kind.0).to_lowercase() + "s",
                self.scope()
            );
            self.report(
                &binding,
                Desired::new(types::RELATED_RESOURCES_SYNCED, false, reason, message),
                0,
            )
            .await;
            return RETRY;
        }
        // The same for the caches of where the bound objects are: a partial view could refuse
        // (and then remove) good copies.
        for occupancy in &self.occupancy {
            let (listed, error) = {
                let health = occupancy.health.locked();
                (health.listed, health.error.clone())
            };
            if listed {
                continue;
            }
            let Some(error) = error else {
                return Duration::from_secs(1);
            };
            let message = format!(
                "the consumer credentials cannot list and watch {} in all namespaces (needed to know where the provider's objects may land): {error}",
                occupancy.api
            );
            self.report(
                &binding,
                Desired::new(
                    types::RELATED_RESOURCES_SYNCED,
                    false,
                    reasons::ERROR,
                    message,
                ),
                0,
            )
            .await;
            return RETRY;
        }

        let sources: HashMap<(KindKey, Side), Vec<Item>> = self
            .watched
            .iter()
            .filter(|((_, _, role), _)| *role == Role::Source)
            .map(|((kind, side, _), w)| {
                let items = w
                    .store
                    .state()
                    .iter()
                    .filter(|o| {
                        entries.iter().any(|e| {
                            e.kind == kind.0
                                && plan::sides(e.direction).0 == *side
                                && e.selects(
                                    o.labels(),
                                    o.namespace().as_deref().unwrap_or_default(),
                                    &o.name_any(),
                                )
                        })
                    })
                    .map(|o| item(o))
                    .collect();
                ((*kind, *side), items)
            })
            .collect();
        let wanted = plan::wanted(&entries, |kind, side| {
            sources
                .get(&(KindKey(kind), side))
                .map(|items| items.iter().collect())
                .unwrap_or_default()
        });
        // An entry that selects something says so even when the limits below leave it out.
        let unmatched = plan::unmatched_note(&entries, &wanted);
        // Nothing is read from or written to a protected namespace, on either side.
        let fence = plan::Fence::new(
            &self.ctx.membership.namespace,
            &self.ctx.provider_secrets.namespaces,
        );
        let (wanted, fenced) = fence.split(wanted);
        // A ClusterBinding's provider objects land only where the binding has bound objects or
        // where its entry lists the namespace: the provider does not choose.
        let (wanted, homeless) = if self.spec.namespace.is_none() {
            let occupied: BTreeSet<String> = self
                .occupancy
                .iter()
                .flat_map(|o| o.store.state())
                .filter_map(|o| o.metadata.namespace.clone())
                .collect();
            plan::landing(
                &entries,
                wanted,
                &occupied,
                self.spec.namespaces.boundary().is_some(),
            )
        } else {
            (wanted, Vec::new())
        };
        // Each entry copies a bounded number of objects and bytes.
        let limits = self.ctx.limits.related;
        let (wanted, over) = limits.split(wanted);
        let heartbeat = kbind_shared::heartbeat::record(
            self.spec.kubeconfig.namespace(),
            &self.spec.connection,
            &self.spec.local_uid,
        );
        let marker = Marker {
            binding_uid: &self.spec.uid,
            local_uid: &self.spec.local_uid,
            heartbeat: &heartbeat,
        };
        let mut outcome = Outcome::default();
        // A Binding adopts only where the Connection's owner allows it.
        let policy =
            (self.spec.access).conflict_policy(self.spec.namespace.is_some(), spec.conflict_policy);
        for (key, want) in &wanted {
            self.copy(key, want, &marker, policy, &mut outcome).await;
        }
        // GC per entry: our copies that no entry wants any more.
        for ((kind, side, role), watched) in &self.watched {
            if *role != Role::Target {
                continue;
            }
            let targets: Vec<Item> = watched.store.state().iter().map(|o| item(o)).collect();
            for garbage in plan::garbage(kind.0, *side, &targets, &wanted, &self.spec.uid) {
                self.delete(kind.0, *side, garbage, &mut outcome).await;
            }
        }
        self.sweep_unused_kinds(&entries, &mut outcome).await;

        let conflicts = outcome.conflicts.len();
        let note = unmatched
            + &plan::fenced_note(&fenced)
            + &plan::homeless_note(&homeless)
            + &limits.note(&over);
        let mut desired = summary::condition(&outcome, note);
        // Objects the binding selects that the limits left out: not in sync, and it says so.
        if !over.is_empty() && desired.status == kbind_shared::conditions::Status::True {
            desired.status = kbind_shared::conditions::Status::False;
            desired.reason = plan::TOO_MANY_OBJECTS;
        }
        self.announce_new_conflicts(&binding, &outcome.conflicts)
            .await;
        let wait = if outcome.errors.is_empty() && conflicts == 0 {
            RESYNC
        } else {
            RETRY
        };
        self.report(&binding, desired, conflicts).await;
        wait
    }

    fn scope(&self) -> String {
        match &self.spec.namespace {
            Some(ns) => format!("namespace {ns}"),
            None => "all namespaces".to_owned(),
        }
    }

    fn target(&self, key: &TargetKey) -> Option<Item> {
        let watched = self.watched.get(&(key.kind, key.side, Role::Target))?;
        let reference = ObjectRef::new_with(&key.name, resource(key.kind.0)).within(&key.namespace);
        watched.store.get(&reference).map(|o| item(&o))
    }

    fn failed(&self, outcome: &mut Outcome, what: String, error: &kube::Error) {
        let forbidden = matches!(error, kube::Error::Api(s) if kbind_shared::delivery::refusal(s.code, &s.message) == Some(kbind_shared::delivery::Refusal::Forbidden));
        let message = format!("{what}: {}", describe_error(error));
        tracing::warn!(binding = %describe(&self.spec), error = %kbind_shared::redact::remote(&message), "related resources");
        outcome.errors.push((forbidden, message));
    }

    /// A Warning Event on the binding for each conflict not seen in the previous pass.
    async fn announce_new_conflicts(
        &self,
        binding: &AnyBinding,
        conflicts: &BTreeMap<TargetKey, String>,
    ) {
        let new: Vec<(TargetKey, String)> = {
            let mut seen = self.conflicts.locked();
            let new = conflicts
                .iter()
                .filter(|(k, _)| !seen.contains(*k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            *seen = conflicts.keys().cloned().collect();
            new
        };
        for (key, why) in new {
            let event = Event {
                type_: EventType::Warning,
                reason: "RelatedResourceConflict".into(),
                note: Some(format!("{key} {why}; it is left alone")),
                action: "CopyRelated".into(),
                secondary: None,
            };
            if let Err(e) = self.recorder.publish(&event, &binding.object_ref()).await {
                tracing::debug!(error = %e, "cannot publish Event");
            }
        }
    }

    /// Writes the condition and conflict count to the binding's status when they differ, with
    /// server-side apply under the syncer's own field manager (the schema manager owns the rest).
    async fn report(&self, binding: &AnyBinding, desired: Desired<'_>, conflicts: usize) {
        let status = binding.status().cloned().unwrap_or_default();
        let mut current = status.conditions.clone();
        let now = Time(jiff::Timestamp::now());
        let changed = conditions::set(&mut current, desired, binding.meta().generation, &now);
        if !changed && status.related_conflict_count as usize == conflicts {
            return;
        }
        if !self.ctx.membership.is_current() {
            return;
        }
        let Some(condition) = conditions::find(&current, types::RELATED_RESOURCES_SYNCED).cloned()
        else {
            return;
        };
        let mut body = json!({
            "apiVersion": format!("{}/{}", keys::GROUP, keys::VERSION),
            "kind": binding.kind(),
            "metadata": { "name": self.spec.name },
            "status": { "conditions": [condition] },
        });
        if conflicts > 0 {
            body["status"]["relatedConflictCount"] = Value::from(conflicts as i64);
        }
        let params = PatchParams::apply(keys::RELATED_STATUS_FIELD_MANAGER).force();
        let result = match binding {
            AnyBinding::Cluster(_) => {
                Api::<kbind_shared::api::ClusterBinding>::all(self.ctx.client.clone())
                    .patch_status(&self.spec.name, &params, &Patch::Apply(&body))
                    .await
                    .map(drop)
            }
            AnyBinding::Namespaced(b) => {
                body["metadata"]["namespace"] = Value::from(b.namespace().unwrap_or_default());
                Api::<kbind_shared::api::Binding>::namespaced(
                    self.ctx.client.clone(),
                    &b.namespace().unwrap_or_default(),
                )
                .patch_status(&self.spec.name, &params, &Patch::Apply(&body))
                .await
                .map(drop)
            }
        };
        if let Err(e) = result {
            tracing::warn!(binding = %describe(&self.spec), error = %describe_error(&e), "cannot write the related-resources status");
        }
    }
}
