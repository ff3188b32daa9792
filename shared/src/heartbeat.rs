//! The heartbeat Lease on the provider, named in one place: where kbind's schema manager renews
//! it (HB-2, HB-3), the record of it the syncer puts on every provider object it writes
//! ([`keys::HEARTBEAT_ANNOTATION`]), and which Leases the provider's reaper accepts as speaking for
//! a consumer (kbind's form, or the Go konnector's older `consumer-<uid>`, VER-1).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use serde_json::{Value, json};

use crate::keys;

/// HB-3: `<connection>-<first 10 chars of the consumer UID>`.
pub fn lease_name(connection: &str, local_uid: &str) -> String {
    let prefix: String = local_uid.chars().take(10).collect();
    format!("{connection}-{prefix}")
}

/// HB-2: the provider kubeconfig context's namespace, else `kbind`.
pub fn lease_namespace(context_namespace: Option<&str>) -> &str {
    context_namespace.unwrap_or(keys::DEFAULT_NAMESPACE)
}

/// VER-1: the Go konnector's Lease name, `consumer-<uid>` (no connection part).
pub fn go_lease_name(local_uid: &str) -> String {
    format!("consumer-{local_uid}")
}

/// Where the Go konnector renews its Lease: always `kbind` (its reconciler's default; its binary
/// has no flag for it), whatever the kubeconfig context says.
pub const GO_LEASE_NAMESPACE: &str = keys::DEFAULT_NAMESPACE;

/// What kbind does with the Go konnector's heartbeat Lease after a takeover (#53.3), from what a
/// read of `kbind/consumer-<uid>` on the provider found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GoLease {
    /// It is this consumer's (its name and holder): kbind renews it beside its own, so that a
    /// reaper that knows only the Go name never reads this live consumer as dead.
    Renew,
    /// There is none: nothing to do, and kbind never creates one.
    Absent,
    /// A Lease under that name whose holder is not this consumer: not evidence of anything, and
    /// not kbind's to write.
    NotThisConsumers,
}

/// [`GoLease`] from the Lease found under [`go_lease_name`] (its holder), if any.
pub fn go_lease(found: Option<Option<&str>>, uid: &str) -> GoLease {
    match found {
        None => GoLease::Absent,
        Some(holder) if speaks_for(&go_lease_name(uid), holder, uid, None) => GoLease::Renew,
        Some(_) => GoLease::NotThisConsumers,
    }
}

/// The JSON patch that renews the Go konnector's Lease of the consumer `uid` at `renewed`: it
/// applies only while the holder is still that consumer (a `test` the API server checks), and
/// touches `renewTime` only — the Lease stays in the Go konnector's shape.
pub fn go_renewal(uid: &str, renewed: &MicroTime) -> Value {
    json!([
        { "op": "test", "path": "/spec/holderIdentity", "value": uid },
        { "op": "add", "path": "/spec/renewTime", "value": renewed },
    ])
}

/// The value of [`keys::HEARTBEAT_ANNOTATION`]: `<namespace>/<name>` of the Connection's Lease.
pub fn record(context_namespace: Option<&str>, connection: &str, local_uid: &str) -> String {
    format!(
        "{}/{}",
        lease_namespace(context_namespace),
        lease_name(connection, local_uid)
    )
}

/// Whether a Lease named `name` whose holder is `holder` may speak for the consumer `uid` of the
/// Connection `connection` (its annotation, if any): only under the name kbind derives from both
/// (or the Go konnector's `consumer-<uid>`), and only when the holder is that UID. Anyone may
/// create a Lease that claims a UID; a claim under another name, or with another holder, is not
/// evidence of anything.
pub fn speaks_for(name: &str, holder: Option<&str>, uid: &str, connection: Option<&str>) -> bool {
    if uid.is_empty() || holder != Some(uid) {
        return false;
    }
    let kbind_form = connection.is_some_and(|c| !c.is_empty() && name == lease_name(c, uid));
    kbind_form || name == go_lease_name(uid)
}

/// The server-side apply body of a heartbeat renewal (HB-3): the Lease of `connection` for the
/// consumer `local_uid`, held by it, renewed at `renewed`; `acquired` and `interval_secs` (the
/// renew interval, [`keys::HEARTBEAT_INTERVAL_ANNOTATION`]) when known.
pub fn lease_body(
    connection: &str,
    local_uid: &str,
    duration_secs: u64,
    interval_secs: Option<u64>,
    acquired: Option<&MicroTime>,
    renewed: &MicroTime,
) -> Value {
    let mut body = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": lease_name(connection, local_uid),
            "labels": { keys::MANAGED_LABEL: keys::TRUE },
            "annotations": {
                keys::CONSUMER_CLUSTER_UID_ANNOTATION: local_uid,
                keys::CONNECTION_ANNOTATION: connection,
            },
        },
        "spec": {
            "holderIdentity": local_uid,
            "leaseDurationSeconds": duration_secs.max(1),
            "renewTime": renewed,
        },
    });
    if let Some(interval) = interval_secs {
        body["metadata"]["annotations"][keys::HEARTBEAT_INTERVAL_ANNOTATION] =
            json!(interval.max(1).to_string());
    }
    if let Some(acquired) = acquired {
        body["spec"]["acquireTime"] = json!(acquired);
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_is_named_after_connection_and_consumer() {
        assert_eq!(
            lease_name("provider", "0123456789abcdef"),
            "provider-0123456789"
        );
        assert_eq!(lease_name("p", "short"), "p-short");
        assert_eq!(lease_namespace(Some("team-a")), "team-a");
        assert_eq!(lease_namespace(None), "kbind");
        assert_eq!(
            record(None, "provider", "0123456789abcdef"),
            "kbind/provider-0123456789"
        );
        assert_eq!(record(Some("t"), "p", "u"), "t/p-u");
    }

    #[test]
    fn a_renewal_names_the_lease_as_the_reaper_accepts_it() {
        let at = MicroTime(jiff::Timestamp::from_second(1_000).unwrap());
        let body = lease_body("provider", "0123456789abcdef", 60, Some(30), Some(&at), &at);
        let name = body["metadata"]["name"].as_str().unwrap();
        let holder = body["spec"]["holderIdentity"].as_str();
        assert!(speaks_for(
            name,
            holder,
            "0123456789abcdef",
            Some("provider")
        ));
        assert_eq!(
            body["metadata"]["annotations"][keys::HEARTBEAT_INTERVAL_ANNOTATION],
            "30"
        );
        assert_eq!(body["spec"]["leaseDurationSeconds"], 60);
        assert!(body["spec"].get("acquireTime").is_some());
        let bare = lease_body("p", "u", 0, None, None, &at);
        assert_eq!(bare["spec"]["leaseDurationSeconds"], 1);
        assert!(bare["spec"].get("acquireTime").is_none());
        assert!(
            bare["metadata"]["annotations"]
                .get(keys::HEARTBEAT_INTERVAL_ANNOTATION)
                .is_none()
        );
    }

    #[test]
    fn a_lease_speaks_for_a_consumer_only_under_its_derived_name_and_holder() {
        let uid = "0123456789abcdef";
        for (name, holder, connection, want) in [
            ("provider-0123456789", Some(uid), Some("provider"), true),
            ("consumer-0123456789abcdef", Some(uid), None, true),
            // The Go form also with kbind's annotations (a takeover renews it as it is).
            (
                "consumer-0123456789abcdef",
                Some(uid),
                Some("provider"),
                true,
            ),
            // Another name claiming the UID (a copied Lease under a name of one's own).
            ("provider-copy", Some(uid), Some("provider"), false),
            ("other-consumer-b", Some(uid), None, false),
            // kbind's form for another Connection than the annotation names.
            ("provider-0123456789", Some(uid), Some("other"), false),
            // The holder disagrees, or is missing.
            (
                "provider-0123456789",
                Some("someone-else"),
                Some("provider"),
                false,
            ),
            ("provider-0123456789", None, Some("provider"), false),
            // No connection annotation: only the Go form is possible.
            ("provider-0123456789", Some(uid), None, false),
        ] {
            assert_eq!(
                speaks_for(name, holder, uid, connection),
                want,
                "{name} {holder:?} {connection:?}"
            );
        }
        assert!(!speaks_for("consumer-", Some(""), "", None));
    }

    #[test]
    fn the_go_konnectors_lease_is_renewed_only_while_it_is_this_consumers() {
        let uid = "0123456789abcdef";
        assert_eq!(go_lease(Some(Some(uid)), uid), GoLease::Renew);
        assert_eq!(go_lease(None, uid), GoLease::Absent);
        assert_eq!(
            go_lease(Some(Some("another")), uid),
            GoLease::NotThisConsumers
        );
        assert_eq!(go_lease(Some(None), uid), GoLease::NotThisConsumers);
        assert_eq!(go_lease(Some(Some("")), ""), GoLease::NotThisConsumers);
        assert_eq!(GO_LEASE_NAMESPACE, "kbind");
        let at = MicroTime(jiff::Timestamp::from_second(1_000).unwrap());
        let renewal = go_renewal(uid, &at);
        assert_eq!(renewal[0]["op"], "test");
        assert_eq!(renewal[0]["value"], uid);
        assert_eq!(renewal[1]["path"], "/spec/renewTime");
        assert_eq!(
            renewal.as_array().unwrap().len(),
            2,
            "nothing but renewTime"
        );
    }
}
