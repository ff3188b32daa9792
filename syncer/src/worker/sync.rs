//! Executing one object's sync (REFERENCE-BEHAVIOUR §17: SYNC, OWN, IDEL): the facts come from
//! the caches, [`decide`] picks the step, and only the step's writes happen.

use kbind_shared::sync::Locked;
use std::sync::Arc;
use std::time::Duration;

use kbind_shared::cache::{Instance, Json, ProviderCopy};
use kbind_shared::delivery;
use kbind_shared::keys;
use kbind_shared::ownership::{self, Owner};
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use serde_json::json;

use super::decide::{Copy, Facts, Paused, Rest, Routing, SpecUp, Step, decide, rest};
use super::pending;
use super::pending::Seen;
use super::state::{Worker, WorkerSpec, object_key};
use super::states::SyncState;
use super::strangers::Known;
use super::writes::{Error, result_label};
use kbind_shared::routing;

/// One sync: gather the facts, [`decide`], execute the step (one executor each). `seen`: when the
/// changes it syncs were first seen, for the lag of the writes that deliver them.
pub(super) async fn sync(
    object: Arc<Instance>,
    worker: Arc<Worker>,
    seen: Seen,
) -> Result<Action, Error> {
    // The fence: a replica whose membership is not current writes nothing.
    if !worker.ctx.membership.is_current() {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let provider_copy = match worker.provider_copy(&object) {
        Some(copy) => Some(copy),
        None => stranger(&worker, &object).await?,
    };
    let gate = gate_of(&worker, &object);
    let facts = facts(&worker, &object, provider_copy.as_deref(), gate.as_ref());
    let (worker, object) = (worker.as_ref(), object.as_ref());
    match decide(&facts) {
        Step::Delete => delete(object, worker).await,
        Step::Idle => Ok(Action::await_change()),
        Step::Unmark => unmark(worker, object).await,
        Step::Release => release(object, worker).await,
        Step::Held { reason, announce } => {
            held(worker, object, gate.as_ref(), reason, announce).await
        }
        Step::Conflict {
            reason,
            owner,
            announce,
        } => {
            let policy = facts.bound.unwrap_or_default();
            conflict(worker, object, policy, reason, owner, announce).await
        }
        Step::Paused(_) => paused(worker, object).await,
        Step::WaitForTerminatingCopy => wait_for_terminating_copy(worker, object).await,
        Step::AddFinalizer => add_finalizer(worker, object, seen).await,
        Step::Sync {
            clear_conflict,
            spec_up,
            route_changed,
        } => {
            if clear_conflict {
                show_route_changed(worker, object, route_changed, gate.as_ref()).await?;
            }
            let delivered = match spec_up {
                Some(how) => match push_spec(worker, object, how, seen).await? {
                    Ok(delivered) => delivered,
                    Err(action) => return Ok(action),
                },
                None => Delivered::as_cached(object, provider_copy.as_deref()),
            };
            worker.note_oversized(object, delivered.oversized).await;
            copy_status(worker, object, provider_copy.as_deref(), delivered, seen).await
        }
    }
}

/// [`Step::Unmark`]: no binding binds the object any more; kbind's conflict annotation goes, and
/// with it routing's record: `Delivery` must not go on saying why kbind holds it.
async fn unmark(worker: &Worker, object: &Instance) -> Result<Action, Error> {
    if object.annotations().contains_key(keys::CONFLICT_ANNOTATION) {
        worker.set_conflict(object, None).await?;
    }
    if let Some(status) = without_hold_record(object.status.as_ref().map(Json::value)) {
        status_down(worker, object, status, "record").await?;
    }
    worker.mark(object, None);
    Ok(Action::await_change())
}

/// [`Step::Held`] (#36): written to no provider; the annotation and the record say why, and a
/// Warning Event when it is new.
async fn held(
    worker: &Worker,
    object: &Instance,
    gate: Option<&routing::Gate>,
    reason: &str,
    announce: bool,
) -> Result<Action, Error> {
    let message = match gate {
        Some(routing::Gate::Hold(_, message)) => message.as_str(),
        _ => "",
    };
    worker.set_conflict(object, Some(reason)).await?;
    record_refusal(worker, object, reason, message).await?;
    if announce {
        worker
            .warn(object, reason, format!("written to no provider: {message}"))
            .await;
        worker.count("route", reason);
    }
    worker.mark(object, Some(SyncState::Conflict));
    Ok(Action::await_change())
}

/// [`Step::Conflict`] (OWN): the provider object is not this consumer object's; `policy` leaves
/// it alone. The annotation says so, and a Warning Event when it is new.
async fn conflict(
    worker: &Worker,
    object: &Instance,
    policy: kbind_shared::api::ConflictPolicy,
    reason: &str,
    owner: Owner,
    announce: bool,
) -> Result<Action, Error> {
    worker.set_conflict(object, Some(reason)).await?;
    if announce {
        let owner_text = if owner == Owner::Unmarked {
            "exists without kbind's markers"
        } else {
            "is owned by another consumer object or cluster"
        };
        let namespace = object
            .namespace()
            .map(|n| format!("{n}/"))
            .unwrap_or_default();
        worker
            .warn(object, reason, format!("the provider object {namespace}{} {owner_text}; conflictPolicy {policy:?} leaves it alone", object.name_any()))
            .await;
        worker.count("spec_up", "conflict");
    }
    worker.mark(object, Some(SyncState::Conflict));
    // A stranger's conflict is looked at again when its read goes stale: no watch event tells
    // when it goes ([`super::strangers`]).
    let recheck = worker
        .strangers
        .locked()
        .recheck_in(&pending::key(object), std::time::Instant::now());
    Ok(recheck.map_or_else(Action::await_change, Action::requeue))
}

/// [`Step::Paused`]: the one write a pause costs is the record saying so (none once it does).
async fn paused(worker: &Worker, object: &Instance) -> Result<Action, Error> {
    if let Some(status) = paused_status(worker, object) {
        status_down(worker, object, status, "record").await?;
    }
    worker.mark(object, Some(SyncState::Paused));
    Ok(Action::await_change())
}

/// [`Step::WaitForTerminatingCopy`]: said once on the object (the same record again writes
/// nothing), not per poll.
async fn wait_for_terminating_copy(worker: &Worker, object: &Instance) -> Result<Action, Error> {
    record_refusal(
        worker,
        object,
        delivery::PENDING,
        "waiting for the provider's previous copy to finish terminating",
    )
    .await?;
    Ok(Action::requeue(Duration::from_secs(1)))
}

/// [`Step::AddFinalizer`]: kbind's finalizer before anything is written to the provider — and a
/// routed object's pin to this route in the same write (#36).
async fn add_finalizer(worker: &Worker, object: &Instance, seen: Seen) -> Result<Action, Error> {
    let finalizers =
        kbind_shared::finalizers::toggled(&object.metadata, &worker.spec.finalizer(), true)
            .unwrap_or_default();
    let pin = worker
        .routing()
        .filter(|_| !object.annotations().contains_key(keys::ROUTE_ANNOTATION))
        .map(|r| r.route.pin_text());
    worker.set_finalizers(object, finalizers, pin).await?;
    // The change still waits for its spec-up (which the finalizer's echo starts): its lag runs
    // from when it was first seen, the creation, not from the echo (#33.3).
    worker
        .pending
        .locked()
        .give_back(pending::key(object), seen);
    Ok(Action::await_change())
}

/// The conflict annotation a [`Step::Sync`] wants: none, or `RouteChanged` (#36) — announced
/// once, when the gate says why.
async fn show_route_changed(
    worker: &Worker,
    object: &Instance,
    route_changed: bool,
    gate: Option<&routing::Gate>,
) -> Result<(), Error> {
    let wanted = route_changed.then_some(super::decide::ROUTE_CHANGED);
    worker.set_conflict(object, wanted).await?;
    if let (
        Some(reason),
        Some(routing::Gate::Sync {
            changed: Some(message),
        }),
    ) = (wanted, gate)
    {
        worker.warn(object, reason, message.clone()).await;
        worker.count("route", reason);
    }
    Ok(())
}

/// What the provider has of the object after a sync's spec step: its status (within the size
/// limit), the size of one too large to copy, and when kbind last wrote its spec.
struct Delivered {
    provider_status: Option<serde_json::Value>,
    oversized: Option<usize>,
    at: Option<String>,
}

impl Delivered {
    /// As the provider cache shows the copy (no spec write this sync).
    fn as_cached(object: &Instance, copy: Option<&ProviderCopy>) -> Self {
        Delivered {
            provider_status: provider_side_status(copy, object),
            oversized: copy.and_then(|c| c.oversized_status),
            at: copy.and_then(ProviderCopy::applied_at),
        }
    }
}

/// SYNC-7/8: the spec up, by server-side apply — create only when no copy is cached. `Ok(Err)`:
/// the sync ends here with that action (a copy appeared meanwhile: classified next time).
async fn push_spec(
    worker: &Worker,
    object: &Instance,
    how: SpecUp,
    seen: Seen,
) -> Result<Result<Delivered, Action>, Error> {
    let spec = &worker.spec;
    let namespace = object.namespace();
    if let Some(ns) = namespace.as_deref()
        && let Err(e) = worker.ensure_provider_namespace(ns).await
    {
        return forbidden_or(worker, object, "create the provider namespace", e)
            .await
            .map(Err);
    }
    let mut body = ownership::spec_up_body(
        &spec.resource.api_version,
        &spec.resource.kind,
        worker.provider_namespace(namespace.as_deref())?.as_deref(),
        &object.name_any(),
        object.spec.as_ref().map(Json::value).as_ref(),
        &spec.local_uid,
        object.metadata.uid.as_deref().unwrap_or_default(),
        &spec.heartbeat(),
    );
    // OWN on fresh facts: with no copy in the cache, the first write only creates. Anything that
    // exists under the name (created in the instant the cache has not seen yet) answers 409, and
    // the next sync classifies it from the cache — it is never forced over.
    let creating = how == SpecUp::Create;
    if creating {
        kbind_shared::apply::create_only(&mut body);
    }
    worker.fence()?;
    let key = pending::key(object);
    worker.provider_echoes.locked().writing(key.clone());
    let applied = worker
        .provider_api(namespace.as_deref())?
        .patch(
            &object.name_any(),
            &PatchParams::apply(keys::FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await;
    let now = std::time::Instant::now();
    let written = applied.as_ref().ok();
    worker.provider_echoes.locked().wrote(
        &key,
        written.and_then(|a| a.metadata.resource_version.as_deref()),
        now,
    );
    match applied {
        Ok(applied) => {
            worker.count("spec_up", "ok");
            // Adopted, or labelled: ours now, and the watch shows it.
            worker.strangers.locked().forget(&key);
            // A new generation is timed from its change as the consumer's API server recorded
            // it; a drift repair (the same generation again) from its receipt.
            let new_generation = object.delivery.as_ref().is_none_or(|d| {
                d.generation.map(std::num::NonZeroI64::get) != object.metadata.generation
            });
            worker.lag(
                "spec_up",
                seen.first(),
                object.changed_at.filter(|_| new_generation),
            );
            worker.pending.locked().spec_applied(key, now);
            let (provider_status, oversized) = match bounded(
                applied.data.get("status"),
                worker.ctx.limits.max_status_bytes,
            ) {
                Ok(status) => (status, None),
                Err(size) => (object.status.as_ref().map(Json::value), Some(size)),
            };
            Ok(Ok(Delivered {
                provider_status,
                oversized,
                at: delivery::applied_at(&applied.metadata),
            }))
        }
        Err(e) if creating && kbind_shared::apply::exists(&e) => {
            tracing::debug!(api = %spec.api, object = %object.name_any(), "a provider object exists under the name; classifying it");
            // Ours and labelled: the cache shows it shortly. Anything else: decided from what was
            // read, at once.
            let wait = match read_stranger(worker, object).await? {
                Known::Fresh(_) => Duration::from_millis(10),
                _ => Duration::from_millis(200),
            };
            Ok(Err(Action::requeue(wait)))
        }
        Err(kube::Error::Api(s)) if s.is_not_found() => {
            // The provider namespace went away under us: forget it, create it next time.
            if let Some(ns) = namespace.as_deref() {
                worker.forget_namespace(ns);
            }
            Err(Error::Provider(kube::Error::Api(s)))
        }
        Err(e) => forbidden_or(worker, object, "apply the spec to the provider", e)
            .await
            .map(Err),
    }
}

/// SYNC-9: the status down, only when it differs — with kbind's delivery record, which says the
/// current generation reached the provider; paced per object, and a record alone waits a while
/// for the provider's status change to carry it.
async fn copy_status(
    worker: &Worker,
    object: &Instance,
    provider_copy: Option<&ProviderCopy>,
    delivered: Delivered,
    seen: Seen,
) -> Result<Action, Error> {
    let current = object.status.as_ref().map(Json::value);
    let current = current.as_ref();
    let desired = desired_status(
        &worker.spec,
        object,
        delivered.provider_status,
        delivered.at,
    );
    let Some(status) = desired.filter(|status| current != Some(status)) else {
        worker.mark(object, Some(SyncState::Synced));
        // The backstop resync is one periodic pass over the whole cache (`resync_ticks` in the
        // worker), not a timer per object: at rest a synced object costs no scheduler entry.
        return Ok(Action::await_change());
    };
    let key = pending::key(object);
    let now = std::time::Instant::now();
    // A provider rewriting a status faster than --status-min-interval is copied at that pace;
    // the next sync copies whatever is latest then.
    let paced = worker.pending.locked().status_write_wait(&key, now);
    if let Some(wait) = paced {
        worker.pending.locked().give_back(key, seen);
        return Ok(Action::requeue(wait));
    }
    if !delivery::differs_beyond_record(current, Some(&status)) {
        // A Pending record (a late change's, or a failure's that a retry overcame) is corrected
        // at once: it would go on saying the spec has not arrived. Any other waits to be carried
        // (a Paused record after a resume: one write, as always).
        let says_pending = object
            .delivery
            .as_ref()
            .is_some_and(|r| r.state == delivery::State::Pending);
        let wait = (!says_pending)
            .then(|| worker.pending.locked().record_wait_left(&key, now))
            .flatten();
        if let Some(wait) = wait {
            // Only the record is new: the status change the provider makes for this spec will
            // carry it, in the one consumer write a change costs. If none comes soon (how soon
            // is learned from the provider's recent answers), the record is written on its own.
            worker.mark(object, Some(SyncState::Synced));
            return Ok(Action::requeue(wait));
        }
        status_down(worker, object, status, "record").await?;
    } else {
        status_down(worker, object, status, "status_down").await?;
        worker
            .pending
            .locked()
            .status_carried(&key, seen.provider_latest.unwrap_or(now));
        // A provider change (or one learned of late: a restart, a resync) is timed from the
        // provider's API server's record of its status write too; a consumer-side trigger (a
        // status someone else edited, restored) from its receipt.
        let provider_side = seen.provider.is_some() || seen.first().is_none();
        worker.lag(
            "status_down",
            seen.provider.or(seen.consumer),
            provider_copy
                .and_then(|c| c.status_at)
                .filter(|_| provider_side),
        );
    }
    worker.mark(object, Some(SyncState::Synced));
    Ok(Action::await_change())
}

/// The status without kbind's record, when the record says routing held the object (`None`:
/// it does not, nothing to write).
fn without_hold_record(status: Option<serde_json::Value>) -> Option<serde_json::Value> {
    let held = delivery::summary(status.as_ref())?.state == delivery::State::Held;
    let mut status = status?;
    held.then(|| {
        if let Some(map) = status.as_object_mut() {
            map.remove(delivery::FIELD);
        }
        status
    })
}

/// #36: what routing says about `object` for this worker's route, when its API is routed.
pub(super) fn gate_of(worker: &Worker, object: &Instance) -> Option<routing::Gate> {
    let namespace = object.metadata.namespace.as_deref();
    // A pin to a Connection this namespace may not use says so, naming the access rule.
    let barred = |connection: &str| {
        let (_, access) = worker.ctx.pinned_provider(connection)?;
        routing::barred(connection, namespace, access.binding_namespaces.as_deref())
    };
    let Some(spec) = worker.routing() else {
        return routing::unrouted(
            &worker.spec.connection,
            object
                .annotations()
                .get(keys::ROUTE_ANNOTATION)
                .map(String::as_str),
            object.metadata.finalizers.as_deref().unwrap_or_default(),
            &barred,
        );
    };
    let offers = worker.ctx.route_offers(&worker.spec.api, namespace);
    let candidates = routing::candidates(&offers, &worker.spec.api, namespace);
    let pin = routing::read_pin(
        object
            .annotations()
            .get(keys::ROUTE_ANNOTATION)
            .map(String::as_str),
        |connection| {
            // A bare Connection name: one of the API's routes, completed with its pinned provider.
            if connection == spec.route.connection {
                return (!spec.route.cluster.is_empty()).then(|| spec.route.cluster.clone());
            }
            let routes = worker
                .ctx
                .route_connections(&worker.spec.api, &spec.served_by);
            (connection == spec.served_by || routes.contains(connection))
                .then(|| worker.ctx.pinned_provider(connection))
                .flatten()
                .map(|(cluster, _)| cluster)
        },
    );
    let orphan = object
        .annotations()
        .get(keys::DELETION_POLICY_ANNOTATION)
        .map(String::as_str)
        == Some(keys::DELETION_POLICY_ORPHAN);
    Some(routing::gate(
        &spec.route,
        &spec.served_by,
        &pin,
        object.metadata.finalizers.as_deref().unwrap_or_default(),
        &candidates,
        &object.labels.map(),
        orphan,
        &barred,
    ))
}

/// The facts a sync of `object` decides from, with `copy` the provider copy the cache holds and
/// `gate` routing's word on it (#36; `None`: the API has one route).
fn facts<'a>(
    worker: &Worker,
    object: &'a Instance,
    copy: Option<&ProviderCopy>,
    gate: Option<&routing::Gate>,
) -> Facts<'a> {
    // SYNC-14: cluster-scoped instances sync only under a ClusterBinding (the resolver ensures it).
    let resolution = worker
        .ctx
        .resolve(
            &worker.spec.connection,
            &worker.spec.api,
            object.metadata.namespace.as_deref(),
        )
        .filter(|r| r.is_bound())
        // Another route's object is not this worker's to sync.
        .filter(|_| !matches!(gate, Some(routing::Gate::Idle | routing::Gate::Uncovered)));
    let speaks_when_unbound = match gate {
        None => true,
        Some(routing::Gate::Uncovered) => worker
            .routing()
            .is_some_and(|r| r.route.connection == r.served_by),
        Some(_) => false,
    };
    let routing = match gate {
        None | Some(routing::Gate::Idle | routing::Gate::Uncovered | routing::Gate::Pin(_)) => None,
        Some(routing::Gate::Sync { changed }) => changed.as_ref().map(|_| Routing::Changed),
        Some(routing::Gate::Release { .. }) => Some(Routing::Release),
        Some(routing::Gate::Hold(reason, _)) => Some(Routing::Hold(reason.as_str())),
    };
    let bound = resolution.as_ref().map(|r| r.conflict_policy);
    let paused = pause_message(object, resolution.as_ref()).map(|message| Paused {
        recorded: paused_record(worker, object, &message).is_none(),
    });
    let object_uid = object.metadata.uid.as_deref().unwrap_or_default();
    Facts {
        deleting: object.metadata.deletion_timestamp.is_some(),
        bound,
        copy: copy.map(|copy| Copy {
            owner: copy.owner(object_uid),
            terminating: copy.terminating,
            current: copy.is_current(object.spec.as_ref(), object_uid),
        }),
        has_finalizer: kbind_shared::finalizers::has(&object.metadata, &worker.spec.finalizer()),
        conflict: object
            .annotations()
            .get(keys::CONFLICT_ANNOTATION)
            .map(String::as_str),
        paused,
        routing,
        speaks_when_unbound,
        hold_recorded: object
            .delivery
            .as_ref()
            .is_some_and(|d| d.state == delivery::State::Held),
    }
}

/// Why the user paused `object`, if they did: its own `core.kbind.io/paused: "true"`, else its
/// binding's `spec.suspend`.
fn pause_message(
    object: &Instance,
    resolution: Option<&kbind_shared::resolve::Resolution>,
) -> Option<String> {
    let annotated = object
        .annotations()
        .get(keys::PAUSED_ANNOTATION)
        .map(String::as_str);
    if annotated == Some(keys::TRUE) {
        return Some(format!(
            "paused by its {} annotation: kbind neither writes its spec to the provider nor copies the provider's status until the annotation is removed",
            keys::PAUSED_ANNOTATION
        ));
    }
    let binding = resolution.filter(|r| r.suspended)?;
    let described = match &binding.namespace {
        Some(namespace) => format!("Binding {namespace}/{}", binding.name),
        None => format!("ClusterBinding {}", binding.name),
    };
    Some(format!(
        "{described} is suspended (spec.suspend): kbind writes nothing for the objects it covers until it is resumed"
    ))
}

/// The status that records `object` as paused, when it does not say so already (`None`: nothing
/// to write — the record says so, or its CRD keeps no record).
fn paused_record(worker: &Worker, object: &Instance, message: &str) -> Option<serde_json::Value> {
    if !worker.spec.has_delivery || !worker.spec.has_status_subresource {
        return None;
    }
    let current = object.status.as_ref().map(Json::value);
    let record = delivery::paused(delivery::record_of(current.as_ref()), message);
    let status = delivery::with_record(current.as_ref(), &record);
    (current.as_ref() != Some(&status)).then_some(status)
}

/// [`paused_record`] with the message of why `object` is paused now.
fn paused_status(worker: &Worker, object: &Instance) -> Option<serde_json::Value> {
    let resolution = worker.ctx.resolve(
        &worker.spec.connection,
        &worker.spec.api,
        object.metadata.namespace.as_deref(),
    );
    let message = pause_message(object, resolution.as_ref())?;
    paused_record(worker, object, &message)
}

/// The status a sync leaves on `object` (SYNC-9): the provider's `provider_status` with, where
/// the CRD has one, kbind's delivery record of the spec kbind applied at `delivered_at`.
/// `None`: the provider has none and the CRD has no record to keep.
fn desired_status(
    spec: &WorkerSpec,
    object: &Instance,
    provider_status: Option<serde_json::Value>,
    delivered_at: Option<String>,
) -> Option<serde_json::Value> {
    if spec.has_delivery {
        let record = delivery::delivered(object.metadata.generation, delivered_at);
        Some(delivery::with_record(provider_status.as_ref(), &record))
    } else {
        provider_status
    }
}

/// The provider's status as a sync copies it down: the copy's — or, when the provider's is larger
/// than `--max-status-bytes` (the cache then holds only its size), what the consumer object holds
/// already: an oversized status is never copied, and nothing of the last good one is lost.
fn provider_side_status(
    copy: Option<&ProviderCopy>,
    object: &Instance,
) -> Option<serde_json::Value> {
    let copy = copy?;
    if copy.oversized_status.is_some() {
        return object.status.as_ref().map(Json::value);
    }
    copy.status.as_ref().map(Json::value)
}

/// `status` if its compact JSON is at most `max_bytes`, else its size.
fn bounded(
    status: Option<&serde_json::Value>,
    max_bytes: usize,
) -> Result<Option<serde_json::Value>, usize> {
    let Some(status) = status else {
        return Ok(None);
    };
    match serde_json::to_vec(status).map(|v| v.len()) {
        Ok(size) if size > max_bytes => Err(size),
        _ => Ok(Some(status.clone())),
    }
}

/// Whether a sync of `object` (with `copy` the provider copy the cache holds) would write
/// nothing: the same facts, [`decide`] and status the sync itself uses.
pub(super) fn at_rest(worker: &Worker, object: &Instance, copy: Option<&ProviderCopy>) -> Rest {
    let gate = gate_of(worker, object);
    rest(decide(&facts(worker, object, copy, gate.as_ref())), || {
        let desired = desired_status(
            &worker.spec,
            object,
            provider_side_status(copy, object),
            copy.and_then(ProviderCopy::applied_at),
        );
        let current = object.status.as_ref().map(Json::value);
        desired.is_none_or(|status| current.as_ref() == Some(&status))
    })
}

/// Writes `status` (the provider's, and kbind's record) to the consumer object, counted as `op`:
/// `status_down`, or `record` when only kbind's delivery record changes.
async fn status_down(
    worker: &Worker,
    object: &Instance,
    status: serde_json::Value,
    op: &str,
) -> Result<(), Error> {
    if !worker.spec.has_status_subresource {
        // QRK-12: one clear Warning, not an endless error loop.
        let first = !std::mem::replace(&mut *worker.warned_no_status.locked(), true);
        if first {
            worker
                .warn(object, "NoStatusSubresource", format!("the consumer CRD {} has no status subresource, so the provider's status cannot be copied back", worker.spec.api))
                .await;
        }
        return Ok(());
    }
    let current = object.status.as_ref().map(Json::value).unwrap_or(json!({}));
    let mut status_patch = ownership::merge_patch(&current, &status);
    delivery::set_record_whole(&mut status_patch, delivery::record_of(Some(&status)));
    let patch = json!({ "status": status_patch });
    worker.fence()?;
    match worker.patch_status(object, &patch).await {
        Ok(written) => {
            worker.count(op, "ok");
            worker.wrote(object, &written);
            worker
                .pending
                .locked()
                .status_written(pending::key(object), std::time::Instant::now());
            Ok(())
        }
        Err(e) => {
            worker.count(op, result_label(&e));
            Err(Error::Consumer(e))
        }
    }
}

/// The delivery record says the current spec did not reach the provider (refused, or
/// [`delivery::PENDING`]), why, and since when the change waits — written once per cause (a
/// retry that fails the same way writes nothing).
async fn record_refusal(
    worker: &Worker,
    object: &Instance,
    state: &str,
    message: &str,
) -> Result<(), Error> {
    if !worker.spec.has_delivery || !worker.spec.has_status_subresource {
        return Ok(());
    }
    let current_status = object.status.as_ref().map(Json::value);
    let current = delivery::record_of(current_status.as_ref());
    let since = object.changed_at.map(delivery::Seconds::time);
    let record = delivery::refused(current, state, message, since.as_ref());
    let status = delivery::with_record(current_status.as_ref(), &record);
    if current_status.as_ref() == Some(&status) {
        return Ok(());
    }
    status_down(worker, object, status, "record").await
}

/// SYNC-10: a Forbidden or rejected write is recorded on the object, gets a Warning Event once
/// per refusal (not per retry), and is retried with the same exponential backoff as any error
/// (`error_policy`); anything else is an error.
async fn forbidden_or(
    worker: &Worker,
    object: &Instance,
    operation: &str,
    error: kube::Error,
) -> Result<Action, Error> {
    // Told apart by what the provider says: a webhook's 403 is a rejection, not RBAC (#33.2).
    let refusal = match &error {
        kube::Error::Api(s) => match delivery::refusal(s.code, &s.message) {
            Some(delivery::Refusal::Forbidden) => Some((
                "forbidden",
                delivery::FORBIDDEN,
                delivery::Refusal::Forbidden.event_reason(),
                format!("cannot {operation}"),
            )),
            // The provider's validation or admission said no: tell the user why; other objects
            // are unaffected.
            Some(delivery::Refusal::Rejected) => Some((
                "rejected",
                delivery::REJECTED,
                delivery::Refusal::Rejected.event_reason(),
                "the provider rejected the object".to_owned(),
            )),
            None => None,
        },
        _ => None,
    };
    let (kube::Error::Api(s), Some((result, state, reason, what))) = (&error, refusal) else {
        worker.count("spec_up", result_label(&error));
        // #33.1: the provider did not take the spec (an outage, a 5xx, a timeout): the object
        // says so — Pending, with the answer — instead of keeping the last state.
        let answer = match &error {
            kube::Error::Api(s) => format!("the provider answered {}: {}", s.code, s.message),
            other => format!("the provider did not answer: {other}"),
        };
        record_refusal(
            worker,
            object,
            delivery::PENDING,
            &format!("cannot {operation}: {answer}"),
        )
        .await?;
        return Err(Error::Provider(error));
    };
    worker.count("spec_up", result);
    record_refusal(worker, object, state, &s.message).await?;
    let news = worker.retries.is_new(
        &object_key(object),
        &Error::Provider(error_copy(s)).to_string(),
    );
    if news {
        let message = format!("{what}: {}", kbind_shared::redact::remote(&s.message));
        worker.warn(object, reason, message).await;
    }
    Err(Error::Provider(error))
}

/// The same API error again (a `kube::Error` is not `Clone`).
fn error_copy(status: &kube::core::Status) -> kube::Error {
    kube::Error::Api(Box::new(status.clone()))
}

/// #36: the user moved `object` to another route. This route's copy goes first — deleted, or
/// with `core.kbind.io/deletion-policy: Orphan` unmarked and left, foreign to kbind — and only
/// once it is gone (or unmarked) is this route's finalizer dropped, which lets the new route's
/// worker write. Never both at once.
async fn release(object: &Instance, worker: &Worker) -> Result<Action, Error> {
    let Some(released) =
        kbind_shared::finalizers::toggled(&object.metadata, &worker.spec.finalizer(), false)
    else {
        return Ok(Action::await_change());
    };
    let orphan = object
        .annotations()
        .get(keys::DELETION_POLICY_ANNOTATION)
        .map(String::as_str)
        == Some(keys::DELETION_POLICY_ORPHAN);
    // A fresh read: a release must not act on a stale cache.
    if let Some(copy) = our_copy(object, worker).await? {
        worker.fence()?;
        if orphan {
            let copy_uid = copy.metadata.uid.clone().unwrap_or_default();
            match worker
                .provider_api(object.namespace().as_deref())?
                .patch(
                    &object.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(ownership::unmark_patch(&copy_uid)),
                )
                .await
            {
                Ok(_) => worker.count("release", "orphaned"),
                Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => {}
                Err(e) => {
                    worker.count("release", result_label(&e));
                    return Err(Error::Provider(e));
                }
            }
            // Looked at again: dropped only once the copy no longer reads as ours.
            return Ok(Action::requeue(Duration::from_millis(500)));
        }
        delete_copy(object, worker, &copy, "release").await?;
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    worker.set_finalizers(object, released, None).await?;
    worker.mark(object, None);
    Ok(Action::await_change())
}

/// The provider object under `object`'s name that the cache does not show, as far as a sync
/// decides from it ([`super::strangers`]): the one last read there, read again when stale.
async fn stranger(worker: &Worker, object: &Instance) -> Result<Option<Arc<ProviderCopy>>, Error> {
    let known = worker
        .strangers
        .locked()
        .known(&pending::key(object), std::time::Instant::now());
    let known = match known {
        Known::Stale => read_stranger(worker, object).await?,
        known => known,
    };
    Ok(match known {
        Known::Fresh(copy) => Some(copy),
        Known::Nothing | Known::Stale => None,
    })
}

/// Reads the provider object under `object`'s name and records it as a stranger — unless it is
/// this consumer cluster's labelled copy (the cache shows it shortly) or nothing is there.
async fn read_stranger(worker: &Worker, object: &Instance) -> Result<Known, Error> {
    let api: kube::Api<Instance> = match worker.provider_namespace(object.namespace().as_deref())? {
        Some(namespace) => {
            kube::Api::namespaced_with(worker.provider.clone(), &namespace, &worker.dyntype)
        }
        None => kube::Api::all_with(worker.provider.clone(), &worker.dyntype),
    };
    let mut read = api
        .get_opt(&object.name_any())
        .await
        .map_err(Error::Provider)?;
    // Held under the consumer's namespace, as the cache holds copies (#51).
    if let Some(read) = &mut read {
        read.metadata.namespace = object.namespace();
    }
    let object_uid = object.metadata.uid.as_deref().unwrap_or_default();
    let copy = read
        .map(|o| ProviderCopy::of(o, &worker.spec.local_uid))
        .filter(|c| !(c.labelled && c.owner(object_uid) == Owner::Ours));
    Ok(worker
        .strangers
        .locked()
        .read(pending::key(object), copy, std::time::Instant::now()))
}

/// `object`'s provider copy, read fresh, if it is kbind's copy of it (OWN-1).
async fn our_copy(
    object: &Instance,
    worker: &Worker,
) -> Result<Option<kube::api::DynamicObject>, Error> {
    let copy = worker
        .provider_api(object.namespace().as_deref())?
        .get_opt(&object.name_any())
        .await
        .map_err(Error::Provider)?;
    let object_uid = object.metadata.uid.clone().unwrap_or_default();
    Ok(copy.filter(|c| {
        ownership::classify(c.annotations(), &worker.spec.local_uid, &object_uid) == Owner::Ours
    }))
}

/// Deletes exactly `copy` (its UID is the precondition: a foreign object re-created under the
/// name since is never deleted), unless its deletion runs already; counted as `op`.
async fn delete_copy(
    object: &Instance,
    worker: &Worker,
    copy: &kube::api::DynamicObject,
    op: &str,
) -> Result<(), Error> {
    if copy.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: copy.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match worker
        .provider_api(object.namespace().as_deref())?
        .delete(&object.name_any(), &params)
        .await
    {
        Ok(_) => worker.count(op, "ok"),
        Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => {}
        Err(e) => {
            worker.count(op, result_label(&e));
            return Err(Error::Provider(e));
        }
    }
    Ok(())
}

/// IDEL-1 … IDEL-3.
async fn delete(object: &Instance, worker: &Worker) -> Result<Action, Error> {
    let Some(released) =
        kbind_shared::finalizers::toggled(&object.metadata, &worker.spec.finalizer(), false)
    else {
        return Ok(Action::await_change());
    };
    let release = || async {
        // Read first: the object can vanish (and its watch event clear the entry) before the
        // release's answer arrives.
        let key = pending::key(object);
        let since = worker.pending.locked().deletion_started(&key);
        worker
            .set_finalizers(object, released.clone(), None)
            .await?;
        worker.pending.locked().deleted(&key);
        let deleted_at = object
            .metadata
            .deletion_timestamp
            .as_ref()
            .and_then(delivery::Seconds::of);
        worker.lag("delete", since, deleted_at);
        Ok::<(), Error>(())
    };
    if object
        .annotations()
        .get(keys::DELETION_POLICY_ANNOTATION)
        .map(String::as_str)
        == Some(keys::DELETION_POLICY_ORPHAN)
    {
        release().await?;
        return Ok(Action::await_change());
    }
    // A fresh read: deletion must not act on a stale cache.
    match our_copy(object, worker).await? {
        Some(copy) => {
            worker.fence()?;
            delete_copy(object, worker, &copy, "delete").await?;
            Ok(Action::requeue(Duration::from_secs(2)))
        }
        None => {
            release().await?;
            worker.mark(object, None);
            Ok(Action::await_change())
        }
    }
}

/// Whether the provider should hold something under `object`'s name that the cache does not show:
/// the object holds this route's finalizer (a copy was written, by kbind or the Go konnector) or
/// records an ownership conflict. Its sync reads the name first ([`super::strangers`]).
fn expects_a_copy(worker: &Worker, object: &Instance) -> bool {
    kbind_shared::finalizers::has(&object.metadata, &worker.spec.finalizer())
        || matches!(
            object
                .annotations()
                .get(keys::CONFLICT_ANNOTATION)
                .map(String::as_str),
            Some(keys::CONFLICT_FOREIGN | keys::CONFLICT_OWNED_BY_ANOTHER)
        )
}

impl Worker {
    /// Whether a sync of `object` has anything to do; when not, where it stands is recorded.
    pub(super) fn has_work(&self, object: &Instance) -> bool {
        if self.echoes.locked().behind(
            &pending::key(object),
            object.metadata.resource_version.as_deref(),
        ) {
            // Its echo syncs it.
            return false;
        }
        let copy = self.known_copy(object);
        if copy.is_none() && expects_a_copy(self, object) {
            self.strangers
                .locked()
                .expect(pending::key(object), std::time::Instant::now());
        }
        match at_rest(self, object, copy.as_deref()) {
            Rest::Work => true,
            Rest::Unbound => false,
            Rest::Stands(state) => {
                self.mark(object, Some(state));
                false
            }
        }
    }

    /// The consumer objects within `reach` (this worker's cache of them) whose sync has
    /// something to do.
    pub(super) fn with_work(&self, reach: &crate::bindings::Reach) -> Vec<Arc<Instance>> {
        if *reach == crate::bindings::Reach::Nothing {
            return Vec::new();
        }
        self.consumer_objects
            .state()
            .into_iter()
            .filter(|o| reach.covers(o.metadata.namespace.as_deref()) && self.has_work(o))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_status_over_the_limit_is_refused_by_its_size() {
        let status = serde_json::json!({ "phase": "Ready" }); // 17 bytes
        assert_eq!(super::bounded(Some(&status), 17), Ok(Some(status.clone())));
        assert_eq!(super::bounded(Some(&status), 16), Err(17));
        assert_eq!(super::bounded(None, 0), Ok(None));
    }

    #[test]
    fn only_routings_record_goes_with_its_mark() {
        use serde_json::json;
        let held = json!({ "phase": "Ready", "kbindSync": { "state": "NoRoute", "message": "x" } });
        assert_eq!(
            super::without_hold_record(Some(held)),
            Some(json!({ "phase": "Ready" }))
        );
        for kept in [
            json!({ "kbindSync": { "state": "Synced", "generation": 1 } }),
            json!({ "kbindSync": { "state": "Pending" } }),
            json!({ "phase": "Ready" }),
        ] {
            assert_eq!(
                super::without_hold_record(Some(kept.clone())),
                None,
                "{kept}"
            );
        }
        assert_eq!(super::without_hold_record(None), None);
    }
}
