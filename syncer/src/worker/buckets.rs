//! Which namespace buckets of an API a worker serves (see `kbind_shared::shard::Unit`).

use std::collections::BTreeSet;

use kbind_shared::shard::{self, Unit};
use kube::Resource;
use kube::runtime::watcher;

/// The namespace buckets of an API a worker serves (see `kbind_shared::shard::Unit`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Buckets {
    /// Every object.
    All,
    /// Objects whose namespace hashes into `mine` of `of` buckets.
    Some {
        /// How many buckets the API is split into.
        of: u32,
        /// The buckets assigned here.
        mine: BTreeSet<u32>,
    },
}

impl Buckets {
    /// From the units of one API assigned here; `None` when there are none.
    pub fn of(units: &[&Unit]) -> Option<Self> {
        let mut buckets: Option<Self> = None;
        for unit in units {
            let Unit::Api { bucket, .. } = unit else {
                continue;
            };
            match (bucket, &mut buckets) {
                (None, _) => return Some(Buckets::All),
                (Some((k, n)), None) => {
                    buckets = Some(Buckets::Some {
                        of: *n,
                        mine: [*k].into(),
                    })
                }
                (Some((k, n)), Some(Buckets::Some { of, mine })) if of == n => {
                    mine.insert(*k);
                }
                // A split that is being changed: the other size's units wait for the next round.
                (Some(_), _) => {}
            }
        }
        buckets
    }

    /// Whether an object in `namespace` is served here.
    pub fn contains(&self, namespace: Option<&str>) -> bool {
        match self {
            Buckets::All => true,
            Buckets::Some { of, mine } => mine.contains(&shard::namespace_bucket(namespace, *of)),
        }
    }

    /// Keeps only the watch events of objects served here (the caches then hold only those).
    pub(super) fn keep<K: Resource>(
        &self,
        event: &Result<watcher::Event<K>, watcher::Error>,
    ) -> bool {
        match event {
            Ok(
                watcher::Event::Apply(o) | watcher::Event::Delete(o) | watcher::Event::InitApply(o),
            ) => self.contains(o.meta().namespace.as_deref()),
            _ => true,
        }
    }
}
