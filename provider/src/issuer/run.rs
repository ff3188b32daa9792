//! The Grant controller's I/O: caches of what it wrote (label-selected by boundary), triggers
//! from them, and the writes [`super::plan`] decides — each only where the cache differs, so a
//! Grant at rest costs no request.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kbind_shared::api::catalog::Export;
use kbind_shared::api::iam::Grant;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::plan::{self, Claim, Decision, Kind};
use crate::status::{FIELD_MANAGER, Written, now, write_status};

/// How soon a failed reconcile is tried again.
const RETRY: Duration = Duration::from_secs(5);
/// How often a Grant one of whose objects someone else holds looks again (that object is not in
/// the issuer's caches, so its removal triggers nothing).
const TAKEN_RECHECK: Duration = Duration::from_secs(30);

/// A failed reconcile.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct Error {
    what: String,
    /// Which write (the `reason` label of `kbind_reconcile_errors_total{controller="grant"}`).
    step: &'static str,
    #[source]
    source: kube::Error,
}

/// The steps a Grant's reconcile can fail at.
const STEPS: [&str; 4] = ["namespace", "apply", "delete", "status-write"];

/// What the issuer wrote, as its caches hold it.
struct Owned {
    namespaces: Store<Namespace>,
    accounts: Store<ServiceAccount>,
    roles: Store<Role>,
    role_bindings: Store<RoleBinding>,
    cluster_roles: Store<ClusterRole>,
    cluster_role_bindings: Store<ClusterRoleBinding>,
}

impl Owned {
    /// The cached object of `kind` at `namespace/name`, as JSON.
    fn get(&self, kind: Kind, namespace: Option<&str>, name: &str) -> Option<Value> {
        fn json<K: Resource<DynamicType = ()> + Clone + serde::Serialize>(
            store: &Store<K>,
            namespace: Option<&str>,
            name: &str,
        ) -> Option<Value> {
            let key = match namespace {
                Some(ns) => ObjectRef::new(name).within(ns),
                None => ObjectRef::new(name),
            };
            store
                .get(&key)
                .and_then(|o| serde_json::to_value(o.as_ref()).ok())
        }
        match kind {
            Kind::ServiceAccount => json(&self.accounts, namespace, name),
            Kind::Role => json(&self.roles, namespace, name),
            Kind::RoleBinding => json(&self.role_bindings, namespace, name),
            Kind::ClusterRole => json(&self.cluster_roles, namespace, name),
            Kind::ClusterRoleBinding => json(&self.cluster_role_bindings, namespace, name),
        }
    }
}

fn api_resource(kind: Kind) -> ApiResource {
    match kind {
        Kind::ServiceAccount => ApiResource::erase::<ServiceAccount>(&()),
        Kind::Role => ApiResource::erase::<Role>(&()),
        Kind::RoleBinding => ApiResource::erase::<RoleBinding>(&()),
        Kind::ClusterRole => ApiResource::erase::<ClusterRole>(&()),
        Kind::ClusterRoleBinding => ApiResource::erase::<ClusterRoleBinding>(&()),
    }
}

struct Issuer {
    client: Client,
    grants: Store<Grant>,
    exports: Store<Export>,
    owned: Owned,
    metrics: kbind_shared::metrics::Metrics,
    written: Written,
}

type Triggers = futures::channel::mpsc::UnboundedSender<ObjectRef<Grant>>;

/// The Grants by boundary, as their watch shows them: which Grants an object labelled with a
/// boundary concerns (all that compute it — one holds it, others wait for it), without hashing
/// every Grant per event.
#[derive(Default, Clone)]
struct Boundaries(Arc<std::sync::Mutex<super::index::Index>>);

impl Boundaries {
    fn locked(&self) -> std::sync::MutexGuard<'_, super::index::Index> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sends a trigger for each Grant of `boundary`.
    fn trigger(&self, boundary: &str, triggers: &Triggers) {
        for name in self.locked().grants(boundary) {
            let _ = triggers.unbounded_send(ObjectRef::new(&name));
        }
    }
}

/// A cache of `K` labelled with a boundary, each change triggering the Grants of its boundary.
fn owned_cache<K>(
    client: &Client,
    stop: &CancellationToken,
    triggers: &Triggers,
    boundaries: &Boundaries,
    selector: &str,
) -> Store<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let (triggers, boundaries) = (triggers.clone(), boundaries.clone());
    kbind_shared::cache::observe_modified(
        writer,
        Api::<K>::all(client.clone()),
        watcher::Config::default().labels(selector),
        stop.clone(),
        // Who wrote which field is never compared: not kept.
        |o| o.meta_mut().managed_fields = None,
        move |event| {
            let Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) = event else {
                return;
            };
            if let Some(boundary) = o.labels().get(plan::BOUNDARY_LABEL) {
                boundaries.trigger(boundary, &triggers);
            }
        },
    );
    store
}

/// Runs the Grant controller until `stop`.
pub async fn run(client: Client, metrics: kbind_shared::metrics::Metrics, stop: CancellationToken) {
    let (triggers, triggered) = futures::channel::mpsc::unbounded::<ObjectRef<Grant>>();
    let boundaries = Boundaries::default();
    // The Grants by boundary; a Grant deleted triggers the others of its boundary (one may be
    // waiting for it).
    {
        let (triggers, boundaries) = (triggers.clone(), boundaries.clone());
        kbind_shared::cache::observe_uncached(
            Api::<Grant>::all(client.clone()),
            watcher::Config::default(),
            stop.clone(),
            move |event| {
                let Ok(event) = event else { return };
                let freed = boundaries.locked().observe(event);
                for boundary in freed {
                    boundaries.trigger(&boundary, &triggers);
                }
            },
        );
    }
    let written = format!(
        "{},{}={}",
        plan::BOUNDARY_LABEL,
        plan::MANAGED_BY_LABEL,
        plan::MANAGED_BY
    );
    let owned = Owned {
        // Boundaries and the namespaces of them (a consumer creates those: not the issuer's).
        namespaces: owned_cache(&client, &stop, &triggers, &boundaries, plan::BOUNDARY_LABEL),
        // The rest: only what the issuer wrote — nothing else is compared, updated or deleted.
        accounts: owned_cache(&client, &stop, &triggers, &boundaries, &written),
        roles: owned_cache(&client, &stop, &triggers, &boundaries, &written),
        role_bindings: owned_cache(&client, &stop, &triggers, &boundaries, &written),
        cluster_roles: owned_cache(&client, &stop, &triggers, &boundaries, &written),
        cluster_role_bindings: owned_cache(&client, &stop, &triggers, &boundaries, &written),
    };
    let (exports, writer) = reflector::store::<Export>();
    let (export_changed, export_changes) = futures::channel::mpsc::unbounded::<String>();
    kbind_shared::cache::observe(
        writer,
        Api::<Export>::all(client.clone()),
        watcher::Config::default(),
        stop.clone(),
        move |event| {
            if let Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) = event {
                let _ = export_changed.unbounded_send(o.name_any());
            }
        },
    );
    // Nothing is decided before the caches hold the truth: a Grant looked at before its boundary
    // is known would try to create it again.
    let ready = async {
        let _ = owned.namespaces.wait_until_ready().await;
        let _ = owned.accounts.wait_until_ready().await;
        let _ = owned.roles.wait_until_ready().await;
        let _ = owned.role_bindings.wait_until_ready().await;
        let _ = owned.cluster_roles.wait_until_ready().await;
        let _ = owned.cluster_role_bindings.wait_until_ready().await;
        let _ = exports.wait_until_ready().await;
    };
    tokio::select! {
        _ = ready => {}
        _ = stop.cancelled() => return,
    }
    kbind_shared::metrics::Metrics::init_counters(&metrics.reconcile_errors_total, "grant", &STEPS);

    // The Grants, kept without who wrote which field (never read).
    let (grants, writer) = reflector::store();
    let stream = watcher::watcher(
        Api::<Grant>::all(client.clone()),
        watcher::Config::default(),
    )
    .modify(|g| g.metadata.managed_fields = None)
    .default_backoff()
    .reflect(writer)
    .touched_objects();
    let controller = Controller::for_stream(stream, grants.clone());
    let naming = grants.clone();
    let issuer = Arc::new(Issuer {
        client,
        grants,
        exports,
        owned,
        metrics,
        written: Written::default(),
    });
    controller
        .reconcile_on(triggered)
        .reconcile_on(export_changes.flat_map(move |export| {
            futures::stream::iter(
                naming
                    .state()
                    .into_iter()
                    .filter(|g| g.spec.export == export)
                    .map(|g| ObjectRef::from_obj(g.as_ref()))
                    .collect::<Vec<_>>(),
            )
        }))
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(reconcile, error_policy, issuer)
        .for_each(|_| async {})
        .await;
}

fn error_policy(grant: Arc<Grant>, error: &Error, issuer: Arc<Issuer>) -> Action {
    tracing::warn!(grant = %grant.name_any(), %error, "grant reconcile failed");
    issuer
        .metrics
        .reconcile_errors_total
        .with_label_values(&["grant", error.step])
        .inc();
    Action::requeue(RETRY)
}

async fn reconcile(grant: Arc<Grant>, issuer: Arc<Issuer>) -> Result<Action, Error> {
    if grant.metadata.deletion_timestamp.is_some() {
        // The API server's garbage collector removes what the Grant owns.
        return Ok(Action::await_change());
    }
    let (name, uid) = (grant.name_any(), grant.uid().unwrap_or_default());
    let boundary = plan::boundary_of(&grant);
    let export = issuer.exports.get(&ObjectRef::new(&grant.spec.export));
    let offer = plan::offered(&grant.spec.export, export.as_deref());
    let cached = issuer.owned.namespaces.get(&ObjectRef::new(&boundary));
    let claim = issuer.claim(&name, &uid, &boundary, cached.as_deref());
    let mut decision = plan::decide(claim, &offer, &boundary);
    let mut retry = None;
    if let Decision::Provision { claim, .. } = &decision
        && let Some(found) = issuer.hold_boundary(&name, &uid, &boundary, claim).await?
    {
        decision = plan::decide(found, &offer, &boundary);
        if matches!(decision, Decision::Provision { .. }) {
            // Created meanwhile by the issuer itself: decided again once the cache shows it.
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
    }
    if let Decision::Provision { export, .. } = &decision {
        let labelled: Vec<(String, String)> = issuer
            .owned
            .namespaces
            .state()
            .iter()
            .map(|n| {
                let label = n.labels().get(plan::BOUNDARY_LABEL).cloned();
                (n.name_any(), label.unwrap_or_default())
            })
            .collect();
        let of = plan::namespaces_of(
            &boundary,
            labelled.iter().map(|(n, l)| (n.as_str(), l.as_str())),
        );
        let (wanted, unwanted) =
            plan::objects((&name, &uid), &boundary, *export, grant.spec.revoked, &of);
        if let Some(taken) = issuer.converge(&wanted, &unwanted).await? {
            decision = Decision::Refuse {
                reason: plan::reasons::OBJECT_TAKEN,
                message: taken,
            };
            retry = Some(TAKEN_RECHECK);
        }
    }
    let status = plan::status(&grant, &boundary, &decision, &offer, &now());
    let key = format!("grant/{name}");
    let version = grant.resource_version();
    if issuer
        .written
        .needed(&key, version.as_ref(), grant.status.as_ref(), &status)
    {
        write_status::<Grant>(&issuer.client, &name, &status)
            .await
            .map_err(|e| Error {
                what: e.what,
                step: "status-write",
                source: e.source,
            })?;
        issuer.written.wrote(&key, version.as_ref(), &status);
    }
    Ok(retry.map_or_else(Action::await_change, Action::requeue))
}

impl Issuer {
    fn claim(&self, name: &str, uid: &str, boundary: &str, ns: Option<&Namespace>) -> Claim {
        plan::claim(name, uid, boundary, ns, |other| {
            self.grants
                .get(&ObjectRef::new(other))
                .filter(|g| g.metadata.deletion_timestamp.is_none())
                .and_then(|g| g.uid())
        })
    }

    /// Creates or re-claims the boundary as `claim` says. `Some(claim)` when the API server shows
    /// a namespace the cache did not (created meanwhile): where the Grant stands with it.
    async fn hold_boundary(
        &self,
        name: &str,
        uid: &str,
        boundary: &str,
        claim: &Claim,
    ) -> Result<Option<Claim>, Error> {
        let api = Api::<Namespace>::all(self.client.clone());
        let failed = |source| Error {
            what: format!("boundary namespace {boundary}"),
            step: "namespace",
            source,
        };
        let annotations = json!({
            plan::GRANT_ANNOTATION: name,
            plan::GRANT_UID_ANNOTATION: uid,
        });
        match claim {
            Claim::Create => {
                let body: Namespace = serde_json::from_value(json!({
                    "metadata": {
                        "name": boundary,
                        "labels": { plan::BOUNDARY_LABEL: boundary, plan::MANAGED_BY_LABEL: plan::MANAGED_BY },
                        "annotations": annotations,
                    }
                }))
                .unwrap_or_default();
                match api.create(&PostParams::default(), &body).await {
                    Ok(_) => Ok(None),
                    Err(kube::Error::Api(e)) if e.code == 409 => {
                        // Never overwritten: where the Grant stands with what is there.
                        let there = api.get_opt(boundary).await.map_err(failed)?;
                        let claim = self.claim(name, uid, boundary, there.as_ref());
                        Ok(match claim {
                            Claim::Held => None,
                            other => Some(other),
                        })
                    }
                    Err(e) => Err(failed(e)),
                }
            }
            Claim::Reclaim(version) => {
                let patch = json!({
                    "metadata": { "resourceVersion": version, "annotations": annotations }
                });
                api.patch(boundary, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(|_| None)
                    .map_err(failed)
            }
            _ => Ok(None),
        }
    }

    /// Applies each of `wanted` the cache does not hold, and deletes each of `unwanted` it does.
    async fn converge(
        &self,
        wanted: &[plan::Object],
        unwanted: &[plan::Object],
    ) -> Result<Option<String>, Error> {
        for object in wanted {
            let cached = self
                .owned
                .get(object.kind, object.namespace.as_deref(), &object.name);
            match cached {
                Some(cached) if plan::holds(&cached, &object.body) => continue,
                // The issuer's own (the cache holds only what it labelled): brought in line.
                Some(_) => self.apply(object).await?,
                // Created, never over what stands there: one of the issuer's that the cache does
                // not show yet is brought in line; anyone else's is left alone and named.
                None => {
                    if let Some(taken) = self.create(object).await? {
                        return Ok(Some(taken));
                    }
                }
            }
        }
        for object in unwanted {
            if self
                .owned
                .get(object.kind, object.namespace.as_deref(), &object.name)
                .is_none()
            {
                continue;
            }
            match self
                .api(object)
                .delete(&object.name, &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(source) => {
                    return Err(Error {
                        what: format!("deleting {:?} {}", object.kind, path(object)),
                        step: "delete",
                        source,
                    });
                }
            }
        }
        Ok(None)
    }

    /// One server-side apply of `object` as the issuer (it is the issuer's).
    async fn apply(&self, object: &plan::Object) -> Result<(), Error> {
        self.api(object)
            .patch(
                &object.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&object.body),
            )
            .await
            .map(|_| ())
            .map_err(|source| Error {
                what: format!("applying {:?} {}", object.kind, path(object)),
                step: "apply",
                source,
            })
    }

    /// Creates `object`; if one of that name exists, applies over it only when it is the
    /// issuer's (labelled so, for this boundary), else returns what stands there.
    async fn create(&self, object: &plan::Object) -> Result<Option<String>, Error> {
        let api = self.api(object);
        let failed = |source| Error {
            what: format!("creating {:?} {}", object.kind, path(object)),
            step: "apply",
            source,
        };
        let body: DynamicObject = serde_json::from_value(object.body.clone())
            .map_err(|e| failed(kube::Error::SerdeError(e)))?;
        match api
            .create(
                &PostParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..PostParams::default()
                },
                &body,
            )
            .await
        {
            Ok(_) => return Ok(None),
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(failed(e)),
        }
        let there = api.get_opt(&object.name).await.map_err(failed)?;
        let label = |o: &DynamicObject, key: &str| o.labels().get(key).cloned();
        let wanted_boundary = object.body["metadata"]["labels"][plan::BOUNDARY_LABEL].as_str();
        match there {
            None => Ok(None),
            Some(o)
                if label(&o, plan::MANAGED_BY_LABEL).as_deref() == Some(plan::MANAGED_BY)
                    && label(&o, plan::BOUNDARY_LABEL).as_deref() == wanted_boundary =>
            {
                self.apply(object).await.map(|()| None)
            }
            Some(_) => Ok(Some(format!(
                "{:?} {} exists and was not created by kbind-issuer for this boundary: it is never taken over (delete or rename it)",
                object.kind,
                path(object)
            ))),
        }
    }

    fn api(&self, object: &plan::Object) -> Api<DynamicObject> {
        let resource = api_resource(object.kind);
        match &object.namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &resource),
            None => Api::all_with(self.client.clone(), &resource),
        }
    }
}

fn path(object: &plan::Object) -> String {
    match &object.namespace {
        Some(ns) => format!("{ns}/{}", object.name),
        None => object.name.clone(),
    }
}
