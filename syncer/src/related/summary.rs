//! What one pass of the related worker found, and the `RelatedResourcesSynced` condition that
//! says it. Pure.

use std::collections::BTreeMap;

use kbind_shared::conditions::{Desired, reasons, types};

use super::plan::TargetKey;

/// What one pass found.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    /// Copies in sync.
    pub(super) in_sync: usize,
    /// Targets left alone, and why.
    pub(super) conflicts: BTreeMap<TargetKey, String>,
    /// Failed writes: (forbidden?, message).
    pub(super) errors: Vec<(bool, String)>,
}

/// How many conflicts the condition names (the count says the rest).
const NAMED: usize = 3;

/// The condition for a pass: the first error (and how many more), else the conflicts (the first
/// few named), else in sync with `note` (entries that matched nothing).
pub(super) fn condition(outcome: &Outcome, note: String) -> Desired<'static> {
    let conflicts = outcome.conflicts.len();
    if let Some((forbidden, first)) = outcome.errors.first() {
        let more = match outcome.errors.len() {
            1 => String::new(),
            n => format!(" (and {} more errors)", n - 1),
        };
        let reason = if *forbidden {
            reasons::FORBIDDEN
        } else {
            reasons::ERROR
        };
        return Desired::new(
            types::RELATED_RESOURCES_SYNCED,
            false,
            reason,
            format!("{first}{more}"),
        );
    }
    if conflicts > 0 {
        let listed: Vec<String> = outcome
            .conflicts
            .iter()
            .take(NAMED)
            .map(|(k, why)| format!("{k} {why}"))
            .collect();
        let more = if conflicts > NAMED {
            format!("; and {} more", conflicts - NAMED)
        } else {
            String::new()
        };
        return Desired::new(
            types::RELATED_RESOURCES_SYNCED,
            false,
            reasons::CONFLICTS,
            format!(
                "{conflicts} related object(s) left alone: {}{more}",
                listed.join("; ")
            ),
        );
    }
    Desired::new(
        types::RELATED_RESOURCES_SYNCED,
        true,
        reasons::AS_EXPECTED,
        format!(
            "{} related object(s) copied and in sync{note}",
            outcome.in_sync
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::related::plan::{KindKey, Side};
    use kbind_shared::api::RelatedResourceKind;
    use kbind_shared::conditions::Status;

    fn key(name: &str) -> TargetKey {
        TargetKey {
            kind: KindKey(RelatedResourceKind::Secrets),
            side: Side::Provider,
            namespace: "team-a".into(),
            name: name.into(),
        }
    }

    #[test]
    fn errors_then_conflicts_then_in_sync() {
        let conflicts: BTreeMap<TargetKey, String> = (0..5)
            .map(|i| (key(&format!("s{i}")), "exists".to_owned()))
            .collect();
        // (outcome, status, reason, message contains)
        let cases = [
            (
                Outcome {
                    in_sync: 2,
                    conflicts: conflicts.clone(),
                    errors: vec![(true, "denied".into()), (false, "boom".into())],
                },
                Status::False,
                reasons::FORBIDDEN,
                "denied (and 1 more errors)",
            ),
            (
                Outcome {
                    in_sync: 2,
                    conflicts: conflicts.clone(),
                    errors: vec![(false, "boom".into())],
                },
                Status::False,
                reasons::ERROR,
                "boom",
            ),
            (
                Outcome {
                    in_sync: 2,
                    conflicts,
                    errors: vec![],
                },
                Status::False,
                reasons::CONFLICTS,
                "5 related object(s) left alone: ",
            ),
            (
                Outcome {
                    in_sync: 2,
                    ..Default::default()
                },
                Status::True,
                reasons::AS_EXPECTED,
                "2 related object(s) copied and in sync; note",
            ),
        ];
        for (outcome, status, reason, text) in cases {
            let d = condition(&outcome, "; note".into());
            assert_eq!((d.status, d.reason), (status, reason), "{text}");
            assert!(d.message.contains(text), "{}", d.message);
        }
        let many = Outcome {
            conflicts: (0..5)
                .map(|i| (key(&format!("s{i}")), "exists".to_owned()))
                .collect(),
            ..Default::default()
        };
        let message = condition(&many, String::new()).message;
        assert!(message.ends_with("; and 2 more"), "{message}");
        assert_eq!(message.matches("exists").count(), NAMED);
    }
}
