//! What a Grant's credential may do, as RBAC rules: pure.
//!
//! Three sets, each bound only where it applies (#51):
//! - in the **boundary** namespace (the consumer's own: its heartbeat Lease lives there): the
//!   Leases, and a new token for its own ServiceAccount (kbind renews the credential in process);
//! - in each namespace **of** the boundary (labelled with it; where the consumer's copies live):
//!   exactly the Export's APIs (every verb kbind's syncer uses), its related Secrets/ConfigMaps
//!   (read where the provider is the source, written only where the consumer is) and the provider's
//!   Events (read);
//! - **cluster-wide**: creating namespaces of its own boundary (`<boundary>-…`, labelled with it:
//!   the issuer chart's admission policy refuses anything else), and reads: the provider's
//!   identity (the `kube-system` Namespace, or kcp's `LogicalCluster` `cluster`, by name)
//!   and the Export's CRDs (`get` by name; `list`/`watch` cannot be limited by name, so every CRD's
//!   schema is readable — schemas, not data).
//!
//! No wildcard anywhere; nothing written outside the boundary's namespaces but those namespaces.

use std::collections::BTreeSet;

use k8s_openapi::api::rbac::v1::PolicyRule;
use kbind_shared::api::catalog::ExportSpec;
use kbind_shared::api::{RelatedDirection, RelatedResourceKind};
use sha2::{Digest, Sha256};

/// Every verb kbind's syncer uses on a bound API's copies.
const SYNC_VERBS: [&str; 7] = [
    "get", "list", "watch", "create", "update", "patch", "delete",
];
const READ_VERBS: [&str; 3] = ["get", "list", "watch"];

/// The ServiceAccount in each boundary whose tokens are the consumer's credentials.
pub const SERVICE_ACCOUNT: &str = "kbind-consumer";

/// The boundary namespace of a consumer's Grant for an Export: the same for the same identity,
/// cluster name and Export on every re-grant, a valid DNS label of fixed length (so no boundary is
/// a prefix of another's namespaces), and saying nothing of the identity itself.
pub fn boundary(identity: &str, cluster_name: Option<&str>, export: &str) -> String {
    let mut hash = Sha256::new();
    for part in [identity, cluster_name.unwrap_or_default(), export] {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    let digest = hash.finalize();
    let hex: String = digest.iter().take(5).map(|b| format!("{b:02x}")).collect();
    format!("kbind-{hex}")
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str], names: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(groups.iter().map(|g| (*g).to_owned()).collect()),
        resources: Some(resources.iter().map(|r| (*r).to_owned()).collect()),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        resource_names: (!names.is_empty())
            .then(|| names.iter().map(|n| (*n).to_owned()).collect()),
        non_resource_urls: None,
    }
}

/// The rules in the boundary namespace itself: its heartbeat Leases (the namespace is this
/// consumer's alone), and new tokens for its own ServiceAccount only.
pub fn boundary_rules() -> Vec<PolicyRule> {
    vec![
        rule(
            &["coordination.k8s.io"],
            &["leases"],
            &["get", "create", "update", "patch"],
            &[],
        ),
        rule(
            &[""],
            &["serviceaccounts/token"],
            &["create"],
            &[SERVICE_ACCOUNT],
        ),
    ]
}

/// The rules in each namespace of the boundary, for an Export.
pub fn sync_rules(export: &ExportSpec) -> Vec<PolicyRule> {
    let mut rules = Vec::new();
    for api in &export.apis {
        let (plural, group) = api.name.split_once('.').unwrap_or((api.name.as_str(), ""));
        rules.push(rule(&[group], &[plural], &SYNC_VERBS, &[]));
    }
    let mut read = BTreeSet::new();
    let mut write = BTreeSet::new();
    for related in export
        .defaults
        .iter()
        .flat_map(|d| d.related_resources.iter())
    {
        let resource = match related.resource {
            RelatedResourceKind::Secrets => "secrets",
            RelatedResourceKind::Configmaps => "configmaps",
        };
        match related.direction {
            RelatedDirection::FromProvider => read.insert(resource),
            RelatedDirection::FromConsumer => write.insert(resource),
        };
    }
    let read: Vec<&str> = read.difference(&write).copied().collect();
    let write: Vec<&str> = write.into_iter().collect();
    if !read.is_empty() {
        rules.push(rule(&[""], &read, &READ_VERBS, &[]));
    }
    if !write.is_empty() {
        rules.push(rule(&[""], &write, &SYNC_VERBS, &[]));
    }
    rules.push(rule(&[""], &["events"], &["list", "watch"], &[]));
    rules
}

/// The cluster-wide reads a Connection needs for an Export.
pub fn cluster_rules(export: &ExportSpec) -> Vec<PolicyRule> {
    let names: Vec<&str> = export.apis.iter().map(|a| a.name.as_str()).collect();
    vec![
        rule(&[""], &["namespaces"], &["get"], &["kube-system"]),
        // kbind asks kcp's identity first (RBAC answers before the API server knows whether kcp
        // is there); a plain Kubernetes provider answers 404.
        rule(
            &["core.kcp.io"],
            &["logicalclusters"],
            &["get"],
            &["cluster"],
        ),
        // A namespace of its own boundary for each consumer namespace with copies: the issuer
        // chart's admission policy (`boundaries.yaml`) refuses any other name or label.
        rule(&[""], &["namespaces"], &["create"], &[]),
        rule(
            &["apiextensions.k8s.io"],
            &["customresourcedefinitions"],
            &["get"],
            &names,
        ),
        rule(
            &["apiextensions.k8s.io"],
            &["customresourcedefinitions"],
            &["list", "watch"],
            &[],
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use kbind_shared::api::catalog::ExportDefaults;
    use kbind_shared::api::{ApiRef, RelatedResource};

    fn export(related: &[(RelatedResourceKind, RelatedDirection)]) -> ExportSpec {
        ExportSpec {
            title: "W".into(),
            description: None,
            docs: None,
            apis: vec![ApiRef {
                name: "widgets.example.org".into(),
            }],
            defaults: Some(ExportDefaults {
                conflict_policy: None,
                related_resources: related
                    .iter()
                    .map(|(resource, direction)| RelatedResource {
                        group: String::new(),
                        resource: *resource,
                        direction: *direction,
                        selector: None,
                        namespaces: Vec::new(),
                    })
                    .collect(),
            }),
        }
    }

    #[test]
    fn a_boundary_is_stable_per_identity_cluster_and_export_and_a_dns_label() {
        let a = boundary("https://idp#alice", None, "widgets");
        assert_eq!(a, boundary("https://idp#alice", None, "widgets"));
        assert_ne!(a, boundary("https://idp#alice", Some("prod"), "widgets"));
        assert_ne!(a, boundary("https://idp#bob", None, "widgets"));
        assert_ne!(a, boundary("https://idp#alice", None, "gadgets"));
        // The parts are kept apart: "ab" + "c" is not "a" + "bc".
        assert_ne!(
            boundary("ab", Some("c"), "e"),
            boundary("a", Some("bc"), "e")
        );
        assert_eq!(a.len(), "kbind-".len() + 10);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        );
    }

    #[test]
    fn no_rule_has_a_wildcard_and_related_writes_only_from_the_consumer() {
        let spec = export(&[
            (RelatedResourceKind::Secrets, RelatedDirection::FromProvider),
            (
                RelatedResourceKind::Configmaps,
                RelatedDirection::FromConsumer,
            ),
        ]);
        let rules: Vec<PolicyRule> = boundary_rules()
            .into_iter()
            .chain(sync_rules(&spec))
            .chain(cluster_rules(&spec))
            .collect();
        for r in &rules {
            let all = r
                .api_groups
                .iter()
                .flatten()
                .chain(r.resources.iter().flatten())
                .chain(&r.verbs);
            assert!(all.clone().all(|v| v != "*"), "{r:?}");
        }
        let verbs = |resource: &str| -> Vec<String> {
            sync_rules(&spec)
                .into_iter()
                .filter(|r| r.resources.iter().flatten().any(|x| x == resource))
                .flat_map(|r| r.verbs)
                .collect()
        };
        assert_eq!(verbs("secrets"), ["get", "list", "watch"]);
        assert!(verbs("configmaps").contains(&"create".to_owned()));
        assert!(verbs("widgets").contains(&"delete".to_owned()));
        // A new token: for its own ServiceAccount only.
        let token = boundary_rules()
            .into_iter()
            .find(|r| {
                r.resources
                    .iter()
                    .flatten()
                    .any(|x| x == "serviceaccounts/token")
            })
            .expect("a token rule");
        assert_eq!(token.resource_names, Some(vec![SERVICE_ACCOUNT.to_owned()]));
        assert_eq!(token.verbs, ["create"]);
        // Cluster-wide: reads, and creating namespaces (the admission policy keeps those to the
        // boundary's own).
        for r in cluster_rules(&spec) {
            let namespaces = r.resources.as_deref() == Some(&["namespaces".to_owned()][..]);
            assert!(
                r.verbs
                    .iter()
                    .all(|v| READ_VERBS.contains(&v.as_str()) || (namespaces && v == "create")),
                "{r:?}"
            );
        }
    }
}
