//! A watch-fed cache (kube-runtime reflector) whose stream runs on its own task and calls
//! `on_change` on every event, so that callers can wait for its readiness once and react to change.

use futures::StreamExt;
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};

/// Starts caching `api` (filtered by `config`); `on_change` runs after every event.
pub fn spawn<K>(
    api: Api<K>,
    config: watcher::Config,
    on_change: impl Fn() + Send + 'static,
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config)).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            if event.is_ok() {
                on_change();
            }
        }
    });
    reader
}
