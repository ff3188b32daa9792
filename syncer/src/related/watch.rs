//! The related worker's watches: in the binding's scope, the sources its entries read and the
//! labelled copies on the target side, each a reflector store with its health.

use kbind_shared::sync::Locked;
use std::sync::{Arc, Mutex};

use futures::channel::mpsc::UnboundedReceiver;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kbind_shared::api::RelatedResourceKind;
use kbind_shared::keys;
use kbind_shared::namespaced::{Command, Namespaced};
use kbind_shared::streaming::Events;
use kube::Api;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::plan::{self, Item, Side};

/// What a watch has done so far.
#[derive(Debug, Default)]
pub(super) struct Health {
    pub(super) listed: bool,
    pub(super) error: Option<String>,
    pub(super) forbidden: bool,
}

pub(super) struct Watched {
    pub(super) store: Store<DynamicObject>,
    pub(super) health: Arc<Mutex<Health>>,
}

/// Sources are all objects of a kind in scope; targets only kbind's labelled copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Role {
    Source,
    Target,
}

pub(super) fn resource(kind: RelatedResourceKind) -> ApiResource {
    match kind {
        RelatedResourceKind::Secrets => ApiResource::erase::<Secret>(&()),
        RelatedResourceKind::Configmaps => ApiResource::erase::<ConfigMap>(&()),
    }
}

/// A server-side label selector for a source watch when every entry reading this kind from this
/// side selects by labels with `matchLabels` only: the watch then carries only what can match.
pub(super) fn source_filter(
    entries: &[kbind_shared::api::RelatedResource],
    kind: RelatedResourceKind,
    side: Side,
) -> Option<String> {
    let mut common: Option<String> = None;
    for entry in entries
        .iter()
        .filter(|e| e.resource == kind && plan::sides(e.direction).0 == side)
    {
        let selector = entry.selector.as_ref()?.label_selector.as_ref()?;
        if selector
            .match_expressions
            .as_ref()
            .is_some_and(|e| !e.is_empty())
        {
            return None;
        }
        let labels = selector.match_labels.as_ref().filter(|l| !l.is_empty())?;
        let text = labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        match &common {
            None => common = Some(text),
            Some(existing) if *existing == text => {}
            Some(_) => return None,
        }
    }
    common
}

/// What a cached object keeps: kbind's decisions read the name, namespace, UID, labels and
/// annotations, and the payload only of sources an entry selects. Everything else —
/// managedFields above all — and the payload of every object no entry reads is dropped before
/// the cache holds it, so a broad watch (a ClusterBinding's, every namespace) costs little for
/// the objects it does not copy.
pub(super) fn slim(object: &mut DynamicObject, selected: impl Fn(&DynamicObject) -> bool) {
    let keep = selected(object);
    let meta = std::mem::take(&mut object.metadata);
    object.metadata = kube::api::ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        resource_version: meta.resource_version,
        labels: meta.labels,
        annotations: meta.annotations,
        deletion_timestamp: meta.deletion_timestamp,
        ..Default::default()
    };
    if !keep {
        object.data = serde_json::Value::Object(Default::default());
    }
}

/// The selector of a target watch on `side`: kbind's copies — on the provider only this consumer
/// cluster's (`local_uid`), by the label every provider copy carries (#50.5), so that another
/// consumer's related copies are never read.
pub(super) fn target_selector(side: Side, local_uid: &str) -> String {
    let managed = format!("{}={}", keys::MANAGED_LABEL, keys::TRUE);
    match side {
        Side::Consumer => managed,
        Side::Provider => format!("{managed},{}={local_uid}", keys::CONSUMER_CLUSTER_UID_LABEL),
    }
}

/// Where a watch looks.
pub(super) enum Scope {
    /// One namespace (every one when `None`), named alike on both sides.
    Plain(Option<String>),
    /// The provider in a Connection's boundary (#51): the (consumer) namespaces the commands
    /// name, each mapped ([`kbind_shared::namespaced`]) — a Binding's own, a ClusterBinding's
    /// where its bound objects are and those its entries list ([`Told`]).
    Namespaces(
        UnboundedReceiver<Command>,
        kbind_shared::boundary::NamespaceMap,
    ),
}

/// One watch of `kind` in `scope`, selected by `labels`, each object as [`slim`] leaves it and
/// held under its consumer namespace.
#[allow(clippy::too_many_arguments)]
pub(super) fn watch(
    client: Client,
    kind: RelatedResourceKind,
    scope: Scope,
    labels: Option<String>,
    selected: impl Fn(&DynamicObject) -> bool + Send + 'static,
    stop: CancellationToken,
    changes: Arc<Notify>,
) -> Watched {
    let resource = resource(kind);
    let config = match labels {
        Some(labels) => watcher::Config::default().labels(&labels),
        None => watcher::Config::default(),
    };
    let events: Events<DynamicObject> = match scope {
        Scope::Plain(namespace) => watcher(
            kbind_shared::dynamic::scoped(&client, namespace.as_deref(), &resource),
            config.clone(),
        )
        .boxed(),
        Scope::Namespaces(commands, map) => {
            let (client, resource, config) = (client.clone(), resource.clone(), config.clone());
            let open = kbind_shared::namespaced::in_boundary(map, move |namespace| {
                watcher(
                    Api::namespaced_with(client.clone(), namespace, &resource),
                    config.clone(),
                )
                .boxed()
            });
            Namespaced::new(open, commands, |namespace, name| DynamicObject {
                types: None,
                metadata: kube::api::ObjectMeta {
                    namespace: Some(namespace.to_owned()),
                    name: Some(name.to_owned()),
                    ..Default::default()
                },
                data: serde_json::Value::Null,
            })
            .boxed()
        }
    };
    let writer = reflector::store::Writer::<DynamicObject>::new(resource);
    let store = writer.as_reader();
    let health = Arc::new(Mutex::new(Health::default()));
    let events = events
        .map_ok(move |event| event.modify(|object| slim(object, &selected)))
        .boxed();
    kbind_shared::cache::observe_stream(writer, events, stop, {
        let health = health.clone();
        move |event| {
            let mut health = health.locked();
            match event {
                Ok(watcher::Event::InitDone) => {
                    health.listed = true;
                    health.error = None;
                    health.forbidden = false;
                }
                Ok(_) => {}
                Err(e) => {
                    health.forbidden = matches!(e, watcher::Error::InitialListFailed(kube::Error::Api(s)) | watcher::Error::WatchStartFailed(kube::Error::Api(s)) if s.is_forbidden());
                    health.error = Some(e.to_string());
                }
            }
            changes.notify_one();
        }
    });
    Watched { store, health }
}

/// Which consumer namespaces hold objects of one bound API (names only; see
/// `kbind_shared::cache::spawn_names`).
pub(super) struct Occupancy {
    pub(super) api: String,
    pub(super) store: Store<kube::core::PartialObjectMeta<DynamicObject>>,
    pub(super) health: Arc<Mutex<Health>>,
}

/// Watches where `resource`'s objects are. `changes` is told when the cache has listed and when an
/// object appears in a namespace not seen before (a namespace emptied is noticed at the next pass:
/// removing a copy is never urgent, creating one where it may not go must not happen).
/// What a ClusterBinding's occupancy watches tell its provider watches in a boundary: each
/// namespace its bound objects are in, and, once every one of them has listed, that the first
/// list is complete.
pub(super) struct Told {
    watches: Vec<futures::channel::mpsc::UnboundedSender<Command>>,
    /// Occupancy watches that have not listed yet.
    waiting: std::sync::atomic::AtomicUsize,
}

impl Told {
    /// Tells `watches`, for `occupancies` occupancy watches, that the namespaces `listed` are to
    /// be watched (those the entries name); complete at once without occupancy.
    pub(super) fn new(
        watches: Vec<futures::channel::mpsc::UnboundedSender<Command>>,
        occupancies: usize,
        listed: impl IntoIterator<Item = String>,
    ) -> Arc<Self> {
        let told = Arc::new(Told {
            watches,
            waiting: occupancies.into(),
        });
        for namespace in listed {
            told.tell(&Command::Watch(namespace));
        }
        if occupancies == 0 {
            told.tell(&Command::Complete);
        }
        told
    }

    fn tell(&self, command: &Command) {
        for watch in &self.watches {
            let _ = watch.unbounded_send(command.clone());
        }
    }

    /// One occupancy watch listed for the first time.
    fn listed(&self) {
        if self
            .waiting
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
            == 1
        {
            self.tell(&Command::Complete);
        }
    }
}

pub(super) fn occupancy(
    client: Client,
    api: String,
    resource: &ApiResource,
    stop: CancellationToken,
    changes: Arc<Notify>,
    told: Option<Arc<Told>>,
) -> Occupancy {
    let health = Arc::new(Mutex::new(Health::default()));
    let seen = Mutex::new(std::collections::HashSet::<String>::new());
    let store = kbind_shared::cache::spawn_names(client, resource, stop, {
        let health = health.clone();
        move |event| match event {
            Ok(watcher::Event::InitDone) => {
                let mut health = health.locked();
                if !health.listed
                    && let Some(told) = &told
                {
                    told.listed();
                }
                health.listed = true;
                health.error = None;
                health.forbidden = false;
                changes.notify_one();
            }
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                let namespace = o.namespace().unwrap_or_default();
                if let Some(told) = &told {
                    told.tell(&Command::Watch(namespace.clone()));
                }
                if seen.locked().insert(namespace) && health.locked().listed {
                    changes.notify_one();
                }
            }
            Ok(_) => {}
            Err(e) => {
                let mut health = health.locked();
                health.forbidden = matches!(e, watcher::Error::InitialListFailed(kube::Error::Api(s)) | watcher::Error::WatchStartFailed(kube::Error::Api(s)) if s.is_forbidden());
                health.error = Some(e.to_string());
                changes.notify_one();
            }
        }
    });
    Occupancy { api, store, health }
}

pub(super) fn item(object: &DynamicObject) -> Item {
    Item {
        namespace: object.namespace().unwrap_or_default(),
        name: object.name_any(),
        uid: object.metadata.uid.clone().unwrap_or_default(),
        labels: object.labels().clone(),
        annotations: object.annotations().clone(),
        payload: plan::PAYLOAD_FIELDS
            .iter()
            .filter_map(|f| object.data.get(*f).map(|v| ((*f).to_owned(), v.clone())))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {
                "name": "db", "namespace": "team-a", "uid": "u1", "resourceVersion": "7",
                "labels": { "app": "db" }, "annotations": { "core.kbind.io/related-binding": "b" },
                "managedFields": [{ "manager": "kubectl", "operation": "Apply", "fieldsV1": { "f:data": { "f:password": {} } } }],
                "ownerReferences": [{ "apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "o" }],
            },
            "data": { "password": "czNjcmV0" },
            "type": "Opaque",
        }))
        .unwrap()
    }

    #[test]
    fn cached_objects_keep_what_decisions_read_and_payloads_only_when_selected() {
        // #32.2: a broad related watch holds bounded bytes for the objects it does not copy.
        let mut kept = secret();
        slim(&mut kept, |_| true);
        assert_eq!(kept.metadata.managed_fields, None);
        assert_eq!(kept.metadata.owner_references, None);
        assert_eq!(kept.metadata.uid.as_deref(), Some("u1"));
        assert_eq!(kept.labels().get("app").map(String::as_str), Some("db"));
        assert!(
            kept.annotations()
                .contains_key("core.kbind.io/related-binding")
        );
        assert_eq!(item(&kept).payload["data"]["password"], "czNjcmV0");

        let mut unread = secret();
        slim(&mut unread, |_| false);
        assert_eq!(unread.data, serde_json::json!({}));
        assert_eq!(unread.metadata.name.as_deref(), Some("db"));
        assert!(item(&unread).payload.is_empty());
        let size = |o: &DynamicObject| serde_json::to_string(o).unwrap().len();
        assert!(
            size(&unread) < size(&secret()) / 2,
            "{} vs {}",
            size(&unread),
            size(&secret())
        );
    }
}
