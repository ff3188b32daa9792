//! Related Secrets and ConfigMaps of one binding (REFERENCE-BEHAVIOUR §13, improved): watch-driven
//! copies in either direction, per-entry garbage collection, conflicts reported on the binding.
//!
//! One worker runs per binding that lists `relatedResources`, on the syncer replica the
//! assignment gives that binding's unit to, so the work spreads with the replicas and never has
//! two writers. The worker watches, in the binding's scope only (its namespace on both clusters
//! for a Binding), the sources its entries read and the labelled copies on the target side; every
//! event leads to one pass that compares wanted and actual copies and writes only what differs.

pub mod plan;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kbind_shared::api::RelatedResourceKind;
use kbind_shared::conditions::{self, Desired, reasons, types};
use kbind_shared::identity::describe_error;
use kbind_shared::keys;
use kbind_shared::kubeconfig::InlineKubeconfig;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams,
    Preconditions,
};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::context::{AnyBinding, Context};
use crate::namespaces;
use plan::{Entry, Item, KindKey, Marker, Side, Step, TargetKey, Wanted};

/// The backstop when nothing happens.
const RESYNC: Duration = Duration::from_secs(30);
/// How soon to look again while something is wrong (a conflict may be resolved by deleting the
/// foreign object, which no watch of ours sees).
const RETRY: Duration = Duration::from_secs(5);
/// How long to gather a burst of events into one pass.
const DEBOUNCE: Duration = Duration::from_millis(50);

/// Which binding, and with which provider.
pub struct RelatedSpec {
    /// The Binding's namespace; `None` for a ClusterBinding.
    pub namespace: Option<String>,
    /// The binding's name.
    pub name: String,
    /// The binding's UID (the worker ends if the binding is replaced).
    pub uid: String,
    /// The binding's generation the worker was built for: its watches follow that spec, so a
    /// newer spec waits for the worker to be rebuilt.
    pub generation: i64,
    /// The Connection.
    pub connection: String,
    /// Whether the Connection lets Secrets be copied to the provider (`spec.access`).
    pub secrets_to_provider: bool,
    /// The consumer's pinned identity.
    pub local_uid: String,
    /// Provider credentials.
    pub kubeconfig: InlineKubeconfig,
}

/// What a watch has done so far.
#[derive(Debug, Default)]
struct Health {
    listed: bool,
    error: Option<String>,
    forbidden: bool,
}

struct Watched {
    store: Store<DynamicObject>,
    health: Arc<Mutex<Health>>,
}

/// Sources are all objects of a kind in scope; targets only kbind's labelled copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Role {
    Source,
    Target,
}

struct Worker {
    ctx: Arc<Context>,
    spec: RelatedSpec,
    provider: Client,
    watched: HashMap<(KindKey, Side, Role), Watched>,
    recorder: Recorder,
    known_namespaces: Mutex<HashSet<(Side, String)>>,
    conflicts: Mutex<BTreeSet<TargetKey>>,
    swept_unused: Mutex<bool>,
}

fn resource(kind: RelatedResourceKind) -> ApiResource {
    match kind {
        RelatedResourceKind::Secrets => ApiResource::erase::<Secret>(&()),
        RelatedResourceKind::Configmaps => ApiResource::erase::<ConfigMap>(&()),
    }
}

const KINDS: [RelatedResourceKind; 2] = [
    RelatedResourceKind::Secrets,
    RelatedResourceKind::Configmaps,
];
const SIDES: [Side; 2] = [Side::Consumer, Side::Provider];

/// What one pass found.
#[derive(Debug, Default)]
struct Outcome {
    in_sync: usize,
    conflicts: BTreeMap<TargetKey, String>,
    errors: Vec<(bool, String)>,
}

/// Runs until `stop`, or until the binding is gone or replaced.
pub async fn run(ctx: Arc<Context>, spec: RelatedSpec, stop: CancellationToken) {
    let who = describe(&spec);
    let provider = match spec
        .kubeconfig
        .counted_client(&spec.connection, Some(&ctx.metrics.api_requests_total))
        .await
    {
        Ok(client) => client,
        Err(e) => {
            tracing::warn!(binding = %who, error = %e, "cannot build the provider client");
            return;
        }
    };
    let Some(binding) = ctx.binding(spec.namespace.as_deref(), &spec.name) else {
        return;
    };
    let entries = binding.spec().related_resources.clone();
    let changes = Arc::new(Notify::new());
    let worker_stop = stop.child_token();
    let mut watched = HashMap::new();
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
            watched.insert(
                key,
                watch(
                    client,
                    entry.resource,
                    spec.namespace.as_deref(),
                    role,
                    source_filter(&entries, entry.resource, from).filter(|_| role == Role::Source),
                    worker_stop.clone(),
                    changes.clone(),
                ),
            );
        }
    }
    let worker = Worker {
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
    let bindings = ctx.binding_changes();
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

/// A server-side label selector for a source watch when every entry reading this kind from this
/// side selects by labels with `matchLabels` only: the watch then carries only what can match.
fn source_filter(
    entries: &[kbind_shared::api::RelatedResource],
    kind: RelatedResourceKind,
    side: Side,
) -> Option<String> {
    let mut common: Option<String> = None;
    for entry in entries
        .iter()
        .filter(|e| e.resource == kind && plan::sides(e.direction).0 == side)
    {
        let selector = entry.selector.as_ref()?.label_selector.as_ref()?;
        if selector
            .match_expressions
            .as_ref()
            .is_some_and(|e| !e.is_empty())
        {
            return None;
        }
        let labels = selector.match_labels.as_ref().filter(|l| !l.is_empty())?;
        let text = labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        match &common {
            None => common = Some(text),
            Some(existing) if *existing == text => {}
            Some(_) => return None,
        }
    }
    common
}

fn watch(
    client: Client,
    kind: RelatedResourceKind,
    namespace: Option<&str>,
    role: Role,
    source_labels: Option<String>,
    stop: CancellationToken,
    changes: Arc<Notify>,
) -> Watched {
    let resource = resource(kind);
    let api = kbind_shared::dynamic::scoped(&client, namespace, &resource);
    let config = match (role, source_labels) {
        (Role::Target, _) => {
            watcher::Config::default().labels(&format!("{}={}", keys::MANAGED_LABEL, keys::TRUE))
        }
        (Role::Source, Some(labels)) => watcher::Config::default().labels(&labels),
        (Role::Source, None) => watcher::Config::default(),
    };
    let writer = reflector::store::Writer::<DynamicObject>::new(resource);
    let store = writer.as_reader();
    let health = Arc::new(Mutex::new(Health::default()));
    kbind_shared::cache::observe(writer, api, config, stop, {
        let health = health.clone();
        move |event| {
            let mut health = health.lock().expect("not poisoned");
            match event {
                Ok(watcher::Event::InitDone) => {
                    health.listed = true;
                    health.error = None;
                    health.forbidden = false;
                }
                Ok(_) => {}
                Err(e) => {
                    health.forbidden = matches!(e, watcher::Error::InitialListFailed(kube::Error::Api(s)) | watcher::Error::WatchStartFailed(kube::Error::Api(s)) if s.is_forbidden());
                    health.error = Some(e.to_string());
                }
            }
            changes.notify_one();
        }
    });
    Watched { store, health }
}

fn item(object: &DynamicObject) -> Item {
    Item {
        namespace: object.namespace().unwrap_or_default(),
        name: object.name_any(),
        uid: object.metadata.uid.clone().unwrap_or_default(),
        labels: object.labels().clone(),
        annotations: object.annotations().clone(),
        payload: plan::PAYLOAD_FIELDS
            .iter()
            .filter_map(|f| object.data.get(*f).map(|v| ((*f).to_owned(), v.clone())))
            .collect(),
    }
}

impl Worker {
    fn client(&self, side: Side) -> &Client {
        match side {
            Side::Consumer => &self.ctx.client,
            Side::Provider => &self.provider,
        }
    }

    fn api(&self, kind: RelatedResourceKind, side: Side, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client(side).clone(), namespace, &resource(kind))
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
        let entries: Result<Vec<Entry>, String> = spec
            .related_resources
            .iter()
            .enumerate()
            .map(|(i, e)| Entry::parse(i, e))
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
            self.spec.secrets_to_provider,
            &self.spec.connection,
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
                let health = watched.health.lock().expect("not poisoned");
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
                                && e.selects(o.labels(), &o.name_any())
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
        let marker = Marker {
            binding_uid: &self.spec.uid,
            local_uid: &self.spec.local_uid,
        };
        let mut outcome = Outcome::default();
        for (key, want) in &wanted {
            self.copy(key, want, &marker, spec.conflict_policy, &mut outcome)
                .await;
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
        let desired = if let Some((forbidden, first)) = outcome.errors.first().cloned() {
            let more = match outcome.errors.len() {
                1 => String::new(),
                n => format!(" (and {} more errors)", n - 1),
            };
            Desired::new(
                types::RELATED_RESOURCES_SYNCED,
                false,
                if forbidden {
                    reasons::FORBIDDEN
                } else {
                    reasons::ERROR
                },
                format!("{first}{more}"),
            )
        } else if conflicts > 0 {
            let listed: Vec<String> = outcome
                .conflicts
                .iter()
                .take(3)
                .map(|(k, why)| format!("{k} {why}"))
                .collect();
            let more = if conflicts > 3 {
                format!("; and {} more", conflicts - 3)
            } else {
                String::new()
            };
            Desired::new(
                types::RELATED_RESOURCES_SYNCED,
                false,
                reasons::CONFLICTS,
                format!(
                    "{conflicts} related object(s) left alone: {}{more}",
                    listed.join("; ")
                ),
            )
        } else {
            Desired::new(
                types::RELATED_RESOURCES_SYNCED,
                true,
                reasons::AS_EXPECTED,
                format!(
                    "{} related object(s) copied and in sync{}",
                    outcome.in_sync,
                    plan::unmatched_note(&entries, &wanted)
                ),
            )
        };
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

    async fn copy(
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
            match self
                .api(key.kind.0, key.side, &key.namespace)
                .get_opt(&key.name)
                .await
            {
                Ok(Some(found)) => {
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
                                .lock()
                                .expect("not poisoned")
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
        self.api(key.kind.0, key.side, &key.namespace)
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
            match self
                .api(key.kind.0, key.side, &key.namespace)
                .delete(&key.name, &params)
                .await
            {
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

    async fn delete(
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
        match self
            .api(kind, side, &garbage.namespace)
            .delete(&garbage.name, &params)
            .await
        {
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
    async fn sweep_unused_kinds(&self, entries: &[Entry], outcome: &mut Outcome) {
        if *self.swept_unused.lock().expect("not poisoned") {
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
                let api = kbind_shared::dynamic::scoped(
                    self.client(side),
                    self.spec.namespace.as_deref(),
                    &resource(kind),
                );
                let list = api
                    .list(&ListParams::default().labels(&format!(
                        "{}={}",
                        keys::MANAGED_LABEL,
                        keys::TRUE
                    )))
                    .await;
                match list {
                    Ok(list) => {
                        for object in list.items {
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
        *self.swept_unused.lock().expect("not poisoned") = complete;
    }

    fn failed(&self, outcome: &mut Outcome, what: String, error: &kube::Error) {
        let forbidden = matches!(error, kube::Error::Api(s) if s.is_forbidden());
        let message = format!("{what}: {}", describe_error(error));
        tracing::warn!(binding = %describe(&self.spec), error = %message, "related resources");
        outcome.errors.push((forbidden, message));
    }

    /// LIM-26-like: a provider namespace is created only when a GET says it is missing. Consumer
    /// namespaces are never created (safe by default): a copy waits until its namespace exists.
    async fn ensure_namespace(&self, side: Side, namespace: &str) -> Result<(), kube::Error> {
        if side == Side::Consumer {
            return Ok(());
        }
        let known = (side, namespace.to_owned());
        if self
            .known_namespaces
            .lock()
            .expect("not poisoned")
            .contains(&known)
        {
            return Ok(());
        }
        let object = Namespace {
            metadata: ObjectMeta {
                name: Some(namespace.to_owned()),
                labels: Some([(keys::MANAGED_LABEL.to_owned(), keys::TRUE.to_owned())].into()),
                annotations: Some(
                    [(
                        keys::CONSUMER_CLUSTER_UID_ANNOTATION.to_owned(),
                        self.spec.local_uid.clone(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces::create_if_missing(self.client(side), &object).await?;
        self.known_namespaces
            .lock()
            .expect("not poisoned")
            .insert(known);
        Ok(())
    }

    /// A Warning Event on the binding for each conflict not seen in the previous pass.
    async fn announce_new_conflicts(
        &self,
        binding: &AnyBinding,
        conflicts: &BTreeMap<TargetKey, String>,
    ) {
        let new: Vec<(TargetKey, String)> = {
            let mut seen = self.conflicts.lock().expect("not poisoned");
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
        let condition = conditions::find(&current, types::RELATED_RESOURCES_SYNCED)
            .cloned()
            .expect("just set");
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
