//! The managed-CRD controller (REFERENCE-BEHAVIOUR §16, SCTL-1 … SCTL-7): one sync worker per
//! consumer CRD labelled `core.kbind.io/managed=true`, running while its Connection is Ready,
//! rebuilt when the CRD's generation or the provider credentials change.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_shared::api::Connection;
use kbind_shared::conditions::{self, types};
use kbind_shared::credential::ProviderCredential;
use kbind_shared::keys;
use kbind_shared::shard::{self, Unit};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::credentials::SecretCredentials;
use crate::related;
use crate::worker::{self, Buckets, WorkerSpec};

/// How often the desired workers are re-evaluated without an event (the membership fence is
/// checked this often).
const RECHECK: Duration = Duration::from_secs(1);

/// What a running worker was built from; any change rebuilds it (SCTL-5).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Key {
    /// The assigned units it serves (reported as running: the drain acknowledgement).
    units: BTreeSet<String>,
    uid: String,
    generation: i64,
    connection: String,
    local_uid: String,
    /// The digest of the verified provider credential.
    credentials: String,
    /// The Connection's access rules (related workers).
    access: kbind_shared::api::ConnectionAccess,
    /// The bound APIs whose objects say where a ClusterBinding's provider copies may land
    /// (related workers).
    bound_apis: Vec<String>,
    /// The Connection's boundary (#51; immutable, but a Connection deleted and made again may
    /// have another).
    boundary: Option<String>,
    /// The route an API worker serves (#36). Whether its API is routed is not part of it: the
    /// running worker reads that live (#50.3).
    route: Option<worker::RouteSpec>,
    /// Whether an API worker reads cluster-wide (a ClusterBinding lists the API) or per
    /// namespace (#54). Which namespaces is not part of it: the running worker follows them.
    cluster_wide: bool,
}

/// A worker to run.
enum Work {
    /// Instances of one API.
    Api(WorkerSpec),
    /// Related resources of one binding.
    Related(related::RelatedSpec),
}

/// Backoff for workers that ended on their own: 1 s, 2 s, 4 s … 32 s.
#[derive(Default)]
struct Restarts(HashMap<String, (u32, tokio::time::Instant)>);

impl Restarts {
    /// Records a failure; returns how long until it may start again.
    fn failed(&mut self, name: &str, now: tokio::time::Instant) -> Duration {
        let entry = self.0.entry(name.to_owned()).or_insert((0, now));
        entry.0 = entry.0.saturating_add(1);
        let wait = Duration::from_secs(1u64 << entry.0.min(6).saturating_sub(1));
        entry.1 = now + wait;
        wait
    }

    fn may_start(&self, name: &str, now: tokio::time::Instant) -> bool {
        self.0.get(name).is_none_or(|(_, at)| now >= *at)
    }
}

struct Running {
    key: Key,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Running {
    async fn stop(self) {
        self.stop.cancel();
        // SCTL-7: wait at most 10 s.
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

/// Runs until `stop`, then stops every worker.
pub async fn run(ctx: Arc<Context>, stop: CancellationToken) {
    let changes = Arc::new(Notify::new());
    let crds: Store<CustomResourceDefinition> = kbind_shared::cache::spawn(
        Api::all(ctx.client.clone()),
        watcher::Config::default().labels(&format!("{}={}", keys::MANAGED_LABEL, keys::TRUE)),
        stop.clone(),
        {
            let changes = changes.clone();
            move || changes.notify_one()
        },
    );
    // The Connections' cache is the context's (their changes arrive as binding changes below).
    let connections: Store<Connection> = ctx.connections().clone();
    let assignment: Store<ConfigMap> = kbind_shared::cache::spawn(
        Api::namespaced(ctx.client.clone(), &ctx.membership.namespace),
        watcher::Config::default()
            .fields(&format!("metadata.name={}", shard::ASSIGNMENT_CONFIGMAP)),
        stop.clone(),
        {
            let changes = changes.clone();
            move || changes.notify_one()
        },
    );
    let _ = crds.wait_until_ready().await;
    let _ = assignment.wait_until_ready().await;
    let credentials = SecretCredentials::new(
        ctx.client.clone(),
        ctx.provider_secrets.clone(),
        changes.clone(),
        stop.clone(),
    );
    let binding_changes = ctx.binding_changes();
    let mut binding_changes = std::pin::pin!(binding_changes);
    let connection_changes = ctx.connection_changes();

    let mut running: HashMap<String, Running> = HashMap::new();
    let mut restarts = Restarts::default();
    loop {
        // A worker that ended on its own (it could not start, or panicked) is noticed: its units
        // are no longer reported as running, and it starts again after a backoff.
        let dead: Vec<String> = running
            .iter()
            .filter(|(_, r)| r.task.is_finished())
            .map(|(name, _)| name.clone())
            .collect();
        for name in dead {
            if let Some(r) = running.remove(&name) {
                let why = match r.task.await {
                    Err(e) if e.is_panic() => "panicked",
                    _ => "ended",
                };
                let wait = restarts.failed(&name, tokio::time::Instant::now());
                tracing::warn!(worker = %name, retry_in = ?wait, "sync worker {why}; it restarts after a backoff");
            }
        }
        let (mine, generation) = my_units(&ctx, &assignment);
        let inputs = Inputs {
            crds: &crds,
            connections: &connections,
            credentials: &credentials,
            mine: &mine,
        };
        let mut wanted = desired_workers(&ctx, &inputs);
        wanted.extend(desired_related(&ctx, &inputs));
        credentials.retain(connections.state().iter().map(|c| c.as_ref()));
        // A Connection no wanted worker uses any more (deleted, not Ready, assigned elsewhere)
        // keeps no provider client here; a worker started later builds one again.
        ctx.retain_provider_clients(|connection| {
            wanted.values().any(|(key, _)| key.connection == connection)
        });
        let stale: Vec<String> = running
            .iter()
            .filter(|(name, r)| wanted.get(*name).is_none_or(|(key, _)| r.key != *key))
            .map(|(name, _)| name.clone())
            .collect();
        if !stale.is_empty() {
            // Stop them all at once, report what still runs (the drain acknowledgement), and read
            // the assignment again before starting anything: stopping may take seconds, and what
            // was assigned before it may have moved since.
            let stopping: Vec<Running> = stale
                .iter()
                .filter_map(|name| {
                    tracing::info!(worker = %name, "stopping sync worker");
                    running.remove(name)
                })
                .collect();
            futures::future::join_all(stopping.into_iter().map(Running::stop)).await;
            report_running(&ctx, &running, generation);
            continue;
        }
        if stop.is_cancelled() {
            break;
        }
        if ctx.membership.is_lapsed() {
            // Every worker of the old incarnation has stopped (`mine` was empty while lapsed).
            report_running(&ctx, &running, generation);
            ctx.membership.clear_lapse();
            continue;
        }
        for (name, (key, work)) in wanted {
            if running.contains_key(&name)
                || !restarts.may_start(&name, tokio::time::Instant::now())
            {
                continue;
            }
            tracing::info!(worker = %name, connection = %key.connection, generation = key.generation, units = key.units.len(), "starting sync worker");
            let token = stop.child_token();
            let task = match work {
                Work::Api(spec) => tokio::spawn(worker::run(ctx.clone(), spec, token.clone())),
                Work::Related(spec) => tokio::spawn(related::run(ctx.clone(), spec, token.clone())),
            };
            running.insert(
                name,
                Running {
                    key,
                    stop: token,
                    task,
                },
            );
        }
        report_running(&ctx, &running, generation);
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(RECHECK) => {}
            _ = changes.notified() => {}
            _ = connection_changes.notified() => {}
            _ = futures::StreamExt::next(&mut binding_changes) => {}
        }
    }
    futures::future::join_all(running.drain().map(|(_, worker)| worker.stop())).await;
    let (_, generation) = my_units(&ctx, &assignment);
    ctx.membership.set_running(BTreeSet::new(), generation);
}

/// Reports what runs now and the assignment generation it conforms to: the drain acknowledgement
/// the assignment waits for.
fn report_running(ctx: &Context, running: &HashMap<String, Running>, generation: u64) {
    let units: BTreeSet<String> = running
        .values()
        .flat_map(|r| r.key.units.iter().cloned())
        .collect();
    let apis: BTreeSet<(String, String)> = units
        .iter()
        .filter_map(|u| match u.parse::<Unit>() {
            Ok(Unit::Api {
                connection, api, ..
            }) => Some((connection, api)),
            _ => None,
        })
        .collect();
    let identity = ctx.membership.identity.as_str();
    ctx.metrics
        .syncer_assigned_apis
        .with_label_values(&[identity])
        .set(apis.len() as f64);
    ctx.metrics
        .syncer_assigned_units
        .with_label_values(&[identity])
        .set(units.len() as f64);
    ctx.membership.set_running(units, generation);
}

/// The units assigned to this replica (its current incarnation) and the assignment's generation;
/// no units while its membership is not current (the fence).
fn my_units(ctx: &Context, assignment: &Store<ConfigMap>) -> (BTreeSet<Unit>, u64) {
    let text = assignment
        .state()
        .into_iter()
        .next()
        .and_then(|map| map.data.as_ref()?.get(shard::ASSIGNMENT_KEY).cloned())
        .unwrap_or_default();
    if text.is_empty() {
        return (BTreeSet::new(), 0);
    }
    let assignment = match shard::Assignment::decode(&text) {
        Ok(assignment) => assignment,
        Err(e) => {
            tracing::error!(error = %e, "cannot read the work assignment; running nothing");
            return (BTreeSet::new(), 0);
        }
    };
    if !ctx.membership.is_current() {
        return (BTreeSet::new(), assignment.generation);
    }
    let units = assignment
        .units_of(&ctx.membership.identity, ctx.membership.incarnation())
        .into_iter()
        .filter_map(|u| match u.parse::<Unit>() {
            Ok(unit) => Some(unit),
            Err(e) => {
                tracing::warn!(error = %e, "ignoring an assigned unit this kbind-syncer cannot read");
                None
            }
        })
        .collect();
    (units, assignment.generation)
}

/// The Connection, if it is engaged (Ready with a pinned consumer identity), and its identity.
fn engaged(connections: &Store<Connection>, name: &str) -> Option<(Arc<Connection>, String)> {
    let connection = connections.get(&reflector::ObjectRef::new(name))?;
    let status = connection.status.clone().unwrap_or_default();
    (conditions::is_true(&status.conditions, types::READY) && !status.local_cluster_uid.is_empty())
        .then_some((connection, status.local_cluster_uid))
}

/// An engaged Connection, its consumer identity and its verified credential: all a worker needs
/// before it may write.
fn usable(
    connections: &Store<Connection>,
    credentials: &SecretCredentials,
    name: &str,
) -> Option<(Arc<Connection>, String, ProviderCredential)> {
    let (connection, local_uid) = engaged(connections, name)?;
    let credential = verified_credential(credentials, &connection)?;
    Some((connection, local_uid, credential))
}

/// The Connection's provider credential, if kbind may write with it: its cluster identity was
/// verified against the pin (`kbind_shared::credential`). A Secret swapped to another cluster
/// stops the Connection's workers here, before they could write anything with it.
fn verified_credential(
    credentials: &SecretCredentials,
    connection: &Connection,
) -> Option<ProviderCredential> {
    match credentials.read(connection)? {
        Ok(credential) if credential.is_verified(connection.status.as_ref()) => Some(credential),
        Ok(_) => {
            tracing::debug!(connection = %connection.name_any(), "the provider credential is not verified yet; waiting for the schema manager");
            None
        }
        Err(e) => {
            tracing::warn!(connection = %connection.name_any(), error = %e, "cannot use the provider credential");
            None
        }
    }
}

/// What decides which workers run: the managed CRDs, the Connections and their credentials, and
/// the units assigned to this replica.
struct Inputs<'a> {
    crds: &'a Store<CustomResourceDefinition>,
    connections: &'a Store<Connection>,
    credentials: &'a SecretCredentials,
    mine: &'a BTreeSet<Unit>,
}

/// The related-resources workers that should run: one per assigned binding unit whose binding
/// lists related resources and whose Connection is engaged.
fn desired_related(ctx: &Context, inputs: &Inputs) -> HashMap<String, (Key, Work)> {
    let Inputs {
        crds,
        connections,
        credentials,
        mine,
    } = *inputs;
    let mut wanted = HashMap::new();
    for unit in mine {
        let Unit::Related {
            connection: connection_name,
            namespace,
            name,
        } = unit
        else {
            continue;
        };
        let Some(binding) = ctx.binding(namespace.as_deref(), name) else {
            continue;
        };
        if binding.meta().deletion_timestamp.is_some()
            || binding.spec().related_resources.is_empty()
            || binding.spec().connection_ref.name != *connection_name
        {
            continue;
        }
        let Some((connection, local_uid, credential)) =
            usable(connections, credentials, connection_name)
        else {
            continue;
        };
        // A Binding in a namespace the Connection does not serve gets no worker (its Ready
        // condition says why).
        if let Some(namespace) = namespace
            && !connection.spec.access.allows_bindings_in(namespace)
        {
            continue;
        }
        let access = connection.spec.access.clone();
        let ProviderCredential {
            kubeconfig,
            digest: credentials,
        } = credential;
        let uid = binding.meta().uid.clone().unwrap_or_default();
        let generation = binding.meta().generation.unwrap_or_default();
        let bound_apis = if namespace.is_none()
            && (connection.spec.boundary.is_some()
                || binding
                    .spec()
                    .related_resources
                    .iter()
                    .any(|e| e.direction == kbind_shared::api::RelatedDirection::FromProvider))
        {
            bound_resources(crds, binding.status(), connection_name)
        } else {
            Vec::new()
        };
        let key = Key {
            bound_apis: bound_apis.iter().map(|(name, _)| name.clone()).collect(),
            units: [unit.to_string()].into(),
            uid: uid.clone(),
            generation,
            connection: connection_name.clone(),
            local_uid: local_uid.clone(),
            credentials,
            access: access.clone(),
            boundary: connection.spec.boundary.clone(),
            route: None,
            cluster_wide: true,
        };
        let spec = related::RelatedSpec {
            namespace: namespace.clone(),
            name: name.clone(),
            uid,
            generation,
            connection: connection_name.clone(),
            local_uid,
            kubeconfig,
            digest: key.credentials.clone(),
            access,
            bound_apis,
            namespaces: connection.spec.namespaces(),
        };
        wanted.insert(unit.to_string(), (key, Work::Related(spec)));
    }
    wanted
}

/// The APIs a binding has bound through `connection` whose consumer CRDs are managed for that
/// Connection, with their instance resources, by name.
fn bound_resources(
    crds: &Store<CustomResourceDefinition>,
    status: Option<&kbind_shared::api::BindingStatus>,
    connection: &str,
) -> Vec<(String, kube::api::ApiResource)> {
    let Some(status) = status else {
        return Vec::new();
    };
    let mut bound: Vec<(String, kube::api::ApiResource)> = status
        .apis
        .iter()
        .filter(|a| a.bound && a.connection == connection)
        .filter_map(|a| {
            let crd = crds.get(&reflector::ObjectRef::new(&a.name))?;
            (crd.annotations().get(keys::CONNECTION_ANNOTATION)? == connection).then_some(())?;
            Some((
                a.name.clone(),
                kbind_shared::dynamic::instance_resource(&crd)?,
            ))
        })
        .collect();
    bound.sort_by(|a, b| a.0.cmp(&b.0));
    bound.dedup_by(|a, b| a.0 == b.0);
    bound
}

/// SCTL-2 … SCTL-5: the API workers that should run (for the assigned units only), keyed by CRD
/// name.
fn desired_workers(ctx: &Context, inputs: &Inputs) -> HashMap<String, (Key, Work)> {
    let mut wanted = HashMap::new();
    for crd in inputs.crds.state() {
        let name = crd.name_any();
        if crd.metadata.deletion_timestamp.is_some() {
            continue;
        }
        // Being handed over to another Connection: its old provider is drained first, and no
        // worker may write to either meanwhile.
        if crd.annotations().contains_key(keys::HANDOVER_ANNOTATION) {
            continue;
        }
        let Some(connection_name) = crd.annotations().get(keys::CONNECTION_ANNOTATION).cloned()
        else {
            tracing::warn!(crd = %name, "managed CRD has no {} annotation; not syncing it", keys::CONNECTION_ANNOTATION);
            continue;
        };
        // #36: other Connections routing some of its objects are routes of their own; each
        // route assigned here (the serving Connection's included) has a worker. The assignment
        // keeps a route that went away a while (it may come back: a tenant's route Binding
        // created and deleted again restarts and re-lists nothing, #50.3).
        let mut connections: BTreeSet<&str> = BTreeSet::new();
        for unit in inputs.mine {
            if let Unit::Api {
                connection, api, ..
            } = unit
                && *api == name
            {
                connections.insert(connection.as_str());
            }
        }
        if connections.is_empty() {
            continue;
        }
        let Some(resource) = kbind_shared::dynamic::instance_resource(&crd) else {
            tracing::warn!(crd = %name, "managed CRD has no served version; not syncing it");
            continue;
        };
        for connection in connections {
            let units: Vec<&Unit> = inputs
                .mine
                .iter()
                .filter(|u| matches!(u, Unit::Api { connection: c, api, .. } if c == connection && *api == name))
                .collect();
            let Some(buckets) = Buckets::of(&units) else {
                continue;
            };
            let usable = usable(inputs.connections, inputs.credentials, connection);
            let Some((serving, local_uid, credential)) = usable else {
                continue;
            };
            let remote_uid = serving
                .status
                .as_ref()
                .map(|s| s.remote_cluster_uid.clone())
                .unwrap_or_default();
            let ProviderCredential {
                kubeconfig,
                digest: credentials,
            } = credential;
            let route = worker::RouteSpec {
                route: kbind_shared::routing::Route {
                    connection: connection.to_owned(),
                    cluster: remote_uid,
                },
                served_by: connection_name.clone(),
            };
            let key = Key {
                units: units.iter().map(ToString::to_string).collect(),
                uid: crd.metadata.uid.clone().unwrap_or_default(),
                generation: crd.metadata.generation.unwrap_or_default(),
                connection: connection.to_owned(),
                local_uid: local_uid.clone(),
                credentials,
                access: Default::default(),
                bound_apis: Vec::new(),
                boundary: serving.spec.boundary.clone(),
                route: Some(route.clone()),
                // (A cluster-scoped API has no namespaces to read: only a ClusterBinding binds it.)
                cluster_wide: crd.spec.scope == "Cluster" || ctx.watch_scope(&name).is_cluster(),
            };
            let spec = WorkerSpec {
                api: name.clone(),
                resource: resource.clone(),
                has_status_subresource: crd.spec.versions.iter().any(|v| {
                    v.storage && v.subresources.as_ref().is_some_and(|s| s.status.is_some())
                }),
                has_delivery: has_delivery_record(&crd),
                connection: connection.to_owned(),
                local_uid,
                kubeconfig,
                digest: key.credentials.clone(),
                buckets,
                namespaces: serving.spec.namespaces(),
                cluster_wide: key.cluster_wide,
                route,
            };
            // The serving Connection's worker keeps the CRD's name (as before routing).
            let worker_name = if connection == connection_name {
                name.clone()
            } else {
                format!("{name}@{connection}")
            };
            wanted.insert(worker_name, (key, Work::Api(spec)));
        }
    }
    wanted
}

/// Whether the consumer CRD's storage version has kbind's `status.kbindSync` (the schema
/// manager adds it to the CRDs it installs; a CRD supplied by someone else may lack it, and then
/// the record is not written — the API server would prune it, every time).
fn has_delivery_record(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> bool {
    kbind_shared::dynamic::storage_version(&crd.spec.versions)
        .filter(|v| v.subresources.as_ref().is_some_and(|s| s.status.is_some()))
        .and_then(|v| v.schema.as_ref()?.open_api_v3_schema.as_ref())
        .and_then(|s| s.properties.as_ref()?.get("status")?.properties.as_ref())
        .is_some_and(|p| p.contains_key(kbind_shared::delivery::FIELD))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_worker_restarts_after_a_growing_capped_backoff() {
        let now = tokio::time::Instant::now();
        let mut r = Restarts::default();
        assert!(r.may_start("w", now));
        let waits: Vec<u64> = (0..9).map(|_| r.failed("w", now).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 32, 32, 32]);
        assert!(!r.may_start("w", now));
        assert!(r.may_start("w", now + Duration::from_secs(32)));
        assert!(r.may_start("other", now));
    }
}
