//! Which namespace buckets of an API a worker serves (see `kbind_shared::shard::Unit`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

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

    /// How many objects each unit served here holds, the objects given by their namespaces
    /// (each distinct namespace is hashed once): what the leader places units by.
    pub fn objects_per_unit<'a>(
        &self,
        connection: &str,
        api: &str,
        namespaces: impl IntoIterator<Item = Option<&'a str>>,
    ) -> BTreeMap<String, u64> {
        let unit = |bucket| {
            Unit::Api {
                connection: connection.to_owned(),
                api: api.to_owned(),
                bucket,
            }
            .to_string()
        };
        match self {
            Buckets::All => [(unit(None), namespaces.into_iter().count() as u64)].into(),
            Buckets::Some { of, mine } => {
                let mut per_namespace: HashMap<Option<&str>, u64> = HashMap::new();
                for namespace in namespaces {
                    *per_namespace.entry(namespace).or_default() += 1;
                }
                let mut out: BTreeMap<String, u64> =
                    mine.iter().map(|k| (unit(Some((*k, *of))), 0)).collect();
                for (namespace, count) in per_namespace {
                    let k = shard::namespace_bucket(namespace, *of);
                    if mine.contains(&k) {
                        *out.entry(unit(Some((k, *of)))).or_default() += count;
                    }
                }
                out
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_counted_per_unit_served_here() {
        let all =
            Buckets::All.objects_per_unit("p", "widgets.example.org", [None, Some("a"), Some("b")]);
        assert_eq!(all, [("p/widgets.example.org".to_owned(), 3)].into());
        let (a, b) = (
            shard::namespace_bucket(Some("a"), 4),
            shard::namespace_bucket(Some("b"), 4),
        );
        let mine: BTreeSet<u32> = [a, (a + 1) % 4].into();
        let some = Buckets::Some {
            of: 4,
            mine: mine.clone(),
        };
        let counted = some.objects_per_unit(
            "p",
            "widgets.example.org",
            [Some("a"), Some("a"), Some("b"), Some("a")],
        );
        let unit = |k: u32| format!("p/widgets.example.org#{k}/4");
        // Every bucket served here is counted, an empty one as 0; other buckets not at all.
        let mut want: BTreeMap<String, u64> = mine.iter().map(|k| (unit(*k), 0)).collect();
        *want.get_mut(&unit(a)).unwrap() += 3;
        if mine.contains(&b) {
            *want.get_mut(&unit(b)).unwrap() += 1;
        }
        assert_eq!(counted, want);
    }
}
