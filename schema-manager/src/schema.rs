//! Schema installation with the CRD source (REFERENCE-BEHAVIOUR §9.1, SCH-1 … SCH-7): the
//! consumer CRD is derived from the provider CRD by pure functions; [`install`] applies the plan.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition, CustomResourceDefinitionSpec,
    CustomResourceDefinitionVersion,
};
use kbind_shared::api::OmittedVersion;
use kbind_shared::keys;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::openapi::fetch::{Documents, synthesize_from_provider};
use crate::providers::{Provider, ProviderError};

/// SCH-3, with the full digest: `sha256:<64 hex>` of the desired spec's JSON. The whole SHA-256,
/// because consent names it: a provider controlling both schemas could collide a shortened one
/// (#33.6).
pub fn schema_hash(crd: &CustomResourceDefinition) -> String {
    // The spec was deserialized, so it serializes (string-keyed maps only); a failure would
    // hash to the empty document and read as "changed", never panic.
    let json = serde_json::to_vec(&crd.spec).unwrap_or_default();
    let digest = Sha256::digest(&json);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// SCH-2, improved: the consumer CRD for a provider CRD, pinned to `connection`. Every served
/// version that converts losslessly with conversion `None` ([`serve_lossless`]), the provider's
/// storage version as storage, each version's `deprecated`/`deprecationWarning` and printer
/// columns kept; and — unlike the reference (QRK-20) — none of the provider's labels or
/// annotations, only kbind's markers and the schema hash. Also returns the versions left out.
pub fn desired_crd(
    provider: &CustomResourceDefinition,
    connection: &str,
) -> Result<(CustomResourceDefinition, Vec<OmittedVersion>), String> {
    let name = provider.name_any();
    let mut spec = provider.spec.clone();
    if kbind_shared::dynamic::storage_version(&spec.versions).is_none() {
        return Err(format!("provider CRD {name} has no served version"));
    }
    let omitted = serve_lossless(&mut spec);
    with_delivery(&mut spec);
    Ok((
        with_markers(
            CustomResourceDefinition {
                metadata: ObjectMeta {
                    name: Some(name),
                    ..Default::default()
                },
                spec,
                status: None,
            },
            connection,
        ),
        omitted,
    ))
}

/// Per-object delivery on a consumer CRD, in place: each version with a status subresource and a
/// `status` object in its schema gets kbind's `status.kbindSync` field and printer columns
/// ([`kbind_shared::delivery`]), unless the provider's schema already has a field of that name.
pub fn with_delivery(spec: &mut CustomResourceDefinitionSpec) {
    use kbind_shared::delivery;
    for version in &mut spec.versions {
        if version
            .subresources
            .as_ref()
            .is_none_or(|s| s.status.is_none())
        {
            continue;
        }
        let Some(mut schema) = version
            .schema
            .as_ref()
            .and_then(|s| serde_json::to_value(s).ok())
        else {
            continue;
        };
        let status = &mut schema["openAPIV3Schema"]["properties"]["status"];
        let is_object = status.is_object()
            && status
                .get("type")
                .is_none_or(|t| t == &serde_json::Value::from("object"));
        if !is_object || status["properties"].get(delivery::FIELD).is_some() {
            continue;
        }
        if !status["properties"].is_object() {
            status["properties"] = json!({});
        }
        status["properties"][delivery::FIELD] = delivery::status_schema();
        let Ok(with_field) = serde_json::from_value(schema) else {
            continue;
        };
        version.schema = Some(with_field);
        let columns = version
            .additional_printer_columns
            .get_or_insert_with(Vec::new);
        for column in delivery::printer_columns() {
            let name = column["name"].as_str().unwrap_or_default();
            if columns.iter().any(|c| c.name.eq_ignore_ascii_case(name)) {
                continue;
            }
            if let Ok(column) = serde_json::from_value(column) {
                columns.push(column);
            }
        }
    }
}

/// The versions a consumer CRD serves, in place: the storage version (the provider's, else its
/// first served one) and every other served version whose schema and subresources are identical
/// to it — what conversion `None` (only the apiVersion changes) converts without loss. Unserved
/// versions are dropped; served ones that differ are left out and returned with why.
pub fn serve_lossless(spec: &mut CustomResourceDefinitionSpec) -> Vec<OmittedVersion> {
    let Some(storage) = kbind_shared::dynamic::storage_version(&spec.versions).cloned() else {
        spec.versions.clear();
        return Vec::new();
    };
    let shape = |v: &CustomResourceDefinitionVersion| {
        let schema = v
            .schema
            .as_ref()
            .and_then(|s| serde_json::to_value(s).ok())
            .unwrap_or_default();
        let subresources = v
            .subresources
            .as_ref()
            .and_then(|s| serde_json::to_value(s).ok())
            .unwrap_or_default();
        (schema, subresources)
    };
    let (storage_schema, storage_subresources) = shape(&storage);
    let mut omitted = Vec::new();
    spec.versions.retain_mut(|v| {
        if v.name == storage.name {
            v.served = true;
            v.storage = true;
            return true;
        }
        if !v.served {
            return false;
        }
        let (schema, subresources) = shape(v);
        let lossless = crate::evolution::same_structure(&schema, &storage_schema)
            && subresources == storage_subresources;
        if !lossless {
            omitted.push(OmittedVersion {
                name: v.name.clone(),
                reason: format!(
                    "its schema differs from the storage version {}'s: conversion None would lose data",
                    storage.name
                ),
            });
        }
        v.storage = false;
        lossless
    });
    spec.conversion = Some(CustomResourceConversion {
        strategy: "None".into(),
        webhook: None,
    });
    omitted
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

/// The desired consumer CRD of an exported API, from the active schema source: the pulled
/// provider CRD (§9.1) or a CRD synthesized from the provider's OpenAPI documents (§9.2, §10),
/// serving its lossless versions; and the versions left out ([`serve_lossless`]).
pub async fn desired_for(
    provider: &Provider,
    documents: &Documents,
    connection: &str,
    source: Option<kbind_shared::api::ActiveSchemaSource>,
    export: &kbind_shared::api::ExportedApi,
) -> Result<(CustomResourceDefinition, Vec<OmittedVersion>), ProviderError> {
    if source == Some(kbind_shared::api::ActiveSchemaSource::OpenApi) {
        let synthesized = synthesize_from_provider(provider, documents, |group, resource, _| {
            group == export.group && resource == export.resource
        })
        .await?;
        if let Some((_, why)) = synthesized
            .failed
            .iter()
            .find(|(f, _)| f.name == export.name)
        {
            return Err(ProviderError::Failed(why.clone()));
        }
        return synthesized
            .crds
            .into_iter()
            .find(|c| c.metadata.name.as_deref() == Some(export.name.as_str()))
            .map(|mut crd| {
                let omitted = serve_lossless(&mut crd.spec);
                with_delivery(&mut crd.spec);
                (with_markers(crd, connection), omitted)
            })
            .ok_or_else(|| {
                ProviderError::Failed(
                    "the provider's OpenAPI documents have no usable schema for it".into(),
                )
            });
    }
    // At rest: what was derived from the version the provider still has.
    if let Some(derived) = provider.schemas.derived(&export.name) {
        return Ok(derived);
    }
    let provider_crd = Api::<CustomResourceDefinition>::all(provider.client.clone())
        .get(&export.name)
        .await
        .map_err(|e| ProviderError::from_kube("reading the provider CRD", e))?;
    let derived = desired_crd(&provider_crd, connection).map_err(ProviderError::Failed)?;
    provider.schemas.remember(
        &export.name,
        provider_crd.metadata.resource_version.as_deref(),
        &derived,
    );
    Ok(derived)
}

impl Plan {
    /// Whether carrying the plan out writes the CRD.
    pub fn writes(&self) -> bool {
        matches!(self, Plan::Create | Plan::Replace | Plan::Stamp)
    }
}

/// What [`install`] will do (SCH-4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Absent and not to be created (pullPolicy None).
    LeaveAbsent,
    /// Absent: create it, recording that kbind created it.
    Create,
    /// Present with another hash, updates allowed: replace its spec (and mark it).
    Replace,
    /// Present, and the schema is not to be changed: only stamp kbind's markers.
    Stamp,
    /// Nothing to do.
    Keep,
    /// Not kbind's to change: the message says whose it is and how to opt in.
    Refuse(String),
    /// Served by Connection `from`, and the user annotated it to be adopted by this Connection:
    /// `from`'s provider is drained before the CRD is re-marked (a binding of this Connection
    /// does it; nothing is written here).
    Handover {
        /// The Connection that serves the CRD now.
        from: String,
    },
    /// Present, ours, with another hash — but the change is breaking and not accepted: the
    /// served schema stays as it is (see [`gate`]).
    Hold {
        /// Each breaking change.
        changes: Vec<crate::evolution::Breaking>,
        /// How many more there were.
        more: usize,
    },
}

/// Schema evolution on top of [`plan`]: a [`Plan::Replace`] whose change is breaking
/// ([`crate::evolution::breaking_changes`]) becomes [`Plan::Hold`] unless `accepted` lists the
/// API with the desired schema hash. Compatible changes and every other plan pass unchanged.
pub fn gate(
    plan: Plan,
    existing: Option<&CustomResourceDefinition>,
    desired: &CustomResourceDefinition,
    accepted: &[kbind_shared::api::AcceptedChange],
) -> Plan {
    let (Plan::Replace, Some(existing)) = (&plan, existing) else {
        return plan;
    };
    let (changes, more) = crate::evolution::breaking_changes(&existing.spec, &desired.spec);
    if changes.is_empty() {
        return plan;
    }
    let name = desired.name_any();
    let hash = desired.annotations().get(keys::SCHEMA_HASH_ANNOTATION);
    if accepted
        .iter()
        .any(|a| a.api == name && Some(&a.schema_hash) == hash)
    {
        return plan;
    }
    Plan::Hold { changes, more }
}

/// API groups kbind never installs or changes a CRD in, whatever a provider exports: its own and
/// Kubernetes' (the core group, `*.k8s.io`, `*.kubernetes.io`).
pub fn reserved_group(group: &str) -> bool {
    let under = |domain: &str| group == domain || group.ends_with(&format!(".{domain}"));
    group.is_empty() || group == keys::GROUP || under("k8s.io") || under("kubernetes.io")
}

/// SCH-4 as a pure decision, safe by default: kbind replaces or stamps only a CRD it created for
/// this Connection or one already marked for it; anything else — a CRD another tool installed, one
/// another Connection serves — is refused until the user annotates it
/// `core.kbind.io/adopt=<connection>`. Reserved groups are refused outright.
pub fn plan(
    existing: Option<&CustomResourceDefinition>,
    desired: &CustomResourceDefinition,
    connection: &str,
    create: bool,
    update: bool,
) -> Plan {
    let name = desired.name_any();
    if reserved_group(&desired.spec.group) {
        let group = match desired.spec.group.as_str() {
            "" => "the core API group",
            group => group,
        };
        return Plan::Refuse(format!(
            "{group} is reserved for Kubernetes and kbind; kbind never installs or changes CRD {name}"
        ));
    }
    let Some(existing) = existing else {
        return if create {
            Plan::Create
        } else {
            Plan::LeaveAbsent
        };
    };
    let annotation = |key: &str| existing.annotations().get(key).map(String::as_str);
    let marked_for = (existing
        .labels()
        .get(keys::MANAGED_LABEL)
        .map(String::as_str)
        == Some(keys::TRUE))
    .then(|| annotation(keys::CONNECTION_ANNOTATION))
    .flatten();
    let ours = match marked_for {
        Some(marked) => marked == connection,
        None => annotation(keys::CREATED_BY_ANNOTATION) == Some(connection),
    };
    if !ours && annotation(keys::ADOPT_ANNOTATION) != Some(connection) {
        let owner = match marked_for {
            Some(other) => format!("serves Connection {other}"),
            None => "was not created by kbind".to_owned(),
        };
        return Plan::Refuse(format!(
            "the consumer CRD {name} {owner}, so kbind leaves it alone; to let Connection {connection} take it over, annotate it {}={connection}",
            keys::ADOPT_ANNOTATION
        ));
    }
    // Another Connection serves it and the user opted in: its provider is drained first.
    if let Some(other) = marked_for.filter(|m| *m != connection) {
        return Plan::Handover {
            from: other.to_owned(),
        };
    }
    let hash = desired
        .annotations()
        .get(keys::SCHEMA_HASH_ANNOTATION)
        .map(String::as_str);
    let marked = marked_for == Some(connection) && annotation(keys::UNBOUND_ANNOTATION).is_none();
    if create && update && annotation(keys::SCHEMA_HASH_ANNOTATION) != hash {
        Plan::Replace
    } else if marked {
        Plan::Keep
    } else {
        Plan::Stamp
    }
}

/// #36: when `existing` serves another Connection than `connection` (and is not being adopted by
/// it), what a binding of `connection` listing the API gets: a route for the objects it selects
/// (`selects`: it has an object selector), with its provider's schema (`desired`) classified
/// against the served one, or a refusal ([`kbind_shared::routing::admit`]). `None`: the schema
/// plan decides as always (not marked, ours, or being adopted). The CRD is never touched here.
pub fn route_plan(
    existing: &CustomResourceDefinition,
    desired: &CustomResourceDefinition,
    connection: &str,
    selects: bool,
) -> Option<(String, kbind_shared::routing::Admission)> {
    let annotation = |key: &str| existing.annotations().get(key).map(String::as_str);
    let managed = existing
        .labels()
        .get(keys::MANAGED_LABEL)
        .map(String::as_str)
        == Some(keys::TRUE);
    let served_by = annotation(keys::CONNECTION_ANNOTATION).filter(|_| managed)?;
    if served_by == connection || annotation(keys::ADOPT_ANNOTATION) == Some(connection) {
        return None;
    }
    let agreement = crate::evolution::route_agreement(&existing.spec, &desired.spec);
    let admission = kbind_shared::routing::admit(
        &existing.name_any(),
        connection,
        selects,
        Some(served_by),
        agreement,
    );
    Some((served_by.to_owned(), admission))
}

/// The consumer CRD after installation, if it exists.
#[derive(Debug)]
pub struct Installed {
    /// What was done.
    pub plan: Plan,
    /// Whether the installed CRD carries the desired hash (SchemaInSync).
    pub in_sync: bool,
    /// Whether the API server serves it yet (`Established`): a binding is Ready only then.
    pub established: bool,
}

/// The [`install`] settings from a Connection's schema policy.
#[derive(Debug, Clone, Copy)]
pub struct Policy<'a> {
    /// Absent CRDs are created (pullPolicy not None).
    pub create: bool,
    /// Present CRDs follow the provider (updatePolicy Always).
    pub update: bool,
    /// Breaking changes the user accepted.
    pub accepted: &'a [kbind_shared::api::AcceptedChange],
}

/// Whether the API server serves a CRD's resource (its `Established` condition is True).
pub fn established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
}

/// Applies [`plan`] and [`gate`] for `desired` on the consumer. API server rejections (a scope
/// change, a dropped stored version, SCH-7) come back as errors naming the CRD.
pub async fn install(
    consumer: &Client,
    desired: &CustomResourceDefinition,
    connection: &str,
    policy: Policy<'_>,
    cached: Option<&CustomResourceDefinition>,
) -> Result<Installed, String> {
    let Policy {
        create,
        update,
        accepted,
    } = policy;
    let api: Api<CustomResourceDefinition> = Api::all(consumer.clone());
    let name = desired.name_any();
    let hash = desired
        .annotations()
        .get(keys::SCHEMA_HASH_ANNOTATION)
        .cloned()
        .unwrap_or_default();
    let in_sync = |crd: &CustomResourceDefinition| {
        crd.annotations().get(keys::SCHEMA_HASH_ANNOTATION) == Some(&hash)
    };
    // At rest a watch's copy answers: a plan made from it that writes nothing is the plan. Any
    // write is planned again from a fresh read.
    if let Some(existing) = cached {
        let plan = gate(
            plan(Some(existing), desired, connection, create, update),
            Some(existing),
            desired,
            accepted,
        );
        if !plan.writes() {
            return Ok(Installed {
                in_sync: in_sync(existing),
                established: established(existing),
                plan,
            });
        }
    }
    let existing = api.get_opt(&name).await.map_err(|e| {
        format!(
            "read consumer CRD {name}: {}",
            kbind_shared::identity::describe_error(&e)
        )
    })?;
    let plan = gate(
        plan(existing.as_ref(), desired, connection, create, update),
        existing.as_ref(),
        desired,
        accepted,
    );
    let reject = |e: kube::Error| {
        format!(
            "the consumer API server rejected CRD {name}: {}",
            kbind_shared::identity::describe_error(&e)
        )
    };
    match plan {
        Plan::Refuse(_) | Plan::LeaveAbsent | Plan::Handover { .. } => Ok(Installed {
            plan,
            in_sync: false,
            established: false,
        }),
        Plan::Keep | Plan::Hold { .. } => Ok(Installed {
            plan,
            in_sync: existing.as_ref().is_some_and(in_sync),
            established: existing.as_ref().is_some_and(established),
        }),
        Plan::Create => {
            let mut crd = desired.clone();
            crd.annotations_mut().insert(
                keys::CREATED_BY_ANNOTATION.to_owned(),
                connection.to_owned(),
            );
            let created = api
                .create(&PostParams::default(), &crd)
                .await
                .map_err(reject)?;
            Ok(Installed {
                plan,
                in_sync: true,
                established: established(&created),
            })
        }
        Plan::Replace => {
            let Some(mut crd) = existing else {
                return Err(format!(
                    "consumer CRD {name} vanished while it was being replaced"
                ));
            };
            crd.spec = desired.spec.clone();
            crd.labels_mut()
                .insert(keys::MANAGED_LABEL.to_owned(), keys::TRUE.to_owned());
            let annotations = crd.annotations_mut();
            annotations.insert(
                keys::CONNECTION_ANNOTATION.to_owned(),
                connection.to_owned(),
            );
            annotations.insert(keys::SCHEMA_HASH_ANNOTATION.to_owned(), hash.clone());
            annotations.remove(keys::UNBOUND_ANNOTATION);
            let replaced = api
                .replace(&name, &PostParams::default(), &crd)
                .await
                .map_err(reject)?;
            Ok(Installed {
                plan,
                in_sync: true,
                established: established(&replaced),
            })
        }
        Plan::Stamp => {
            let patch = json!({ "metadata": {
                "labels": { keys::MANAGED_LABEL: keys::TRUE },
                "annotations": {
                    keys::CONNECTION_ANNOTATION: connection,
                    keys::UNBOUND_ANNOTATION: null,
                },
            }});
            let stamped = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(reject)?;
            Ok(Installed {
                plan,
                in_sync: in_sync(&stamped),
                established: established(&stamped),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_create_replace_and_stamp_write_so_only_they_need_a_fresh_read() {
        use super::Plan;
        let cases = [
            (Plan::LeaveAbsent, false),
            (Plan::Create, true),
            (Plan::Replace, true),
            (Plan::Stamp, true),
            (Plan::Keep, false),
            (Plan::Refuse("another Connection's".into()), false),
            (
                Plan::Hold {
                    changes: Vec::new(),
                    more: 0,
                },
                false,
            ),
        ];
        for (plan, writes) in cases {
            assert_eq!(plan.writes(), writes, "{plan:?}");
        }
    }

    use super::*;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceDefinitionSpec, WebhookConversion,
    };

    use kbind_shared::dynamic::bare_version as version;

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
    fn breaking_changes_are_held_until_their_hash_is_accepted() {
        use kbind_shared::api::AcceptedChange;
        let with_spec = |spec: serde_json::Value| {
            let mut provider = provider_crd();
            provider.spec.versions = vec![version("v1", true, true)];
            provider.spec.versions[0].schema = serde_json::from_value(json!({ "openAPIV3Schema": {
                "type": "object", "properties": { "spec": spec } } }))
            .unwrap();
            desired_crd(&provider, "p").unwrap().0
        };
        let served =
            with_spec(json!({ "type": "object", "properties": { "size": { "type": "integer" } } }));
        let compatible = with_spec(json!({ "type": "object", "properties": {
            "size": { "type": "integer" }, "shape": { "type": "string" } } }));
        let breaking =
            with_spec(json!({ "type": "object", "properties": { "size": { "type": "string" } } }));
        let hash = |crd: &CustomResourceDefinition| {
            crd.annotations()[keys::SCHEMA_HASH_ANNOTATION].clone()
        };
        let accept = |api: &str, hash: String| AcceptedChange {
            api: api.into(),
            schema_hash: hash,
        };
        let held = |plan: &Plan| matches!(plan, Plan::Hold { changes, .. } if changes[0].to_string() == "spec.size: type integer → string");

        // (plan, desired, accepted) → held?
        let cases: Vec<(
            &str,
            Plan,
            &CustomResourceDefinition,
            Vec<AcceptedChange>,
            bool,
        )> = vec![
            (
                "compatible: replaced",
                Plan::Replace,
                &compatible,
                vec![],
                false,
            ),
            (
                "breaking, nothing accepted: held",
                Plan::Replace,
                &breaking,
                vec![],
                true,
            ),
            (
                "breaking, its hash accepted: replaced",
                Plan::Replace,
                &breaking,
                vec![accept("widgets.example.org", hash(&breaking))],
                false,
            ),
            (
                "breaking, another hash accepted: held",
                Plan::Replace,
                &breaking,
                vec![accept("widgets.example.org", hash(&compatible))],
                true,
            ),
            (
                "breaking, the hash accepted for another API: held",
                Plan::Replace,
                &breaking,
                vec![accept("gadgets.example.org", hash(&breaking))],
                true,
            ),
        ];
        for (name, plan, desired, accepted, expect_held) in cases {
            let out = gate(plan, Some(&served), desired, &accepted);
            assert_eq!(held(&out), expect_held, "{name}: {out:?}");
            if !expect_held {
                assert_eq!(out, Plan::Replace, "{name}");
            }
        }
        // Other plans pass unchanged: nothing to compare, or nothing to replace.
        for plan in [
            Plan::Create,
            Plan::Keep,
            Plan::Stamp,
            Plan::LeaveAbsent,
            Plan::Refuse("x".into()),
        ] {
            assert_eq!(gate(plan.clone(), Some(&served), &breaking, &[]), plan);
        }
        assert_eq!(gate(Plan::Replace, None, &breaking, &[]), Plan::Replace);
    }

    #[test]
    fn serves_every_lossless_version_with_the_providers_storage_and_conversion_none() {
        // Identical schemas (here: none at all): every served version, v1 stored.
        let (crd, omitted) = desired_crd(&provider_crd(), "provider").unwrap();
        let versions = kbind_shared::dynamic::version_flags(&crd.spec.versions);
        assert_eq!(
            versions,
            [
                ("v1alpha1", true, false),
                ("v1", true, true),
                ("v2", true, false)
            ]
        );
        assert!(omitted.is_empty());
        let conversion = crd.spec.conversion.as_ref().unwrap();
        assert_eq!(
            (conversion.strategy.as_str(), conversion.webhook.is_none()),
            ("None", true)
        );
    }

    #[test]
    fn installed_crds_carry_the_delivery_record_and_its_columns() {
        let with = |status: serde_json::Value, subresource: bool| {
            let mut p = provider_crd();
            p.spec.versions = vec![version("v1", true, true)];
            p.spec.versions[0].schema = serde_json::from_value(json!({ "openAPIV3Schema": {
                "type": "object", "properties": { "spec": { "type": "object" }, "status": status } } }))
            .unwrap();
            if subresource {
                p.spec.versions[0].subresources =
                    Some(serde_json::from_value(json!({ "status": {} })).unwrap());
            }
            p.spec.versions[0].additional_printer_columns = Some(vec![
                serde_json::from_value(
                    json!({ "name": "Phase", "type": "string", "jsonPath": ".status.phase" }),
                )
                .unwrap(),
            ]);
            desired_crd(&p, "c").unwrap().0
        };
        let status_of = |crd: &CustomResourceDefinition| {
            serde_json::to_value(&crd.spec.versions[0].schema).unwrap()["openAPIV3Schema"]
                ["properties"]["status"]
                .clone()
        };
        let columns = |crd: &CustomResourceDefinition| -> Vec<String> {
            crd.spec.versions[0]
                .additional_printer_columns
                .iter()
                .flatten()
                .map(|c| c.name.clone())
                .collect()
        };
        // A free-form status gets the declared record; the provider's columns come first.
        let crd = with(
            json!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true }),
            true,
        );
        assert_eq!(
            status_of(&crd)["properties"]["kbindSync"]["properties"]["generation"]["type"],
            "integer"
        );
        assert_eq!(
            columns(&crd),
            [
                "Phase",
                "Generation",
                "Synced-Generation",
                "Delivery",
                "Delivered",
                "Route",
                "Message",
                "Waiting-Since",
                "Age"
            ]
        );
        // A structured status keeps its fields.
        let crd = with(
            json!({ "type": "object", "properties": { "phase": { "type": "string" } } }),
            true,
        );
        assert!(status_of(&crd)["properties"]["phase"].is_object());
        assert!(status_of(&crd)["properties"]["kbindSync"].is_object());
        // No status subresource (no status write), or a provider field of that name: untouched.
        let crd = with(json!({ "type": "object" }), false);
        assert!(status_of(&crd)["properties"].get("kbindSync").is_none());
        assert_eq!(columns(&crd), ["Phase"]);
        let crd = with(
            json!({ "type": "object", "properties": { "kbindSync": { "type": "string" } } }),
            true,
        );
        assert_eq!(
            status_of(&crd)["properties"]["kbindSync"],
            json!({ "type": "string" })
        );
        assert_eq!(columns(&crd), ["Phase"]);
        // Adding the record to an installed CRD is never a breaking change.
        let before = with(
            json!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true }),
            false,
        );
        let mut after = before.clone();
        after.spec.versions[0].subresources =
            Some(serde_json::from_value(json!({ "status": {} })).unwrap());
        with_delivery(&mut after.spec);
        after.spec.versions[0].subresources = None;
        assert!(
            crate::evolution::breaking_changes(&before.spec, &after.spec)
                .0
                .is_empty()
        );
    }

    #[test]
    fn versions_that_differ_from_the_storage_version_are_left_out_and_said() {
        let schema = |spec: serde_json::Value| {
            serde_json::from_value(
                json!({ "openAPIV3Schema": { "type": "object", "properties": { "spec": spec } } }),
            )
            .unwrap()
        };
        let same = json!({ "type": "object", "properties": { "size": { "type": "integer" } } });
        let mut p = provider_crd();
        p.spec.versions = vec![
            version("v1beta1", true, false),
            version("v1", true, true),
            version("v1alpha1", false, false),
            version("v2", true, false),
        ];
        p.spec.versions[0].schema = Some(schema(
            json!({ "type": "object", "properties": { "size": { "type": "string" } } }),
        ));
        p.spec.versions[1].schema = Some(schema(same.clone()));
        p.spec.versions[3].schema = Some(schema(same.clone()));
        // A deprecated version keeps its warning; a description-only difference is lossless.
        p.spec.versions[3].deprecated = Some(true);
        p.spec.versions[3].deprecation_warning = Some("use v1".into());
        p.spec.versions[3].schema = Some(schema(
            json!({ "type": "object", "description": "v2 says more",
            "properties": { "size": { "type": "integer", "description": "how big" } } }),
        ));
        let (crd, omitted) = desired_crd(&p, "c").unwrap();
        let names: Vec<&str> = crd.spec.versions.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(
            names,
            ["v1", "v2"],
            "unserved and lossy versions are not served"
        );
        assert_eq!(
            crd.spec.versions[1].deprecation_warning.as_deref(),
            Some("use v1")
        );
        assert_eq!(crd.spec.versions[1].deprecated, Some(true));
        assert_eq!(omitted.len(), 1);
        assert_eq!(omitted[0].name, "v1beta1");
        assert!(omitted[0].reason.contains("storage version v1"));
        // Subresources count too: a version without the status subresource is not lossless.
        let mut q = provider_crd();
        q.spec.versions = vec![version("v1", true, true), version("v2", true, false)];
        q.spec.versions[0].subresources =
            Some(serde_json::from_value(json!({ "status": {} })).unwrap());
        let (crd, omitted) = desired_crd(&q, "c").unwrap();
        assert_eq!(crd.spec.versions.len(), 1);
        assert_eq!(omitted[0].name, "v2");
    }

    #[test]
    fn falls_back_to_the_first_served_version_and_rejects_none() {
        let mut p = provider_crd();
        p.spec.versions = vec![version("v1beta1", false, false), version("v1", true, false)];
        assert_eq!(desired_crd(&p, "c").unwrap().0.spec.versions[0].name, "v1");
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
        let crd = desired_crd(&provider_crd(), "provider").unwrap().0;
        assert_eq!(crd.labels().len(), 1);
        assert_eq!(crd.labels()["core.kbind.io/managed"], "true");
        assert_eq!(crd.annotations()["core.kbind.io/connection"], "provider");
        assert!(crd.annotations()["core.kbind.io/schema-hash"].starts_with("sha256:"));
        assert_eq!(
            crd.annotations()["core.kbind.io/schema-hash"].len(),
            "sha256:".len() + 64,
            "the full digest (#33.6)"
        );
        assert!(crd.metadata.resource_version.is_none() && crd.metadata.uid.is_none());
    }

    #[test]
    fn hash_follows_the_spec_only() {
        let a = desired_crd(&provider_crd(), "one").unwrap().0;
        let b = desired_crd(&provider_crd(), "two").unwrap().0;
        assert_eq!(schema_hash(&a), schema_hash(&b));
        let mut changed = provider_crd();
        changed.spec.versions[1].deprecated = Some(true);
        assert_ne!(
            schema_hash(&desired_crd(&changed, "one").unwrap().0),
            schema_hash(&a)
        );
    }

    #[test]
    fn install_plan_matrix() {
        // SCH-4, safe by default: only kbind's own CRDs are replaced or stamped.
        let desired = desired_crd(&provider_crd(), "p").unwrap().0;
        let other_hash = {
            let mut d = desired.clone();
            d.annotations_mut()
                .insert("core.kbind.io/schema-hash".into(), "sha256:other".into());
            d
        };
        let with = |labels: &[(&str, &str)], annotations: &[(&str, &str)]| {
            let mut crd = desired.clone();
            crd.metadata.labels = Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
            );
            crd.metadata.annotations = Some(
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
            );
            crd
        };
        let managed = [("core.kbind.io/managed", "true")];
        let marked_p = with(
            &managed,
            &[
                ("core.kbind.io/connection", "p"),
                (
                    "core.kbind.io/schema-hash",
                    &desired.annotations()["core.kbind.io/schema-hash"],
                ),
            ],
        );
        let marked_q = with(&managed, &[("core.kbind.io/connection", "q")]);
        let mut unbound_p = marked_p.clone();
        unbound_p
            .annotations_mut()
            .insert("core.kbind.io/unbound".into(), "kept".into());
        let foreign = with(&[], &[]);
        let created_unmarked = with(&[], &[("core.kbind.io/created-by", "p")]);
        let foreign_adopted = with(&[], &[("core.kbind.io/adopt", "p")]);
        let q_adopted = with(
            &managed,
            &[
                ("core.kbind.io/connection", "q"),
                ("core.kbind.io/adopt", "p"),
            ],
        );
        let adopted_for_q = with(&[], &[("core.kbind.io/adopt", "q")]);
        let refused = |p: Plan| matches!(p, Plan::Refuse(_));
        // (existing, desired, create, update) → plan
        let cases: Vec<(
            Option<&CustomResourceDefinition>,
            &CustomResourceDefinition,
            bool,
            bool,
            Plan,
        )> = vec![
            (None, &desired, false, true, Plan::LeaveAbsent),
            (None, &desired, true, false, Plan::Create),
            (Some(&marked_p), &desired, true, true, Plan::Keep),
            (Some(&marked_p), &other_hash, true, true, Plan::Replace),
            (Some(&marked_p), &other_hash, true, false, Plan::Keep),
            (Some(&marked_p), &other_hash, false, true, Plan::Keep),
            (Some(&created_unmarked), &desired, true, true, Plan::Replace),
            (Some(&created_unmarked), &desired, false, true, Plan::Stamp),
            (Some(&foreign_adopted), &desired, true, true, Plan::Replace),
            (Some(&foreign_adopted), &desired, true, false, Plan::Stamp),
            (Some(&foreign_adopted), &desired, false, true, Plan::Stamp),
            // Served by q, adopted by p: q's provider is drained first (#32.10), whatever the
            // policy.
            (
                Some(&q_adopted),
                &desired,
                true,
                true,
                Plan::Handover { from: "q".into() },
            ),
            (
                Some(&q_adopted),
                &desired,
                false,
                false,
                Plan::Handover { from: "q".into() },
            ),
            // Bound again after an automatic unbind: the mark is taken off.
            (Some(&unbound_p), &desired, true, true, Plan::Stamp),
            (Some(&unbound_p), &desired, false, true, Plan::Stamp),
        ];
        for (existing, desired, create, update, want) in cases {
            assert_eq!(
                plan(existing, desired, "p", create, update),
                want,
                "{:?} {create} {update}",
                existing.map(|e| e.annotations())
            );
        }
        for (existing, create, update) in [
            (&foreign, true, true),
            (&foreign, false, true),
            (&foreign, true, false),
            (&marked_q, true, true),
            (&marked_q, false, true),
            (&adopted_for_q, true, true),
        ] {
            let p = plan(Some(existing), &desired, "p", create, update);
            assert!(refused(p.clone()), "{:?}: {p:?}", existing.annotations());
        }
        let Plan::Refuse(message) = plan(Some(&marked_q), &desired, "p", true, true) else {
            unreachable!()
        };
        assert_eq!(
            message,
            "the consumer CRD widgets.example.org serves Connection q, so kbind leaves it alone; to let Connection p take it over, annotate it core.kbind.io/adopt=p"
        );
        let Plan::Refuse(message) = plan(Some(&foreign), &desired, "p", true, true) else {
            unreachable!()
        };
        assert!(message.contains("was not created by kbind"), "{message}");
    }

    #[test]
    fn reserved_groups_are_refused_whatever_exists() {
        for (group, reserved) in [
            ("", true),
            ("core.kbind.io", true),
            ("k8s.io", true),
            ("apps.k8s.io", true),
            ("networking.k8s.io", true),
            ("kubernetes.io", true),
            ("resource.kubernetes.io", true),
            ("example.org", false),
            ("cert-manager.io", false),
            ("cluster.x-k8s.io", false),
            ("notk8s.io", false),
            ("kbind.io", false),
        ] {
            assert_eq!(reserved_group(group), reserved, "{group}");
            let mut desired = desired_crd(&provider_crd(), "p").unwrap().0;
            desired.spec.group = group.into();
            let adopted = {
                let mut c = desired.clone();
                c.annotations_mut()
                    .insert("core.kbind.io/adopt".into(), "p".into());
                c
            };
            for existing in [None, Some(&desired), Some(&adopted)] {
                assert_eq!(
                    matches!(plan(existing, &desired, "p", true, true), Plan::Refuse(_)),
                    reserved,
                    "{group}"
                );
            }
        }
    }
}
