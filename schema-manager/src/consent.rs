//! Consent that expires (#33.6): an accepted breaking change names one full schema digest, and it
//! lasts while that schema is served. Once the consumer CRD serves an accepted schema, the
//! Connection's status records since when; when the CRD serves another schema afterwards (the
//! provider moved on and a newer change applied), the entry is pruned from
//! `spec.schema.acceptedChanges` — a provider going A → B → A must be accepted again. An entry
//! whose schema was never served (still pending, or not reported yet) is never pruned. Pure.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kbind_shared::api::{AcceptedChange, AppliedChange};

/// What the review decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Review {
    /// The accepted entries to keep, in their order.
    pub accepted: Vec<AcceptedChange>,
    /// The served ones, since when.
    pub applied: Vec<AppliedChange>,
}

/// Reviews `accepted` against the schema hash each API's consumer CRD serves for this Connection
/// (`served`, by API), given what the status recorded (`applied`), at `now`.
pub fn review(
    accepted: &[AcceptedChange],
    applied: &[AppliedChange],
    served: &BTreeMap<String, String>,
    now: &Time,
) -> Review {
    let mut out = Review {
        accepted: Vec::new(),
        applied: Vec::new(),
    };
    for entry in accepted {
        let recorded = applied
            .iter()
            .find(|a| a.api == entry.api && a.schema_hash == entry.schema_hash);
        let serving = served.get(&entry.api) == Some(&entry.schema_hash);
        match (serving, recorded) {
            (true, Some(recorded)) => {
                out.accepted.push(entry.clone());
                out.applied.push(recorded.clone());
            }
            (true, None) => {
                out.accepted.push(entry.clone());
                out.applied.push(AppliedChange {
                    api: entry.api.clone(),
                    schema_hash: entry.schema_hash.clone(),
                    since: now.clone(),
                });
            }
            // Served once, and the CRD serves another schema now: the consent has done its work
            // and expires. (A CRD not there at the moment decides nothing.)
            (false, Some(_)) if served.contains_key(&entry.api) => {}
            (false, Some(recorded)) => {
                out.accepted.push(entry.clone());
                out.applied.push(recorded.clone());
            }
            // Not served yet: pending, or waiting for its binding.
            (false, None) => out.accepted.push(entry.clone()),
        }
    }
    out.applied
        .dedup_by(|a, b| a.api == b.api && a.schema_hash == b.schema_hash);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepted(api: &str, hash: &str) -> AcceptedChange {
        AcceptedChange {
            api: api.into(),
            schema_hash: hash.into(),
        }
    }

    fn at(seconds: i64) -> Time {
        Time(jiff::Timestamp::from_second(seconds).unwrap())
    }

    #[test]
    fn consent_lasts_while_its_schema_is_served() {
        let served = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(a, h)| ((*a).to_owned(), (*h).to_owned()))
                .collect()
        };
        // B accepted while A is served: pending, kept, nothing recorded.
        let list = vec![accepted("w.x", "sha256:b")];
        let pending = review(&list, &[], &served(&[("w.x", "sha256:a")]), &at(1));
        assert_eq!(pending.accepted, list);
        assert!(pending.applied.is_empty());
        // B applied: recorded since now, kept.
        let applied = review(&list, &[], &served(&[("w.x", "sha256:b")]), &at(2));
        assert_eq!(applied.accepted, list);
        assert_eq!(applied.applied.len(), 1);
        assert_eq!(applied.applied[0].since, at(2));
        // Still served later: the time stays the first one seen.
        let later = review(
            &list,
            &applied.applied,
            &served(&[("w.x", "sha256:b")]),
            &at(9),
        );
        assert_eq!(later.applied[0].since, at(2));
        // The provider moved on and C (accepted too) applied: B's consent expires, C's stays.
        let both = vec![accepted("w.x", "sha256:b"), accepted("w.x", "sha256:c")];
        let moved = review(
            &both,
            &later.applied,
            &served(&[("w.x", "sha256:c")]),
            &at(10),
        );
        assert_eq!(moved.accepted, vec![accepted("w.x", "sha256:c")]);
        assert_eq!(moved.applied.len(), 1);
        assert_eq!(moved.applied[0].schema_hash, "sha256:c");
        // A → B → A: the old A, once pruned, must be accepted again (an entry for it now is new
        // consent, recorded afresh).
        let again = review(
            &[accepted("w.x", "sha256:a")],
            &moved.applied,
            &served(&[("w.x", "sha256:a")]),
            &at(11),
        );
        assert_eq!(again.applied[0].since, at(11));
        // Other APIs and a CRD gone (nothing served) leave entries alone unless recorded.
        let unrelated = review(
            &[accepted("v.x", "sha256:z")],
            &[],
            &BTreeMap::new(),
            &at(12),
        );
        assert_eq!(unrelated.accepted.len(), 1);
        // A recorded entry whose CRD is not there at the moment stays, with its record.
        let absent = review(&list, &applied.applied, &BTreeMap::new(), &at(12));
        assert_eq!(
            (absent.accepted, absent.applied),
            (list.clone(), applied.applied.clone())
        );
        // A legacy 16-digit entry never matches a served full digest: kept until it was
        // served, which it never is — the user's to remove (kbind does not guess).
        let legacy = review(
            &[accepted("w.x", "sha256:0123456789abcdef")],
            &[],
            &served(&[("w.x", "sha256:c")]),
            &at(13),
        );
        assert_eq!(legacy.accepted.len(), 1);
    }
}
