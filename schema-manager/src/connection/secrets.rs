//! Watching only the Secrets that Connections reference (improving on QRK-7, which watched every
//! Secret): one name-scoped watch per referenced Secret, feeding the Connection controller, and
//! caching the Secret so that a reconcile reads it without a request (at rest, nothing is read).

use crate::changes::{Change, Changes};
use kbind_shared::sync::Locked;
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::task::JoinHandle;

struct Watch {
    connections: BTreeSet<String>,
    store: Store<Secret>,
    task: JoinHandle<()>,
}

/// The set of watched Secrets and which Connections each one triggers.
pub struct SecretWatches {
    client: Client,
    changes: Changes,
    watches: std::sync::Arc<Mutex<HashMap<(String, String), Watch>>>,
}

impl SecretWatches {
    /// Watches announce the Connections whose Secret changed into `changes`.
    pub fn new(client: Client, changes: Changes) -> Self {
        Self {
            client,
            changes,
            watches: Default::default(),
        }
    }

    /// Makes sure the Secret `namespace/name` is watched for `connection`.
    pub fn track(&self, connection: &str, namespace: &str, name: &str) {
        let mut watches = self.watches.locked();
        let key = (namespace.to_owned(), name.to_owned());
        if let Some(watch) = watches.get_mut(&key) {
            watch.connections.insert(connection.to_owned());
            return;
        }
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let changes = self.changes.clone();
        let registry = self.watches.clone();
        let watched = key.clone();
        let (store, writer) = reflector::store();
        let task = tokio::spawn(async move {
            // Backoff on errors (a Secret kbind may not read must not become a hot loop). The
            // cache is updated before the Connections hear of it.
            let mut events = reflector::reflector(writer, watcher(api, config))
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(
                        watcher::Event::Apply(_)
                        | watcher::Event::Delete(_)
                        | watcher::Event::InitDone,
                    ) => {
                        let connections = registry
                            .locked()
                            .get(&watched)
                            .map(|w| w.connections.clone())
                            .unwrap_or_default();
                        for connection in connections {
                            changes.announce(Change::ConnectionInput(connection));
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, secret = %watched.1, "Secret watch error; retrying")
                    }
                }
            }
        });
        watches.insert(
            key,
            Watch {
                connections: [connection.to_owned()].into(),
                store,
                task,
            },
        );
    }

    /// The Secret `namespace/name` as its watch sees it: `None` until the watch has listed (read
    /// it from the API instead), `Some(None)` when it does not exist.
    pub fn cached(&self, namespace: &str, name: &str) -> Option<Option<std::sync::Arc<Secret>>> {
        let watches = self.watches.locked();
        let watch = watches.get(&(namespace.to_owned(), name.to_owned()))?;
        // Listed once: the store is ready from then on, also while a watch reconnects.
        let Some(Ok(())) = watch.store.wait_until_ready().now_or_never() else {
            return None;
        };
        Some(watch.store.get(&ObjectRef::new(name).within(namespace)))
    }

    /// Stops watching for `connection`; a Secret no Connection references is no longer watched.
    pub fn untrack(&self, connection: &str) {
        let mut watches = self.watches.locked();
        watches.retain(|_, watch| {
            watch.connections.remove(connection);
            if watch.connections.is_empty() {
                watch.task.abort();
                false
            } else {
                true
            }
        });
    }
}

impl Drop for SecretWatches {
    fn drop(&mut self) {
        for watch in self.watches.locked().values() {
            watch.task.abort();
        }
    }
}
