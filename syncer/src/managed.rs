//! The managed-CRD controller (REFERENCE-BEHAVIOUR §16, SCTL-1 … SCTL-7): one sync worker per
//! consumer CRD labelled `core.kbind.io/managed=true`, running while its Connection is Ready,
//! rebuilt when the CRD's generation or the provider credentials change.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_shared::api::Connection;
use kbind_shared::conditions::{self, types};
use kbind_shared::keys;
use kbind_shared::kubeconfig::InlineKubeconfig;
use kbind_shared::shard;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use sha2::{Digest, Sha256};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::worker::{self, WorkerSpec};

/// How often the desired workers are re-evaluated without an event (the membership fence is
/// checked this often).
const RECHECK: Duration = Duration::from_secs(1);
/// How long a read of a Connection's credentials is reused before the Secret is read again (to
/// pick up rotated credentials without a Secret watch).
const CREDENTIALS_TTL: Duration = Duration::from_secs(5);

/// What a running worker was built from; any change rebuilds it (SCTL-5).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Key {
    api: String,
    generation: i64,
    connection: String,
    local_uid: String,
    credentials: [u8; 32],
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
    let crds: Store<CustomResourceDefinition> = crate::cache::spawn(
        Api::all(ctx.client.clone()),
        watcher::Config::default().labels(&format!("{}={}", keys::MANAGED_LABEL, keys::TRUE)),
        {
            let changes = changes.clone();
            move || changes.notify_one()
        },
    );
    let connections: Store<Connection> =
        crate::cache::spawn(Api::all(ctx.client.clone()), watcher::Config::default(), {
            let changes = changes.clone();
            move || changes.notify_one()
        });
    let assignment: Store<ConfigMap> = crate::cache::spawn(
        Api::namespaced(ctx.client.clone(), &ctx.membership.namespace),
        watcher::Config::default()
            .fields(&format!("metadata.name={}", shard::ASSIGNMENT_CONFIGMAP)),
        {
            let changes = changes.clone();
            move || changes.notify_one()
        },
    );
    let _ = crds.wait_until_ready().await;
    let _ = connections.wait_until_ready().await;
    let _ = assignment.wait_until_ready().await;

    let mut running: HashMap<String, Running> = HashMap::new();
    loop {
        let mine = my_units(&ctx, &assignment);
        let mut wanted = desired_workers(&ctx, &crds, &connections).await;
        wanted.retain(|_, (key, _)| mine.contains(&shard::unit(&key.connection, &key.api)));
        let names: Vec<String> = running.keys().cloned().collect();
        for name in names {
            let keep = wanted
                .get(&name)
                .is_some_and(|(key, _)| running[&name].key == *key);
            if !keep {
                tracing::info!(crd = %name, "stopping sync worker");
                running.remove(&name).expect("listed").stop().await;
            }
        }
        for (name, (key, spec)) in wanted {
            if running.contains_key(&name) {
                continue;
            }
            tracing::info!(crd = %name, connection = %key.connection, generation = key.generation, "starting sync worker");
            let token = stop.child_token();
            let task = tokio::spawn(worker::run(ctx.clone(), spec, token.clone()));
            running.insert(
                name,
                Running {
                    key,
                    stop: token,
                    task,
                },
            );
        }
        // Report what runs now: the drain acknowledgement the assignment waits for.
        let units: BTreeSet<String> = running
            .values()
            .map(|r| shard::unit(&r.key.connection, &r.key.api))
            .collect();
        ctx.metrics
            .syncer_assigned_apis
            .with_label_values(&[ctx.membership.identity.as_str()])
            .set(units.len() as f64);
        ctx.membership.set_running(units);
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(RECHECK) => {}
            _ = changes.notified() => {}
        }
    }
    for (_, worker) in running.drain() {
        worker.stop().await;
    }
    ctx.membership.set_running(BTreeSet::new());
}

/// The units assigned to this replica; none while its membership is not current (the fence).
fn my_units(ctx: &Context, assignment: &Store<ConfigMap>) -> BTreeSet<String> {
    if !ctx.membership.is_current() {
        return BTreeSet::new();
    }
    let Some(map) = assignment.state().into_iter().next() else {
        return BTreeSet::new();
    };
    let text = map
        .data
        .as_ref()
        .and_then(|d| d.get(shard::ASSIGNMENT_KEY))
        .cloned()
        .unwrap_or_default();
    match shard::Assignment::decode(&text) {
        Ok(assignment) => assignment.units_of(&ctx.membership.identity),
        Err(e) => {
            tracing::error!(error = %e, "cannot read the work assignment; running nothing");
            BTreeSet::new()
        }
    }
}

/// SCTL-2 … SCTL-5: the workers that should run, keyed by CRD name.
async fn desired_workers(
    ctx: &Context,
    crds: &Store<CustomResourceDefinition>,
    connections: &Store<Connection>,
) -> HashMap<String, (Key, WorkerSpec)> {
    let mut wanted = HashMap::new();
    for crd in crds.state() {
        let name = crd.name_any();
        if crd.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(connection_name) = crd.annotations().get(keys::CONNECTION_ANNOTATION).cloned()
        else {
            tracing::warn!(crd = %name, "managed CRD has no {} annotation; not syncing it", keys::CONNECTION_ANNOTATION);
            continue;
        };
        let Some(connection) = connections.get(&reflector::ObjectRef::new(&connection_name)) else {
            continue;
        };
        let status = connection.status.clone().unwrap_or_default();
        // ENG: only a Ready Connection with a pinned consumer identity is engaged.
        if !conditions::is_true(&status.conditions, types::READY)
            || status.local_cluster_uid.is_empty()
        {
            continue;
        }
        let Some(resource) = worker::instance_resource(&crd) else {
            tracing::warn!(crd = %name, "managed CRD has no served version; not syncing it");
            continue;
        };
        let (kubeconfig, credentials) = match read_credentials(ctx, &connection).await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(crd = %name, connection = %connection_name, error = %e, "cannot build the provider client");
                continue;
            }
        };
        let key = Key {
            api: name.clone(),
            generation: crd.metadata.generation.unwrap_or_default(),
            connection: connection_name.clone(),
            local_uid: status.local_cluster_uid.clone(),
            credentials,
        };
        let spec =
            WorkerSpec {
                api: name.clone(),
                resource,
                has_status_subresource: crd.spec.versions.iter().any(|v| {
                    v.storage && v.subresources.as_ref().is_some_and(|s| s.status.is_some())
                }),
                connection: connection_name,
                local_uid: status.local_cluster_uid.clone(),
                kubeconfig,
            };
        wanted.insert(name, (key, spec));
    }
    wanted
}

type Credentials = Result<(InlineKubeconfig, [u8; 32]), String>;

/// Recently read credentials, by Connection name.
static CREDENTIALS: std::sync::LazyLock<
    std::sync::Mutex<HashMap<String, (std::time::Instant, Credentials)>>,
> = std::sync::LazyLock::new(Default::default);

async fn read_credentials(ctx: &Context, connection: &Connection) -> Credentials {
    let name = connection.name_any();
    if let Some((at, found)) = CREDENTIALS.lock().expect("not poisoned").get(&name)
        && at.elapsed() < CREDENTIALS_TTL
    {
        return found.clone();
    }
    let found = read_credentials_now(ctx, connection).await;
    CREDENTIALS
        .lock()
        .expect("not poisoned")
        .insert(name, (std::time::Instant::now(), found.clone()));
    found
}

async fn read_credentials_now(ctx: &Context, connection: &Connection) -> Credentials {
    let reference = &connection.spec.kubeconfig_secret_ref;
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), &reference.namespace)
        .get(&reference.name)
        .await
        .map_err(|e| {
            format!(
                "read Secret {}/{}: {e}",
                reference.namespace, reference.name
            )
        })?;
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(reference.effective_key()))
        .map(|b| b.0.clone())
        .ok_or_else(|| {
            format!(
                "Secret {}/{} has no key `{}`",
                reference.namespace,
                reference.name,
                reference.effective_key()
            )
        })?;
    let kubeconfig = InlineKubeconfig::parse(&bytes).map_err(|e| e.to_string())?;
    Ok((kubeconfig, Sha256::digest(&bytes).into()))
}
