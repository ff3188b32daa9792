//! Fetching a provider's API description for synthesis: discovery, the `/openapi/v3` index and
//! each group version's document, with a cache of documents per provider server.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_shared::api::{ApiScope, ExportedApi};
use kbind_shared::sync::Locked;
use serde_json::Value;

use super::synthesis::{Budget, DiscoveredVersion, MAX_DISCOVERY_NODES, synthesize_within};
use crate::providers::{Provider, ProviderError};

/// OAPI-3: groups that are Kubernetes' own and never exported through OpenAPI discovery.
pub fn is_builtin_group(group: &str) -> bool {
    matches!(
        group,
        "" | "apps" | "batch" | "extensions" | "policy" | "autoscaling" | "networking.k8s.io"
    ) || group.ends_with(".k8s.io")
}

/// The most bytes of an error answer kbind reads (the rest is dropped): a provider's error body
/// is only ever a short Status.
const ERROR_BODY_LIMIT: u64 = 64 * 1024;

/// Reads at most `limit` bytes of `body`; `None` when it is longer (it is not read further).
async fn read_limited(
    mut body: kube::client::Body,
    limit: u64,
) -> Result<Option<Vec<u8>>, kube::Error> {
    use http_body_util::BodyExt;
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            if (bytes.len() + data.len()) as u64 > limit {
                return Ok(None);
            }
            bytes.extend_from_slice(&data);
        }
    }
    Ok(Some(bytes))
}

/// Reads the JSON at `path`, refusing a body over `limit` bytes before it is all in memory; an
/// error answer is read up to [`ERROR_BODY_LIMIT`] (kube's own client would read all of it).
pub(crate) async fn get_json<T: serde::de::DeserializeOwned>(
    client: &kube::Client,
    path: &str,
    limit: u64,
) -> Result<T, FetchError> {
    let request = http::Request::get(path)
        .body(kube::client::Body::empty())
        .map_err(|e| FetchError::Request(kube::Error::HttpError(e)))?;
    let response = client.send(request).await.map_err(FetchError::Request)?;
    let status = response.status();
    if status.is_client_error() || status.is_server_error() {
        let body = read_limited(response.into_body(), ERROR_BODY_LIMIT)
            .await
            .ok()
            .flatten()
            .unwrap_or_default();
        let parsed = serde_json::from_slice::<kube::core::Status>(&body).ok();
        let status = parsed.unwrap_or_else(|| {
            let text = String::from_utf8_lossy(&body);
            kube::core::Status::failure(&kbind_shared::redact::remote(&text), "")
                .with_code(status.as_u16())
        });
        return Err(FetchError::Request(kube::Error::Api(status.boxed())));
    }
    let Some(bytes) = read_limited(response.into_body(), limit)
        .await
        .map_err(FetchError::Request)?
    else {
        return Err(FetchError::TooLarge { path_limit: limit });
    };
    serde_json::from_slice(&bytes).map_err(|e| FetchError::Request(kube::Error::SerdeError(e)))
}

/// How many objects one page of a bounded list asks for.
const LIST_PAGE: usize = 20;
/// The most bytes one page may have (20 objects of the API server's own object size limit fit).
const LIST_PAGE_BYTES: u64 = 64 * 1024 * 1024;
/// The most pages one bounded list reads: a provider answering with endless continue tokens
/// gets an error, not a loop.
const LIST_PAGES: usize = 100;

/// Lists `collection` (an API path such as `/apis/apiextensions.k8s.io/v1/customresourcedefinitions`)
/// filtered by `label_selector`, in pages of [`LIST_PAGE`] objects each read with a size limit,
/// at most [`LIST_PAGES`] pages: what a provider answers is bounded in bytes and in work.
pub(crate) async fn list_bounded<K>(
    client: &kube::Client,
    collection: &str,
    label_selector: &str,
) -> Result<Vec<K>, FetchError>
where
    K: Clone + serde::de::DeserializeOwned,
{
    let mut items = Vec::new();
    let mut token: Option<String> = None;
    for _ in 0..LIST_PAGES {
        let query = {
            let mut query = form_urlencoded::Serializer::new(String::new());
            query.append_pair("labelSelector", label_selector);
            query.append_pair("limit", &LIST_PAGE.to_string());
            if let Some(token) = &token {
                query.append_pair("continue", token);
            }
            query.finish()
        };
        let page: kube::core::ObjectList<K> =
            get_json(client, &format!("{collection}?{query}"), LIST_PAGE_BYTES).await?;
        items.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(next) => token = Some(next),
            None => return Ok(items),
        }
    }
    Err(FetchError::Request(kube::Error::Api(
        kube::core::Status::failure(
            &format!("{collection}: more than {LIST_PAGES} pages of {LIST_PAGE} objects"),
            "TooManyObjects",
        )
        .boxed(),
    )))
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
    pub(crate) fn into_provider_error(self, what: &str) -> ProviderError {
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
    /// What was synthesized from documents named by content hash, by the digest of everything
    /// the synthesis read ([`synthesis_key`]): an unchanged provider costs no synthesis at the
    /// next discovery (#32.9). At most [`Documents::SYNTHESIZED`] entries.
    synthesized: Mutex<HashMap<[u8; 32], Option<CustomResourceDefinition>>>,
}

impl Documents {
    /// How many bytes of documents it keeps at most.
    pub const BYTES: u64 = 64 * 1024 * 1024;

    /// How many synthesis results it keeps at most.
    pub const SYNTHESIZED: usize = 4096;

    /// A cache that reads documents of at most `limit` bytes.
    pub fn new(limit: u64) -> Self {
        Self {
            by_url: Mutex::default(),
            limit,
            synthesized: Mutex::default(),
        }
    }

    /// The synthesis result remembered under `key`.
    fn synthesized(&self, key: &[u8; 32]) -> Option<Option<CustomResourceDefinition>> {
        self.synthesized.locked().get(key).cloned()
    }

    /// Remembers a synthesis result (emptied when full).
    fn remember(&self, key: [u8; 32], crd: Option<CustomResourceDefinition>) {
        let mut synthesized = self.synthesized.locked();
        if synthesized.len() >= Self::SYNTHESIZED {
            synthesized.clear();
        }
        synthesized.insert(key, crd);
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
        let fetched = Arc::new(get_json::<Value>(client, path, self.limit).await?);
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

/// The digest of everything one API's synthesis reads — the server, the API, discovery's facts and
/// the documents' URLs — or `None` when a document's URL names no content hash (then its content
/// is not known from its URL, and nothing is cached).
pub(crate) fn synthesis_key(
    server: &str,
    group: &str,
    resource: &str,
    preferred: Option<&str>,
    versions: &[DiscoveredVersion],
    paths: &[String],
) -> Option<[u8; 32]> {
    use sha2::Digest;
    if versions.len() != paths.len() || paths.iter().any(|path| !path.contains("hash=")) {
        return None;
    }
    let facts: Vec<serde_json::Value> = versions
        .iter()
        .zip(paths)
        .map(|(v, path)| {
            serde_json::json!([
                v.version,
                v.kind,
                v.singular,
                v.namespaced,
                v.has_status,
                v.short_names,
                v.categories,
                path
            ])
        })
        .collect();
    let text = serde_json::json!([server, group, resource, preferred, facts]).to_string();
    Some(sha2::Sha256::digest(text.as_bytes()).into())
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
    let groups: k8s_openapi::apimachinery::pkg::apis::meta::v1::APIGroupList =
        get_json(provider, "/apis", documents.limit)
            .await
            .map_err(|e| e.into_provider_error("provider API discovery"))?;
    let index: Value = get_json(provider, "/openapi/v3", documents.limit)
        .await
        .map_err(|e| e.into_provider_error("reading the provider's /openapi/v3"))?;
    let mut out = Synthesized::default();
    let budget = Arc::new(Budget::new(MAX_DISCOVERY_NODES));
    for group in groups.groups.iter().filter(|g| !is_builtin_group(&g.name)) {
        let preferred = group.preferred_version.as_ref().map(|v| v.version.clone());
        let mut by_resource: BTreeMap<String, Vec<DiscoveredVersion>> = BTreeMap::new();
        // Each version's document URL, beside `by_resource`.
        let mut paths: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut unreadable: BTreeMap<String, (bool, String)> = BTreeMap::new();
        for version in &group.versions {
            let Ok(resources) =
                get_json::<k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList>(
                    provider,
                    &format!("/apis/{}", version.group_version),
                    documents.limit,
                )
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
                paths
                    .entry(resource.name.clone())
                    .or_default()
                    .push(path.to_owned());
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
        // What was synthesized from these very documents before is not synthesized again.
        let mut work = by_resource.clone();
        let mut keys: BTreeMap<String, [u8; 32]> = BTreeMap::new();
        let mut results = Vec::new();
        work.retain(|resource, versions| {
            let Some(key) = synthesis_key(
                server,
                &group.name,
                resource,
                preferred.as_deref(),
                versions,
                paths.get(resource).map(Vec::as_slice).unwrap_or_default(),
            ) else {
                return true;
            };
            keys.insert(resource.clone(), key);
            match documents.synthesized(&key) {
                Some(known) => {
                    results.push((resource.clone(), Ok(known)));
                    false
                }
                None => true,
            }
        });
        // Synthesis is CPU work bounded by the discovery's node budget: it runs on a blocking
        // thread, never on the async threads that renew the leader's Lease (#32.9).
        let (group_name, shared) = (group.name.clone(), budget.clone());
        let synthesized = tokio::task::spawn_blocking(move || {
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
        for (resource, result) in &synthesized {
            if let (Ok(crd), Some(key)) = (result, keys.get(resource)) {
                documents.remember(*key, crd.clone());
            }
        }
        results.extend(synthesized);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn version(v: &str) -> DiscoveredVersion {
        DiscoveredVersion {
            version: v.into(),
            kind: "Widget".into(),
            singular: "widget".into(),
            namespaced: true,
            has_status: true,
            short_names: Vec::new(),
            categories: Vec::new(),
            document: Arc::new(serde_json::json!({})),
        }
    }

    /// A client whose "API server" answers every request with `answer(path and query)`.
    fn answering(
        answer: impl Fn(&str) -> (u16, Vec<u8>) + Send + Sync + Clone + 'static,
    ) -> kube::Client {
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let (status, body) = answer(
                request
                    .uri()
                    .path_and_query()
                    .map(|p| p.as_str())
                    .unwrap_or_default(),
            );
            async move {
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .status(status)
                        .body(kube::client::Body::from(body))
                        .unwrap(),
                )
            }
        });
        kube::Client::new(service, "default")
    }

    #[tokio::test]
    async fn provider_answers_are_read_only_up_to_their_bounds() {
        // #32.9: a huge success body, a huge error body and endless pages are all cut short.
        let huge = || vec![b'x'; 2 * 1024 * 1024];
        let client = answering(move |_| (200, huge()));
        let error = get_json::<Value>(&client, "/apis", 1024).await.unwrap_err();
        assert!(
            matches!(error, FetchError::TooLarge { path_limit: 1024 }),
            "{error:?}"
        );

        let client = answering(move |_| (500, huge()));
        let FetchError::Request(kube::Error::Api(status)) =
            get_json::<Value>(&client, "/apis", 1024).await.unwrap_err()
        else {
            panic!("an API error");
        };
        assert_eq!(status.code, 500);
        assert!(status.message.len() <= 2048, "{}", status.message.len());

        let client = answering(|_| {
            let status = serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": "apiservices.apiregistration.k8s.io is forbidden", "reason": "Forbidden",
                "code": 403,
            });
            (403, status.to_string().into_bytes())
        });
        let FetchError::Request(kube::Error::Api(status)) =
            get_json::<Value>(&client, "/apis", 1024).await.unwrap_err()
        else {
            panic!("an API error");
        };
        assert!(status.is_forbidden());

        let pages = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = pages.clone();
        let client = answering(move |query| {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            assert!(
                query.contains("labelSelector=core.kbind.io%2Fexported%3Dtrue"),
                "{query}"
            );
            assert!(query.contains("limit=20"), "{query}");
            let list = serde_json::json!({
                "apiVersion": "v1", "kind": "List",
                "metadata": { "continue": "more" }, "items": [{ "apiVersion": "v1", "kind": "X", "metadata": { "name": "x" } }],
            });
            (200, list.to_string().into_bytes())
        });
        let error = list_bounded::<kube::api::DynamicObject>(
            &client,
            "/apis/apiregistration.k8s.io/v1/apiservices",
            "core.kbind.io/exported=true",
        )
        .await
        .unwrap_err();
        assert!(
            format!("{error:?}").contains("more than 100 pages"),
            "{error:?}"
        );
        assert_eq!(pages.load(std::sync::atomic::Ordering::Relaxed), LIST_PAGES);
    }

    #[tokio::test]
    async fn a_server_relative_url_with_spaces_is_an_error_not_a_panic() {
        // A provider's index names the URL: one it cannot have meant is refused before any
        // request (a server that answers everything sees none), while a proper one is read.
        let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = asked.clone();
        let client = answering(move |_| {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            (200, b"{}".to_vec())
        });
        let hostile = get_json::<Value>(&client, "/openapi/v3/apis/a b/v1?hash=x y", 1024).await;
        assert!(hostile.is_err());
        assert_eq!(asked.load(std::sync::atomic::Ordering::Relaxed), 0);
        let proper = get_json::<Value>(&client, "/openapi/v3/apis/a/v1?hash=xy", 1024).await;
        assert_eq!(proper.unwrap(), serde_json::json!({}));
        assert_eq!(asked.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    #[test]
    fn synthesis_is_remembered_only_by_content_hashes_and_everything_it_read() {
        // #32.9: an unchanged provider costs no synthesis; any change to what it reads does.
        let versions = [version("v1")];
        let path = |hash: &str| vec![format!("/openapi/v3/apis/example.org/v1?hash={hash}")];
        let key = |server: &str, versions: &[DiscoveredVersion], paths: &[String]| {
            synthesis_key(
                server,
                "example.org",
                "widgets",
                Some("v1"),
                versions,
                paths,
            )
        };
        let a = key("https://p", &versions, &path("A")).unwrap();
        assert_eq!(Some(a), key("https://p", &versions, &path("A")));
        assert_ne!(Some(a), key("https://p", &versions, &path("B")));
        assert_ne!(Some(a), key("https://q", &versions, &path("A")));
        let mut cluster_scoped = version("v1");
        cluster_scoped.namespaced = false;
        assert_ne!(Some(a), key("https://p", &[cluster_scoped], &path("A")));
        // A URL without a content hash says nothing about the content: never cached.
        assert_eq!(
            key(
                "https://p",
                &versions,
                &["/openapi/v3/apis/example.org/v1".to_owned()]
            ),
            None
        );
        // Bounded.
        let documents = Documents::new(1024);
        for i in 0..Documents::SYNTHESIZED + 10 {
            let key = key("https://p", &versions, &path(&i.to_string())).unwrap();
            documents.remember(key, None);
        }
        assert!(documents.synthesized.locked().len() <= Documents::SYNTHESIZED);
        assert_eq!(documents.synthesized(&a), None);
    }
}
