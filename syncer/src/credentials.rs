//! Provider credentials from the Connections' kubeconfig Secrets: one name-scoped watch per
//! referenced Secret (so a rotation reaches the workers at once, and nothing is polled), parsed
//! once per Secret version.

use kbind_shared::sync::Locked;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Secret;
use kbind_shared::api::Connection;
use kbind_shared::credential::{ProviderCredential, SecretPolicy};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// A parsed credential and the digest of its bytes (a change rebuilds the workers).
pub type Credentials = Result<ProviderCredential, String>;

struct Watched {
    store: Store<Secret>,
    listed: Arc<AtomicBool>,
    stop: CancellationToken,
    /// (resourceVersion, key) → the parse of that version.
    parsed: Mutex<Option<((String, String), Credentials)>>,
}

/// The watched kubeconfig Secrets, by (namespace, name).
pub struct SecretCredentials {
    client: Client,
    policy: SecretPolicy,
    changes: Arc<Notify>,
    stop: CancellationToken,
    watched: Mutex<HashMap<(String, String), Arc<Watched>>>,
}

impl SecretCredentials {
    /// Watches notify `changes`; all of them end with `stop`.
    /// Only Secrets in the `policy`'s namespaces are ever watched or read.
    pub fn new(
        client: Client,
        policy: SecretPolicy,
        changes: Arc<Notify>,
        stop: CancellationToken,
    ) -> Self {
        Self {
            client,
            policy,
            changes,
            stop,
            watched: Mutex::default(),
        }
    }

    /// The Connection's credentials; `None` while its Secret's watch has not listed yet (the
    /// listing notifies `changes`).
    pub fn read(&self, connection: &Connection) -> Option<Credentials> {
        let reference = &connection.spec.kubeconfig_secret_ref;
        if let Err(refused) =
            kbind_shared::credential::check_secret_namespace(reference, &self.policy.namespaces)
        {
            return Some(Err(refused));
        }
        let watched = self.watch(&reference.namespace, &reference.name);
        if !watched.listed.load(Ordering::Acquire) {
            return None;
        }
        let secret = watched
            .store
            .get(&ObjectRef::new(&reference.name).within(&reference.namespace));
        let Some(secret) = secret else {
            return Some(ProviderCredential::from_secret(
                None,
                reference,
                self.policy.transport,
            ));
        };
        let version = (
            secret.resource_version().unwrap_or_default(),
            reference.effective_key().to_owned(),
        );
        let mut parsed = watched.parsed.locked();
        if let Some((at, found)) = parsed.as_ref()
            && *at == version
        {
            return Some(found.clone());
        }
        let found =
            ProviderCredential::from_secret(Some(&secret), reference, self.policy.transport);
        *parsed = Some((version, found.clone()));
        Some(found)
    }

    /// Stops the watches of Secrets that no Connection in `connections` references.
    pub fn retain<'c>(&self, connections: impl IntoIterator<Item = &'c Connection>) {
        let referenced: BTreeSet<(String, String)> = connections
            .into_iter()
            .map(|c| {
                let r = &c.spec.kubeconfig_secret_ref;
                (r.namespace.clone(), r.name.clone())
            })
            .collect();
        self.watched.locked().retain(|key, watched| {
            let keep = referenced.contains(key);
            if !keep {
                watched.stop.cancel();
            }
            keep
        });
    }

    fn watch(&self, namespace: &str, name: &str) -> Arc<Watched> {
        let mut watched = self.watched.locked();
        let key = (namespace.to_owned(), name.to_owned());
        if let Some(existing) = watched.get(&key) {
            return existing.clone();
        }
        let (store, writer) = reflector::store();
        let listed = Arc::new(AtomicBool::new(false));
        let stop = self.stop.child_token();
        kbind_shared::cache::observe(
            writer,
            Api::<Secret>::namespaced(self.client.clone(), namespace),
            watcher::Config::default().fields(&format!("metadata.name={name}")),
            stop.clone(),
            {
                let (listed, changes, name) =
                    (listed.clone(), self.changes.clone(), name.to_owned());
                move |event| match event {
                    Ok(watcher::Event::InitDone) => {
                        listed.store(true, Ordering::Release);
                        changes.notify_one();
                    }
                    Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                        changes.notify_one();
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(secret = %name, error = %e, "cannot watch a Connection's kubeconfig Secret; retrying");
                    }
                }
            },
        );
        let entry = Arc::new(Watched {
            store,
            listed,
            stop,
            parsed: Mutex::new(None),
        });
        watched.insert(key, entry.clone());
        entry
    }
}
