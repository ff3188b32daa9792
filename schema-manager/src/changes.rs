//! The one way to wake a reconciler: every trigger in the schema manager is a [`Change`] announced
//! here and received through [`Changes::subscribe`], whether a term cache saw an object change or
//! a reconciler computed a signal (a provider's schema, the marked instances of an API and how
//! many there are, the related-resources Bindings a namespace serves, a Connection's Secret or
//! provider identity).
//!
//! Each [`Topic`] has its own bounded channel, so a flood of one topic (a namespace user's
//! Bindings) never makes a receiver of another (the Connection controller) miss changes; a
//! receiver that fell behind on a topic it hears is told so (`None`) and reacts to everything.
//! The hub lives as long as the process: watches that outlive a leadership term (a provider's
//! identity and schema watches) announce into it, and each term's controllers subscribe anew.

use futures::{Stream, StreamExt};
use kbind_shared::cache::ObjectKey;
use std::sync::Arc;
use tokio::sync::broadcast;

/// Changes of one topic a receiver may fall behind by before it is told it missed some (a message
/// is a topic and one or two names: well under 1 MiB buffered per topic).
pub const CAPACITY: usize = 4096;

/// The kinds the leadership term caches (each a [`Topic`] of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `Connection`.
    Connection,
    /// `ClusterBinding`.
    ClusterBinding,
    /// `Binding`.
    Binding,
    /// A consumer `CustomResourceDefinition`, managed by kbind or not (a user's
    /// `core.kbind.io/adopt` on a foreign one matters too).
    Crd,
    /// A syncer's membership Lease.
    MemberLease,
    /// The work assignment ConfigMap.
    Assignment,
}

impl Kind {
    /// Every cached kind.
    pub const ALL: [Kind; 6] = [
        Kind::Connection,
        Kind::ClusterBinding,
        Kind::Binding,
        Kind::Crd,
        Kind::MemberLease,
        Kind::Assignment,
    ];
}

/// What a receiver hears: each topic has its own channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Topic {
    /// Objects of one cached kind.
    Cached(Kind),
    /// What a Connection reads from outside its object.
    ConnectionInput,
    /// Providers' exported CRDs.
    ProviderSchema,
    /// Which instances of an API carry a mark (a conflict, a pause).
    Marked,
    /// How many instances of an API there are.
    Instances,
    /// Which related-resources Bindings a namespace serves.
    RelatedServed,
    /// A Binding let in under the per-namespace cap.
    LetIn,
}

impl Topic {
    /// How many topics there are.
    const COUNT: usize = Kind::ALL.len() + 6;

    /// Its channel's index.
    fn index(self) -> usize {
        match self {
            Topic::Cached(kind) => kind as usize,
            Topic::ConnectionInput => Kind::ALL.len(),
            Topic::ProviderSchema => Kind::ALL.len() + 1,
            Topic::Marked => Kind::ALL.len() + 2,
            Topic::Instances => Kind::ALL.len() + 3,
            Topic::RelatedServed => Kind::ALL.len() + 4,
            Topic::LetIn => Kind::ALL.len() + 5,
        }
    }

    /// The topics of every cached kind.
    pub fn cached() -> [Topic; 6] {
        Kind::ALL.map(Topic::Cached)
    }
}

/// Something changed that some reconciler reacts to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// An object of a cached kind changed, and the term's cache of that kind holds the change.
    Cached(Kind, ObjectKey),
    /// Something Connection `0` reads from outside its object changed: its kubeconfig Secret, or
    /// its provider's identity object.
    ConnectionInput(String),
    /// A provider's exported CRD changed (or appeared, or went), and the watch's cache holds it.
    ProviderSchema {
        /// The Connection whose provider serves it.
        connection: String,
        /// The CRD's name, `<plural>.<group>`: the API's name in bindings.
        api: String,
    },
    /// The instances of API `0` (`<plural>.<group>`) that carry a mark (a conflict annotation,
    /// a pause), or their marks, changed.
    Marked(String),
    /// How many instances API `0` has changed (announced at most once a second per API).
    Instances(String),
    /// The set of related-resources Bindings namespace `0` serves changed.
    RelatedServed(String),
    /// Another Binding of its namespace left, and Binding `0` may now be within the
    /// per-namespace cap (`--max-bindings-per-namespace`).
    LetIn(ObjectKey),
}

impl Change {
    /// The topic it is announced on.
    pub fn topic(&self) -> Topic {
        match self {
            Change::Cached(kind, _) => Topic::Cached(*kind),
            Change::ConnectionInput(_) => Topic::ConnectionInput,
            Change::ProviderSchema { .. } => Topic::ProviderSchema,
            Change::Marked(_) => Topic::Marked,
            Change::Instances(_) => Topic::Instances,
            Change::RelatedServed(_) => Topic::RelatedServed,
            Change::LetIn(_) => Topic::LetIn,
        }
    }
}

/// The hub every trigger announces into and every reconciler hears from (clones share it).
#[derive(Clone)]
pub struct Changes {
    channels: Arc<[broadcast::Sender<Change>; Topic::COUNT]>,
}

impl Default for Changes {
    fn default() -> Self {
        Self {
            channels: Arc::new(std::array::from_fn(|_| broadcast::channel(CAPACITY).0)),
        }
    }
}

impl Changes {
    /// Tells every receiver of its topic (nobody listening is fine: no term runs).
    pub fn announce(&self, change: Change) {
        let _ = self.channels[change.topic().index()].send(change);
    }

    /// Every change of `topics` from now on; `None`: some of those were missed (the receiver fell
    /// behind), react as to a change of everything of those topics.
    pub fn subscribe(
        &self,
        topics: &[Topic],
    ) -> impl Stream<Item = Option<Change>> + Send + 'static + use<> {
        futures::stream::select_all(
            topics
                .iter()
                .map(|topic| received(self.channels[topic.index()].subscribe()).boxed()),
        )
    }
}

/// The messages of `receiver`; `None` for those it missed by falling behind.
fn received<T: Clone + Send + 'static>(
    receiver: broadcast::Receiver<T>,
) -> impl Stream<Item = Option<T>> + Send + 'static {
    futures::stream::unfold(receiver, |mut receiver| async {
        match receiver.recv().await {
            Ok(message) => Some((Some(message), receiver)),
            Err(broadcast::error::RecvError::Lagged(_)) => Some((None, receiver)),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(name: &str) -> Change {
        Change::Cached(
            Kind::Binding,
            ObjectKey {
                namespace: Some("team-a".into()),
                name: name.into(),
            },
        )
    }

    #[test]
    fn every_topic_has_a_channel_of_its_own() {
        let mut topics: Vec<Topic> = Topic::cached().to_vec();
        topics.extend([
            Topic::ConnectionInput,
            Topic::ProviderSchema,
            Topic::Marked,
            Topic::Instances,
            Topic::RelatedServed,
            Topic::LetIn,
        ]);
        let mut indexes: Vec<usize> = topics.iter().map(|t| t.index()).collect();
        indexes.sort_unstable();
        indexes.dedup();
        assert_eq!(indexes, (0..Topic::COUNT).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_flood_of_one_topic_never_makes_a_receiver_of_another_miss_changes() {
        let changes = Changes::default();
        let connections =
            changes.subscribe(&[Topic::Cached(Kind::Connection), Topic::ConnectionInput]);
        let everything = changes.subscribe(&Topic::cached());
        // A namespace user's flood of Bindings, past a channel's capacity, then one Connection
        // change and one Secret change.
        for n in 0..CAPACITY + 10 {
            changes.announce(binding(&n.to_string()));
        }
        let connection = Change::Cached(
            Kind::Connection,
            ObjectKey {
                namespace: None,
                name: "c".into(),
            },
        );
        changes.announce(connection.clone());
        changes.announce(Change::ConnectionInput("c".into()));
        drop(changes);
        let got: Vec<Option<Change>> = connections.collect().await;
        assert_eq!(got.len(), 2);
        assert!(got.contains(&Some(connection.clone())));
        assert!(got.contains(&Some(Change::ConnectionInput("c".into()))));
        // A receiver of every cached kind missed Bindings, and says so; the Connection arrives.
        let got: Vec<Option<Change>> = everything.collect().await;
        assert!(got.contains(&None), "told it missed some");
        assert!(got.contains(&Some(connection)));
        assert!(!got.contains(&Some(Change::ConnectionInput("c".into()))));
    }

    #[tokio::test]
    async fn a_receiver_that_fell_behind_is_told_it_missed_changes() {
        let (sender, receiver) = broadcast::channel(2);
        for n in 0..3 {
            sender.send(n).unwrap();
        }
        drop(sender);
        let got: Vec<Option<i32>> = received(receiver).collect().await;
        assert_eq!(got, [None, Some(1), Some(2)]);
    }
}
