//! How kbind watches a resource — a syncer worker its instances on either cluster, the schema
//! manager a provider's identity: a streaming list where the API server serves one
//! (`sendInitialEvents`: the current objects arrive as watch events from the server's cache, with
//! no list response held whole in memory on either end — a restart at many objects is quicker and
//! has no memory peak), else the paged list every server serves. Like client-go's reflector, a
//! watch whose streaming list is refused, or never starts, lists instead from then on.

use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::Api;
use kube::runtime::watcher::{self, Event, watcher};

/// How long a streaming list may stay silent before the server is taken not to serve one. A
/// server that does sends the first object, or the end of an empty list, at once; one that
/// ignores the request would only ever send later changes.
const FIRST_EVENT_WITHIN: Duration = Duration::from_secs(15);

/// A watch's events.
pub type Events<K> = Pin<Box<dyn Stream<Item = watcher::Result<Event<K>>> + Send>>;

/// Watches `api` with `config`, streaming the initial list where the server can.
pub fn instances<K>(api: Api<K>, config: watcher::Config) -> Events<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let streaming = watcher(api.clone(), config.clone().streaming_lists()).boxed();
    with_fallback(
        streaming,
        move || watcher(api, config).boxed(),
        FIRST_EVENT_WITHIN,
    )
}

/// Whether `error`, seen before the first complete initial list (`listed`), says the server
/// refuses a streaming list: it rejects the request itself (400 Bad Request, 422 Invalid — how
/// servers without the WatchList feature answer `sendInitialEvents`), not access or availability.
pub fn refused(listed: bool, error: &watcher::Error) -> bool {
    let code = match error {
        watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.code,
        watcher::Error::WatchError(status) => status.code,
        _ => return false,
    };
    !listed && matches!(code, 400 | 422)
}

enum State<K, F> {
    /// The streaming watch: whether any event came yet, whether an initial list completed.
    Streaming {
        events: Events<K>,
        started: bool,
        listed: bool,
        fallback: F,
    },
    /// Listing instead, for good.
    Listing(Events<K>),
}

/// `streaming`'s events until it shows the server does not serve streaming lists (a refusal
/// before the first initial list, or no event at all within `silence`), then `fallback()`'s.
pub fn with_fallback<K, F>(streaming: Events<K>, fallback: F, silence: Duration) -> Events<K>
where
    K: Send + 'static,
    F: FnOnce() -> Events<K> + Send + 'static,
{
    let start = State::Streaming {
        events: streaming,
        started: false,
        listed: false,
        fallback,
    };
    futures::stream::unfold(start, move |state| async move {
        match state {
            State::Listing(mut events) => {
                let next = events.next().await?;
                Some((next, State::Listing(events)))
            }
            State::Streaming {
                mut events,
                started,
                listed,
                fallback,
            } => {
                let next = if started {
                    events.next().await
                } else {
                    match tokio::time::timeout(silence, events.next()).await {
                        Ok(next) => next,
                        Err(_) => {
                            tracing::info!(
                                "the API server sent nothing for a streaming list within {silence:?}; listing instead"
                            );
                            return switch(fallback).await;
                        }
                    }
                };
                match next? {
                    Err(e) if refused(listed, &e) => {
                        tracing::info!(error = %e, "the API server refuses streaming lists; listing instead");
                        switch(fallback).await
                    }
                    item => {
                        let listed = listed || matches!(item, Ok(Event::InitDone));
                        Some((
                            item,
                            State::Streaming {
                                events,
                                started: true,
                                listed,
                                fallback,
                            },
                        ))
                    }
                }
            }
        }
    })
    .boxed()
}

/// The first event of the fallback watch, and the state that goes on with it.
async fn switch<K, F>(fallback: F) -> Option<(watcher::Result<Event<K>>, State<K, F>)>
where
    F: FnOnce() -> Events<K>,
{
    let mut events = fallback();
    let next = events.next().await?;
    Some((next, State::Listing(events)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> kube::core::Status {
        kube::core::Status {
            code,
            ..kube::core::Status::failure("no", "Invalid")
        }
    }

    fn rejected(code: u16) -> watcher::Error {
        watcher::Error::WatchStartFailed(kube::Error::Api(Box::new(status(code))))
    }

    #[test]
    fn only_a_rejected_request_before_the_first_list_means_no_streaming_lists() {
        assert!(refused(false, &rejected(422)));
        assert!(refused(false, &rejected(400)));
        assert!(refused(
            false,
            &watcher::Error::WatchError(Box::new(status(400)))
        ));
        assert!(!refused(true, &rejected(422)), "it streamed a list already");
        for code in [401, 403, 404, 410, 429, 500, 503] {
            assert!(
                !refused(false, &rejected(code)),
                "{code} is not about the request's form"
            );
        }
        assert!(!refused(false, &watcher::Error::NoResourceVersion));
    }

    type Item = watcher::Result<Event<u32>>;

    fn events(items: Vec<Item>) -> Events<u32> {
        futures::stream::iter(items).boxed()
    }

    fn listed(n: u32) -> Events<u32> {
        events(vec![
            Ok(Event::Init),
            Ok(Event::InitApply(n)),
            Ok(Event::InitDone),
        ])
    }

    fn shown(items: &[Item]) -> Vec<String> {
        items
            .iter()
            .map(|i| match i {
                Ok(Event::Init) => "init".to_owned(),
                Ok(Event::InitApply(n)) => format!("listed {n}"),
                Ok(Event::InitDone) => "done".to_owned(),
                Ok(Event::Apply(n)) => format!("apply {n}"),
                Ok(Event::Delete(n)) => format!("delete {n}"),
                Err(_) => "error".to_owned(),
            })
            .collect()
    }

    #[tokio::test]
    async fn a_server_that_streams_is_used_and_a_later_error_stays_with_it() {
        let streaming = events(vec![
            Ok(Event::Init),
            Ok(Event::InitApply(1)),
            Ok(Event::InitDone),
            Err(rejected(422)),
            Ok(Event::Apply(2)),
        ]);
        let got: Vec<Item> = with_fallback(streaming, || listed(9), Duration::from_secs(1))
            .collect()
            .await;
        assert_eq!(
            shown(&got),
            ["init", "listed 1", "done", "error", "apply 2"]
        );
    }

    #[tokio::test]
    async fn a_refusal_lists_instead_and_is_not_passed_on() {
        let streaming = events(vec![Err(rejected(422)), Ok(Event::Apply(1))]);
        let got: Vec<Item> = with_fallback(streaming, || listed(9), Duration::from_secs(1))
            .collect()
            .await;
        assert_eq!(shown(&got), ["init", "listed 9", "done"]);
    }

    #[tokio::test]
    async fn other_errors_before_the_list_are_passed_on_for_the_watcher_to_retry() {
        let streaming = events(vec![
            Err(rejected(503)),
            Ok(Event::Init),
            Ok(Event::InitDone),
        ]);
        let got: Vec<Item> = with_fallback(streaming, || listed(9), Duration::from_secs(1))
            .collect()
            .await;
        assert_eq!(shown(&got), ["error", "init", "done"]);
    }

    #[tokio::test]
    async fn a_silent_server_is_listed_instead() {
        // (It never sends anything: the wait always runs out, however slow the machine.)
        let silent = futures::stream::pending().boxed();
        let got: Vec<Item> = with_fallback(silent, || listed(9), Duration::from_millis(50))
            .collect()
            .await;
        assert_eq!(shown(&got), ["init", "listed 9", "done"]);
    }
}
