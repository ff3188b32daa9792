//! Fetching a provider's API description for synthesis: discovery, the `/openapi/v3` index and
//! each group version's document, with a cache of documents per provider server.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_shared::api::{ApiScope, ExportedApi};
use kbind_shared::sync::Locked;
use serde_json::Value;

use super::{DiscoveredVersion, synthesize_within};
use crate::providers::{Provider, ProviderError};

/// OAPI-3: groups that are Kubernetes' own and never exported through OpenAPI discovery.
pub fn is_builtin_group(group: &str) -> bool {
    matches!(
        group,
        "" | "apps" | "batch" | "extensions" | "policy" | "autoscaling" | "networking.k8s.io"
    ) || group.ends_with(".k8s.io")
}

/// Reads the JSON at `path`, refusing a body over `limit` bytes before it is all in memory.
async fn get_json(client: &kube::Client, path: &str, limit: u64) -> Result<Value, FetchError> {
    use futures::AsyncReadExt;
    let request = http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| FetchError::Request(kube::Error::HttpError(e)))?;
    let body = client
        .request_stream(request)
        .await
        .map_err(FetchError::Request)?;
    let mut bytes = Vec::new();
    std::pin::pin!(body)
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| FetchError::Request(kube::Error::ReadEvents(e)))?;
    if bytes.len() as u64 > limit {
        return Err(FetchError::TooLarge { path_limit: limit });
    }
    serde_json::from_slice(&bytes).map_err(|e| FetchError::Request(kube::Error::SerdeError(e)))
}

/// [`get_json`] for tests of hostile paths.
#[cfg(test)]
pub async fn get_json_for_tests(client: &kube::Client, path: &str) -> Result<Value, String> {
    get_json(client, path, 1024)
        .await
        .map_err(|e| format!("{e:?}"))
}

/// Why a document could not be read.
#[derive(Debug)]
pub enum FetchError {
    /// The request failed.
    Request(kube::Error),
    /// The document is larger than the limit.
    TooLarge {
        /// The limit in bytes.
        path_limit: u64,
    },
}

impl FetchError {
    fn into_provider_error(self, what: &str) -> ProviderError {
        match self {
            FetchError::Request(e) => ProviderError::from_kube(what, e),
            FetchError::TooLarge { path_limit } => {
                ProviderError::Failed(too_large(what, path_limit))
            }
        }
    }
}

fn too_large(what: &str, limit: u64) -> String {
    format!(
        "{what}: the document is larger than {limit} bytes, kbind's limit (--openapi-document-limit)"
    )
}

/// Cached documents by (server, URL) with their sizes, and the sum of the sizes.
type Cached = (HashMap<(String, String), (Arc<Value>, u64)>, u64);

/// Fetched OpenAPI v3 documents by provider server and `serverRelativeURL`, which carries the
/// document's content hash (`?hash=…`): a changed document has a new URL, so a cached one is
/// never stale, and one provider's documents are never served for another. Bounded in bytes:
/// emptied when it would grow past [`Documents::BYTES`].
pub struct Documents {
    by_url: Mutex<Cached>,
    /// The largest document read (bytes).
    limit: u64,
}

impl Documents {
    /// How many bytes of documents it keeps at most.
    pub const BYTES: u64 = 64 * 1024 * 1024;

    /// A cache that reads documents of at most `limit` bytes.
    pub fn new(limit: u64) -> Self {
        Self {
            by_url: Mutex::default(),
            limit,
        }
    }

    /// One group version's document from `server`, from the cache when its URL names a content
    /// hash.
    pub async fn get(
        &self,
        client: &kube::Client,
        server: &str,
        path: &str,
    ) -> Result<Arc<Value>, FetchError> {
        let key = (server.to_owned(), path.to_owned());
        let cacheable = path.contains("hash=");
        if cacheable && let Some((found, _)) = self.by_url.locked().0.get(&key) {
            return Ok(found.clone());
        }
        let fetched = Arc::new(get_json(client, path, self.limit).await?);
        if cacheable {
            // Its size as text, the measure the limit uses.
            let size = fetched.to_string().len() as u64;
            let mut guard = self.by_url.locked();
            let (documents, total) = &mut *guard;
            if *total + size > Self::BYTES {
                documents.clear();
                *total = 0;
            }
            if size <= Self::BYTES {
                documents.insert(key, (fetched.clone(), size));
                *total += size;
            }
        }
        Ok(fetched)
    }
}

/// What synthesis from a provider's OpenAPI documents produced.
#[derive(Debug, Default)]
pub struct Synthesized {
    /// The CRDs, sorted by name.
    pub crds: Vec<CustomResourceDefinition>,
    /// APIs discovery lists whose CRD could not be synthesized within kbind's bounds, and why:
    /// they are still exports, and binding one reports the reason.
    pub failed: Vec<(ExportedApi, String)>,
}

/// Synthesizes the CRDs of the provider's non-built-in APIs that `wanted(group, resource,
/// group_version)` accepts (the resources the provider marked exported, or the one API being
/// installed): nothing else is read or synthesized. Group versions whose discovery cannot be read
/// are skipped (OAPI-1, OAPI-3); a document that is too large, or a schema that expands beyond
/// kbind's bounds, fails its APIs with the reason.
pub async fn synthesize_from_provider(
    provider: &Provider,
    documents: &Documents,
    wanted: impl Fn(&str, &str, &str) -> bool,
) -> Result<Synthesized, ProviderError> {
    let server = provider.kubeconfig.server();
    let provider = &provider.client;
    let groups = provider
        .list_api_groups()
        .await
        .map_err(|e| ProviderError::from_kube("provider API discovery", e))?;
    let index = get_json(provider, "/openapi/v3", documents.limit)
        .await
        .map_err(|e| e.into_provider_error("reading the provider's /openapi/v3"))?;
    let mut out = Synthesized::default();
    let budget = Arc::new(super::Budget::new(super::MAX_DISCOVERY_NODES));
    for group in groups.groups.iter().filter(|g| !is_builtin_group(&g.name)) {
        let preferred = group.preferred_version.as_ref().map(|v| v.version.clone());
        let mut by_resource: BTreeMap<String, Vec<DiscoveredVersion>> = BTreeMap::new();
        let mut unreadable: BTreeMap<String, (bool, String)> = BTreeMap::new();
        for version in &group.versions {
            let Ok(resources) = provider
                .list_api_group_resources(&version.group_version)
                .await
            else {
                continue;
            };
            let top_level = || {
                resources.resources.iter().filter(|r| {
                    !r.name.contains('/') && wanted(&group.name, &r.name, &version.group_version)
                })
            };
            if top_level().next().is_none() {
                continue;
            }
            let Some(path) =
                index["paths"][format!("apis/{}", version.group_version)]["serverRelativeURL"]
                    .as_str()
            else {
                continue;
            };
            let document = match documents.get(provider, server, path).await {
                Ok(document) => document,
                Err(e) => {
                    let what = format!("the OpenAPI document of {}", version.group_version);
                    let why = e.into_provider_error(&what).message().to_owned();
                    for resource in top_level() {
                        unreadable
                            .insert(resource.name.clone(), (resource.namespaced, why.clone()));
                    }
                    continue;
                }
            };
            let names: BTreeSet<&str> = resources
                .resources
                .iter()
                .map(|r| r.name.as_str())
                .collect();
            for resource in top_level() {
                by_resource
                    .entry(resource.name.clone())
                    .or_default()
                    .push(DiscoveredVersion {
                        version: version.version.clone(),
                        kind: resource.kind.clone(),
                        singular: resource.singular_name.clone(),
                        namespaced: resource.namespaced,
                        has_status: names.contains(format!("{}/status", resource.name).as_str()),
                        short_names: resource.short_names.clone().unwrap_or_default(),
                        categories: resource.categories.clone().unwrap_or_default(),
                        document: document.clone(),
                    });
            }
        }
        let failed = |resource: &str, namespaced: bool, versions: Vec<String>, why: String| {
            (
                ExportedApi {
                    name: format!("{resource}.{}", group.name),
                    group: group.name.clone(),
                    resource: resource.to_owned(),
                    scope: if namespaced {
                        ApiScope::Namespaced
                    } else {
                        ApiScope::Cluster
                    },
                    versions,
                    omitted_versions: Vec::new(),
                },
                why,
            )
        };
        // Synthesis is CPU work bounded by the discovery's node budget: it runs on a blocking
        // thread, never on the async threads that renew the leader's Lease (#32.9).
        let (group_name, work, shared) = (group.name.clone(), by_resource.clone(), budget.clone());
        let results = tokio::task::spawn_blocking(move || {
            work.iter()
                .map(|(resource, versions)| {
                    let synthesized = synthesize_within(
                        &group_name,
                        resource,
                        preferred.as_deref(),
                        versions,
                        &shared,
                    );
                    (resource.clone(), synthesized)
                })
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|e| ProviderError::Failed(format!("synthesizing group {}: {e}", group.name)))?;
        for (resource, synthesized) in results {
            let resource = &resource;
            let Some(versions) = by_resource.get(resource) else {
                continue;
            };
            match synthesized {
                Ok(Some(crd)) => out.crds.push(crd),
                Ok(None) => {}
                Err(why) => out.failed.push(failed(
                    resource,
                    versions.first().is_some_and(|v| v.namespaced),
                    versions.iter().map(|v| v.version.clone()).collect(),
                    format!("its schema cannot be synthesized: {why}"),
                )),
            }
        }
        for (resource, (namespaced, why)) in unreadable {
            if !by_resource.contains_key(&resource) {
                out.failed
                    .push(failed(&resource, namespaced, Vec::new(), why));
            }
        }
    }
    out.crds
        .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    out.failed.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    Ok(out)
}
