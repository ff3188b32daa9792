//! A watch-fed cache (kube-runtime reflector) whose stream runs on its own task and reports every
//! event, so that callers can wait for its readiness once and react to change.

use futures::StreamExt;
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;

/// Starts caching `api` (filtered by `config`) until `stop`; `on_change` runs after every event.
pub fn spawn<K>(
    api: Api<K>,
    config: watcher::Config,
    stop: CancellationToken,
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
    observe(writer, api, config, stop, move |event| {
        if event.is_ok() {
            on_change();
        }
    });
    reader
}

/// Feeds `writer` from a watch of `api` until `stop`; `observer` sees every event and every watch
/// error (the watch retries with backoff after an error).
pub fn observe<K>(
    writer: reflector::store::Writer<K>,
    api: Api<K>,
    config: watcher::Config,
    stop: CancellationToken,
    observer: impl Fn(Result<&watcher::Event<K>, &watcher::Error>) + Send + 'static,
) where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    let stream = reflector::reflector(writer, watcher(api, config)).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                event = stream.next() => match event {
                    Some(event) => observer(event.as_ref()),
                    None => break,
                },
                _ = stop.cancelled() => break,
            }
        }
    });
}
