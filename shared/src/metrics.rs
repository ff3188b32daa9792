//! kbind's Prometheus metrics (INTERFACES.md, "Metrics"). One [`Metrics`] per process, registered
//! in its own registry and served at `/metrics`.

use prometheus::{
    Encoder, Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry,
    TextEncoder,
};

/// Every metric either program exports. Families a program never touches stay empty.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
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
    /// `kbind_sync_operations_total{api,op,result}`
    pub sync_operations_total: IntCounterVec,
    /// `kbind_sync_latency_seconds{op}`
    pub sync_latency_seconds: HistogramVec,
    /// `kbind_work_queue_depth{api}`
    pub work_queue_depth: GaugeVec,
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
    /// `kbind_sync_lag_seconds{connection,api,op}`: from the watch event that showed a change to
    /// the write that delivered it (spec up: consumer change → provider copy written; status
    /// down: provider status → consumer status written; delete: deletion seen → provider copy
    /// gone and the finalizer released)
    pub sync_lag_seconds: HistogramVec,
    /// `kbind_sync_backlog{connection,api}`: objects whose change was seen and not yet synced
    pub sync_backlog: GaugeVec,
    /// `kbind_sync_backlog_oldest_seconds{connection,api}`: how long the oldest of them has waited
    pub sync_backlog_oldest_seconds: GaugeVec,
    /// `kbind_delivery_record_wait_seconds{connection,api}`: how long a delivery record waits for
    /// the provider's status change to carry it, learned from the provider's recent answers
    pub delivery_record_wait_seconds: GaugeVec,
    /// `kbind_connection_heartbeat_age_seconds{connection}`: since the heartbeat Lease on the
    /// provider was last renewed (computed when scraped)
    pub connection_heartbeat_age_seconds: GaugeVec,
    heartbeats:
        std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every kbind metric in it.
    #[allow(
        clippy::expect_used,
        reason = "static definitions, valid and unique by construction; every process builds them at start and the unit tests render them"
    )]
    pub fn new() -> Self {
        let registry = Registry::new();
        fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
            let g = GaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry
                .register(Box::new(g.clone()))
                .expect("unique metric");
            g
        }
        fn counter_vec(
            registry: &Registry,
            name: &str,
            help: &str,
            labels: &[&str],
        ) -> IntCounterVec {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        }
        let sync_latency_seconds = HistogramVec::new(
            HistogramOpts::new(
                "kbind_sync_latency_seconds",
                "Time from the watch event that made an object out of date to the write that fixed it",
            )
            .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
            &["op"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(sync_latency_seconds.clone()))
            .expect("unique metric");
        let sync_lag_seconds = HistogramVec::new(
            HistogramOpts::new(
                "kbind_sync_lag_seconds",
                "End-to-end delay from the watch event that showed a change to the write that delivered it, per Connection, API and operation",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
            ]),
            &["connection", "api", "op"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(sync_lag_seconds.clone()))
            .expect("unique metric");
        let assignment_overlaps = Gauge::new(
            "kbind_assignment_overlaps",
            "Work units more than one live syncer reports running; must stay 0",
        )
        .expect("valid metric");
        registry
            .register(Box::new(assignment_overlaps.clone()))
            .expect("unique metric");
        let assignment_unassigned_units = Gauge::new(
            "kbind_assignment_unassigned_units",
            "Work units left unassigned: the assignment ConfigMap is full, or a binding's related resources are not admitted (related resources off, or past --max-related-bindings-per-namespace)",
        )
        .expect("valid metric");
        registry
            .register(Box::new(assignment_unassigned_units.clone()))
            .expect("unique metric");
        let leader = Gauge::new(
            "kbind_leader",
            "1 while this schema manager holds the leader Lease",
        )
        .expect("valid metric");
        registry
            .register(Box::new(leader.clone()))
            .expect("unique metric");

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
            sync_operations_total: counter_vec(
                &registry,
                "kbind_sync_operations_total",
                "Sync operations by outcome",
                &["api", "op", "result"],
            ),
            sync_latency_seconds,
            work_queue_depth: gauge_vec(
                &registry,
                "kbind_work_queue_depth",
                "Objects waiting to be synced",
                &["api"],
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
                "Requests to API servers",
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
                "Objects whose change was seen and is not yet synced",
                &["connection", "api"],
            ),
            sync_backlog_oldest_seconds: gauge_vec(
                &registry,
                "kbind_sync_backlog_oldest_seconds",
                "How long the oldest object not yet synced has waited",
                &["connection", "api"],
            ),
            delivery_record_wait_seconds: gauge_vec(
                &registry,
                "kbind_delivery_record_wait_seconds",
                "How long a delivery record waits for the provider's status change to carry it",
                &["connection", "api"],
            ),
            connection_heartbeat_age_seconds: gauge_vec(
                &registry,
                "kbind_connection_heartbeat_age_seconds",
                "Seconds since the heartbeat Lease on the Connection's provider was last renewed",
                &["connection"],
            ),
            heartbeats: Default::default(),
            sync_lag_seconds,
            leader,
            assignment_overlaps,
            assignment_unassigned_units,
            registry,
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
        m.sync_operations_total
            .with_label_values(&["widgets.example.org", "spec_up", "ok"])
            .inc();
        m.sync_latency_seconds
            .with_label_values(&["spec_up"])
            .observe(0.1);
        m.work_queue_depth
            .with_label_values(&["widgets.example.org"])
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
            "kbind_sync_operations_total",
            "kbind_sync_latency_seconds_bucket",
            "kbind_work_queue_depth",
            "kbind_api_requests_total",
            "kbind_syncer_assigned_apis",
            "kbind_leader",
        ] {
            assert!(
                text.contains(&format!("\n{name}")) || text.starts_with(name),
                "{name} missing"
            );
        }
    }
}
