//! The related copies (Secrets, ConfigMaps) a previous identity of this consumer left, for
//! `kubectl kbind rehome` (#53.2): `FromConsumer` copies on the provider and `FromProvider`
//! copies on the consumer (restored with the objects) name the previous consumer cluster and a
//! binding UID that no longer exists, so the restored bindings' entries report them as another
//! binding's. Each is claimed for the one restored binding of the Connection whose entry of that
//! kind and direction covers it — by namespace scope, and by name when entries list names — with
//! one server-side apply of what kbind's related syncer writes (its payload as read, this
//! consumer's markers, the restored binding's UID, the entry record kept); a copy more than one
//! binding could claim is left and named. Decisions are pure functions; reads and writes at the
//! edge.

use std::collections::BTreeMap;

use kbind_shared::api::{
    Binding, BindingSpec, ClusterBinding, RelatedDirection, RelatedResourceKind,
};
use kbind_shared::keys;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use serde_json::{Value, json};

use crate::view::{self, cell};

/// The payload fields of a Secret or ConfigMap, kept as read.
const PAYLOAD: [&str; 5] = ["data", "binaryData", "stringData", "type", "immutable"];
/// Objects listed per request.
const PAGE: u32 = 500;

/// A binding that may claim related copies: what its entries cover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimant {
    /// `ClusterBinding x` or `Binding ns/x`.
    pub name: String,
    pub uid: String,
    /// A Binding's namespace (its scope); `None` for a ClusterBinding.
    pub namespace: Option<String>,
    /// Its entries: kind, direction, listed names, listed namespaces.
    pub entries: Vec<(
        RelatedResourceKind,
        RelatedDirection,
        Vec<String>,
        Vec<String>,
    )>,
}

impl Claimant {
    fn of(name: String, uid: String, namespace: Option<String>, spec: &BindingSpec) -> Self {
        Self {
            name,
            uid,
            namespace,
            entries: spec
                .related_resources
                .iter()
                .map(|r| {
                    let names = r
                        .selector
                        .as_ref()
                        .map(|s| s.names.clone())
                        .unwrap_or_default();
                    (r.resource, r.direction, names, r.namespaces.clone())
                })
                .collect(),
        }
    }

    /// Whether an entry of this binding covers a copy of `kind` in `namespace` named `name`
    /// going `direction`: `Some(true)` when the entry lists the name.
    fn covers(
        &self,
        kind: RelatedResourceKind,
        direction: RelatedDirection,
        namespace: &str,
        name: &str,
    ) -> Option<bool> {
        if self.namespace.as_deref().is_some_and(|ns| ns != namespace) {
            return None;
        }
        self.entries
            .iter()
            .filter(|(k, d, names, namespaces)| {
                *k == kind
                    && *d == direction
                    && (self.namespace.is_some()
                        || namespaces.is_empty()
                        || namespaces.iter().any(|n| n == namespace))
                    && (names.is_empty() || names.iter().any(|n| n == name))
            })
            .map(|(_, _, names, _)| !names.is_empty())
            .max()
    }
}

/// Which binding claims a copy: the one whose entry covers it, or among several the one whose
/// entry lists its name. `Err` names why none does: `no binding` or `ambiguous`.
pub fn claimant<'c>(
    claimants: &'c [Claimant],
    kind: RelatedResourceKind,
    direction: RelatedDirection,
    namespace: &str,
    name: &str,
) -> Result<&'c Claimant, &'static str> {
    let covering: Vec<(&Claimant, bool)> = claimants
        .iter()
        .filter_map(|c| Some((c, c.covers(kind, direction, namespace, name)?)))
        .collect();
    let by_name: Vec<&Claimant> = covering
        .iter()
        .filter(|(_, n)| *n)
        .map(|(c, _)| *c)
        .collect();
    match (covering.as_slice(), by_name.as_slice()) {
        ([], _) => Err("no binding"),
        ([(only, _)], _) => Ok(only),
        (_, [only]) => Ok(only),
        _ => Err("ambiguous"),
    }
}

/// The apply that claims a copy: `object` (as read) with this consumer's markers, the claiming
/// binding's UID, the heartbeat record, its entry record kept and its payload as it is; the
/// consumer UID label on the provider's side only.
pub fn claim_body(
    object: &DynamicObject,
    kind: &str,
    provider_side: bool,
    uid: &str,
    binding: &str,
    heartbeat: &str,
) -> Value {
    let mut labels = json!({ keys::MANAGED_LABEL: keys::TRUE });
    if provider_side {
        labels[keys::CONSUMER_CLUSTER_UID_LABEL] = json!(uid);
    }
    let mut annotations = json!({
        keys::CONSUMER_CLUSTER_UID_ANNOTATION: uid,
        keys::RELATED_BINDING_ANNOTATION: binding,
        keys::HEARTBEAT_ANNOTATION: heartbeat,
    });
    for key in [
        keys::RELATED_ENTRIES_ANNOTATION,
        keys::RELATED_ADOPTED_ANNOTATION,
    ] {
        if let Some(value) = object.annotations().get(key) {
            annotations[key] = json!(value);
        }
    }
    let mut body = json!({
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {
            "name": object.name_any(),
            "namespace": object.namespace(),
            "resourceVersion": object.resource_version(),
            "labels": labels,
            "annotations": annotations,
        },
    });
    for field in PAYLOAD {
        if let Some(value) = object.data.get(field) {
            body[field] = value.clone();
        }
    }
    body
}

/// One related copy of the previous identity.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RelatedCopy {
    /// `provider` (FromConsumer) or `consumer` (FromProvider).
    pub side: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// `claim`, `ambiguous` or `no binding`.
    pub verdict: String,
    /// The binding that claims it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binding: Option<String>,
}

/// The Connection's bindings (not being deleted) with related entries.
pub async fn claimants(consumer: &Client, connection: &str) -> Result<Vec<Claimant>, String> {
    let params = ListParams::default();
    let mut out = Vec::new();
    for b in Api::<ClusterBinding>::all(consumer.clone())
        .list(&params)
        .await
        .map_err(|e| view::read_error("ClusterBindings", &e))?
        .items
    {
        if b.spec.binding.connection_ref.name == connection
            && b.metadata.deletion_timestamp.is_none()
        {
            out.push(Claimant::of(
                format!("ClusterBinding {}", b.name_any()),
                b.uid().unwrap_or_default(),
                None,
                &b.spec.binding,
            ));
        }
    }
    for b in Api::<Binding>::all(consumer.clone())
        .list(&params)
        .await
        .map_err(|e| view::read_error("Bindings", &e))?
        .items
    {
        if b.spec.connection_ref.name == connection && b.metadata.deletion_timestamp.is_none() {
            let namespace = b.namespace().unwrap_or_default();
            out.push(Claimant::of(
                format!("Binding {namespace}/{}", b.name_any()),
                b.uid().unwrap_or_default(),
                Some(namespace),
                &b.spec,
            ));
        }
    }
    out.retain(|c| !c.entries.is_empty());
    Ok(out)
}

/// Where a side's copies are: the cluster, and the direction whose target it is.
pub struct Side<'a> {
    pub client: &'a Client,
    /// `provider` or `consumer`.
    pub name: &'static str,
    pub direction: RelatedDirection,
    /// Where to list (`None`: every namespace) — on the provider in a boundary (#51), each
    /// consumer namespace's mapped one.
    pub scopes: Vec<Option<String>>,
    /// How the Connection names consumer namespaces here (identity on the consumer).
    pub map: kbind_shared::boundary::NamespaceMap,
}

/// The related copies on `side` that name the previous identity `from`, each with its verdict;
/// when `claim` (and `refused` is not set), those with one claimant are claimed.
pub async fn copies(
    side: &Side<'_>,
    claimants: &[Claimant],
    from: &str,
    uid: &str,
    heartbeat: &str,
    claim: bool,
) -> Result<(Vec<RelatedCopy>, usize), String> {
    let (mut rows, mut claimed) = (Vec::new(), 0);
    for kind in [
        RelatedResourceKind::Secrets,
        RelatedResourceKind::Configmaps,
    ] {
        if !claimants.iter().any(|c| {
            c.entries
                .iter()
                .any(|(k, d, _, _)| *k == kind && *d == side.direction)
        }) {
            continue;
        }
        let resource = match kind {
            RelatedResourceKind::Secrets => {
                ApiResource::erase::<k8s_openapi::api::core::v1::Secret>(&())
            }
            RelatedResourceKind::Configmaps => {
                ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&())
            }
        };
        let managed = ListParams::default()
            .labels(&format!("{}={}", keys::MANAGED_LABEL, keys::TRUE))
            .limit(PAGE);
        for scope in &side.scopes {
            let api: Api<DynamicObject> =
                kbind_shared::dynamic::scoped(side.client, scope.as_deref(), &resource);
            let mut params = managed.clone();
            loop {
                let page = api.list(&params).await.map_err(|e| {
                    view::read_error(&format!("{} on the {}", resource.plural, side.name), &e)
                })?;
                for object in &page.items {
                    let annotations = object.annotations();
                    if annotations
                        .get(keys::CONSUMER_CLUSTER_UID_ANNOTATION)
                        .map(String::as_str)
                        != Some(from)
                        || !annotations.contains_key(keys::RELATED_BINDING_ANNOTATION)
                    {
                        continue;
                    }
                    let namespace = object.namespace().unwrap_or_default();
                    let name = object.name_any();
                    // Bindings speak of the consumer's namespaces.
                    let Some(named) = side.map.consumer(&namespace) else {
                        continue;
                    };
                    let found = claimant(claimants, kind, side.direction, named, &name);
                    if claim && let Ok(binding) = found {
                        let body = claim_body(
                            object,
                            &resource.kind,
                            side.name == "provider",
                            uid,
                            &binding.uid,
                            heartbeat,
                        );
                        kbind_shared::dynamic::scoped(side.client, Some(&namespace), &resource)
                            .patch(
                                &name,
                                &PatchParams::apply(keys::RELATED_FIELD_MANAGER).force(),
                                &Patch::Apply(&body),
                            )
                            .await
                            .map_err(|e| {
                                format!(
                                    "claim the related copy {} {namespace}/{name} on the {}: {}",
                                    resource.kind,
                                    side.name,
                                    kbind_shared::identity::describe_error(&e)
                                )
                            })?;
                        claimed += 1;
                    }
                    rows.push(RelatedCopy {
                        side: side.name.to_owned(),
                        kind: resource.kind.clone(),
                        namespace: cell(&namespace),
                        name: cell(&name),
                        verdict: match found {
                            Ok(_) => "claim".to_owned(),
                            Err(why) => why.to_owned(),
                        },
                        binding: found.ok().map(|b| cell(&b.name)),
                    });
                }
                match page.metadata.continue_.filter(|c| !c.is_empty()) {
                    Some(token) => params = managed.clone().continue_token(&token),
                    None => break,
                }
            }
        }
    }
    Ok((rows, claimed))
}

/// Counts per verdict, for the report.
pub fn counted(rows: &[RelatedCopy]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for row in rows {
        *counts.entry(row.verdict.clone()).or_insert(0) += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use RelatedDirection::{FromConsumer, FromProvider};
    use RelatedResourceKind::{Configmaps, Secrets};

    fn claimant_of(
        name: &str,
        namespace: Option<&str>,
        entries: &[(RelatedResourceKind, RelatedDirection, &[&str], &[&str])],
    ) -> Claimant {
        Claimant {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: namespace.map(str::to_owned),
            entries: entries
                .iter()
                .map(|(k, d, names, namespaces)| {
                    (
                        *k,
                        *d,
                        names.iter().map(|s| s.to_string()).collect(),
                        namespaces.iter().map(|s| s.to_string()).collect(),
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn a_copy_goes_to_the_one_binding_whose_entry_covers_it() {
        let all = vec![
            claimant_of(
                "cluster",
                None,
                &[(Configmaps, FromConsumer, &[], &["team-a"])],
            ),
            claimant_of(
                "team-b",
                Some("team-b"),
                &[(Configmaps, FromConsumer, &[], &[])],
            ),
            claimant_of(
                "named",
                Some("team-c"),
                &[(Secrets, FromProvider, &["db"], &[])],
            ),
            claimant_of(
                "any-c",
                Some("team-c"),
                &[(Secrets, FromProvider, &[], &[])],
            ),
        ];
        let who = |kind, direction, ns: &str, name: &str| {
            claimant(&all, kind, direction, ns, name).map(|c| c.name.as_str())
        };
        assert_eq!(who(Configmaps, FromConsumer, "team-a", "x"), Ok("cluster"));
        assert_eq!(who(Configmaps, FromConsumer, "team-b", "x"), Ok("team-b"));
        assert_eq!(
            who(Configmaps, FromConsumer, "team-z", "x"),
            Err("no binding")
        );
        assert_eq!(
            who(Configmaps, FromProvider, "team-a", "x"),
            Err("no binding")
        );
        // Two cover it; the one listing the name claims it.
        assert_eq!(who(Secrets, FromProvider, "team-c", "db"), Ok("named"));
        assert_eq!(who(Secrets, FromProvider, "team-c", "other"), Ok("any-c"));
        let twins = vec![
            claimant_of("one", Some("team-d"), &[(Secrets, FromConsumer, &[], &[])]),
            claimant_of("two", Some("team-d"), &[(Secrets, FromConsumer, &[], &[])]),
        ];
        assert_eq!(
            claimant(&twins, Secrets, FromConsumer, "team-d", "s").map(|c| c.name.as_str()),
            Err("ambiguous")
        );
    }

    #[test]
    fn a_claim_keeps_the_payload_and_the_entry_record_and_changes_only_the_markers() {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "settings", "namespace": "team-a", "resourceVersion": "42",
                "labels": { keys::MANAGED_LABEL: keys::TRUE, keys::CONSUMER_CLUSTER_UID_LABEL: "old" },
                "annotations": { keys::CONSUMER_CLUSTER_UID_ANNOTATION: "old",
                                 keys::RELATED_BINDING_ANNOTATION: "old-binding",
                                 keys::RELATED_ENTRIES_ANNOTATION: "abcd1234" } },
            "data": { "colour": "blue" } }))
        .unwrap();
        let body = claim_body(
            &object,
            "ConfigMap",
            true,
            "new",
            "new-binding",
            "kbind/p-new",
        );
        assert_eq!(body["kind"], "ConfigMap");
        assert_eq!(body["data"], json!({ "colour": "blue" }));
        assert_eq!(body["metadata"]["resourceVersion"], "42");
        assert_eq!(
            body["metadata"]["labels"][keys::CONSUMER_CLUSTER_UID_LABEL],
            "new"
        );
        let annotations = &body["metadata"]["annotations"];
        assert_eq!(annotations[keys::CONSUMER_CLUSTER_UID_ANNOTATION], "new");
        assert_eq!(annotations[keys::RELATED_BINDING_ANNOTATION], "new-binding");
        assert_eq!(annotations[keys::RELATED_ENTRIES_ANNOTATION], "abcd1234");
        assert_eq!(annotations[keys::HEARTBEAT_ANNOTATION], "kbind/p-new");
        let consumer_side = claim_body(&object, "ConfigMap", false, "new", "b", "h");
        assert!(
            consumer_side["metadata"]["labels"]
                .get(keys::CONSUMER_CLUSTER_UID_LABEL)
                .is_none()
        );
    }
}
