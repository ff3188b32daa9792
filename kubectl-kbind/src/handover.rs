//! Whether the Go konnector still writes, and what becomes of its heartbeat (#53.3), for
//! `kubectl kbind migrate`: its Lease on each Connection's provider (`kbind/consumer-<uid>`,
//! which kbind's schema manager renews beside its own while it exists), and the newest writes of
//! its field manager on both clusters — the evidence that a Go konnector runs somewhere (another
//! cluster, a laptop) although none was found here. Decisions are pure functions; reads at the
//! edge, only GETs and LISTs.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kbind_shared::api::{Binding, ClusterBinding, Connection};
use kbind_shared::heartbeat::{GO_LEASE_NAMESPACE, GoLease, go_lease_name};
use kbind_shared::kubeconfig::Transport;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use serde::Serialize;

use crate::view::{self, cell};

/// The Go konnector's field manager for everything it writes by update — status copied down,
/// finalizers, its Connections' status, pulled CRDs, its Lease: the default controller-runtime
/// derives from its binary's name. (Its server-side applies use `kbind-konnector` and
/// `kbind-konnector-related`, which kbind shares and so cannot tell apart.)
pub const GO_MANAGER: &str = "konnector";

/// `--quiet-for`'s default: longer than the Go konnector's 30 s renewal of its Lease.
pub const DEFAULT_QUIET: &str = "65s";
/// Writes in flight when a Go konnector's pods went: not evidence of another writer.
const IN_FLIGHT: jiff::SignedDuration = jiff::SignedDuration::from_secs(2);

/// How far back writes are reported.
const WINDOW_SECS: u64 = 600;
/// The most writes reported.
const MAX_WRITES: usize = 20;
/// Objects listed per request.
const PAGE: u32 = 500;

/// The Go konnector's heartbeat Lease of this consumer on one Connection's provider.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct GoLeaseRow {
    pub connection: String,
    /// `namespace/name`.
    pub lease: String,
    /// `absent`, `this consumer's`, `another's`, or why it could not be read.
    pub found: String,
    /// Seconds since its `renewTime`, when there is one.
    pub renewed_secs_ago: Option<u64>,
    /// What becomes of it.
    pub fate: String,
}

/// A write of [`GO_MANAGER`], as the object's `managedFields` record it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct GoWrite {
    /// `consumer`, or `provider of <connection>`.
    pub cluster: String,
    /// `kind namespace/name`.
    pub object: String,
    /// When (the API server's clock).
    pub at: String,
    /// Seconds before the read.
    pub secs_ago: u64,
}

/// When [`GO_MANAGER`] last wrote an object: its newest `managedFields` entry's time.
pub fn last_go_write(fields: Option<&[ManagedFieldsEntry]>) -> Option<jiff::Timestamp> {
    fields?
        .iter()
        .filter(|f| f.manager.as_deref() == Some(GO_MANAGER))
        .filter_map(|f| f.time.as_ref().map(|t| t.0))
        .max()
}

/// What becomes of the Go konnector's Lease, in words.
pub fn fate(lease: &GoLease, kbind_lease: &str) -> String {
    match lease {
        GoLease::Renew => format!(
            "kbind renews it beside its own ({kbind_lease}) while it exists — its renewTime only, never re-created once deleted: a reaper that knows only the Go name keeps reading this consumer as alive; delete it once the provider's reaper knows kbind's name"
        ),
        GoLease::Absent => format!("none: kbind renews only its own ({kbind_lease})"),
        GoLease::NotThisConsumers => "held by another consumer: kbind leaves it alone".to_owned(),
    }
}

/// The writes at or after `since`, newest first, at most [`MAX_WRITES`].
pub fn after(writes: &[GoWrite], since: jiff::Timestamp) -> Vec<GoWrite> {
    let mut found: Vec<GoWrite> = writes
        .iter()
        .filter(|w| w.at.parse::<jiff::Timestamp>().is_ok_and(|at| at >= since))
        .cloned()
        .collect();
    found.sort_by_key(|w| w.secs_ago);
    found.truncate(MAX_WRITES);
    found
}

/// Why `apply` must not hand over: the Go konnector's field manager wrote `recent` (writes after
/// the moment that matters) — another Go konnector runs, and two writers would share one field
/// manager. `None` when nothing was written.
pub fn refusal(recent: &[GoWrite], quiet: &str) -> Option<String> {
    let newest = recent.first()?;
    Some(format!(
        "the Go konnector's field manager ({GO_MANAGER}) wrote {} on the {} {}s ago ({} write(s) in the last {quiet}): a Go konnector still runs somewhere — stop it first; nothing was handed over",
        newest.object,
        newest.cluster,
        newest.secs_ago,
        recent.len()
    ))
}

/// The last write to a workload's spec or metadata (not its status): for a stopped Go konnector,
/// no earlier than when it was stopped.
pub fn last_spec_write(fields: Option<&[ManagedFieldsEntry]>) -> Option<jiff::Timestamp> {
    fields?
        .iter()
        .filter(|f| f.subresource.as_deref().unwrap_or_default().is_empty())
        .filter_map(|f| f.time.as_ref().map(|t| t.0))
        .max()
}

/// From when a write of the Go konnector's field manager is evidence that one runs although none
/// runs here: the last `quiet`, and only after the Go konnectors stopped here were stopped (their
/// own last writes, in flight then, explain nothing about another).
pub fn evidence_since(
    now: jiff::Timestamp,
    quiet: std::time::Duration,
    stopped: impl IntoIterator<Item = jiff::Timestamp>,
) -> jiff::Timestamp {
    let window = now - jiff::SignedDuration::try_from(quiet).unwrap_or_default();
    stopped
        .into_iter()
        .map(|at| at + IN_FLIGHT)
        .fold(window, std::cmp::max)
}

/// The first step when the Go konnector's field manager wrote in the last minutes although no
/// Go konnector runs on this cluster: one runs elsewhere.
pub fn elsewhere(running_here: bool, writes: &[GoWrite]) -> Option<String> {
    let newest = writes.first().filter(|_| !running_here)?;
    Some(format!(
        "stop the Go konnector that still writes although none runs here (its field manager {GO_MANAGER} wrote {} on the {} {}s ago): another cluster or a process outside Kubernetes — apply refuses until it has been silent for --quiet-for",
        newest.object, newest.cluster, newest.secs_ago
    ))
}

fn write(
    cluster: &str,
    kind: &str,
    meta: &kube::api::ObjectMeta,
    now: jiff::Timestamp,
) -> Option<GoWrite> {
    let at = last_go_write(meta.managed_fields.as_deref())?;
    let secs_ago = (now.as_second() - at.as_second()).max(0).unsigned_abs();
    (secs_ago <= WINDOW_SECS).then(|| GoWrite {
        cluster: cluster.to_owned(),
        object: cell(&format!(
            "{kind} {}{}",
            meta.namespace
                .as_deref()
                .map(|n| format!("{n}/"))
                .unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        )),
        at: at.to_string(),
        secs_ago,
    })
}

/// The Go konnector's Lease on each Connection's provider, and its writes there. A provider that
/// cannot be reached gets a row saying why.
pub async fn leases(
    consumer: &Client,
    connections: &[Connection],
    transport: Transport,
    now: jiff::Timestamp,
) -> (Vec<GoLeaseRow>, Vec<GoWrite>) {
    let (mut rows, mut writes) = (Vec::new(), Vec::new());
    for connection in connections {
        let name = connection.name_any();
        let Some(uid) = connection
            .status
            .as_ref()
            .map(|s| s.local_cluster_uid.clone())
            .filter(|u| !u.is_empty())
        else {
            continue;
        };
        let lease = format!("{GO_LEASE_NAMESPACE}/{}", go_lease_name(&uid));
        let row = |found: String, renewed: Option<u64>, fate: String| GoLeaseRow {
            connection: cell(&name),
            lease: lease.clone(),
            found,
            renewed_secs_ago: renewed,
            fate,
        };
        let provider = match view::provider(consumer, &connection.spec, transport).await {
            Ok(p) => p.provider,
            Err(e) => {
                rows.push(row(
                    format!("unreadable: {}", view::line(&e, 200)),
                    None,
                    "unknown".into(),
                ));
                continue;
            }
        };
        let kbind_lease =
            kbind_shared::heartbeat::record(provider.kubeconfig.namespace(), &name, &uid);
        match Api::<Lease>::namespaced(provider.client.clone(), GO_LEASE_NAMESPACE)
            .get_opt(&go_lease_name(&uid))
            .await
        {
            Ok(found) => {
                let holder = found
                    .as_ref()
                    .map(|l| l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()));
                let state = kbind_shared::heartbeat::go_lease(holder, &uid);
                let renewed = found
                    .as_ref()
                    .and_then(|l| l.spec.as_ref()?.renew_time.as_ref())
                    .map(|t| (now.as_second() - t.0.as_second()).max(0).unsigned_abs());
                if let Some(l) = &found {
                    writes.extend(write(
                        &format!("provider of {name}"),
                        "Lease",
                        &l.metadata,
                        now,
                    ));
                }
                let words = match state {
                    GoLease::Renew => "this consumer's",
                    GoLease::Absent => "absent",
                    GoLease::NotThisConsumers => "another's",
                };
                rows.push(row(words.into(), renewed, fate(&state, &kbind_lease)));
            }
            Err(e) => rows.push(row(
                view::read_error("the Lease", &e),
                None,
                "unknown".into(),
            )),
        }
    }
    (rows, writes)
}

/// The Go konnector's writes on the consumer: its Connections, bindings, pulled CRDs and the
/// objects of those CRDs (their metadata, page by page).
pub async fn consumer_writes(
    consumer: &Client,
    connections: &[Connection],
    pulled: &[CustomResourceDefinition],
    now: jiff::Timestamp,
) -> Result<Vec<GoWrite>, String> {
    let mut writes: Vec<GoWrite> = connections
        .iter()
        .filter_map(|c| write("consumer", "Connection", &c.metadata, now))
        .collect();
    let params = ListParams::default().limit(PAGE);
    for b in Api::<ClusterBinding>::all(consumer.clone())
        .list(&params)
        .await
        .map_err(|e| view::read_error("ClusterBindings", &e))?
        .items
    {
        writes.extend(write("consumer", "ClusterBinding", &b.metadata, now));
    }
    for b in Api::<Binding>::all(consumer.clone())
        .list(&params)
        .await
        .map_err(|e| view::read_error("Bindings", &e))?
        .items
    {
        writes.extend(write("consumer", "Binding", &b.metadata, now));
    }
    for crd in pulled {
        writes.extend(write(
            "consumer",
            "CustomResourceDefinition",
            &crd.metadata,
            now,
        ));
        let Some(resource) = kbind_shared::dynamic::instance_resource(crd) else {
            continue;
        };
        let api: Api<kube::api::DynamicObject> = Api::all_with(consumer.clone(), &resource);
        let mut page = params.clone();
        loop {
            let list = api
                .list_metadata(&page)
                .await
                .map_err(|e| view::read_error(&crd.name_any(), &e))?;
            for o in &list.items {
                writes.extend(write("consumer", &resource.kind, &o.metadata, now));
            }
            match list.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => page = params.clone().continue_token(&token),
                None => break,
            }
        }
    }
    Ok(writes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn entry(manager: &str, second: i64) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Update".into()),
            time: Some(Time(jiff::Timestamp::from_second(second).unwrap())),
            ..Default::default()
        }
    }

    #[test]
    fn only_the_go_konnectors_own_manager_counts_as_its_write() {
        let fields = [
            entry("kbind-konnector", 900),
            entry(GO_MANAGER, 500),
            entry(GO_MANAGER, 700),
            entry("kubectl", 1_000),
        ];
        assert_eq!(
            last_go_write(Some(&fields)),
            Some(jiff::Timestamp::from_second(700).unwrap())
        );
        assert_eq!(last_go_write(Some(&fields[..1])), None);
        assert_eq!(last_go_write(None), None);
        let now = jiff::Timestamp::from_second(1_000).unwrap();
        let mut meta = kube::api::ObjectMeta {
            name: Some("provider".into()),
            managed_fields: Some(fields.to_vec()),
            ..Default::default()
        };
        let w = write("consumer", "Connection", &meta, now).unwrap();
        assert_eq!(
            (w.object.as_str(), w.secs_ago),
            ("Connection provider", 300)
        );
        // Older than the window: not reported.
        meta.managed_fields = Some(vec![entry(GO_MANAGER, 1)]);
        assert_eq!(write("consumer", "Connection", &meta, now), None);
    }

    #[test]
    fn apply_refuses_only_for_writes_after_the_moment_that_matters() {
        let at = |second: i64, ago: u64| GoWrite {
            cluster: "consumer".into(),
            object: format!("Widget team-a/w{second}"),
            at: jiff::Timestamp::from_second(second).unwrap().to_string(),
            secs_ago: ago,
        };
        let writes = [at(100, 900), at(950, 50), at(990, 10)];
        let since = jiff::Timestamp::from_second(940).unwrap();
        let recent = after(&writes, since);
        assert_eq!(recent.len(), 2);
        assert_eq!(recent[0].object, "Widget team-a/w990", "newest first");
        let why = refusal(&recent, "60s").unwrap();
        assert!(
            why.contains("Widget team-a/w990 on the consumer 10s ago"),
            "{why}"
        );
        assert!(why.contains("2 write(s)"), "{why}");
        assert_eq!(
            refusal(
                &after(&writes, jiff::Timestamp::from_second(995).unwrap()),
                "60s"
            ),
            None
        );
    }

    #[test]
    fn a_stopped_konnectors_own_last_writes_are_no_evidence_of_another() {
        let t = |second: i64| jiff::Timestamp::from_second(second).unwrap();
        let quiet = std::time::Duration::from_secs(65);
        assert_eq!(evidence_since(t(1_000), quiet, []), t(935));
        assert_eq!(evidence_since(t(1_000), quiet, [t(900)]), t(935));
        assert_eq!(evidence_since(t(1_000), quiet, [t(950), t(960)]), t(962));
        let mut status = entry("kube-controller-manager", 990);
        status.subresource = Some("status".into());
        let fields = [entry("kubectl-kbind", 950), status];
        assert_eq!(last_spec_write(Some(&fields)), Some(t(950)));
    }

    #[test]
    fn a_write_with_no_konnector_here_names_one_elsewhere() {
        let w = GoWrite {
            cluster: "provider of p".into(),
            object: "Lease kbind/consumer-u".into(),
            at: "2026-12-06T00:00:00Z".into(),
            secs_ago: 12,
        };
        let step = elsewhere(false, std::slice::from_ref(&w)).unwrap();
        assert!(
            step.contains("Lease kbind/consumer-u on the provider of p 12s ago"),
            "{step}"
        );
        assert_eq!(
            elsewhere(true, &[w]),
            None,
            "explained by the one running here"
        );
        assert_eq!(elsewhere(false, &[]), None);
    }

    #[test]
    fn the_go_lease_fate_says_what_kbind_does() {
        assert!(
            fate(&GoLease::Renew, "kbind/p-u").contains("renews it beside its own (kbind/p-u)")
        );
        assert!(fate(&GoLease::Renew, "x").contains("never re-created"));
        assert!(fate(&GoLease::Absent, "x").starts_with("none"));
        assert!(fate(&GoLease::NotThisConsumers, "x").contains("leaves it alone"));
    }
}
