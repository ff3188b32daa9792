//! What a binding reconcile gathers per listed API (BIND-5): its export, the desired and installed
//! consumer CRD, and the conflicting instances in the binding's scope; and which APIs of a
//! Binding a ClusterBinding covers (RES-2).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_shared::api::{ApiScope, Connection, PullPolicy, UpdatePolicy};
use kbind_shared::keys;
use kube::ResourceExt;

use super::kinds::Scoped;
use super::outcome::{ApiState, Held, Marks};
use crate::context::Context;
use crate::providers::{Provider, ProviderError};
use crate::schema;

/// The APIs of a Binding that a ClusterBinding also lists, with that ClusterBinding's name: its
/// instances in the Binding's namespace sync under the ClusterBinding (RES-2).
pub(super) async fn covered_by_cluster_bindings(
    ctx: &Context,
    spec: &kbind_shared::api::BindingSpec,
) -> Vec<(String, String)> {
    let Ok((cluster_bindings, _)) = ctx.all_bindings().await else {
        return Vec::new();
    };
    let mut covered = Vec::new();
    for api in &spec.apis {
        if let Some(resolution) = kbind_shared::resolve::resolve(
            &api.name,
            None,
            cluster_bindings.iter().map(|b| b.as_ref()),
            std::iter::empty(),
        ) {
            covered.push((api.name.clone(), resolution.name));
        }
    }
    covered
}

/// Reason of an API whose binding's object selector cannot be read.
pub const INVALID_OBJECT_SELECTOR: &str = "InvalidObjectSelector";

/// BIND-5 for one API.
pub(super) async fn api_state<B: Scoped>(
    binding: &B,
    connection: &Connection,
    provider: &Provider,
    api: &str,
    ctx: &Context,
) -> ApiState {
    // A selector the syncer could not read would route nothing: said here, by what is wrong.
    if let Some(selector) = &binding.binding_spec().object_selector
        && let Err(e) = kube::core::Selector::try_from(selector.clone())
    {
        return ApiState::Gated {
            reason: INVALID_OBJECT_SELECTOR,
            message: format!("spec.objectSelector cannot be read: {e}"),
        };
    }
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
    let (desired, omitted) = match schema::desired_for(
        provider,
        &ctx.documents,
        &connection.name_any(),
        status.active_schema_source,
        export,
    )
    .await
    {
        Ok(found) => found,
        Err(ProviderError::Forbidden(message)) => return ApiState::Forbidden(message),
        Err(ProviderError::Failed(message)) => return ApiState::Pending(message),
    };
    let hash = desired
        .annotations()
        .get(keys::SCHEMA_HASH_ANNOTATION)
        .cloned()
        .unwrap_or_default();
    let policy = schema::Policy {
        create,
        update,
        accepted: &policy.accepted_changes,
    };
    let cached = ctx.cached_crd(api);
    // Another Connection serves the consumer CRD: this binding is an extra route for it, or
    // refused (#36). The CRD is not touched either way.
    if let Some(existing) = cached.as_deref()
        && let Some(state) = as_route(binding, existing, &desired, &connection.name_any())
    {
        return state;
    }
    let installed = match schema::install(
        &ctx.client,
        &desired,
        &connection.name_any(),
        policy,
        cached.as_deref(),
    )
    .await
    {
        Ok(installed) => installed,
        Err(message) => return ApiState::Pending(message),
    };
    if let schema::Plan::Refuse(message) = installed.plan {
        return ApiState::SchemaConflict(message);
    }
    // Adopted from the Connection that serves it: drained from that provider first.
    if let schema::Plan::Handover { from } = &installed.plan {
        return match super::release::adopt_from(ctx, api, from, &connection.name_any()).await {
            Ok(Some(message)) => ApiState::Moving {
                from: from.clone(),
                message,
            },
            Ok(None) => ApiState::Pending(format!(
                "taken over from Connection {from}; installing the schema"
            )),
            Err(e) => ApiState::Pending(e.to_string()),
        };
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
    let marks = count_marks(
        ctx,
        &desired,
        binding.covered_namespace().as_deref(),
        binding.binding_spec().suspend,
    );
    let held = match installed.plan {
        schema::Plan::Hold { changes, more } => Some(Held {
            affected: ctx
                .instances
                .affected_objects(&desired, &hash, binding.covered_namespace().as_deref())
                .await,
            hash: hash.clone(),
            connection: connection.name_any(),
            changes: changes.iter().map(ToString::to_string).collect(),
            more,
        }),
        _ => None,
    };
    ApiState::Bound {
        hash,
        in_sync: installed.in_sync,
        marks,
        held,
        omitted: omitted
            .iter()
            .map(|v| format!("{} ({})", v.name, v.reason))
            .collect(),
    }
}

/// [`schema::route_plan`] as this binding's API state: a route, a refusal, or `None` (the schema
/// plan decides).
fn as_route<B: Scoped>(
    binding: &B,
    existing: &CustomResourceDefinition,
    desired: &CustomResourceDefinition,
    connection: &str,
) -> Option<ApiState> {
    let selects = binding.binding_spec().object_selector.is_some();
    let (served_by, admission) = schema::route_plan(existing, desired, connection, selects)?;
    match admission {
        kbind_shared::routing::Admission::Serves => None,
        kbind_shared::routing::Admission::Route(schema) => {
            Some(ApiState::Route { served_by, schema })
        }
        kbind_shared::routing::Admission::Refused(message) => {
            Some(ApiState::SchemaConflict(message))
        }
    }
}

/// BIND-5d: instances in scope with a conflict annotation, and those paused — by their
/// annotation, or all of them while `suspended` — from a metadata-only watch cache (LIM-16: no
/// LIST of every instance per resync). A cache that has not listed yet counts 0.
fn count_marks(
    ctx: &Context,
    crd: &CustomResourceDefinition,
    namespace: Option<&str>,
    suspended: bool,
) -> Marks {
    let Some(resource) = kbind_shared::dynamic::instance_resource(crd) else {
        return Marks::default();
    };
    // Read in the binding's scope only (#54): a Binding's namespace, or everywhere.
    let marked = ctx.instances.marked(&resource, namespace);
    let mut marks = Marks::default();
    for item in marked.store.state() {
        if namespace.is_some() && item.metadata.namespace.as_deref() != namespace {
            continue;
        }
        let annotations = item.annotations();
        match annotations
            .get(keys::CONFLICT_ANNOTATION)
            .map(String::as_str)
        {
            Some(keys::CONFLICT_FOREIGN) => marks.foreign += 1,
            Some(v) if kbind_shared::routing::Reason::parse(v).is_some() => marks.routing += 1,
            Some(v) if !v.is_empty() => marks.owned_by_another += 1,
            _ => {}
        }
        if annotations.get(keys::PAUSED_ANNOTATION).map(String::as_str) == Some(keys::TRUE) {
            marks.paused += 1;
        }
    }
    if suspended {
        marks.paused = i32::try_from(marked.total(namespace)).unwrap_or(i32::MAX);
    }
    marks
}
