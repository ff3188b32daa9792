//! Which heartbeat answers for a provider object: the Connection that wrote it, by the record on
//! the object (`core.kbind.io/heartbeat`), and never another Connection of the same consumer —
//! one lapsed credential does not make a consumer's other, live Connection's copies look dead.
//! Objects no Lease the reaper can judge accounts for are `Unaccounted`: reported, never touched.
//! Pure; table-tested.

use std::collections::{BTreeMap, BTreeSet};

/// Who a group of objects (one consumer UID, one heartbeat record or none) answers to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Judge {
    /// The heartbeat Lease `<namespace>/<name>` the reaper reads.
    Heartbeat(String),
    /// A heartbeat Lease in the policy's namespaces that the reaper saw and that is gone.
    Gone(String),
    /// The consumer (UID) has no Lease the reaper ever saw where the record says it is.
    Never(String),
    /// The consumer (UID) wrote them through a Connection whose Lease the reaper cannot judge.
    Unaccounted(String),
}

/// The heartbeats a sweep read (each a Lease that speaks for its consumer), and where it reads.
#[derive(Debug, Clone, Default)]
pub struct Heartbeats {
    /// `<namespace>/<name>` → the consumer UID it speaks for.
    pub by_key: BTreeMap<String, String>,
    /// The namespaces whose Leases the policy reads.
    pub watched: BTreeSet<String>,
}

impl Heartbeats {
    /// Judges every group of objects, `(consumer UID, heartbeat record)`:
    /// - a record naming a Lease that is read and speaks for that UID: that heartbeat;
    /// - a record naming a Lease in a read namespace that is not there: `Gone` if it was seen
    ///   (`was_seen`), else `Never`;
    /// - a record naming a Lease elsewhere, or one that speaks for another UID: `Unaccounted`;
    /// - no record (written before copies carried it, or by the Go konnector): the consumer's one
    ///   heartbeat when it has exactly one and nothing of it is judged otherwise; `Never` with
    ///   none; `Unaccounted` when several Connections (or one the reaper cannot read) could have
    ///   written it.
    pub fn judge<'g>(
        &self,
        groups: impl IntoIterator<Item = (&'g str, Option<&'g str>)>,
        was_seen: &dyn Fn(&str) -> bool,
    ) -> BTreeMap<(String, Option<String>), Judge> {
        let groups: BTreeSet<(&str, Option<&str>)> = groups.into_iter().collect();
        let mut judged = BTreeMap::new();
        // UIDs with objects written by a Connection the reaper cannot judge.
        let mut hidden_writers: BTreeSet<&str> = BTreeSet::new();
        for &(uid, record) in &groups {
            let Some(record) = record else { continue };
            let judge = match self.by_key.get(record) {
                Some(owner) if owner == uid => Judge::Heartbeat(record.to_owned()),
                Some(_) => Judge::Unaccounted(uid.to_owned()),
                None if self.is_watched(record) && was_seen(record) => {
                    Judge::Gone(record.to_owned())
                }
                None if self.is_watched(record) => Judge::Never(uid.to_owned()),
                None => Judge::Unaccounted(uid.to_owned()),
            };
            if !matches!(judge, Judge::Heartbeat(_)) {
                hidden_writers.insert(uid);
            }
            judged.insert((uid.to_owned(), Some(record.to_owned())), judge);
        }
        for &(uid, record) in &groups {
            if record.is_some() {
                continue;
            }
            let mut keys = self.by_key.iter().filter(|(_, owner)| *owner == uid);
            let judge = match (keys.next(), keys.next()) {
                _ if hidden_writers.contains(uid) => Judge::Unaccounted(uid.to_owned()),
                (Some((key, _)), None) => Judge::Heartbeat(key.clone()),
                (None, _) => Judge::Never(uid.to_owned()),
                (Some(_), Some(_)) => Judge::Unaccounted(uid.to_owned()),
            };
            judged.insert((uid.to_owned(), None), judge);
        }
        judged
    }

    fn is_watched(&self, record: &str) -> bool {
        record
            .split_once('/')
            .is_some_and(|(namespace, _)| self.watched.contains(namespace))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heartbeats(leases: &[(&str, &str)]) -> Heartbeats {
        Heartbeats {
            by_key: leases
                .iter()
                .map(|(k, u)| ((*k).to_owned(), (*u).to_owned()))
                .collect(),
            watched: ["kbind".to_owned()].into(),
        }
    }

    fn judged(
        h: &Heartbeats,
        groups: &[(&str, Option<&str>)],
        seen: &[&str],
    ) -> Vec<(String, Option<String>, Judge)> {
        h.judge(groups.iter().copied(), &|k| seen.contains(&k))
            .into_iter()
            .map(|((u, r), j)| (u, r, j))
            .collect()
    }

    fn heartbeat(key: &str) -> Judge {
        Judge::Heartbeat(key.into())
    }

    #[test]
    fn each_copy_answers_to_the_connection_that_wrote_it() {
        let h = heartbeats(&[("kbind/x-u", "u"), ("kbind/y-u", "u")]);
        // Two Connections of one consumer: each copy by its own record.
        assert_eq!(
            judged(
                &h,
                &[("u", Some("kbind/x-u")), ("u", Some("kbind/y-u"))],
                &[]
            ),
            [
                ("u".into(), Some("kbind/x-u".into()), heartbeat("kbind/x-u")),
                ("u".into(), Some("kbind/y-u".into()), heartbeat("kbind/y-u")),
            ]
        );
    }

    #[test]
    fn copies_no_judged_heartbeat_accounts_for_are_never_someone_elses_to_reap() {
        let h = heartbeats(&[("kbind/x-u", "u"), ("kbind/fake-v", "u")]);
        for (group, seen, want) in [
            // Written by a Connection whose Lease is outside the policy's namespaces: a Lease
            // for the same UID in a read namespace (a co-tenant's copy, say) does not speak for it.
            (
                ("u", Some("team-a/y-u")),
                vec![],
                Judge::Unaccounted("u".into()),
            ),
            // The record names a Lease that speaks for another consumer.
            (
                ("v", Some("kbind/x-u")),
                vec![],
                Judge::Unaccounted("v".into()),
            ),
            // In a read namespace, never seen: NoLease; seen and gone: Gone.
            (("w", Some("kbind/z-w")), vec![], Judge::Never("w".into())),
            (
                ("w", Some("kbind/z-w")),
                vec!["kbind/z-w"],
                Judge::Gone("kbind/z-w".into()),
            ),
        ] {
            let got = judged(&h, &[group], &seen);
            assert_eq!(got[0].2, want, "{group:?}");
        }
    }

    #[test]
    fn unrecorded_copies_answer_to_the_one_heartbeat_that_can_have_written_them() {
        // The Go konnector's consumer: one Lease, copies without the record.
        let one = heartbeats(&[("kbind/consumer-g", "g")]);
        assert_eq!(
            judged(&one, &[("g", None)], &[])[0].2,
            heartbeat("kbind/consumer-g")
        );
        // With a recorded copy of the same heartbeat too.
        assert_eq!(
            judged(&one, &[("g", None), ("g", Some("kbind/consumer-g"))], &[])
                .iter()
                .map(|(_, _, j)| j.clone())
                .collect::<Vec<_>>(),
            [heartbeat("kbind/consumer-g"), heartbeat("kbind/consumer-g")]
        );
        // One visible heartbeat, but the consumer also wrote through a Connection the reaper
        // cannot read: the unrecorded copies may be that one's.
        let got = judged(&one, &[("g", None), ("g", Some("elsewhere/y-g"))], &[]);
        assert_eq!(got[0].2, Judge::Unaccounted("g".into()));
        // Two visible heartbeats: which one wrote it cannot be told.
        let two = heartbeats(&[("kbind/x-u", "u"), ("kbind/y-u", "u")]);
        assert_eq!(
            judged(&two, &[("u", None)], &[])[0].2,
            Judge::Unaccounted("u".into())
        );
        // No heartbeat at all: NoLease.
        assert_eq!(
            judged(&two, &[("c", None)], &[])[0].2,
            Judge::Never("c".into())
        );
    }
}
