//! What every reconciler of the schema manager shares.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_shared::api::{Binding, ClusterBinding, Connection};
use kbind_shared::identity::{IdentityError, cluster_identity};
use kbind_shared::metrics::Metrics;
use kube::Api;
use kube::Client;
use kube::runtime::events::Reporter;
use tokio::sync::OnceCell;

use crate::caches::{Cached, TermCaches};
use crate::changes::{Change, Changes};
use crate::instances::Instances;
use crate::openapi::fetch::Documents;
use crate::providers::Providers;

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
    pub provider_secrets: kbind_shared::credential::SecretPolicy,
    /// The largest provider OpenAPI document read, in bytes.
    pub openapi_document_limit: u64,
    /// How long an export must be missing before autoBind drops it.
    pub autobind_grace_period: Duration,
    /// Whether bindings' related resources are served (`--related-resources`).
    pub related_resources: bool,
    /// The most Bindings of one namespace whose related resources are served
    /// (`--max-related-bindings-per-namespace`).
    pub max_related_bindings_per_namespace: u32,
    /// The most Bindings served per namespace, the oldest first (`--max-bindings-per-namespace`).
    pub max_bindings_per_namespace: u32,
    /// The share of a bound provider token's lifetime after which it is renewed
    /// (`--token-renewal-at`).
    pub token_renewal_at: f64,
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
    /// The one way to wake a reconciler: every trigger announces here.
    pub changes: Changes,
    /// What the binding reconciles read of consumer instances.
    pub instances: Instances,
    /// Providers' OpenAPI documents, by server and URL.
    pub documents: Documents,
    /// Backoff and log-once for failing Connections and bindings (by kind/namespace/name).
    pub retries: kbind_shared::backoff::Retries,
    /// When each heartbeat Lease was acquired (a renewal need not read it).
    pub heartbeats: crate::connection::heartbeat::Acquired,
    local_uid: OnceCell<String>,
    /// The served related-resources Bindings of each namespace, as the last reconcile there saw
    /// them.
    related_served: std::sync::Mutex<std::collections::HashMap<String, Vec<String>>>,
    /// This leadership term's caches (`None` outside a term).
    term: std::sync::RwLock<Option<TermCaches>>,
    /// The work units the live syncers report running, as this term's last assignment round saw
    /// them (`None` before the first round).
    running_units: std::sync::Mutex<Option<std::collections::BTreeSet<String>>>,
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
        let changes = Changes::default();
        Self {
            instances: Instances::new(client.clone(), changes.clone()),
            client,
            metrics,
            reporter,
            documents: Documents::new(settings.openapi_document_limit),
            retries: kbind_shared::backoff::Retries::new(
                Duration::from_secs(1),
                Duration::from_secs(300),
            ),
            settings,
            namespace,
            providers: Providers::new(changes.clone()),
            changes,
            heartbeats: Default::default(),
            local_uid: OnceCell::new(),
            related_served: Default::default(),
            term: Default::default(),
            running_units: Default::default(),
        }
    }

    /// Forgets what the syncers reported (a term ended: the next term's first round tells anew).
    pub fn forget_running_units(&self) {
        *self
            .running_units
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    /// Records the units the live syncers report running (each assignment round).
    pub fn set_running_units(&self, units: std::collections::BTreeSet<String>) {
        *self
            .running_units
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(units);
    }

    /// Whether a syncer may still be working on `api` for `connection`: it reports a unit of it
    /// running, or no assignment round has seen the syncers yet in this term.
    pub fn runs_api(&self, connection: &str, api: &str) -> bool {
        let running = self
            .running_units
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(running) = running.as_ref() else {
            return true;
        };
        running.iter().any(|unit| {
            matches!(
                unit.parse::<kbind_shared::shard::Unit>(),
                Ok(kbind_shared::shard::Unit::Api { connection: c, api: a, .. }) if c == connection && a == api
            )
        })
    }

    /// Publishes this leadership term's caches (listed already), or forgets them (`None`: the
    /// term ended).
    pub fn set_term_caches(&self, caches: Option<TermCaches>) {
        *self
            .term
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = caches;
    }

    /// This leadership term's caches (`None` outside a term).
    pub fn term(&self) -> Option<TermCaches> {
        self.term
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// kbind's managed consumer CRDs as this term's watch sees them (`None` outside a term).
    pub fn managed_crds(&self) -> Option<Vec<std::sync::Arc<CustomResourceDefinition>>> {
        self.term().map(|c| c.managed_crds())
    }

    /// What the core CRDs installed lack of kbind's (#53.6), as one message naming each CRD and
    /// field, from this term's watch; `None` when they keep everything kbind writes (or outside a
    /// term, where nothing is reconciled).
    pub fn core_crds_lack(&self) -> Option<String> {
        let term = self.term()?;
        let lacks: Vec<(String, kbind_shared::api::installed::Lack)> = expected_core_crds()
            .iter()
            .filter_map(|crd| {
                let name = crd.metadata.name.clone().unwrap_or_default();
                // One the cache does not show (not listed yet) is not judged: a Connection being
                // reconciled proves its CRD is there.
                let installed = term.core_crd(&name)?;
                let lack = kbind_shared::api::installed::lack(crd, Some(&installed))?;
                Some((name, lack))
            })
            .collect();
        kbind_shared::api::installed::describe(&lacks)
    }

    /// The ClusterBinding `name` as this term's watch shows it.
    pub fn cached_cluster_binding(&self, name: &str) -> Cached<std::sync::Arc<ClusterBinding>> {
        Cached::from_term(self.term(), |c| {
            c.cluster_bindings
                .get(&kube::runtime::reflector::ObjectRef::new(name))
        })
    }

    /// The Connection `name` as this term's watch shows it.
    pub fn cached_connection(&self, name: &str) -> Cached<std::sync::Arc<Connection>> {
        Cached::from_term(self.term(), |c| {
            c.connections
                .get(&kube::runtime::reflector::ObjectRef::new(name))
        })
    }

    /// The managed consumer CRD `name`, if this term's watch has it.
    pub fn cached_crd(&self, name: &str) -> Option<std::sync::Arc<CustomResourceDefinition>> {
        self.term()?.managed_crd(name)
    }

    /// Every ClusterBinding and Binding, for readers that only report: from this term's caches
    /// (no request), else (outside a term) a LIST.
    pub async fn all_bindings(&self) -> Result<AllBindings, kube::Error> {
        if let Some(caches) = self.term() {
            return Ok((caches.cluster_bindings.state(), caches.bindings.state()));
        }
        let params = kube::api::ListParams::default();
        let cluster_bindings = Api::<ClusterBinding>::all(self.client.clone())
            .list(&params)
            .await?;
        let bindings = Api::<Binding>::all(self.client.clone())
            .list(&params)
            .await?;
        Ok((
            cluster_bindings
                .items
                .into_iter()
                .map(std::sync::Arc::new)
                .collect(),
            bindings
                .items
                .into_iter()
                .map(std::sync::Arc::new)
                .collect(),
        ))
    }

    /// Records which related-resources Bindings of `namespace` are served; when that differs from
    /// what the last reconcile there saw, the namespace's Bindings are evaluated again.
    pub fn related_served(&self, namespace: &str, served: Vec<String>) {
        let changed = {
            let mut seen = self
                .related_served
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            seen.insert(namespace.to_owned(), served.clone()) != Some(served)
        };
        if changed {
            self.changes
                .announce(Change::RelatedServed(namespace.to_owned()));
        }
    }

    /// A Binding of `namespace` went away: the others there are evaluated again.
    pub fn related_left(&self, namespace: &str) {
        self.changes
            .announce(Change::RelatedServed(namespace.to_owned()));
    }

    /// The consumer's identity (ID-1), read once: a cluster does not change identity.
    pub async fn local_identity(&self) -> Result<String, IdentityError> {
        self.local_uid
            .get_or_try_init(|| cluster_identity(&self.client))
            .await
            .cloned()
    }
}

/// Why a reconcile did not finish, as every controller counts and logs it.
pub trait ReconcileError: std::fmt::Display {
    /// A low-cardinality label for logs and `kbind_reconcile_errors_total`; `None` for a drain
    /// wait, which is how a deletion normally proceeds, and for a write that [`raced`] another,
    /// which is retried at once: neither is a failed reconcile (#33.9).
    fn metric_label(&self) -> Option<&'static str>;
}

/// Whether a consumer write failed only because it raced with another (409: the object changed
/// since it was read); the controllers retry it at once.
pub fn raced(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.is_conflict())
}

/// kbind's own core CRDs, as its types generate them (once per process).
fn expected_core_crds() -> &'static [CustomResourceDefinition] {
    static CRDS: std::sync::OnceLock<Vec<CustomResourceDefinition>> = std::sync::OnceLock::new();
    CRDS.get_or_init(|| {
        kbind_shared::api::crds()
            .into_iter()
            .map(|(_, crd)| crd)
            .collect()
    })
}

/// An API server's answer with `code` (409 as a conflict), for the reconcilers' error tests.
#[cfg(test)]
pub fn api_error(code: u16) -> kube::Error {
    let reason = if code == 409 {
        "Conflict"
    } else {
        "InternalError"
    };
    kube::Error::Api(Box::new(kube::core::Status {
        code,
        ..kube::core::Status::failure("x", reason)
    }))
}

impl Context {
    /// Counts a reconcile of `controller` that did not finish in `kbind_reconcile_errors_total`
    /// (a drain wait is not counted).
    pub fn count_error(&self, controller: &str, error: &impl ReconcileError) {
        if let Some(reason) = error.metric_label() {
            self.metrics
                .reconcile_errors_total
                .with_label_values(&[controller, reason])
                .inc();
        }
    }

    /// When to retry the reconcile of `object` (e.g. `Connection c`) that failed with `error`:
    /// after a backoff that grows with the streak; logged as a warning once per new message.
    pub fn retry_after(&self, object: &str, error: &impl ReconcileError) -> Duration {
        let message = error.to_string();
        let retry = self.retries.failed(object, &message);
        let shown = kbind_shared::redact::remote(&message);
        if retry.log {
            tracing::warn!(%object, error = %shown, kind = error.metric_label(), retry_in = ?retry.after, "reconcile failed");
        } else {
            tracing::debug!(%object, error = %shown, retry_in = ?retry.after, "reconcile failed again");
        }
        retry.after
    }
}

/// The object to hand to kube-runtime's finalizer helper. Reconciles are also triggered from other
/// watches (a Connection's Secret, a binding's Connection or CRD), and then the cached object can
/// predate the finalizer this program just added: the helper's JSON-patch `test` would fail with
/// `422 Invalid` and the object converge only on a retry. Without our finalizer in the cached
/// copy, read it fresh first (once per new object).
pub async fn fresh_unless_finalized<K>(
    api: &Api<K>,
    object: std::sync::Arc<K>,
    finalizer: &str,
) -> Result<std::sync::Arc<K>, kube::Error>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let meta = object.meta();
    if meta.deletion_timestamp.is_some() || meta.finalizers.iter().flatten().any(|f| f == finalizer)
    {
        return Ok(object);
    }
    let name = meta.name.clone().unwrap_or_default();
    Ok(match api.get_opt(&name).await? {
        Some(fresh) => std::sync::Arc::new(fresh),
        None => object,
    })
}

/// Every ClusterBinding and every Binding.
pub type AllBindings = (
    Vec<std::sync::Arc<ClusterBinding>>,
    Vec<std::sync::Arc<Binding>>,
);

/// A reconcile held by kbind's cleanup finalizer: the object fresh when needed
/// ([`fresh_unless_finalized`]), then kube-runtime's finalizer helper running `apply` or
/// `cleanup`; their errors come back as they are, the helper's own as `E::from`.
pub async fn finalized<K, E, A, AF, C, CF>(
    api: &Api<K>,
    object: std::sync::Arc<K>,
    apply: A,
    cleanup: C,
) -> Result<kube::runtime::controller::Action, E>
where
    K: kbind_shared::cache::Cacheable + serde::Serialize,
    E: std::error::Error + Send + 'static,
    E: From<kube::Error> + From<Box<kube::runtime::finalizer::Error<E>>>,
    A: FnOnce(std::sync::Arc<K>) -> AF,
    AF: std::future::Future<Output = Result<kube::runtime::controller::Action, E>>,
    C: FnOnce(std::sync::Arc<K>) -> CF,
    CF: std::future::Future<Output = Result<kube::runtime::controller::Action, E>>,
{
    use kube::runtime::finalizer::{self, Event};
    let object = fresh_unless_finalized(api, object, kbind_shared::keys::CLEANUP_FINALIZER).await?;
    finalizer::finalizer(
        api,
        kbind_shared::keys::CLEANUP_FINALIZER,
        object,
        |event| async {
            match event {
                Event::Apply(o) => apply(o).await,
                Event::Cleanup(o) => cleanup(o).await,
            }
        },
    )
    .await
    .map_err(|e| match e {
        finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e,
        e => E::from(Box::new(e)),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_a_conflict_is_a_race() {
        let answer = |code: u16, reason: &str| {
            kube::Error::Api(Box::new(
                kube::core::Status::failure("", reason).with_code(code),
            ))
        };
        assert!(super::raced(&answer(409, "Conflict")));
        for (code, reason) in [
            (409, "AlreadyExists"),
            (403, "Forbidden"),
            (404, "NotFound"),
            (422, "Invalid"),
            (500, "InternalError"),
        ] {
            assert!(!super::raced(&answer(code, reason)), "{code} {reason}");
        }
    }
}
