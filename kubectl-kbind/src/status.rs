//! `kubectl kbind status`: every Connection, binding and bound API on one screen. Object counts,
//! delivery and lag come from the objects themselves — each one's `status.kbindSync` record and
//! the times the API servers stamped in `managedFields` — so the answer needs no access to kbind's
//! pods or metrics.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kbind_shared::api::{Binding, ClusterBinding, Connection};
use kbind_shared::conditions::{self, types};
use kbind_shared::{delivery, keys};
use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use serde_json::Value;

use crate::view::{self, cell};

/// The whole report.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Every Connection.
    pub connections: Vec<ConnectionRow>,
    /// Every ClusterBinding, then every Binding.
    pub bindings: Vec<BindingRow>,
    /// Every API kbind serves on this cluster (a CRD it marks), with its objects.
    pub apis: Vec<ApiRow>,
    /// The routing table (#36): per API served by several Connections, each route and the
    /// objects on it.
    pub routes: Vec<RouteRow>,
}

/// One route of an API (or `connection` "-": the objects on no route, held by routing).
#[derive(Debug, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RouteRow {
    pub api: String,
    pub connection: String,
    /// This Connection serves the consumer CRD (the route objects without a pin are on).
    pub serves: bool,
    /// The bindings offering it (`ClusterBinding/<name>`, `Binding/<ns>/<name>`), each with its
    /// selector (`*`: every object).
    pub bindings: Vec<String>,
    /// Whether its schema agrees with the served one (a binding's status says so).
    pub schema_agrees: bool,
    /// Objects pinned to it (or whose copy it holds, when unpinned).
    pub objects: u64,
    /// Of those, the ones routing holds or reports (AmbiguousRoute, NoRoute, RouteChanged,
    /// SchemaMismatch).
    pub held: u64,
    /// Copies it still holds of objects pinned elsewhere: moves under way.
    pub moving_out: u64,
}

impl Report {
    /// Objects the provider rejected or forbade, over every bound API (#33.7: `status` exits 1
    /// while there are any).
    pub fn refused(&self) -> u64 {
        self.apis.iter().map(|a| a.rejected + a.forbidden).sum()
    }
}

/// One Connection.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionRow {
    pub name: String,
    pub ready: String,
    pub reason: String,
    pub message: String,
    pub provider_cluster_uid: String,
    pub schema_source: String,
    pub exported_apis: usize,
    pub missing_exports: usize,
}

/// One binding.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BindingRow {
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    pub connection: String,
    pub ready: String,
    pub reason: String,
    pub apis: Vec<BindingApi>,
    /// Instances in conflict with provider objects, and related resources in conflict.
    pub conflicts: i64,
}

/// One API a binding lists.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BindingApi {
    pub name: String,
    pub bound: bool,
    pub reason: String,
}

/// One API kbind serves, and how its objects stand.
#[derive(Debug, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ApiRow {
    pub api: String,
    pub connection: String,
    pub objects: u64,
    pub synced: u64,
    pub pending: u64,
    pub conflicts: u64,
    pub rejected: u64,
    pub forbidden: u64,
    /// Held by the user: their annotation, or a suspended binding (not waiting on kbind).
    pub paused: u64,
    /// In no binding's scope (e.g. a namespace no Binding covers): not kbind's to sync.
    pub not_bound: u64,
    /// How long the oldest change not delivered yet has waited.
    pub oldest_pending_seconds: Option<u64>,
    /// Change to delivery, over every object's last delivery: the median and the largest.
    pub lag_p50_seconds: Option<u64>,
    pub lag_max_seconds: Option<u64>,
    /// Why the objects could not be counted, if they could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Where one consumer object stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Its current generation reached the provider.
    Synced,
    /// Not yet delivered.
    Pending,
    /// The provider object is not kbind's (conflict annotation).
    Conflict,
    /// The provider refused the current spec.
    Rejected,
    /// kbind's credential may not write it.
    Forbidden,
    /// The user paused it (its record says so).
    Paused,
    /// No binding covers it.
    NotBound,
}

/// One object, classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectView {
    pub delivery: Delivery,
    /// For an object not synced: how long since its last change.
    pub waiting: Option<u64>,
    /// For a synced object: from its last change to its delivery.
    pub lag: Option<u64>,
}

/// When the object's spec last changed ([`delivery::changed_at`]: the API server's record).
fn changed_at(object: &DynamicObject) -> Option<String> {
    delivery::changed_at(&object.metadata).map(|t| t.0.to_string())
}

/// Classifies one object; `bound` says whether a binding covers it.
pub fn object_view(object: &DynamicObject, bound: bool, now: jiff::Timestamp) -> ObjectView {
    let record = delivery::record_of(object.data.get("status"));
    let field = |key: &str| record.and_then(|r| r.get(key));
    let state = field("state").and_then(Value::as_str).unwrap_or_default();
    let delivered = field("generation").and_then(Value::as_i64);
    let changed = changed_at(object);
    let since_change = changed.as_deref().and_then(|t| view::seconds_since(t, now));
    let conflict = object
        .annotations()
        .get(keys::CONFLICT_ANNOTATION)
        .is_some_and(|v| !v.is_empty());
    let delivery = if !bound {
        Delivery::NotBound
    } else if conflict {
        Delivery::Conflict
    } else if state == delivery::REJECTED {
        Delivery::Rejected
    } else if state == delivery::FORBIDDEN {
        Delivery::Forbidden
    } else if state == delivery::PAUSED {
        Delivery::Paused
    } else if state == delivery::SYNCED
        && delivered.is_some()
        && delivered >= object.metadata.generation
    {
        Delivery::Synced
    } else {
        Delivery::Pending
    };
    let lag = match (delivery, changed, field("time").and_then(Value::as_str)) {
        (Delivery::Synced, Some(changed), Some(time)) => time
            .parse::<jiff::Timestamp>()
            .ok()
            .and_then(|t| view::seconds_since(&changed, t)),
        _ => None,
    };
    ObjectView {
        delivery,
        waiting: (!matches!(
            delivery,
            Delivery::Synced | Delivery::NotBound | Delivery::Paused
        ))
        .then_some(since_change)
        .flatten(),
        lag,
    }
}

/// Adds one object to an API's row; `lags` collects the delivery lags for [`finish`].
pub fn count(row: &mut ApiRow, lags: &mut Vec<u64>, object: ObjectView) {
    row.objects += 1;
    match object.delivery {
        Delivery::Synced => row.synced += 1,
        Delivery::Pending => row.pending += 1,
        Delivery::Conflict => row.conflicts += 1,
        Delivery::Rejected => row.rejected += 1,
        Delivery::Forbidden => row.forbidden += 1,
        Delivery::Paused => row.paused += 1,
        Delivery::NotBound => row.not_bound += 1,
    }
    if object.delivery == Delivery::Pending {
        row.oldest_pending_seconds = row.oldest_pending_seconds.max(object.waiting);
    }
    lags.extend(object.lag);
}

/// The lag figures of a row, from every object's lag.
pub fn finish(row: &mut ApiRow, mut lags: Vec<u64>) {
    lags.sort_unstable();
    row.lag_p50_seconds = lags.get(lags.len() / 2).copied();
    row.lag_max_seconds = lags.last().copied();
}

fn condition(conditions: &[Condition]) -> (String, String, String) {
    conditions::find(conditions, types::READY)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
        .unwrap_or_else(|| ("Unknown".into(), String::new(), String::new()))
}

fn connection_row(c: &Connection) -> ConnectionRow {
    let status = c.status.clone().unwrap_or_default();
    let (ready, reason, message) = condition(&status.conditions);
    ConnectionRow {
        name: c.name_any(),
        ready,
        reason,
        message,
        provider_cluster_uid: status.remote_cluster_uid,
        schema_source: status
            .active_schema_source
            .map(|s| format!("{s:?}"))
            .unwrap_or_default(),
        exported_apis: status.exported_apis.len(),
        missing_exports: status.missing_exports.len(),
    }
}

fn binding_row(
    kind: &str,
    namespace: Option<String>,
    name: String,
    spec: &kbind_shared::api::BindingSpec,
    status: Option<&kbind_shared::api::BindingStatus>,
) -> BindingRow {
    let status = status.cloned().unwrap_or_default();
    let (ready, reason, _) = condition(&status.conditions);
    let apis = spec
        .apis
        .iter()
        .map(|a| {
            let entry = status.apis.iter().find(|e| e.name == a.name);
            BindingApi {
                name: a.name.clone(),
                bound: entry.is_some_and(|e| e.bound),
                reason: entry.map(|e| e.reason.clone()).unwrap_or_default(),
            }
        })
        .collect();
    let conflicts = status
        .bound_apis
        .iter()
        .map(|b| i64::from(b.conflict_count))
        .sum::<i64>()
        + i64::from(status.related_conflict_count);
    BindingRow {
        kind: kind.into(),
        namespace,
        name,
        connection: spec.connection_ref.name.clone(),
        ready,
        reason,
        apis,
        conflicts,
    }
}

/// Reads everything the report shows from the consumer (lists only).
pub async fn gather(consumer: &Client) -> Result<Report, String> {
    let connections = Api::<Connection>::all(consumer.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| view::read_error("Connections", &e))?
        .items;
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
    let crds = Api::<CustomResourceDefinition>::all(consumer.clone())
        .list(&ListParams::default().labels(&format!("{}={}", keys::MANAGED_LABEL, keys::TRUE)))
        .await
        .map_err(|e| view::read_error("CustomResourceDefinitions", &e))?
        .items;
    let now = jiff::Timestamp::now();
    let mut apis = Vec::new();
    let mut routes = Vec::new();
    for crd in &crds {
        let connection = crd
            .annotations()
            .get(keys::CONNECTION_ANNOTATION)
            .cloned()
            .unwrap_or_default();
        let mut row = ApiRow {
            api: crd.name_any(),
            connection: connection.clone(),
            ..Default::default()
        };
        match api_objects(
            consumer,
            crd,
            now,
            &connection,
            &cluster_bindings,
            &bindings,
        )
        .await
        {
            Ok((counted, lags, placed)) => {
                routes.extend(route_rows(
                    &row.api,
                    &connection,
                    (&connections, &cluster_bindings, &bindings),
                    placed,
                ));
                row = ApiRow {
                    api: row.api,
                    connection: row.connection,
                    ..counted
                };
                finish(&mut row, lags);
            }
            Err(message) => row.error = Some(message),
        }
        apis.push(row);
    }
    let mut rows: Vec<BindingRow> = cluster_bindings
        .iter()
        .map(|b| {
            binding_row(
                "ClusterBinding",
                None,
                b.name_any(),
                &b.spec.binding,
                b.status.as_ref(),
            )
        })
        .collect();
    rows.extend(bindings.iter().map(|b| {
        binding_row(
            "Binding",
            b.namespace(),
            b.name_any(),
            &b.spec,
            b.status.as_ref(),
        )
    }));
    Ok(Report {
        connections: connections.iter().map(connection_row).collect(),
        bindings: rows,
        apis,
        routes,
    })
}

/// Where one API's objects are, by route: `(connection, objects, held, moving out)`.
type Placed = BTreeMap<String, (u64, u64, u64)>;

/// Adds one object to `placed` (its pin, its finalizers, its conflict annotation).
pub fn place(placed: &mut Placed, served_by: &str, object: &DynamicObject) {
    let (target, elsewhere) = kbind_shared::routing::placement(
        served_by,
        object
            .annotations()
            .get(keys::ROUTE_ANNOTATION)
            .map(String::as_str),
        object.finalizers(),
    );
    let held = object
        .annotations()
        .get(keys::CONFLICT_ANNOTATION)
        .and_then(|r| kbind_shared::routing::Reason::parse(r))
        .is_some();
    match target {
        Some(connection) => {
            let entry = placed.entry(connection).or_default();
            entry.0 += 1;
            entry.1 += u64::from(held);
        }
        None if held => {
            let entry = placed.entry("-".to_owned()).or_default();
            entry.0 += 1;
            entry.1 += 1;
        }
        None => {}
    }
    for connection in elsewhere {
        placed.entry(connection).or_default().2 += 1;
    }
}

/// The routing table of one API: a row per route that bindings offer or objects are on — only
/// when the API has more than one (or objects on no route); else nothing.
pub fn route_rows(
    api: &str,
    served_by: &str,
    (connections, cluster_bindings, bindings): (&[Connection], &[ClusterBinding], &[Binding]),
    placed: Placed,
) -> Vec<RouteRow> {
    let offers = kbind_shared::resolve::offers(api, cluster_bindings, bindings, |name| {
        let c = connections.iter().find(|c| c.name_any() == name)?;
        let uid = c.status.as_ref()?.remote_cluster_uid.clone();
        Some((uid, c.spec.access.clone()))
    });
    let mut rows: BTreeMap<String, RouteRow> = BTreeMap::new();
    // Only what the syncer would route by: admitted offers (a refused binding routes nothing).
    for offer in offers.iter().filter(|o| o.admitted) {
        let row = rows
            .entry(offer.route.connection.clone())
            .or_insert_with(|| RouteRow {
                schema_agrees: true,
                ..Default::default()
            });
        let selector = offer
            .selector
            .as_ref()
            .map_or("*".to_owned(), ToString::to_string);
        let kind = if offer.namespace.is_some() {
            "Binding"
        } else {
            "ClusterBinding"
        };
        row.bindings
            .push(format!("{kind}/{} ({selector})", offer.binding));
        row.schema_agrees &= offer.schema == kbind_shared::routing::Schema::Agrees;
    }
    for (connection, (objects, held, moving_out)) in placed {
        let row = rows.entry(connection).or_insert_with(|| RouteRow {
            schema_agrees: true,
            ..Default::default()
        });
        (row.objects, row.held, row.moving_out) = (objects, held, moving_out);
    }
    let several = rows.keys().filter(|c| *c != "-").count() > 1 || rows.contains_key("-");
    if !several {
        return Vec::new();
    }
    rows.into_iter()
        .map(|(connection, row)| RouteRow {
            api: api.to_owned(),
            serves: connection == served_by,
            connection,
            ..row
        })
        .collect()
}

/// Counts an API's objects page by page (nothing kept but the counts and lags).
async fn api_objects(
    consumer: &Client,
    crd: &CustomResourceDefinition,
    now: jiff::Timestamp,
    connection: &str,
    cluster_bindings: &[ClusterBinding],
    bindings: &[Binding],
) -> Result<(ApiRow, Vec<u64>, Placed), String> {
    let resource = kbind_shared::dynamic::instance_resource(crd)
        .ok_or_else(|| "the CRD serves no version".to_owned())?;
    let api = crd.name_any();
    let objects = kbind_shared::dynamic::scoped(consumer, None, &resource);
    let mut row = ApiRow::default();
    let mut lags = Vec::new();
    let mut bound_in: BTreeMap<Option<String>, bool> = BTreeMap::new();
    let mut placed = Placed::new();
    view::for_each_object(&objects, &api, |object| {
        place(&mut placed, connection, object);
        let namespace = object.metadata.namespace.clone();
        let bound = *bound_in.entry(namespace.clone()).or_insert_with(|| {
            kbind_shared::resolve::resolve_served_by(
                connection,
                &api,
                namespace.as_deref(),
                cluster_bindings,
                bindings,
            )
            .is_some_and(|r| r.is_bound())
        });
        count(&mut row, &mut lags, object_view(object, bound, now));
    })
    .await?;
    Ok((row, lags, placed))
}

/// The report as three tables.
pub fn render(report: &Report) -> String {
    let mut out = String::from("CONNECTIONS\n");
    let rows: Vec<Vec<String>> = report
        .connections
        .iter()
        .map(|c| {
            vec![
                cell(&c.name),
                cell(&c.ready),
                cell(&c.reason),
                cell(&c.provider_cluster_uid),
                cell(&c.schema_source),
                c.exported_apis.to_string(),
                cell(&c.message),
            ]
        })
        .collect();
    out += &view::table(
        &[
            "NAME", "READY", "REASON", "PROVIDER", "SOURCE", "EXPORTED", "MESSAGE",
        ],
        &rows,
    );
    out += "\nBINDINGS\n";
    let rows: Vec<Vec<String>> = report
        .bindings
        .iter()
        .map(|b| {
            let apis: Vec<String> = b
                .apis
                .iter()
                .map(|a| match (a.bound, a.reason.as_str()) {
                    (true, _) => view::line(&a.name, 60),
                    (false, "") => format!("{} (not bound)", view::line(&a.name, 60)),
                    (false, why) => {
                        format!("{} ({})", view::line(&a.name, 60), view::line(why, 40))
                    }
                })
                .collect();
            vec![
                cell(&b.kind),
                cell(b.namespace.as_deref().unwrap_or_default()),
                cell(&b.name),
                cell(&b.connection),
                cell(&b.ready),
                cell(&b.reason),
                b.conflicts.to_string(),
                view::line(&apis.join(", "), 200),
            ]
        })
        .collect();
    out += &view::table(
        &[
            "KIND",
            "NAMESPACE",
            "NAME",
            "CONNECTION",
            "READY",
            "REASON",
            "CONFLICTS",
            "APIS",
        ],
        &rows,
    );
    out += "\nAPIS\n";
    let rows: Vec<Vec<String>> = report
        .apis
        .iter()
        .map(|a| {
            let mut row = vec![cell(&a.api), cell(&a.connection)];
            match &a.error {
                Some(error) => row.push(cell(error)),
                None => row.extend([
                    a.objects.to_string(),
                    a.synced.to_string(),
                    a.pending.to_string(),
                    a.conflicts.to_string(),
                    a.rejected.to_string(),
                    a.forbidden.to_string(),
                    a.paused.to_string(),
                    a.not_bound.to_string(),
                    view::maybe_age(a.oldest_pending_seconds),
                    view::maybe_age(a.lag_p50_seconds),
                    view::maybe_age(a.lag_max_seconds),
                ]),
            }
            row
        })
        .collect();
    out += &view::table(
        &[
            "API",
            "CONNECTION",
            "OBJECTS",
            "SYNCED",
            "PENDING",
            "CONFLICTS",
            "REJECTED",
            "FORBIDDEN",
            "PAUSED",
            "NOT-BOUND",
            "OLDEST-PENDING",
            "LAG-P50",
            "LAG-MAX",
        ],
        &rows,
    );
    if !report.routes.is_empty() {
        out += "\nROUTES\n";
        let rows: Vec<Vec<String>> = report
            .routes
            .iter()
            .map(|r| {
                vec![
                    cell(&r.api),
                    cell(&r.connection),
                    if r.serves { "yes" } else { "" }.to_owned(),
                    if r.schema_agrees {
                        "agrees"
                    } else {
                        "MISMATCH"
                    }
                    .to_owned(),
                    r.objects.to_string(),
                    r.held.to_string(),
                    r.moving_out.to_string(),
                    view::line(&r.bindings.join(", "), 200),
                ]
            })
            .collect();
        out += &view::table(
            &[
                "API",
                "ROUTE",
                "SERVES-CRD",
                "SCHEMA",
                "OBJECTS",
                "HELD",
                "MOVING-OUT",
                "BINDINGS",
            ],
            &rows,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(generation: i64, record: Value, annotations: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "example.org/v1",
            "kind": "Widget",
            "metadata": {
                "name": "w",
                "namespace": "ns",
                "generation": generation,
                "creationTimestamp": "2026-12-01T00:00:00Z",
                "annotations": annotations,
                "managedFields": [
                    { "manager": "kubectl", "operation": "Update", "time": "2026-12-01T00:00:10Z",
                      "fieldsType": "FieldsV1", "fieldsV1": { "f:spec": { "f:size": {} } } },
                    { "manager": keys::FIELD_MANAGER, "operation": "Apply", "time": "2026-12-01T00:00:50Z",
                      "fieldsType": "FieldsV1", "fieldsV1": { "f:metadata": { "f:finalizers": {} } } },
                    { "manager": "kubectl", "operation": "Update", "subresource": "status", "time": "2026-12-01T00:00:55Z",
                      "fieldsType": "FieldsV1", "fieldsV1": { "f:status": { "f:spec": {} } } },
                ],
            },
            "status": { "kbindSync": record },
        }))
        .unwrap()
    }

    #[test]
    fn each_object_says_where_it_stands() {
        let now: jiff::Timestamp = "2026-12-01T00:01:10Z".parse().unwrap();
        let synced = json!({"state": "Synced", "generation": 2, "time": "2026-12-01T00:00:12Z"});
        let none = json!({});
        let conflict = json!({ keys::CONFLICT_ANNOTATION: keys::CONFLICT_FOREIGN });
        for (generation, record, annotations, bound, want) in [
            (
                2,
                synced.clone(),
                none.clone(),
                true,
                (Delivery::Synced, None, Some(2)),
            ),
            // A newer generation than the one delivered waits since the user's change (00:00:10).
            (
                3,
                synced.clone(),
                none.clone(),
                true,
                (Delivery::Pending, Some(60), None),
            ),
            (
                1,
                json!(null),
                none.clone(),
                true,
                (Delivery::Pending, Some(60), None),
            ),
            (
                2,
                synced.clone(),
                conflict,
                true,
                (Delivery::Conflict, Some(60), None),
            ),
            (
                3,
                json!({"state": "Rejected", "generation": 2, "message": "no"}),
                none.clone(),
                true,
                (Delivery::Rejected, Some(60), None),
            ),
            (
                3,
                json!({"state": "Forbidden", "message": "no"}),
                none.clone(),
                true,
                (Delivery::Forbidden, Some(60), None),
            ),
            (
                2,
                synced.clone(),
                none.clone(),
                false,
                (Delivery::NotBound, None, None),
            ),
            (
                3,
                json!({"state": "Paused", "generation": 2, "message": "held"}),
                none.clone(),
                true,
                (Delivery::Paused, None, None),
            ),
        ] {
            let seen = object_view(&object(generation, record.clone(), annotations), bound, now);
            assert_eq!(
                (seen.delivery, seen.waiting, seen.lag),
                want,
                "generation {generation}, record {record}, bound {bound}"
            );
        }
    }

    #[test]
    fn an_object_without_managed_fields_counts_from_its_creation() {
        let now: jiff::Timestamp = "2026-12-01T00:00:30Z".parse().unwrap();
        let mut o = object(1, json!(null), json!({}));
        o.metadata.managed_fields = None;
        assert_eq!(object_view(&o, true, now).waiting, Some(30));
    }

    #[test]
    fn rows_count_every_state_and_the_lag_figures() {
        let mut row = ApiRow::default();
        let mut lags = Vec::new();
        let view = |delivery, waiting, lag| ObjectView {
            delivery,
            waiting,
            lag,
        };
        for object in [
            view(Delivery::Synced, None, Some(1)),
            view(Delivery::Synced, None, Some(5)),
            view(Delivery::Synced, None, Some(2)),
            view(Delivery::Pending, Some(30), None),
            view(Delivery::Pending, Some(90), None),
            view(Delivery::Conflict, Some(500), None),
            view(Delivery::Rejected, Some(7), None),
            view(Delivery::Forbidden, Some(7), None),
            view(Delivery::NotBound, None, None),
            view(Delivery::Paused, None, None),
        ] {
            count(&mut row, &mut lags, object);
        }
        finish(&mut row, lags);
        assert_eq!(
            row,
            ApiRow {
                objects: 10,
                synced: 3,
                pending: 2,
                conflicts: 1,
                rejected: 1,
                forbidden: 1,
                paused: 1,
                not_bound: 1,
                oldest_pending_seconds: Some(90),
                lag_p50_seconds: Some(2),
                lag_max_seconds: Some(5),
                ..Default::default()
            }
        );
    }

    #[test]
    fn the_text_view_never_carries_control_characters() {
        let report = Report {
            connections: vec![ConnectionRow {
                name: "c".into(),
                ready: "False".into(),
                reason: "Bad".into(),
                message: "a\u{1b}[2Jb\nc".into(),
                provider_cluster_uid: String::new(),
                schema_source: String::new(),
                exported_apis: 0,
                missing_exports: 0,
            }],
            bindings: Vec::new(),
            apis: Vec::new(),
            routes: vec![RouteRow {
                api: "w.x".into(),
                connection: "q".into(),
                bindings: vec!["ClusterBinding/x\u{7}y (*)".into()],
                ..Default::default()
            }],
        };
        let text = render(&report);
        assert!(text.contains("ROUTES"), "{text}");
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{text:?}"
        );
        assert!(text.contains("a [2Jb c"), "{text}");
    }

    #[test]
    fn the_routing_table_counts_each_object_on_its_route_and_moves_on_the_old_one() {
        let o = |annotations: Value, finalizers: Value| {
            serde_json::from_value::<DynamicObject>(json!({
                "apiVersion": "x/v1", "kind": "W",
                "metadata": { "name": "o", "namespace": "a", "annotations": annotations, "finalizers": finalizers },
            }))
            .unwrap()
        };
        let route = kbind_shared::routing::finalizer("q", "p");
        let mut placed = Placed::new();
        for object in [
            o(json!({}), json!([keys::SYNCER_FINALIZER])),
            o(
                json!({ keys::ROUTE_ANNOTATION: "p/u1" }),
                json!([keys::SYNCER_FINALIZER]),
            ),
            o(json!({ keys::ROUTE_ANNOTATION: "q/u2" }), json!([route])),
            o(
                json!({ keys::ROUTE_ANNOTATION: "q/u2", keys::CONFLICT_ANNOTATION: "RouteChanged" }),
                json!([route]),
            ),
            // Moving from p to q: counted on q, and as moving out of p.
            o(
                json!({ keys::ROUTE_ANNOTATION: "q" }),
                json!([keys::SYNCER_FINALIZER]),
            ),
            o(
                json!({ keys::CONFLICT_ANNOTATION: "AmbiguousRoute" }),
                json!([]),
            ),
            // Not kbind's business at all.
            o(
                json!({ keys::CONFLICT_ANNOTATION: "ForeignObjectExists" }),
                json!([]),
            ),
        ] {
            place(&mut placed, "p", &object);
        }
        let rows = route_rows("w.x", "p", (&[], &[], &[]), placed);
        let got: Vec<(&str, bool, u64, u64, u64)> = rows
            .iter()
            .map(|r| {
                (
                    r.connection.as_str(),
                    r.serves,
                    r.objects,
                    r.held,
                    r.moving_out,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("-", false, 1, 1, 0),
                ("p", true, 2, 0, 1),
                ("q", false, 3, 1, 0)
            ]
        );
        // One route and nothing held: no table.
        let mut single = Placed::new();
        place(
            &mut single,
            "p",
            &o(json!({}), json!([keys::SYNCER_FINALIZER])),
        );
        assert!(route_rows("w.x", "p", (&[], &[], &[]), single).is_empty());
    }
}
