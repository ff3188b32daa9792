//! What one Connection reconcile found, and the conditions that says (CONN-3 … CONN-11). Pure:
//! the reconciler gathers an [`Outcome`], this module turns it into conditions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kbind_shared::conditions::{self, Desired, Status, reasons, types};

/// The result of connecting to the provider, from the first failing step to full success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// CONN-3: the Secret is missing or its kubeconfig unusable.
    SecretInvalid(String),
    /// CONN-4: RBAC denied the provider identity read.
    IdentityForbidden(String),
    /// CONN-4: the provider did not answer (unreachable, TLS, 401, no identity source).
    Unreachable(String),
    /// CONN-6: the provider is another cluster than the pinned one.
    IdentityChanged {
        /// The UID the provider reports now.
        current: String,
        /// The pinned UID.
        pinned: String,
    },
    /// CONN-7: RBAC denied discovery.
    DiscoveryForbidden(String),
    /// CONN-7: discovery failed otherwise.
    DiscoveryFailed(String),
    /// CONN-11: connected, discovered.
    Ready {
        /// The provider server.
        server: String,
        /// How many APIs it exports.
        exported: usize,
        /// Under pullPolicy All, each export whose schema could not be installed, and why: said
        /// in `SchemaInSync`, never un-Readying the Connection (one bad export does not stop the
        /// others).
        not_installed: Vec<String>,
        /// RBAC denied one of the Connection's own requests (the heartbeat), which does not stop
        /// the sync: said in `PermissionDenied`, with the verb and resource.
        denied: Option<String>,
    },
}

/// Reason (SchemaInSync) when pullPolicy All could not install some exports.
pub const INSTALL_FAILED: &str = "InstallFailed";

/// `SchemaInSync=False/InstallFailed` naming the first exports pullPolicy All could not install
/// (at most three, then how many more); `None` when every one was installed.
pub fn not_installed_condition(problems: &[String]) -> Option<Desired<'static>> {
    let (first, rest) = (problems.iter().take(3), problems.len().saturating_sub(3));
    let mut message = first.cloned().collect::<Vec<_>>().join("; ");
    if problems.is_empty() {
        return None;
    }
    if rest > 0 {
        message.push_str(&format!("; and {rest} more"));
    }
    Some(Desired::new(
        types::SCHEMA_IN_SYNC,
        false,
        INSTALL_FAILED,
        format!(
            "pullPolicy All could not install {} of the exported APIs: {message}",
            problems.len()
        ),
    ))
}

/// `Ready=False/CoreSchemaOutdated` when the core CRDs installed lack fields kbind writes (`lack`,
/// [`kbind_shared::api::installed::describe`]): set after the outcome's conditions, whatever they
/// say — the reconcile goes on (the heartbeat keeps the consumer alive for the provider's
/// reaper), but no Connection is `Ready` while nothing can sync.
pub fn core_schema_condition(lack: Option<&str>) -> Option<Desired<'static>> {
    lack.map(|message| {
        Desired::new(
            types::READY,
            false,
            reasons::CORE_SCHEMA_OUTDATED,
            message.to_owned(),
        )
    })
}

/// The conditions `outcome` implies, in setting order. Conditions of steps the reconcile did not
/// reach are left out (they keep their last value, as in the reference).
pub fn desired(outcome: &Outcome) -> Vec<Desired<'static>> {
    let d = |type_, status: bool, reason, message: &str| {
        Desired::new(type_, status, reason, message.to_owned())
    };
    let secret_ok = d(types::SECRET_VALID, true, reasons::AS_EXPECTED, "");
    let connected = d(types::CONNECTED, true, reasons::AS_EXPECTED, "");
    match outcome {
        Outcome::SecretInvalid(m) => vec![
            d(types::SECRET_VALID, false, reasons::SECRET_NOT_FOUND, m),
            d(types::READY, false, reasons::SECRET_NOT_FOUND, m),
        ],
        // Unlike the reference (QRK-16), Connected follows too: the provider was not verified.
        Outcome::IdentityForbidden(m) => vec![
            secret_ok,
            d(types::CONNECTED, false, reasons::FORBIDDEN, m),
            d(types::PERMISSION_DENIED, true, reasons::FORBIDDEN, m),
            d(types::READY, false, reasons::FORBIDDEN, m),
        ],
        Outcome::Unreachable(m) => vec![
            secret_ok,
            d(types::CONNECTED, false, reasons::PENDING, m),
            d(types::READY, false, reasons::PENDING, m),
        ],
        Outcome::IdentityChanged { current, pinned } => {
            let m = format!(
                "the provider's cluster identity is {current}, but this Connection is pinned to {pinned}; \
                 use a new Connection for a different provider"
            );
            vec![
                secret_ok,
                d(
                    types::CONNECTED,
                    false,
                    reasons::CLUSTER_IDENTITY_CHANGED,
                    &m,
                ),
                d(types::READY, false, reasons::CLUSTER_IDENTITY_CHANGED, &m),
            ]
        }
        Outcome::DiscoveryForbidden(m) => vec![
            secret_ok,
            connected,
            d(types::PERMISSION_DENIED, true, reasons::FORBIDDEN, m),
            d(types::READY, false, reasons::FORBIDDEN, m),
        ],
        Outcome::DiscoveryFailed(m) => vec![
            secret_ok,
            connected,
            d(types::READY, false, reasons::PENDING, m),
        ],
        Outcome::Ready {
            server,
            exported,
            denied,
            ..
        } => vec![
            secret_ok,
            connected,
            match denied {
                Some(m) => d(types::PERMISSION_DENIED, true, reasons::FORBIDDEN, m),
                None => d(types::PERMISSION_DENIED, false, reasons::AS_EXPECTED, ""),
            },
            d(
                types::READY,
                true,
                reasons::AS_EXPECTED,
                &format!("connected to {server}; {exported} exported API(s)"),
            ),
        ],
    }
}

/// Sets the conditions `outcome` implies ([`desired`]). Returns whether anything changed.
pub fn apply(
    conditions: &mut Vec<Condition>,
    outcome: &Outcome,
    generation: Option<i64>,
    now: &Time,
) -> bool {
    let mut changed = false;
    for d in desired(outcome) {
        changed |= conditions::set(conditions, d, generation, now);
    }
    changed
}

/// A condition that changed status (or appeared) between `before` and `after`: what an Event
/// reports. Returns (type, new status, reason, message).
pub fn transitions(before: &[Condition], after: &[Condition]) -> Vec<Condition> {
    after
        .iter()
        .filter(|c| {
            conditions::find(before, &c.type_)
                .is_none_or(|old| old.status != c.status || old.reason != c.reason)
        })
        .cloned()
        .collect()
}

/// Whether a condition in this state is good news (a Normal Event) rather than a Warning.
pub fn is_healthy(condition: &Condition) -> bool {
    let healthy_when = if condition.type_ == types::PERMISSION_DENIED {
        Status::False
    } else {
        Status::True
    };
    condition.status == healthy_when.as_str()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Time {
        Time(jiff::Timestamp::from_second(100).unwrap())
    }

    fn state(conditions: &[Condition], type_: &str) -> (String, String) {
        let c = conditions::find(conditions, type_).unwrap_or_else(|| panic!("{type_} missing"));
        (c.status.clone(), c.reason.clone())
    }

    fn s(a: &str, b: &str) -> (String, String) {
        (a.to_owned(), b.to_owned())
    }

    #[test]
    fn outdated_core_crds_un_ready_a_connection_that_is_otherwise_ready() {
        let ready = Outcome::Ready {
            server: "https://p".into(),
            exported: 2,
            not_installed: vec![],
            denied: None,
        };
        let mut conds = Vec::new();
        apply(&mut conds, &ready, Some(1), &now());
        assert_eq!(state(&conds, "Ready"), s("True", "AsExpected"));
        assert_eq!(core_schema_condition(None), None);
        let lack = "the core CRDs installed are not kbind's: connections.core.kbind.io lacks status.verifiedCredential";
        let desired = core_schema_condition(Some(lack)).unwrap();
        conditions::set(&mut conds, desired, Some(1), &now());
        assert_eq!(state(&conds, "Ready"), s("False", "CoreSchemaOutdated"));
        assert_eq!(conditions::find(&conds, "Ready").unwrap().message, lack);
        // The other conditions still say what the reconcile found.
        assert_eq!(state(&conds, "Connected"), s("True", "AsExpected"));
    }

    #[test]
    fn bad_secret_sets_secret_valid_and_ready_false() {
        // CONN-3
        let mut conds = Vec::new();
        apply(
            &mut conds,
            &Outcome::SecretInvalid("Secret kbind/p not found".into()),
            Some(1),
            &now(),
        );
        assert_eq!(state(&conds, "SecretValid"), s("False", "SecretNotFound"));
        assert_eq!(state(&conds, "Ready"), s("False", "SecretNotFound"));
        assert_eq!(
            conditions::find(&conds, "Ready").unwrap().message,
            "Secret kbind/p not found"
        );
        // CONN-14: the order conditions are first set in.
        apply(
            &mut conds,
            &Outcome::Ready {
                server: "s".into(),
                exported: 1,
                not_installed: vec![],
                denied: None,
            },
            Some(1),
            &now(),
        );
        let order: Vec<&str> = conds.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(
            order,
            ["SecretValid", "Ready", "Connected", "PermissionDenied"]
        );
    }

    #[test]
    fn forbidden_identity_denies_permission_and_disconnects() {
        // CONN-4, improving on QRK-16
        let mut conds = Vec::new();
        apply(
            &mut conds,
            &Outcome::IdentityForbidden("denied".into()),
            Some(1),
            &now(),
        );
        assert_eq!(state(&conds, "PermissionDenied"), s("True", "Forbidden"));
        assert_eq!(state(&conds, "Connected"), s("False", "Forbidden"));
        assert_eq!(state(&conds, "Ready"), s("False", "Forbidden"));
        assert_eq!(state(&conds, "SecretValid"), s("True", "AsExpected"));
    }

    #[test]
    fn identity_change_names_both_uids() {
        // CONN-6
        let mut conds = Vec::new();
        apply(
            &mut conds,
            &Outcome::IdentityChanged {
                current: "new-uid".into(),
                pinned: "old-uid".into(),
            },
            Some(1),
            &now(),
        );
        assert_eq!(
            state(&conds, "Connected"),
            s("False", "ClusterIdentityChanged")
        );
        let message = &conditions::find(&conds, "Ready").unwrap().message;
        assert!(
            message.contains("new-uid") && message.contains("old-uid"),
            "{message}"
        );
    }

    #[test]
    fn ready_clears_permission_denied() {
        let mut conds = Vec::new();
        apply(
            &mut conds,
            &Outcome::DiscoveryForbidden("no list".into()),
            Some(1),
            &now(),
        );
        assert_eq!(state(&conds, "PermissionDenied"), s("True", "Forbidden"));
        assert_eq!(state(&conds, "Connected"), s("True", "AsExpected"));
        apply(
            &mut conds,
            &Outcome::Ready {
                server: "https://p".into(),
                exported: 2,
                not_installed: vec![],
                denied: None,
            },
            Some(2),
            &now(),
        );
        assert_eq!(state(&conds, "PermissionDenied"), s("False", "AsExpected"));
        assert_eq!(state(&conds, "Ready"), s("True", "AsExpected"));
        assert!(conds.iter().all(|c| c.observed_generation == Some(2)));
        // #33.8: the heartbeat denied (a revoked credential): PermissionDenied names it, while
        // what still works keeps working; access regained clears it.
        let denied = |denied: Option<&str>| Outcome::Ready {
            server: "https://p".into(),
            exported: 2,
            not_installed: vec![],
            denied: denied.map(str::to_owned),
        };
        apply(
            &mut conds,
            &denied(Some("may not update leases")),
            Some(2),
            &now(),
        );
        assert_eq!(state(&conds, "PermissionDenied"), s("True", "Forbidden"));
        assert!(
            kbind_shared::conditions::find(&conds, "PermissionDenied")
                .is_some_and(|c| c.message.contains("may not update leases"))
        );
        apply(&mut conds, &denied(None), Some(2), &now());
        assert_eq!(state(&conds, "PermissionDenied"), s("False", "AsExpected"));
    }

    #[test]
    fn unchanged_outcome_changes_nothing_and_transitions_are_reported_once() {
        let mut conds = Vec::new();
        let outcome = Outcome::Ready {
            server: "s".into(),
            exported: 1,
            not_installed: vec![],
            denied: None,
        };
        assert!(apply(&mut conds, &outcome, Some(1), &now()));
        let before = conds.clone();
        assert!(!apply(&mut conds, &outcome, Some(1), &now()));
        assert!(transitions(&before, &conds).is_empty());

        apply(
            &mut conds,
            &Outcome::Unreachable("refused".into()),
            Some(1),
            &now(),
        );
        let changed: Vec<String> = transitions(&before, &conds)
            .iter()
            .map(|c| c.type_.clone())
            .collect();
        assert_eq!(changed, ["Connected", "Ready"]);
        // A new reason under the same status is news too; so is a new status under the same
        // reason; a new message alone is not.
        let condition = |status: &str, reason: &str, message: &str| Condition {
            type_: "Ready".into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: now(),
            observed_generation: None,
        };
        let was = [condition("False", "Unreachable", "refused")];
        for (now_is, news) in [
            (condition("False", "Forbidden", "refused"), true),
            (condition("True", "Unreachable", "refused"), true),
            (condition("False", "Unreachable", "timed out"), false),
        ] {
            assert_eq!(
                transitions(&was, std::slice::from_ref(&now_is)).len(),
                usize::from(news),
                "{now_is:?}"
            );
        }
        assert!(!is_healthy(conditions::find(&conds, "Ready").unwrap()));
        assert!(is_healthy(
            conditions::find(&conds, "PermissionDenied").unwrap()
        ));
    }

    #[test]
    fn exports_pull_policy_all_could_not_install_are_named_without_un_readying() {
        // #32.10
        assert!(not_installed_condition(&[]).is_none());
        let problems: Vec<String> = (0..5).map(|i| format!("api{i}: why")).collect();
        let d = not_installed_condition(&problems).unwrap();
        assert_eq!((d.type_, d.reason), (types::SCHEMA_IN_SYNC, INSTALL_FAILED));
        assert!(
            d.message.contains("could not install 5 of"),
            "{}",
            d.message
        );
        assert!(d.message.contains("api2: why; and 2 more"), "{}", d.message);
        assert!(!d.message.contains("api3"), "{}", d.message);
        // Three or fewer: all named, nothing "more".
        let three = not_installed_condition(&problems[..3]).unwrap();
        assert!(
            three.message.ends_with("api0: why; api1: why; api2: why"),
            "{}",
            three.message
        );
        // Ready stays True.
        let mut conds = Vec::new();
        apply(
            &mut conds,
            &Outcome::Ready {
                server: "s".into(),
                exported: 5,
                not_installed: problems,
                denied: None,
            },
            Some(1),
            &now(),
        );
        assert_eq!(state(&conds, "Ready").0, "True");
    }
}
