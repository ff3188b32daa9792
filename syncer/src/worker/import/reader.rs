//! Import's provider watch: the objects no consumer has marked, where importing bindings ask.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use kbind_shared::cache::ProviderCopy;
use kbind_shared::keys;
use kbind_shared::namespaced::{Command, Namespaced};
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::task::JoinHandle;

use super::super::state::Worker;
use crate::bindings::ImportRule;

/// Where the provider is read for import.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Reach {
    /// Nowhere: no binding imports the API here.
    Nowhere,
    /// Cluster-wide: a ClusterBinding imports it.
    Cluster,
    /// In these consumer namespaces (mapped into a boundary).
    Namespaces(BTreeSet<String>),
}

/// Where `rules` read, within `buckets` — cluster-wide only outside a boundary (a boundary's
/// credential reads its own namespaces only: a ClusterBinding's import there reads nothing).
pub(super) fn reach(
    rules: &[ImportRule],
    buckets: &super::super::Buckets,
    boundary: bool,
) -> Reach {
    if !boundary && rules.iter().any(|r| r.namespace.is_none()) {
        return Reach::Cluster;
    }
    let namespaces: BTreeSet<String> = rules
        .iter()
        .filter_map(|r| r.namespace.clone())
        .filter(|ns| buckets.contains(Some(ns)))
        .collect();
    if namespaces.is_empty() {
        Reach::Nowhere
    } else {
        Reach::Namespaces(namespaces)
    }
}

/// The provider watch of unmarked objects: its cache, whether it has listed, and its task.
pub(super) struct Reader {
    pub(super) reach: Reach,
    store: Option<Store<ProviderCopy>>,
    listed: Arc<AtomicBool>,
    task: Option<JoinHandle<()>>,
}

impl Drop for Reader {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// The selection of objects no consumer has marked: without any consumer cluster's label.
fn unmarked() -> watcher::Config {
    watcher::Config::default().labels(&format!("!{}", keys::CONSUMER_CLUSTER_UID_LABEL))
}

impl Reader {
    pub(super) fn nowhere() -> Self {
        Reader {
            reach: Reach::Nowhere,
            store: None,
            listed: Arc::new(AtomicBool::new(true)),
            task: None,
        }
    }

    /// Starts reading `reach` for `worker`; each event wakes the importer.
    pub(super) fn start(worker: &Arc<Worker>, reach: Reach) -> Self {
        let (client, dyntype) = (worker.provider.clone(), worker.dyntype.clone());
        let source = match &reach {
            Reach::Nowhere => return Self::nowhere(),
            Reach::Cluster => {
                kbind_shared::streaming::instances(Api::all_with(client, &dyntype), unmarked())
            }
            Reach::Namespaces(namespaces) => {
                let open = kbind_shared::namespaced::in_boundary(
                    worker.spec.namespaces.clone(),
                    move |namespace| {
                        kbind_shared::streaming::instances(
                            Api::namespaced_with(client.clone(), namespace, &dyntype),
                            unmarked(),
                        )
                    },
                );
                let (commands, rx) = futures::channel::mpsc::unbounded();
                for namespace in namespaces {
                    let _ = commands.unbounded_send(Command::Watch(namespace.clone()));
                }
                let _ = commands.unbounded_send(Command::Complete);
                Namespaced::new(open, rx, super::super::feeds::tombstone).boxed()
            }
        };
        let writer = reflector::store::Writer::new(worker.dyntype.clone());
        let store = writer.as_reader();
        let listed = Arc::new(AtomicBool::new(false));
        let (uid, max_bytes) = (
            worker.spec.local_uid.clone(),
            worker.ctx.limits.max_status_bytes,
        );
        let events = reflector::reflector(
            writer,
            futures::TryStreamExt::map_ok(source, move |event| {
                kbind_shared::cache::map_event(event, |o| {
                    ProviderCopy::of(o, &uid).bounded(max_bytes)
                })
            }),
        )
        .default_backoff();
        let (done, wake) = (listed.clone(), worker.clone());
        let api = worker.spec.api.clone();
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::InitDone) => done.store(true, Ordering::Release),
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(%api, error = %e, "import watch");
                        continue;
                    }
                }
                wake.import_wake.notify_one();
            }
        });
        Reader {
            reach,
            store: Some(store),
            listed,
            task: Some(task),
        }
    }

    /// The unmarked provider objects read, if the watch has listed (`Some(empty)`: nothing is
    /// read).
    pub(super) fn objects(&self) -> Option<Vec<Arc<ProviderCopy>>> {
        if !self.listed.load(Ordering::Acquire) {
            return None;
        }
        Some(self.store.as_ref().map(Store::state).unwrap_or_default())
    }
}

/// Whether a provider object may be imported: no consumer's marker of either kind, kbind's
/// managed label absent (another consumer's copy, or one half-written), not being deleted.
pub(super) fn importable(copy: &ProviderCopy) -> bool {
    copy.owner("") == kbind_shared::ownership::Owner::Unmarked && !copy.managed && !copy.terminating
}
#[cfg(test)]
mod tests {
    use super::*;
    use kbind_shared::cache::Instance;
    use serde_json::json;

    fn rule(namespace: Option<&str>) -> ImportRule {
        ImportRule {
            namespace: namespace.map(str::to_owned),
            binding: "b".into(),
            limit: 10,
        }
    }

    #[test]
    fn import_reads_cluster_wide_only_for_a_cluster_binding_outside_a_boundary() {
        let all = crate::worker::Buckets::All;
        let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
        assert_eq!(reach(&[], &all, false), Reach::Nowhere);
        assert_eq!(
            reach(&[rule(Some("a")), rule(Some("b"))], &all, false),
            Reach::Namespaces(set(&["a", "b"]))
        );
        assert_eq!(
            reach(&[rule(Some("a")), rule(None)], &all, false),
            Reach::Cluster
        );
        assert_eq!(
            reach(&[rule(Some("a")), rule(None)], &all, true),
            Reach::Namespaces(set(&["a"]))
        );
        assert_eq!(reach(&[rule(None)], &all, true), Reach::Nowhere);
    }

    #[test]
    fn only_objects_nobody_marked_are_importable() {
        let object = |annotations: serde_json::Value, labels: serde_json::Value, deleting: bool| {
            let mut metadata = json!({ "name": "w", "namespace": "n", "annotations": annotations, "labels": labels });
            if deleting {
                metadata["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
            let instance: Instance =
                serde_json::from_value(json!({ "metadata": metadata, "spec": {} })).unwrap();
            ProviderCopy::of(instance, "me")
        };
        assert!(importable(&object(json!({}), json!({ "app": "x" }), false)));
        assert!(
            !importable(&object(json!({}), json!({}), true)),
            "being deleted"
        );
        assert!(
            !importable(&object(
                json!({}),
                json!({ keys::MANAGED_LABEL: "true" }),
                false
            )),
            "managed by kbind"
        );
        for marker in [
            keys::CONSUMER_CLUSTER_UID_ANNOTATION,
            keys::CONSUMER_OBJECT_UID_ANNOTATION,
        ] {
            assert!(
                !importable(&object(json!({ marker: "x" }), json!({}), false)),
                "{marker}"
            );
        }
    }
}
