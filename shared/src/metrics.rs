//! kbind's Prometheus metrics (INTERFACES.md, "Metrics"). One [`Metrics`] per process, registered
//! in its own registry and served at `/metrics`.

use prometheus::{
    Encoder, Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry,
    TextEncoder,
};

/// One registered metric family, as its collector describes itself to the registry: what
/// `/metrics` can serve (a family with no series yet is left out of a scrape, not of this).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Family {
    /// The series name (a histogram's `_bucket`, `_sum` and `_count` derive from it).
    pub name: String,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// The HELP text.
    pub help: String,
    /// The label names every series of it carries.
    pub labels: Vec<String>,
}

/// Registers collectors and keeps their descriptions.
struct Registrar {
    registry: Registry,
    families: std::cell::RefCell<Vec<Family>>,
}

impl Registrar {
    #[allow(
        clippy::expect_used,
        reason = "static definitions, unique by construction; every process builds them at start and the unit tests render them"
    )]
    fn add<C: prometheus::core::Collector + Clone + 'static>(
        &self,
        collector: C,
        kind: &'static str,
    ) -> C {
        for desc in collector.desc() {
            self.families.borrow_mut().push(Family {
                name: desc.fq_name.clone(),
                kind,
                help: desc.help.clone(),
                labels: desc.variable_labels.clone(),
            });
        }
        self.registry
            .register(Box::new(collector.clone()))
            .expect("unique metric");
        collector
    }
}

/// Every metric either program exports. Families a program never touches stay empty.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    families: std::sync::Arc<Vec<Family>>,
    /// `kbind_connection_ready{connection}`
    pub connection_ready: GaugeVec,
    /// `kbind_connection_exported_apis{connection}`
    pub connection_exported_apis: GaugeVec,
    /// `kbind_binding_ready{namespace,name}`
    pub binding_ready: GaugeVec,
    /// `kbind_synced_objects{api}`
    pub synced_objects: GaugeVec,
    /// `kbind_conflicts{api}`
    pub conflicts: GaugeVec,
    /// `kbind_paused_objects{api}`
    pub paused_objects: GaugeVec,
    /// `kbind_route_objects{connection,api,state}`: objects per route (#36) — synced, conflict
    /// or paused on the route of `connection` (every API has at least the route of the
    /// Connection serving it).
    pub route_objects: GaugeVec,
    /// `kbind_bindings_past_cap{namespace}`: a namespace's Bindings past
    /// `--max-bindings-per-namespace` (only namespaces that have some), which the syncer ignores.
    pub bindings_past_cap: GaugeVec,
    /// `kbind_sync_operations_total{api,op,result}`
    pub sync_operations_total: IntCounterVec,
    /// `kbind_provider_events_total{api,result}`
    pub provider_events_total: IntCounterVec,
    /// `kbind_sync_latency_seconds{op}`
    pub sync_latency_seconds: HistogramVec,
    /// `kbind_work_queue_depth{api}`
    pub work_queue_depth: GaugeVec,
    /// `kbind_imported_objects{api,state}`: provider objects observe-first import mirrors
    /// (`observed`) and leaves out past a binding's limit (`over_limit`)
    pub imported_objects: GaugeVec,
    /// `kbind_api_requests_total{cluster,verb,code}`
    pub api_requests_total: IntCounterVec,
    /// `kbind_syncer_assigned_apis{identity}`
    pub syncer_assigned_apis: GaugeVec,
    /// `kbind_syncer_assigned_units{identity}`
    pub syncer_assigned_units: GaugeVec,
    /// `kbind_leader`
    pub leader: Gauge,
    /// `kbind_reconcile_errors_total{controller,reason}`: failed reconciles by controller
    /// (`connection`, `clusterbinding`, `binding`, `sync`) and the error's `metric_label()`
    pub reconcile_errors_total: IntCounterVec,
    /// `kbind_assignment_overlaps`: units more than one live syncer reports running (must be 0)
    pub assignment_overlaps: Gauge,
    /// `kbind_assignment_unassigned_units`: work units left out because the assignment is full,
    /// and bindings' related resources not admitted (off, or past a namespace's cap)
    pub assignment_unassigned_units: Gauge,
    /// `kbind_sync_lag_seconds{connection,api,op}`: from a change (the earlier of its watch event
    /// and the API server's record of it, to the second) to the write that delivered it (spec up: consumer change → provider copy written; status
    /// down: provider status → consumer status written; delete: deletion seen → provider copy
    /// gone and the finalizer released)
    pub sync_lag_seconds: HistogramVec,
    /// `kbind_sync_backlog{connection,api,state}`: objects waiting for kbind — their current spec
    /// not delivered (`pending`), refused and retried (`rejected`, `forbidden`), a deletion in
    /// progress (`deleting`), a provider status not copied down (`status`) — read off the objects
    pub sync_backlog: GaugeVec,
    /// `kbind_sync_backlog_oldest_seconds{connection,api}`: how long the oldest of them has waited,
    /// from its change as the API server recorded it
    pub sync_backlog_oldest_seconds: GaugeVec,
    /// `kbind_delivery_record_wait_seconds{connection,api}`: how long a delivery record waits for
    /// the provider's status change to carry it, learned from the provider's recent answers
    pub delivery_record_wait_seconds: GaugeVec,
    /// `kbind_connection_heartbeat_age_seconds{connection}`: since the heartbeat Lease on the
    /// provider was last renewed (computed when scraped)
    pub connection_heartbeat_age_seconds: GaugeVec,
    /// `kbind_reaper_consumers{policy,state}` (kbind-reaper, on a provider): consumers by state
    /// at the last sweep
    pub reaper_consumers: GaugeVec,
    /// `kbind_reaper_objects_total{policy,api,action}` (kbind-reaper): objects it deleted or
    /// orphaned, and Grants it revoked (the API server accepted the write)
    pub reaper_objects_total: IntCounterVec,
    /// `kbind_reaper_last_sweep_timestamp_seconds{policy}` (kbind-reaper): the provider API
    /// server's time of the last complete sweep
    pub reaper_last_sweep_timestamp_seconds: GaugeVec,
    /// `kbind_gateway_requests_total{endpoint,code}` (kbind-gateway, on a provider): answers by
    /// endpoint (`provider`, `catalog`, `bind`, `pickup`, `login`, `callback`, `session`) and
    /// HTTP status code
    pub gateway_requests_total: IntCounterVec,
    /// `kbind_gateway_request_seconds{endpoint}` (kbind-gateway): how long each answer took
    pub gateway_request_seconds: HistogramVec,
    heartbeats:
        std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates the series of `counter` for each value of its last label, at 0, under `first`:
    /// an operator's query sees 0 from the start, not "no data" until the first event.
    pub fn init_counters(counter: &IntCounterVec, first: &str, values: &[&str]) {
        for value in values {
            counter.with_label_values(&[first, value]);
        }
    }

    /// A fresh registry with every kbind metric in it.
    #[allow(
        clippy::expect_used,
        reason = "static definitions, valid and unique by construction; every process builds them at start and the unit tests render them"
    )]
    pub fn new() -> Self {
        let registry = Registrar {
            registry: Registry::new(),
            families: Default::default(),
        };
        fn gauge_vec(registry: &Registrar, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
            registry.add(
                GaugeVec::new(Opts::new(name, help), labels).expect("valid metric"),
                "gauge",
            )
        }
        fn counter_vec(
            registry: &Registrar,
            name: &str,
            help: &str,
            labels: &[&str],
        ) -> IntCounterVec {
            registry.add(
                IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
                "counter",
            )
        }
        let sync_latency_seconds = HistogramVec::new(
            HistogramOpts::new(
                "kbind_sync_latency_seconds",
                "End-to-end delay from a change to the write that delivered it, by operation only",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ]),
            &["op"],
        )
        .expect("valid metric");
        let sync_latency_seconds = registry.add(sync_latency_seconds, "histogram");
        let sync_lag_seconds = HistogramVec::new(
            HistogramOpts::new(
                "kbind_sync_lag_seconds",
                "End-to-end delay from a change to the write that delivered it, per Connection, API and operation",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
            ]),
            &["connection", "api", "op"],
        )
        .expect("valid metric");
        let sync_lag_seconds = registry.add(sync_lag_seconds, "histogram");
        let assignment_overlaps = Gauge::new(
            "kbind_assignment_overlaps",
            "Work units more than one live syncer reports running (must stay 0)",
        )
        .expect("valid metric");
        let assignment_overlaps = registry.add(assignment_overlaps, "gauge");
        let assignment_unassigned_units = Gauge::new(
            "kbind_assignment_unassigned_units",
            "Work units left unassigned: the assignment is full, or a binding's related resources are not admitted",
        )
        .expect("valid metric");
        let assignment_unassigned_units = registry.add(assignment_unassigned_units, "gauge");
        let gateway_request_seconds = HistogramVec::new(
            HistogramOpts::new(
                "kbind_gateway_request_seconds",
                "How long the gateway took to answer, by endpoint (a bind includes the issuer issuing its Grant)",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ]),
            &["endpoint"],
        )
        .expect("valid metric");
        let gateway_request_seconds = registry.add(gateway_request_seconds, "histogram");
        let leader = Gauge::new(
            "kbind_leader",
            "1 while this schema manager holds the leader Lease",
        )
        .expect("valid metric");
        let leader = registry.add(leader, "gauge");

        Self {
            connection_ready: gauge_vec(
                &registry,
                "kbind_connection_ready",
                "1 when the Connection is Ready",
                &["connection"],
            ),
            connection_exported_apis: gauge_vec(
                &registry,
                "kbind_connection_exported_apis",
                "APIs the Connection's provider exports",
                &["connection"],
            ),
            binding_ready: gauge_vec(
                &registry,
                "kbind_binding_ready",
                "1 when the binding is Ready",
                &["namespace", "name"],
            ),
            synced_objects: gauge_vec(
                &registry,
                "kbind_synced_objects",
                "Objects in sync with the provider",
                &["api"],
            ),
            conflicts: gauge_vec(
                &registry,
                "kbind_conflicts",
                "Objects with a recorded conflict",
                &["api"],
            ),
            paused_objects: gauge_vec(
                &registry,
                "kbind_paused_objects",
                "Objects kbind leaves alone: paused by their annotation or a suspended binding",
                &["api"],
            ),
            route_objects: gauge_vec(
                &registry,
                "kbind_route_objects",
                "Objects per route (#36: several Connections serving one API)",
                &["connection", "api", "state"],
            ),
            bindings_past_cap: gauge_vec(
                &registry,
                "kbind_bindings_past_cap",
                "Bindings of a namespace past --max-bindings-per-namespace: they bind nothing",
                &["namespace"],
            ),
            sync_operations_total: counter_vec(
                &registry,
                "kbind_sync_operations_total",
                "Writes by operation and outcome",
                &["api", "op", "result"],
            ),
            provider_events_total: counter_vec(
                &registry,
                "kbind_provider_events_total",
                "Provider Events about synced objects' copies that a binding asked for, by what kbind did with them",
                &["api", "result"],
            ),
            sync_latency_seconds,
            work_queue_depth: gauge_vec(
                &registry,
                "kbind_work_queue_depth",
                "Syncs in progress right now",
                &["api"],
            ),
            imported_objects: gauge_vec(
                &registry,
                "kbind_imported_objects",
                "Provider objects imported and observed, and left out past an import limit",
                &["api", "state"],
            ),
            reconcile_errors_total: counter_vec(
                &registry,
                "kbind_reconcile_errors_total",
                "Failed reconciles by controller and reason",
                &["controller", "reason"],
            ),
            api_requests_total: counter_vec(
                &registry,
                "kbind_api_requests_total",
                "Requests to each API server",
                &["cluster", "verb", "code"],
            ),
            syncer_assigned_apis: gauge_vec(
                &registry,
                "kbind_syncer_assigned_apis",
                "APIs (of a Connection) a syncer runs, wholly or some of their namespace buckets",
                &["identity"],
            ),
            syncer_assigned_units: gauge_vec(
                &registry,
                "kbind_syncer_assigned_units",
                "Work units a syncer runs: APIs, namespace buckets, bindings' related resources",
                &["identity"],
            ),
            sync_backlog: gauge_vec(
                &registry,
                "kbind_sync_backlog",
                "Objects waiting for kbind by state",
                &["connection", "api", "state"],
            ),
            sync_backlog_oldest_seconds: gauge_vec(
                &registry,
                "kbind_sync_backlog_oldest_seconds",
                "How long the oldest object waiting for kbind has waited, from its change as the API server recorded it",
                &["connection", "api"],
            ),
            delivery_record_wait_seconds: gauge_vec(
                &registry,
                "kbind_delivery_record_wait_seconds",
                "How long a delivery record waits for the provider's status change to carry it in one write",
                &["connection", "api"],
            ),
            connection_heartbeat_age_seconds: gauge_vec(
                &registry,
                "kbind_connection_heartbeat_age_seconds",
                "Seconds since the heartbeat Lease on the Connection's provider was last renewed",
                &["connection"],
            ),
            reaper_consumers: gauge_vec(
                &registry,
                "kbind_reaper_consumers",
                "Consumers of this provider by state at the reaper's last sweep",
                &["policy", "state"],
            ),
            reaper_objects_total: counter_vec(
                &registry,
                "kbind_reaper_objects_total",
                "Objects of dead consumers the reaper deleted or orphaned, and Grants it revoked, by API and action",
                &["policy", "api", "action"],
            ),
            reaper_last_sweep_timestamp_seconds: gauge_vec(
                &registry,
                "kbind_reaper_last_sweep_timestamp_seconds",
                "The provider API server's time of the reaper's last complete sweep",
                &["policy"],
            ),
            gateway_requests_total: counter_vec(
                &registry,
                "kbind_gateway_requests_total",
                "The gateway's answers by endpoint and HTTP status code",
                &["endpoint", "code"],
            ),
            gateway_request_seconds,
            heartbeats: Default::default(),
            sync_lag_seconds,
            leader,
            assignment_overlaps,
            assignment_unassigned_units,
            families: std::sync::Arc::new(registry.families.into_inner()),
            registry: registry.registry,
        }
    }

    /// The heartbeat Lease of `connection` was renewed just now.
    pub fn heartbeat_renewed(&self, connection: &str) {
        if let Ok(mut heartbeats) = self.heartbeats.lock() {
            heartbeats.insert(connection.to_owned(), std::time::Instant::now());
        }
    }

    /// Drops every series about `connection` (it is gone).
    pub fn forget_connection(&self, connection: &str) {
        if let Ok(mut heartbeats) = self.heartbeats.lock() {
            heartbeats.remove(connection);
        }
        for gauge in [
            &self.connection_ready,
            &self.connection_exported_apis,
            &self.connection_heartbeat_age_seconds,
        ] {
            let _ = gauge.remove_label_values(&[connection]);
        }
    }

    /// Drops what only the leader knows (Connection and binding readiness, heartbeats): a
    /// schema manager that stops leading exports none of it, so dashboards read the leader's.
    pub fn forget_leader_state(&self) {
        if let Ok(mut heartbeats) = self.heartbeats.lock() {
            heartbeats.clear();
        }
        self.connection_ready.reset();
        self.connection_exported_apis.reset();
        self.connection_heartbeat_age_seconds.reset();
        self.binding_ready.reset();
    }

    /// Every registered family (name, type, HELP, labels), as the collectors describe
    /// themselves to the registry.
    pub fn families(&self) -> &[Family] {
        &self.families
    }

    /// The registry in Prometheus text format.
    pub fn render(&self) -> String {
        if let Ok(heartbeats) = self.heartbeats.lock() {
            for (connection, renewed) in heartbeats.iter() {
                self.connection_heartbeat_age_seconds
                    .with_label_values(&[connection.as_str()])
                    .set(renewed.elapsed().as_secs_f64());
            }
        }
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %e, "cannot render the metrics");
            return format!("# kbind: cannot render the metrics: {e}\n");
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn repository_file(path: &str) -> String {
        std::fs::read_to_string(format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"))).unwrap()
    }

    /// `text` without its parenthesised parts.
    fn outside_parentheses(text: &str) -> String {
        let mut depth = 0usize;
        text.chars()
            .filter(|c| {
                match c {
                    '(' => depth += 1,
                    ')' => depth = depth.saturating_sub(1),
                    _ => return depth == 0,
                }
                false
            })
            .collect()
    }

    fn backticked(text: &str) -> Vec<String> {
        text.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    }

    /// The Metrics table (`docs/operations.md`): series → (type, labels).
    fn documented() -> BTreeMap<String, (String, BTreeSet<String>)> {
        let readme = repository_file("docs/operations.md");
        let start = readme.find("\n## Metrics").unwrap();
        let section = &readme[start..];
        let section = &section[..section.find("\n### ").unwrap()];
        let mut out = BTreeMap::new();
        for row in section.lines().filter(|l| l.starts_with("| `kbind_")) {
            // `| series | type | labels | program | what it answers |`
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let kind = cells[2].split_whitespace().next().unwrap().to_owned();
            let labels: BTreeSet<String> = backticked(&outside_parentheses(cells[3]))
                .into_iter()
                .collect();
            for name in backticked(cells[1]) {
                out.insert(name, (kind.clone(), labels.clone()));
            }
        }
        out
    }

    #[test]
    fn the_readme_documents_exactly_what_the_registry_serves() {
        // #33.9: names, types and labels come from the registry, not from prose.
        let metrics = Metrics::new();
        let served: BTreeMap<String, (String, BTreeSet<String>)> = metrics
            .families()
            .iter()
            .map(|f| {
                (
                    f.name.clone(),
                    (f.kind.to_owned(), f.labels.iter().cloned().collect()),
                )
            })
            .collect();
        assert_eq!(documented(), served);
        assert!(metrics.families().iter().all(|f| !f.help.is_empty()));
    }

    /// `text` as prose: lower case, without markdown emphasis or code marks, single-spaced.
    fn prose(text: &str) -> String {
        text.replace("**", "")
            .replace('`', "")
            .to_lowercase()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn each_help_text_is_what_the_readme_says_of_its_series() {
        // #33.9: `# HELP` is what a scraper shows; it says what the documented row says.
        let readme = repository_file("docs/operations.md");
        let start = readme.find("\n## Metrics").unwrap();
        let section = &readme[start..];
        let section = &section[..section.find("\n### ").unwrap()];
        let mut described: BTreeMap<String, String> = BTreeMap::new();
        for row in section.lines().filter(|l| l.starts_with("| `kbind_")) {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            for name in backticked(cells[1]) {
                described.insert(name, prose(cells[5]));
            }
        }
        let mismatched: Vec<String> = Metrics::new()
            .families()
            .iter()
            .filter(|f| {
                described
                    .get(&f.name)
                    .is_none_or(|d| !d.contains(&prose(&f.help)))
            })
            .map(|f| {
                format!(
                    "{}: {:?} not in {:?}",
                    f.name,
                    f.help,
                    described.get(&f.name)
                )
            })
            .collect();
        assert!(mismatched.is_empty(), "{mismatched:#?}");
    }

    #[test]
    fn the_dashboard_reads_only_registered_series_by_labels_they_carry() {
        // #33.9: every series a panel reads is registered, and every label it filters on is one
        // the series carries (a filter on a label a series lacks would silently match nothing).
        let metrics = Metrics::new();
        let families: BTreeMap<&str, &Family> = metrics
            .families()
            .iter()
            .map(|f| (f.name.as_str(), f))
            .collect();
        let dashboard: serde_json::Value = serde_json::from_str(&repository_file(
            "deploy/charts/kbind/dashboards/kbind.json",
        ))
        .unwrap();
        let mut read = 0;
        for panel in dashboard["panels"].as_array().unwrap() {
            let title = panel["title"].as_str().unwrap_or_default();
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"].as_str().unwrap();
                let mut rest = expr;
                while let Some(at) = rest.find("kbind_") {
                    let tail = &rest[at..];
                    let end = tail
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .unwrap_or(tail.len());
                    let series = &tail[..end];
                    let base = ["_bucket", "_sum", "_count"]
                        .iter()
                        .find_map(|suffix| {
                            series
                                .strip_suffix(suffix)
                                .filter(|b| families.get(b).is_some_and(|f| f.kind == "histogram"))
                        })
                        .unwrap_or(series);
                    let family = families
                        .get(base)
                        .unwrap_or_else(|| panic!("{series} (in {expr}) is not registered"));
                    read += 1;
                    // The Connection picker filters what can be filtered; a per-API series
                    // without the label says so in its panel's title instead of pretending.
                    if family.labels.iter().any(|l| l == "connection") {
                        assert!(
                            tail[end..].starts_with("{connection=~\"$connection\"")
                                || tail[end..].contains(",connection=~\"$connection\""),
                            "{expr} reads {series} without the Connection filter"
                        );
                    } else if family.labels.iter().any(|l| l == "api") {
                        assert!(
                            title.contains("(all Connections)"),
                            "panel {title:?} reads {series}, which has no connection label, without saying it covers all Connections"
                        );
                    }
                    let after = &tail[end..];
                    if let Some(matchers) = after.strip_prefix('{') {
                        let matchers = &matchers[..matchers.find('}').unwrap()];
                        for matcher in matchers.split(',').filter(|m| !m.trim().is_empty()) {
                            let label = matcher.split(['=', '!']).next().unwrap().trim();
                            assert!(
                                family.labels.iter().any(|l| l == label)
                                    || (label == "le" && family.kind == "histogram"),
                                "{expr} filters {series} on {label}, which it does not carry ({:?})",
                                family.labels
                            );
                        }
                    }
                    rest = &tail[end..];
                }
            }
        }
        assert!(read > 10, "the dashboard reads {read} series");
    }

    #[test]
    fn every_interface_metric_is_exported() {
        let m = Metrics::new();
        m.connection_ready.with_label_values(&["p"]).set(1.0);
        m.connection_exported_apis
            .with_label_values(&["p"])
            .set(2.0);
        m.binding_ready.with_label_values(&["", "b"]).set(1.0);
        m.synced_objects
            .with_label_values(&["widgets.example.org"])
            .set(1.0);
        m.conflicts
            .with_label_values(&["widgets.example.org"])
            .set(0.0);
        m.paused_objects
            .with_label_values(&["widgets.example.org"])
            .set(0.0);
        m.route_objects
            .with_label_values(&["p", "widgets.example.org", "synced"])
            .set(1.0);
        m.sync_operations_total
            .with_label_values(&["widgets.example.org", "spec_up", "ok"])
            .inc();
        m.bindings_past_cap.with_label_values(&["team-a"]).set(3.0);
        m.provider_events_total
            .with_label_values(&["widgets.example.org", "mirrored"])
            .inc();
        m.sync_latency_seconds
            .with_label_values(&["spec_up"])
            .observe(0.1);
        m.work_queue_depth
            .with_label_values(&["widgets.example.org"])
            .set(0.0);
        m.imported_objects
            .with_label_values(&["widgets.example.org", "observed"])
            .set(0.0);
        m.api_requests_total
            .with_label_values(&["consumer", "get", "200"])
            .inc();
        m.syncer_assigned_apis.with_label_values(&["s-1"]).set(3.0);
        m.leader.set(1.0);
        let text = m.render();
        for name in [
            "kbind_connection_ready",
            "kbind_connection_exported_apis",
            "kbind_binding_ready",
            "kbind_synced_objects",
            "kbind_conflicts",
            "kbind_paused_objects",
            "kbind_route_objects",
            "kbind_sync_operations_total",
            "kbind_provider_events_total",
            "kbind_sync_latency_seconds_bucket",
            "kbind_work_queue_depth",
            "kbind_imported_objects",
            "kbind_api_requests_total",
            "kbind_syncer_assigned_apis",
            "kbind_bindings_past_cap",
            "kbind_leader",
        ] {
            assert!(
                text.contains(&format!("\n{name}")) || text.starts_with(name),
                "{name} missing"
            );
        }
    }
}
