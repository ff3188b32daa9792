//! The catalog controllers (`kbind-issuer`'s first duty): each `Export` says whether it is offered
//! — every API it names served by a CRD labelled exported — and each `Collection` how many of
//! the Exports it lists are. Level-triggered on Exports, Collections and the provider's CRDs
//! (names, labels and scopes are all it keeps of a CRD); one status write per change of the
//! truth, none at rest.

pub mod offer;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_shared::api::catalog::{Collection, Export};
use kbind_shared::cache::ChangedNames;
use kbind_shared::keys;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, reflector, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::status::{Error, Written, now, write_status};
use offer::Served;

/// How soon a failed status write is tried again.
const RETRY: Duration = Duration::from_secs(5);

struct Catalog {
    client: Client,
    crds: Store<CustomResourceDefinition>,
    exports: Store<Export>,
    metrics: kbind_shared::metrics::Metrics,
    written: Written,
}

/// Runs both catalog controllers until `stop`.
pub async fn run(client: Client, metrics: kbind_shared::metrics::Metrics, stop: CancellationToken) {
    // The provider's CRDs, each held as its name, labels and scope only (a schema can be
    // megabytes; the catalog never reads one), and the Exports as the Collections read them. Each
    // cache names what changed once it holds the change — re-lists included — so a reconcile it
    // triggers reads what triggered it.
    let (crds, writer) = reflector::store();
    let (crd_changed, crd_changes) = futures::channel::mpsc::unbounded::<String>();
    kbind_shared::cache::observe_modified(
        writer,
        Api::<CustomResourceDefinition>::all(client.clone()),
        watcher::Config::default(),
        stop.clone(),
        slim,
        changed_names(crd_changed),
    );
    let (exports, writer) = reflector::store();
    let (export_changed, export_changes) = futures::channel::mpsc::unbounded::<String>();
    kbind_shared::cache::observe(
        writer,
        Api::<Export>::all(client.clone()),
        watcher::Config::default(),
        stop.clone(),
        changed_names(export_changed),
    );
    // Nothing is judged before the truth is known: an Export looked at before the CRDs are would
    // say `UnknownAPI` for a moment, a Collection `no such Export`.
    let ready = async {
        let _ = crds.wait_until_ready().await;
        let _ = exports.wait_until_ready().await;
    };
    tokio::select! {
        _ = ready => {}
        _ = stop.cancelled() => return,
    }
    for controller in ["export", "collection"] {
        kbind_shared::metrics::Metrics::init_counters(
            &metrics.reconcile_errors_total,
            controller,
            &["status-write"],
        );
    }
    let catalog = Arc::new(Catalog {
        client: client.clone(),
        crds,
        exports,
        metrics,
        written: Written::default(),
    });

    // An Export is looked at when it changes, and when a CRD it names does.
    let export_controller = Controller::new(
        Api::<Export>::all(client.clone()),
        watcher::Config::default(),
    );
    let named_by = export_controller.store();
    let export_controller = export_controller
        .reconcile_on(crd_changes.flat_map(move |name| {
            futures::stream::iter(
                named_by
                    .state()
                    .into_iter()
                    .filter(|e| e.spec.apis.iter().any(|a| a.name == name))
                    .map(|e| ObjectRef::from_obj(e.as_ref()))
                    .collect::<Vec<_>>(),
            )
        }))
        .graceful_shutdown_on({
            let stop = stop.clone();
            async move { stop.cancelled().await }
        })
        .run(reconcile_export, error_policy, catalog.clone())
        .for_each(|_| async {});

    // A Collection is looked at when it changes, and when an Export it lists does.
    let collection_controller =
        Controller::new(Api::<Collection>::all(client), watcher::Config::default());
    let listing = collection_controller.store();
    let collection_controller = collection_controller
        .reconcile_on(export_changes.flat_map(move |name| {
            futures::stream::iter(
                listing
                    .state()
                    .into_iter()
                    .filter(|c| c.spec.exports.iter().any(|e| e.name == name))
                    .map(|c| ObjectRef::from_obj(c.as_ref()))
                    .collect::<Vec<_>>(),
            )
        }))
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(reconcile_collection, error_policy, catalog)
        .for_each(|_| async {});
    futures::join!(export_controller, collection_controller);
}

/// A cache observer sending the name of each object a watch shows changed (see
/// [`ChangedNames`]).
fn changed_names<K: Resource>(
    sender: futures::channel::mpsc::UnboundedSender<String>,
) -> impl Fn(Result<&watcher::Event<K>, &watcher::Error>) + Send + 'static {
    let names = std::sync::Mutex::new(ChangedNames::default());
    move |event| {
        let Ok(event) = event else { return };
        let changed = names
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .observe(event);
        for key in changed {
            let _ = sender.unbounded_send(key.name);
        }
    }
}

fn error_policy<K>(object: Arc<K>, error: &Error, catalog: Arc<Catalog>) -> Action
where
    K: Resource<DynamicType = ()>,
{
    let controller = K::kind(&()).to_lowercase();
    tracing::warn!(%controller, name = %object.meta().name.clone().unwrap_or_default(), %error, "catalog reconcile failed");
    catalog
        .metrics
        .reconcile_errors_total
        .with_label_values(&[controller.as_str(), "status-write"])
        .inc();
    Action::requeue(RETRY)
}

/// What the catalog keeps of a CRD: its name, labels and scope.
fn slim(crd: &mut CustomResourceDefinition) {
    crd.metadata.annotations = None;
    crd.metadata.managed_fields = None;
    crd.spec.versions.clear();
    crd.spec.conversion = None;
    crd.status = None;
}

/// How the provider serves `name`, as its CRDs say: the label alone decides, as in the core's
/// discovery (only the exact value "true").
fn served(crds: &Store<CustomResourceDefinition>, name: &str) -> Served {
    let Some(crd) = crds.get(&ObjectRef::new(name)) else {
        return Served::Absent;
    };
    let scope = crd.spec.scope.clone();
    if crd.labels().get(keys::EXPORTED_LABEL).map(String::as_str) == Some(keys::TRUE) {
        Served::Exported(scope)
    } else {
        Served::Unlabelled(scope)
    }
}

async fn reconcile_export(export: Arc<Export>, catalog: Arc<Catalog>) -> Result<Action, Error> {
    let truth: BTreeMap<String, Served> = export
        .spec
        .apis
        .iter()
        .map(|a| (a.name.clone(), served(&catalog.crds, &a.name)))
        .collect();
    let status = offer::export_status(
        &export.spec,
        export.metadata.generation,
        &truth,
        export.status.as_ref(),
        &now(),
    );
    let (key, version) = (
        format!("export/{}", export.name_any()),
        export.resource_version(),
    );
    if catalog
        .written
        .needed(&key, version.as_ref(), export.status.as_ref(), &status)
    {
        write_status::<Export>(&catalog.client, &export.name_any(), &status).await?;
        catalog.written.wrote(&key, version.as_ref(), &status);
    }
    Ok(Action::await_change())
}

async fn reconcile_collection(
    collection: Arc<Collection>,
    catalog: Arc<Catalog>,
) -> Result<Action, Error> {
    let exports: BTreeMap<String, bool> = collection
        .spec
        .exports
        .iter()
        .filter_map(|e| {
            let export = catalog.exports.get(&ObjectRef::new(&e.name))?;
            // Offered for the generation it describes: an edited Export counts once looked at.
            let current = export.status.as_ref().and_then(|s| s.observed_generation)
                == export.metadata.generation;
            Some((
                e.name.clone(),
                current && offer::offered(export.status.as_ref()),
            ))
        })
        .collect();
    let status = offer::collection_status(
        &collection.spec,
        collection.metadata.generation,
        &exports,
        collection.status.as_ref(),
        &now(),
    );
    let key = format!("collection/{}", collection.name_any());
    let version = collection.resource_version();
    if catalog
        .written
        .needed(&key, version.as_ref(), collection.status.as_ref(), &status)
    {
        write_status::<Collection>(&catalog.client, &collection.name_any(), &status).await?;
        catalog.written.wrote(&key, version.as_ref(), &status);
    }
    Ok(Action::await_change())
}
