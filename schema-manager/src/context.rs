//! What every reconciler of the schema manager shares.

use std::time::Duration;

use futures::StreamExt;
use kbind_shared::identity::{IdentityError, cluster_identity};
use kbind_shared::metrics::Metrics;
use kube::Api;
use kube::Client;
use kube::api::{ApiResource, DynamicObject, PartialObjectMeta};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::OnceCell;

use crate::connection::credentials::Providers;

/// Periods from the flags.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Backstop resync of bindings.
    pub binding_resync_interval: Duration,
    /// Connection re-discovery and heartbeat period.
    pub discovery_interval: Duration,
    /// `leaseDurationSeconds` of the provider heartbeat Lease.
    pub heartbeat_lease_duration: Duration,
    /// Namespace buckets each managed API's sync work is split into (1: not split).
    pub namespace_buckets: u32,
    /// Where provider kubeconfig Secrets may live (`--provider-secret-namespaces`).
    pub provider_secret_namespaces: Vec<String>,
    /// How long an export must be missing before autoBind drops it.
    pub autobind_grace_period: Duration,
}

/// How long an instance metadata cache lives without being read.
pub const METADATA_CACHE_IDLE: Duration = Duration::from_secs(600);

/// One API's instance metadata cache.
pub struct MetadataCache {
    store: Store<PartialObjectMeta<DynamicObject>>,
    task: tokio::task::JoinHandle<()>,
    used: std::time::Instant,
}

impl Drop for MetadataCache {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Shared by the reconcilers.
pub struct Context {
    /// The consumer cluster.
    pub client: Client,
    /// Metrics.
    pub metrics: Metrics,
    /// Event reporter.
    pub reporter: Reporter,
    /// Periods.
    pub settings: Settings,
    /// kbind's own namespace (`--namespace`): leader election, syncer membership, assignment.
    pub namespace: String,
    /// One provider client per Connection, shared by the reconcilers.
    pub providers: Providers,
    local_uid: OnceCell<String>,
    instance_metadata: std::sync::Mutex<std::collections::HashMap<String, MetadataCache>>,
}

impl Context {
    /// A context for the reconcilers.
    pub fn new(
        client: Client,
        metrics: Metrics,
        reporter: Reporter,
        settings: Settings,
        namespace: String,
    ) -> Self {
        Self {
            client,
            metrics,
            reporter,
            settings,
            namespace,
            providers: Providers::default(),
            local_uid: OnceCell::new(),
            instance_metadata: Default::default(),
        }
    }

    /// A metadata-only cache of every instance of a bound API, started on first use (conflict
    /// counts read it instead of listing, LIM-16). Caches unused for [`METADATA_CACHE_IDLE`] (an
    /// API no longer bound, a CRD gone) are stopped.
    pub fn instance_metadata(
        &self,
        resource: &ApiResource,
    ) -> Store<PartialObjectMeta<DynamicObject>> {
        let key = format!(
            "{}/{}/{}",
            resource.group, resource.version, resource.plural
        );
        let now = std::time::Instant::now();
        let mut caches = self.instance_metadata.lock().expect("not poisoned");
        caches.retain(|k, cache| {
            let keep = *k == key || now.duration_since(cache.used) < METADATA_CACHE_IDLE;
            if !keep {
                tracing::debug!(api = %k, "stopping an unused instance metadata cache");
            }
            keep
        });
        let cache = caches.entry(key).or_insert_with(|| {
            let writer =
                reflector::store::Writer::<PartialObjectMeta<DynamicObject>>::new(resource.clone());
            let store = writer.as_reader();
            let api: Api<PartialObjectMeta<DynamicObject>> =
                Api::all_with(self.client.clone(), resource);
            let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
                .default_backoff();
            let task = tokio::spawn(async move { stream.for_each(|_| async {}).await });
            MetadataCache {
                store,
                task,
                used: now,
            }
        });
        cache.used = now;
        cache.store.clone()
    }

    /// The consumer's identity (ID-1), read once: a cluster does not change identity.
    pub async fn local_identity(&self) -> Result<String, IdentityError> {
        self.local_uid
            .get_or_try_init(|| cluster_identity(&self.client))
            .await
            .cloned()
    }
}
