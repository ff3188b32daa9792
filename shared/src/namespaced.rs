//! One watch of a namespaced resource over a growing set of namespaces, delivered as one
//! cluster-wide watch would deliver it — for a credential that may read only in some namespaces
//! (a Grant's boundary, #51; #54).
//!
//! A reflector cannot be fed several namespaces' watches as they are: each namespace's (re-)list
//! would replace the whole cache with that one namespace's objects. So ([`Merge`], pure):
//! - **starting**, every namespace known so far is listed, and once the set of namespaces is
//!   complete (the caller says so: [`Command::Complete`]) and every one of them has listed, the
//!   objects of all of them go out as one initial list (`Init`, `InitApply`…, `InitDone`) — what
//!   changed meanwhile included; a namespace the credential may not read yet (its namespace does
//!   not exist, so neither does the grant of it: 403) counts as listed and empty;
//! - **afterwards**, a namespace's re-list goes out as `Apply` for what it holds and `Delete` for
//!   what it held before and no longer does; a namespace added later lists the same way.
//!
//! - **a namespace no longer watched** goes out as a `Delete` of each object it held (#54: a
//!   Binding's namespace left behind), and the other namespaces are untouched.
//!
//! The I/O ([`Namespaced`]) runs one watch per namespace and takes [`Command`]s: watch a
//! namespace; it was just created (its failing watch starts again at once, not after its
//! backoff); stop watching one; the set is complete.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::channel::mpsc::UnboundedReceiver;
use futures::stream::{AbortHandle, Abortable, SelectAll};
use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::watcher::{self, Event};

use crate::streaming::Events;

/// What the caller tells a [`Namespaced`] watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Watch this namespace too (nothing if it is watched).
    Watch(String),
    /// This namespace was just created: its watch, unless it has listed, starts again now rather
    /// than after its backoff (watched from now on, if it was not).
    Created(String),
    /// Stop watching this namespace: what it held is deleted (nothing if it is not watched).
    Unwatch(String),
    /// Every namespace of the first list has been named.
    Complete,
}

/// The merge of namespaces' watch events into one cluster-wide stream.
pub struct Merge<K> {
    starting: Option<Starting<K>>,
    /// The names each namespace held when last listed or changed (what a re-list may delete).
    known: HashMap<String, HashSet<String>>,
    /// Namespaces being re-listed, with what they listed so far.
    relisting: HashMap<String, Vec<K>>,
    tombstone: fn(&str, &str) -> K,
}

struct Starting<K> {
    complete: bool,
    /// Namespaces that have not listed yet.
    waiting: HashSet<String>,
    /// What each namespace holds, so far.
    held: HashMap<String, BTreeMap<String, K>>,
}

impl<K: Resource + Clone> Merge<K> {
    /// A merge whose `Delete` of an object no longer listed carries `tombstone(namespace, name)`.
    pub fn new(tombstone: fn(&str, &str) -> K) -> Self {
        Self {
            starting: Some(Starting {
                complete: false,
                waiting: HashSet::new(),
                held: HashMap::new(),
            }),
            known: HashMap::new(),
            relisting: HashMap::new(),
            tombstone,
        }
    }

    /// A namespace is watched from now on.
    pub fn watch(&mut self, namespace: &str) {
        if let Some(starting) = &mut self.starting
            && !starting.held.contains_key(namespace)
        {
            starting.waiting.insert(namespace.to_owned());
            starting.held.insert(namespace.to_owned(), BTreeMap::new());
        }
    }

    /// `namespace` is no longer watched: each object it held goes out as a `Delete` (none while
    /// starting — nothing went out yet; the first list then waits for it no more).
    pub fn unwatch(&mut self, namespace: &str) -> Vec<Event<K>> {
        if let Some(starting) = &mut self.starting {
            starting.waiting.remove(namespace);
            starting.held.remove(namespace);
            return self.started();
        }
        self.relisting.remove(namespace);
        let mut gone: Vec<String> = self
            .known
            .remove(namespace)
            .unwrap_or_default()
            .into_iter()
            .collect();
        gone.sort();
        gone.into_iter()
            .map(|n| Event::Delete((self.tombstone)(namespace, &n)))
            .collect()
    }

    /// Every namespace of the first list has been named.
    pub fn complete(&mut self) -> Vec<Event<K>> {
        if let Some(starting) = &mut self.starting {
            starting.complete = true;
        }
        self.started()
    }

    /// `namespace`'s watch failed; `absent`: the namespace cannot be read because it is not there
    /// (yet) — then it holds nothing of ours.
    pub fn failed(&mut self, namespace: &str, absent: bool) -> Vec<Event<K>> {
        if let Some(starting) = &mut self.starting
            && absent
        {
            starting.waiting.remove(namespace);
        }
        self.started()
    }

    /// One event of `namespace`'s watch; what goes out.
    pub fn on(&mut self, namespace: &str, event: Event<K>) -> Vec<Event<K>> {
        if let Some(starting) = &mut self.starting {
            let held = starting.held.entry(namespace.to_owned()).or_default();
            match event {
                Event::Init => held.clear(),
                Event::InitApply(o) | Event::Apply(o) => {
                    held.insert(o.meta().name.clone().unwrap_or_default(), o);
                }
                Event::Delete(o) => {
                    held.remove(o.meta().name.as_deref().unwrap_or_default());
                }
                Event::InitDone => {
                    starting.waiting.remove(namespace);
                }
            }
            return self.started();
        }
        let name = |o: &K| o.meta().name.clone().unwrap_or_default();
        match event {
            Event::Init => {
                self.relisting.insert(namespace.to_owned(), Vec::new());
                Vec::new()
            }
            Event::InitApply(o) => {
                self.relisting
                    .entry(namespace.to_owned())
                    .or_default()
                    .push(o);
                Vec::new()
            }
            Event::InitDone => {
                let listed = self.relisting.remove(namespace).unwrap_or_default();
                let now: HashSet<String> = listed.iter().map(name).collect();
                let before = self.known.insert(namespace.to_owned(), now.clone());
                let mut out: Vec<Event<K>> = listed.into_iter().map(Event::Apply).collect();
                let mut gone: Vec<String> = before
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|n| !now.contains(n))
                    .collect();
                gone.sort();
                out.extend(
                    gone.into_iter()
                        .map(|n| Event::Delete((self.tombstone)(namespace, &n))),
                );
                out
            }
            Event::Apply(o) => {
                self.known
                    .entry(namespace.to_owned())
                    .or_default()
                    .insert(name(&o));
                vec![Event::Apply(o)]
            }
            Event::Delete(o) => {
                if let Some(names) = self.known.get_mut(namespace) {
                    names.remove(&name(&o));
                }
                vec![Event::Delete(o)]
            }
        }
    }

    /// The first list, once complete.
    fn started(&mut self) -> Vec<Event<K>> {
        let ready = self
            .starting
            .as_ref()
            .is_some_and(|s| s.complete && s.waiting.is_empty());
        if !ready {
            return Vec::new();
        }
        let Some(starting) = self.starting.take() else {
            return Vec::new();
        };
        let mut namespaces: Vec<(String, BTreeMap<String, K>)> =
            starting.held.into_iter().collect();
        namespaces.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out = vec![Event::Init];
        for (namespace, held) in namespaces {
            self.known.insert(namespace, held.keys().cloned().collect());
            out.extend(held.into_values().map(Event::InitApply));
        }
        out.push(Event::InitDone);
        out
    }
}

/// How a namespace's watch is opened: its events, its objects as the caller keys them.
pub type Open<K> = Box<dyn Fn(&str) -> Events<K> + Send>;

type Tagged<K> = Pin<Box<dyn Stream<Item = (String, watcher::Result<Event<K>>)> + Send>>;

/// The watch of several namespaces as one ([`Merge`]); runs until dropped (the commands ending
/// only means no namespace is added).
pub struct Namespaced<K> {
    merge: Merge<K>,
    open: Open<K>,
    streams: SelectAll<Abortable<Tagged<K>>>,
    watching: HashMap<String, AbortHandle>,
    /// Namespaces whose watch has listed since it started.
    listed: HashSet<String>,
    commands: Option<UnboundedReceiver<Command>>,
    out: VecDeque<Event<K>>,
}

impl<K> Namespaced<K>
where
    K: Resource + Clone + Send + 'static,
{
    /// A watch of the namespaces `commands` name, each opened by `open`; objects no longer listed
    /// are deleted as `tombstone(namespace, name)`.
    pub fn new(
        open: Open<K>,
        commands: UnboundedReceiver<Command>,
        tombstone: fn(&str, &str) -> K,
    ) -> Self {
        Self {
            merge: Merge::new(tombstone),
            open,
            streams: SelectAll::new(),
            watching: HashMap::new(),
            listed: HashSet::new(),
            commands: Some(commands),
            out: VecDeque::new(),
        }
    }

    fn start(&mut self, namespace: &str) {
        if let Some(running) = self.watching.remove(namespace) {
            running.abort();
        }
        self.listed.remove(namespace);
        let tag = namespace.to_owned();
        let events: Tagged<K> = (self.open)(namespace)
            .map(move |e| (tag.clone(), e))
            .boxed();
        let (stream, handle) = futures::stream::abortable(events);
        self.streams.push(stream);
        self.watching.insert(namespace.to_owned(), handle);
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Watch(namespace) => {
                if !self.watching.contains_key(&namespace) {
                    self.merge.watch(&namespace);
                    self.start(&namespace);
                }
            }
            Command::Created(namespace) => {
                if !self.listed.contains(&namespace) {
                    self.merge.watch(&namespace);
                    self.start(&namespace);
                }
            }
            Command::Unwatch(namespace) => {
                if let Some(running) = self.watching.remove(&namespace) {
                    running.abort();
                    self.listed.remove(&namespace);
                    let out = self.merge.unwatch(&namespace);
                    self.out.extend(out);
                }
            }
            Command::Complete => {
                let out = self.merge.complete();
                self.out.extend(out);
            }
        }
    }
}

// No field is structurally pinned: the watches are boxed.
impl<K> Unpin for Namespaced<K> {}

impl<K> Drop for Namespaced<K> {
    fn drop(&mut self) {
        for handle in self.watching.values() {
            handle.abort();
        }
    }
}

/// The backoff of one namespace's watch: 0.2 s doubling to 5 s — a namespace not readable yet is
/// tried again soon (the issuer grants it within moments of its creation), and its creation by
/// kbind starts it again at once ([`Command::Created`]).
#[derive(Debug, Clone, Default)]
pub struct Quick(Option<std::time::Duration>);

impl Iterator for Quick {
    type Item = std::time::Duration;

    fn next(&mut self) -> Option<Self::Item> {
        let next = match self.0 {
            None => std::time::Duration::from_millis(200),
            Some(d) => (d * 2).min(std::time::Duration::from_secs(5)),
        };
        self.0 = Some(next);
        Some(next)
    }
}

impl kube::runtime::utils::Backoff for Quick {
    fn reset(&mut self) {
        self.0 = None;
    }
}

/// How a Connection's boundary's namespaces are opened (#51): `watch` of the provider namespace
/// of each consumer namespace, its objects held under the consumer's namespace, retried soon
/// ([`Quick`]); a consumer namespace too long to map lists as empty (nothing of it can be
/// there: its objects fail with the reason).
pub fn in_boundary<K>(
    map: crate::boundary::NamespaceMap,
    watch: impl Fn(&str) -> Events<K> + Send + 'static,
) -> Open<K>
where
    K: Resource + Clone + Send + 'static,
{
    use futures::TryStreamExt;
    use kube::runtime::WatchStreamExt;
    Box::new(move |namespace: &str| -> Events<K> {
        let Ok(mapped) = map.provider(namespace) else {
            let listed = [Ok(Event::Init), Ok(Event::InitDone)];
            return futures::stream::iter(listed)
                .chain(futures::stream::pending())
                .boxed();
        };
        let consumer = namespace.to_owned();
        watch(&mapped)
            .backoff(Quick::default())
            .map_ok(move |event: Event<K>| {
                event.modify(|o| o.meta_mut().namespace = Some(consumer.clone()))
            })
            .boxed()
    })
}

/// Whether a namespace's watch failed because its namespace is not readable yet: refused (the
/// grant of it is made once it exists) or not there.
fn absent(error: &watcher::Error) -> bool {
    let status = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s,
        _ => return false,
    };
    status.code == 403 || status.code == 404
}

impl<K> Stream for Namespaced<K>
where
    K: Resource + Clone + Send + 'static,
{
    type Item = watcher::Result<Event<K>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(event) = this.out.pop_front() {
                return Poll::Ready(Some(Ok(event)));
            }
            if let Some(commands) = &mut this.commands {
                match commands.poll_next_unpin(cx) {
                    Poll::Ready(Some(command)) => {
                        this.command(command);
                        continue;
                    }
                    Poll::Ready(None) => this.commands = None,
                    Poll::Pending => {}
                }
            }
            match this.streams.poll_next_unpin(cx) {
                Poll::Ready(Some((namespace, Ok(event)))) => {
                    if matches!(event, Event::InitDone) {
                        this.listed.insert(namespace.clone());
                    }
                    let out = this.merge.on(&namespace, event);
                    this.out.extend(out);
                }
                Poll::Ready(Some((namespace, Err(error)))) => {
                    tracing::debug!(%namespace, %error, "namespace watch");
                    let out = this.merge.failed(&namespace, absent(&error));
                    this.out.extend(out);
                }
                // No watch yet (or all ended): the commands' waker wakes us.
                Poll::Ready(None) | Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn cm(namespace: &str, name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                namespace: Some(namespace.into()),
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn tombstone(namespace: &str, name: &str) -> ConfigMap {
        cm(namespace, name)
    }

    /// Events as `kind ns/name` lines.
    fn show(events: Vec<Event<ConfigMap>>) -> Vec<String> {
        let id = |o: &ConfigMap| {
            format!(
                "{}/{}",
                o.metadata.namespace.as_deref().unwrap_or_default(),
                o.metadata.name.as_deref().unwrap_or_default()
            )
        };
        events
            .into_iter()
            .map(|e| match e {
                Event::Init => "Init".to_owned(),
                Event::InitApply(o) => format!("InitApply {}", id(&o)),
                Event::InitDone => "InitDone".to_owned(),
                Event::Apply(o) => format!("Apply {}", id(&o)),
                Event::Delete(o) => format!("Delete {}", id(&o)),
            })
            .collect()
    }

    /// A merge past its start: `a` listed `x` and `y`, `b` listed `x`.
    fn started() -> Merge<ConfigMap> {
        let mut merge = Merge::new(tombstone);
        merge.watch("a");
        merge.watch("b");
        listed(&mut merge, "a", &["x", "y"]);
        listed(&mut merge, "b", &["x"]);
        merge.complete();
        merge
    }

    fn listed(merge: &mut Merge<ConfigMap>, ns: &str, names: &[&str]) -> Vec<String> {
        let mut out = merge.on(ns, Event::Init);
        for n in names {
            out.extend(merge.on(ns, Event::InitApply(cm(ns, n))));
        }
        out.extend(merge.on(ns, Event::InitDone));
        show(out)
    }

    #[test]
    fn the_first_list_goes_out_once_every_named_namespace_has_listed_with_what_changed_meanwhile() {
        let mut merge = Merge::new(tombstone);
        merge.watch("a");
        merge.watch("b");
        assert!(listed(&mut merge, "a", &["x", "y"]).is_empty());
        // Changes of a listed namespace while another still lists are held, not lost.
        assert!(show(merge.on("a", Event::Delete(cm("a", "y")))).is_empty());
        assert!(show(merge.on("a", Event::Apply(cm("a", "z")))).is_empty());
        assert!(
            listed(&mut merge, "b", &["x"]).is_empty(),
            "not complete yet"
        );
        assert_eq!(
            show(merge.complete()),
            [
                "Init",
                "InitApply a/x",
                "InitApply a/z",
                "InitApply b/x",
                "InitDone"
            ]
        );
        // Afterwards, changes pass.
        assert_eq!(
            show(merge.on("b", Event::Apply(cm("b", "w")))),
            ["Apply b/w"]
        );
    }

    #[test]
    fn a_namespace_named_while_starting_is_waited_for_and_an_unreadable_one_counts_as_empty() {
        let mut merge = Merge::new(tombstone);
        merge.watch("a");
        assert!(merge.complete().is_empty());
        assert_eq!(
            listed(&mut merge, "a", &["x"]),
            ["Init", "InitApply a/x", "InitDone"]
        );
        let mut merge = Merge::new(tombstone);
        merge.watch("a");
        merge.watch("gone");
        assert!(merge.complete().is_empty());
        assert!(listed(&mut merge, "a", &["x"]).is_empty());
        assert!(merge.failed("gone", false).is_empty(), "unreachable: wait");
        assert_eq!(
            show(merge.failed("gone", true)),
            ["Init", "InitApply a/x", "InitDone"]
        );
        // Nothing named at all: an empty first list once complete.
        let mut merge = Merge::<ConfigMap>::new(tombstone);
        assert_eq!(show(merge.complete()), ["Init", "InitDone"]);
    }

    #[test]
    fn a_namespace_watch_retries_soon_and_never_waits_more_than_five_seconds() {
        use kube::runtime::utils::Backoff;
        let mut backoff = Quick::default();
        let waits: Vec<u128> = backoff.by_ref().take(7).map(|d| d.as_millis()).collect();
        assert_eq!(waits, [200, 400, 800, 1600, 3200, 5000, 5000]);
        backoff.reset();
        assert_eq!(backoff.next().unwrap().as_millis(), 200);
    }

    #[test]
    fn a_relist_afterwards_applies_what_it_holds_and_deletes_only_what_its_namespace_lost() {
        let mut merge = started();
        assert_eq!(
            show(merge.on("a", Event::Apply(cm("a", "n")))),
            ["Apply a/n"]
        );
        assert_eq!(
            listed(&mut merge, "a", &["x"]),
            ["Apply a/x", "Delete a/n", "Delete a/y"]
        );
        // b is untouched by a's re-list; a deleted object is not deleted twice.
        assert_eq!(
            show(merge.on("b", Event::Delete(cm("b", "x")))),
            ["Delete b/x"]
        );
        assert!(listed(&mut merge, "b", &[]).is_empty());
        // A namespace added later lists as applies.
        merge.watch("c");
        assert_eq!(listed(&mut merge, "c", &["q"]), ["Apply c/q"]);
        assert_eq!(listed(&mut merge, "c", &[]), ["Delete c/q"]);
    }

    #[test]
    fn a_namespace_no_longer_watched_deletes_what_it_held_and_nothing_else() {
        let mut merge = started();
        merge.on("a", Event::Apply(cm("a", "z")));
        merge.on("a", Event::Delete(cm("a", "x")));
        assert_eq!(
            show(merge.unwatch("a")),
            ["Delete a/y", "Delete a/z"],
            "what a held when it went, once"
        );
        assert!(merge.unwatch("a").is_empty(), "not twice");
        assert_eq!(
            listed(&mut merge, "b", &["x"]),
            ["Apply b/x"],
            "b untouched"
        );
        // Watched again later, it lists as applies.
        merge.watch("a");
        assert_eq!(listed(&mut merge, "a", &["y"]), ["Apply a/y"]);
        // A namespace half way through a re-list when it goes leaves nothing behind.
        merge.on("a", Event::Init);
        merge.on("a", Event::InitApply(cm("a", "w")));
        assert_eq!(show(merge.unwatch("a")), ["Delete a/y"]);
        merge.watch("a");
        assert_eq!(
            listed(&mut merge, "a", &["v"]),
            ["Apply a/v"],
            "the abandoned re-list's objects never go out"
        );
    }

    #[test]
    fn a_namespace_no_longer_watched_while_starting_is_not_waited_for() {
        let mut merge = Merge::new(tombstone);
        merge.watch("a");
        merge.watch("slow");
        assert!(merge.complete().is_empty());
        assert!(
            listed(&mut merge, "a", &["x"]).is_empty(),
            "slow has not listed"
        );
        assert_eq!(
            show(merge.unwatch("slow")),
            ["Init", "InitApply a/x", "InitDone"]
        );
        // Listed and then unwatched before the start: its objects never go out.
        let mut merge = Merge::new(tombstone);
        merge.watch("a");
        merge.watch("b");
        listed(&mut merge, "b", &["q"]);
        assert!(merge.unwatch("b").is_empty());
        merge.complete();
        assert_eq!(listed(&mut merge, "a", &[]), ["Init", "InitDone"]);
    }
}
