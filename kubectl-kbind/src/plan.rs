//! `kubectl kbind plan <file>`: what applying a file of Connections and bindings would do, decided
//! by the schema manager's own functions (`schema::plan`, `schema::gate`,
//! `evolution::breaking_changes`, `ownership::classify`/`decide`, `resolve`) over what the two
//! clusters hold now. Every request it makes is a GET or a LIST: nothing changes on either cluster.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_schema_manager::openapi::fetch::Documents;
use kbind_schema_manager::providers::ProviderError;
use kbind_schema_manager::{discovery, evolution, schema};
use kbind_shared::api::{
    ApiScope, Binding, BindingSpec, ClusterBinding, Connection, ConnectionSpec, ExportedApi,
    PullPolicy, UpdatePolicy,
};
use kbind_shared::kubeconfig::Transport;
use kbind_shared::ownership::{self, Decision, Owner};
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use serde_json::Value;

use crate::view::{self, Pin, cell};

/// The largest plan file read.
const MAX_FILE: usize = 4 << 20;
/// The most documents in one file.
const MAX_DOCUMENTS: usize = 500;
/// Object names listed per category (the counts are always whole).
const MAX_NAMES: usize = 50;
/// The largest OpenAPI document read from a provider (the schema manager's default).
const OPENAPI_LIMIT: u64 = 10 << 20;

/// The objects of a plan file.
#[derive(Debug, Default)]
pub struct PlanFile {
    pub connections: Vec<Connection>,
    pub cluster_bindings: Vec<ClusterBinding>,
    pub bindings: Vec<Binding>,
}

/// Reads a file of YAML or JSON documents: only kbind's three kinds, each checked against its
/// type; anything else is an error naming the document.
pub fn parse(text: &str) -> Result<PlanFile, String> {
    if text.len() > MAX_FILE {
        return Err(format!(
            "the file is {} bytes; plans read at most {MAX_FILE}",
            text.len()
        ));
    }
    let mut out = PlanFile::default();
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        if index >= MAX_DOCUMENTS {
            return Err(format!("the file has more than {MAX_DOCUMENTS} documents"));
        }
        let value = <Value as serde::Deserialize>::deserialize(document).map_err(|e| {
            format!(
                "document {}: {}",
                index + 1,
                view::line(&e.to_string(), 300)
            )
        })?;
        if value.is_null() {
            continue;
        }
        let field = |key: &str| {
            value
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let (kind, api_version) = (field("kind"), field("apiVersion"));
        let wrong = |e: serde_json::Error| {
            format!(
                "document {} ({kind}): {}",
                index + 1,
                view::line(&e.to_string(), 300)
            )
        };
        if api_version
            != format!(
                "{}/{}",
                kbind_shared::keys::GROUP,
                kbind_shared::keys::VERSION
            )
        {
            return Err(format!(
                "document {} is {} {}: a plan reads only Connections, ClusterBindings and Bindings of {}/{}",
                index + 1,
                view::line(&api_version, 100),
                view::line(&kind, 100),
                kbind_shared::keys::GROUP,
                kbind_shared::keys::VERSION
            ));
        }
        match kind.as_str() {
            "Connection" => out
                .connections
                .push(serde_json::from_value(value).map_err(wrong)?),
            "ClusterBinding" => out
                .cluster_bindings
                .push(serde_json::from_value(value).map_err(wrong)?),
            "Binding" => out
                .bindings
                .push(serde_json::from_value(value).map_err(wrong)?),
            other => {
                return Err(format!(
                    "document {} is a {}: a plan reads only Connections, ClusterBindings and Bindings",
                    index + 1,
                    view::line(other, 100)
                ));
            }
        }
    }
    Ok(out)
}

/// The whole plan.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub connections: Vec<ConnectionPlan>,
    pub apis: Vec<ApiPlan>,
}

impl Report {
    /// Whether applying the file would leave something the user must act on: a refused or held
    /// schema, a conflict, a mismatched provider, an error.
    pub fn blocked(&self) -> bool {
        self.connections.iter().any(|c| c.error.is_some())
            || self.apis.iter().any(|a| {
                a.error.is_some()
                    || !a.conflicts.is_empty()
                    || matches!(
                        a.crd.action,
                        Action::Refuse | Action::Hold | Action::NotExported
                    )
                    // A route whose schema does not agree would hold its objects.
                    || (a.crd.action == Action::Route && !a.crd.breaking.is_empty())
            })
    }
}

/// One Connection the file creates, changes or names.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionPlan {
    pub name: String,
    /// `create`, `update` or `unchanged`; `missing` when neither the file nor the cluster has it.
    pub action: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_cluster_uid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<Pin>,
    pub exported_apis: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What would happen to a consumer CRD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Created.
    Create,
    /// Replaced with the provider's schema.
    Update,
    /// Present with another schema; the change is breaking and not accepted: held.
    Hold,
    /// Only kbind's markers added.
    Stamp,
    /// Already as desired.
    Keep,
    /// Not kbind's to change (another tool's, another Connection's, a reserved group).
    Refuse,
    /// Absent and not to be created (pullPolicy None).
    LeaveAbsent,
    /// The provider does not export it, or not for this kind of binding.
    NotExported,
    /// Another Connection serves the CRD; this binding selects objects, so its Connection becomes
    /// a route for them (#36). The CRD is not touched.
    Route,
    /// Nothing decided (see the error).
    Unknown,
}

/// A CRD's fate.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CrdPlan {
    pub action: Action,
    /// The breaking changes of an update (a held one, or one the Connection accepted).
    pub breaking: Vec<String>,
    /// Whether the Connection's schema policy accepts the breaking change.
    pub accepted: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// One API of one binding.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiPlan {
    /// `ClusterBinding/<name>` or `Binding/<namespace>/<name>`.
    pub binding: String,
    pub api: String,
    pub connection: String,
    pub crd: CrdPlan,
    /// Existing consumer objects no binding syncs yet that would start syncing.
    pub start_syncing: u64,
    /// Existing consumer objects another binding already syncs.
    pub already_syncing: u64,
    /// Up to 50 of those that would start.
    pub start_syncing_names: Vec<String>,
    /// Unmarked provider objects the binding's `Adopt` policy would take over.
    pub adopted: Vec<String>,
    /// Objects whose provider copy is not kbind's: they would not sync.
    pub conflicts: Vec<ObjectConflict>,
    /// How many conflicts in all (the list holds up to 50).
    pub conflict_count: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One conflict.
#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectConflict {
    pub object: String,
    pub reason: String,
}

/// The CRD decision for one API, as the schema manager would make it; `selects`: the binding
/// has an object selector (a route, when another Connection serves the CRD).
pub fn crd_plan(
    existing: Option<&CustomResourceDefinition>,
    desired: &CustomResourceDefinition,
    connection: &str,
    spec: &ConnectionSpec,
    selects: bool,
) -> CrdPlan {
    if let Some((served_by, admission)) =
        existing.and_then(|e| schema::route_plan(e, desired, connection, selects))
    {
        use kbind_shared::routing::{Admission, Schema};
        match admission {
            Admission::Route(Schema::Agrees) => {
                return CrdPlan {
                    action: Action::Route,
                    breaking: Vec::new(),
                    accepted: false,
                    message: format!(
                        "a route for the objects this binding selects; Connection {served_by} serves the CRD, which stays as it is"
                    ),
                };
            }
            Admission::Route(Schema::Mismatch(why)) => {
                return CrdPlan {
                    action: Action::Route,
                    breaking: vec![why],
                    accepted: false,
                    message: format!(
                        "a route whose schema does not agree with the one Connection {served_by} serves: the objects it selects would be held (SchemaMismatch)"
                    ),
                };
            }
            Admission::Refused(message) => {
                return CrdPlan {
                    action: Action::Refuse,
                    breaking: Vec::new(),
                    accepted: false,
                    message,
                };
            }
            Admission::Serves => {}
        }
    }
    let policy = &spec.schema;
    let create = policy.pull_policy != PullPolicy::None;
    let update = policy.update_policy != UpdatePolicy::Once;
    let decided = schema::plan(existing, desired, connection, create, update);
    let gated = schema::gate(decided.clone(), existing, desired, &policy.accepted_changes);
    let breaking = match (&decided, existing) {
        (schema::Plan::Replace, Some(existing)) => {
            let (changes, more) = evolution::breaking_changes(&existing.spec, &desired.spec);
            let mut listed: Vec<String> = changes.iter().map(ToString::to_string).collect();
            if more > 0 {
                listed.push(format!("… and {more} more"));
            }
            listed
        }
        _ => Vec::new(),
    };
    let (action, message) = match gated {
        schema::Plan::Create => (Action::Create, String::new()),
        schema::Plan::Replace => (Action::Update, String::new()),
        schema::Plan::Hold { .. } => (
            Action::Hold,
            "breaking change: the served schema stays until the Connection accepts it (spec.schema.acceptedChanges)"
                .to_owned(),
        ),
        schema::Plan::Stamp => (Action::Stamp, String::new()),
        schema::Plan::Handover { from } => (
            Action::Stamp,
            format!(
                "adopted from Connection {from}: its provider's copies are deleted first, then the CRD is re-marked"
            ),
        ),
        schema::Plan::Keep => (Action::Keep, String::new()),
        schema::Plan::Refuse(message) => (Action::Refuse, message),
        schema::Plan::LeaveAbsent => (
            Action::LeaveAbsent,
            "the consumer CRD is absent and pullPolicy is None: supply it".to_owned(),
        ),
    };
    CrdPlan {
        accepted: action == Action::Update && !breaking.is_empty(),
        action,
        breaking,
        message,
    }
}

/// Whether a binding of this kind may bind the export (BIND-5: a namespaced Binding never binds a
/// cluster-scoped API).
pub fn scope_allows(namespaced: bool, export: &ExportedApi) -> bool {
    !(namespaced && export.scope == ApiScope::Cluster)
}

/// What would happen to one consumer object that starts syncing, from its provider copy's
/// annotations (`None`: no copy yet).
pub fn object_fate(
    provider_annotations: Option<&BTreeMap<String, String>>,
    consumer_cluster: &str,
    object_uid: &str,
    policy: kbind_shared::api::ConflictPolicy,
) -> Fate {
    let Some(annotations) = provider_annotations else {
        return Fate::Create;
    };
    let owner = ownership::classify(annotations, consumer_cluster, object_uid);
    match (owner, ownership::decide(owner, policy)) {
        (Owner::Ours, _) => Fate::Resume,
        (_, Decision::Write) => Fate::Adopt,
        (_, Decision::Conflict(reason)) => Fate::Conflict(reason),
    }
}

/// [`object_fate`]'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// No provider copy: kbind creates one.
    Create,
    /// The provider copy is already this object's.
    Resume,
    /// An unmarked provider object, taken over under `Adopt`.
    Adopt,
    /// Not kbind's: the object would not sync.
    Conflict(&'static str),
}

struct ConnectionState {
    name: String,
    spec: ConnectionSpec,
    provider: Option<view::ProviderView>,
    exports: Vec<ExportedApi>,
    source: Option<kbind_shared::api::ActiveSchemaSource>,
}

/// One binding of the file (or the ClusterBinding a Connection's autoBind would make).
struct PlannedBinding {
    label: String,
    namespace: Option<String>,
    spec: BindingSpec,
}

fn planned_bindings(
    file: &PlanFile,
    exports: &BTreeMap<String, Vec<String>>,
) -> Vec<PlannedBinding> {
    let mut out: Vec<PlannedBinding> = file
        .cluster_bindings
        .iter()
        .map(|b| PlannedBinding {
            label: format!("ClusterBinding/{}", b.name_any()),
            namespace: None,
            spec: b.spec.binding.clone(),
        })
        .collect();
    out.extend(file.bindings.iter().map(|b| {
        let namespace = b.namespace().unwrap_or_else(|| "default".into());
        PlannedBinding {
            label: format!("Binding/{namespace}/{}", b.name_any()),
            namespace: Some(namespace),
            spec: b.spec.clone(),
        }
    }));
    for connection in file.connections.iter().filter(|c| c.spec.auto_bind) {
        let name = connection.name_any();
        let apis: Vec<&str> = exports
            .get(&name)
            .map(|e| e.iter().map(String::as_str).collect())
            .unwrap_or_default();
        out.push(PlannedBinding {
            label: format!("ClusterBinding/{name} (autoBind)"),
            namespace: None,
            spec: BindingSpec::new(&name, &apis),
        });
    }
    out
}

/// Reads both clusters and decides. Only GETs and LISTs.
pub async fn gather(
    consumer: &Client,
    file: PlanFile,
    transport: Transport,
) -> Result<Report, String> {
    let consumer_cluster = kbind_shared::identity::cluster_identity(consumer)
        .await
        .map_err(|e| format!("cannot read the consumer's cluster identity: {e}"))?;
    let cluster_bindings = Api::<ClusterBinding>::all(consumer.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| view::read_error("ClusterBindings", &e))?
        .items;
    let bindings = Api::<Binding>::all(consumer.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| view::read_error("Bindings", &e))?
        .items;
    let documents = Documents::new(OPENAPI_LIMIT);

    // Every Connection the file defines or names.
    let mut names: BTreeSet<String> = file.connections.iter().map(|c| c.name_any()).collect();
    names.extend(
        file.cluster_bindings
            .iter()
            .map(|b| b.spec.binding.connection_ref.name.clone())
            .chain(
                file.bindings
                    .iter()
                    .map(|b| b.spec.connection_ref.name.clone()),
            ),
    );
    let mut plans = Vec::new();
    let mut states: BTreeMap<String, ConnectionState> = BTreeMap::new();
    for name in names {
        let existing = view::connection(consumer, &name).await?;
        let in_file = file.connections.iter().find(|c| c.name_any() == name);
        let (action, spec) = match (in_file, &existing) {
            (Some(new), None) => ("create", new.spec.clone()),
            (Some(new), Some(old)) if same_spec(&new.spec, &old.spec) => {
                ("unchanged", new.spec.clone())
            }
            (Some(new), Some(_)) => ("update", new.spec.clone()),
            (None, Some(old)) => ("unchanged", old.spec.clone()),
            (None, None) => {
                plans.push(ConnectionPlan {
                    name: name.clone(),
                    action: "missing".into(),
                    provider_cluster_uid: None,
                    identity: None,
                    exported_apis: Vec::new(),
                    error: Some(format!(
                        "Connection {name} is neither in the file nor on the cluster"
                    )),
                });
                continue;
            }
        };
        let mut plan = ConnectionPlan {
            name: name.clone(),
            action: action.into(),
            provider_cluster_uid: None,
            identity: None,
            exported_apis: Vec::new(),
            error: None,
        };
        let mut state = ConnectionState {
            name: name.clone(),
            spec: spec.clone(),
            provider: None,
            exports: Vec::new(),
            source: None,
        };
        match view::provider(consumer, &spec, transport).await {
            Err(message) => plan.error = Some(message),
            Ok(provider) => {
                let pin = view::pin(
                    existing.as_ref().and_then(|c| c.status.as_ref()),
                    &provider.identity,
                );
                plan.provider_cluster_uid = Some(provider.identity.clone());
                if let Pin::Mismatch { pinned } = &pin {
                    plan.error = Some(format!(
                        "the credential reaches cluster {}, not the pinned {}: kbind would refuse it (ClusterIdentityChanged)",
                        provider.identity, pinned
                    ));
                } else {
                    // The source the Connection's status records (Auto resolves once).
                    let recorded = existing
                        .as_ref()
                        .and_then(|c| c.status.as_ref())
                        .and_then(|s| s.active_schema_source);
                    match discovery::discover(
                        &provider.provider,
                        &documents,
                        &spec.schema,
                        recorded,
                    )
                    .await
                    {
                        Ok(exports) => {
                            plan.exported_apis =
                                exports.apis.iter().map(|e| e.name.clone()).collect();
                            state.exports = exports.apis;
                            state.source = Some(exports.source);
                            state.provider = Some(provider);
                        }
                        Err(e) => plan.error = Some(format!("discovery: {}", e.message())),
                    }
                }
                plan.identity = Some(pin);
            }
        }
        states.insert(name, state);
        plans.push(plan);
    }

    let exports: BTreeMap<String, Vec<String>> = states
        .iter()
        .map(|(name, s)| {
            (
                name.clone(),
                s.exports.iter().map(|e| e.name.clone()).collect(),
            )
        })
        .collect();
    let mut apis = Vec::new();
    for binding in planned_bindings(&file, &exports) {
        for api in &binding.spec.apis {
            let connection = &binding.spec.connection_ref.name;
            let mut plan = ApiPlan {
                binding: binding.label.clone(),
                api: api.name.clone(),
                connection: connection.clone(),
                crd: CrdPlan {
                    action: Action::Unknown,
                    breaking: Vec::new(),
                    accepted: false,
                    message: String::new(),
                },
                start_syncing: 0,
                already_syncing: 0,
                start_syncing_names: Vec::new(),
                adopted: Vec::new(),
                conflicts: Vec::new(),
                conflict_count: 0,
                error: None,
            };
            match states.get(connection) {
                Some(state) => {
                    let context = Scope {
                        consumer,
                        consumer_cluster: &consumer_cluster,
                        documents: &documents,
                        cluster_bindings: &cluster_bindings,
                        bindings: &bindings,
                    };
                    if let Err(message) = plan_api(&context, state, &binding, &mut plan).await {
                        plan.error = Some(message);
                    }
                }
                None => {
                    plan.error = Some(format!("Connection {connection} cannot be planned (above)"))
                }
            }
            apis.push(plan);
        }
    }
    Ok(Report {
        connections: plans,
        apis,
    })
}

/// Whether two Connection specs are the same (as the API server would store them).
fn same_spec(a: &ConnectionSpec, b: &ConnectionSpec) -> bool {
    serde_json::to_value(a).ok() == serde_json::to_value(b).ok()
}

struct Scope<'a> {
    consumer: &'a Client,
    consumer_cluster: &'a str,
    documents: &'a Documents,
    cluster_bindings: &'a [ClusterBinding],
    bindings: &'a [Binding],
}

async fn plan_api(
    scope: &Scope<'_>,
    state: &ConnectionState,
    binding: &PlannedBinding,
    plan: &mut ApiPlan,
) -> Result<(), String> {
    let Some(provider) = &state.provider else {
        return Err(format!(
            "Connection {} cannot be planned (above)",
            state.name
        ));
    };
    let Some(export) = state.exports.iter().find(|e| e.name == plan.api) else {
        plan.crd.action = Action::NotExported;
        plan.crd.message = format!(
            "the provider of Connection {} does not export it",
            state.name
        );
        return Ok(());
    };
    if !scope_allows(binding.namespace.is_some(), export) {
        plan.crd.action = Action::NotExported;
        plan.crd.message =
            "a cluster-scoped API cannot be bound by a namespaced Binding; use a ClusterBinding"
                .into();
        return Ok(());
    }
    let (desired, _omitted) = schema::desired_for(
        &provider.provider,
        scope.documents,
        &state.name,
        state.source,
        export,
    )
    .await
    .map_err(|e| match e {
        ProviderError::Forbidden(m) | ProviderError::Failed(m) => m,
    })?;
    let existing = Api::<CustomResourceDefinition>::all(scope.consumer.clone())
        .get_opt(&plan.api)
        .await
        .map_err(|e| view::read_error(&format!("consumer CRD {}", plan.api), &e))?;
    plan.crd = crd_plan(
        existing.as_ref(),
        &desired,
        &state.name,
        &state.spec,
        binding.spec.object_selector.is_some(),
    );
    let Some(existing) = existing else {
        return Ok(()); // No consumer objects can exist yet.
    };
    if matches!(plan.crd.action, Action::Refuse | Action::LeaveAbsent) {
        return Ok(());
    }
    let Some(resource) = kbind_shared::dynamic::instance_resource(&existing) else {
        return Ok(());
    };
    // The consumer objects in the binding's scope, and which of them would start syncing.
    let mut starting: Vec<(Option<String>, String, String)> = Vec::new();
    let consumer_objects =
        kbind_shared::dynamic::scoped(scope.consumer, binding.namespace.as_deref(), &resource);
    let mut already: BTreeMap<Option<String>, bool> = BTreeMap::new();
    // A route takes only objects its selector matches that are on no route yet: the others stay
    // where they are pinned (#36).
    let offers =
        (plan.crd.action == Action::Route).then(|| route_offers(scope, binding, &plan.api));
    let mut ambiguous: Vec<String> = Vec::new();
    view::for_each_object(&consumer_objects, "consumer objects", |object| {
        let namespace = object.metadata.namespace.clone();
        if let Some(offers) = &offers {
            match route_fate(offers, &plan.api, &state.name, object) {
                RouteFate::Elsewhere => {}
                RouteFate::Stays => plan.already_syncing += 1,
                RouteFate::Starts => {
                    plan.start_syncing += 1;
                    starting.push((
                        namespace,
                        object.name_any(),
                        object.metadata.uid.clone().unwrap_or_default(),
                    ));
                }
                RouteFate::Ambiguous => ambiguous.push(match &namespace {
                    Some(ns) => format!("{ns}/{}", object.name_any()),
                    None => object.name_any(),
                }),
            }
            return;
        }
        let syncing = *already.entry(namespace.clone()).or_insert_with(|| {
            kbind_shared::resolve::resolve_served_by(
                &state.name,
                &plan.api,
                namespace.as_deref(),
                scope.cluster_bindings,
                scope.bindings,
            )
            .is_some_and(|r| r.is_bound())
        });
        if syncing {
            plan.already_syncing += 1;
        } else {
            plan.start_syncing += 1;
            starting.push((
                namespace,
                object.name_any(),
                object.metadata.uid.clone().unwrap_or_default(),
            ));
        }
    })
    .await?;
    for object in ambiguous {
        plan.conflict_count += 1;
        if plan.conflicts.len() < MAX_NAMES {
            plan.conflicts.push(ObjectConflict {
                object,
                reason: kbind_shared::routing::Reason::AmbiguousRoute
                    .as_str()
                    .into(),
            });
        }
    }
    if starting.is_empty() {
        return Ok(());
    }
    // Their provider copies, in the same namespaces under the same names.
    let provider_resource = kube::api::ApiResource {
        group: export.group.clone(),
        version: kbind_shared::dynamic::storage_version(&desired.spec.versions)
            .map(|v| v.name.clone())
            .unwrap_or_default(),
        api_version: String::new(),
        kind: desired.spec.names.kind.clone(),
        plural: export.resource.clone(),
    };
    let provider_resource = kube::api::ApiResource {
        api_version: format!("{}/{}", provider_resource.group, provider_resource.version),
        ..provider_resource
    };
    let provider_objects = kbind_shared::dynamic::scoped(
        &provider.provider.client,
        binding.namespace.as_deref(),
        &provider_resource,
    );
    let mut copies: BTreeMap<(Option<String>, String), BTreeMap<String, String>> = BTreeMap::new();
    view::for_each_object(&provider_objects, "provider objects", |object| {
        copies.insert(
            (object.metadata.namespace.clone(), object.name_any()),
            object.annotations().clone(),
        );
    })
    .await?;
    for (namespace, name, uid) in starting {
        let label = match &namespace {
            Some(ns) => format!("{ns}/{name}"),
            None => name.clone(),
        };
        let copy = copies.get(&(namespace, name));
        match object_fate(
            copy,
            scope.consumer_cluster,
            &uid,
            // What the syncer will do: a Binding adopts only where the Connection allows it.
            state
                .spec
                .access
                .conflict_policy(binding.namespace.is_some(), binding.spec.conflict_policy),
        ) {
            Fate::Conflict(reason) => {
                plan.conflict_count += 1;
                if plan.conflicts.len() < MAX_NAMES {
                    plan.conflicts.push(ObjectConflict {
                        object: label.clone(),
                        reason: reason.into(),
                    });
                }
            }
            Fate::Adopt if plan.adopted.len() < MAX_NAMES => plan.adopted.push(label.clone()),
            _ => {}
        }
        if plan.start_syncing_names.len() < MAX_NAMES {
            plan.start_syncing_names.push(label);
        }
    }
    Ok(())
}

/// The routes an API's objects would choose among once `planned` is applied: every binding on
/// the cluster as the syncer admits it (its status), with `planned` in place of its namesake,
/// admitted as the route the plan says it becomes.
fn route_offers(
    scope: &Scope<'_>,
    planned: &PlannedBinding,
    api: &str,
) -> Vec<kbind_shared::routing::Offer> {
    let label_of = |namespace: Option<String>, name: String| match namespace {
        Some(ns) => format!("Binding/{ns}/{name}"),
        None => format!("ClusterBinding/{name}"),
    };
    let mut offers = kbind_shared::resolve::offers(
        api,
        scope
            .cluster_bindings
            .iter()
            .filter(|b| label_of(None, b.name_any()) != planned.label),
        scope
            .bindings
            .iter()
            .filter(|b| label_of(b.namespace(), b.name_any()) != planned.label),
        |_| Some((String::new(), Default::default())),
    );
    offers.push(kbind_shared::routing::Offer {
        binding: planned.label.clone(),
        namespace: planned.namespace.clone(),
        apis: [api.to_owned()].into(),
        route: kbind_shared::routing::Route {
            connection: planned.spec.connection_ref.name.clone(),
            cluster: String::new(),
        },
        selector: planned
            .spec
            .object_selector
            .clone()
            .and_then(|s| kube::core::Selector::try_from(s).ok()),
        schema: kbind_shared::routing::Schema::Agrees,
        admitted: true,
    });
    offers
}

/// What a new route would do with one existing object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteFate {
    /// Its labels choose another route, or none.
    Elsewhere,
    /// It is on a route already (pinned, or holding a copy): it stays there.
    Stays,
    /// It would start syncing on this route.
    Starts,
    /// Its labels would choose several routes: held (AmbiguousRoute).
    Ambiguous,
}

/// [`RouteFate`] of `object` for the route of `connection`, the syncer's own decision
/// ([`kbind_shared::routing::choose`]) over `offers`.
pub fn route_fate(
    offers: &[kbind_shared::routing::Offer],
    api: &str,
    connection: &str,
    object: &kube::api::DynamicObject,
) -> RouteFate {
    use kbind_shared::routing::{self, Choice};
    let candidates = routing::candidates(offers, api, object.metadata.namespace.as_deref());
    match routing::choose(&candidates, object.labels()) {
        Choice::Route(route) if route.connection == connection => {
            if routing::placed(object.annotations(), object.finalizers()) {
                RouteFate::Stays
            } else {
                RouteFate::Starts
            }
        }
        Choice::Ambiguous(routes)
            if routes.iter().any(|r| r.connection == connection)
                && !routing::placed(object.annotations(), object.finalizers()) =>
        {
            RouteFate::Ambiguous
        }
        _ => RouteFate::Elsewhere,
    }
}

/// The plan as text.
pub fn render(report: &Report) -> String {
    let mut out = String::from("CONNECTIONS\n");
    let rows: Vec<Vec<String>> = report
        .connections
        .iter()
        .map(|c| {
            let identity = match &c.identity {
                None => "-".to_owned(),
                Some(Pin::Matches) => "matches pin".into(),
                Some(Pin::Unpinned) => "would pin".into(),
                Some(Pin::Mismatch { .. }) => "MISMATCH".into(),
            };
            vec![
                cell(&c.name),
                cell(&c.action),
                cell(c.provider_cluster_uid.as_deref().unwrap_or_default()),
                identity,
                c.exported_apis.len().to_string(),
                cell(c.error.as_deref().unwrap_or_default()),
            ]
        })
        .collect();
    out += &view::table(
        &[
            "NAME", "ACTION", "PROVIDER", "IDENTITY", "EXPORTED", "ERROR",
        ],
        &rows,
    );
    out += "\nAPIS\n";
    let rows: Vec<Vec<String>> = report
        .apis
        .iter()
        .map(|a| {
            let action = serde_json::to_value(a.crd.action)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            let breaking = match (a.crd.breaking.len(), a.crd.accepted) {
                (0, _) => "-".to_owned(),
                (n, true) => format!("{n} (accepted)"),
                (n, false) => n.to_string(),
            };
            vec![
                cell(&a.binding),
                cell(&a.api),
                cell(&a.connection),
                action,
                breaking,
                a.start_syncing.to_string(),
                a.already_syncing.to_string(),
                a.conflict_count.to_string(),
            ]
        })
        .collect();
    out += &view::table(
        &[
            "BINDING",
            "API",
            "CONNECTION",
            "CRD",
            "BREAKING",
            "START-SYNCING",
            "ALREADY-SYNCING",
            "CONFLICTS",
        ],
        &rows,
    );
    let mut details = String::new();
    for a in &report.apis {
        let head = format!(
            "{} {}",
            view::line(&a.binding, 120),
            view::line(&a.api, 120)
        );
        if let Some(error) = &a.error {
            details += &format!("{head}: error: {}\n", view::line(error, 300));
        }
        if !a.crd.message.is_empty() {
            details += &format!("{head}: {}\n", view::line(&a.crd.message, 300));
        }
        for change in &a.crd.breaking {
            details += &format!("{head}: breaking: {}\n", view::line(change, 200));
        }
        for c in &a.conflicts {
            details += &format!(
                "{head}: conflict {}: {}\n",
                view::line(&c.object, 200),
                c.reason
            );
        }
        for name in &a.adopted {
            details += &format!(
                "{head}: would adopt the unmarked provider object {}\n",
                view::line(name, 200)
            );
        }
        if !a.start_syncing_names.is_empty() {
            let more = a
                .start_syncing
                .saturating_sub(a.start_syncing_names.len() as u64);
            let names: Vec<String> = a
                .start_syncing_names
                .iter()
                .map(|n| view::line(n, 100))
                .collect();
            details += &format!(
                "{head}: would start syncing {}{}\n",
                names.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            );
        }
    }
    if !details.is_empty() {
        out += "\n";
        out += &details;
    }
    out += "\nNothing was changed on either cluster.\n";
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kbind_shared::api::{AcceptedChange, ConflictPolicy, KubeconfigSecretRef, SchemaPolicy};
    use kbind_shared::keys;
    use serde_json::json;

    fn spec(
        pull: PullPolicy,
        update: UpdatePolicy,
        accepted: Vec<AcceptedChange>,
    ) -> ConnectionSpec {
        ConnectionSpec {
            kubeconfig_secret_ref: KubeconfigSecretRef {
                namespace: "kbind".into(),
                name: "p".into(),
                key: String::new(),
            },
            schema: SchemaPolicy {
                pull_policy: pull,
                update_policy: update,
                accepted_changes: accepted,
                ..Default::default()
            },
            auto_bind: false,
            access: Default::default(),
            boundary: None,
        }
    }

    fn provider_crd(size_type: &str) -> CustomResourceDefinition {
        serde_json::from_value(json!({
            "metadata": { "name": "widgets.example.org" },
            "spec": {
                "group": "example.org",
                "names": { "plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList" },
                "scope": "Namespaced",
                "versions": [{
                    "name": "v1", "served": true, "storage": true,
                    "schema": { "openAPIV3Schema": { "type": "object", "properties": {
                        "spec": { "type": "object", "properties": { "size": { "type": size_type } } },
                    } } },
                }],
            },
        }))
        .unwrap()
    }

    fn desired(size_type: &str) -> CustomResourceDefinition {
        schema::desired_crd(&provider_crd(size_type), "c")
            .unwrap()
            .0
    }

    #[test]
    fn crd_plans_follow_the_schema_managers_decisions() {
        let always = spec(PullPolicy::Bound, UpdatePolicy::Always, Vec::new());
        let installed = desired("string");
        let mut foreign = provider_crd("string");
        foreign.metadata.annotations = None;
        let hash = |crd: &CustomResourceDefinition| {
            crd.annotations()
                .get(keys::SCHEMA_HASH_ANNOTATION)
                .cloned()
                .unwrap()
        };
        let accepting = spec(
            PullPolicy::Bound,
            UpdatePolicy::Always,
            vec![AcceptedChange {
                api: "widgets.example.org".into(),
                schema_hash: hash(&desired("integer")),
            }],
        );
        let none = spec(PullPolicy::None, UpdatePolicy::Always, Vec::new());
        for (name, existing, wanted, spec, action, breaking, accepted) in [
            (
                "absent",
                None,
                desired("string"),
                &always,
                Action::Create,
                0,
                false,
            ),
            (
                "absent, pull None",
                None,
                desired("string"),
                &none,
                Action::LeaveAbsent,
                0,
                false,
            ),
            (
                "same",
                Some(&installed),
                desired("string"),
                &always,
                Action::Keep,
                0,
                false,
            ),
            (
                "breaking",
                Some(&installed),
                desired("integer"),
                &always,
                Action::Hold,
                1,
                false,
            ),
            (
                "accepted",
                Some(&installed),
                desired("integer"),
                &accepting,
                Action::Update,
                1,
                true,
            ),
            (
                "not ours",
                Some(&foreign),
                desired("string"),
                &always,
                Action::Refuse,
                0,
                false,
            ),
        ] {
            let plan = crd_plan(existing, &wanted, "c", spec, false);
            assert_eq!(
                (plan.action, plan.breaking.len(), plan.accepted),
                (action, breaking, accepted),
                "{name}: {plan:?}"
            );
        }
        // A compatible change (a new optional field) is an update with nothing breaking.
        let mut wider = provider_crd("string");
        wider.spec.versions[0]
            .schema
            .as_mut()
            .unwrap()
            .open_api_v3_schema
            .as_mut()
            .unwrap()
            .properties
            .as_mut()
            .unwrap()
            .insert(
                "extra".into(),
                serde_json::from_value(json!({"type": "string"})).unwrap(),
            );
        let wider = schema::desired_crd(&wider, "c").unwrap().0;
        let plan = crd_plan(Some(&installed), &wider, "c", &always, false);
        assert_eq!((plan.action, plan.breaking.len()), (Action::Update, 0));
    }

    #[test]
    fn object_fates_follow_ownership() {
        let marked = |cluster: &str, object: &str| {
            BTreeMap::from([
                (
                    keys::CONSUMER_CLUSTER_UID_ANNOTATION.to_owned(),
                    cluster.to_owned(),
                ),
                (
                    keys::CONSUMER_OBJECT_UID_ANNOTATION.to_owned(),
                    object.to_owned(),
                ),
            ])
        };
        let unmarked = BTreeMap::new();
        let ours = marked("me", "o1");
        let another = marked("other", "o1");
        for (copy, policy, want) in [
            (None, ConflictPolicy::Fail, Fate::Create),
            (Some(&ours), ConflictPolicy::Fail, Fate::Resume),
            (
                Some(&unmarked),
                ConflictPolicy::Fail,
                Fate::Conflict(keys::CONFLICT_FOREIGN),
            ),
            (Some(&unmarked), ConflictPolicy::Adopt, Fate::Adopt),
            (
                Some(&another),
                ConflictPolicy::Adopt,
                Fate::Conflict(keys::CONFLICT_OWNED_BY_ANOTHER),
            ),
        ] {
            assert_eq!(
                object_fate(copy, "me", "o1", policy),
                want,
                "{copy:?} {policy:?}"
            );
        }
    }

    #[test]
    fn a_namespaced_binding_never_binds_a_cluster_scoped_api() {
        let export = |scope: ApiScope| -> ExportedApi {
            serde_json::from_value(json!({
                "name": "x.example.org", "group": "example.org", "resource": "x",
                "scope": scope, "versions": ["v1"],
            }))
            .unwrap()
        };
        assert!(scope_allows(false, &export(ApiScope::Cluster)));
        assert!(scope_allows(true, &export(ApiScope::Namespaced)));
        assert!(!scope_allows(true, &export(ApiScope::Cluster)));
    }

    #[test]
    fn plan_files_hold_only_kbinds_kinds() {
        let file = r#"
apiVersion: core.kbind.io/v1alpha1
kind: Connection
metadata: { name: c }
spec:
  kubeconfigSecretRef: { namespace: kbind, name: p }
---
apiVersion: core.kbind.io/v1alpha1
kind: ClusterBinding
metadata: { name: b }
spec: { connectionRef: { name: c }, apis: [ { name: widgets.example.org } ] }
---
apiVersion: core.kbind.io/v1alpha1
kind: Binding
metadata: { name: b, namespace: team }
spec: { connectionRef: { name: c }, apis: [ { name: widgets.example.org } ] }
---
"#;
        let parsed = parse(file).unwrap();
        assert_eq!(
            (
                parsed.connections.len(),
                parsed.cluster_bindings.len(),
                parsed.bindings.len()
            ),
            (1, 1, 1)
        );
        for (bad, says) in [
            (
                "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n",
                "a plan reads only",
            ),
            (
                "apiVersion: core.kbind.io/v1alpha1\nkind: Widget\n",
                "a plan reads only",
            ),
            (
                "apiVersion: core.kbind.io/v1alpha1\nkind: ClusterBinding\nmetadata: {name: b}\nspec: {apis: 3}\n",
                "document 1 (ClusterBinding)",
            ),
            ("key: [unclosed\n", "document 1"),
        ] {
            let error = parse(bad).unwrap_err();
            assert!(error.contains(says), "{bad:?}: {error}");
        }
        assert!(
            parse(&"#".repeat(MAX_FILE + 1))
                .unwrap_err()
                .contains("at most")
        );
    }

    #[test]
    fn a_new_route_takes_only_the_unplaced_objects_its_labels_choose() {
        use kbind_shared::routing::{Offer, Route, Schema};
        let offer = |binding: &str, connection: &str, selector: Option<(&str, &str)>| Offer {
            binding: binding.into(),
            namespace: None,
            apis: ["w.x".to_owned()].into(),
            route: Route {
                connection: connection.into(),
                cluster: String::new(),
            },
            selector: selector
                .map(|(k, v)| kube::core::Selector::from_iter([(k.to_owned(), v.to_owned())])),
            schema: Schema::Agrees,
            admitted: true,
        };
        let offers = vec![
            offer("all", "p", None),
            offer("us", "q", Some(("region", "us"))),
            offer("gold", "p", Some(("tier", "gold"))),
        ];
        let object = |labels: serde_json::Value,
                      annotations: serde_json::Value,
                      finalizers: serde_json::Value| {
            serde_json::from_value::<kube::api::DynamicObject>(json!({
                "apiVersion": "x/v1", "kind": "W",
                "metadata": { "name": "o", "namespace": "a", "labels": labels, "annotations": annotations, "finalizers": finalizers },
            }))
            .unwrap()
        };
        for (name, o, want) in [
            (
                "selected, new",
                object(json!({"region": "us"}), json!({}), json!([])),
                RouteFate::Starts,
            ),
            (
                "not selected",
                object(json!({}), json!({}), json!([])),
                RouteFate::Elsewhere,
            ),
            (
                "selected, synced before",
                object(
                    json!({"region": "us"}),
                    json!({}),
                    json!([keys::SYNCER_FINALIZER]),
                ),
                RouteFate::Stays,
            ),
            (
                "selected, pinned",
                object(
                    json!({"region": "us"}),
                    json!({ keys::ROUTE_ANNOTATION: "p" }),
                    json!([]),
                ),
                RouteFate::Stays,
            ),
            (
                "two selectors",
                object(
                    json!({"region": "us", "tier": "gold"}),
                    json!({}),
                    json!([]),
                ),
                RouteFate::Ambiguous,
            ),
        ] {
            assert_eq!(route_fate(&offers, "w.x", "q", &o), want, "{name}");
        }
    }
}
