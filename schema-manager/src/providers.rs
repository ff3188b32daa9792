//! Provider credentials: reading the Connection's Secret (CONN-3) and keeping one verified
//! provider client per Connection, replaced when a rotated credential is verified (LIM-1).

use crate::changes::{Change, Changes};
use kbind_shared::sync::Locked;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_shared::api::KubeconfigSecretRef;
use kbind_shared::api::{ExportedApi, OmittedVersion};
use kbind_shared::credential::{ProviderCredential, SecretPolicy};
use kbind_shared::keys;
use kbind_shared::kubeconfig::InlineKubeconfig;
use kbind_shared::metrics::Metrics;
use kube::api::{ObjectMeta, PartialObjectMeta};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

/// A provider client and the credential it was built from.
#[derive(Clone)]
pub struct Provider {
    /// Client for the provider.
    pub client: Client,
    /// The validated kubeconfig (server, default namespace).
    pub kubeconfig: InlineKubeconfig,
    /// `sha256:<hex>` of the kubeconfig bytes.
    pub digest: String,
    /// What was derived from the provider's exported CRDs, and which versions of them.
    pub schemas: ProviderSchemas,
    /// The watch of the provider's identity, started once the identity was verified through this
    /// client (shared by every clone).
    pub identity: Arc<std::sync::OnceLock<crate::identity_watch::IdentityWatch>>,
}

impl Provider {
    /// The provider's identity as this client's identity watch shows it for certain, if one runs.
    pub fn watched_identity(&self) -> Option<String> {
        self.identity.get()?.identity()
    }

    /// Starts watching the identity object `source` names, unless a watch runs already;
    /// `on_change` runs when what it shows changes.
    pub fn watch_identity(
        &self,
        source: kbind_shared::identity::Source,
        connection: &str,
        on_change: impl Fn() + Send + Sync + 'static,
    ) {
        self.identity.get_or_init(|| {
            crate::identity_watch::IdentityWatch::start(&self.client, source, connection, on_change)
        });
    }
}

/// The consumer CRD derived from one provider CRD, and the versions it leaves out.
pub type Derived = (CustomResourceDefinition, Vec<OmittedVersion>);

/// Exported CRDs' names and `resourceVersion`s, sorted.
type Versions = Vec<(String, String)>;

/// The exports discovered, and from which versions of the exported CRDs.
type Discovered = Option<(Versions, Vec<ExportedApi>)>;

/// What kbind derived from a provider's exported CRDs, each with the `resourceVersion` of what it
/// was derived from, and a watch of those CRDs' names and `resourceVersion`s alone (started once
/// the Connection's identity is verified). A result is reused only while the watch shows exactly
/// the versions it came from: at rest, discovery and the schema checks read nothing from the
/// provider; any change is read fresh.
#[derive(Clone, Default)]
pub struct ProviderSchemas {
    versions: Option<Store<PartialObjectMeta<CustomResourceDefinition>>>,
    derived: Arc<Mutex<HashMap<String, (String, Derived)>>>,
    exports: Arc<Mutex<Discovered>>,
    /// Stops the watch when the last clone of this provider is gone.
    _watch: Option<Arc<crate::identity_watch::StopOnDrop>>,
}

impl ProviderSchemas {
    /// Watches the exported CRDs `client` reaches, keeping only names and `resourceVersion`s;
    /// announces each CRD the watch shows changed, once the cache holds it (a re-list
    /// names only what differs from what was seen: nothing at rest).
    fn watched(client: &Client, connection: &str, changes: Changes) -> Self {
        let stop = CancellationToken::new();
        let connection = connection.to_owned();
        let names = Mutex::new(kbind_shared::cache::ChangedNames::default());
        let listed = std::sync::atomic::AtomicBool::new(false);
        use std::sync::atomic::Ordering::Relaxed;
        let selector = format!("{}={}", keys::EXPORTED_LABEL, keys::TRUE);
        let versions = kbind_shared::cache::spawn_modified(
            Api::<PartialObjectMeta<CustomResourceDefinition>>::all(client.clone()),
            watcher::Config::default().labels(&selector),
            stop.clone(),
            |crd: &mut PartialObjectMeta<CustomResourceDefinition>| {
                crd.metadata = ObjectMeta {
                    name: crd.metadata.name.take(),
                    resource_version: crd.metadata.resource_version.take(),
                    ..Default::default()
                };
            },
            move |event| {
                if let Ok(event) = event {
                    let changed = names.locked().observe(event);
                    // The first list names every export, and none changed: the bindings read a
                    // new client's schemas anyway. Announcing them would wake every binding of
                    // the Connection at once (and, past the topic's capacity, every binding).
                    if matches!(event, watcher::Event::InitDone) && !listed.swap(true, Relaxed) {
                        return;
                    }
                    for api in changed.into_iter().map(|key| key.name) {
                        let connection = connection.clone();
                        changes.announce(Change::ProviderSchema { connection, api });
                    }
                }
            },
        );
        Self::over(versions, stop)
    }

    fn over(
        versions: Store<PartialObjectMeta<CustomResourceDefinition>>,
        stop: CancellationToken,
    ) -> Self {
        Self {
            versions: Some(versions),
            _watch: Some(Arc::new(crate::identity_watch::StopOnDrop(stop))),
            ..Default::default()
        }
    }

    /// The `resourceVersion` the watch shows for the exported CRD `name`.
    fn version(&self, name: &str) -> Option<String> {
        self.versions
            .as_ref()?
            .get(&ObjectRef::new(name))?
            .metadata
            .resource_version
            .clone()
    }

    /// Every exported CRD's name and `resourceVersion` as the watch shows them, sorted (`None`
    /// without a watch, or while it shows none).
    fn all_versions(&self) -> Option<Versions> {
        let mut all: Versions = self
            .versions
            .as_ref()?
            .state()
            .iter()
            .map(|c| {
                (
                    c.metadata.name.clone().unwrap_or_default(),
                    c.metadata.resource_version.clone().unwrap_or_default(),
                )
            })
            .collect();
        all.sort();
        (!all.is_empty()).then_some(all)
    }

    /// What was derived from the exported CRD `name`, if it is still the version the watch shows.
    pub fn derived(&self, name: &str) -> Option<Derived> {
        let version = self.version(name)?;
        let derived = self.derived.locked();
        let (from, value) = derived.get(name)?;
        (*from == version).then(|| value.clone())
    }

    /// Keeps what was derived from version `version` of the exported CRD `name`.
    pub fn remember(&self, name: &str, version: Option<&str>, value: &Derived) {
        if let Some(version) = version {
            self.derived
                .locked()
                .insert(name.to_owned(), (version.to_owned(), value.clone()));
        }
    }

    /// The exports discovered from the exported CRDs, if the watch still shows exactly the
    /// versions they were discovered from.
    pub fn exports(&self) -> Option<Vec<ExportedApi>> {
        let versions = self.all_versions()?;
        let exports = self.exports.locked();
        let (from, apis) = exports.as_ref()?;
        (*from == versions).then(|| apis.clone())
    }

    /// Keeps the exports discovered from `crds` (a LIST of the exported CRDs).
    pub fn remember_exports(&self, crds: &[CustomResourceDefinition], apis: &[ExportedApi]) {
        let mut versions: Versions = crds
            .iter()
            .map(|c| {
                (
                    c.metadata.name.clone().unwrap_or_default(),
                    c.metadata.resource_version.clone().unwrap_or_default(),
                )
            })
            .collect();
        versions.sort();
        *self.exports.locked() = Some((versions, apis.to_vec()));
    }
}

/// Why reading something from a provider failed: RBAC said no, or anything else (retried).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// RBAC denied it.
    #[error("{0}")]
    Forbidden(String),
    /// Anything else.
    #[error("{0}")]
    Failed(String),
}

impl ProviderError {
    /// Classifies a failed request for `what` (the message names it and never carries a URL).
    pub fn from_kube(what: &str, e: kube::Error) -> Self {
        match e {
            kube::Error::Api(s) if s.is_forbidden() => Self::Forbidden(format!(
                "{what} was denied by RBAC: {}",
                kbind_shared::redact::remote(&s.message)
            )),
            e => Self::Failed(format!(
                "{what} failed: {}",
                kbind_shared::identity::describe_error(&e)
            )),
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        match self {
            Self::Forbidden(m) | Self::Failed(m) => m,
        }
    }
}

/// Reads the Secret a Connection references and returns its validated credential.
pub async fn read_credential(
    consumer: &Client,
    reference: &KubeconfigSecretRef,
    policy: &SecretPolicy,
) -> Result<ProviderCredential, String> {
    read_credential_cached(consumer, reference, policy, None).await
}

/// [`read_credential`], from `cached` when a watch of the Secret has it (`Some(None)`: it does
/// not exist), else from the API.
pub async fn read_credential_cached(
    consumer: &Client,
    reference: &KubeconfigSecretRef,
    policy: &SecretPolicy,
    cached: Option<Option<std::sync::Arc<Secret>>>,
) -> Result<ProviderCredential, String> {
    kbind_shared::credential::check_secret_namespace(reference, &policy.namespaces)?;
    if let Some(secret) = cached {
        return ProviderCredential::from_secret(secret.as_deref(), reference, policy.transport);
    }
    let secrets: Api<Secret> = Api::namespaced(consumer.clone(), &reference.namespace);
    let secret = secrets.get_opt(&reference.name).await.map_err(|e| {
        format!(
            "cannot read Secret {}/{}: {}",
            reference.namespace,
            reference.name,
            kbind_shared::identity::describe_error(&e)
        )
    })?;
    ProviderCredential::from_secret(secret.as_ref(), reference, policy.transport)
}

/// One provider client per Connection, holding only credentials whose cluster identity was
/// verified (see `kbind_shared::credential`): nothing but the Connection reconcile, right after
/// it checked the identity, puts a client here.
pub struct Providers {
    by_connection: Mutex<HashMap<String, Provider>>,
    /// Where identity watches announce the Connection whose provider they see change, and schema
    /// watches the exported CRDs they see change (a watch outlives the term that started it).
    changes: Changes,
}

impl Providers {
    /// No clients yet; their watches will announce into `changes`.
    pub fn new(changes: Changes) -> Self {
        Self {
            by_connection: Default::default(),
            changes,
        }
    }

    /// Starts `provider`'s identity watch of the object `source` names, unless one runs; a change
    /// it shows announces `connection`'s input changed.
    pub fn watch_identity(
        &self,
        provider: &Provider,
        source: kbind_shared::identity::Source,
        connection: &kbind_shared::api::Connection,
    ) {
        let name = kube::ResourceExt::name_any(connection);
        provider.watch_identity(source, &name, self.reconciles(connection));
    }

    /// Announces that what `connection` reads from its provider changed.
    fn reconciles(
        &self,
        connection: &kbind_shared::api::Connection,
    ) -> impl Fn() + Send + Sync + 'static {
        let changes = self.changes.clone();
        let name = kube::ResourceExt::name_any(connection);
        move || changes.announce(Change::ConnectionInput(name.clone()))
    }

    /// A client for `credential`: the verified one if it was built from the same credential,
    /// else a new one that is *not* kept until [`Providers::verified`] says so.
    pub async fn build(
        &self,
        connection: &str,
        credential: ProviderCredential,
        metrics: &Metrics,
    ) -> Result<Provider, String> {
        if let Some(existing) = self.by_connection.locked().get(connection)
            && existing.digest == credential.digest
        {
            return Ok(existing.clone());
        }
        let client = credential
            .kubeconfig
            .counted_client(connection, Some(&metrics.api_requests_total))
            .await
            .map_err(|e| e.to_string())?;
        Ok(Provider {
            client,
            kubeconfig: credential.kubeconfig,
            digest: credential.digest,
            schemas: ProviderSchemas::default(),
            identity: Default::default(),
        })
    }

    /// Keeps `provider` as the Connection's client: its cluster identity matched the pin. A new
    /// client starts its watch of the exported CRDs' versions.
    pub fn verified(&self, connection: &str, provider: &Provider) {
        let mut by_connection = self.by_connection.locked();
        if by_connection
            .get(connection)
            .is_some_and(|kept| kept.digest == provider.digest)
        {
            return;
        }
        let mut kept = provider.clone();
        kept.schemas = ProviderSchemas::watched(&kept.client, connection, self.changes.clone());
        let previous = by_connection.insert(connection.to_owned(), kept);
        if previous.is_some_and(|p| p.digest != provider.digest) {
            tracing::info!(
                connection,
                "provider credentials changed and were verified; using the new client"
            );
        }
    }

    /// The verified provider client of a Connection: the kept one, else one built from its Secret
    /// now if that credential is the one `status.verifiedCredential` records.
    pub async fn for_connection(
        &self,
        consumer: &Client,
        connection: &kbind_shared::api::Connection,
        policy: &SecretPolicy,
        metrics: &Metrics,
    ) -> Result<Provider, String> {
        let name = kube::ResourceExt::name_any(connection);
        let reference = &connection.spec.kubeconfig_secret_ref;
        kbind_shared::credential::check_secret_namespace(reference, &policy.namespaces)?;
        if let Some(existing) = self.by_connection.locked().get(&name) {
            return Ok(existing.clone());
        }
        let credential = read_credential(consumer, reference, policy).await?;
        if !credential.is_verified(connection.status.as_ref()) {
            return Err(format!(
                "the credential in Secret {}/{} has not been verified against the provider's pinned cluster identity yet",
                reference.namespace, reference.name
            ));
        }
        let provider = self.build(&name, credential, metrics).await?;
        self.verified(&name, &provider);
        Ok(provider)
    }

    /// The client kept for a Connection (verified when it was kept), if any: nothing is built.
    pub fn kept(&self, connection: &str) -> Option<Provider> {
        self.by_connection.locked().get(connection).cloned()
    }

    /// Forgets the client of a deleted Connection.
    pub fn forget(&self, connection: &str) {
        self.by_connection.locked().remove(connection);
    }

    /// Forgets every client (their identity watches stop): a replica that stops leading holds no
    /// provider credential in use, whatever happened to the Connections meanwhile.
    pub fn forget_all(&self) {
        self.by_connection.locked().clear();
    }

    /// How many provider clients are kept.
    pub fn len(&self) -> usize {
        self.by_connection.locked().len()
    }

    /// Whether no provider client is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changes::Topic;
    use futures::StreamExt;
    use kube::runtime::reflector::store::Writer;

    fn version(name: &str, resource_version: &str) -> PartialObjectMeta<CustomResourceDefinition> {
        PartialObjectMeta {
            types: None,
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(resource_version.into()),
                ..Default::default()
            },
            _phantom: std::marker::PhantomData,
        }
    }

    fn crd(name: &str, resource_version: &str) -> CustomResourceDefinition {
        CustomResourceDefinition {
            metadata: version(name, resource_version).metadata,
            ..Default::default()
        }
    }

    fn derived(name: &str) -> Derived {
        (crd(name, "0"), Vec::new())
    }

    fn export(name: &str) -> ExportedApi {
        ExportedApi {
            name: name.into(),
            group: "example.org".into(),
            resource: name.split('.').next().unwrap_or_default().into(),
            scope: kbind_shared::api::ApiScope::Namespaced,
            versions: vec!["v1".into()],
            omitted_versions: Vec::new(),
        }
    }

    #[test]
    fn a_derived_schema_is_reused_only_while_the_provider_has_the_version_it_came_from() {
        let mut watch = Writer::<PartialObjectMeta<CustomResourceDefinition>>::default();
        let schemas = ProviderSchemas::over(watch.as_reader(), CancellationToken::new());
        let a = "as.example.org";
        schemas.remember(a, Some("5"), &derived(a));
        assert_eq!(schemas.derived(a), None, "the watch does not show it yet");
        watch.apply_watcher_event(&watcher::Event::Apply(version(a, "5")));
        assert_eq!(schemas.derived(a), Some(derived(a)), "the same version");
        watch.apply_watcher_event(&watcher::Event::Apply(version(a, "6")));
        assert_eq!(schemas.derived(a), None, "a newer version is read fresh");
        schemas.remember(a, Some("6"), &derived(a));
        assert_eq!(schemas.derived(a), Some(derived(a)));
        watch.apply_watcher_event(&watcher::Event::Delete(version(a, "6")));
        assert_eq!(schemas.derived(a), None, "gone from the provider");
        schemas.remember("bs.example.org", None, &derived("bs.example.org"));
        assert_eq!(
            schemas.derived("bs.example.org"),
            None,
            "no version, nothing kept"
        );
    }

    #[test]
    fn discovered_exports_are_reused_only_while_the_provider_has_exactly_those_versions() {
        let (a, b) = ("as.example.org", "bs.example.org");
        let mut watch = Writer::<PartialObjectMeta<CustomResourceDefinition>>::default();
        let schemas = ProviderSchemas::over(watch.as_reader(), CancellationToken::new());
        schemas.remember_exports(&[crd(b, "2"), crd(a, "1")], &[export(a), export(b)]);
        assert_eq!(schemas.exports(), None, "the watch shows none yet");
        watch.apply_watcher_event(&watcher::Event::Apply(version(a, "1")));
        assert_eq!(schemas.exports(), None, "one is missing");
        watch.apply_watcher_event(&watcher::Event::Apply(version(b, "2")));
        assert_eq!(schemas.exports(), Some(vec![export(a), export(b)]));
        watch.apply_watcher_event(&watcher::Event::Apply(version(b, "3")));
        assert_eq!(schemas.exports(), None, "one changed");
        watch.apply_watcher_event(&watcher::Event::Apply(version(b, "2")));
        watch.apply_watcher_event(&watcher::Event::Apply(version("cs.example.org", "9")));
        assert_eq!(schemas.exports(), None, "a new export");
    }

    #[tokio::test]
    async fn identity_watches_announce_their_connection_to_whichever_term_listens() {
        let changes = Changes::default();
        let providers = Providers::new(changes.clone());
        let connection = kbind_shared::api::Connection::new(
            "c",
            kbind_shared::api::ConnectionSpec::for_secret("kbind", "p"),
        );
        let reconcile = providers.reconciles(&connection);
        reconcile(); // no term yet: nobody listens, nothing breaks
        let first = changes.subscribe(&[Topic::ConnectionInput]);
        reconcile();
        // A new term: the same watch's changes reach its controller too.
        let second = changes.subscribe(&[Topic::ConnectionInput]);
        reconcile();
        drop((providers, reconcile, changes));
        let first: Vec<_> = first.collect().await;
        let second: Vec<_> = second.collect().await;
        let announced = Some(Change::ConnectionInput("c".into()));
        assert_eq!(first, [announced.clone(), announced.clone()]);
        assert_eq!(second, [announced]);
    }

    #[test]
    fn without_a_watch_nothing_is_reused() {
        let schemas = ProviderSchemas::default();
        schemas.remember("as.example.org", Some("1"), &derived("as.example.org"));
        schemas.remember_exports(&[crd("as.example.org", "1")], &[export("as.example.org")]);
        assert_eq!(schemas.derived("as.example.org"), None);
        assert_eq!(schemas.exports(), None);
    }
}
