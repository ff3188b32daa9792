//! Discovery of the APIs a provider exports (REFERENCE-BEHAVIOUR §6, DISC-1 … DISC-6).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_shared::api::{ActiveSchemaSource, ApiScope, ExportedApi, SchemaSource};
use kbind_shared::keys;
use kube::Api;
use kube::api::ListParams;

use crate::openapi::fetch::{Documents, synthesize_from_provider};
use crate::providers::{Provider, ProviderError};

/// What discovery found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exports {
    /// The source actually used (what `Auto` resolved to).
    pub source: ActiveSchemaSource,
    /// Exported APIs, sorted by name.
    pub apis: Vec<ExportedApi>,
}

/// The exported API a CRD describes, with `versions` and the versions the consumer leaves out.
fn export_of(crd: &CustomResourceDefinition, versions: Vec<String>) -> ExportedApi {
    let omitted_versions = crate::schema::serve_lossless(&mut crd.spec.clone());
    ExportedApi {
        omitted_versions,
        name: crd.metadata.name.clone().unwrap_or_default(),
        group: crd.spec.group.clone(),
        resource: crd.spec.names.plural.clone(),
        scope: if crd.spec.scope == "Cluster" {
            ApiScope::Cluster
        } else {
            ApiScope::Namespaced
        },
        versions,
    }
}

/// DISC-1: the exported API of each labelled CRD; CRDs without a served version are skipped.
pub fn exports_from_crds(crds: &[CustomResourceDefinition]) -> Vec<ExportedApi> {
    let mut apis: Vec<ExportedApi> = crds
        .iter()
        .filter(|crd| {
            crd.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(keys::EXPORTED_LABEL))
                .is_some_and(|v| v == keys::TRUE)
        })
        .filter_map(|crd| {
            let versions: Vec<String> = crd
                .spec
                .versions
                .iter()
                .filter(|v| v.served)
                .map(|v| v.name.clone())
                .collect();
            (!versions.is_empty()).then(|| export_of(crd, versions))
        })
        .collect();
    apis.sort_by(|a, b| a.name.cmp(&b.name));
    apis
}

async fn list_exported_crds(provider: &Provider) -> Result<Vec<ExportedApi>, ProviderError> {
    // At rest: the exports found in exactly the versions the provider still has.
    if let Some(apis) = provider.schemas.exports() {
        return Ok(apis);
    }
    let crds: Api<CustomResourceDefinition> = Api::all(provider.client.clone());
    let selector = format!("{}={}", keys::EXPORTED_LABEL, keys::TRUE);
    let list = crds
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| {
            ProviderError::from_kube("listing the provider's CustomResourceDefinitions", e)
        })?;
    let apis = exports_from_crds(&list.items);
    provider.schemas.remember_exports(&list.items, &apis);
    Ok(apis)
}

/// DISC-4: every non-built-in API for which a CRD can be synthesized from the provider's OpenAPI
/// documents, with its versions highest first.
async fn discover_openapi_candidates(
    provider: &Provider,
    documents: &Documents,
) -> Result<Vec<ExportedApi>, ProviderError> {
    let synthesized = synthesize_from_provider(provider, documents, None).await?;
    let mut exports: Vec<ExportedApi> = synthesized
        .crds
        .iter()
        .map(|crd| {
            export_of(
                crd,
                crd.spec.versions.iter().map(|v| v.name.clone()).collect(),
            )
        })
        .collect();
    // APIs too large to synthesize stay exports: binding one reports why it cannot be installed.
    exports.extend(synthesized.failed.into_iter().map(|(export, _)| export));
    exports.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(exports)
}

/// The source a discovery under `source` reads, given the one a previous discovery of the same
/// Connection recorded (`status.activeSchemaSource`). `Auto` resolves once (LIM-2 fixed): the
/// first discovery picks CRDs when the provider exports any, else OpenAPI, and from then on the
/// recorded choice stands — an empty answer (an export label removed for a moment) is just that,
/// never a fall-through that widens the exports. `None`: `Auto` not resolved yet.
pub fn resolved_source(
    source: SchemaSource,
    recorded: Option<ActiveSchemaSource>,
) -> Option<ActiveSchemaSource> {
    match source {
        SchemaSource::Crd => Some(ActiveSchemaSource::Crd),
        SchemaSource::OpenApi => Some(ActiveSchemaSource::OpenApi),
        SchemaSource::Auto => recorded,
    }
}

/// DISC-2/3/4: the exported APIs under the Connection's schema source; `recorded` is the source
/// its status records from an earlier discovery ([`resolved_source`]).
pub async fn discover(
    provider: &Provider,
    documents: &Documents,
    source: SchemaSource,
    recorded: Option<ActiveSchemaSource>,
) -> Result<Exports, ProviderError> {
    let source = match resolved_source(source, recorded) {
        Some(ActiveSchemaSource::Crd) => SchemaSource::Crd,
        Some(ActiveSchemaSource::OpenApi) => SchemaSource::OpenApi,
        None => SchemaSource::Auto,
    };
    match source {
        SchemaSource::Crd => Ok(Exports {
            source: ActiveSchemaSource::Crd,
            apis: list_exported_crds(provider).await?,
        }),
        SchemaSource::OpenApi => Ok(Exports {
            source: ActiveSchemaSource::OpenApi,
            apis: discover_openapi_candidates(provider, documents).await?,
        }),
        SchemaSource::Auto => {
            // A failed list is an error, not a fall-through (DISC-2).
            let apis = list_exported_crds(provider).await?;
            if apis.is_empty() {
                Ok(Exports {
                    source: ActiveSchemaSource::OpenApi,
                    apis: discover_openapi_candidates(provider, documents).await?,
                })
            } else {
                Ok(Exports {
                    source: ActiveSchemaSource::Crd,
                    apis,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceDefinitionNames, CustomResourceDefinitionSpec,
        CustomResourceDefinitionVersion,
    };

    fn crd(
        name: &str,
        label: Option<&str>,
        scope: &str,
        versions: &[(&str, bool)],
    ) -> CustomResourceDefinition {
        let (plural, group) = name.split_once('.').unwrap();
        let mut crd = CustomResourceDefinition {
            spec: CustomResourceDefinitionSpec {
                group: group.into(),
                names: CustomResourceDefinitionNames {
                    plural: plural.into(),
                    kind: "K".into(),
                    ..Default::default()
                },
                scope: scope.into(),
                versions: versions
                    .iter()
                    .map(|(v, served)| CustomResourceDefinitionVersion {
                        name: (*v).into(),
                        served: *served,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            },
            ..Default::default()
        };
        crd.metadata.name = Some(name.into());
        if let Some(value) = label {
            crd.metadata.labels =
                Some([(keys::EXPORTED_LABEL.to_owned(), value.to_owned())].into());
        }
        crd
    }

    #[test]
    fn only_exactly_true_labelled_crds_with_served_versions_are_exported() {
        // DISC-1, KEY-1
        let crds = [
            crd(
                "widgets.example.org",
                Some("true"),
                "Namespaced",
                &[("v1", true), ("v1beta1", false), ("v2", true)],
            ),
            crd(
                "gadgets.example.org",
                Some("True"),
                "Namespaced",
                &[("v1", true)],
            ),
            crd(
                "dials.example.org",
                Some("yes"),
                "Namespaced",
                &[("v1", true)],
            ),
            crd(
                "hidden.example.org",
                Some("true"),
                "Namespaced",
                &[("v1", false)],
            ),
            crd(
                "clusters.example.org",
                Some("true"),
                "Cluster",
                &[("v1alpha1", true)],
            ),
            crd("plain.example.org", None, "Namespaced", &[("v1", true)]),
        ];
        let exports = exports_from_crds(&crds);
        let names: Vec<&str> = exports.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["clusters.example.org", "widgets.example.org"]);
        assert_eq!(exports[0].scope, ApiScope::Cluster);
        assert_eq!(exports[1].versions, ["v1", "v2"]);
        assert_eq!(
            (exports[1].group.as_str(), exports[1].resource.as_str()),
            ("example.org", "widgets")
        );
    }

    #[test]
    fn auto_resolves_once_and_keeps_its_choice() {
        // #32.8: (source, recorded) → what is read
        use ActiveSchemaSource::{Crd, OpenApi};
        let cases = [
            (SchemaSource::Auto, None, None),
            (SchemaSource::Auto, Some(Crd), Some(Crd)),
            (SchemaSource::Auto, Some(OpenApi), Some(OpenApi)),
            (SchemaSource::Crd, Some(OpenApi), Some(Crd)),
            (SchemaSource::OpenApi, Some(Crd), Some(OpenApi)),
            (SchemaSource::Crd, None, Some(Crd)),
        ];
        for (source, recorded, want) in cases {
            assert_eq!(
                resolved_source(source, recorded),
                want,
                "{source:?} {recorded:?}"
            );
        }
    }

    #[test]
    fn builtin_groups_are_never_candidates() {
        use crate::openapi::fetch::is_builtin_group;
        for group in [
            "",
            "apps",
            "batch",
            "extensions",
            "policy",
            "autoscaling",
            "networking.k8s.io",
            "rbac.authorization.k8s.io",
            "apiextensions.k8s.io",
        ] {
            assert!(is_builtin_group(group), "{group}");
        }
        for group in ["example.org", "core.kcp.io", "k8s.io.example.org"] {
            assert!(!is_builtin_group(group), "{group}");
        }
    }
}
