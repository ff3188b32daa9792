//! `kubectl kbind diff <kind>/<name>`: one synced object, side by side with its provider copy.
//!
//! The fields kbind syncs — the spec, kbind's label and the two ownership annotations, exactly
//! the server-side apply body the syncer would send now — are rendered as YAML for the consumer
//! object and for the provider copy and compared as a unified diff (`-` the provider's, `+` what
//! kbind would write). Beside it: who owns which field on each side (`managedFields`), the
//! delivered generation and time, the last refusal, the Connection and the provider copy's
//! identity. Only GETs and LISTs, and the provider is read only when its identity is the one the
//! Connection pinned.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kbind_shared::kubeconfig::Transport;
use kbind_shared::ownership::{self, Owner};
use kbind_shared::{delivery, keys};
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use serde_json::{Value, json};

use crate::view::{self, Pin};

/// Field paths listed per field manager (the rest are counted).
const MAX_PATHS: usize = 40;
/// The longest line of a rendered document or of the diff.
const MAX_LINE: usize = 2000;
/// How long the line diff may take before it settles for a coarser answer.
const DIFF_DEADLINE: Duration = Duration::from_secs(2);
/// Events read about the object (the newest refusal is looked for among them).
const EVENTS_READ: u32 = 200;

/// The whole report.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// `<plural>.<group>`.
    pub api: String,
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    /// The Connection serving the API.
    pub connection: String,
    /// Whether the provider copy holds exactly the fields kbind would write now.
    pub identical: bool,
    /// The unified diff (empty when identical): `-` the provider copy, `+` the consumer's.
    pub diff: String,
    pub consumer: ConsumerSide,
    pub provider: ProviderSide,
    /// The object's delivery record (`status.kbindSync`), if it has one.
    pub delivery: Option<Value>,
    /// The last time the provider refused this object's spec, if kbind still knows.
    pub last_refusal: Option<LastRefusal>,
}

/// The consumer object.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerSide {
    pub uid: String,
    pub generation: Option<i64>,
    pub resource_version: String,
    /// Whether its `core.kbind.io/paused` annotation pauses it.
    pub paused: bool,
    /// A mirror of a provider object observe-first import made (#54): `Observed` (not claimed:
    /// kbind writes nothing to the provider for it) or `Claimed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub imported: Option<String>,
    pub owners: Vec<FieldOwner>,
}

/// The provider side.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderSide {
    /// The identity the Connection pinned.
    pub pinned_cluster: String,
    /// The identity the credential reaches now, and whether it is the pinned one.
    pub cluster: String,
    pub pin: Pin,
    /// Why the provider was not read (its copy is then unknown).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unread: Option<String>,
    /// The copy, when it exists.
    pub copy: Option<CopySide>,
}

/// The provider copy.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CopySide {
    pub uid: String,
    pub generation: Option<i64>,
    pub resource_version: String,
    /// Whose it is by its ownership markers: `Ours` (this consumer object's), `Unmarked`,
    /// `Another`.
    pub ownership: String,
    /// When kbind's field manager last wrote it, as the provider recorded it.
    pub applied_at: Option<String>,
    pub owners: Vec<FieldOwner>,
}

/// One `managedFields` entry: a field manager and the fields it owns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FieldOwner {
    pub manager: String,
    pub operation: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub subresource: String,
    pub time: Option<String>,
    /// The fields it owns (leaves), at most [`MAX_PATHS`].
    pub fields: Vec<String>,
    /// How many more it owns.
    pub more: usize,
}

/// The provider's last refusal of the object's spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LastRefusal {
    /// `Rejected` or `Forbidden`.
    pub state: String,
    pub message: String,
    /// When: since when the record says so, or the Event's last time.
    pub time: Option<String>,
    /// `record` (it still stands: the delivery record says so) or `event` (kbind's Warning
    /// Event about an earlier refusal).
    pub source: String,
}

impl Report {
    /// Whether the user should look: the copy differs, or there is none.
    pub fn differs(&self) -> bool {
        !self.identical
    }
}

/// `<kind>/<name>` split; both parts required.
pub fn parse_target(target: &str) -> Result<(&str, &str), String> {
    match target.split_once('/') {
        Some((kind, name)) if !kind.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((kind, name))
        }
        _ => Err(format!(
            "expected <kind>/<name> (e.g. widget/w1 or widgets.example.org/w1), got {:?}",
            view::line(target, 100)
        )),
    }
}

/// The CRD among kbind's (`crds`, the managed ones) that `kind` names: its plural, singular, kind
/// or a short name, each alone or followed by `.<group>`, case-insensitive.
pub fn resolve<'a>(
    crds: &'a [CustomResourceDefinition],
    kind: &str,
) -> Result<&'a CustomResourceDefinition, String> {
    let wanted = kind.to_ascii_lowercase();
    let matching: Vec<&CustomResourceDefinition> = crds
        .iter()
        .filter(|crd| {
            let names = &crd.spec.names;
            let mut aliases = vec![names.plural.clone(), names.kind.to_ascii_lowercase()];
            aliases.extend(names.singular.clone());
            aliases.extend(names.short_names.iter().flatten().cloned());
            aliases
                .iter()
                .any(|alias| wanted == *alias || wanted == format!("{alias}.{}", crd.spec.group))
        })
        .collect();
    match matching.as_slice() {
        [one] => Ok(one),
        [] => {
            let served: BTreeSet<String> = crds.iter().map(|c| c.name_any()).collect();
            Err(format!(
                "no API kbind serves here is called {:?} (kbind serves: {})",
                view::line(kind, 100),
                if served.is_empty() {
                    "none".to_owned()
                } else {
                    served.into_iter().collect::<Vec<_>>().join(", ")
                }
            ))
        }
        many => Err(format!(
            "{:?} names several APIs kbind serves ({}): say which, as <plural>.<group>",
            view::line(kind, 100),
            many.iter()
                .map(|c| c.name_any())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// The provider copy's side of what kbind syncs: the same keys [`ownership::spec_up_body`]
/// writes, with the copy's values (a key it lacks stays out).
pub fn synced_fields_of_copy(copy: &DynamicObject) -> Value {
    let mut metadata = json!({ "name": copy.name_any() });
    if let Some(namespace) = &copy.metadata.namespace {
        metadata["namespace"] = json!(namespace);
    }
    let labels: serde_json::Map<String, Value> =
        [keys::MANAGED_LABEL, keys::CONSUMER_CLUSTER_UID_LABEL]
            .into_iter()
            .filter_map(|key| Some((key.to_owned(), json!(copy.labels().get(key)?))))
            .collect();
    if !labels.is_empty() {
        metadata["labels"] = Value::Object(labels);
    }
    let markers: serde_json::Map<String, Value> = [
        keys::CONSUMER_CLUSTER_UID_ANNOTATION,
        keys::CONSUMER_OBJECT_UID_ANNOTATION,
    ]
    .into_iter()
    .filter_map(|key| Some((key.to_owned(), json!(copy.annotations().get(key)?))))
    .collect();
    if !markers.is_empty() {
        metadata["annotations"] = Value::Object(markers);
    }
    let mut fields = json!({ "metadata": metadata });
    if let Some(types) = &copy.types {
        fields["apiVersion"] = json!(types.api_version);
        fields["kind"] = json!(types.kind);
    }
    if let Some(spec) = copy.data.get("spec") {
        fields["spec"] = spec.clone();
    }
    fields
}

/// Removes [`keys::HEARTBEAT_ANNOTATION`] from a spec-up body.
fn without_heartbeat_record(body: &mut Value) {
    if let Some(annotations) = body
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.remove(keys::HEARTBEAT_ANNOTATION);
    }
}

/// `value` as YAML with every map's keys in order, each line made safe for a terminal.
pub fn render_yaml(value: &Value) -> String {
    let text = serde_yaml::to_string(&sorted(value)).unwrap_or_else(|e| format!("# {e}\n"));
    text.lines()
        .map(|line| view::line(line, MAX_LINE) + "\n")
        .collect()
}

/// `value` with its maps' keys sorted (whatever order the API servers kept them in).
fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted(&map[k])))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// A unified diff from `old` (labelled `old_name`) to `new`; empty when they are equal.
pub fn unified(old: &str, new: &str, old_name: &str, new_name: &str) -> String {
    if old == new {
        return String::new();
    }
    similar::TextDiff::configure()
        .timeout(DIFF_DEADLINE)
        .diff_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .header(old_name, new_name)
        .to_string()
}

/// Who owns what: each `managedFields` entry with its fields as paths.
pub fn field_owners(meta: &ObjectMeta) -> Vec<FieldOwner> {
    meta.managed_fields
        .iter()
        .flatten()
        .map(|entry| {
            let mut paths = Vec::new();
            if let Some(fields) = &entry.fields_v1 {
                field_paths(&fields.0, "", &mut paths);
            }
            let more = paths.len().saturating_sub(MAX_PATHS);
            paths.truncate(MAX_PATHS);
            FieldOwner {
                manager: view::line(entry.manager.as_deref().unwrap_or_default(), 200),
                operation: entry.operation.clone().unwrap_or_default(),
                subresource: entry.subresource.clone().unwrap_or_default(),
                time: entry.time.as_ref().map(|t| t.0.to_string()),
                fields: paths,
                more,
            }
        })
        .collect()
}

/// The leaves of a `fieldsV1` set as paths: `f:name` is `.name`, `k:{"name":"a"}` is
/// `[name=a]`, `v:"x"` is `[="x"]`, `i:3` is `[3]`; `.` (the element itself) is not a leaf of
/// its own when it has children.
fn field_paths(fields: &Value, prefix: &str, out: &mut Vec<String>) {
    let Value::Object(children) = fields else {
        return;
    };
    let children: Vec<(&String, &Value)> = children.iter().filter(|(k, _)| *k != ".").collect();
    if children.is_empty() {
        if !prefix.is_empty() {
            out.push(prefix.to_owned());
        }
        return;
    }
    for (key, value) in children {
        let step = match key.split_once(':') {
            Some(("f", name)) => format!(".{name}"),
            Some(("i", index)) => format!("[{index}]"),
            Some(("v", value)) => format!("[={value}]"),
            Some(("k", key)) => match serde_json::from_str::<serde_json::Map<String, Value>>(key) {
                Ok(map) => format!(
                    "[{}]",
                    map.iter()
                        .map(|(k, v)| match v {
                            Value::String(s) => format!("{k}={s}"),
                            other => format!("{k}={other}"),
                        })
                        .collect::<Vec<_>>()
                        .join(",")
                ),
                Err(_) => format!("[{key}]"),
            },
            _ => format!(".{key}"),
        };
        field_paths(value, &format!("{prefix}{step}"), out);
    }
}

/// The last refusal: the delivery record's when it still says `Rejected` or `Forbidden`, else
/// the newest of kbind's refusal Warning Events about the object (`events`, any order).
pub fn last_refusal(record: Option<&Value>, events: &[Event]) -> Option<LastRefusal> {
    let refused = [delivery::REJECTED, delivery::FORBIDDEN];
    if let Some(record) = record
        && let Some(state) = record.get("state").and_then(Value::as_str)
        && refused.contains(&state)
    {
        let text = |key: &str| record.get(key).and_then(Value::as_str).map(str::to_owned);
        return Some(LastRefusal {
            state: state.to_owned(),
            message: text("message").unwrap_or_default(),
            time: text("since"),
            source: "record".into(),
        });
    }
    events
        .iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .filter(|e| {
            e.reporting_component.as_deref() == Some(keys::EVENT_COMPONENT)
                || e.source.as_ref().and_then(|s| s.component.as_deref())
                    == Some(keys::EVENT_COMPONENT)
        })
        .filter_map(|e| {
            let reason = e.reason.as_deref()?;
            let refusal = delivery::Refusal::ALL
                .into_iter()
                .find(|r| r.event_reason() == reason)?;
            Some((event_time(e), refusal, e))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(time, refusal, e)| LastRefusal {
            state: refusal.state().to_owned(),
            message: e.message.clone().unwrap_or_default(),
            time,
            source: "event".into(),
        })
}

/// When an Event last happened, as RFC 3339 (which of its times is set depends on the API that
/// wrote it).
fn event_time(event: &Event) -> Option<String> {
    event
        .series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref())
        .map(|t| t.0)
        .or_else(|| event.last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| event.event_time.as_ref().map(|t| t.0))
        .or_else(|| event.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .map(|t| t.to_string())
}

fn ownership_name(owner: Owner) -> &'static str {
    match owner {
        Owner::Ours => "Ours",
        Owner::Unmarked => "Unmarked",
        Owner::Another => "Another",
    }
}

/// Reads everything the report needs (only GETs and LISTs) and compares.
pub async fn gather(
    consumer: &Client,
    target: &str,
    namespace: Option<&str>,
    transport: Transport,
) -> Result<Report, String> {
    let (kind, name) = parse_target(target)?;
    let crds = Api::<CustomResourceDefinition>::all(consumer.clone())
        .list(&ListParams::default().labels(&format!("{}={}", keys::MANAGED_LABEL, keys::TRUE)))
        .await
        .map_err(|e| view::read_error("the CRDs kbind manages", &e))?
        .items;
    let crd = resolve(&crds, kind)?;
    let api = crd.name_any();
    let resource: ApiResource = kbind_shared::dynamic::instance_resource(crd)
        .ok_or_else(|| format!("the CRD {api} serves no version"))?;
    let namespace = match crd.spec.scope.as_str() {
        "Namespaced" => Some(
            namespace
                .unwrap_or_else(|| consumer.default_namespace())
                .to_owned(),
        ),
        _ => None,
    };
    let described = match &namespace {
        Some(ns) => format!("{} {ns}/{name}", resource.kind),
        None => format!("{} {name}", resource.kind),
    };
    let connection_name = crd
        .annotations()
        .get(keys::CONNECTION_ANNOTATION)
        .cloned()
        .ok_or_else(|| format!("the CRD {api} names no Connection"))?;
    let object = kbind_shared::dynamic::scoped(consumer, namespace.as_deref(), &resource)
        .get_opt(name)
        .await
        .map_err(|e| view::read_error(&described, &e))?
        .ok_or_else(|| format!("{described} does not exist on the consumer"))?;
    let connection = view::connection(consumer, &connection_name)
        .await?
        .ok_or_else(|| format!("the Connection {connection_name} does not exist"))?;
    let status = connection.status.clone().unwrap_or_default();

    // The provider, only when it is the pinned one.
    let mut provider = ProviderSide {
        pinned_cluster: status.remote_cluster_uid.clone(),
        cluster: String::new(),
        pin: Pin::Unpinned,
        unread: None,
        copy: None,
    };
    let mut copy = None;
    // In a boundary the copy lives in the mapped namespace (#51).
    let provider_namespace = connection
        .spec
        .namespaces()
        .provider_opt(namespace.as_deref())
        .map_err(|e| e.to_string())?;
    match view::provider_maybe_unidentified(consumer, &connection.spec, transport).await {
        Err(e) => provider.unread = Some(e),
        Ok((_, Err(e))) => provider.unread = Some(e),
        Ok((reached, Ok(()))) => {
            provider.cluster = reached.identity.clone();
            provider.pin = view::pin(connection.status.as_ref(), &reached.identity);
            match &provider.pin {
                Pin::Matches => {
                    copy = kbind_shared::dynamic::scoped(
                        &reached.provider.client,
                        provider_namespace.as_deref(),
                        &resource,
                    )
                    .get_opt(name)
                    .await
                    .map_err(|e| view::read_error(&format!("the provider's {described}"), &e))?;
                }
                Pin::Unpinned => {
                    provider.unread =
                        Some("the Connection has pinned no provider identity yet".into())
                }
                Pin::Mismatch { pinned } => {
                    provider.unread = Some(format!(
                        "the credential reaches cluster {}, not the pinned {pinned}: kbind does not use it",
                        reached.identity
                    ))
                }
            }
        }
    }

    let mut desired = ownership::spec_up_body(
        &resource.api_version,
        &resource.kind,
        provider_namespace.as_deref(),
        name,
        object.data.get("spec"),
        &status.local_cluster_uid,
        object.uid().as_deref().unwrap_or_default(),
        "",
    );
    // The record of the writing Connection's heartbeat is not a synced field: a copy gets it
    // with its next change, and kbind never writes for it alone.
    without_heartbeat_record(&mut desired);
    let mine = render_yaml(&desired);
    let theirs = copy
        .as_ref()
        .map(|c| render_yaml(&synced_fields_of_copy(c)))
        .unwrap_or_default();
    let diff = if provider.unread.is_some() {
        String::new()
    } else {
        unified(
            &theirs,
            &mine,
            &format!("provider {described}"),
            &format!("consumer {described}"),
        )
    };
    provider.copy = copy.as_ref().map(|c| CopySide {
        uid: c.uid().unwrap_or_default(),
        generation: c.metadata.generation,
        resource_version: c.resource_version().unwrap_or_default(),
        ownership: ownership_name(ownership::classify(
            &c.annotations().clone(),
            &status.local_cluster_uid,
            object.uid().as_deref().unwrap_or_default(),
        ))
        .into(),
        applied_at: delivery::applied_at(&c.metadata),
        owners: field_owners(&c.metadata),
    });

    let record = delivery::record_of(object.data.get("status")).cloned();
    let uid = object.uid().unwrap_or_default();
    let events =
        Api::<Event>::namespaced(consumer.clone(), namespace.as_deref().unwrap_or("default"))
            .list(
                &ListParams::default()
                    .fields(&format!("involvedObject.uid={uid}"))
                    .limit(EVENTS_READ),
            )
            .await
            .map_err(|e| view::read_error(&format!("the Events about {described}"), &e))?
            .items;

    let imported = imported(&object.metadata, &connection_name);
    Ok(Report {
        api,
        kind: resource.kind.clone(),
        namespace,
        name: name.to_owned(),
        connection: connection_name,
        identical: provider.unread.is_none() && copy.is_some() && diff.is_empty(),
        diff,
        consumer: ConsumerSide {
            uid,
            generation: object.metadata.generation,
            resource_version: object.resource_version().unwrap_or_default(),
            paused: object
                .annotations()
                .get(keys::PAUSED_ANNOTATION)
                .map(String::as_str)
                == Some(keys::TRUE),
            imported,
            owners: field_owners(&object.metadata),
        },
        provider,
        last_refusal: last_refusal(record.as_ref(), &events),
        delivery: record,
    })
}

/// Where an object stands towards observe-first import, as the report says it.
fn imported(meta: &ObjectMeta, connection: &str) -> Option<String> {
    use kbind_shared::import::{Standing, standing_of};
    match standing_of(meta, connection, keys::SYNCER_FINALIZER) {
        Standing::NotImported => None,
        Standing::Observed | Standing::Elsewhere => Some("Observed".into()),
        Standing::Claimed => Some("Claimed".into()),
    }
}

/// The report as text: where the object stands, the diff, then the field owners.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let target = match &report.namespace {
        Some(ns) => format!("{} {ns}/{}", report.kind, report.name),
        None => format!("{} {}", report.kind, report.name),
    };
    out.push_str(&format!(
        "{target} ({}) via Connection {}\n",
        report.api,
        view::cell(&report.connection)
    ));
    let consumer = &report.consumer;
    out.push_str(&format!(
        "consumer:     uid {}, generation {}, resourceVersion {}{}\n",
        consumer.uid,
        consumer.generation.map_or("-".into(), |g| g.to_string()),
        consumer.resource_version,
        if consumer.paused { ", paused" } else { "" },
    ));
    match consumer.imported.as_deref() {
        Some("Observed") => out.push_str(&format!(
            "imported:     a read-only mirror of the provider's object: kbind writes nothing to the provider for it until it is claimed ({}=true); the diff is what the claim would write\n",
            keys::CLAIM_ANNOTATION
        )),
        Some(_) => out.push_str("imported:     claimed: synced as any object\n"),
        None => {}
    }
    let provider = &report.provider;
    match (&provider.unread, &provider.copy) {
        (Some(why), _) => out.push_str(&format!("provider:     not read: {}\n", view::line(why, 300))),
        (None, None) => out.push_str(&format!(
            "provider:     no copy on cluster {}\n",
            view::cell(&provider.cluster)
        )),
        (None, Some(copy)) => out.push_str(&format!(
            "provider:     uid {}, generation {}, resourceVersion {}, markers say {}, on cluster {} (the pinned one), kbind wrote it {}\n",
            view::cell(&copy.uid),
            copy.generation.map_or("-".into(), |g| g.to_string()),
            view::cell(&copy.resource_version),
            copy.ownership,
            view::cell(&provider.cluster),
            copy.applied_at.as_deref().unwrap_or("never"),
        )),
    }
    let text = |record: &Value, key: &str| {
        record
            .get(key)
            .map(|v| match v {
                Value::String(s) => view::line(s, 300),
                other => other.to_string(),
            })
            .unwrap_or_else(|| "-".into())
    };
    match &report.delivery {
        Some(record) => out.push_str(&format!(
            "delivery:     {}, generation {} delivered at {}\n",
            text(record, "state"),
            text(record, "generation"),
            text(record, "time"),
        )),
        None => out.push_str("delivery:     no record yet\n"),
    }
    match &report.last_refusal {
        Some(refusal) => out.push_str(&format!(
            "last refusal: {} at {} ({}): {}\n",
            refusal.state,
            refusal.time.as_deref().unwrap_or("-"),
            refusal.source,
            view::line(&refusal.message, 300),
        )),
        None => out.push_str("last refusal: none known\n"),
    }
    out.push('\n');
    if report.identical {
        out.push_str("no differences in the fields kbind syncs\n");
    } else if report.diff.is_empty() {
        out.push_str("nothing to compare: the provider copy is not known\n");
    } else {
        out.push_str(&report.diff);
    }
    out.push('\n');
    let mut rows = Vec::new();
    let sides = [("consumer", &consumer.owners)]
        .into_iter()
        .chain(provider.copy.as_ref().map(|c| ("provider", &c.owners)));
    for (side, owners) in sides {
        for owner in owners {
            let mut fields = owner.fields.join(", ");
            if owner.more > 0 {
                fields.push_str(&format!(" (and {} more)", owner.more));
            }
            rows.push(vec![
                side.to_owned(),
                view::cell(&owner.manager),
                view::cell(&owner.operation),
                view::cell(&owner.subresource),
                owner.time.clone().unwrap_or_else(|| "-".into()),
                view::line(&fields, MAX_LINE),
            ]);
        }
    }
    out.push_str(&view::table(
        &[
            "SIDE",
            "MANAGER",
            "OPERATION",
            "SUBRESOURCE",
            "TIME",
            "FIELDS",
        ],
        &rows,
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceDefinitionNames, CustomResourceDefinitionSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, Time};

    fn crd(plural: &str, group: &str, kind: &str, short: &[&str]) -> CustomResourceDefinition {
        CustomResourceDefinition {
            metadata: ObjectMeta {
                name: Some(format!("{plural}.{group}")),
                ..Default::default()
            },
            spec: CustomResourceDefinitionSpec {
                group: group.into(),
                names: CustomResourceDefinitionNames {
                    plural: plural.into(),
                    singular: Some(kind.to_ascii_lowercase()),
                    kind: kind.into(),
                    short_names: Some(short.iter().map(|s| (*s).to_owned()).collect()),
                    ..Default::default()
                },
                scope: "Namespaced".into(),
                ..Default::default()
            },
            status: None,
        }
    }

    #[test]
    fn a_target_is_a_kind_and_a_name() {
        assert_eq!(parse_target("widget/w1"), Ok(("widget", "w1")));
        assert_eq!(
            parse_target("widgets.example.org/w1"),
            Ok(("widgets.example.org", "w1"))
        );
        for bad in ["w1", "/w1", "widget/", "widget/a/b", ""] {
            assert!(parse_target(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_kind_is_found_by_any_of_its_names_and_ambiguity_is_refused() {
        let crds = [
            crd("widgets", "example.org", "Widget", &["wd"]),
            crd("gadgets", "example.org", "Gadget", &[]),
            crd("gadgets", "other.io", "Gadget", &[]),
        ];
        for (text, want) in [
            ("widgets", Ok("widgets.example.org")),
            ("widget", Ok("widgets.example.org")),
            ("Widget", Ok("widgets.example.org")),
            ("WD", Ok("widgets.example.org")),
            ("widgets.example.org", Ok("widgets.example.org")),
            ("widget.example.org", Ok("widgets.example.org")),
            ("gadgets.other.io", Ok("gadgets.other.io")),
            ("gadget", Err("names several APIs")),
            ("widgets.other.io", Err("no API kbind serves here")),
            (
                "pods",
                Err("kbind serves: gadgets.example.org, gadgets.other.io, widgets.example.org"),
            ),
        ] {
            match (resolve(&crds, text), want) {
                (Ok(found), Ok(name)) => assert_eq!(found.name_any(), name, "{text}"),
                (Err(message), Err(part)) => assert!(message.contains(part), "{text}: {message}"),
                (got, want) => panic!("{text}: got {:?}, want {want:?}", got.map(|c| c.name_any())),
            }
        }
        assert!(
            resolve(&[], "widget")
                .unwrap_err()
                .contains("kbind serves: none")
        );
    }

    fn copy(annotations: &[(&str, &str)], labels: &[(&str, &str)], spec: Value) -> DynamicObject {
        let mut object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "example.org/v1",
            "kind": "Widget",
            "metadata": { "name": "w1", "namespace": "team-a", "uid": "p-1" },
            "spec": spec,
        }))
        .unwrap();
        for (k, v) in annotations {
            object.annotations_mut().insert((*k).into(), (*v).into());
        }
        for (k, v) in labels {
            object.labels_mut().insert((*k).into(), (*v).into());
        }
        object
    }

    #[test]
    fn an_up_to_date_copy_has_exactly_the_fields_kbind_writes() {
        let spec = json!({ "size": 1, "tags": ["a"] });
        let mut desired = ownership::spec_up_body(
            "example.org/v1",
            "Widget",
            Some("team-a"),
            "w1",
            Some(&spec),
            "consumer-1",
            "c-1",
            "kbind/provider-consumer-1",
        );
        without_heartbeat_record(&mut desired);
        let synced = copy(
            &[
                (keys::CONSUMER_CLUSTER_UID_ANNOTATION, "consumer-1"),
                (keys::CONSUMER_OBJECT_UID_ANNOTATION, "c-1"),
                // With the heartbeat record or without it (written before copies carried it).
                (keys::HEARTBEAT_ANNOTATION, "kbind/provider-consumer-1"),
                ("provider.example/other", "not kbind's"),
            ],
            &[
                (keys::MANAGED_LABEL, keys::TRUE),
                (keys::CONSUMER_CLUSTER_UID_LABEL, "consumer-1"),
                ("team", "x"),
            ],
            spec.clone(),
        );
        assert_eq!(synced_fields_of_copy(&synced), desired);
        // A copy written before copies carried the consumer cluster's label: the label is the
        // difference (its next spec-up adds it).
        let before_the_label = copy(
            &[
                (keys::CONSUMER_CLUSTER_UID_ANNOTATION, "consumer-1"),
                (keys::CONSUMER_OBJECT_UID_ANNOTATION, "c-1"),
            ],
            &[(keys::MANAGED_LABEL, keys::TRUE)],
            spec.clone(),
        );
        assert_eq!(
            unified(
                &render_yaml(&synced_fields_of_copy(&before_the_label)),
                &render_yaml(&desired),
                "a",
                "b"
            )
            .lines()
            .filter(|l| l.starts_with(['+', '-']) && !l.starts_with("+++") && !l.starts_with("---"))
            .collect::<Vec<_>>(),
            ["+    core.kbind.io/consumer-cluster-uid: consumer-1"]
        );
        assert_eq!(
            unified(
                &render_yaml(&synced_fields_of_copy(&synced)),
                &render_yaml(&desired),
                "a",
                "b"
            ),
            ""
        );
        // An unmarked copy with another size: the markers and the size are the difference.
        let foreign = copy(&[], &[], json!({ "size": 2, "tags": ["a"] }));
        let diff = unified(
            &render_yaml(&synced_fields_of_copy(&foreign)),
            &render_yaml(&desired),
            "provider",
            "consumer",
        );
        assert!(diff.starts_with("--- provider\n+++ consumer\n"), "{diff}");
        for line in [
            "-  size: 2",
            "+  size: 1",
            "+    core.kbind.io/consumer-object-uid: c-1",
            "+    core.kbind.io/managed: 'true'",
        ] {
            assert!(diff.lines().any(|l| l == line), "{line:?} in\n{diff}");
        }
        assert!(!diff.contains("provider.example/other"), "{diff}");
    }

    #[test]
    fn rendered_documents_sort_keys_and_keep_control_characters_out() {
        let a = render_yaml(&json!({ "b": 1, "a": { "d": "x\u{1b}[2J", "c": 2 } }));
        let b = render_yaml(&json!({ "a": { "c": 2, "d": "x\u{1b}[2J" }, "b": 1 }));
        assert_eq!(a, b);
        assert!(a.starts_with("a:\n  c: 2\n"), "{a}");
        assert!(!a.contains('\u{1b}'), "{a:?}");
    }

    #[test]
    fn field_owners_list_each_managers_leaves() {
        let entry = |manager: &str, fields: Value| ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Apply".into()),
            time: Some(Time("2026-12-03T10:00:00Z".parse().unwrap())),
            fields_v1: Some(FieldsV1(fields)),
            ..Default::default()
        };
        let many: serde_json::Map<String, Value> =
            (0..45).map(|i| (format!("f:k{i:02}"), json!({}))).collect();
        let meta = ObjectMeta {
            managed_fields: Some(vec![
                entry(
                    "kbind-konnector",
                    json!({
                        "f:metadata": { "f:labels": { "f:core.kbind.io/managed": {} } },
                        "f:spec": {
                            "f:size": {},
                            "f:ports": { "k:{\"port\":80,\"protocol\":\"TCP\"}": { ".": {}, "f:name": {} } },
                            "f:tags": { "v:\"a\"": {} },
                            "f:list": { "i:0": {} },
                            "f:empty": { ".": {} },
                        },
                    }),
                ),
                entry("bulk", json!({ "f:data": Value::Object(many) })),
            ]),
            ..Default::default()
        };
        let owners = field_owners(&meta);
        assert_eq!(owners[0].manager, "kbind-konnector");
        assert_eq!(owners[0].time.as_deref(), Some("2026-12-03T10:00:00Z"));
        let mut fields = owners[0].fields.clone();
        fields.sort();
        assert_eq!(
            fields,
            [
                ".metadata.labels.core.kbind.io/managed",
                ".spec.empty",
                ".spec.list[0]",
                ".spec.ports[port=80,protocol=TCP].name",
                ".spec.size",
                ".spec.tags[=\"a\"]",
            ]
        );
        assert_eq!((owners[1].fields.len(), owners[1].more), (MAX_PATHS, 5));
    }

    fn event(reason: &str, type_: &str, component: &str, at: &str, message: &str) -> Event {
        serde_json::from_value(json!({
            "metadata": { "name": format!("e-{at}"), "namespace": "team-a" },
            "involvedObject": {},
            "type": type_,
            "reason": reason,
            "reportingComponent": component,
            "eventTime": at,
            "message": message,
        }))
        .unwrap()
    }

    #[test]
    fn the_last_refusal_is_the_records_or_else_kbinds_newest_refusal_event() {
        let events = [
            event(
                "ProviderRejected",
                "Warning",
                "kbind-konnector",
                "2026-12-03T10:00:00.000000Z",
                "old",
            ),
            event(
                "Forbidden",
                "Warning",
                "kbind-konnector",
                "2026-12-03T11:00:00.000000Z",
                "newest",
            ),
            event(
                "ProviderRejected",
                "Warning",
                "someone-else",
                "2026-12-03T12:00:00.000000Z",
                "forged",
            ),
            event(
                "ProviderRejected",
                "Normal",
                "kbind-konnector",
                "2026-12-03T12:00:00.000000Z",
                "not a warning",
            ),
            event(
                "ForeignObjectExists",
                "Warning",
                "kbind-konnector",
                "2026-12-03T12:00:00.000000Z",
                "a conflict",
            ),
        ];
        let rejected =
            json!({ "state": "Rejected", "message": "too big", "since": "2026-12-03T09:00:00Z" });
        let standing = last_refusal(Some(&rejected), &events).unwrap();
        assert_eq!(
            (
                standing.state.as_str(),
                standing.message.as_str(),
                standing.source.as_str()
            ),
            ("Rejected", "too big", "record")
        );
        let synced = json!({ "state": "Synced", "generation": 3 });
        let past = last_refusal(Some(&synced), &events).unwrap();
        assert_eq!(
            (
                past.state.as_str(),
                past.message.as_str(),
                past.source.as_str()
            ),
            ("Forbidden", "newest", "event")
        );
        assert_eq!(past.time.as_deref(), Some("2026-12-03T11:00:00Z"));
        assert_eq!(last_refusal(None, &events[2..]), None);
        assert_eq!(last_refusal(Some(&synced), &[]), None);
    }
}
