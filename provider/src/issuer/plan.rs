//! What the issuer does for a Grant: pure decisions over what its caches hold.
//!
//! A Grant gets a **boundary**: a namespace of its own ([`super::rbac::boundary`]), created by the
//! issuer and claimed by the Grant (its name and UID written on the namespace). A namespace of
//! that name the issuer did not create is never adopted; one claimed by another live Grant is not
//! shared. In the boundary: the ServiceAccount whose tokens are the consumer's credentials, a
//! Role and RoleBinding for its Leases and tokens; in each namespace of the boundary a RoleBinding
//! to the Export's sync rules; cluster-wide a ClusterRole and ClusterRoleBinding for its reads.
//! Every object but the namespace is owned by the Grant (deleting the Grant collects them: its
//! tokens stop working), and a revoked Grant keeps everything but its bindings — its credential
//! then may do nothing, and nothing the consumer synced is touched.

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kbind_shared::api::catalog::{Export, ExportSpec};
use kbind_shared::api::iam::{Grant, GrantStatus};
use kbind_shared::conditions::{self, Desired};
use serde_json::{Value, json};

use super::rbac;

/// The label on every object the issuer writes for a Grant: the Grant's boundary. On a
/// namespace, it marks the boundary itself and the namespaces of it.
pub use kbind_shared::boundary::BOUNDARY_LABEL;
/// The annotation naming the Grant an object was written for (names can be longer than a label).
pub const GRANT_ANNOTATION: &str = "iam.kbind.io/grant";
/// The annotation on a boundary naming the UID of the Grant that claims it.
pub const GRANT_UID_ANNOTATION: &str = "iam.kbind.io/grant-uid";
/// The label saying the issuer created a namespace.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Its value.
pub const MANAGED_BY: &str = "kbind-issuer";

/// Condition types of a Grant.
pub mod types {
    /// Whether the credential is provisioned and may act.
    pub const ISSUED: &str = "Issued";
    /// Whether the Export the Grant names is offered now.
    pub const EXPORT_OFFERED: &str = "ExportOffered";
}

/// Reasons of a Grant's conditions.
pub mod reasons {
    /// Provisioned; the credential may act.
    pub const ISSUED: &str = "Issued";
    /// No Export of that name.
    pub const EXPORT_NOT_FOUND: &str = "ExportNotFound";
    /// The Export exists but is not offered.
    pub const EXPORT_NOT_OFFERED: &str = "ExportNotOffered";
    /// The Export is offered.
    pub const OFFERED: &str = "Offered";
    /// A namespace of the boundary's name exists and the issuer did not create it.
    pub const BOUNDARY_TAKEN: &str = "BoundaryTaken";
    /// Another Grant holds the boundary.
    pub const BOUNDARY_CLAIMED: &str = "BoundaryClaimed";
    /// An object the Grant needs (a ServiceAccount, role or binding of its name) exists and the
    /// issuer did not create it.
    pub const OBJECT_TAKEN: &str = "ObjectTaken";
    /// `spec.revoked`.
    pub const REVOKED: &str = "Revoked";
}

/// A Grant's boundary: its consumer's identity, cluster name and Export decide it.
pub fn boundary_of(grant: &Grant) -> String {
    let consumer = &grant.spec.consumer;
    rbac::boundary(
        &consumer.identity,
        consumer.cluster_name.as_deref(),
        &grant.spec.export,
    )
}

/// Where a Grant stands with its boundary namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// No namespace of that name: the issuer creates it.
    Create,
    /// The Grant's own.
    Held,
    /// Created by the issuer for a Grant that no longer exists (or an earlier Grant of this
    /// name): claimed again, in one write guarded by this resourceVersion.
    Reclaim(String),
    /// The namespace exists and the issuer did not create it: never adopted.
    Taken,
    /// Another live Grant holds it.
    ClaimedBy(String),
}

/// Where the Grant `name` (UID `uid`) stands with its boundary `ns` (as read), given the UID of
/// each live Grant by name (`uid_of`).
pub fn claim(
    name: &str,
    uid: &str,
    boundary: &str,
    ns: Option<&Namespace>,
    uid_of: impl Fn(&str) -> Option<String>,
) -> Claim {
    let Some(ns) = ns else {
        return Claim::Create;
    };
    let labels = ns.metadata.labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);
    if label(BOUNDARY_LABEL) != Some(boundary) || label(MANAGED_BY_LABEL) != Some(MANAGED_BY) {
        return Claim::Taken;
    }
    let annotation = |key: &str| {
        ns.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    };
    if annotation(GRANT_UID_ANNOTATION) == Some(uid) {
        return Claim::Held;
    }
    let holder = annotation(GRANT_ANNOTATION).unwrap_or_default();
    let holder_alive = holder != name
        && !holder.is_empty()
        && uid_of(holder)
            .is_some_and(|live| Some(live.as_str()) == annotation(GRANT_UID_ANNOTATION));
    if holder_alive {
        return Claim::ClaimedBy(holder.to_owned());
    }
    Claim::Reclaim(ns.metadata.resource_version.clone().unwrap_or_default())
}

/// The Export's spec when it is offered for the generation its status describes; else the
/// reason and message saying why not.
pub fn offered<'a>(
    name: &str,
    export: Option<&'a Export>,
) -> Result<&'a ExportSpec, (&'static str, String)> {
    let Some(export) = export else {
        return Err((reasons::EXPORT_NOT_FOUND, format!("no Export {name}")));
    };
    let status = export.status.as_ref();
    let current = status.and_then(|s| s.observed_generation) == export.metadata.generation;
    if current && crate::catalog::offer::offered(status) {
        return Ok(&export.spec);
    }
    let why = status
        .and_then(|s| conditions::find(&s.conditions, kbind_shared::api::catalog::OFFERED))
        .filter(|_| current)
        .map(|c| c.message.clone())
        .unwrap_or_else(|| "not looked at yet".into());
    Err((
        reasons::EXPORT_NOT_OFFERED,
        format!("Export {name} is not offered: {why}"),
    ))
}

/// What the issuer does for a Grant.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision<'a> {
    /// Nothing written but the Grant's status.
    Refuse {
        /// The `Issued` condition's reason.
        reason: &'static str,
        /// Its message.
        message: String,
    },
    /// Provision (or keep) the boundary and credential.
    Provision {
        /// How the boundary is held.
        claim: Claim,
        /// The Export's rules, when offered (`None`: the rules written before stay as they were).
        export: Option<&'a ExportSpec>,
    },
}

/// The decision for a Grant, its claim on the boundary and its Export's offer.
pub fn decide<'a>(
    claim: Claim,
    offer: &Result<&'a ExportSpec, (&'static str, String)>,
    boundary: &str,
) -> Decision<'a> {
    match (claim, offer) {
        (Claim::Taken, _) => Decision::Refuse {
            reason: reasons::BOUNDARY_TAKEN,
            message: format!(
                "namespace {boundary} exists and was not created by kbind-issuer: it is never adopted (delete or rename it, or grant under another identity)"
            ),
        },
        (Claim::ClaimedBy(other), _) => Decision::Refuse {
            reason: reasons::BOUNDARY_CLAIMED,
            message: format!(
                "boundary {boundary} is held by Grant {other} for the same consumer and Export; one Grant per consumer, cluster and Export"
            ),
        },
        (Claim::Held, Err(_)) => Decision::Provision {
            claim: Claim::Held,
            export: None,
        },
        (_, Err((reason, message))) => Decision::Refuse {
            reason,
            message: message.clone(),
        },
        (claim, Ok(spec)) => Decision::Provision {
            claim,
            export: Some(spec),
        },
    }
}

/// The kinds the issuer writes for a Grant (besides the boundary namespace).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `ServiceAccount`
    ServiceAccount,
    /// `Role`
    Role,
    /// `RoleBinding`
    RoleBinding,
    /// `ClusterRole`
    ClusterRole,
    /// `ClusterRoleBinding`
    ClusterRoleBinding,
}

/// One object the issuer writes, or removes.
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    /// Its kind.
    pub kind: Kind,
    /// Its namespace (`None`: cluster-scoped).
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// The whole body the issuer applies (empty for a removal).
    pub body: Value,
}

/// The name of a boundary's sync ClusterRole (bound in each namespace of the boundary).
pub fn sync_role(boundary: &str) -> String {
    format!("kbind-grant-{boundary}-sync")
}

/// The name of a boundary's cluster-wide ClusterRole and ClusterRoleBinding.
pub fn cluster_role(boundary: &str) -> String {
    format!("kbind-grant-{boundary}")
}

/// The objects a provisioned Grant `name` (UID `uid`) has in `boundary`, and the ones it must not
/// have: its bindings when revoked. `namespaces_of` are the namespaces of the boundary (each gets
/// the sync RoleBinding). With `export` `None` the ClusterRoles are left as they are.
pub fn objects(
    (name, uid): (&str, &str),
    boundary: &str,
    export: Option<&ExportSpec>,
    revoked: bool,
    namespaces_of: &[String],
) -> (Vec<Object>, Vec<Object>) {
    let meta = |namespace: Option<&str>, object: &str| {
        let mut meta = json!({
            "name": object,
            "labels": { BOUNDARY_LABEL: boundary, MANAGED_BY_LABEL: MANAGED_BY },
            "annotations": { GRANT_ANNOTATION: name },
            "ownerReferences": [{
                "apiVersion": "iam.kbind.io/v1alpha1",
                "kind": "Grant",
                "name": name,
                "uid": uid,
            }],
        });
        if let Some(namespace) = namespace {
            meta["namespace"] = json!(namespace);
        }
        meta
    };
    let object = |kind: Kind, namespace: Option<&str>, object: &str, rest: Value| {
        let (api_version, kind_name) = match kind {
            Kind::ServiceAccount => ("v1", "ServiceAccount"),
            Kind::Role => ("rbac.authorization.k8s.io/v1", "Role"),
            Kind::RoleBinding => ("rbac.authorization.k8s.io/v1", "RoleBinding"),
            Kind::ClusterRole => ("rbac.authorization.k8s.io/v1", "ClusterRole"),
            Kind::ClusterRoleBinding => ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
        };
        let mut body = json!({
            "apiVersion": api_version,
            "kind": kind_name,
            "metadata": meta(namespace, object),
        });
        if let (Some(body), Value::Object(rest)) = (body.as_object_mut(), rest) {
            body.extend(rest);
        }
        Object {
            kind,
            namespace: namespace.map(str::to_owned),
            name: object.to_owned(),
            body,
        }
    };
    let subject = json!([{
        "kind": "ServiceAccount",
        "name": rbac::SERVICE_ACCOUNT,
        "namespace": boundary,
    }]);
    let role_ref = |kind: &str, role: &str| json!({ "apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role });
    let mut wanted = vec![
        object(
            Kind::ServiceAccount,
            Some(boundary),
            rbac::SERVICE_ACCOUNT,
            json!({}),
        ),
        object(
            Kind::Role,
            Some(boundary),
            rbac::SERVICE_ACCOUNT,
            json!({ "rules": rbac::boundary_rules() }),
        ),
    ];
    if let Some(export) = export {
        wanted.push(object(
            Kind::ClusterRole,
            None,
            &sync_role(boundary),
            json!({ "rules": rbac::sync_rules(export) }),
        ));
        wanted.push(object(
            Kind::ClusterRole,
            None,
            &cluster_role(boundary),
            json!({ "rules": rbac::cluster_rules(export) }),
        ));
    }
    let mut bindings = vec![
        object(
            Kind::RoleBinding,
            Some(boundary),
            rbac::SERVICE_ACCOUNT,
            json!({ "roleRef": role_ref("Role", rbac::SERVICE_ACCOUNT), "subjects": subject }),
        ),
        object(
            Kind::ClusterRoleBinding,
            None,
            &cluster_role(boundary),
            json!({ "roleRef": role_ref("ClusterRole", &cluster_role(boundary)), "subjects": subject }),
        ),
    ];
    for namespace in namespaces_of {
        bindings.push(object(
            Kind::RoleBinding,
            Some(namespace),
            rbac::SERVICE_ACCOUNT,
            json!({ "roleRef": role_ref("ClusterRole", &sync_role(boundary)), "subjects": subject }),
        ));
    }
    if revoked {
        (wanted, bindings)
    } else {
        wanted.extend(bindings);
        (wanted, Vec::new())
    }
}

/// The namespaces of `boundary` among `labelled` (each namespace's name and its boundary label):
/// those labelled with it and named `<boundary>-…`, the boundary itself excluded.
pub fn namespaces_of<'a>(
    boundary: &str,
    labelled: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Vec<String> {
    let prefix = format!("{boundary}-");
    let mut out: Vec<String> = labelled
        .into_iter()
        .filter(|(name, label)| *label == boundary && name.starts_with(&prefix))
        .map(|(name, _)| name.to_owned())
        .collect();
    out.sort();
    out
}

/// Whether `cached` already holds everything `desired` says: every field of `desired` equal in
/// `cached` (objects compared key by key, lists element by element and of the same length), so a
/// field the API server adds (a UID, a default) is no difference.
pub fn holds(cached: &Value, desired: &Value) -> bool {
    match (cached, desired) {
        (Value::Object(have), Value::Object(want)) => want
            .iter()
            .all(|(k, w)| have.get(k).is_some_and(|h| holds(h, w)) || w.is_null()),
        (Value::Array(have), Value::Array(want)) => {
            have.len() == want.len() && have.iter().zip(want).all(|(h, w)| holds(h, w))
        }
        _ => cached == desired,
    }
}

/// The status of `grant` after `decision`.
pub fn status(
    grant: &Grant,
    boundary: &str,
    decision: &Decision<'_>,
    offer: &Result<&ExportSpec, (&'static str, String)>,
    now: &Time,
) -> GrantStatus {
    let generation = grant.metadata.generation;
    let previous = grant.status.clone().unwrap_or_default();
    let mut conditions = previous.conditions.clone();
    let issued = match decision {
        Decision::Refuse { reason, message } => {
            Desired::new(types::ISSUED, false, reason, message.clone())
        }
        Decision::Provision { .. } if grant.spec.revoked => Desired::new(
            types::ISSUED,
            false,
            reasons::REVOKED,
            "revoked: the credential's bindings are removed, so it may do nothing; nothing it synced is touched (set spec.revoked to false to restore it)",
        ),
        Decision::Provision { .. } => Desired::new(
            types::ISSUED,
            true,
            reasons::ISSUED,
            format!(
                "ServiceAccount {boundary}/{} may act for Export {}",
                rbac::SERVICE_ACCOUNT,
                grant.spec.export
            ),
        ),
    };
    conditions::set(&mut conditions, issued, generation, now);
    let offered = match offer {
        Ok(_) => Desired::new(types::EXPORT_OFFERED, true, reasons::OFFERED, ""),
        Err((reason, message)) => {
            let message = if matches!(decision, Decision::Provision { .. }) {
                format!(
                    "{message}; the credential keeps the rights it was issued (revoke the Grant to end them)"
                )
            } else {
                message.clone()
            };
            Desired::new(types::EXPORT_OFFERED, false, reason, message)
        }
    };
    conditions::set(&mut conditions, offered, generation, now);
    let provisioned = matches!(decision, Decision::Provision { .. });
    GrantStatus {
        observed_generation: generation,
        boundary: provisioned.then(|| boundary.to_owned()),
        service_account: provisioned.then(|| rbac::SERVICE_ACCOUNT.to_owned()),
        conditions,
    }
}

#[cfg(test)]
mod tests;
