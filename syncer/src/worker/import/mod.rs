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

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kbind_shared::cache::{Instance, Json, ProviderCopy};
use kbind_shared::import::Standing;
use kbind_shared::sync::Locked;
use kbind_shared::{delivery, keys};
use kube::ResourceExt;
use kube::runtime::events::{Event, EventType};

use super::pending::{self, Key};
use super::state::Worker;
use crate::bindings::ImportRule;

mod plan;
mod reader;
mod writes;

use plan::{Offered, OverLimit, Present, Write};
use reader::{Reader, importable, reach};
use writes::{Done, Left, Op};

/// The least time between two looks.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// How long a look waits after the first trigger, for the ones that follow it.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// Writes made at once.
const CONCURRENT_WRITES: usize = 8;

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
