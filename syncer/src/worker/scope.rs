//! Where a worker reads when its API is not read cluster-wide (#54): the consumer namespaces
//! whose Bindings list the API (those of this worker's buckets), followed live — a namespace
//! whose first Binding comes is watched from then on (its own list, no re-list of the others), and
//! one whose last Binding has let go of the API is no longer read on either cluster (its objects
//! leave the caches). Which namespaces is the binding index's answer
//! ([`crate::bindings::WatchScope`]); this module turns its changes into the feeds' commands.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::StreamExt;
use kbind_shared::namespaced::Command;
use kbind_shared::sync::Locked;

use super::buckets::Buckets;
use super::state::Worker;
use crate::bindings::WatchScope;

/// The namespaces to read of `scope`, within `buckets`.
fn wanted(scope: WatchScope, buckets: &Buckets) -> BTreeSet<String> {
    match scope {
        // (A worker reading cluster-wide restarts when that changes: `managed`.)
        WatchScope::Cluster => BTreeSet::new(),
        WatchScope::Namespaces(namespaces) => namespaces
            .into_iter()
            .filter(|ns| buckets.contains(Some(ns)))
            .collect(),
    }
}

/// What moves `watched` to `wanted`: the namespaces to start reading, then those to stop.
fn changes(watched: &mut BTreeSet<String>, wanted: BTreeSet<String>) -> Vec<Command> {
    let mut commands: Vec<Command> = wanted
        .difference(watched)
        .cloned()
        .map(Command::Watch)
        .collect();
    commands.extend(watched.difference(&wanted).cloned().map(Command::Unwatch));
    *watched = wanted;
    commands
}

/// Tells the consumer feed where to read now, and returns what follows the bindings' changes
/// from then on (nothing to do for a worker reading cluster-wide). Subscribed before the first
/// look, so no change between the two is missed.
pub(super) fn follow(worker: &Arc<Worker>) -> impl Future<Output = ()> + Send + use<> {
    let worker = worker.clone();
    let per_namespace = worker.consumer_namespaces.is_some();
    let bindings = worker.ctx.binding_changes();
    if per_namespace {
        look(&worker);
        worker.tell_consumer_watch(Command::Complete);
    }
    async move {
        if !per_namespace {
            return std::future::pending().await;
        }
        let api = worker.spec.api.clone();
        let mut bursts = std::pin::pin!(bindings.ready_chunks(1024));
        while let Some(burst) = bursts.next().await {
            if burst.iter().any(|touched| touched.concerns_api(&api)) {
                look(&worker);
            }
        }
    }
}

/// Reads the scope and tells the feeds what changed.
fn look(worker: &Worker) {
    let scope = worker.ctx.watch_scope(&worker.spec.api);
    let commands = changes(
        &mut worker.reading.locked(),
        wanted(scope, &worker.spec.buckets),
    );
    for command in commands {
        match command {
            Command::Unwatch(namespace) => {
                tracing::debug!(api = %worker.spec.api, %namespace, "no binding lists it here any more: not read");
                worker.unwatch(&namespace);
            }
            command => worker.tell_consumer_watch(command),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn namespaces_come_and_go_as_the_scope_changes_and_nothing_is_said_twice() {
        let mut watched = BTreeSet::new();
        assert_eq!(
            changes(&mut watched, set(&["a", "b"])),
            [Command::Watch("a".into()), Command::Watch("b".into())]
        );
        assert!(changes(&mut watched, set(&["a", "b"])).is_empty());
        assert_eq!(
            changes(&mut watched, set(&["b", "c"])),
            [Command::Watch("c".into()), Command::Unwatch("a".into())]
        );
        assert_eq!(
            changes(&mut watched, set(&[])),
            [Command::Unwatch("b".into()), Command::Unwatch("c".into())]
        );
        assert!(watched.is_empty());
    }

    #[test]
    fn only_the_workers_buckets_are_read_and_cluster_wide_is_not_a_namespace_list() {
        let all = Buckets::All;
        assert_eq!(
            wanted(WatchScope::Namespaces(set(&["a", "b"])), &all),
            set(&["a", "b"])
        );
        assert!(wanted(WatchScope::Cluster, &all).is_empty());
        let bucket = |ns: &str| kbind_shared::shard::namespace_bucket(Some(ns), 2);
        let other = (0..64)
            .map(|i| format!("n{i}"))
            .find(|ns| bucket(ns) != bucket("b"))
            .expect("two buckets of 64 names");
        let some = Buckets::Some {
            of: 2,
            mine: [bucket("b")].into(),
        };
        assert_eq!(
            wanted(WatchScope::Namespaces(set(&["b", &other])), &some),
            set(&["b"])
        );
    }
}
