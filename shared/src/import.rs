//! Observe-first import (#54), as both programs read it: where a consumer object stands towards
//! it. A mirror of a provider object nobody marked carries [`keys::IMPORTED_LABEL`] (naming the
//! importing Connection); the syncer writes it alone until the user claims it
//! ([`keys::CLAIM_ANNOTATION`]); the schema manager deletes the unclaimed ones when their binding
//! lets go of the API. Pure.
//!
//! The label counts only when kbind's own field manager set it ([`imported_by`]): a user's object
//! that merely carries it — the YAML of a mirror applied elsewhere — is never written over or
//! deleted as a mirror.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::keys;

/// The Connection that imported the object, when its [`keys::IMPORTED_LABEL`] was set by kbind
/// (its field manager owns the label in `managedFields`); `None` otherwise.
pub fn imported_by(meta: &ObjectMeta) -> Option<&str> {
    let value = meta.labels.as_ref()?.get(keys::IMPORTED_LABEL)?;
    let field = format!("f:{}", keys::IMPORTED_LABEL);
    let kbinds = meta.managed_fields.iter().flatten().any(|entry| {
        entry.manager.as_deref() == Some(keys::FIELD_MANAGER)
            && entry
                .fields_v1
                .as_ref()
                .is_some_and(|fields| fields.0["f:metadata"]["f:labels"].get(&field).is_some())
    });
    kbinds.then_some(value.as_str())
}

/// `meta`'s labels, without [`keys::IMPORTED_LABEL`] unless kbind set it ([`imported_by`]): what
/// a cache that keeps no `managedFields` holds (`None`: the labels as they are).
pub fn evidenced_labels(meta: &ObjectMeta) -> Option<BTreeMap<String, String>> {
    let labels = meta.labels.as_ref()?;
    if !labels.contains_key(keys::IMPORTED_LABEL) || imported_by(meta).is_some() {
        return None;
    }
    let mut labels = labels.clone();
    labels.remove(keys::IMPORTED_LABEL);
    Some(labels)
}

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
pub fn standing_of(meta: &ObjectMeta, connection: &str, finalizer: &str) -> Standing {
    standing(
        imported_by(meta),
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

    fn meta(manager: &str) -> ObjectMeta {
        serde_json::from_value(serde_json::json!({
            "name": "w",
            "labels": { keys::IMPORTED_LABEL: "p", "app": "x" },
            "managedFields": [{ "manager": manager, "operation": "Update", "fieldsType": "FieldsV1",
                "fieldsV1": { "f:metadata": { "f:labels": { ".": {}, "f:core.kbind.io/imported": {} } } } }],
        }))
        .unwrap()
    }

    #[test]
    fn only_a_label_kbind_set_makes_a_mirror() {
        let kbinds = meta(keys::FIELD_MANAGER);
        assert_eq!(imported_by(&kbinds), Some("p"));
        assert_eq!(evidenced_labels(&kbinds), None, "kept as it is");
        assert_eq!(standing_of(&kbinds, "p", "f"), Standing::Observed);
        // The YAML of a mirror applied by someone else: the label is theirs.
        let copied = meta("kubectl-client-side-apply");
        assert_eq!(imported_by(&copied), None);
        assert_eq!(
            evidenced_labels(&copied),
            Some([("app".to_owned(), "x".to_owned())].into())
        );
        assert_eq!(standing_of(&copied, "p", "f"), Standing::NotImported);
        let mut no_fields = kbinds.clone();
        no_fields.managed_fields = None;
        assert_eq!(imported_by(&no_fields), None);
        // No label: nothing to take away.
        let mut plain = kbinds;
        plain.labels = None;
        assert_eq!(evidenced_labels(&plain), None);
    }

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
