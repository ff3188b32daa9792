//! The ClusterBinding and Binding reconcilers (REFERENCE-BEHAVIOUR §12 BIND, §9 SCH, §14 BCL):
//! install the schemas of the listed APIs, report per-API problems, count conflicts, and on
//! deletion drain exactly the instances no remaining binding covers.

pub mod outcome;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kbind_shared::api::{
    ApiScope, Binding, BindingStatus, ClusterBinding, Connection, PullPolicy, UpdatePolicy,
};
use kbind_shared::conditions::{self, Desired, reasons, types};
use kbind_shared::keys;
use kbind_shared::resolve::BindingObject;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{self, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::connection::credentials::Provider;
use crate::context::Context;
use crate::schema;
use outcome::{ApiState, Conflicts};

const DRAIN_RECHECK: Duration = Duration::from_secs(2);
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Why a binding reconcile did not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A consumer request failed.
    #[error("consumer API: {0}")]
    Consumer(#[source] kube::Error),
    /// Unbind waits for provider copies to be deleted.
    #[error("waiting for {0} provider object(s) to be deleted")]
    Draining(usize),
    /// Cleanup could not proceed.
    #[error("{0}")]
    Cleanup(String),
    /// The finalizer helper failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<finalizer::Error<Error>>),
}

/// Runs both binding controllers until `stop`.
pub async fn run(ctx: Arc<Context>, stop: CancellationToken) {
    let cluster_bindings =
        controller::<ClusterBinding>(ctx.clone(), Api::all(ctx.client.clone()), stop.clone());
    let bindings = controller::<Binding>(ctx.clone(), Api::all(ctx.client.clone()), stop.clone());
    let both = futures::future::join(cluster_bindings, bindings);
    tokio::select! {
        _ = both => {}
        _ = async { stop.cancelled().await; tokio::time::sleep(SHUTDOWN_GRACE).await } => {
            tracing::warn!("binding reconciles did not finish within {SHUTDOWN_GRACE:?} of shutdown");
        }
    }
}

async fn controller<B>(ctx: Arc<Context>, api: Api<B>, stop: CancellationToken)
where
    B: BindingObject + kube::Resource<DynamicType = ()>,
    B: Scoped,
{
    let controller = Controller::new(api, watcher::Config::default());
    let store = controller.store();
    let crd_store = store.clone();
    // BIND-5d live: a change in which instances conflict re-counts the bindings listing the API.
    let conflict_store = store.clone();
    let conflict_triggers = futures::stream::unfold(ctx.conflict_changes(), |mut changes| async {
        loop {
            match changes.recv().await {
                Ok(api) => return Some((api, changes)),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
    .flat_map(move |api| {
        futures::stream::iter(
            conflict_store
                .state()
                .into_iter()
                .filter(|b| b.binding_spec().apis.iter().any(|a| a.name == api))
                .map(|b| ObjectRef::from_obj(b.as_ref()))
                .collect::<Vec<_>>(),
        )
    });

    // BIND triggers: Connection events map to the bindings that name the Connection.
    controller
        .watches(
            Api::<Connection>::all(ctx.client.clone()),
            watcher::Config::default(),
            move |connection| {
                let name = connection.name_any();
                store
                    .state()
                    .into_iter()
                    .filter(|b| b.binding_spec().connection_ref.name == name)
                    .map(|b| ObjectRef::from_obj(b.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
        // A consumer CRD changing (the user's `core.kbind.io/adopt` opt-in, markers edited by
        // hand) re-evaluates the bindings that list it at once; metadata only.
        .watches(
            Api::<kube::core::PartialObjectMeta<CustomResourceDefinition>>::all(ctx.client.clone()),
            watcher::Config::default(),
            move |crd| {
                let name = crd.name_any();
                crd_store
                    .state()
                    .into_iter()
                    .filter(|b| b.binding_spec().apis.iter().any(|a| a.name == name))
                    .map(|b| ObjectRef::from_obj(b.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
        .reconcile_on(conflict_triggers)
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(reconcile::<B>, error_policy::<B>, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "binding reconcile");
            }
        })
        .await;
}

/// How to reach a binding kind's API for one object.
pub trait Scoped: BindingObject {
    /// The Api for this object's scope.
    fn api(client: &Client, object: &Self) -> Api<Self>;
    /// The namespace whose instances it covers (`None`: all).
    fn covered_namespace(&self) -> Option<String>;
    /// `kind/[namespace/]name`, for messages.
    fn describe(&self) -> String;
}

impl Scoped for Binding {
    fn api(client: &Client, object: &Self) -> Api<Self> {
        Api::namespaced(client.clone(), &object.namespace().unwrap_or_default())
    }
    fn covered_namespace(&self) -> Option<String> {
        self.namespace()
    }
    fn describe(&self) -> String {
        format!(
            "Binding {}/{}",
            self.namespace().unwrap_or_default(),
            self.name_any()
        )
    }
}

impl Scoped for ClusterBinding {
    fn api(client: &Client, _: &Self) -> Api<Self> {
        Api::all(client.clone())
    }
    fn covered_namespace(&self) -> Option<String> {
        None
    }
    fn describe(&self) -> String {
        format!("ClusterBinding {}", self.name_any())
    }
}

fn error_policy<B: Scoped>(binding: Arc<B>, error: &Error, ctx: Arc<Context>) -> Action {
    match error {
        Error::Draining(_) => Action::requeue(DRAIN_RECHECK),
        // A write raced with another (a status write from a cache a moment old): the fresh object
        // is on its way through the watch; retry at once, without a warning.
        Error::Consumer(kube::Error::Api(s)) if s.is_conflict() => {
            tracing::debug!(binding = %binding.describe(), "write conflict; retrying");
            Action::requeue(Duration::from_millis(200))
        }
        e => {
            tracing::warn!(binding = %binding.describe(), error = %e, "binding reconcile failed");
            Action::requeue(
                ctx.settings
                    .binding_resync_interval
                    .max(Duration::from_secs(1)),
            )
        }
    }
}

async fn reconcile<B: Scoped>(binding: Arc<B>, ctx: Arc<Context>) -> Result<Action, Error> {
    let api = B::api(&ctx.client, &binding);
    let binding = crate::context::fresh_unless_finalized(&api, binding, keys::CLEANUP_FINALIZER)
        .await
        .map_err(Error::Consumer)?;
    finalizer(&api, keys::CLEANUP_FINALIZER, binding, |event| async {
        match event {
            finalizer::Event::Apply(b) => apply(b, &ctx).await,
            finalizer::Event::Cleanup(b) => cleanup(b, &ctx).await,
        }
    })
    .await
    .map_err(|e| match e {
        finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e,
        e => Error::Finalizer(Box::new(e)),
    })
}

/// BIND-3 … BIND-13.
async fn apply<B: Scoped>(binding: Arc<B>, ctx: &Context) -> Result<Action, Error> {
    let requeue = Action::requeue(ctx.settings.binding_resync_interval);
    let connection_name = binding.binding_spec().connection_ref.name.clone();
    let connection = Api::<Connection>::all(ctx.client.clone())
        .get_opt(&connection_name)
        .await
        .map_err(Error::Consumer)?;

    // BIND-3: the Connection gate.
    let gate = match &connection {
        None => Some(format!("Connection {connection_name} not found yet")),
        Some(c) => {
            let conds = c
                .status
                .as_ref()
                .map(|s| s.conditions.as_slice())
                .unwrap_or_default();
            (!conditions::is_true(conds, types::READY)).then(|| {
                let why = conditions::find(conds, types::READY)
                    .map(|r| format!(": {}", r.message))
                    .unwrap_or_default();
                format!("Connection {connection_name} is not Ready yet{why}")
            })
        }
    };
    let denied = connection
        .as_ref()
        .and_then(|c| outcome::access_denied(c, binding.namespace().as_deref()));
    let (desired, bound_apis) = match (gate, connection) {
        // Nothing is installed or synced for a Binding the Connection does not serve.
        _ if denied.is_some() => (denied.into_iter().collect(), Some(Vec::new())),
        (Some(message), _) => (vec![outcome::connection_pending(message)], None),
        (None, None) => (
            vec![outcome::connection_pending(format!(
                "Connection {connection_name} not found yet"
            ))],
            None,
        ),
        (None, Some(connection)) => {
            let provider = ctx
                .providers
                .for_connection(
                    &ctx.client,
                    &connection,
                    &ctx.settings.provider_secret_namespaces,
                    &ctx.metrics,
                )
                .await;
            let mut states = Vec::new();
            for api in &binding.binding_spec().apis {
                let state = match &provider {
                    Ok(provider) => {
                        api_state(binding.as_ref(), &connection, provider, &api.name, ctx).await
                    }
                    Err(message) => ApiState::Pending(message.clone()),
                };
                states.push((api.name.clone(), state));
            }
            let (mut desired, bound) = outcome::evaluate(&states);
            if B::NAMESPACED {
                let covered =
                    covered_by_cluster_bindings(&ctx.client, binding.binding_spec()).await;
                outcome::note_precedence(&mut desired, &covered);
            }
            (desired, Some(bound))
        }
    };
    write_status(binding.as_ref(), ctx, desired, bound_apis).await?;
    Ok(requeue)
}

/// The APIs of a Binding that a ClusterBinding also lists, with that ClusterBinding's name: its
/// instances in the Binding's namespace sync under the ClusterBinding (RES-2).
async fn covered_by_cluster_bindings(
    client: &Client,
    spec: &kbind_shared::api::BindingSpec,
) -> Vec<(String, String)> {
    let Ok(cluster_bindings) = Api::<ClusterBinding>::all(client.clone())
        .list(&ListParams::default())
        .await
    else {
        return Vec::new();
    };
    let mut covered = Vec::new();
    for api in &spec.apis {
        if let Some(resolution) = kbind_shared::resolve::resolve(
            &api.name,
            None,
            cluster_bindings.items.iter(),
            std::iter::empty(),
        ) {
            covered.push((api.name.clone(), resolution.name));
        }
    }
    covered
}

/// BIND-5 for one API.
async fn api_state<B: Scoped>(
    binding: &B,
    connection: &Connection,
    provider: &Provider,
    api: &str,
    ctx: &Context,
) -> ApiState {
    let status = connection.status.clone().unwrap_or_default();
    let Some(export) = status.exported_apis.iter().find(|e| e.name == api) else {
        return ApiState::NotExported;
    };
    if B::NAMESPACED && export.scope == ApiScope::Cluster {
        return ApiState::ClusterScopedInBinding;
    }
    let policy = &connection.spec.schema;
    let create = policy.pull_policy != PullPolicy::None;
    let update = policy.update_policy != UpdatePolicy::Once;
    let desired = match schema::desired_for(
        &provider.client,
        &connection.name_any(),
        status.active_schema_source,
        export,
    )
    .await
    {
        Ok(desired) => desired,
        Err(schema::Problem::Forbidden(message)) => return ApiState::Forbidden(message),
        Err(schema::Problem::Pending(message)) => return ApiState::Pending(message),
    };
    let hash = desired
        .annotations()
        .get(keys::SCHEMA_HASH_ANNOTATION)
        .cloned()
        .unwrap_or_default();
    let installed = match schema::install(
        &ctx.client,
        &desired,
        &connection.name_any(),
        create,
        update,
    )
    .await
    {
        Ok(installed) => installed,
        Err(message) => return ApiState::Pending(message),
    };
    if let schema::Plan::Refuse(message) = installed.plan {
        return ApiState::SchemaConflict(message);
    }
    if installed.plan == schema::Plan::LeaveAbsent {
        return ApiState::Pending(
            "the consumer CRD is not installed and pullPolicy is None: supply it".into(),
        );
    }
    // Ready means usable: not before the API server serves the CRD (its Established condition
    // re-triggers this reconcile through the CRD watch).
    if !installed.established {
        return ApiState::Pending(format!("the consumer CRD {api} is not established yet"));
    }
    let conflicts = count_conflicts(ctx, &desired, binding.covered_namespace().as_deref()).await;
    ApiState::Bound {
        hash,
        in_sync: installed.in_sync,
        conflicts,
    }
}

/// The instances' API of a consumer CRD: its storage version.
fn instance_resource(crd: &CustomResourceDefinition) -> Option<ApiResource> {
    let version = schema::select_version(&crd.spec.versions)?;
    Some(ApiResource {
        group: crd.spec.group.clone(),
        version: version.name.clone(),
        api_version: format!("{}/{}", crd.spec.group, version.name),
        kind: crd.spec.names.kind.clone(),
        plural: crd.spec.names.plural.clone(),
    })
}

fn instances(
    client: &Client,
    resource: &ApiResource,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    }
}

/// BIND-5d: instances in scope with a conflict annotation, from a metadata-only watch cache
/// (LIM-16: no LIST of every instance per resync). A cache that has not listed yet counts 0.
async fn count_conflicts(
    ctx: &Context,
    crd: &CustomResourceDefinition,
    namespace: Option<&str>,
) -> Conflicts {
    let Some(resource) = instance_resource(crd) else {
        return Conflicts::default();
    };
    let mut conflicts = Conflicts::default();
    for item in ctx.instance_metadata(&resource).state() {
        if namespace.is_some() && item.metadata.namespace.as_deref() != namespace {
            continue;
        }
        match item
            .annotations()
            .get(keys::CONFLICT_ANNOTATION)
            .map(String::as_str)
        {
            Some(keys::CONFLICT_FOREIGN) => conflicts.foreign += 1,
            Some(v) if !v.is_empty() => conflicts.owned_by_another += 1,
            _ => {}
        }
    }
    conflicts
}

/// BIND-12: writes the status when anything changed.
async fn write_status<B: Scoped>(
    binding: &B,
    ctx: &Context,
    desired: Vec<Desired<'_>>,
    bound_apis: Option<Vec<kbind_shared::api::BoundApi>>,
) -> Result<(), Error> {
    let before = binding.binding_status().cloned().unwrap_or_default();
    let mut status: BindingStatus = before.clone();
    let now = Time(jiff::Timestamp::now());
    let ready = desired
        .iter()
        .any(|d| d.type_ == types::READY && d.status == conditions::Status::True);
    for d in desired {
        conditions::set(&mut status.conditions, d, binding.meta().generation, &now);
    }
    if let Some(bound) = bound_apis {
        status.bound_apis = bound;
    }
    let namespace = binding.namespace().unwrap_or_default();
    ctx.metrics
        .binding_ready
        .with_label_values(&[namespace.as_str(), &binding.name_any()])
        .set(if ready { 1.0 } else { 0.0 });
    if status == before {
        return Ok(());
    }
    warn_on_new_schema_conflict(binding, ctx, &before, &status).await;
    let mut updated = binding.clone();
    updated.set_binding_status(status);
    B::api(&ctx.client, binding)
        .replace_status(&binding.name_any(), &PostParams::default(), &updated)
        .await
        .map_err(Error::Consumer)?;
    Ok(())
}

/// A `SchemaConflict` Warning Event when the Ready message about one starts or changes: the
/// user must act (annotate the CRD, or drop the API), so it is announced, once per change.
async fn warn_on_new_schema_conflict<B: Scoped>(
    binding: &B,
    ctx: &Context,
    before: &BindingStatus,
    after: &BindingStatus,
) {
    let conflict = |status: &BindingStatus| {
        conditions::find(&status.conditions, types::READY)
            .filter(|c| c.reason == reasons::SCHEMA_CONFLICT)
            .map(|c| c.message.clone())
    };
    let Some(message) = conflict(after) else {
        return;
    };
    if conflict(before).as_ref() == Some(&message) {
        return;
    }
    let recorder = kube::runtime::events::Recorder::new(ctx.client.clone(), ctx.reporter.clone());
    let event = kube::runtime::events::Event {
        type_: kube::runtime::events::EventType::Warning,
        reason: reasons::SCHEMA_CONFLICT.into(),
        note: Some(message),
        action: "InstallSchema".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &binding.object_ref(&())).await {
        tracing::debug!(error = %e, "cannot publish Event");
    }
}

/// Where an API's instances stay covered after `leaving` goes: by a remaining ClusterBinding
/// (everywhere) or by remaining Bindings (their namespaces). LIM-22: exact, per namespace.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    /// A remaining ClusterBinding covers every namespace.
    pub everywhere: bool,
    /// Namespaces a remaining Binding covers.
    pub namespaces: Vec<String>,
}

/// Computes the [`Coverage`] that remains for `api` of `connection` without the leaving binding.
pub fn remaining_coverage(
    api: &str,
    connection: &str,
    leaving_uid: &str,
    cluster_bindings: &[ClusterBinding],
    bindings: &[Binding],
) -> Coverage {
    let remains = |meta: &kube::api::ObjectMeta, spec: &kbind_shared::api::BindingSpec| {
        meta.deletion_timestamp.is_none()
            && meta.uid.as_deref() != Some(leaving_uid)
            && spec.connection_ref.name == connection
            && spec.apis.iter().any(|a| a.name == api)
    };
    Coverage {
        everywhere: cluster_bindings
            .iter()
            .any(|b| remains(&b.metadata, &b.spec)),
        namespaces: bindings
            .iter()
            .filter(|b| remains(&b.metadata, &b.spec))
            .filter_map(|b| b.namespace())
            .collect(),
    }
}

/// §14 BCL, exact: drain the instances no remaining binding covers, wait for their provider copies
/// to be gone (PGAP-1), and remove a consumer CRD only when a ClusterBinding goes, nothing else
/// lists the API, and kbind created the CRD (LIM-9).
async fn cleanup<B: Scoped>(binding: Arc<B>, ctx: &Context) -> Result<Action, Error> {
    let client = &ctx.client;
    let spec = binding.binding_spec();
    let connection_name = spec.connection_ref.name.clone();
    let connection = Api::<Connection>::all(client.clone())
        .get_opt(&connection_name)
        .await
        .map_err(Error::Consumer)?;
    let (provider, local_uid) = match &connection {
        Some(c) => (
            ctx.providers
                .for_connection(
                    client,
                    c,
                    &ctx.settings.provider_secret_namespaces,
                    &ctx.metrics,
                )
                .await
                .ok(),
            c.status
                .as_ref()
                .map(|s| s.local_cluster_uid.clone())
                .unwrap_or_default(),
        ),
        None => (None, String::new()),
    };
    let cluster_bindings = Api::<ClusterBinding>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::Consumer)?
        .items;
    let bindings = Api::<Binding>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::Consumer)?
        .items;
    let uid = binding.meta().uid.clone().unwrap_or_default();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    // Safe by default: a binding autoBind made goes away without a user asking for it (autoBind
    // off, an export missing past its grace, the Connection deleted). Its instances are orphaned
    // — finalizers released, provider copies kept — and its CRDs are kept, marked unbound.
    let automatic = is_automatic(binding.meta());

    let mut waiting = 0;
    for api in &spec.apis {
        let coverage = remaining_coverage(
            &api.name,
            &connection_name,
            &uid,
            &cluster_bindings,
            &bindings,
        );
        if coverage.everywhere {
            continue;
        }
        let Some(crd) = crds.get_opt(&api.name).await.map_err(Error::Consumer)? else {
            continue;
        };
        let Some(resource) = instance_resource(&crd) else {
            continue;
        };
        let scope = binding.covered_namespace();
        let list = match instances(client, &resource, scope.as_deref())
            .list(&ListParams::default())
            .await
        {
            Ok(list) => list.items,
            Err(kube::Error::Api(s)) if s.is_not_found() => Vec::new(),
            Err(e) => return Err(Error::Consumer(e)),
        };
        for object in list {
            let namespace = object.namespace();
            if namespace
                .as_ref()
                .is_some_and(|ns| coverage.namespaces.contains(ns))
            {
                continue;
            }
            if !object
                .finalizers()
                .iter()
                .any(|f| f == keys::SYNCER_FINALIZER)
            {
                continue;
            }
            let orphan = object
                .annotations()
                .get(keys::DELETION_POLICY_ANNOTATION)
                .map(String::as_str)
                == Some(keys::DELETION_POLICY_ORPHAN);
            if !orphan
                && !automatic
                && let Some(provider) = &provider
            {
                match delete_provider_copy(&provider.client, &resource, &object, &local_uid).await {
                    Ok(true) => {
                        waiting += 1;
                        continue;
                    }
                    Ok(false) => {}
                    Err(message) => return Err(Error::Cleanup(message)),
                }
            }
            release_syncer_finalizer(client, &resource, &object).await?;
        }
        if waiting == 0 && !B::NAMESPACED {
            let last = LastBinding {
                crds: &crds,
                crd: &crd,
                connection: &connection_name,
                api: &api.name,
                leaving_uid: &uid,
                cluster_bindings: &cluster_bindings,
                bindings: &bindings,
            };
            if automatic {
                last.mark_unbound(&binding.name_any()).await?;
            } else {
                last.delete_crd_if_ours().await?;
            }
        }
    }
    // BCL-4, for every kind and side (not only the declared entries: an entry removed while no
    // syncer ran may have left copies): delete this binding's related copies. Sources are never
    // touched (REL-7). Deleting is immediate; the next pass confirms none came back.
    let related = delete_related_copies(
        client,
        provider.as_ref().map(|p| &p.client),
        binding.covered_namespace().as_deref(),
        &uid,
    )
    .await?;
    if waiting > 0 || related > 0 {
        let message = match (waiting, related) {
            (0, related) => format!("deleting {related} related copy(ies)"),
            (waiting, 0) => format!("waiting for {waiting} provider object(s) to be deleted"),
            (waiting, related) => format!(
                "waiting for {waiting} provider object(s) to be deleted; deleting {related} related copy(ies)"
            ),
        };
        let desired = vec![Desired::new(
            types::READY,
            false,
            outcome::DRAINING_OBJECTS,
            message,
        )];
        write_status(binding.as_ref(), ctx, desired, None).await?;
        return Err(Error::Draining(waiting + related));
    }
    let namespace = binding.namespace().unwrap_or_default();
    let _ = ctx
        .metrics
        .binding_ready
        .remove_label_values(&[namespace.as_str(), &binding.name_any()]);
    Ok(Action::await_change())
}

/// BCL-4: deletes the Secrets and ConfigMaps this binding copied (labelled managed, annotated with
/// its UID) on both clusters in its scope. Returns how many it found. Without a provider client
/// only the consumer side is cleaned (best effort, like the reference).
async fn delete_related_copies(
    consumer: &Client,
    provider: Option<&Client>,
    namespace: Option<&str>,
    binding_uid: &str,
) -> Result<usize, Error> {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let mut found = 0;
    let selector = format!("{}={}", keys::MANAGED_LABEL, keys::TRUE);
    for (side, client) in [("consumer", Some(consumer)), ("provider", provider)] {
        let Some(client) = client else { continue };
        for resource in [
            ApiResource::erase::<Secret>(&()),
            ApiResource::erase::<ConfigMap>(&()),
        ] {
            let api = instances(client, &resource, namespace);
            let list = match api
                .list_metadata(&ListParams::default().labels(&selector))
                .await
            {
                Ok(list) => list.items,
                // Credentials that may not list a kind cannot have made copies of it.
                Err(kube::Error::Api(s)) if s.is_forbidden() || s.is_not_found() => continue,
                Err(e) => {
                    return Err(Error::Cleanup(format!(
                        "list related {} on the {side}: {}",
                        resource.plural,
                        kbind_shared::identity::describe_error(&e)
                    )));
                }
            };
            for copy in list {
                if copy
                    .annotations()
                    .get(keys::RELATED_BINDING_ANNOTATION)
                    .map(String::as_str)
                    != Some(binding_uid)
                    // Taken over under Adopt, not created: kbind never deletes it.
                    || copy
                        .annotations()
                        .get(keys::RELATED_ADOPTED_ANNOTATION)
                        .map(String::as_str)
                        == Some(keys::TRUE)
                {
                    continue;
                }
                found += 1;
                let namespace = copy.namespace().unwrap_or_default();
                let params = DeleteParams {
                    preconditions: Some(kube::api::Preconditions {
                        uid: copy.metadata.uid.clone(),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                match instances(client, &resource, Some(&namespace))
                    .delete(&copy.name_any(), &params)
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => {}
                    Err(e) => {
                        return Err(Error::Cleanup(format!(
                            "delete related {} {namespace}/{} on the {side}: {}",
                            resource.kind,
                            copy.name_any(),
                            kbind_shared::identity::describe_error(&e)
                        )));
                    }
                }
            }
        }
    }
    Ok(found)
}

/// Deletes the provider copy of `object` if it is ours. Returns whether it still exists.
async fn delete_provider_copy(
    provider: &Client,
    resource: &ApiResource,
    object: &DynamicObject,
    local_uid: &str,
) -> Result<bool, String> {
    let api = instances(provider, resource, object.namespace().as_deref());
    let name = object.name_any();
    let copy = match api.get_opt(&name).await {
        Ok(copy) => copy,
        Err(e) => {
            return Err(format!(
                "read provider copy of {name}: {}",
                kbind_shared::identity::describe_error(&e)
            ));
        }
    };
    let Some(copy) = copy else { return Ok(false) };
    let ours = copy
        .annotations()
        .get(keys::CONSUMER_CLUSTER_UID_ANNOTATION)
        .map(String::as_str)
        == Some(local_uid)
        && copy.annotations().get(keys::CONSUMER_OBJECT_UID_ANNOTATION)
            == object.metadata.uid.as_ref();
    if !ours {
        return Ok(false);
    }
    if copy.metadata.deletion_timestamp.is_none() {
        // Exactly the copy just classified as ours: its UID is the precondition (a foreign object
        // re-created under the name since is never deleted).
        let params = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: copy.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(false),
            Err(kube::Error::Api(s)) if s.is_conflict() => return Ok(true),
            Err(e) => {
                return Err(format!(
                    "delete provider copy of {name}: {}",
                    kbind_shared::identity::describe_error(&e)
                ));
            }
        }
    }
    Ok(true)
}

async fn release_syncer_finalizer(
    client: &Client,
    resource: &ApiResource,
    object: &DynamicObject,
) -> Result<(), Error> {
    let finalizers: Vec<&String> = object
        .finalizers()
        .iter()
        .filter(|f| *f != keys::SYNCER_FINALIZER)
        .collect();
    let patch = json!({ "metadata": { "finalizers": finalizers, "resourceVersion": object.resource_version() } });
    match instances(client, resource, object.namespace().as_deref())
        .patch(
            &object.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(Error::Consumer(e)),
    }
}

/// Whether a binding was made by autoBind: controlled by a Connection.
fn is_automatic(meta: &kube::api::ObjectMeta) -> bool {
    meta.owner_references.iter().flatten().any(|o| {
        o.controller == Some(true)
            && o.kind == "Connection"
            && o.api_version.starts_with(&format!("{}/", keys::GROUP))
    })
}

/// An API's consumer CRD as its (possibly last) binding goes.
struct LastBinding<'a> {
    crds: &'a Api<CustomResourceDefinition>,
    crd: &'a CustomResourceDefinition,
    connection: &'a str,
    api: &'a str,
    leaving_uid: &'a str,
    cluster_bindings: &'a [ClusterBinding],
    bindings: &'a [Binding],
}

impl LastBinding<'_> {
    /// Whether kbind created the CRD for this Connection, it still serves it, and no other
    /// binding lists the API.
    fn ours_and_last(&self) -> bool {
        let listed_elsewhere = self
            .cluster_bindings
            .iter()
            .map(|b| (&b.metadata, &b.spec.binding))
            .chain(self.bindings.iter().map(|b| (&b.metadata, &b.spec)))
            .any(|(meta, spec)| {
                meta.deletion_timestamp.is_none()
                    && meta.uid.as_deref() != Some(self.leaving_uid)
                    && spec.apis.iter().any(|a| a.name == self.api)
            });
        let annotation = |key: &str| self.crd.annotations().get(key).map(String::as_str);
        !listed_elsewhere
            && annotation(keys::CREATED_BY_ANNOTATION) == Some(self.connection)
            && annotation(keys::CONNECTION_ANNOTATION) == Some(self.connection)
    }

    /// LIM-9: only the explicit deletion of the last binding removes a CRD kbind created (its UID
    /// is the precondition).
    async fn delete_crd_if_ours(&self) -> Result<(), Error> {
        if !self.ours_and_last() {
            return Ok(());
        }
        let params = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: self.crd.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self.crds.delete(self.api, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => Ok(()),
            Err(e) => Err(Error::Consumer(e)),
        }
    }

    /// The automatic unbind: the CRD (and so every object) stays, annotated to say why.
    async fn mark_unbound(&self, binding: &str) -> Result<(), Error> {
        if !self.ours_and_last() {
            return Ok(());
        }
        let note = format!(
            "ClusterBinding {binding} made by autoBind went away without a user deleting it; kbind kept this CRD and its objects (delete the CRD yourself if they are no longer wanted)"
        );
        let patch = json!({ "metadata": { "annotations": { keys::UNBOUND_ANNOTATION: note } } });
        match self
            .crds
            .patch(self.api, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
            Err(e) => Err(Error::Consumer(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kbind_shared::api::{ApiRef, BindingSpec, ClusterBindingSpec, ConnectionRef};

    fn spec(connection: &str, apis: &[&str]) -> BindingSpec {
        BindingSpec {
            connection_ref: ConnectionRef {
                name: connection.into(),
            },
            apis: apis.iter().map(|a| ApiRef { name: (*a).into() }).collect(),
            conflict_policy: Default::default(),
            related_resources: Vec::new(),
        }
    }

    #[test]
    fn remaining_coverage_is_exact_per_namespace_and_connection() {
        // LIM-22
        let w = "widgets.example.org";
        let mut leaving = ClusterBinding::new("leaving", ClusterBindingSpec::from(spec("p", &[w])));
        leaving.metadata.uid = Some("leaving".into());
        let other_connection =
            ClusterBinding::new("other", ClusterBindingSpec::from(spec("q", &[w])));
        let mut team_a = Binding::new("a", spec("p", &[w]));
        team_a.metadata.namespace = Some("team-a".into());
        let mut team_b_other_api = Binding::new("b", spec("p", &["gadgets.example.org"]));
        team_b_other_api.metadata.namespace = Some("team-b".into());
        let coverage = remaining_coverage(
            w,
            "p",
            "leaving",
            &[leaving.clone(), other_connection],
            &[team_a, team_b_other_api],
        );
        assert_eq!(
            coverage,
            Coverage {
                everywhere: false,
                namespaces: vec!["team-a".into()]
            }
        );

        let still = ClusterBinding::new("still", ClusterBindingSpec::from(spec("p", &[w])));
        assert!(remaining_coverage(w, "p", "leaving", &[leaving, still], &[]).everywhere);
    }
}
