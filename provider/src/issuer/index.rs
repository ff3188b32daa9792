//! The Grants by boundary, kept from their watch's events: pure.

use std::collections::{BTreeSet, HashMap};

use kbind_shared::api::iam::Grant;
use kube::ResourceExt;
use kube::runtime::watcher;

/// Which Grants compute each boundary.
#[derive(Debug, Default)]
pub struct Index {
    /// Each Grant's boundary, by Grant name.
    boundary_of: HashMap<String, String>,
    /// The (re-)list in progress, until its `InitDone`.
    listing: Option<HashMap<String, String>>,
}

impl Index {
    /// Takes in `event`; returns the boundaries a Grant left (deleted, or edited to another),
    /// whose remaining Grants may now hold them.
    pub fn observe(&mut self, event: &watcher::Event<Grant>) -> Vec<String> {
        let entry = |g: &Grant| (g.name_any(), super::plan::boundary_of(g));
        match event {
            watcher::Event::Apply(g) => {
                let (name, boundary) = entry(g);
                self.boundary_of
                    .insert(name, boundary.clone())
                    .filter(|old| *old != boundary)
                    .into_iter()
                    .collect()
            }
            watcher::Event::Delete(g) => {
                self.boundary_of.remove(&g.name_any()).into_iter().collect()
            }
            watcher::Event::Init => {
                self.listing = Some(HashMap::new());
                Vec::new()
            }
            watcher::Event::InitApply(g) => {
                let (name, boundary) = entry(g);
                self.listing.get_or_insert_default().insert(name, boundary);
                Vec::new()
            }
            watcher::Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                let old = std::mem::replace(&mut self.boundary_of, listed);
                let mut left: Vec<String> = old
                    .into_iter()
                    .filter(|(name, boundary)| self.boundary_of.get(name) != Some(boundary))
                    .map(|(_, boundary)| boundary)
                    .collect();
                left.sort();
                left.dedup();
                left
            }
        }
    }

    /// The Grants whose boundary is `boundary`.
    pub fn grants(&self, boundary: &str) -> BTreeSet<String> {
        self.boundary_of
            .iter()
            .filter(|(_, b)| *b == boundary)
            .map(|(name, _)| name.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kbind_shared::api::iam::{GrantConsumer, GrantSpec};

    fn grant(name: &str, identity: &str) -> Grant {
        Grant::new(
            name,
            GrantSpec {
                export: "widgets".into(),
                consumer: GrantConsumer {
                    identity: identity.into(),
                    cluster_name: None,
                },
                credential: Default::default(),
                revoked: false,
            },
        )
    }

    fn b(identity: &str) -> String {
        super::super::rbac::boundary(identity, None, "widgets")
    }

    #[test]
    fn grants_are_found_by_boundary_and_a_boundary_left_is_named() {
        use watcher::Event::*;
        let mut index = Index::default();
        assert!(index.observe(&Apply(grant("first", "alice"))).is_empty());
        assert!(index.observe(&Apply(grant("second", "alice"))).is_empty());
        assert!(index.observe(&Apply(grant("other", "bob"))).is_empty());
        assert_eq!(
            index.grants(&b("alice")),
            ["first".to_owned(), "second".to_owned()].into()
        );
        // Deleted: its boundary is named, the other Grant of it remains.
        assert_eq!(
            index.observe(&Delete(grant("first", "alice"))),
            [b("alice")]
        );
        assert_eq!(index.grants(&b("alice")), ["second".to_owned()].into());
        // Edited to another consumer: the old boundary is named.
        assert_eq!(
            index.observe(&Apply(grant("second", "carol"))),
            [b("alice")]
        );
        assert!(index.grants(&b("alice")).is_empty());
        // Unchanged: nothing named.
        assert!(index.observe(&Apply(grant("second", "carol"))).is_empty());
        // A re-list that no longer shows `other`: its boundary is named once it is done.
        assert!(index.observe(&Init).is_empty());
        assert!(
            index
                .observe(&InitApply(grant("second", "carol")))
                .is_empty()
        );
        assert_eq!(
            index.grants(&b("bob")),
            ["other".to_owned()].into(),
            "until the re-list is done"
        );
        assert_eq!(index.observe(&InitDone), [b("bob")]);
        assert!(index.grants(&b("bob")).is_empty());
        assert_eq!(index.grants(&b("carol")), ["second".to_owned()].into());
    }
}
