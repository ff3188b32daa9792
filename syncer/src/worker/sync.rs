//! Executing one object's sync (REFERENCE-BEHAVIOUR §17: SYNC, OWN, IDEL): the facts come from
//! the caches, [`decide`] picks the step, and only the step's writes happen.

use kbind_shared::sync::Locked;
use std::sync::Arc;
use std::time::Duration;

use kbind_shared::cache::{Instance, Json, ProviderCopy};
use kbind_shared::delivery;
use kbind_shared::keys;
use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::decide::{Copy, Facts, Paused, Rest, Routing, Step, decide, rest};
use super::pending;
use super::pending::Seen;
use super::state::Worker;
use super::steps::marks::{self, pause_message, paused_record};
use super::steps::status_down::{self, Delivered, desired_status, provider_side_status};
use super::steps::{deletion, spec_up};
use super::strangers::Known;
use super::writes::Error;
use kbind_shared::import::Standing;
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
    let inputs = inputs(&worker, &object);
    let facts = facts(&worker, &object, provider_copy.as_deref(), &inputs);
    let (worker, object) = (worker.as_ref(), object.as_ref());
    match decide(&facts) {
        Step::Delete => deletion::delete(object, worker).await,
        Step::Idle => Ok(Action::await_change()),
        Step::Unmark => marks::unmark(worker, object).await,
        Step::Release => deletion::release(object, worker).await,
        Step::Held {
            reason,
            message,
            announce,
        } => marks::held(worker, object, reason, message, announce).await,
        Step::Conflict {
            reason,
            owner,
            policy,
            announce,
        } => marks::conflict(worker, object, policy, reason, owner, announce).await,
        Step::Paused(paused) => marks::paused(worker, object, paused.record).await,
        Step::WaitForTerminatingCopy => marks::wait_for_terminating_copy(worker, object).await,
        Step::AddFinalizer => spec_up::add_finalizer(worker, object, seen).await,
        Step::Sync {
            clear_conflict,
            spec_up,
            route_changed,
        } => {
            if clear_conflict {
                marks::show_route_changed(worker, object, route_changed).await?;
            }
            let delivered = match spec_up {
                Some(how) => match spec_up::push_spec(worker, object, how, seen).await? {
                    Ok(delivered) => delivered,
                    Err(action) => return Ok(action),
                },
                None => Delivered::as_cached(object, provider_copy.as_deref()),
            };
            worker.note_oversized(object, delivered.oversized).await;
            status_down::copy_status(worker, object, provider_copy.as_deref(), delivered, seen)
                .await
        }
    }
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

/// What the facts of one object's sync are read from besides the object and its copy.
struct Inputs {
    /// Routing's word on it (#36; `None`: the API has one route).
    gate: Option<routing::Gate>,
    /// The binding that binds its API for this worker, if one does.
    resolution: Option<kbind_shared::resolve::Resolution>,
    /// The user paused it (`Some`), with the status that records it when one is to be written.
    pause: Option<Option<serde_json::Value>>,
}

fn inputs(worker: &Worker, object: &Instance) -> Inputs {
    // #54: a mirror of an imported provider object is import's alone until the user claims it —
    // not bound, routed or paused here; a claim adopts the provider object (the one write that
    // marks it kbind's).
    let standing = super::import::standing_of(worker, object);
    if matches!(standing, Standing::Observed | Standing::Elsewhere) {
        return Inputs {
            gate: None,
            resolution: None,
            pause: None,
        };
    }
    let gate = gate_of(worker, object);
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
    let resolution = match standing {
        Standing::Claimed => resolution.map(|r| kbind_shared::resolve::Resolution {
            conflict_policy: kbind_shared::api::ConflictPolicy::Adopt,
            ..r
        }),
        _ => resolution,
    };
    let pause = pause_message(object, resolution.as_ref())
        .map(|message| paused_record(worker, object, &message));
    Inputs {
        gate,
        resolution,
        pause,
    }
}

/// The facts a sync of `object` decides from, with `copy` the provider copy the cache holds.
fn facts<'a>(
    worker: &Worker,
    object: &'a Instance,
    copy: Option<&ProviderCopy>,
    inputs: &'a Inputs,
) -> Facts<'a> {
    let gate = inputs.gate.as_ref();
    let speaks_when_unbound = match gate {
        None => true,
        Some(routing::Gate::Uncovered) => worker
            .routing()
            .is_some_and(|r| r.route.connection == r.served_by),
        Some(_) => false,
    };
    let routing = match gate {
        None | Some(routing::Gate::Idle | routing::Gate::Uncovered | routing::Gate::Pin(_)) => None,
        Some(routing::Gate::Sync { changed }) => changed.as_deref().map(Routing::Changed),
        Some(routing::Gate::Release { .. }) => Some(Routing::Release),
        Some(routing::Gate::Hold(reason, message)) => {
            Some(Routing::Hold(reason.as_str(), message.as_str()))
        }
    };
    let bound = inputs.resolution.as_ref().map(|r| r.conflict_policy);
    let paused = inputs.pause.as_ref().map(|record| Paused {
        record: record.as_ref(),
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

/// Whether a sync of `object` (with `copy` the provider copy the cache holds) would write
/// nothing: the same facts, [`decide`] and status the sync itself uses.
pub(super) fn at_rest(worker: &Worker, object: &Instance, copy: Option<&ProviderCopy>) -> Rest {
    let inputs = inputs(worker, object);
    rest(decide(&facts(worker, object, copy, &inputs)), || {
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

/// The provider object under `object`'s name that the cache does not show, as far as a sync
/// decides from it ([`super::strangers`]): the one last read there, read again when stale.
async fn stranger(worker: &Worker, object: &Instance) -> Result<Option<Arc<ProviderCopy>>, Error> {
    let known = worker
        .tracked
        .locked()
        .known_stranger(&pending::key(object), std::time::Instant::now());
    let known = match known {
        Known::Stale => spec_up::read_stranger(worker, object).await?,
        // A claimed import (#54): the provider object it mirrored stands there unmarked — read
        // it rather than probe with a create (the claim then costs the provider one write).
        Known::Nothing if super::import::standing_of(worker, object) == Standing::Claimed => {
            spec_up::read_stranger(worker, object).await?
        }
        known => known,
    };
    Ok(match known {
        Known::Fresh(copy) => Some(copy),
        Known::Nothing | Known::Stale => None,
    })
}

/// Whether the provider should hold something under `object`'s name that the cache does not show:
/// the object holds this route's finalizer (a copy was written, by kbind or the Go konnector) or
/// records an ownership conflict. Its sync reads the name first ([`super::strangers`]).
fn expects_a_copy(worker: &Worker, object: &Instance) -> bool {
    kbind_shared::finalizers::has(&object.metadata, &worker.spec.finalizer())
        // A claimed import: the provider object it mirrored is there, unmarked until adopted.
        || super::import::standing_of(worker, object) == Standing::Claimed
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
        if self.tracked.locked().behind(
            &pending::key(object),
            object.metadata.resource_version.as_deref(),
        ) {
            // Its echo syncs it.
            return false;
        }
        let copy = self.known_copy(object);
        if copy.is_none() && expects_a_copy(self, object) {
            self.tracked
                .locked()
                .expect_stranger(&pending::key(object), std::time::Instant::now());
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
    use std::time::Instant;

    use kube::runtime::watcher;
    use serde_json::{Value, json};

    use super::super::fake;
    use super::super::record::SyncState;
    use super::super::state::Writers;
    use super::*;
    use crate::bindings::Reach;

    /// A worker whose Connection `c` binds Widgets in `team-a` (a Binding there), on a fake
    /// provider answering from `provider`.
    async fn bound_in_team_a(
        provider: impl Fn(&str, &str) -> Option<(u16, Value)> + Send + Sync + 'static,
    ) -> (Arc<Worker>, Writers, fake::Requests, fake::Requests) {
        let widget = fake::widget_path("team-a", "w", "");
        let (consumer, on_consumer) =
            fake::consumer_with(vec![fake::binding("team-a")], move |method, path| {
                // Its writes answer with the object as it was.
                (method == "PATCH" && path.starts_with(&widget)).then(|| {
                    (
                        200,
                        json!({ "apiVersion": "example.org/v1", "kind": "Widget",
                        "metadata": { "name": "w", "namespace": "team-a", "uid": "w-uid",
                            "resourceVersion": "11", "generation": 2 } }),
                    )
                })
            });
        let (provider, on_provider) = fake::server(provider);
        let (worker, writers) = fake::worker_and_caches(consumer, provider).await;
        (worker, writers, on_consumer, on_provider)
    }

    fn known(worker: &Worker, object: &Instance) -> Known {
        worker
            .tracked
            .locked()
            .known_stranger(&pending::key(object), Instant::now())
    }

    #[tokio::test]
    async fn only_a_bound_object_has_work_and_one_that_may_have_a_copy_is_looked_for_first() {
        let (worker, ..) = bound_in_team_a(|_, _| None).await;
        let fresh = fake::widget(json!({}), Value::Null);
        assert!(worker.has_work(&fresh), "bound, no finalizer yet");
        assert_eq!(
            known(&worker, &fresh),
            Known::Nothing,
            "nothing to look for"
        );
        let unbound = fake::widget(json!({ "namespace": "team-b" }), Value::Null);
        assert!(!worker.has_work(&unbound), "no binding in team-b");

        // A copy may stand under the name, the cache not showing it: the sync reads it first.
        let holding = fake::bound_widget();
        worker.has_work(&holding);
        assert_eq!(
            known(&worker, &holding),
            Known::Stale,
            "it holds the finalizer"
        );
        let conflicting = fake::widget(
            json!({ "name": "f", "annotations": { keys::CONFLICT_ANNOTATION: keys::CONFLICT_FOREIGN } }),
            Value::Null,
        );
        worker.has_work(&conflicting);
        assert_eq!(
            known(&worker, &conflicting),
            Known::Stale,
            "a recorded foreign object"
        );
        let claimed = fake::widget(
            json!({ "name": "i", "labels": { keys::IMPORTED_LABEL: "c" }, "managedFields": fake::imported_fields(),
                "annotations": { keys::CLAIM_ANNOTATION: "true" } }),
            Value::Null,
        );
        worker.has_work(&claimed);
        assert_eq!(
            known(&worker, &claimed),
            Known::Stale,
            "a claimed import's object"
        );
        let held = fake::widget(
            json!({ "name": "h", "annotations": { keys::CONFLICT_ANNOTATION: "NoRoute" } }),
            Value::Null,
        );
        worker.has_work(&held);
        assert_eq!(
            known(&worker, &held),
            Known::Nothing,
            "a routing hold has no copy"
        );
    }

    #[tokio::test]
    async fn a_mark_left_on_an_unbound_object_is_work_and_a_mirror_is_never_any() {
        let (worker, ..) = bound_in_team_a(|_, _| None).await;
        let record = |state: &str| json!({ "kbindSync": { "state": state } });
        let held = fake::widget(json!({ "namespace": "team-b" }), record("NoRoute"));
        assert!(
            worker.has_work(&held),
            "a routing hold's record goes once unbound"
        );
        let synced = fake::widget(json!({ "namespace": "team-b" }), record("Synced"));
        assert!(!worker.has_work(&synced), "any other record stays");
        let mirror = fake::widget(
            json!({ "labels": { keys::IMPORTED_LABEL: "c" }, "managedFields": fake::imported_fields() }),
            record("Observed"),
        );
        assert!(!worker.has_work(&mirror), "a mirror is import's alone");
        // The label alone, set by someone else (a mirror's YAML applied again): the user's own
        // object, synced as any.
        let copied = fake::widget(
            json!({ "labels": { keys::IMPORTED_LABEL: "c" } }),
            record("Observed"),
        );
        assert!(worker.has_work(&copied), "not a mirror: bound, so it syncs");
    }

    #[tokio::test]
    async fn an_object_at_rest_stands_synced_and_a_status_that_differs_is_work() {
        let (worker, ..) = bound_in_team_a(|_, _| None).await;
        let copy = ProviderCopy::of(
            serde_json::from_value(json!({
                "metadata": { "name": "w", "namespace": "team-a",
                    "labels": { keys::MANAGED_LABEL: "true", keys::CONSUMER_CLUSTER_UID_LABEL: "consumer-uid" },
                    "annotations": { keys::CONSUMER_CLUSTER_UID_ANNOTATION: "consumer-uid",
                        keys::CONSUMER_OBJECT_UID_ANNOTATION: "w-uid" } },
                "spec": { "size": 3 },
                "status": { "phase": "Ready" },
            }))
            .unwrap(),
            "consumer-uid",
        );
        let holding = fake::bound_widget();
        let desired = desired_status(
            &worker.spec,
            &holding,
            Some(json!({ "phase": "Ready" })),
            None,
        )
        .unwrap();
        let at_rest = fake::widget(
            json!({ "finalizers": [keys::SYNCER_FINALIZER] }),
            desired.clone(),
        );
        assert_eq!(
            super::at_rest(&worker, &at_rest, Some(&copy)),
            Rest::Stands(SyncState::Synced)
        );
        let mut behind = desired;
        behind["phase"] = json!("Pending");
        let behind = fake::widget(json!({ "finalizers": [keys::SYNCER_FINALIZER] }), behind);
        assert_eq!(super::at_rest(&worker, &behind, Some(&copy)), Rest::Work);
    }

    #[tokio::test]
    async fn with_work_is_the_objects_within_reach_that_have_work() {
        let (worker, mut writers, ..) = bound_in_team_a(|_, _| None).await;
        let a = fake::widget(json!({}), Value::Null);
        let b = fake::widget(
            json!({ "namespace": "team-b", "name": "x", "uid": "x-uid" }),
            Value::Null,
        );
        for object in [a, b] {
            writers
                .consumer
                .apply_watcher_event(&watcher::Event::Apply(object));
        }
        let names = |reach: Reach| -> Vec<String> {
            worker
                .with_work(&reach)
                .iter()
                .map(|o| o.name_any())
                .collect()
        };
        assert_eq!(names(Reach::All), ["w"]);
        assert!(names(Reach::Nothing).is_empty());
        assert_eq!(names(Reach::Namespaces(["team-a".into()].into())), ["w"]);
        assert!(
            names(Reach::Namespaces(["team-b".into()].into())).is_empty(),
            "within reach, but nothing to do"
        );
    }

    /// A fake provider answering for `team-a/w`: a GET with an unmarked object, an apply with
    /// the object marked as this consumer's.
    fn provider_of_w(method: &str, path: &str) -> Option<(u16, Value)> {
        let widget = fake::widget_path("team-a", "w", "");
        let object = |annotations: Value| {
            json!({ "apiVersion": "example.org/v1", "kind": "Widget",
                "metadata": { "name": "w", "namespace": "team-a", "uid": "p-uid",
                    "resourceVersion": "5", "annotations": annotations },
                "spec": { "size": 3 } })
        };
        match (method, path) {
            ("GET", p) if p == widget => Some((200, object(json!({})))),
            ("PATCH", p) if p == widget => Some((
                200,
                object(
                    json!({ keys::CONSUMER_CLUSTER_UID_ANNOTATION: "consumer-uid",
                    keys::CONSUMER_OBJECT_UID_ANNOTATION: "w-uid" }),
                ),
            )),
            ("GET", "/api/v1/namespaces/team-a") => {
                Some((200, json!({ "metadata": { "name": "team-a" } })))
            }
            _ => None,
        }
    }

    /// The provider requests about `team-a/w`: method, query, and the body's resourceVersion.
    fn asked_about_w(on_provider: &fake::Requests) -> Vec<(String, String, Value)> {
        fake::calls(on_provider)
            .into_iter()
            .filter(|c| c.path == fake::widget_path("team-a", "w", ""))
            .map(|c| {
                (
                    c.method,
                    c.query,
                    c.body["metadata"]["resourceVersion"].clone(),
                )
            })
            .collect()
    }

    /// The worker of route `r` and the serving Connection `c`'s own, on a
    /// [`fake::routed_consumer`].
    async fn routed_workers() -> (Arc<Worker>, Arc<Worker>) {
        let worker = |serving| async move {
            let (consumer, _) = fake::routed_consumer(|_, _| None);
            let (provider, _) = fake::server(|_, _| None);
            fake::route_worker(consumer, provider, serving).await
        };
        (worker(false).await, worker(true).await)
    }

    fn route_r_finalizer() -> String {
        routing::finalizer("r", "c")
    }

    #[tokio::test]
    async fn a_bare_pin_is_completed_with_the_provider_of_the_connection_it_names() {
        let (route_r, _) = routed_workers().await;
        // Pinned to this worker's own Connection by name, its copy here, no binding offering
        // route r in team-a: held, the pin read as r's provider (not as an unknown one).
        let pinned_here = fake::widget(
            json!({ "annotations": { keys::ROUTE_ANNOTATION: "r" },
                "finalizers": [route_r_finalizer()] }),
            Value::Null,
        );
        assert_eq!(
            gate_of(&route_r, &pinned_here),
            Some(routing::Gate::Hold(
                routing::Reason::NoRoute,
                "pinned to r/cl-r, which no binding covering it offers".into()
            ))
        );
        // Pinned to the serving Connection by name, which team-a's binding offers: route r's
        // copy is released (orphaned only under the Orphan policy).
        let moved = |annotations: Value| {
            fake::widget(
                json!({ "annotations": annotations, "finalizers": [route_r_finalizer()] }),
                Value::Null,
            )
        };
        assert_eq!(
            gate_of(&route_r, &moved(json!({ keys::ROUTE_ANNOTATION: "c" }))),
            Some(routing::Gate::Release { orphan: false })
        );
        assert_eq!(
            gate_of(
                &route_r,
                &moved(json!({ keys::ROUTE_ANNOTATION: "c",
                    keys::DELETION_POLICY_ANNOTATION: keys::DELETION_POLICY_ORPHAN }))
            ),
            Some(routing::Gate::Release { orphan: true })
        );
        // A bare name no route of the API has: its provider is not known.
        let unknown = fake::widget(
            json!({ "annotations": { keys::ROUTE_ANNOTATION: "elsewhere" },
                "finalizers": [route_r_finalizer()] }),
            Value::Null,
        );
        assert!(
            matches!(gate_of(&route_r, &unknown),
                Some(routing::Gate::Hold(routing::Reason::NoRoute, m)) if m.contains("not known")),
            "{:?}",
            gate_of(&route_r, &unknown)
        );
    }

    #[tokio::test]
    async fn only_the_serving_connections_worker_speaks_for_an_object_no_binding_covers() {
        let (route_r, serving) = routed_workers().await;
        assert!(serving.routing().is_some(), "route r makes the API routed");
        // In team-c no binding offers anything: routing leaves it alone on every worker.
        let uncovered = fake::widget(json!({ "namespace": "team-c" }), Value::Null);
        for worker in [&route_r, &serving] {
            assert_eq!(gate_of(worker, &uncovered), Some(routing::Gate::Uncovered));
        }
        let speaks = |worker: &Worker| {
            let inputs = inputs(worker, &uncovered);
            facts(worker, &uncovered, None, &inputs).speaks_when_unbound
        };
        assert!(
            speaks(&serving),
            "the serving Connection's worker clears a mark"
        );
        assert!(!speaks(&route_r), "another route's worker keeps out");
    }

    #[tokio::test]
    async fn an_object_no_cached_copy_stands_for_is_created_only_not_read_first() {
        let (worker, _writers, _, on_provider) = bound_in_team_a(provider_of_w).await;
        super::sync(
            Arc::new(fake::bound_widget()),
            worker.clone(),
            Seen::default(),
        )
        .await
        .unwrap();
        let asked = asked_about_w(&on_provider);
        assert_eq!(asked.len(), 1, "{asked:?}");
        assert_eq!(asked[0].0, "PATCH", "{asked:?}");
        assert_eq!(
            asked[0].2,
            kbind_shared::apply::CREATE_ONLY_RESOURCE_VERSION,
            "{asked:?}"
        );
    }

    #[tokio::test]
    async fn a_claim_reads_the_unmarked_provider_object_then_adopts_it_in_one_apply() {
        let (worker, _writers, _, on_provider) = bound_in_team_a(provider_of_w).await;
        // Claimed, its finalizer on: the next step is the spec-up.
        let claimed = fake::widget(
            json!({ "labels": { keys::IMPORTED_LABEL: "c" }, "managedFields": fake::imported_fields(),
                "annotations": { keys::CLAIM_ANNOTATION: "true" },
                "finalizers": [keys::SYNCER_FINALIZER] }),
            Value::Null,
        );
        super::sync(Arc::new(claimed), worker.clone(), Seen::default())
            .await
            .unwrap();
        let asked = asked_about_w(&on_provider);
        assert_eq!(asked.len(), 2, "{asked:?}");
        assert_eq!(
            asked[0].0, "GET",
            "read first, not probed with a create: {asked:?}"
        );
        assert_eq!(asked[1].0, "PATCH", "{asked:?}");
        assert!(asked[1].1.contains("force=true"), "{asked:?}");
        assert_eq!(
            asked[1].2,
            Value::Null,
            "an apply over it, not a create-only: {asked:?}"
        );
    }
}
