//! Discovery of the APIs a provider exports (REFERENCE-BEHAVIOUR §6, DISC-1 … DISC-6).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_shared::api::{
    ActiveSchemaSource, ApiScope, ExportedApi, OpenApiExports, SchemaPolicy, SchemaSource,
};
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

/// DISC-4: the APIs of the provider's OpenAPI for which a CRD can be synthesized, with their
/// versions highest first. `Boundary` (the seed's contract): every non-built-in API the
/// credential's discovery shows, kbind's own groups excepted. `Marked` (#32.8, opt-in): only
/// what the provider marked ([`Marks`]); unmarked APIs are then neither read nor synthesized.
async fn discover_openapi_candidates(
    provider: &Provider,
    documents: &Documents,
    exports: OpenApiExports,
) -> Result<Vec<ExportedApi>, ProviderError> {
    let marks = match exports {
        OpenApiExports::Boundary => None,
        OpenApiExports::Marked => {
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
            Some(marks)
        }
    };
    let synthesized = synthesize_from_provider(provider, documents, |group, resource, gv| {
        in_boundary(group)
            && marks
                .as_ref()
                .is_none_or(|m| m.exports(group, resource, gv))
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

/// Whether the OpenAPI source may export an API of `group` (built-in groups are never read at
/// all, `openapi::fetch::is_builtin_group`): not kbind's own (`core.kbind.io`, `reaper.kbind.io`
/// — kbind never installs them as a consumer API).
pub fn in_boundary(group: &str) -> bool {
    group != "kbind.io" && !group.ends_with(".kbind.io")
}

/// What a discovery reads, given the Connection's `source` and the source a previous discovery
/// recorded (`status.activeSchemaSource`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// Labelled provider CRDs only.
    Crd,
    /// The provider's OpenAPI.
    OpenApi,
    /// Labelled provider CRDs when there are any, else the provider's OpenAPI.
    CrdElseOpenApi,
}

/// `Auto` (DISC-2/3, LIM-2 fixed): labelled CRDs win when there are any — also after an earlier
/// discovery fell through to OpenAPI (it narrows to CRD once the provider labels exports) — but
/// once it reads CRDs it stays there: an empty answer (an export label removed for a moment) is
/// just that, never a fall-through that widens the exports to the whole OpenAPI boundary.
pub fn reading(source: SchemaSource, recorded: Option<ActiveSchemaSource>) -> Reading {
    match (source, recorded) {
        (SchemaSource::Crd, _) | (SchemaSource::Auto, Some(ActiveSchemaSource::Crd)) => {
            Reading::Crd
        }
        (SchemaSource::OpenApi, _) => Reading::OpenApi,
        (SchemaSource::Auto, None | Some(ActiveSchemaSource::OpenApi)) => Reading::CrdElseOpenApi,
    }
}

/// DISC-2/3/4: the exported APIs under the Connection's schema `policy`; `recorded` is the source
/// its status records from an earlier discovery ([`reading`]).
pub async fn discover(
    provider: &Provider,
    documents: &Documents,
    policy: &SchemaPolicy,
    recorded: Option<ActiveSchemaSource>,
) -> Result<Exports, ProviderError> {
    let openapi = || async {
        Ok::<_, ProviderError>(Exports {
            source: ActiveSchemaSource::OpenApi,
            apis: discover_openapi_candidates(provider, documents, policy.openapi_exports).await?,
        })
    };
    match reading(policy.source, recorded) {
        Reading::Crd => Ok(Exports {
            source: ActiveSchemaSource::Crd,
            apis: list_exported_crds(provider).await?,
        }),
        Reading::OpenApi => openapi().await,
        Reading::CrdElseOpenApi => {
            // A failed list is an error, not a fall-through (DISC-2) — but once on OpenAPI, a
            // credential that may no longer list CRDs stays there.
            let apis = match list_exported_crds(provider).await {
                Ok(apis) => apis,
                Err(ProviderError::Forbidden(_))
                    if recorded == Some(ActiveSchemaSource::OpenApi) =>
                {
                    Vec::new()
                }
                Err(e) => return Err(e),
            };
            if apis.is_empty() {
                openapi().await
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
    fn auto_narrows_to_crd_and_never_widens_from_it() {
        // (source, recorded) → what is read
        use ActiveSchemaSource::{Crd, OpenApi};
        let cases = [
            (SchemaSource::Auto, None, Reading::CrdElseOpenApi),
            // Once on CRDs, an empty list stays empty (the blip, #32.8).
            (SchemaSource::Auto, Some(Crd), Reading::Crd),
            // On OpenAPI, labelled CRDs appearing narrow it to CRD (#53.5).
            (SchemaSource::Auto, Some(OpenApi), Reading::CrdElseOpenApi),
            (SchemaSource::Crd, Some(OpenApi), Reading::Crd),
            (SchemaSource::Crd, None, Reading::Crd),
            (SchemaSource::OpenApi, Some(Crd), Reading::OpenApi),
            (SchemaSource::OpenApi, None, Reading::OpenApi),
        ];
        for (source, recorded, want) in cases {
            assert_eq!(reading(source, recorded), want, "{source:?} {recorded:?}");
        }
    }

    #[test]
    fn the_openapi_boundary_leaves_out_kbinds_own_groups() {
        for group in ["example.org", "widgets.io", "kbind.example.org"] {
            assert!(in_boundary(group), "{group}");
        }
        for group in ["core.kbind.io", "reaper.kbind.io", "kbind.io"] {
            assert!(!in_boundary(group), "{group}");
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
