//! Observe-first import (#54), as both programs read it: where a consumer object stands towards
//! it. A mirror of a provider object nobody marked carries [`keys::IMPORTED_LABEL`] (naming the
//! importing Connection); the syncer writes it alone until the user claims it
//! ([`keys::CLAIM_ANNOTATION`]); the schema manager deletes the unclaimed ones when their binding
//! lets go of the API. Pure.

use crate::keys;

/// Where a consumer object stands towards import.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Not imported (the user's own, or synced): import never touches it.
    NotImported,
    /// Imported by this Connection and not claimed: a read-only mirror of the provider's object,
    /// written by import alone. Nothing is written to the provider for it.
    Observed,
    /// Imported, then claimed by the user (its claim annotation, or kbind's finalizer once its
    /// sync began): it syncs as any object, and import leaves it alone.
    Claimed,
    /// Imported by another Connection and not claimed: that Connection's mirror, nobody else's
    /// to write.
    Elsewhere,
}

/// Where a consumer object stands: `imported_by` its import label's value, `claim` its claim
/// annotation's, `has_finalizer` whether it holds this worker's finalizer.
pub fn standing(
    imported_by: Option<&str>,
    claim: Option<&str>,
    has_finalizer: bool,
    connection: &str,
) -> Standing {
    match imported_by {
        None => Standing::NotImported,
        Some(_) if has_finalizer || claim == Some(keys::TRUE) => Standing::Claimed,
        Some(by) if by != connection => Standing::Elsewhere,
        Some(_) => Standing::Observed,
    }
}

/// Where `object` stands, for a worker of `connection` whose finalizer is `finalizer`.
pub fn standing_of(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    connection: &str,
    finalizer: &str,
) -> Standing {
    standing(
        meta.labels
            .as_ref()
            .and_then(|l| l.get(keys::IMPORTED_LABEL))
            .map(String::as_str),
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(keys::CLAIM_ANNOTATION))
            .map(String::as_str),
        crate::finalizers::has(meta, finalizer),
        connection,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_objects_standing_follows_its_label_claim_and_finalizer() {
        use Standing::*;
        let cases = [
            (None, None, false, NotImported),
            (None, Some("true"), true, NotImported),
            (Some("p"), None, false, Observed),
            (Some("p"), Some("false"), false, Observed),
            (Some("p"), Some("true"), false, Claimed),
            (Some("p"), None, true, Claimed),
            (Some("other"), None, false, Elsewhere),
            (Some("other"), Some("true"), false, Claimed),
        ];
        for (label, claim, finalizer, want) in cases {
            assert_eq!(
                standing(label, claim, finalizer, "p"),
                want,
                "{label:?} {claim:?} {finalizer}"
            );
        }
    }
}
