//! Condition types, reasons and the helper that sets them with Kubernetes semantics
//! (REFERENCE-BEHAVIOUR §3.3, COND-1 … COND-3): every condition carries the object's
//! `observedGeneration`, and `lastTransitionTime` changes only when the status changes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// COND-1: condition types.
pub mod types {
    /// The object is fully working.
    pub const READY: &str = "Ready";
    /// The Connection's kubeconfig Secret is present and usable.
    pub const SECRET_VALID: &str = "SecretValid";
    /// The provider answered and its identity matches the pinned one.
    pub const CONNECTED: &str = "Connected";
    /// Installed schemas match the provider's.
    pub const SCHEMA_IN_SYNC: &str = "SchemaInSync";
    /// A binding's setup (schemas, engagement) is done.
    pub const SYNCED: &str = "Synced";
    /// Some instances of a binding conflict with provider objects.
    pub const CONFLICTS: &str = "Conflicts";
    /// The provider credentials lack a permission kbind needs.
    pub const PERMISSION_DENIED: &str = "PermissionDenied";
    /// A binding's related Secrets and ConfigMaps are copied (written by the syncer).
    pub const RELATED_RESOURCES_SYNCED: &str = "RelatedResourcesSynced";
    /// Some of a Connection's APIs are about to lose, or have lost, their automatic binding
    /// (their CRDs and objects are kept).
    pub const UNBOUND: &str = "Unbound";
}

/// COND-2: condition reasons.
pub mod reasons {
    /// Nothing is wrong.
    pub const AS_EXPECTED: &str = "AsExpected";
    /// Waiting for a dependency.
    pub const PENDING: &str = "Pending";
    /// The user paused it (a suspended binding; an object's `core.kbind.io/paused`).
    pub const PAUSED: &str = "Paused";
    /// The kubeconfig Secret is missing or unusable.
    pub const SECRET_NOT_FOUND: &str = "SecretNotFound";
    /// The provider's identity differs from the pinned one.
    pub const CLUSTER_IDENTITY_CHANGED: &str = "ClusterIdentityChanged";
    /// A bound API is not exported by the provider.
    pub const API_NOT_EXPORTED: &str = "APINotExported";
    /// A provider object exists without kbind's markers.
    pub const FOREIGN_OBJECT_EXISTS: &str = "ForeignObjectExists";
    /// A provider object belongs to another consumer object or cluster.
    pub const OWNED_BY_ANOTHER: &str = "OwnedByAnother";
    /// RBAC denied a request.
    pub const FORBIDDEN: &str = "Forbidden";
    /// A Connection waits for its bindings to be cleaned up before it goes.
    pub const DRAINING_BINDINGS: &str = "DrainingBindings";
    /// A `relatedResources` label selector cannot be parsed.
    pub const INVALID_SELECTOR: &str = "InvalidSelector";
    /// Some related targets exist and are not kbind's copies.
    pub const CONFLICTS: &str = "Conflicts";
    /// A request failed for another reason.
    pub const ERROR: &str = "Error";
    /// A consumer CRD an API needs is not kbind's to change (another owner, another Connection,
    /// or a reserved group).
    pub const SCHEMA_CONFLICT: &str = "SchemaConflict";
    /// The core CRDs installed (`*.core.kbind.io`) would prune fields kbind writes: not kbind's
    /// (the Go konnector's, or an older release's), so nothing can sync (#53.6).
    pub const CORE_SCHEMA_OUTDATED: &str = "CoreSchemaOutdated";
}

/// The status of a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// `"True"`.
    True,
    /// `"False"`.
    False,
    /// `"Unknown"`.
    Unknown,
}

impl Status {
    /// The wire form.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

impl From<bool> for Status {
    fn from(value: bool) -> Self {
        if value { Status::True } else { Status::False }
    }
}

/// A condition to set: everything but the bookkeeping fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired<'a> {
    /// Condition type, one of [`types`].
    pub type_: &'a str,
    /// Its status.
    pub status: Status,
    /// One of [`reasons`].
    pub reason: &'a str,
    /// What a cluster admin should know, or do.
    pub message: String,
}

impl<'a> Desired<'a> {
    /// `SchemaInSync`: true when nothing is `behind`, else `Pending`: `differ` followed by what is
    /// behind.
    pub fn schema_in_sync(differ: &str, behind: &[impl AsRef<str>]) -> Self {
        if behind.is_empty() {
            return Desired::new(types::SCHEMA_IN_SYNC, true, reasons::AS_EXPECTED, "");
        }
        let behind: Vec<&str> = behind.iter().map(AsRef::as_ref).collect();
        let message = format!("{differ}{}", behind.join(", "));
        Desired::new(types::SCHEMA_IN_SYNC, false, reasons::PENDING, message)
    }

    /// A condition with the given status, reason and message.
    pub fn new(
        type_: &'a str,
        status: impl Into<Status>,
        reason: &'a str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            status: status.into(),
            reason,
            message: message.into(),
        }
    }
}

/// The longest message kbind writes into a status field (characters): text from a provider or a
/// Secret is bounded before anyone reads it.
pub const MAX_MESSAGE: usize = 1000;

/// `text` cut to at most `max` characters (an ellipsis marks the cut), never inside a character.
pub fn bounded(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// Sets `desired` in `conditions` like Kubernetes' `meta.SetStatusCondition`: a new condition is
/// appended; an existing one gets the new reason, message and `observedGeneration`, and a new
/// `lastTransitionTime` only if its status changed. Returns whether anything changed.
pub fn set(
    conditions: &mut Vec<Condition>,
    desired: Desired<'_>,
    observed_generation: Option<i64>,
    now: &Time,
) -> bool {
    let Desired {
        type_,
        status,
        reason,
        message,
    } = desired;
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        None => {
            conditions.push(Condition {
                type_: type_.to_owned(),
                status: status.as_str().to_owned(),
                reason: reason.to_owned(),
                message,
                observed_generation,
                last_transition_time: now.clone(),
            });
            true
        }
        Some(existing) => {
            let mut changed = false;
            if existing.status != status.as_str() {
                existing.status = status.as_str().to_owned();
                existing.last_transition_time = now.clone();
                changed = true;
            }
            if existing.reason != reason {
                existing.reason = reason.to_owned();
                changed = true;
            }
            if existing.message != message {
                existing.message = message;
                changed = true;
            }
            if existing.observed_generation != observed_generation {
                existing.observed_generation = observed_generation;
                changed = true;
            }
            changed
        }
    }
}

/// The condition of the given type, if present.
pub fn find<'c>(conditions: &'c [Condition], type_: &str) -> Option<&'c Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of the given type is present and `"True"`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == Status::True.as_str())
}

/// Removes the condition of the given type. Returns whether it was present.
pub fn remove(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    conditions.len() != before
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Time {
        Time(jiff::Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn new_condition_is_appended_with_generation_and_time() {
        let mut conds = Vec::new();
        let changed = set(
            &mut conds,
            Desired::new(types::READY, true, reasons::AS_EXPECTED, ""),
            Some(3),
            &at(10),
        );
        assert!(changed);
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0].status, "True");
        assert_eq!(conds[0].reason, "AsExpected");
        assert_eq!(conds[0].observed_generation, Some(3));
        assert_eq!(conds[0].last_transition_time, at(10));
    }

    #[test]
    fn transition_time_moves_only_when_status_changes() {
        let mut conds = Vec::new();
        set(
            &mut conds,
            Desired::new(types::READY, false, reasons::PENDING, "waiting"),
            Some(1),
            &at(10),
        );

        // Same status, new reason/message/generation: updated, but the transition time stays.
        let changed = set(
            &mut conds,
            Desired::new(types::READY, false, reasons::SECRET_NOT_FOUND, "no secret"),
            Some(2),
            &at(20),
        );
        assert!(changed);
        assert_eq!(conds[0].reason, "SecretNotFound");
        assert_eq!(conds[0].message, "no secret");
        assert_eq!(conds[0].observed_generation, Some(2));
        assert_eq!(conds[0].last_transition_time, at(10));

        // Status flips: the transition time moves.
        set(
            &mut conds,
            Desired::new(types::READY, true, reasons::AS_EXPECTED, ""),
            Some(2),
            &at(30),
        );
        assert_eq!(conds[0].status, "True");
        assert_eq!(conds[0].last_transition_time, at(30));
    }

    #[test]
    fn setting_the_same_condition_again_changes_nothing() {
        let mut conds = Vec::new();
        set(
            &mut conds,
            Desired::new(types::CONNECTED, true, reasons::AS_EXPECTED, "ok"),
            Some(1),
            &at(10),
        );
        let before = conds.clone();
        assert!(!set(
            &mut conds,
            Desired::new(types::CONNECTED, true, reasons::AS_EXPECTED, "ok"),
            Some(1),
            &at(99)
        ));
        assert_eq!(conds, before);
    }

    #[test]
    fn conditions_are_found_by_type_not_position() {
        let mut conds = Vec::new();
        set(
            &mut conds,
            Desired::new(types::SECRET_VALID, true, reasons::AS_EXPECTED, ""),
            None,
            &at(1),
        );
        set(
            &mut conds,
            Desired::new(types::READY, false, reasons::PENDING, ""),
            None,
            &at(1),
        );
        assert!(is_true(&conds, types::SECRET_VALID));
        assert!(!is_true(&conds, types::READY));
        assert!(!is_true(&conds, types::CONNECTED));
        assert!(remove(&mut conds, types::SECRET_VALID));
        assert!(!remove(&mut conds, types::SECRET_VALID));
        assert_eq!(find(&conds, types::READY).unwrap().reason, "Pending");
    }

    #[test]
    fn bounded_cuts_on_a_character_boundary() {
        assert_eq!(bounded("abc", 3), "abc");
        assert_eq!(bounded("abcd", 3), "abc…");
        assert_eq!(bounded("ééé", 2), "éé…");
        assert_eq!(bounded("", 0), "");
    }
}
