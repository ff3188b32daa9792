//! `kubectl kbind doctor <connection>`: asks the provider, with the Connection's own credential,
//! whether it may do each thing kbind does (a SelfSubjectAccessReview per verb and resource), and
//! prints what is missing as RBAC ready to apply on the provider. The credential's cluster is
//! checked against the Connection's pinned identity before anything is sent to it.

use std::collections::BTreeMap;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kbind_schema_manager::connection::heartbeat;
use kbind_shared::api::{
    ActiveSchemaSource, Binding, BindingSpec, ClusterBinding, Connection, RelatedDirection,
    RelatedResourceKind, SchemaSource,
};
use kbind_shared::kubeconfig::Transport;
use kbind_shared::resolve::EventsScope;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde::Serialize;
use serde_json::{Value, json};

use crate::view::{self, Pin, cell};

const READ_WRITE: &[&str] = &[
    "get", "list", "watch", "create", "update", "patch", "delete",
];

/// One thing kbind needs on the provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Need {
    /// Why kbind needs it.
    pub why: String,
    /// API group (`""` for the core group); empty with `path` for a non-resource URL.
    pub group: String,
    pub resource: String,
    /// A non-resource URL (`/openapi/v3`), instead of a resource.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// The namespace it is needed in; `None`: cluster-wide.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The one object it is needed on (RBAC `resourceNames`); `None`: any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub verbs: Vec<String>,
}

fn need(why: &str, group: &str, resource: &str, namespace: Option<&str>, verbs: &[&str]) -> Need {
    Need {
        why: why.into(),
        group: group.into(),
        resource: resource.into(),
        path: String::new(),
        namespace: namespace.map(str::to_owned),
        name: None,
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
    }
}

/// One related-resources entry's use of the provider: the kind, which way, and where (`None`:
/// every namespace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelatedUse {
    pub kind: RelatedResourceKind,
    pub direction: RelatedDirection,
    pub namespace: Option<String>,
}

/// Everything kbind does on a provider for a Connection, and no more (#33.7): read its identity,
/// discover its exports (the export marks on CRDs, and OpenAPI documents for that source), keep
/// the heartbeat Lease `lease` (namespace, name) — only that one, by name, so that no consumer may
/// write another's heartbeat in a namespace they share — create namespaces for the objects it copies, write
/// the APIs the Connection's bindings list (`apis`: group and resource — taken from the bindings,
/// so a failed discovery leaves nothing out), and read or write related Secrets/ConfigMaps where
/// the bindings' entries use them (read where the provider is the source, write where it is the
/// target; in a Binding's namespace, a ClusterBinding entry's listed namespaces, or everywhere),
/// and — where bindings ask for them (`provider_events`) — watch the provider's Events.
pub fn needs(
    source: SchemaSource,
    active: Option<ActiveSchemaSource>,
    lease: (&str, &str),
    apis: &[(String, String)],
    related: &[RelatedUse],
    provider_events: &EventsScope,
) -> Vec<Need> {
    let mut out = vec![
        // By name: the identity is the one namespace's UID (or kcp's one LogicalCluster's).
        Need {
            name: Some("kube-system".into()),
            ..need(
                "read the provider's cluster identity",
                "",
                "namespaces",
                None,
                &["get"],
            )
        },
        // Asked first, and RBAC answers before the API server knows whether kcp is there: a
        // plain Kubernetes provider needs it too.
        Need {
            name: Some("cluster".into()),
            ..need(
                "read the provider's cluster identity (kcp's LogicalCluster, tried first)",
                "core.kcp.io",
                "logicalclusters",
                None,
                &["get"],
            )
        },
        need(
            "create a provider namespace before the first object in it",
            "",
            "namespaces",
            None,
            &["create"],
        ),
        // RBAC cannot limit a create by name; the reaper never trusts a Lease by where it is,
        // only by its name and holder, so creating others' names gains nothing.
        need(
            "create the heartbeat Lease",
            "coordination.k8s.io",
            "leases",
            Some(lease.0),
            &["create"],
        ),
        Need {
            name: Some(lease.1.to_owned()),
            ..need(
                "renew the heartbeat Lease (its own only)",
                "coordination.k8s.io",
                "leases",
                Some(lease.0),
                &["get", "update", "patch"],
            )
        },
    ];
    let openapi = source == SchemaSource::OpenApi || active == Some(ActiveSchemaSource::OpenApi);
    // Every source reads the export marks on CRDs (the OpenAPI source exports only marked APIs).
    let mut apis = apis.to_vec();
    apis.sort();
    apis.dedup();
    out.push(need(
        "discover exported APIs",
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        None,
        &["list", "watch"],
    ));
    // Pulled by name: the bound APIs' CRDs.
    for (group, resource) in &apis {
        out.push(Need {
            name: Some(format!("{resource}.{group}")),
            ..need(
                "pull a bound API's CRD",
                "apiextensions.k8s.io",
                "customresourcedefinitions",
                None,
                &["get"],
            )
        });
    }
    if openapi {
        out.push(need(
            "find the aggregated APIs marked exported",
            "apiregistration.k8s.io",
            "apiservices",
            None,
            &["list"],
        ));
        for path in ["/openapi/v3", "/openapi/v3/*"] {
            out.push(Need {
                why: "read the provider's OpenAPI documents".into(),
                group: String::new(),
                resource: String::new(),
                path: path.into(),
                namespace: None,
                name: None,
                verbs: vec!["get".into()],
            });
        }
    }
    for (group, resource) in &apis {
        let name = if group.is_empty() {
            resource.clone()
        } else {
            format!("{resource}.{group}")
        };
        out.push(need(
            &format!("sync {name}"),
            group,
            resource,
            None,
            READ_WRITE,
        ));
    }
    // Related resources: the verbs each (kind, namespace) needs, merged; a namespace is left out
    // where every namespace is needed anyway.
    const SOURCE: &[&str] = &["get", "list", "watch"];
    const TARGET: &[&str] = &["get", "list", "watch", "create", "patch", "delete"];
    let mut by_place: BTreeMap<(&'static str, Option<String>), Vec<&'static str>> = BTreeMap::new();
    for entry in related {
        let resource = match entry.kind {
            RelatedResourceKind::Secrets => "secrets",
            RelatedResourceKind::Configmaps => "configmaps",
        };
        let verbs = match entry.direction {
            RelatedDirection::FromProvider => SOURCE,
            RelatedDirection::FromConsumer => TARGET,
        };
        let place = by_place
            .entry((resource, entry.namespace.clone()))
            .or_default();
        for verb in verbs {
            if !place.contains(verb) {
                place.push(verb);
            }
        }
    }
    let everywhere: BTreeMap<&str, Vec<&str>> = by_place
        .iter()
        .filter(|((_, namespace), _)| namespace.is_none())
        .map(|((resource, _), verbs)| (*resource, verbs.clone()))
        .collect();
    for ((resource, namespace), verbs) in by_place {
        let covered = namespace.is_some()
            && everywhere
                .get(resource)
                .is_some_and(|all| verbs.iter().all(|v| all.contains(v)));
        if covered {
            continue;
        }
        let verbs: Vec<&str> = TARGET
            .iter()
            .copied()
            .filter(|v| verbs.contains(v))
            .collect();
        out.push(need(
            &format!("copy related {resource}"),
            "",
            resource,
            namespace.as_deref(),
            &verbs,
        ));
    }
    let why = "copy provider Events onto consumer objects (spec.providerEvents)";
    match provider_events {
        EventsScope::Nowhere => {}
        EventsScope::Everywhere => out.push(need(why, "", "events", None, &["list", "watch"])),
        EventsScope::Namespaces(namespaces) => {
            for namespace in namespaces {
                out.push(need(why, "", "events", Some(namespace), &["list", "watch"]));
            }
        }
    }
    out
}

/// Where the Connection `connection`'s bindings ask for provider Events, over all the APIs they
/// list: everywhere when any ClusterBinding does, else the asking Bindings' namespaces.
fn events_scope(
    cluster_bindings: &[ClusterBinding],
    bindings: &[Binding],
    connection: &str,
) -> EventsScope {
    let apis: std::collections::BTreeSet<&str> = cluster_bindings
        .iter()
        .map(|b| &b.spec.binding)
        .chain(bindings.iter().map(|b| &b.spec))
        .flat_map(|spec| spec.apis.iter().map(|a| a.name.as_str()))
        .collect();
    let mut namespaces = std::collections::BTreeSet::new();
    for api in apis {
        match kbind_shared::resolve::provider_events_scope(
            connection,
            api,
            cluster_bindings,
            bindings,
        ) {
            EventsScope::Everywhere => return EventsScope::Everywhere,
            EventsScope::Namespaces(some) => namespaces.extend(some),
            EventsScope::Nowhere => {}
        }
    }
    if namespaces.is_empty() {
        EventsScope::Nowhere
    } else {
        EventsScope::Namespaces(namespaces)
    }
}

/// The APIs the Connection's bindings list, as (group, resource).
fn bound_apis<'a>(
    specs: impl Iterator<Item = &'a BindingSpec>,
    connection: &str,
) -> Vec<(String, String)> {
    specs
        .filter(|s| s.connection_ref.name == connection)
        .flat_map(|s| s.apis.iter())
        .filter_map(|a| {
            let (resource, group) = a.name.split_once('.')?;
            Some((group.to_owned(), resource.to_owned()))
        })
        .collect()
}

/// Where the Connection `connection`'s bindings make kbind read each bound API (group,
/// resource) (#54): everywhere (`None`) when a ClusterBinding lists it, else the namespaces of the
/// Bindings that do — as the syncer reads them.
fn api_scopes(
    cluster_bindings: &[ClusterBinding],
    bindings: &[Binding],
    connection: &str,
) -> BTreeMap<(String, String), Option<std::collections::BTreeSet<String>>> {
    let mut scopes: BTreeMap<(String, String), Option<std::collections::BTreeSet<String>>> =
        BTreeMap::new();
    let of = |spec: &BindingSpec| -> Vec<(String, String)> {
        bound_apis(std::iter::once(spec), connection)
    };
    for binding in cluster_bindings {
        for api in of(&binding.spec.binding) {
            scopes.insert(api, None);
        }
    }
    for binding in bindings {
        let Some(namespace) = binding.metadata.namespace.clone() else {
            continue;
        };
        for api in of(&binding.spec) {
            if let Some(namespaces) = scopes
                .entry(api)
                .or_insert_with(|| Some(Default::default()))
            {
                namespaces.insert(namespace.clone());
            }
        }
    }
    scopes
}

/// `needs` with each bound API's asked only where its bindings make kbind read it
/// ([`api_scopes`]): one need per namespace instead of one cluster-wide, for an API only
/// Bindings list (#54: the least the credential needs).
pub fn where_bound(
    needs: Vec<Need>,
    scopes: &BTreeMap<(String, String), Option<std::collections::BTreeSet<String>>>,
) -> Vec<Need> {
    let mut out = Vec::new();
    for need in needs {
        let key = (need.group.clone(), need.resource.clone());
        match scopes.get(&key) {
            Some(Some(namespaces)) if need.namespace.is_none() && need.path.is_empty() => {
                for namespace in namespaces {
                    out.push(Need {
                        why: format!("{} (namespace {namespace})", need.why),
                        namespace: Some(namespace.clone()),
                        ..need.clone()
                    });
                }
            }
            _ => out.push(need),
        }
    }
    out
}

/// The needs of a Connection with a boundary (#51): its credential works in the boundary's
/// namespaces only, so each need of a namespace's objects (the APIs, related copies, Events) is
/// asked in the provider namespace of each consumer namespace in `namespaces` (those holding bound
/// objects) — the issuer grants a boundary namespace once kbind creates it. The rest (identity,
/// discovery, namespaces, the heartbeat Lease in the boundary itself) stays as it is.
pub fn in_boundary(
    needs: Vec<Need>,
    map: &kbind_shared::boundary::NamespaceMap,
    namespaces: &std::collections::BTreeSet<String>,
) -> Vec<Need> {
    if map.boundary().is_none() {
        return needs;
    }
    const CLUSTER_WORK: [&str; 5] = [
        "namespaces",
        "logicalclusters",
        "leases",
        "customresourcedefinitions",
        "apiservices",
    ];
    let mut out = Vec::new();
    for need in needs {
        if !need.path.is_empty() || CLUSTER_WORK.contains(&need.resource.as_str()) {
            out.push(need);
            continue;
        }
        let places: Vec<&String> = match &need.namespace {
            Some(namespace) => vec![namespace],
            None => namespaces.iter().collect(),
        };
        for place in places {
            if let Ok(mapped) = map.provider(place) {
                out.push(Need {
                    why: format!("{} (namespace {place})", need.why),
                    namespace: Some(mapped),
                    ..need.clone()
                });
            }
        }
    }
    out
}

/// The consumer namespaces holding objects of the `apis` (group, resource) — where a boundary's
/// copies are.
async fn occupied(
    consumer: &Client,
    apis: &[(String, String)],
) -> std::collections::BTreeSet<String> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let mut out = std::collections::BTreeSet::new();
    for (group, resource) in apis {
        let crd = Api::<CustomResourceDefinition>::all(consumer.clone())
            .get_opt(&format!("{resource}.{group}"))
            .await;
        let Some(resource) = crd
            .ok()
            .flatten()
            .and_then(|c| kbind_shared::dynamic::instance_resource(&c))
        else {
            continue;
        };
        let objects = Api::<kube::core::PartialObjectMeta<kube::api::DynamicObject>>::all_with(
            consumer.clone(),
            &resource,
        );
        if let Ok(list) = objects.list_metadata(&ListParams::default()).await {
            out.extend(list.items.into_iter().filter_map(|o| o.metadata.namespace));
        }
    }
    out
}

/// One verb of one [`Need`], as the provider answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    pub need: Need,
    pub allowed: Vec<String>,
    pub missing: Vec<String>,
}

/// The RBAC that grants what `checks` found missing to `user` (a ServiceAccount when the name
/// says so): a ClusterRole and ClusterRoleBinding for cluster-wide needs, a Role and RoleBinding
/// per namespace for namespaced ones. `None` when nothing is missing.
pub fn missing_rbac(connection: &str, user: &str, checks: &[Check]) -> Option<String> {
    let name = format!("kbind-provider-{connection}");
    let subject = match user
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
    {
        Some((namespace, account)) => {
            json!({ "kind": "ServiceAccount", "name": account, "namespace": namespace })
        }
        None => json!({ "kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": user }),
    };
    let mut by_scope: BTreeMap<Option<String>, Vec<Value>> = BTreeMap::new();
    for check in checks.iter().filter(|c| !c.missing.is_empty()) {
        let need = &check.need;
        let rule = if let Some(name) = &need.name {
            json!({ "apiGroups": [need.group], "resources": [need.resource], "resourceNames": [name], "verbs": check.missing })
        } else if need.path.is_empty() {
            json!({ "apiGroups": [need.group], "resources": [need.resource], "verbs": check.missing })
        } else {
            json!({ "nonResourceURLs": [need.path], "verbs": check.missing })
        };
        by_scope
            .entry(need.namespace.clone())
            .or_default()
            .push(rule);
    }
    if by_scope.is_empty() {
        return None;
    }
    let mut documents = Vec::new();
    for (namespace, rules) in by_scope {
        let (role, binding, metadata) = match &namespace {
            None => ("ClusterRole", "ClusterRoleBinding", json!({ "name": name })),
            Some(ns) => (
                "Role",
                "RoleBinding",
                json!({ "name": name, "namespace": ns }),
            ),
        };
        // A Role needs its namespace (the heartbeat's, say, before kbind could create it): the
        // snippet brings it, and applying it where it exists changes nothing.
        if let Some(ns) = &namespace {
            documents.push(json!({
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": { "name": ns },
            }));
        }
        documents.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": role,
            "metadata": metadata,
            "rules": rules,
        }));
        documents.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": binding,
            "metadata": metadata,
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": role, "name": name },
            "subjects": [subject],
        }));
    }
    // The user name is the provider's word: in a YAML comment it must stay one line, or it could
    // smuggle documents into what the operator applies (#32.10).
    let mut text = format!(
        "# What Connection {}'s provider credential ({}) is missing; apply on the provider.\n",
        comment_safe(connection),
        comment_safe(user)
    );
    for document in documents {
        text.push_str("---\n");
        text.push_str(&serde_yaml::to_string(&document).unwrap_or_default());
    }
    Some(text)
}

/// `text` as one line of a YAML comment: control characters and the Unicode line and paragraph
/// separators (line breaks to YAML 1.1) become spaces, at most 300 characters.
fn comment_safe(text: &str) -> String {
    view::line(text, 300).replace(['\u{2028}', '\u{2029}'], " ")
}

/// The doctor's findings.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub connection: String,
    pub provider_cluster_uid: String,
    pub identity: Pin,
    /// Who the provider says the credential is.
    pub user: String,
    pub checks: Vec<Check>,
    /// Things worth knowing that are not permissions.
    pub notes: Vec<String>,
    /// RBAC granting what is missing, ready to apply on the provider.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing_rbac: Option<String>,
    /// What the core CRDs installed on the consumer lack of kbind's (#53.6): nothing syncs
    /// until kbind's are installed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub core_crds: Option<String>,
}

impl Report {
    /// Nothing missing: no permission, and no field of kbind's core CRDs.
    pub fn healthy(&self) -> bool {
        self.checks.iter().all(|c| c.missing.is_empty()) && self.core_crds.is_none()
    }
}

/// What the core CRDs installed on the consumer lack of kbind's, as one message (`None`: they
/// keep every field kbind writes). Read with the user's credential: one it may not read is not
/// judged.
async fn core_crds(consumer: &Client) -> Option<String> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kbind_shared::api::installed;
    let api: Api<CustomResourceDefinition> = Api::all(consumer.clone());
    let mut lacks = Vec::new();
    for (_, expected) in kbind_shared::api::crds() {
        let name = expected.metadata.name.clone().unwrap_or_default();
        let Ok(installed) = api.get_opt(&name).await else {
            continue;
        };
        if let Some(lack) = installed::lack(&expected, installed.as_ref()) {
            lacks.push((name, lack));
        }
    }
    installed::describe(&lacks)
}

/// Where each related-resources entry of the Connection's bindings uses the provider:
/// `(namespace of the Binding, or None for a ClusterBinding, spec)`.
fn related_uses<'a>(
    specs: impl Iterator<Item = (Option<&'a str>, &'a BindingSpec)>,
    connection: &str,
) -> Vec<RelatedUse> {
    let mut out = Vec::new();
    for (namespace, spec) in specs.filter(|(_, s)| s.connection_ref.name == connection) {
        for entry in &spec.related_resources {
            let places: Vec<Option<String>> = match namespace {
                Some(ns) => vec![Some(ns.to_owned())],
                None if !entry.namespaces.is_empty() => {
                    entry.namespaces.iter().cloned().map(Some).collect()
                }
                None => vec![None],
            };
            for place in places {
                out.push(RelatedUse {
                    kind: entry.resource,
                    direction: entry.direction,
                    namespace: place,
                });
            }
        }
    }
    out
}

/// Reads the Connection and its credential, checks the provider's identity against the pin, then
/// asks the provider about each need.
pub async fn gather(consumer: &Client, name: &str, transport: Transport) -> Result<Report, String> {
    let connection: Connection = view::connection(consumer, name)
        .await?
        .ok_or_else(|| format!("Connection {name} not found"))?;
    let (provider, identified) =
        view::provider_maybe_unidentified(consumer, &connection.spec, transport).await?;
    let status = connection.status.clone().unwrap_or_default();
    let mut notes = Vec::new();
    // A pinned Connection is checked against its pin first, always; one not pinned yet may have a
    // credential that cannot even read the identity — that is one of the things it lacks.
    if let Err(message) = identified {
        if !status.remote_cluster_uid.is_empty() {
            return Err(message);
        }
        notes.push(format!(
            "{message}; the RBAC below grants it (the Connection pins the identity it then reads)"
        ));
    }
    let identity = view::pin(connection.status.as_ref(), &provider.identity);
    if let Pin::Mismatch { pinned } = &identity {
        return Err(format!(
            "the credential of Connection {name} reaches cluster {}, not the pinned {pinned}; kbind refuses it (ClusterIdentityChanged), and so does the doctor",
            provider.identity
        ));
    }
    if identity == Pin::Unpinned && !provider.identity.is_empty() {
        notes.push(format!(
            "the Connection has not pinned a provider identity yet; kbind would pin {}",
            provider.identity
        ));
    }
    let client = provider.provider.client.clone();
    let cluster_bindings = Api::<ClusterBinding>::all(consumer.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let bindings = Api::<Binding>::all(consumer.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    // What the bindings need, not what discovery shows: a credential that may not discover
    // still gets every rule in one run (#33.7).
    let apis = bound_apis(
        cluster_bindings
            .iter()
            .map(|b| &b.spec.binding)
            .chain(bindings.iter().map(|b| &b.spec)),
        name,
    );
    let related = related_uses(
        cluster_bindings
            .iter()
            .map(|b| (None, &b.spec.binding))
            .chain(
                bindings
                    .iter()
                    .map(|b| (b.metadata.namespace.as_deref(), &b.spec)),
            ),
        name,
    );
    let provider_events = events_scope(&cluster_bindings, &bindings, name);
    let lease_namespace = heartbeat::lease_namespace(provider.provider.kubeconfig.namespace());
    // The heartbeat's name derives from this consumer's identity, which the Connection records
    // once it first reached the provider: read it here when it has not yet.
    let local_uid = if status.local_cluster_uid.is_empty() {
        kbind_shared::identity::cluster_identity(consumer)
            .await
            .map_err(|e| format!("cannot read this consumer cluster's identity: {e}"))?
    } else {
        status.local_cluster_uid.clone()
    };
    let lease_name = heartbeat::lease_name(name, &local_uid);
    let user = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .ok()
        .and_then(|r| r.status?.user_info?.username)
        .unwrap_or_else(|| "<the credential's user>".into());
    let mut checks = Vec::new();
    let map = connection.spec.namespaces();
    let places = match map.boundary() {
        Some(boundary) => {
            let places = occupied(consumer, &apis).await;
            notes.push(format!(
                "the Connection's copies live in its boundary {boundary}: each namespace's needs are asked where its copies are ({} namespace(s) hold bound objects); the issuer grants a boundary namespace when kbind creates it",
                places.len()
            ));
            places
        }
        None => Default::default(),
    };
    let wanted = needs(
        connection.spec.schema.source,
        status.active_schema_source,
        (lease_namespace, &lease_name),
        &apis,
        &related,
        &provider_events,
    );
    let scopes = api_scopes(&cluster_bindings, &bindings, name);
    for need in in_boundary(where_bound(wanted, &scopes), &map, &places) {
        let (mut allowed, mut missing) = (Vec::new(), Vec::new());
        for verb in &need.verbs {
            if may(&client, &need, verb).await? {
                allowed.push(verb.clone());
            } else {
                missing.push(verb.clone());
            }
        }
        checks.push(Check {
            need,
            allowed,
            missing,
        });
    }
    Ok(Report {
        connection: name.into(),
        provider_cluster_uid: provider.identity,
        missing_rbac: missing_rbac(name, &user, &checks),
        core_crds: core_crds(consumer).await,
        identity,
        user,
        checks,
        notes,
    })
}

/// One SelfSubjectAccessReview.
async fn may(client: &Client, need: &Need, verb: &str) -> Result<bool, String> {
    let spec = if need.path.is_empty() {
        SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(need.group.clone()),
                resource: Some(need.resource.clone()),
                namespace: need.namespace.clone(),
                name: need.name.clone(),
                verb: Some(verb.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    } else {
        SelfSubjectAccessReviewSpec {
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(need.path.clone()),
                verb: Some(verb.into()),
            }),
            ..Default::default()
        }
    };
    let review = SelfSubjectAccessReview {
        spec,
        ..Default::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(|e| {
            format!(
                "the provider did not answer an access review: {}",
                kbind_shared::identity::describe_error(&e)
            )
        })?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// The findings as text, the RBAC last.
pub fn render(report: &Report) -> String {
    let mut out = format!(
        "Connection {}: provider {} ({}), credential {}\n\n",
        cell(&report.connection),
        cell(&report.provider_cluster_uid),
        match report.identity {
            Pin::Matches => "matches the pinned identity",
            Pin::Unpinned => "not pinned yet",
            Pin::Mismatch { .. } => "NOT the pinned identity",
        },
        cell(&report.user)
    );
    let rows: Vec<Vec<String>> = report
        .checks
        .iter()
        .map(|c| {
            let what = if c.need.path.is_empty() {
                let group = if c.need.group.is_empty() {
                    "core"
                } else {
                    &c.need.group
                };
                format!("{}.{}", c.need.resource, group)
            } else {
                c.need.path.clone()
            };
            vec![
                if c.missing.is_empty() {
                    "ok".into()
                } else {
                    "MISSING".into()
                },
                cell(&what),
                cell(c.need.namespace.as_deref().unwrap_or_default()),
                cell(&c.missing.join(",")),
                cell(&c.need.why),
            ]
        })
        .collect();
    out += &view::table(
        &["", "RESOURCE", "NAMESPACE", "MISSING", "NEEDED TO"],
        &rows,
    );
    if let Some(lack) = &report.core_crds {
        out += &format!("PROBLEM: {}\n", view::line(lack, 600));
    }
    for note in &report.notes {
        out += &format!("note: {}\n", view::line(note, 300));
    }
    match &report.missing_rbac {
        None => out += "\nThe credential may do everything kbind needs.\n",
        Some(rbac) => {
            out += "\nThe credential lacks permissions kbind needs. Grant them on the provider, e.g. with this (kubectl apply -f -):\n\n";
            out += rbac;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn related(
        kind: RelatedResourceKind,
        direction: RelatedDirection,
        namespace: Option<&str>,
    ) -> RelatedUse {
        RelatedUse {
            kind,
            direction,
            namespace: namespace.map(str::to_owned),
        }
    }

    fn kinds(needs: &[Need]) -> Vec<String> {
        needs
            .iter()
            .map(|n| {
                if let Some(name) = &n.name {
                    format!(
                        "{}/{} {:?} {name} {}",
                        n.group,
                        n.resource,
                        n.namespace,
                        n.verbs.join(",")
                    )
                } else if n.path.is_empty() {
                    format!(
                        "{}/{} {:?} {}",
                        n.group,
                        n.resource,
                        n.namespace,
                        n.verbs.join(",")
                    )
                } else {
                    format!("{} {}", n.path, n.verbs.join(","))
                }
            })
            .collect()
    }

    #[test]
    fn an_api_only_bindings_list_is_asked_in_their_namespaces_and_a_cluster_binding_everywhere() {
        let widgets = ("example.org".to_owned(), "widgets".to_owned());
        let gadgets = ("example.org".to_owned(), "gadgets".to_owned());
        let binding = |namespace: &str, apis: &[&str]| {
            let mut b = Binding::new("b", BindingSpec::new("c", apis));
            b.metadata.namespace = Some(namespace.into());
            b
        };
        let cluster = ClusterBinding::new(
            "all",
            kbind_shared::api::ClusterBindingSpec::from(BindingSpec::new(
                "c",
                &["gadgets.example.org"],
            )),
        );
        let elsewhere = Binding::new("x", BindingSpec::new("other", &["widgets.example.org"]));
        let scopes = api_scopes(
            &[cluster],
            &[
                binding("team-a", &["widgets.example.org", "gadgets.example.org"]),
                binding("team-b", &["widgets.example.org"]),
                Binding {
                    metadata: kube::api::ObjectMeta {
                        namespace: Some("team-z".into()),
                        ..elsewhere.metadata
                    },
                    ..elsewhere
                },
            ],
            "c",
        );
        assert_eq!(
            scopes.get(&widgets),
            Some(&Some(["team-a".to_owned(), "team-b".to_owned()].into())),
            "another Connection's Binding adds nothing"
        );
        assert_eq!(
            scopes.get(&gadgets),
            Some(&None),
            "a ClusterBinding: everywhere"
        );
        let all = needs(
            SchemaSource::Crd,
            None,
            ("kbind", "c-0123456789"),
            &[widgets.clone(), gadgets.clone()],
            &[],
            &EventsScope::Nowhere,
        );
        let got: Vec<String> = kinds(&where_bound(all, &scopes))
            .into_iter()
            .filter(|k| k.starts_with("example.org/"))
            .collect();
        let rw = "get,list,watch,create,update,patch,delete";
        assert_eq!(
            got,
            [
                format!("example.org/gadgets None {rw}"),
                format!("example.org/widgets Some(\"team-a\") {rw}"),
                format!("example.org/widgets Some(\"team-b\") {rw}"),
            ]
        );
    }

    #[test]
    fn in_a_boundary_each_namespaces_needs_are_asked_where_its_copies_are() {
        let widgets = vec![("example.org".to_owned(), "widgets".to_owned())];
        let all = needs(
            SchemaSource::Crd,
            None,
            ("kbind-0123456789", "c-0123456789"),
            &widgets,
            &[
                related(
                    RelatedResourceKind::Secrets,
                    RelatedDirection::FromProvider,
                    None,
                ),
                related(
                    RelatedResourceKind::Configmaps,
                    RelatedDirection::FromConsumer,
                    Some("team-b"),
                ),
            ],
            &EventsScope::Nowhere,
        );
        // Without a boundary nothing changes.
        let none = kbind_shared::boundary::NamespaceMap::new(None);
        let places: std::collections::BTreeSet<String> =
            ["team-a".to_owned(), "team-b".to_owned()].into();
        assert_eq!(in_boundary(all.clone(), &none, &places), all);
        let map = kbind_shared::boundary::NamespaceMap::new(Some("kbind-0123456789"));
        let got = kinds(&in_boundary(all, &map, &places));
        let rw = "get,list,watch,create,update,patch,delete";
        assert_eq!(
            got,
            [
                "/namespaces None kube-system get".to_owned(),
                "core.kcp.io/logicalclusters None cluster get".to_owned(),
                "/namespaces None create".to_owned(),
                "coordination.k8s.io/leases Some(\"kbind-0123456789\") create".to_owned(),
                "coordination.k8s.io/leases Some(\"kbind-0123456789\") c-0123456789 get,update,patch"
                    .to_owned(),
                "apiextensions.k8s.io/customresourcedefinitions None list,watch".to_owned(),
                "apiextensions.k8s.io/customresourcedefinitions None widgets.example.org get"
                    .to_owned(),
                format!("example.org/widgets Some(\"kbind-0123456789-team-a\") {rw}"),
                format!("example.org/widgets Some(\"kbind-0123456789-team-b\") {rw}"),
                "/configmaps Some(\"kbind-0123456789-team-b\") get,list,watch,create,patch,delete"
                    .to_owned(),
                "/secrets Some(\"kbind-0123456789-team-a\") get,list,watch".to_owned(),
                "/secrets Some(\"kbind-0123456789-team-b\") get,list,watch".to_owned(),
            ]
        );
    }

    #[test]
    fn needs_follow_the_schema_source_the_bound_apis_and_related_resources() {
        // #33.7: exactly what the bindings use — their APIs, and related kinds only in the
        // direction and namespaces their entries name.
        let widgets = vec![("example.org".to_owned(), "widgets".to_owned())];
        let base = [
            "/namespaces None kube-system get",
            "core.kcp.io/logicalclusters None cluster get",
            "/namespaces None create",
            "coordination.k8s.io/leases Some(\"kbind\") create",
            "coordination.k8s.io/leases Some(\"kbind\") c-0123456789 get,update,patch",
        ];
        let crd = "apiextensions.k8s.io/customresourcedefinitions None list,watch";
        let widgets_crd =
            "apiextensions.k8s.io/customresourcedefinitions None widgets.example.org get";
        let apiservices = "apiregistration.k8s.io/apiservices None list";
        let rw = "get,list,watch,create,update,patch,delete";
        use RelatedDirection::{FromConsumer, FromProvider};
        use RelatedResourceKind::{Configmaps, Secrets};
        /// (source, active source, bound APIs, related uses) → the needs beyond the base.
        type Case = (
            SchemaSource,
            Option<ActiveSchemaSource>,
            Vec<(String, String)>,
            Vec<RelatedUse>,
            Vec<String>,
        );
        let cases: Vec<Case> = vec![
            (
                SchemaSource::Crd,
                None,
                vec![],
                vec![],
                vec![crd.to_owned()],
            ),
            (
                SchemaSource::Auto,
                Some(ActiveSchemaSource::Crd),
                [widgets.clone(), widgets.clone()].concat(),
                vec![],
                vec![
                    crd.to_owned(),
                    widgets_crd.to_owned(),
                    format!("example.org/widgets None {rw}"),
                ],
            ),
            (
                SchemaSource::OpenApi,
                None,
                vec![],
                vec![],
                vec![
                    crd.to_owned(),
                    apiservices.to_owned(),
                    "/openapi/v3 get".to_owned(),
                    "/openapi/v3/* get".to_owned(),
                ],
            ),
            (
                SchemaSource::Crd,
                None,
                vec![],
                vec![
                    // A Binding reading Secrets from the provider in team-a.
                    related(Secrets, FromProvider, Some("team-a")),
                    // A ClusterBinding sending ConfigMaps to the provider everywhere, and a
                    // Binding doing so in team-b (covered by the first).
                    related(Configmaps, FromConsumer, None),
                    related(Configmaps, FromConsumer, Some("team-b")),
                    // Secrets both ways in team-c.
                    related(Secrets, FromProvider, Some("team-c")),
                    related(Secrets, FromConsumer, Some("team-c")),
                ],
                vec![
                    crd.to_owned(),
                    "/configmaps None get,list,watch,create,patch,delete".to_owned(),
                    "/secrets Some(\"team-a\") get,list,watch".to_owned(),
                    "/secrets Some(\"team-c\") get,list,watch,create,patch,delete".to_owned(),
                ],
            ),
        ];
        for (source, active, apis, uses, extra) in cases {
            let got = kinds(&needs(
                source,
                active,
                ("kbind", "c-0123456789"),
                &apis,
                &uses,
                &EventsScope::Nowhere,
            ));
            let mut want: Vec<String> = base.iter().map(|s| (*s).to_owned()).collect();
            want.extend(extra);
            assert_eq!(got, want, "{source:?} {active:?}");
        }
        // Bindings asking for provider Events: list and watch them where they ask.
        let everywhere = &EventsScope::Everywhere;
        let got = kinds(&needs(
            SchemaSource::Crd,
            None,
            ("kbind", "c-0123456789"),
            &[],
            &[],
            everywhere,
        ));
        assert_eq!(
            got.last().map(String::as_str),
            Some("/events None list,watch")
        );
        assert_eq!(got.len(), base.len() + 2, "{got:?}");
        let two = EventsScope::Namespaces(["team-a".to_owned(), "team-b".to_owned()].into());
        let some = kinds(&needs(
            SchemaSource::Crd,
            None,
            ("kbind", "c-0123456789"),
            &[],
            &[],
            &two,
        ));
        assert_eq!(
            some[base.len() + 1..],
            [
                "/events Some(\"team-a\") list,watch".to_owned(),
                "/events Some(\"team-b\") list,watch".to_owned()
            ]
        );
    }

    fn check(need: Need, missing: &[&str]) -> Check {
        let allowed = need
            .verbs
            .iter()
            .filter(|v| !missing.contains(&v.as_str()))
            .cloned()
            .collect();
        Check {
            need,
            allowed,
            missing: missing.iter().map(|v| (*v).to_owned()).collect(),
        }
    }

    #[test]
    fn missing_permissions_become_rbac_for_the_credentials_subject() {
        let all = needs(
            SchemaSource::Crd,
            None,
            ("kbind", "c-0123456789"),
            &[("example.org".to_owned(), "widgets".to_owned())],
            &[],
            &EventsScope::Nowhere,
        );
        let nothing: Vec<Check> = all.iter().cloned().map(|n| check(n, &[])).collect();
        assert_eq!(missing_rbac("c", "alice", &nothing), None);

        let checks: Vec<Check> = all
            .iter()
            .cloned()
            .map(|n| match (n.resource.as_str(), n.namespace.is_some()) {
                ("widgets", _) => check(n, &["create", "delete"]),
                ("leases", _) if n.name.is_none() => check(n, &["create"]),
                ("leases", _) => check(n, &["patch"]),
                _ => check(n, &[]),
            })
            .collect();
        let text = missing_rbac("c", "system:serviceaccount:team:kbind", &checks).unwrap();
        let documents: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
            .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap())
            .filter(|d| !d.is_null())
            .collect();
        let kinds: Vec<&str> = documents
            .iter()
            .map(|d| d["kind"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            [
                "ClusterRole",
                "ClusterRoleBinding",
                "Namespace",
                "Role",
                "RoleBinding"
            ]
        );
        assert_eq!(
            documents[0]["rules"],
            json!([{ "apiGroups": ["example.org"], "resources": ["widgets"], "verbs": ["create", "delete"] }])
        );
        // The Role's namespace comes first: it may not exist before kbind could create it.
        assert_eq!(documents[2]["metadata"], json!({ "name": "kbind" }));
        assert_eq!(
            documents[3]["metadata"],
            json!({ "name": "kbind-provider-c", "namespace": "kbind" })
        );
        // The heartbeat Lease by name only: no consumer may write another's heartbeat.
        assert_eq!(
            documents[3]["rules"],
            json!([
                { "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"] },
                { "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["c-0123456789"], "verbs": ["patch"] },
            ])
        );
        assert_eq!(
            documents[1]["subjects"],
            json!([{ "kind": "ServiceAccount", "name": "kbind", "namespace": "team" }])
        );
        // A provider-supplied user name cannot add documents or lines to what is applied.
        for evil in [
            "mallory\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding",
            "mallory\u{2028}kind: ClusterRoleBinding\u{2029}x",
            "mallory\r\n# \u{85}kind: Secret",
        ] {
            let text = missing_rbac("c", evil, &checks).unwrap();
            let header = text.lines().next().unwrap();
            assert!(header.starts_with("# What Connection c's"), "{text}");
            assert!(text.lines().nth(1) == Some("---"), "{text}");
            let documents: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
                .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap())
                .filter(|d| !d.is_null())
                .collect();
            assert_eq!(documents.len(), 5, "{text}");
            assert_eq!(documents[1]["subjects"][0]["name"], evil);
        }
        let user = missing_rbac("c", "alice", &checks).unwrap();
        assert!(
            user.contains("kind: User") && user.contains("name: alice"),
            "{user}"
        );
    }
}
