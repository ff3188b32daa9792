//! Whether the core CRDs installed on the consumer keep every field kbind writes (#53.6).
//!
//! An API server prunes what a CRD's schema does not declare. The Go konnector's core CRDs (left
//! installed after a takeover, or by a chart with CRD installation off) lack fields of kbind's
//! API — `Connection.status.verifiedCredential` first: kbind writes it, the API server drops it,
//! the syncer waits for it for ever, and every condition still said `Ready`. So the schema
//! manager compares each installed core CRD with the one kbind's types generate and names what it
//! would lose; a Connection is never `Ready` while that list is not empty. Pure.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray,
};

/// What one installed core CRD lacks of kbind's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lack {
    /// The CRD is not installed.
    Absent,
    /// It serves no version named like kbind's.
    Version(String),
    /// Fields kbind writes that its schema would prune (paths like `status.verifiedCredential`).
    Fields(Vec<String>),
}

/// What `installed` (`None`: absent) lacks of kbind's `expected` CRD; `None` when nothing.
pub fn lack(
    expected: &CustomResourceDefinition,
    installed: Option<&CustomResourceDefinition>,
) -> Option<Lack> {
    let Some(installed) = installed else {
        return Some(Lack::Absent);
    };
    let mut fields = Vec::new();
    for version in &expected.spec.versions {
        let Some(served) = installed
            .spec
            .versions
            .iter()
            .find(|v| v.name == version.name && v.served)
        else {
            return Some(Lack::Version(version.name.clone()));
        };
        let schema = |v: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinitionVersion| {
            v.schema.as_ref().and_then(|s| s.open_api_v3_schema.clone())
        };
        if let (Some(want), Some(have)) = (schema(version), schema(served)) {
            missing(&want, &have, "", &mut fields);
        }
    }
    fields.sort();
    fields.dedup();
    (!fields.is_empty()).then_some(Lack::Fields(fields))
}

/// The properties `want` declares (recursively) that `have` would prune, each as its path under
/// `prefix`. A level of `have` that keeps unknown fields keeps everything under it.
fn missing(want: &JSONSchemaProps, have: &JSONSchemaProps, prefix: &str, out: &mut Vec<String>) {
    if have.x_kubernetes_preserve_unknown_fields == Some(true) {
        return;
    }
    let empty = BTreeMap::new();
    let have_properties = have.properties.as_ref().unwrap_or(&empty);
    for (name, want_child) in want.properties.iter().flatten() {
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        match have_properties.get(name) {
            None => out.push(path),
            Some(have_child) => missing(want_child, have_child, &path, out),
        }
    }
    // A map's values (`additionalProperties`) and a list's items are checked like properties.
    if let (Some(want_items), Some(have_items)) = (item(want), item(have)) {
        missing(want_items, have_items, &format!("{prefix}[]"), out);
    }
}

fn item(schema: &JSONSchemaProps) -> Option<&JSONSchemaProps> {
    match schema.items.as_ref()? {
        JSONSchemaPropsOrArray::Schema(s) => Some(s),
        JSONSchemaPropsOrArray::Schemas(_) => None,
    }
}

/// One line naming what each installed core CRD lacks (`lacks`: CRD name → lack), and what to do;
/// `None` when nothing is lacking.
pub fn describe(lacks: &[(String, Lack)]) -> Option<String> {
    if lacks.is_empty() {
        return None;
    }
    let parts: Vec<String> = lacks
        .iter()
        .map(|(crd, lack)| match lack {
            Lack::Absent => format!("{crd} is not installed"),
            Lack::Version(v) => format!("{crd} does not serve {v}"),
            Lack::Fields(fields) => {
                let shown: Vec<&str> = fields.iter().take(5).map(String::as_str).collect();
                let more = fields.len().saturating_sub(shown.len());
                let more = if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                };
                format!(
                    "{crd} lacks {}{more} (the API server drops them)",
                    shown.join(", ")
                )
            }
        })
        .collect();
    Some(format!(
        "the core CRDs installed are not kbind's: {}; install kbind's (helm upgrade of the kbind chart with CRDs, or kubectl apply -f deploy/crds/) — nothing syncs until then",
        parts.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn crd(schema: serde_json::Value, version: &str) -> CustomResourceDefinition {
        serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": { "name": "connections.core.kbind.io" },
            "spec": { "group": "core.kbind.io", "scope": "Cluster",
                "names": { "kind": "Connection", "plural": "connections" },
                "versions": [{ "name": version, "served": true, "storage": true,
                    "schema": { "openAPIV3Schema": schema } }] }
        }))
        .unwrap()
    }

    fn kbinds() -> serde_json::Value {
        json!({ "type": "object", "properties": {
            "spec": { "type": "object", "properties": { "kubeconfigSecretRef": { "type": "object" } } },
            "status": { "type": "object", "properties": {
                "verifiedCredential": { "type": "string" },
                "conditions": { "type": "array", "items": { "type": "object", "properties": {
                    "type": { "type": "string" }, "observedGeneration": { "type": "integer" } } } },
                "exportedAPIs": { "type": "array", "items": { "type": "string" } },
            } },
        } })
    }

    #[test]
    fn names_every_field_the_installed_schema_would_prune() {
        let expected = crd(kbinds(), "v1alpha1");
        assert_eq!(lack(&expected, Some(&expected)), None);
        assert_eq!(lack(&expected, None), Some(Lack::Absent));
        // The Go konnector's shape: no verifiedCredential, conditions without observedGeneration.
        let go = crd(
            json!({ "type": "object", "properties": {
                "spec": { "type": "object", "properties": { "kubeconfigSecretRef": { "type": "object" } } },
                "status": { "type": "object", "properties": {
                    "conditions": { "type": "array", "items": { "type": "object", "properties": {
                        "type": { "type": "string" } } } },
                    "exportedAPIs": { "type": "array", "items": { "type": "string" } },
                } },
            } }),
            "v1alpha1",
        );
        assert_eq!(
            lack(&expected, Some(&go)),
            Some(Lack::Fields(vec![
                "status.conditions[].observedGeneration".into(),
                "status.verifiedCredential".into(),
            ]))
        );
        // A level that keeps unknown fields keeps everything under it.
        let open = crd(
            json!({ "type": "object", "properties": {
                "spec": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
                "status": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
            } }),
            "v1alpha1",
        );
        assert_eq!(lack(&expected, Some(&open)), None);
        // Another version only.
        assert_eq!(
            lack(&expected, Some(&crd(kbinds(), "v1beta1"))),
            Some(Lack::Version("v1alpha1".into()))
        );
    }

    #[test]
    fn the_message_names_the_crd_the_fields_and_the_remedy() {
        assert_eq!(describe(&[]), None);
        let message = describe(&[
            (
                "connections.core.kbind.io".into(),
                Lack::Fields(vec!["status.verifiedCredential".into()]),
            ),
            ("bindings.core.kbind.io".into(), Lack::Absent),
        ])
        .unwrap();
        assert!(
            message.contains("connections.core.kbind.io lacks status.verifiedCredential"),
            "{message}"
        );
        assert!(
            message.contains("bindings.core.kbind.io is not installed"),
            "{message}"
        );
        assert!(message.contains("deploy/crds"), "{message}");
        let many = describe(&[(
            "c".into(),
            Lack::Fields((0..7).map(|i| format!("status.f{i}")).collect()),
        )])
        .unwrap();
        assert!(many.contains("status.f4 and 2 more"), "{many}");
    }

    #[test]
    fn kbinds_own_crds_lack_nothing_of_themselves() {
        for (_, crd) in crate::api::crds() {
            assert_eq!(lack(&crd, Some(&crd)), None, "{:?}", crd.metadata.name);
        }
    }
}
