//! Fetching a provider's API description for synthesis: discovery, the `/openapi/v3` index and
//! each group version's document, with a cache of documents per provider server.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

use super::{DiscoveredVersion, synthesize};
use crate::providers::{Provider, ProviderError};

/// OAPI-3: groups that are Kubernetes' own and never exported through OpenAPI discovery.
pub fn is_builtin_group(group: &str) -> bool {
    matches!(
        group,
        "" | "apps" | "batch" | "extensions" | "policy" | "autoscaling" | "networking.k8s.io"
    ) || group.ends_with(".k8s.io")
}

async fn get_json(client: &kube::Client, path: &str) -> Result<Value, kube::Error> {
    let request = http::Request::get(path)
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    let text = client.request_text(request).await?;
    serde_json::from_str(&text).map_err(kube::Error::SerdeError)
}

/// Fetched OpenAPI v3 documents by provider server and `serverRelativeURL`, which carries the
/// document's content hash (`?hash=…`): a changed document has a new URL, so a cached one is
/// never stale, and one provider's documents are never served for another. Bounded: emptied when
/// it grows past [`Documents::ENTRIES`].
#[derive(Default)]
pub struct Documents {
    by_url: Mutex<HashMap<(String, String), Value>>,
}

impl Documents {
    /// How many documents it keeps at most.
    pub const ENTRIES: usize = 128;

    /// One group version's document from `server`, from the cache when its URL names a content
    /// hash.
    pub async fn get(
        &self,
        client: &kube::Client,
        server: &str,
        path: &str,
    ) -> Result<Value, kube::Error> {
        let key = (server.to_owned(), path.to_owned());
        let cacheable = path.contains("hash=");
        if cacheable && let Some(found) = self.lock().get(&key) {
            return Ok(found.clone());
        }
        let fetched = get_json(client, path).await?;
        if cacheable {
            let mut documents = self.lock();
            if documents.len() >= Self::ENTRIES {
                documents.clear();
            }
            documents.insert(key, fetched.clone());
        }
        Ok(fetched)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Value>> {
        // A panic while holding the lock cannot leave the map half-written (one insert or clear).
        self.by_url
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Synthesizes the CRDs of the provider's non-built-in groups (all of them, or only `only_group`).
/// Group versions whose discovery or document cannot be read are skipped (OAPI-1, OAPI-3).
pub async fn synthesize_from_provider(
    provider: &Provider,
    documents: &Documents,
    only_group: Option<&str>,
) -> Result<Vec<CustomResourceDefinition>, ProviderError> {
    let server = provider.kubeconfig.server();
    let provider = &provider.client;
    let groups = provider
        .list_api_groups()
        .await
        .map_err(|e| ProviderError::from_kube("provider API discovery", e))?;
    let index = get_json(provider, "/openapi/v3")
        .await
        .map_err(|e| ProviderError::from_kube("reading the provider's /openapi/v3", e))?;
    let mut crds = Vec::new();
    for group in groups
        .groups
        .iter()
        .filter(|g| !is_builtin_group(&g.name) && only_group.is_none_or(|o| o == g.name))
    {
        let preferred = group.preferred_version.as_ref().map(|v| v.version.clone());
        let mut by_resource: std::collections::BTreeMap<String, Vec<DiscoveredVersion>> =
            Default::default();
        for version in &group.versions {
            let Ok(resources) = provider
                .list_api_group_resources(&version.group_version)
                .await
            else {
                continue;
            };
            let Some(path) =
                index["paths"][format!("apis/{}", version.group_version)]["serverRelativeURL"]
                    .as_str()
            else {
                continue;
            };
            let Ok(document) = documents.get(provider, server, path).await else {
                continue;
            };
            let names: BTreeSet<&str> = resources
                .resources
                .iter()
                .map(|r| r.name.as_str())
                .collect();
            for resource in resources.resources.iter().filter(|r| !r.name.contains('/')) {
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
        for (resource, versions) in by_resource {
            if let Some(crd) = synthesize(&group.name, &resource, preferred.as_deref(), &versions) {
                crds.push(crd);
            }
        }
    }
    crds.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    Ok(crds)
}
