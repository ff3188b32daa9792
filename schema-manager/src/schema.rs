//! Schema installation with the CRD source (REFERENCE-BEHAVIOUR §9.1, SCH-1 … SCH-7): the
//! consumer CRD is derived from the provider CRD by pure functions; [`install`] applies the plan.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition, CustomResourceDefinitionVersion,
};
use kbind_shared::keys;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use sha2::{Digest, Sha256};

/// SCH-2 version selection: the first storage version, else the first served one.
pub fn select_version(
    versions: &[CustomResourceDefinitionVersion],
) -> Option<&CustomResourceDefinitionVersion> {
    versions
        .iter()
        .find(|v| v.storage)
        .or_else(|| versions.iter().find(|v| v.served))
}

/// SCH-3: `sha256:<first 16 hex>` of the desired spec's JSON.
pub fn schema_hash(crd: &CustomResourceDefinition) -> String {
    let json = serde_json::to_vec(&crd.spec).expect("a CRD spec serializes");
    let digest = Sha256::digest(&json);
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// SCH-2: the consumer CRD for a provider CRD, pinned to `connection`. One version (served and
/// storage), conversion `None`, and — unlike the reference (QRK-20) — none of the provider's
/// labels or annotations, only kbind's markers and the schema hash.
pub fn desired_crd(
    provider: &CustomResourceDefinition,
    connection: &str,
) -> Result<CustomResourceDefinition, String> {
    let name = provider.name_any();
    let mut version = select_version(&provider.spec.versions)
        .cloned()
        .ok_or_else(|| format!("provider CRD {name} has no served version"))?;
    version.served = true;
    version.storage = true;
    let mut spec = provider.spec.clone();
    spec.versions = vec![version];
    spec.conversion = Some(CustomResourceConversion {
        strategy: "None".into(),
        webhook: None,
    });
    Ok(with_markers(
        CustomResourceDefinition {
            metadata: ObjectMeta {
                name: Some(name),
                ..Default::default()
            },
            spec,
            status: None,
        },
        connection,
    ))
}

/// A consumer CRD with kbind's markers and the schema hash of its spec (SCH-2, SCH-3, SCH-8):
/// label `managed`, annotation `connection`, annotation `schema-hash`; nothing else in metadata
/// but the name.
pub fn with_markers(crd: CustomResourceDefinition, connection: &str) -> CustomResourceDefinition {
    let mut crd = CustomResourceDefinition {
        metadata: ObjectMeta {
            name: crd.metadata.name,
            labels: Some(BTreeMap::from([(
                keys::MANAGED_LABEL.to_owned(),
                keys::TRUE.to_owned(),
            )])),
            annotations: Some(BTreeMap::from([(
                keys::CONNECTION_ANNOTATION.to_owned(),
                connection.to_owned(),
            )])),
            ..Default::default()
        },
        spec: crd.spec,
        status: None,
    };
    let hash = schema_hash(&crd);
    crd.annotations_mut()
        .insert(keys::SCHEMA_HASH_ANNOTATION.to_owned(), hash);
    crd
}

/// Why a desired consumer CRD cannot be built now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// RBAC denied reading the provider's schema.
    Forbidden(String),
    /// Anything else; retried.
    Pending(String),
}

/// The desired consumer CRD of an exported API, from the active schema source: the pulled
/// provider CRD (§9.1) or a CRD synthesized from the provider's OpenAPI documents (§9.2, §10).
pub async fn desired_for(
    provider: &Client,
    connection: &str,
    source: Option<kbind_shared::api::ActiveSchemaSource>,
    export: &kbind_shared::api::ExportedApi,
) -> Result<CustomResourceDefinition, Problem> {
    if source == Some(kbind_shared::api::ActiveSchemaSource::OpenApi) {
        return match crate::openapi::synthesize_from_provider(provider, Some(&export.group)).await {
            Ok(crds) => crds
                .into_iter()
                .find(|c| c.metadata.name.as_deref() == Some(export.name.as_str()))
                .map(|crd| with_markers(crd, connection))
                .ok_or_else(|| {
                    Problem::Pending(
                        "the provider's OpenAPI documents have no usable schema for it".into(),
                    )
                }),
            Err(crate::openapi::FetchError::Forbidden(message)) => Err(Problem::Forbidden(message)),
            Err(crate::openapi::FetchError::Failed(message)) => Err(Problem::Pending(message)),
        };
    }
    let provider_crd = match Api::<CustomResourceDefinition>::all(provider.clone())
        .get(&export.name)
        .await
    {
        Ok(crd) => crd,
        Err(kube::Error::Api(s)) if s.is_forbidden() => {
            return Err(Problem::Forbidden(format!(
                "reading the provider CRD was denied by RBAC: {}",
                s.message
            )));
        }
        Err(e) => {
            return Err(Problem::Pending(format!(
                "cannot read the provider CRD: {}",
                kbind_shared::identity::describe_error(&e)
            )));
        }
    };
    desired_crd(&provider_crd, connection).map_err(Problem::Pending)
}

/// What [`install`] will do (SCH-4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Absent and not to be created (pullPolicy None).
    LeaveAbsent,
    /// Absent: create it, recording that kbind created it.
    Create,
    /// Present with another hash, updates allowed: replace its spec.
    Replace,
    /// Present, creation not allowed (pullPolicy None): only stamp kbind's markers if needed.
    Stamp,
    /// Nothing to do.
    Keep,
}

/// SCH-4 as a pure decision.
pub fn plan(
    existing: Option<&CustomResourceDefinition>,
    desired_hash: &str,
    connection: &str,
    create: bool,
    update: bool,
) -> Plan {
    let Some(existing) = existing else {
        return if create {
            Plan::Create
        } else {
            Plan::LeaveAbsent
        };
    };
    let annotation = |key: &str| existing.annotations().get(key).map(String::as_str);
    if !create {
        let marked = existing
            .labels()
            .get(keys::MANAGED_LABEL)
            .map(String::as_str)
            == Some(keys::TRUE)
            && annotation(keys::CONNECTION_ANNOTATION) == Some(connection);
        return if marked { Plan::Keep } else { Plan::Stamp };
    }
    if update && annotation(keys::SCHEMA_HASH_ANNOTATION) != Some(desired_hash) {
        Plan::Replace
    } else {
        Plan::Keep
    }
}

/// The consumer CRD after installation, if it exists.
#[derive(Debug)]
pub struct Installed {
    /// What was done.
    pub plan: Plan,
    /// Whether the installed CRD carries the desired hash (SchemaInSync).
    pub in_sync: bool,
}

/// Applies [`plan`] for `desired` on the consumer. API server rejections (a scope change, a
/// dropped stored version, SCH-7) come back as errors naming the CRD.
pub async fn install(
    consumer: &Client,
    desired: &CustomResourceDefinition,
    connection: &str,
    create: bool,
    update: bool,
) -> Result<Installed, String> {
    let api: Api<CustomResourceDefinition> = Api::all(consumer.clone());
    let name = desired.name_any();
    let hash = desired
        .annotations()
        .get(keys::SCHEMA_HASH_ANNOTATION)
        .cloned()
        .unwrap_or_default();
    let existing = api
        .get_opt(&name)
        .await
        .map_err(|e| format!("read consumer CRD {name}: {e}"))?;
    let plan = plan(existing.as_ref(), &hash, connection, create, update);
    let in_sync = |crd: &CustomResourceDefinition| {
        crd.annotations().get(keys::SCHEMA_HASH_ANNOTATION) == Some(&hash)
    };
    let reject = |e: kube::Error| {
        format!(
            "the consumer API server rejected CRD {name}: {}",
            kbind_shared::identity::describe_error(&e)
        )
    };
    match plan {
        Plan::LeaveAbsent => Ok(Installed {
            plan,
            in_sync: false,
        }),
        Plan::Keep => Ok(Installed {
            plan,
            in_sync: existing.as_ref().is_some_and(in_sync),
        }),
        Plan::Create => {
            let mut crd = desired.clone();
            crd.annotations_mut().insert(
                keys::CREATED_BY_ANNOTATION.to_owned(),
                connection.to_owned(),
            );
            api.create(&PostParams::default(), &crd)
                .await
                .map_err(reject)?;
            Ok(Installed {
                plan,
                in_sync: true,
            })
        }
        Plan::Replace => {
            let mut crd = existing.expect("Replace implies an existing CRD");
            crd.spec = desired.spec.clone();
            crd.labels_mut()
                .insert(keys::MANAGED_LABEL.to_owned(), keys::TRUE.to_owned());
            let annotations = crd.annotations_mut();
            annotations.insert(
                keys::CONNECTION_ANNOTATION.to_owned(),
                connection.to_owned(),
            );
            annotations.insert(keys::SCHEMA_HASH_ANNOTATION.to_owned(), hash.clone());
            api.replace(&name, &PostParams::default(), &crd)
                .await
                .map_err(reject)?;
            Ok(Installed {
                plan,
                in_sync: true,
            })
        }
        Plan::Stamp => {
            let patch = json!({ "metadata": {
                "labels": { keys::MANAGED_LABEL: keys::TRUE },
                "annotations": { keys::CONNECTION_ANNOTATION: connection },
            }});
            let stamped = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(reject)?;
            Ok(Installed {
                plan,
                in_sync: in_sync(&stamped),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceDefinitionSpec, WebhookConversion,
    };

    fn version(name: &str, served: bool, storage: bool) -> CustomResourceDefinitionVersion {
        CustomResourceDefinitionVersion {
            name: name.into(),
            served,
            storage,
            ..Default::default()
        }
    }

    fn provider_crd() -> CustomResourceDefinition {
        let mut crd = CustomResourceDefinition {
            spec: CustomResourceDefinitionSpec {
                group: "example.org".into(),
                scope: "Namespaced".into(),
                versions: vec![
                    version("v1alpha1", true, false),
                    version("v1", true, true),
                    version("v2", true, false),
                ],
                conversion: Some(CustomResourceConversion {
                    strategy: "Webhook".into(),
                    webhook: Some(WebhookConversion::default()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        crd.metadata.name = Some("widgets.example.org".into());
        crd.metadata.labels = Some(
            [
                ("core.kbind.io/exported".to_owned(), "true".to_owned()),
                ("team".to_owned(), "x".to_owned()),
            ]
            .into(),
        );
        crd.metadata.annotations = Some([("provider-only".to_owned(), "y".to_owned())].into());
        crd.metadata.resource_version = Some("42".into());
        crd.metadata.uid = Some("uid".into());
        crd
    }

    #[test]
    fn keeps_only_the_storage_version_and_forces_conversion_none() {
        // SCH-2
        let crd = desired_crd(&provider_crd(), "provider").unwrap();
        assert_eq!(crd.spec.versions.len(), 1);
        let v = &crd.spec.versions[0];
        assert_eq!((v.name.as_str(), v.served, v.storage), ("v1", true, true));
        let conversion = crd.spec.conversion.as_ref().unwrap();
        assert_eq!(
            (conversion.strategy.as_str(), conversion.webhook.is_none()),
            ("None", true)
        );
    }

    #[test]
    fn falls_back_to_the_first_served_version_and_rejects_none() {
        let mut p = provider_crd();
        p.spec.versions = vec![version("v1beta1", false, false), version("v1", true, false)];
        assert_eq!(desired_crd(&p, "c").unwrap().spec.versions[0].name, "v1");
        p.spec.versions = vec![version("v1", false, false)];
        assert!(
            desired_crd(&p, "c")
                .unwrap_err()
                .contains("no served version")
        );
    }

    #[test]
    fn copies_only_kbind_metadata() {
        // SCH-2 without QRK-20
        let crd = desired_crd(&provider_crd(), "provider").unwrap();
        assert_eq!(crd.labels().len(), 1);
        assert_eq!(crd.labels()["core.kbind.io/managed"], "true");
        assert_eq!(crd.annotations()["core.kbind.io/connection"], "provider");
        assert!(crd.annotations()["core.kbind.io/schema-hash"].starts_with("sha256:"));
        assert_eq!(
            crd.annotations()["core.kbind.io/schema-hash"].len(),
            "sha256:".len() + 16
        );
        assert!(crd.metadata.resource_version.is_none() && crd.metadata.uid.is_none());
    }

    #[test]
    fn hash_follows_the_spec_only() {
        let a = desired_crd(&provider_crd(), "one").unwrap();
        let b = desired_crd(&provider_crd(), "two").unwrap();
        assert_eq!(schema_hash(&a), schema_hash(&b));
        let mut changed = provider_crd();
        changed.spec.versions[1].deprecated = Some(true);
        assert_ne!(
            schema_hash(&desired_crd(&changed, "one").unwrap()),
            schema_hash(&a)
        );
    }

    #[test]
    fn install_plan_matrix() {
        // SCH-4
        let desired = desired_crd(&provider_crd(), "p").unwrap();
        let hash = desired.annotations()["core.kbind.io/schema-hash"].clone();
        assert_eq!(plan(None, &hash, "p", false, true), Plan::LeaveAbsent);
        assert_eq!(plan(None, &hash, "p", true, false), Plan::Create);
        assert_eq!(plan(Some(&desired), &hash, "p", true, true), Plan::Keep);
        assert_eq!(
            plan(Some(&desired), "sha256:other", "p", true, true),
            Plan::Replace
        );
        assert_eq!(
            plan(Some(&desired), "sha256:other", "p", true, false),
            Plan::Keep,
            "Once never updates"
        );
        assert_eq!(
            plan(Some(&desired), &hash, "p", false, true),
            Plan::Keep,
            "None keeps a marked CRD"
        );
        assert_eq!(
            plan(Some(&desired), &hash, "q", false, true),
            Plan::Stamp,
            "None stamps markers"
        );
        let mut unmarked = desired.clone();
        unmarked.metadata.labels = None;
        assert_eq!(plan(Some(&unmarked), &hash, "p", false, true), Plan::Stamp);
    }
}
