//! A verified provider's identity as a watch shows it (issue #15, goal 5): the object that gave
//! the identity (ID-1: kcp's `LogicalCluster` or the `kube-system` Namespace), watched by name,
//! metadata only. A Connection's periodic check reads the identity from here instead of two GETs
//! per interval; whenever the watch has nothing certain to say (not listed yet, broken, the
//! object gone, RBAC refusing the watch) the check reads as before.
//!
//! Every watch session begins with a fresh initial list — never a resumed `resourceVersion` — so
//! a credential that starts reaching another cluster is seen at the session after the change: a
//! different server breaks the watch's connection, and the session that follows lists the new
//! cluster's object; a session also ends every [`SESSION`] on its own. At rest this costs one watch
//! request per [`SESSION`] and no read.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kbind_shared::identity::Source;
use kbind_shared::sync::Locked;
use kube::api::{DynamicObject, PartialObjectMeta};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

/// Cancels its token when dropped: a watch that ends with the last owner of its handle.
pub(crate) struct StopOnDrop(pub(crate) CancellationToken);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// How long one watch session lasts before it is replaced by a fresh one (shorter than the
/// watch request's own timeout, so the watch is never resumed from a `resourceVersion`).
pub const SESSION: Duration = Duration::from_secs(280);

/// The longest wait before a broken watch is opened again.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// What the watch shows of the identity object.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Shown {
    /// Nothing certain: not listed yet, or the watch broke since.
    #[default]
    Unknown,
    /// The object, with this UID.
    Present(String),
    /// No such object (or one without a UID).
    Absent,
}

/// One step of a watch of the identity object, its UID already taken out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// An initial list begins.
    ListStart,
    /// The initial list has the object, with this UID.
    Listed(String),
    /// The initial list is complete.
    ListEnd,
    /// The object changed (or was created), with this UID.
    Changed(String),
    /// The object was deleted.
    Deleted,
    /// The watch failed.
    Broken,
}

impl Seen {
    /// The step a watch event or error is.
    pub fn of<K: kube::Resource>(event: Result<&Event<K>, &watcher::Error>) -> Self {
        let uid = |object: &K| object.meta().uid.clone().unwrap_or_default();
        match event {
            Ok(Event::Init) => Seen::ListStart,
            Ok(Event::InitApply(object)) => Seen::Listed(uid(object)),
            Ok(Event::InitDone) => Seen::ListEnd,
            Ok(Event::Apply(object)) => Seen::Changed(uid(object)),
            Ok(Event::Delete(_)) => Seen::Deleted,
            Err(_) => Seen::Broken,
        }
    }
}

/// What the watch has shown so far: the pure fold of its steps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fold {
    /// What an initial list in progress has shown (`Some(None)`: nothing yet).
    listing: Option<Option<String>>,
    /// What the watch shows.
    pub shown: Shown,
}

fn present(uid: String) -> Shown {
    if uid.is_empty() {
        Shown::Absent
    } else {
        Shown::Present(uid)
    }
}

impl Fold {
    /// Takes one step; returns whether what the watch shows changed. While a new session lists,
    /// the last session's view stands (it was certain a moment ago); a broken watch knows nothing.
    pub fn take(&mut self, seen: Seen) -> bool {
        let before = self.shown.clone();
        match seen {
            Seen::ListStart => self.listing = Some(None),
            // A streaming list has no start step: its first object, or its end, begins it.
            Seen::Listed(uid) => self.listing = Some(Some(uid)),
            Seen::ListEnd => {
                self.shown = self.listing.take().flatten().map_or(Shown::Absent, present);
            }
            Seen::Changed(uid) if self.listing.is_none() => self.shown = present(uid),
            Seen::Deleted if self.listing.is_none() => self.shown = Shown::Absent,
            // Changes during a list come only with a resumed watch, which a session never is.
            Seen::Changed(_) | Seen::Deleted => {}
            Seen::Broken => {
                self.listing = None;
                self.shown = Shown::Unknown;
            }
        }
        self.shown != before
    }

    /// The identity, when the watch shows it for certain.
    pub fn identity(&self) -> Option<&str> {
        match &self.shown {
            Shown::Present(uid) => Some(uid),
            Shown::Unknown | Shown::Absent => None,
        }
    }
}

/// How long to wait before opening the watch again after `failures` failures in a row.
pub fn backoff(failures: u32) -> Duration {
    Duration::from_secs(1u64 << failures.min(6)).min(MAX_BACKOFF)
}

/// A running watch of one provider's identity object; it stops when the last clone is dropped.
#[derive(Clone)]
pub struct IdentityWatch {
    fold: Arc<Mutex<Fold>>,
    source: Source,
    _stop: Arc<StopOnDrop>,
}

impl std::fmt::Debug for IdentityWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityWatch")
            .field("source", &self.source)
            .field("fold", &*self.fold.locked())
            .finish()
    }
}

impl IdentityWatch {
    /// Starts watching the object `source` names through `client`; `on_change` runs whenever what
    /// the watch shows changes (including when it breaks).
    pub fn start(
        client: &Client,
        source: Source,
        connection: &str,
        on_change: impl Fn() + Send + Sync + 'static,
    ) -> Self {
        let stop = CancellationToken::new();
        let fold = Arc::new(Mutex::new(Fold::default()));
        let (resource, name) = source.object();
        let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(client.clone(), &resource);
        let field = format!("metadata.name={name}");
        tokio::spawn(run(
            api,
            field,
            fold.clone(),
            stop.clone(),
            connection.to_owned(),
            on_change,
        ));
        Self {
            fold,
            source,
            _stop: Arc::new(StopOnDrop(stop)),
        }
    }

    /// The identity, when the watch shows it for certain.
    pub fn identity(&self) -> Option<String> {
        self.fold.locked().identity().map(str::to_owned)
    }

    /// The object watched.
    pub fn source(&self) -> Source {
        self.source
    }
}

/// Watch sessions until `stop`, each from a fresh initial list.
async fn run(
    api: Api<PartialObjectMeta<DynamicObject>>,
    field: String,
    fold: Arc<Mutex<Fold>>,
    stop: CancellationToken,
    connection: String,
    on_change: impl Fn() + Send + Sync + 'static,
) {
    let take = |seen: Seen| {
        let mut fold = fold.locked();
        if fold.take(seen) {
            tracing::debug!(%connection, shown = ?fold.shown, "the provider identity watch shows a change");
            drop(fold);
            on_change();
        }
    };
    let config = watcher::Config::default().fields(&field);
    let mut failures = 0u32;
    loop {
        let mut events = kbind_shared::streaming::instances(api.clone(), config.clone());
        let session_end = tokio::time::sleep(SESSION);
        tokio::pin!(session_end);
        let mut listed = false;
        let broken = loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = &mut session_end => break None,
                event = events.next() => match event {
                    None => break None,
                    Some(Err(e)) => break Some(e),
                    Some(Ok(event)) => {
                        if matches!(event, Event::InitDone) {
                            failures = 0;
                            listed = true;
                        }
                        take(Seen::of(Ok(&event)));
                    }
                },
            }
        };
        drop(events);
        if let Some(error) = broken {
            take(Seen::Broken);
            // A refused watch request can come back as an unreadable event rather than a
            // status: before a session has listed, a plain list of the object says whether RBAC
            // is what refuses.
            let refused = forbidden(&error)
                || (!listed
                    && matches!(
                        api.list_metadata(&kube::api::ListParams::default().fields(&field).limit(1)).await,
                        Err(kube::Error::Api(s)) if s.is_forbidden()
                    ));
            if refused {
                tracing::info!(%connection, "watching the provider's identity is not allowed; it is read at each check instead");
                return;
            }
            tracing::debug!(%connection, error = %kbind_shared::redact::remote(&error.to_string()), "the provider identity watch broke; opening it again");
            let wait = backoff(failures);
            failures = failures.saturating_add(1);
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}

fn forbidden(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.is_forbidden(),
        watcher::Error::WatchError(s) => s.is_forbidden(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fold(steps: &[Seen]) -> (Fold, Vec<bool>) {
        let mut fold = Fold::default();
        let changed = steps.iter().map(|s| fold.take(s.clone())).collect();
        (fold, changed)
    }

    fn listed(uid: &str) -> Vec<Seen> {
        vec![Seen::ListStart, Seen::Listed(uid.into()), Seen::ListEnd]
    }

    #[test]
    fn the_identity_is_known_once_a_list_completes() {
        let (f, changed) = fold(&[Seen::ListStart, Seen::Listed("a".into())]);
        assert_eq!(f.identity(), None, "not before the list ends");
        assert_eq!(changed, [false, false]);
        let (f, changed) = fold(&listed("a"));
        assert_eq!(f.identity(), Some("a"));
        assert_eq!(changed, [false, false, true]);
    }

    #[test]
    fn an_empty_list_or_a_uid_less_object_shows_no_identity() {
        let (f, _) = fold(&[Seen::ListStart, Seen::ListEnd]);
        assert_eq!(f.shown, Shown::Absent);
        let (f, _) = fold(&listed(""));
        assert_eq!(f.shown, Shown::Absent);
        assert_eq!(f.identity(), None);
    }

    #[test]
    fn a_new_session_keeps_the_last_view_until_its_list_ends_with_another() {
        let mut steps = listed("a");
        steps.extend([Seen::ListStart, Seen::Listed("b".into())]);
        let (f, _) = fold(&steps);
        assert_eq!(f.identity(), Some("a"), "still listing");
        steps.push(Seen::ListEnd);
        let (f, changed) = fold(&steps);
        assert_eq!(f.identity(), Some("b"), "another cluster's object");
        assert_eq!(changed.last(), Some(&true));
        // The same object again changes nothing.
        let mut same = listed("a");
        same.extend(listed("a"));
        let (f, changed) = fold(&same);
        assert_eq!(f.identity(), Some("a"));
        assert_eq!(changed, [false, false, true, false, false, false]);
    }

    #[test]
    fn changes_and_deletions_after_the_list_are_shown() {
        let mut steps = listed("a");
        steps.push(Seen::Changed("a".into()));
        let (f, changed) = fold(&steps);
        assert_eq!(f.identity(), Some("a"));
        assert_eq!(changed.last(), Some(&false));
        steps.push(Seen::Deleted);
        let (f, changed) = fold(&steps);
        assert_eq!(f.shown, Shown::Absent);
        assert_eq!(changed.last(), Some(&true));
        steps.push(Seen::Changed("c".into()));
        let (f, _) = fold(&steps);
        assert_eq!(f.identity(), Some("c"), "created again: a new UID");
    }

    #[test]
    fn a_broken_watch_knows_nothing_until_a_new_list_ends() {
        let mut steps = listed("a");
        steps.push(Seen::Broken);
        let (f, changed) = fold(&steps);
        assert_eq!(f.shown, Shown::Unknown);
        assert_eq!(changed.last(), Some(&true));
        // A half list before the break, then a whole one.
        steps.extend([Seen::ListStart, Seen::Listed("b".into()), Seen::Broken]);
        steps.extend([Seen::ListStart, Seen::ListEnd]);
        let (f, _) = fold(&steps);
        assert_eq!(f.shown, Shown::Absent, "the half list's object is not kept");
    }

    #[test]
    fn a_streaming_list_needs_no_start_step() {
        // kube-runtime's watcher sends no `Init` before a streaming list.
        let (f, changed) = fold(&[Seen::Listed("a".into()), Seen::ListEnd]);
        assert_eq!(f.identity(), Some("a"));
        assert_eq!(changed, [false, true]);
        let (f, _) = fold(&[Seen::ListEnd]);
        assert_eq!(f.shown, Shown::Absent, "an empty streaming list");
        let mut steps = listed("a");
        steps.extend([Seen::Broken, Seen::Listed("b".into()), Seen::ListEnd]);
        let (f, _) = fold(&steps);
        assert_eq!(f.identity(), Some("b"));
    }

    #[test]
    fn events_become_steps() {
        use kube::api::ObjectMeta;
        let object = |uid: Option<&str>| PartialObjectMeta::<DynamicObject> {
            types: None,
            metadata: ObjectMeta {
                uid: uid.map(str::to_owned),
                ..Default::default()
            },
            _phantom: std::marker::PhantomData,
        };
        assert_eq!(
            Seen::of(Ok(&Event::Init::<PartialObjectMeta<DynamicObject>>)),
            Seen::ListStart
        );
        assert_eq!(
            Seen::of(Ok(&Event::InitApply(object(Some("u"))))),
            Seen::Listed("u".into())
        );
        assert_eq!(
            Seen::of(Ok(&Event::Apply(object(None)))),
            Seen::Changed(String::new())
        );
        assert_eq!(
            Seen::of(Ok(&Event::Delete(object(Some("u"))))),
            Seen::Deleted
        );
        assert_eq!(
            Seen::of::<PartialObjectMeta<DynamicObject>>(Err(&watcher::Error::NoResourceVersion)),
            Seen::Broken
        );
    }

    #[test]
    fn backoff_doubles_up_to_a_minute() {
        let waits: Vec<u64> = (0..9).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }

    #[test]
    fn only_rbac_refusals_stop_the_watch() {
        let status = |code: u16| {
            Box::new(kube::core::Status {
                code,
                reason: if code == 403 {
                    "Forbidden".into()
                } else {
                    "Other".into()
                },
                ..kube::core::Status::failure("no", "x")
            })
        };
        assert!(forbidden(&watcher::Error::WatchStartFailed(
            kube::Error::Api(status(403))
        )));
        assert!(forbidden(&watcher::Error::InitialListFailed(
            kube::Error::Api(status(403))
        )));
        assert!(!forbidden(&watcher::Error::WatchStartFailed(
            kube::Error::Api(status(500))
        )));
        assert!(!forbidden(&watcher::Error::NoResourceVersion));
    }
}
