//! The ClusterBinding and Binding reconcilers (REFERENCE-BEHAVIOUR §12 BIND, §9 SCH, §14 BCL):
//! install the schemas of the listed APIs, report per-API problems, count conflicts, and on
//! deletion drain exactly the instances no remaining binding covers.

mod apis;
mod cleanup;
mod kinds;
pub mod ledger;
pub mod outcome;
pub mod release;
mod status;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kbind_shared::api::{Binding, ClusterBinding, Connection};
use kbind_shared::binding_cap;
use kbind_shared::conditions::{self, types};
use kbind_shared::resolve::BindingObject;
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::caches::{Cached, TermCaches};
use crate::changes::{Change, Kind, Topic};
use crate::context::Context;
use apis::{api_state, covered_by_cluster_bindings};
pub use kinds::{Error, Scoped};
use ledger::{Going, Left, Step};
use outcome::ApiState;
use status::write_status;

const DRAIN_RECHECK: Duration = Duration::from_secs(2);
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Runs both binding controllers on this term's caches until `stop`.
pub async fn run(ctx: Arc<Context>, caches: TermCaches, stop: CancellationToken) {
    for controller in [
        <ClusterBinding as kinds::Scoped>::CONTROLLER,
        <Binding as kinds::Scoped>::CONTROLLER,
    ] {
        kbind_shared::metrics::Metrics::init_counters(
            &ctx.metrics.reconcile_errors_total,
            controller,
            &kinds::REASONS,
        );
    }
    let cluster_bindings = controller::<ClusterBinding>(ctx.clone(), &caches, stop.clone());
    let bindings = controller::<Binding>(ctx.clone(), &caches, stop.clone());
    let both = futures::future::join(cluster_bindings, bindings);
    tokio::select! {
        _ = both => {}
        _ = async { stop.cancelled().await; tokio::time::sleep(SHUTDOWN_GRACE).await } => {
            tracing::warn!("binding reconciles did not finish within {SHUTDOWN_GRACE:?} of shutdown");
        }
    }
}

/// Whether a change the binding controllers hear concerns `binding`: its Connection changed, a
/// consumer CRD it lists changed (the user's `core.kbind.io/adopt` opt-in, markers edited by hand,
/// kbind's own install), its provider's exported CRD of an API it lists changed (the schema check
/// reads it fresh at once), the marked instances of an API it lists changed (conflicts, BIND-5d
/// live; pauses), how many instances an API it lists has changed while it is suspended (all of
/// them are paused), or its namespace's served related-resources Bindings changed (a Binding pushed past the
/// per-namespace cap, or let in, says so at once). A change of its own kind is the controller's
/// own trigger.
fn concerns<B: BindingObject>(binding: &B, change: &Change) -> bool {
    let spec = binding.binding_spec();
    let lists = |api: &str| spec.apis.iter().any(|a| a.name == api);
    match change {
        Change::Cached(Kind::Connection, key) => spec.connection_ref.name == key.name,
        Change::Cached(Kind::Crd, key) => lists(&key.name),
        Change::ProviderSchema { connection, api } => {
            &spec.connection_ref.name == connection && lists(api)
        }
        Change::Marked(api) => lists(api),
        Change::Instances(api) => spec.suspend && lists(api),
        Change::RelatedServed(namespace) => {
            binding.meta().namespace.as_ref() == Some(namespace)
                && !spec.related_resources.is_empty()
        }
        Change::LetIn(key) => {
            key.namespace.is_some()
                && binding.meta().namespace == key.namespace
                && binding.meta().name.as_ref() == Some(&key.name)
        }
        Change::Cached(..) | Change::ConnectionInput(_) => false,
    }
}

/// The topics [`concerns`] reads.
const TOPICS: [Topic; 7] = [
    Topic::Cached(Kind::Connection),
    Topic::Cached(Kind::Crd),
    Topic::ProviderSchema,
    Topic::Marked,
    Topic::Instances,
    Topic::RelatedServed,
    Topic::LetIn,
];

/// The bindings in `store` a change concerns; every binding after missed changes.
fn concerned<B>(store: &Store<B>, change: Option<&Change>) -> Vec<ObjectRef<B>>
where
    B: BindingObject + kube::Resource<DynamicType = ()>,
{
    store
        .state()
        .into_iter()
        .filter(|b| change.is_none_or(|c| concerns(b.as_ref(), c)))
        .map(|b| ObjectRef::from_obj(b.as_ref()))
        .collect()
}

async fn controller<B>(ctx: Arc<Context>, caches: &TermCaches, stop: CancellationToken)
where
    B: BindingObject + kube::Resource<DynamicType = ()>,
    B: Scoped,
{
    let store = B::store(caches);
    let controller = Controller::for_shared_stream(caches.triggers(B::KIND, store.clone()), store);
    let store = controller.store();
    // Every other trigger: a change of another kind, once the cache a reconcile reads holds it,
    // or a signal another reconciler computed.
    let triggers = ctx
        .changes
        .subscribe(&TOPICS)
        .flat_map(move |change| futures::stream::iter(concerned(&store, change.as_ref())));
    controller
        .reconcile_on(triggers)
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(reconcile::<B>, error_policy::<B>, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "binding reconcile");
            }
        })
        .await;
}

fn error_policy<B: Scoped>(binding: Arc<B>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.count_error(B::CONTROLLER, error);
    match error {
        Error::Draining(_) => Action::requeue(DRAIN_RECHECK),
        // A write raced with another (a status write from a cache a moment old): the fresh object
        // is on its way through the watch; retry at once, without a warning.
        Error::Consumer(kube::Error::Api(s)) if s.is_conflict() => {
            tracing::debug!(binding = %binding.describe(), "write conflict; retrying");
            Action::requeue(Duration::from_millis(200))
        }
        e => Action::requeue(ctx.retry_after(&binding.describe(), e)),
    }
}

async fn reconcile<B: Scoped>(binding: Arc<B>, ctx: Arc<Context>) -> Result<Action, Error> {
    if binding.meta().deletion_timestamp.is_some() {
        let_in_next(binding.as_ref(), &ctx).await;
    }
    let api = B::api(&ctx.client, &binding);
    let key = binding.describe();
    let result = crate::context::finalized(
        &api,
        binding,
        |b| apply(b, &ctx),
        |b| cleanup::cleanup(b, &ctx),
    )
    .await;
    if result.is_ok() {
        ctx.retries.succeeded(&key);
    }
    result
}

/// BIND-3 … BIND-13, and every edit converging (BIND-16, AUTO-2, LIM-22, QRK-25 fixed).
async fn apply<B: Scoped>(binding: Arc<B>, ctx: &Context) -> Result<Action, Error> {
    let spec = binding.binding_spec();
    let connection_name = spec.connection_ref.name.clone();

    // A Binding past its namespace's cap binds nothing, holds nothing and costs nothing more: it
    // says so once, and is looked at again only when it changes or an older one leaves.
    if let Some(past) = past_cap(binding.as_ref(), ctx).await {
        let states: Vec<(String, ApiState)> = spec
            .apis
            .iter()
            .map(|api| {
                let state = ApiState::Gated {
                    reason: past.reason,
                    message: past.message.clone(),
                };
                (api.name.clone(), state)
            })
            .collect();
        let entries = outcome::entries(&connection_name, &states, &[]);
        write_status(
            binding.as_ref(),
            ctx,
            vec![past],
            Some(Vec::new()),
            Some(entries),
        )
        .await?;
        return Ok(Action::await_change());
    }

    // What the binding holds against what it lists: let go of the rest first, so a moved API is
    // drained from its old provider before anything is installed for the new one.
    let held = ledger::held(binding.binding_status(), spec);
    let steps = ledger::steps(&held, spec, false);
    let going = let_go(binding.as_ref(), &steps, ctx).await?;
    let requeue = if going.is_empty() {
        Action::requeue(ctx.settings.binding_resync_interval)
    } else {
        Action::requeue(DRAIN_RECHECK)
    };
    let moving = |api: &str| {
        going
            .iter()
            .find(|g| g.held.api == api && g.to.is_some())
            .map(|g| ApiState::Moving {
                from: g.held.connection.clone(),
                message: outcome::going_message(g),
            })
    };

    // The Connection as this term's cache shows it (bindings are triggered only once it shows a
    // change); outside a term, read.
    let connection = match ctx.cached_connection(&connection_name) {
        Cached::Present(cached) => Some(Connection::clone(&cached)),
        Cached::Absent => None,
        Cached::NoTerm => Api::<Connection>::all(ctx.client.clone())
            .get_opt(&connection_name)
            .await
            .map_err(Error::Consumer)?,
    };
    // BIND-3: the Connection gate.
    let gate = match &connection {
        None => Some(outcome::connection_pending(format!(
            "Connection {connection_name} not found yet"
        ))),
        Some(c) => {
            let conds = c
                .status
                .as_ref()
                .map(|s| s.conditions.as_slice())
                .unwrap_or_default();
            let pending = (!conditions::is_true(conds, types::READY)).then(|| {
                let why = conditions::find(conds, types::READY)
                    .map(|r| format!(": {}", r.message))
                    .unwrap_or_default();
                outcome::connection_pending(format!(
                    "Connection {connection_name} is not Ready yet{why}"
                ))
            });
            // Nothing is installed or synced for a Binding the Connection does not serve.
            outcome::access_denied(c, binding.namespace().as_deref()).or(pending)
        }
    };
    // Related resources that get no work unit say why (a namespace's flood of Bindings is capped).
    let related = related_not_served(binding.as_ref(), connection.as_ref(), ctx).await;
    let mut states = Vec::new();
    let (mut desired, bound) = match (gate, connection) {
        (None, Some(connection)) => {
            let provider = ctx
                .providers
                .for_connection(
                    &ctx.client,
                    &connection,
                    &ctx.settings.provider_secrets,
                    &ctx.metrics,
                )
                .await;
            for api in &spec.apis {
                let state = match (moving(&api.name), &provider) {
                    (Some(moving), _) => moving,
                    (None, Ok(provider)) => {
                        api_state(binding.as_ref(), &connection, provider, &api.name, ctx).await
                    }
                    (None, Err(message)) => ApiState::Pending(message.clone()),
                };
                states.push((api.name.clone(), state));
            }
            let (mut desired, bound) = outcome::evaluate(&states, spec.suspend);
            if B::NAMESPACED {
                let covered = covered_by_cluster_bindings(ctx, spec).await;
                outcome::note_precedence(&mut desired, &covered);
            }
            (desired, Some(bound))
        }
        (gate, _) => {
            let gate = gate.unwrap_or_else(|| outcome::connection_pending(String::new()));
            for api in &spec.apis {
                let state = moving(&api.name).unwrap_or_else(|| ApiState::Gated {
                    reason: gate.reason,
                    message: gate.message.clone(),
                });
                states.push((api.name.clone(), state));
            }
            // A Binding that may not use its Connection holds nothing installed.
            let bound = (gate.reason == outcome::NOT_ALLOWED).then(Vec::new);
            (vec![gate], bound)
        }
    };
    desired.extend(related);
    let entries = outcome::entries(&connection_name, &states, &going);
    write_status(binding.as_ref(), ctx, desired, bound, Some(entries)).await?;
    // An adoption draining the serving Connection is checked again soon (the syncers stopping
    // and the provider's deletions send this binding no event).
    let adopting = states
        .iter()
        .any(|(_, state)| matches!(state, ApiState::Moving { .. }));
    Ok(if adopting {
        Action::requeue(DRAIN_RECHECK)
    } else {
        requeue
    })
}

/// `Ready=False` (`TooManyBindings`) for a Binding past its namespace's cap
/// ([`binding_cap::served_among`], the same decision the syncer's index makes): it binds nothing.
async fn past_cap<B: Scoped>(binding: &B, ctx: &Context) -> Option<conditions::Desired<'static>> {
    let namespace = binding.meta().namespace.as_deref()?;
    let (_, bindings) = ctx.all_bindings().await.ok()?;
    let cap = ctx.settings.max_bindings_per_namespace;
    let others = bindings
        .iter()
        .filter(|b| {
            b.metadata.namespace.as_deref() == Some(namespace)
                && b.metadata.name != binding.meta().name
        })
        .map(|b| &b.metadata);
    (!binding_cap::served_among(binding.meta(), others, cap)).then(|| {
        conditions::Desired::new(
            types::READY,
            false,
            binding_cap::TOO_MANY_BINDINGS,
            binding_cap::message(namespace, cap),
        )
    })
}

/// A Binding leaving (being deleted) frees its place under its namespace's cap: the one it lets
/// in is evaluated again at once, not at its next resync.
async fn let_in_next<B: Scoped>(binding: &B, ctx: &Context) {
    let Some(namespace) = binding.meta().namespace.as_deref() else {
        return;
    };
    let Ok((_, bindings)) = ctx.all_bindings().await else {
        return;
    };
    let mut remaining: Vec<binding_cap::Seniority> = bindings
        .iter()
        .filter(|b| b.metadata.namespace.as_deref() == Some(namespace))
        .filter_map(|b| binding_cap::Seniority::of(&b.metadata))
        .collect();
    remaining.sort();
    if let Some(next) = binding_cap::let_in(&remaining, ctx.settings.max_bindings_per_namespace) {
        ctx.changes
            .announce(Change::LetIn(kbind_shared::cache::ObjectKey {
                namespace: Some(namespace.to_owned()),
                name: next.name().to_owned(),
            }));
    }
}

/// `RelatedResourcesSynced=False` when the binding's related resources get no work unit because
/// they are off here or its namespace has more such Bindings than are served — the same decision
/// the assignment makes ([`kbind_shared::shard::related_admission`]). A binding its Connection
/// does not serve says so in `Ready` already.
async fn related_not_served<B: Scoped>(
    binding: &B,
    connection: Option<&Connection>,
    ctx: &Context,
) -> Option<conditions::Desired<'static>> {
    use kbind_shared::shard::{NotServed, RelatedBinding, related_admission};
    let me = RelatedBinding::of(binding.meta(), binding.binding_spec(), connection)?;
    let mut candidates = Vec::new();
    if let Some(namespace) = &me.namespace
        && let Ok((_, bindings)) = ctx.all_bindings().await
    {
        for other in bindings.iter().filter(|b| {
            b.metadata.namespace.as_ref() == Some(namespace)
                && b.metadata.name != binding.meta().name
        }) {
            let named = ctx
                .cached_connection(&other.spec.connection_ref.name)
                .present();
            candidates.extend(RelatedBinding::of(
                &other.metadata,
                &other.spec,
                named.as_deref(),
            ));
        }
    }
    candidates.push(me);
    let settings = &ctx.settings;
    let mut admitted = related_admission(
        &candidates,
        settings.related_resources,
        settings.max_related_bindings_per_namespace,
    );
    // Who is served in this namespace: a change (this Binding let in pushed another out, say)
    // re-evaluates the others at once, not at their next resync.
    if let Some(namespace) = &binding.meta().namespace {
        let mut served: Vec<String> = candidates
            .iter()
            .zip(&admitted)
            .filter(|(_, a)| a.is_ok())
            .map(|(c, _)| c.name.clone())
            .collect();
        served.sort();
        ctx.related_served(namespace, served);
    }
    let mine = admitted.pop()?;
    match mine {
        Ok(_) | Err(NotServed::NotAllowed) => None,
        Err(why) => Some(conditions::Desired::new(
            types::RELATED_RESOURCES_SYNCED,
            false,
            why.reason(),
            why.message(binding.meta().namespace.as_deref()),
        )),
    }
}

/// Runs the release and move steps; returns those not finished yet. Listing the other bindings
/// (to know what still covers an API) happens only when there is something to let go.
async fn let_go<B: Scoped>(
    binding: &B,
    steps: &[Step],
    ctx: &Context,
) -> Result<Vec<Going>, Error> {
    if steps.iter().all(|s| matches!(s, Step::Bind(_))) {
        return Ok(Vec::new());
    }
    let others = release::Others::list(&ctx.client).await?;
    let mut going = Vec::new();
    let mut moved_from = std::collections::BTreeSet::new();
    for step in steps {
        // A binding moving to another Connection leaves nothing on the old provider: its related
        // copies there go too (the new Connection's related worker copies anew).
        if let Step::Move { from, .. } = step
            && moved_from.insert(from.connection.clone())
            && let holder = release::holder(ctx, &from.connection).await?
            && let Ok(old) = &holder.provider
        {
            let uid = binding.meta().uid.clone().unwrap_or_default();
            let deleted = cleanup::delete_related_copies(
                &ctx.client,
                false,
                Some((&old.client, &holder.namespaces)),
                binding.covered_namespace().as_deref(),
                &uid,
            )
            .await?;
            if deleted > 0 {
                tracing::info!(binding = %binding.describe(), connection = %from.connection, deleted, "deleted related copies on the provider the binding moved away from");
            }
        }
        let (held, to, mode) = match step {
            Step::Bind(_) => continue,
            Step::Release(held) => (held, None, release::Mode::Unbind),
            Step::Move { from, to } => (from, Some(to.as_str()), release::Mode::Move),
        };
        let left = release::release_api(binding, held, mode, to, ctx, &others).await?;
        if left != Left::Nothing {
            tracing::debug!(binding = %binding.describe(), api = %held.api, ?left, "letting go");
            going.push(Going {
                held: held.clone(),
                to: to.map(str::to_owned),
                left,
            });
        }
    }
    Ok(going)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kbind_shared::api::{BindingSpec, ClusterBindingSpec, RelatedResource};
    use kbind_shared::cache::ObjectKey;

    fn key(name: &str) -> ObjectKey {
        ObjectKey {
            namespace: None,
            name: name.into(),
        }
    }

    fn spec(related: bool) -> BindingSpec {
        let mut spec = BindingSpec::new("p", &["widgets.example.org"]);
        if related {
            spec.related_resources = vec![
                serde_json::from_value::<RelatedResource>(serde_json::json!({
                    "resource": "secrets",
                    "direction": "FromProvider",
                }))
                .unwrap(),
            ];
        }
        spec
    }

    #[test]
    fn a_change_concerns_exactly_the_bindings_it_can_alter() {
        let in_ns = |namespace: &str, name: &str| ObjectKey {
            namespace: Some(namespace.into()),
            name: name.into(),
        };
        let widgets = "widgets.example.org";
        let schema = |connection: &str, api: &str| Change::ProviderSchema {
            connection: connection.into(),
            api: api.into(),
        };
        // (change, concerns the ClusterBinding, the Binding in team-a, the suspended one with
        // related resources in team-a)
        let table = [
            (Change::Cached(Kind::Connection, key("p")), true, true, true),
            (
                Change::Cached(Kind::Connection, key("q")),
                false,
                false,
                false,
            ),
            (Change::Cached(Kind::Crd, key(widgets)), true, true, true),
            (
                Change::Cached(Kind::Crd, key("gadgets.example.org")),
                false,
                false,
                false,
            ),
            (schema("p", widgets), true, true, true),
            (schema("q", widgets), false, false, false),
            (schema("p", "gadgets.example.org"), false, false, false),
            (Change::Marked(widgets.into()), true, true, true),
            (
                Change::Marked("gadgets.example.org".into()),
                false,
                false,
                false,
            ),
            // Counts matter only to a suspended binding (the related one here).
            (Change::Instances(widgets.into()), false, false, true),
            (Change::RelatedServed("team-a".into()), false, false, true),
            (Change::RelatedServed("team-b".into()), false, false, false),
            // A place under the cap freed: only the Binding let in.
            (Change::LetIn(in_ns("team-a", "b")), false, true, false),
            (Change::LetIn(in_ns("team-b", "b")), false, false, false),
            (Change::LetIn(key("c")), false, false, false),
            // Its own kind is the controller's own trigger; a Connection's inputs are the
            // Connection controller's.
            (
                Change::Cached(Kind::ClusterBinding, key("c")),
                false,
                false,
                false,
            ),
            (
                Change::Cached(Kind::MemberLease, key("s")),
                false,
                false,
                false,
            ),
            (Change::ConnectionInput("p".into()), false, false, false),
        ];
        let cluster = ClusterBinding::new(
            "c",
            ClusterBindingSpec {
                binding: spec(false),
            },
        );
        let mut binding = Binding::new("b", spec(false));
        binding.metadata.namespace = Some("team-a".into());
        let mut related = Binding::new("r", spec(true));
        related.spec.suspend = true;
        related.metadata.namespace = Some("team-a".into());
        for (change, c, b, r) in table {
            assert_eq!(concerns(&cluster, &change), c, "ClusterBinding: {change:?}");
            assert_eq!(concerns(&binding, &change), b, "Binding: {change:?}");
            assert_eq!(concerns(&related, &change), r, "related: {change:?}");
        }
    }
}
