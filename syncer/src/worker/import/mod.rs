//! Observe-first import (#54): a binding with `spec.import` gets a consumer mirror of each
//! provider object in its scope that no consumer has marked — spec and status from the provider,
//! labelled `core.kbind.io/imported`, its delivery record `Observed` — and nothing is written to
//! the provider for it. A user claims a mirror with `core.kbind.io/claim: "true"`: from then on it
//! is an ordinary object of the worker's, whose first spec-up adds kbind's markers to the
//! provider object (one write, the claim adopting it) — import leaves it alone.
//!
//! The mirrors follow the provider: a provider change is copied, a user's edit of a mirror is
//! reverted with a Warning Event (a mirror is read-only until claimed — reverted rather than
//! refused by an admission policy, so that it holds wherever kbind runs, chart or not, and with
//! no admission rule over every API group), a mirror whose provider object is gone — deleted,
//! marked by a consumer, or out of every importing binding's scope — is deleted. Claimed objects,
//! the user's own objects and other Connections' mirrors are never touched.
//!
//! The provider is read by a watch of its own, of unmarked objects only (a label selector),
//! where importing bindings ask: a ClusterBinding's import cluster-wide, a Binding's in its
//! namespace (mapped into a boundary, #51); rebuilt when that changes. Each look is a pure
//! [`plan`] over the two caches; looks are debounced and at most one a second.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kbind_shared::cache::{Instance, Json, ProviderCopy};
use kbind_shared::import::Standing;
use kbind_shared::namespaced::{Command, Namespaced};
use kbind_shared::sync::Locked;
use kbind_shared::{delivery, keys};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PostParams, Preconditions, TypeMeta};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::task::JoinHandle;

use super::pending::{self, Key};
use super::state::Worker;
use super::writes::{consumer_patch, result_label};
use crate::bindings::ImportRule;

mod plan;

use plan::{Offered, OverLimit, Present, Write};

/// The least time between two looks.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// How long a look waits after the first trigger, for the ones that follow it.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// Writes made at once.
const CONCURRENT_WRITES: usize = 8;

/// Where the provider is read for import.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reach {
    /// Nowhere: no binding imports the API here.
    Nowhere,
    /// Cluster-wide: a ClusterBinding imports it.
    Cluster,
    /// In these consumer namespaces (mapped into a boundary).
    Namespaces(BTreeSet<String>),
}

/// Where `rules` read, within `buckets` — cluster-wide only outside a boundary (a boundary's
/// credential reads its own namespaces only: a ClusterBinding's import there reads nothing).
fn reach(rules: &[ImportRule], buckets: &super::Buckets, boundary: bool) -> Reach {
    if !boundary && rules.iter().any(|r| r.namespace.is_none()) {
        return Reach::Cluster;
    }
    let namespaces: BTreeSet<String> = rules
        .iter()
        .filter_map(|r| r.namespace.clone())
        .filter(|ns| buckets.contains(Some(ns)))
        .collect();
    if namespaces.is_empty() {
        Reach::Nowhere
    } else {
        Reach::Namespaces(namespaces)
    }
}

/// The provider watch of unmarked objects: its cache, whether it has listed, and its task.
struct Reader {
    reach: Reach,
    store: Option<Store<ProviderCopy>>,
    listed: Arc<AtomicBool>,
    task: Option<JoinHandle<()>>,
}

impl Drop for Reader {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// The selection of objects no consumer has marked: without any consumer cluster's label.
fn unmarked() -> watcher::Config {
    watcher::Config::default().labels(&format!("!{}", keys::CONSUMER_CLUSTER_UID_LABEL))
}

impl Reader {
    fn nowhere() -> Self {
        Reader {
            reach: Reach::Nowhere,
            store: None,
            listed: Arc::new(AtomicBool::new(true)),
            task: None,
        }
    }

    /// Starts reading `reach` for `worker`; each event wakes the importer.
    fn start(worker: &Arc<Worker>, reach: Reach) -> Self {
        let (client, dyntype) = (worker.provider.clone(), worker.dyntype.clone());
        let source = match &reach {
            Reach::Nowhere => return Self::nowhere(),
            Reach::Cluster => {
                kbind_shared::streaming::instances(Api::all_with(client, &dyntype), unmarked())
            }
            Reach::Namespaces(namespaces) => {
                let open = kbind_shared::namespaced::in_boundary(
                    worker.spec.namespaces.clone(),
                    move |namespace| {
                        kbind_shared::streaming::instances(
                            Api::namespaced_with(client.clone(), namespace, &dyntype),
                            unmarked(),
                        )
                    },
                );
                let (commands, rx) = futures::channel::mpsc::unbounded();
                for namespace in namespaces {
                    let _ = commands.unbounded_send(Command::Watch(namespace.clone()));
                }
                let _ = commands.unbounded_send(Command::Complete);
                Namespaced::new(open, rx, super::feeds::tombstone).boxed()
            }
        };
        let writer = reflector::store::Writer::new(worker.dyntype.clone());
        let store = writer.as_reader();
        let listed = Arc::new(AtomicBool::new(false));
        let (uid, max_bytes) = (
            worker.spec.local_uid.clone(),
            worker.ctx.limits.max_status_bytes,
        );
        let events = reflector::reflector(
            writer,
            futures::TryStreamExt::map_ok(source, move |event| {
                kbind_shared::cache::map_event(event, |o| {
                    ProviderCopy::of(o, &uid).bounded(max_bytes)
                })
            }),
        )
        .default_backoff();
        let (done, wake) = (listed.clone(), worker.clone());
        let api = worker.spec.api.clone();
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::InitDone) => done.store(true, Ordering::Release),
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(%api, error = %e, "import watch");
                        continue;
                    }
                }
                wake.import_wake.notify_one();
            }
        });
        Reader {
            reach,
            store: Some(store),
            listed,
            task: Some(task),
        }
    }

    /// The unmarked provider objects read, if the watch has listed (`Some(empty)`: nothing is
    /// read).
    fn objects(&self) -> Option<Vec<Arc<ProviderCopy>>> {
        if !self.listed.load(Ordering::Acquire) {
            return None;
        }
        Some(self.store.as_ref().map(Store::state).unwrap_or_default())
    }
}

/// Whether a provider object may be imported: no consumer's marker of either kind, kbind's
/// managed label absent (another consumer's copy, or one half-written), not being deleted.
fn importable(copy: &ProviderCopy) -> bool {
    copy.owner("") == kbind_shared::ownership::Owner::Unmarked && !copy.managed && !copy.terminating
}

/// The importer of one worker.
struct Importer {
    worker: Arc<Worker>,
    reader: Reader,
    /// The generation each mirror had after import's last spec write (a later one is a user's
    /// edit), and when it was written (a mirror just created that the cache does not show yet is
    /// not created again).
    written: HashMap<Key, (Option<i64>, Instant)>,
    /// What each binding's limit left out at the last look, as last announced.
    announced: BTreeMap<(Option<String>, String), usize>,
    /// The last refusal announced (RBAC: the chart's `import` value is off).
    refused: Option<String>,
    /// Mirrors whose creation failed (their namespace missing on the consumer, RBAC, validation),
    /// and when: not tried again for [`plan::RETRY_AFTER`] — a provider with many objects kbind cannot
    /// mirror costs one attempt each per wait, not one per look.
    failed: HashMap<Key, Instant>,
    /// When a creation left out for one of those reasons is due: the next look then.
    due: Option<Instant>,
    /// What import last wrote to each mirror (a digest of the spec and status it wanted) and the
    /// resourceVersion its write left: a mirror still showing that version was changed by nobody
    /// since, so a difference that remains is the consumer's API server's doing (a schema that
    /// prunes or defaults differently) — written once, not again at every look.
    settled: HashMap<Key, (u64, String)>,
}

/// Runs `worker`'s import until the worker stops.
pub(super) async fn run(worker: Arc<Worker>) {
    let bindings = worker.ctx.binding_changes();
    for state in ["observed", "over_limit"] {
        worker
            .ctx
            .metrics
            .imported_objects
            .with_label_values(&[worker.spec.api.as_str(), state])
            .set(0.0);
    }
    if worker.consumer_objects.wait_until_ready().await.is_err() {
        return;
    }
    let api = worker.spec.api.clone();
    let mut importer = Importer {
        worker: worker.clone(),
        reader: Reader::nowhere(),
        written: HashMap::new(),
        announced: BTreeMap::new(),
        refused: None,
        failed: HashMap::new(),
        due: None,
        settled: HashMap::new(),
    };
    let mut bursts = std::pin::pin!(bindings.ready_chunks(1024));
    let mut last = Instant::now() - LOOK_EVERY;
    loop {
        let rules = worker.ctx.imports(&worker.spec.connection, &api);
        importer.follow(&rules);
        // A look with nothing read and no rule is still one: mirrors left without a binding go.
        if let Some(objects) = importer.reader.objects() {
            importer.look(&rules, objects).await;
            last = Instant::now();
        }
        // Until something that concerns this API's import happens.
        loop {
            tokio::select! {
                burst = bursts.next() => match burst {
                    None => return,
                    Some(burst) if burst.iter().any(|t| t.concerns_api(&api)) => break,
                    Some(_) => {}
                },
                () = worker.import_wake.notified() => break,
                () = until(importer.due) => break,
                () = tokio::time::sleep(worker.ctx.resync_interval) => break,
            }
        }
        tokio::time::sleep(DEBOUNCE.max(LOOK_EVERY.saturating_sub(last.elapsed()))).await;
    }
}

impl Importer {
    /// Reads the provider where `rules` ask, restarting the watch when that changed.
    fn follow(&mut self, rules: &[ImportRule]) {
        let boundary = self.worker.spec.namespaces.boundary().is_some();
        let wanted = reach(rules, &self.worker.spec.buckets, boundary);
        if wanted != self.reader.reach {
            tracing::debug!(api = %self.worker.spec.api, reach = ?wanted, "import reads");
            self.reader = Reader::start(&self.worker, wanted);
        }
    }

    /// One look: the plan over both caches, and its writes.
    async fn look(&mut self, rules: &[ImportRule], objects: Vec<Arc<ProviderCopy>>) {
        let worker = self.worker.clone();
        let spec = &worker.spec;
        let objects: Vec<Arc<ProviderCopy>> = objects
            .into_iter()
            .filter(|c| importable(c) && spec.buckets.contains(c.namespace.as_deref()))
            .collect();
        let statuses: Vec<Option<Json>> = objects
            .iter()
            .map(|c| mirror_status(spec.has_delivery, c))
            .collect();
        let offered: Vec<Offered<'_>> = objects
            .iter()
            .zip(&statuses)
            .map(|(c, status)| Offered {
                namespace: c.namespace.as_deref(),
                name: &c.name,
                spec: c.spec.as_ref(),
                status: status.as_ref(),
            })
            .collect();
        let names: std::collections::HashSet<(Option<&str>, &str)> =
            offered.iter().map(|o| (o.namespace, o.name)).collect();
        let consumer: Vec<Arc<Instance>> = worker
            .consumer_objects
            .state()
            .into_iter()
            .filter(|o| {
                o.labels.get(keys::IMPORTED_LABEL).is_some()
                    || names.contains(&(
                        o.metadata.namespace.as_deref(),
                        o.metadata.name.as_deref().unwrap_or_default(),
                    ))
            })
            .collect();
        let present: Vec<Present<'_>> = consumer
            .iter()
            .map(|o| Present {
                namespace: o.metadata.namespace.as_deref(),
                name: o.metadata.name.as_deref().unwrap_or_default(),
                standing: standing_of(&worker, o),
                deleting: o.metadata.deletion_timestamp.is_some(),
                spec: o.spec.as_ref(),
                status: o.status.as_ref(),
                edited: self
                    .written
                    .get(&pending::key(o.as_ref()))
                    .is_some_and(|(g, _)| *g != o.metadata.generation),
            })
            .collect();
        let plan = plan::plan(
            rules,
            |namespace| {
                worker
                    .ctx
                    .resolve(&spec.connection, &spec.api, namespace)
                    .is_some_and(|r| r.is_bound())
            },
            &offered,
            &present,
        );
        // A creation waits while its mirror was just made (the cache has not shown it yet) or
        // after it failed; the next look is when the first of them is due.
        let now = Instant::now();
        let waits_until = |o: usize| {
            let key = (
                objects[o].namespace.as_deref().map(str::to_owned),
                objects[o].name.to_string(),
            );
            plan::creation_due(
                now,
                self.written.get(&key).map(|(_, at)| *at),
                self.failed.get(&key).copied(),
            )
        };
        self.due = None;
        let digests: Vec<u64> = objects
            .iter()
            .zip(&statuses)
            .map(|(c, status)| digest(c.spec.as_ref(), status.as_ref()))
            .collect();
        let settled = |p: usize, o: usize| {
            let mirror = &consumer[p];
            plan::written_so(
                self.settled.get(&pending::key(mirror.as_ref())),
                digests[o],
                mirror.metadata.resource_version.as_deref(),
            )
        };
        let mut writes = Vec::new();
        for write in &plan.writes {
            match *write {
                Write::Create { offered: o } => {
                    if let Some(due) = waits_until(o) {
                        self.due = Some(self.due.map_or(due, |d| d.min(due)));
                        continue;
                    }
                }
                Write::Mirror {
                    present: p,
                    offered: o,
                    ..
                } if settled(p, o) => {
                    tracing::debug!(api = %spec.api, object = %consumer[p].name_any(), "import: the consumer keeps the mirror other than written; not written again");
                    continue;
                }
                _ => {}
            }
            writes.push(write);
        }
        let writes = writes.into_iter();
        let writes = writes.map(|write| match *write {
            Write::Create { offered: o } => Op::Create(
                objects[o].clone(),
                statuses[o].as_ref().map(Json::value),
                digests[o],
            ),
            Write::Mirror {
                present: p,
                offered: o,
                spec,
                status,
                revert,
            } => Op::Mirror {
                object: consumer[p].clone(),
                spec: spec.then(|| objects[o].spec.as_ref().map(Json::value)),
                status: status.then(|| statuses[o].as_ref().map(Json::value)),
                revert,
                digest: digests[o],
            },
            Write::Delete { present: p } => Op::Delete(consumer[p].clone()),
        });
        let writes: Vec<Op> = writes.collect();
        let done: Vec<Done> = futures::stream::iter(writes)
            .map(|op| op.run(&worker))
            .buffer_unordered(CONCURRENT_WRITES)
            .collect()
            .await;
        for (key, left, settled) in done {
            if let Some(settled) = settled {
                self.settled.insert(key.clone(), settled);
            }
            match left {
                Left::Spec(generation) => {
                    self.failed.remove(&key);
                    self.written.insert(key, (generation, Instant::now()));
                }
                Left::Gone => {
                    self.written.remove(&key);
                    self.settled.remove(&key);
                }
                Left::Refused => {
                    self.failed.insert(key, Instant::now());
                }
                Left::Same => {}
            }
        }
        // What is known of mirrors that went some other way (a user, an unbind) is forgotten.
        let present: std::collections::HashSet<Key> =
            consumer.iter().map(|o| pending::key(o.as_ref())).collect();
        let now = Instant::now();
        self.written.retain(|key, (_, at)| {
            present.contains(key) || plan::creation_due(now, Some(*at), None).is_some()
        });
        self.failed
            .retain(|_, at| plan::creation_due(now, None, Some(*at)).is_some());
        self.settled.retain(|key, _| present.contains(key));
        self.report(rules, plan.imported, &plan.over_limit).await;
    }

    /// The gauges, and a Warning Event on each binding whose limit leaves objects out (when that
    /// changes).
    async fn report(&mut self, rules: &[ImportRule], imported: usize, over: &[OverLimit]) {
        let worker = &self.worker;
        let api = worker.spec.api.as_str();
        let gauge = |state: &str, n: usize| {
            worker
                .ctx
                .metrics
                .imported_objects
                .with_label_values(&[api, state])
                .set(n as f64);
        };
        gauge("observed", imported);
        gauge("over_limit", over.iter().map(|o| o.left_out).sum());
        let now: BTreeMap<(Option<String>, String), usize> = over
            .iter()
            .map(|o| {
                let rule = &rules[o.rule];
                ((rule.namespace.clone(), rule.binding.clone()), o.left_out)
            })
            .collect();
        for ((namespace, name), left_out) in &now {
            if self.announced.get(&(namespace.clone(), name.clone())) == Some(left_out) {
                continue;
            }
            let Some(binding) = worker.ctx.binding(namespace.as_deref(), name) else {
                continue;
            };
            let limit = binding.spec().import.as_ref().map_or(0, |i| i.limit);
            let note = format!(
                "{left_out} provider objects of {api} are not imported: past spec.import.limit ({limit})"
            );
            self.warn(&binding, "ImportLimitReached", note).await;
        }
        self.announced = now;
        // A refusal is said once on each importing binding, until another is met.
        let refused = worker.import_refused.locked().take();
        if let Some(message) = refused
            && self.refused.as_ref() != Some(&message)
        {
            tracing::warn!(%api, %message, "import refused");
            for rule in rules {
                if let Some(binding) = worker.ctx.binding(rule.namespace.as_deref(), &rule.binding)
                {
                    self.warn(&binding, "ImportForbidden", message.clone())
                        .await;
                }
            }
            self.refused = Some(message);
        }
    }

    /// A Warning Event on `binding`.
    async fn warn(&self, binding: &crate::context::AnyBinding, reason: &str, note: String) {
        let event = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note),
            action: "Import".into(),
            secondary: None,
        };
        if let Err(e) = self
            .worker
            .recorder
            .publish(&event, &binding.object_ref())
            .await
        {
            tracing::debug!(error = %e, "cannot publish Event");
        }
    }
}

/// Where `object` stands towards observe-first import .
pub(in crate::worker) fn standing_of(worker: &Worker, object: &Instance) -> Standing {
    kbind_shared::import::standing(
        object.labels.get(keys::IMPORTED_LABEL),
        object
            .annotations()
            .get(keys::CLAIM_ANNOTATION)
            .map(String::as_str),
        kbind_shared::finalizers::has(&object.metadata, &worker.spec.finalizer()),
        &worker.spec.connection,
    )
}

/// Ready at `due`; never when none.
async fn until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due.into()).await,
        None => std::future::pending().await,
    }
}

/// A digest of what a mirror should hold: its spec and status texts.
fn digest(spec: Option<&Json>, status: Option<&Json>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    spec.map(Json::as_str).hash(&mut hasher);
    status.map(Json::as_str).hash(&mut hasher);
    hasher.finish()
}

/// The consumer status that mirrors provider object `copy`: its status (none when larger than
/// `--max-status-bytes`) with the `Observed` record where the CRD has kbind's record.
fn mirror_status(has_delivery: bool, copy: &ProviderCopy) -> Option<Json> {
    let status = copy.status.as_ref().map(Json::value);
    if has_delivery {
        Some(Json::new(&delivery::with_record(
            status.as_ref(),
            &delivery::observed(),
        )))
    } else {
        status.map(|s| Json::new(&s))
    }
}

/// A write done: the object's key, what it left, and — when every request succeeded — the digest
/// it wrote with the resourceVersion that left.
type Done = (Key, Left, Option<(u64, String)>);

/// What a write leaves for the next look to know of the object.
enum Left {
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
enum Op {
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
    async fn run(self, worker: &Worker) -> Done {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(namespace: Option<&str>) -> ImportRule {
        ImportRule {
            namespace: namespace.map(str::to_owned),
            binding: "b".into(),
            limit: 10,
        }
    }

    #[test]
    fn import_reads_cluster_wide_only_for_a_cluster_binding_outside_a_boundary() {
        let all = super::super::Buckets::All;
        let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
        assert_eq!(reach(&[], &all, false), Reach::Nowhere);
        assert_eq!(
            reach(&[rule(Some("a")), rule(Some("b"))], &all, false),
            Reach::Namespaces(set(&["a", "b"]))
        );
        assert_eq!(
            reach(&[rule(Some("a")), rule(None)], &all, false),
            Reach::Cluster
        );
        assert_eq!(
            reach(&[rule(Some("a")), rule(None)], &all, true),
            Reach::Namespaces(set(&["a"]))
        );
        assert_eq!(reach(&[rule(None)], &all, true), Reach::Nowhere);
    }

    #[test]
    fn only_objects_nobody_marked_are_importable() {
        let object = |annotations: serde_json::Value, labels: serde_json::Value, deleting: bool| {
            let mut metadata = json!({ "name": "w", "namespace": "n", "annotations": annotations, "labels": labels });
            if deleting {
                metadata["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
            let instance: Instance =
                serde_json::from_value(json!({ "metadata": metadata, "spec": {} })).unwrap();
            ProviderCopy::of(instance, "me")
        };
        assert!(importable(&object(json!({}), json!({ "app": "x" }), false)));
        assert!(
            !importable(&object(json!({}), json!({}), true)),
            "being deleted"
        );
        assert!(
            !importable(&object(
                json!({}),
                json!({ keys::MANAGED_LABEL: "true" }),
                false
            )),
            "managed by kbind"
        );
        for marker in [
            keys::CONSUMER_CLUSTER_UID_ANNOTATION,
            keys::CONSUMER_OBJECT_UID_ANNOTATION,
        ] {
            assert!(
                !importable(&object(json!({ marker: "x" }), json!({}), false)),
                "{marker}"
            );
        }
    }
}
