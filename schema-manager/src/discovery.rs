//! Discovery of the APIs a provider exports (REFERENCE-BEHAVIOUR §6, DISC-1 … DISC-6).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_shared::api::{ActiveSchemaSource, ApiScope, ExportedApi, SchemaSource};
use std::collections::BTreeSet;

use kbind_shared::keys;

use crate::openapi::fetch::{Documents, FetchError, list_bounded, synthesize_from_provider};
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
    let selector = format!("{}={}", keys::EXPORTED_LABEL, keys::TRUE);
    // Paged and bounded in bytes: a provider's answer is hostile until read (#32.9).
    let crds: Vec<CustomResourceDefinition> = list_bounded(
        &provider.client,
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        &selector,
    )
    .await
    .map_err(|e| e.into_provider_error("listing the provider's CustomResourceDefinitions"))?;
    let apis = exports_from_crds(&crds);
    provider.schemas.remember_exports(&crds, &apis);
    Ok(apis)
}

/// What the provider marked exported, for the OpenAPI source (#32.8; the reference exported every
/// non-built-in API its OpenAPI showed): a CRD labelled `core.kbind.io/exported=true` exports its
/// API, an APIService so labelled (an aggregated API) exports the resources of its group version.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Marks {
    /// `<plural>.<group>` of the labelled CRDs.
    pub crds: BTreeSet<String>,
    /// `<group>/<version>` of the labelled APIServices.
    pub group_versions: BTreeSet<String>,
}

impl Marks {
    /// Whether `resource` of `group`, as served in `group_version`, is marked exported.
    pub fn exports(&self, group: &str, resource: &str, group_version: &str) -> bool {
        self.crds.contains(&format!("{resource}.{group}"))
            || self.group_versions.contains(group_version)
    }
}

/// The APIServices a provider labelled exported, as `<group>/<version>`. A credential that may not
/// list APIServices sees none (aggregated APIs then cannot be exported; labelled CRDs still are).
async fn marked_api_services(provider: &Provider) -> Result<BTreeSet<String>, ProviderError> {
    let selector = format!("{}={}", keys::EXPORTED_LABEL, keys::TRUE);
    match list_bounded::<kube::api::DynamicObject>(
        &provider.client,
        "/apis/apiregistration.k8s.io/v1/apiservices",
        &selector,
    )
    .await
    {
        // An APIService is named `<version>.<group>`.
        Ok(items) => Ok(items
            .iter()
            .filter_map(|s| {
                let name = s.metadata.name.as_deref()?;
                let (version, group) = name.split_once('.')?;
                Some(format!("{group}/{version}"))
            })
            .collect()),
        Err(FetchError::Request(kube::Error::Api(status))) if status.is_forbidden() => {
            tracing::debug!(
                "the provider credential may not list APIServices; only labelled CRDs are exported"
            );
            Ok(BTreeSet::new())
        }
        Err(e) => Err(e.into_provider_error("listing the provider's APIServices")),
    }
}

/// DISC-4, marked (#32.8): every API the provider marked exported ([`Marks`]) for which a CRD can
/// be synthesized from its OpenAPI documents, with its versions highest first. Unmarked APIs are
/// neither read nor synthesized.
async fn discover_openapi_candidates(
    provider: &Provider,
    documents: &Documents,
) -> Result<Vec<ExportedApi>, ProviderError> {
    let marks = Marks {
        crds: list_exported_crds(provider)
            .await?
            .into_iter()
            .map(|a| a.name)
            .collect(),
        group_versions: marked_api_services(provider).await?,
    };
    if marks == Marks::default() {
        return Ok(Vec::new());
    }
    let synthesized = synthesize_from_provider(provider, documents, |group, resource, gv| {
        marks.exports(group, resource, gv)
    })
    .await?;
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

    #[test]
    fn the_openapi_source_exports_only_what_the_provider_marked() {
        // #32.8: a labelled CRD exports its API in every version; a labelled APIService exports
        // the resources of its group version only; nothing else is exported.
        let marks = Marks {
            crds: ["widgets.example.org".to_owned()].into(),
            group_versions: ["metrics.example.com/v1beta1".to_owned()].into(),
        };
        for (group, resource, group_version, exported) in [
            ("example.org", "widgets", "example.org/v1", true),
            ("example.org", "widgets", "example.org/v2", true),
            ("example.org", "gadgets", "example.org/v1", false),
            ("other.org", "widgets", "other.org/v1", false),
            (
                "metrics.example.com",
                "pods",
                "metrics.example.com/v1beta1",
                true,
            ),
            (
                "metrics.example.com",
                "pods",
                "metrics.example.com/v1",
                false,
            ),
        ] {
            assert_eq!(
                marks.exports(group, resource, group_version),
                exported,
                "{resource}.{group} in {group_version}"
            );
        }
        assert!(!Marks::default().exports("example.org", "widgets", "example.org/v1"));
    }
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
