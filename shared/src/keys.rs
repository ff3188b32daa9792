//! Every label, annotation, finalizer, field manager and name kbind writes or reads
//! (REFERENCE-BEHAVIOUR §2, KEY-1 … KEY-15). The values are part of the observable contract:
//! objects written by the Go konnector are recognised as ours and vice versa.

/// API group of kbind's own kinds.
pub const GROUP: &str = "core.kbind.io";
/// API version of kbind's own kinds.
pub const VERSION: &str = "v1alpha1";

/// KEY-1: label on a provider CRD that opts it in for the CRD schema source. Only [`TRUE`] matches.
pub const EXPORTED_LABEL: &str = "core.kbind.io/exported";
/// KEY-2: label on everything kbind manages (consumer CRDs, provider copies, Leases, …).
pub const MANAGED_LABEL: &str = "core.kbind.io/managed";
/// KEY-3: annotation on a consumer CRD (and the heartbeat Lease) naming its Connection.
pub const CONNECTION_ANNOTATION: &str = "core.kbind.io/connection";
/// KEY-4: ownership marker, part 1: the consumer cluster's identity.
pub const CONSUMER_CLUSTER_UID_ANNOTATION: &str = "core.kbind.io/consumer-cluster-uid";
/// KEY-4 in label form, with the same key (as on the provider namespaces kbind creates): on every
/// provider copy beside the annotation, so that a syncer's provider watch selects exactly its own
/// consumer cluster's copies and never reads another consumer's (#50.5). The annotation stays the
/// marker ownership is decided by (the Go konnector and older kbind read and write only it).
pub const CONSUMER_CLUSTER_UID_LABEL: &str = CONSUMER_CLUSTER_UID_ANNOTATION;
/// KEY-5: ownership marker, part 2: the consumer object's UID.
pub const CONSUMER_OBJECT_UID_ANNOTATION: &str = "core.kbind.io/consumer-object-uid";
/// KEY-6: annotation on related Secret/ConfigMap copies: the UID of the binding that made them.
pub const RELATED_BINDING_ANNOTATION: &str = "core.kbind.io/related-binding";
/// KEY-7: annotation on a consumer instance recording a conflict, see [`CONFLICT_FOREIGN`] and
/// [`CONFLICT_OWNED_BY_ANOTHER`].
pub const CONFLICT_ANNOTATION: &str = "core.kbind.io/conflict";
/// KEY-8: annotation set by the user: keep the provider copy on delete or unbind.
pub const DELETION_POLICY_ANNOTATION: &str = "core.kbind.io/deletion-policy";
/// Annotation set by the user on a consumer instance: [`TRUE`] pauses it — kbind neither writes
/// its spec to the provider nor copies the provider's status back until it is removed (its
/// deletion still runs: a delete is the user's explicit action).
pub const PAUSED_ANNOTATION: &str = "core.kbind.io/paused";
/// The length of a schema hash as kbind writes it: `sha256:` and 64 hex digits.
pub const SCHEMA_HASH_LEN: usize = 71;
/// KEY-9: annotation on a consumer CRD: `sha256:<64 hex>` of the desired CRD spec (the reference
/// kept 16).
pub const SCHEMA_HASH_ANNOTATION: &str = "core.kbind.io/schema-hash";
/// KEY-10: finalizer on a consumer instance, held until its provider copy is gone.
pub const SYNCER_FINALIZER: &str = "core.kbind.io/syncer";
/// The route an instance is pinned to when several Connections serve its API (#36):
/// `<connection>/<provider cluster UID>` (a bare `<connection>` is read as that Connection's
/// pinned provider). kbind records it before the first write to a route; the user changes it to
/// move the object.
pub const ROUTE_ANNOTATION: &str = "core.kbind.io/route";
/// The prefix of the finalizer an instance holds while its copy lives on a route other than the
/// Connection serving its CRD (that one's copy is held by [`SYNCER_FINALIZER`]): the
/// finalizer's name part names the route's Connection.
pub const ROUTE_FINALIZER_PREFIX: &str = "core.kbind.io/route-";
/// KEY-11: finalizer on Connections, their Secrets and bindings, held until teardown has run.
pub const CLEANUP_FINALIZER: &str = "core.kbind.io/cleanup";
/// KEY-12 and KEY-14: SSA field manager for provider instance copies, and the Event source.
pub const FIELD_MANAGER: &str = "kbind-konnector";
/// KEY-13: SSA field manager for related Secret/ConfigMap copies.
pub const RELATED_FIELD_MANAGER: &str = "kbind-konnector-related";
/// KEY-14: the component named as the source of kbind's Events.
pub const EVENT_COMPONENT: &str = FIELD_MANAGER;
/// KEY-15: the reference's default leader-election Lease name. kbind's schema manager uses
/// `--leader-election-id` (default [`DEFAULT_LEADER_ELECTION_ID`]) instead.
pub const REFERENCE_LEADER_ELECTION_LEASE: &str = "konnector.kbind.io";

/// The only value of [`EXPORTED_LABEL`] and [`MANAGED_LABEL`] that counts.
pub const TRUE: &str = "true";
/// KEY-7 value: the provider object exists and carries no kbind ownership markers.
pub const CONFLICT_FOREIGN: &str = "ForeignObjectExists";
/// KEY-7 value: the provider object is marked as owned by another consumer object or cluster.
pub const CONFLICT_OWNED_BY_ANOTHER: &str = "OwnedByAnother";
/// KEY-8 value: the only recognised deletion policy.
pub const DELETION_POLICY_ORPHAN: &str = "Orphan";
/// Default data key of a Connection's kubeconfig Secret.
pub const DEFAULT_KUBECONFIG_KEY: &str = "kubeconfig";

// Keys kbind adds beyond the reference; all under the same `core.kbind.io/` prefix.

/// Annotation on a consumer CRD that kbind created (as opposed to one it only stamped), so that
/// cleanup never deletes a CRD it did not create (LIM-9).
pub const CREATED_BY_ANNOTATION: &str = "core.kbind.io/created-by";
/// Annotation a user puts on a consumer CRD that kbind did not create (or that another Connection
/// serves) to let the named Connection take it over: replace its schema and mark it. Without it
/// kbind never changes such a CRD.
pub const ADOPT_ANNOTATION: &str = "core.kbind.io/adopt";
/// Annotation kbind puts on a consumer CRD that another Connection serves while the Connection it
/// names (the `core.kbind.io/adopt` one) takes it over: no syncer works on the CRD meanwhile, the
/// old provider's copies are deleted, and only then is the CRD re-marked (no object ever reaches
/// two providers). Removed with the re-marking.
pub const HANDOVER_ANNOTATION: &str = "core.kbind.io/handover-to";
/// Annotation on a consumer CRD kbind created whose automatic binding went away (autoBind turned
/// off, an export missing past its grace, the Connection deleted): kbind kept the CRD and its
/// objects instead of deleting them; the value says why. Removed when the API is bound again.
pub const UNBOUND_ANNOTATION: &str = "core.kbind.io/unbound";
/// Label on a consumer object kbind imported from the provider (observe-first import, #54): its
/// value is the importing Connection. While it is not claimed ([`CLAIM_ANNOTATION`]) the object
/// is a read-only mirror of the provider's: kbind writes nothing to the provider for it.
pub const IMPORTED_LABEL: &str = "core.kbind.io/imported";
/// Annotation a user puts on an imported consumer object ([`IMPORTED_LABEL`]) to take it over:
/// [`TRUE`] — one provider write adds kbind's markers, and from then on it syncs as any object.
pub const CLAIM_ANNOTATION: &str = "core.kbind.io/claim";
/// Label on each syncer's membership Lease.
pub const SYNCER_MEMBER_LABEL: &str = "core.kbind.io/syncer-member";
/// Annotation on a related Secret/ConfigMap copy: the ids of the `relatedResources` entries
/// that select it (comma-separated, see `kbind_shared::related::entry_id`).
pub const RELATED_ENTRIES_ANNOTATION: &str = "core.kbind.io/related-entries";
/// Annotation on a provider object a related-resources entry took over under `conflictPolicy:
/// Adopt` (rather than created): kbind updates it but never deletes it.
pub const RELATED_ADOPTED_ANNOTATION: &str = "core.kbind.io/related-adopted";
/// SSA field manager of the syncer's related-resources condition on a binding's status.
pub const RELATED_STATUS_FIELD_MANAGER: &str = "kbind-syncer-related";
/// Annotation on the heartbeat Lease: how often kbind renews it, in whole seconds — so that a
/// reader on the provider can tell a late renewal from a consumer that is gone.
pub const HEARTBEAT_INTERVAL_ANNOTATION: &str = "core.kbind.io/heartbeat-interval-seconds";
/// Annotation on the heartbeat Lease: when (RFC 3339) its Connection was deleted in an orderly
/// way, after its bindings drained — the consumer left, it did not die. A renewal after that time
/// (the Connection created again) supersedes it.
pub const DISCONNECTED_ANNOTATION: &str = "core.kbind.io/disconnected";
/// Annotation on every provider object kbind writes (copies, related copies, the namespaces it
/// creates): the heartbeat Lease of the Connection that wrote it, `<namespace>/<name>` — so the
/// provider's reaper judges each copy by the liveness of the Connection that wrote it, never by
/// another Connection's (the `heartbeat` module names the Lease).
pub const HEARTBEAT_ANNOTATION: &str = "core.kbind.io/heartbeat";
/// Default Lease name of the schema manager's leader election.
pub const DEFAULT_LEADER_ELECTION_ID: &str = "kbind-schema-manager";
/// kbind's own namespace when neither `--namespace` nor `$POD_NAMESPACE` names one.
pub const DEFAULT_NAMESPACE: &str = "kbind";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_exactly_the_reference_contract() {
        // KEY-1 … KEY-15, spelled out so that a typo in a constant fails here.
        assert_eq!(EXPORTED_LABEL, "core.kbind.io/exported");
        assert_eq!(MANAGED_LABEL, "core.kbind.io/managed");
        assert_eq!(CONNECTION_ANNOTATION, "core.kbind.io/connection");
        assert_eq!(
            CONSUMER_CLUSTER_UID_ANNOTATION,
            "core.kbind.io/consumer-cluster-uid"
        );
        assert_eq!(
            CONSUMER_OBJECT_UID_ANNOTATION,
            "core.kbind.io/consumer-object-uid"
        );
        assert_eq!(RELATED_BINDING_ANNOTATION, "core.kbind.io/related-binding");
        assert_eq!(CONFLICT_ANNOTATION, "core.kbind.io/conflict");
        assert_eq!(DELETION_POLICY_ANNOTATION, "core.kbind.io/deletion-policy");
        assert_eq!(SCHEMA_HASH_ANNOTATION, "core.kbind.io/schema-hash");
        assert_eq!(SYNCER_FINALIZER, "core.kbind.io/syncer");
        assert_eq!(CLEANUP_FINALIZER, "core.kbind.io/cleanup");
        assert_eq!(FIELD_MANAGER, "kbind-konnector");
        assert_eq!(RELATED_FIELD_MANAGER, "kbind-konnector-related");
        assert_eq!(EVENT_COMPONENT, "kbind-konnector");
        assert_eq!(REFERENCE_LEADER_ELECTION_LEASE, "konnector.kbind.io");
        assert_eq!(CONFLICT_FOREIGN, "ForeignObjectExists");
        assert_eq!(CONFLICT_OWNED_BY_ANOTHER, "OwnedByAnother");
        assert_eq!(DELETION_POLICY_ORPHAN, "Orphan");
    }

    #[test]
    fn every_kbind_key_lives_under_the_kbind_prefix() {
        for key in [
            EXPORTED_LABEL,
            MANAGED_LABEL,
            CONNECTION_ANNOTATION,
            CONSUMER_CLUSTER_UID_ANNOTATION,
            CONSUMER_OBJECT_UID_ANNOTATION,
            RELATED_BINDING_ANNOTATION,
            CONFLICT_ANNOTATION,
            DELETION_POLICY_ANNOTATION,
            PAUSED_ANNOTATION,
            SCHEMA_HASH_ANNOTATION,
            SYNCER_FINALIZER,
            ROUTE_ANNOTATION,
            CLEANUP_FINALIZER,
            CREATED_BY_ANNOTATION,
            SYNCER_MEMBER_LABEL,
            RELATED_ENTRIES_ANNOTATION,
            HEARTBEAT_INTERVAL_ANNOTATION,
            DISCONNECTED_ANNOTATION,
            HEARTBEAT_ANNOTATION,
        ] {
            let (prefix, name) = key.split_once('/').expect("qualified key");
            assert_eq!(prefix, GROUP, "{key}");
            assert!(!name.is_empty() && name.len() <= 63, "{key}");
        }
    }
}
