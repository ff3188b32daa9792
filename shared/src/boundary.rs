//! Tenant isolation on a shared provider (#51): a Connection with a **boundary** (a Grant's, set
//! by the bundle) keeps its copies in namespaces of its own — consumer namespace `N` is provider
//! namespace `<boundary>-N` — so two consumers whose namespaces and object names are the same
//! never meet on the provider. Without a boundary names are preserved (the default, as before).
//!
//! The map is applied at the edges only: every provider request and every provider watch maps the
//! namespace; everything kbind holds and decides is keyed by the consumer's namespace.

/// The label a boundary's provider namespaces carry (the issuer chart's admission policy lets a
/// boundary's credential create only namespaces `<boundary>-…` labelled with it).
pub const BOUNDARY_LABEL: &str = "iam.kbind.io/boundary";

/// The longest namespace name the API server accepts (a DNS label).
const MAX_NAMESPACE: usize = 63;

/// How consumer namespaces are named on the provider.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct NamespaceMap {
    boundary: Option<String>,
}

/// A consumer namespace whose provider namespace in the boundary would be too long a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooLong {
    pub namespace: String,
    pub boundary: String,
}

impl std::fmt::Display for TooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "namespace {:?} has {} characters: its provider namespace in the Connection's boundary {:?} would be longer than {MAX_NAMESPACE}; this Connection syncs namespaces of at most {} characters",
            self.namespace,
            self.namespace.len(),
            self.boundary,
            MAX_NAMESPACE - self.boundary.len() - 1,
        )
    }
}

impl TooLong {
    /// As the provider's API server would refuse the name (422 Invalid), naming the limit.
    pub fn to_error(&self) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code: 422,
            reason: "Invalid".into(),
            ..kube::core::Status::failure(&self.to_string(), "Invalid")
        }))
    }
}

impl NamespaceMap {
    /// The map of a Connection's `spec.boundary` (`None` or empty: names preserved).
    pub fn new(boundary: Option<&str>) -> Self {
        Self {
            boundary: boundary.filter(|b| !b.is_empty()).map(str::to_owned),
        }
    }

    /// The boundary, if any.
    pub fn boundary(&self) -> Option<&str> {
        self.boundary.as_deref()
    }

    /// The provider namespace of consumer namespace `namespace`.
    pub fn provider(&self, namespace: &str) -> Result<String, TooLong> {
        let Some(boundary) = &self.boundary else {
            return Ok(namespace.to_owned());
        };
        let mapped = format!("{boundary}-{namespace}");
        if mapped.len() > MAX_NAMESPACE {
            return Err(TooLong {
                namespace: namespace.to_owned(),
                boundary: boundary.clone(),
            });
        }
        Ok(mapped)
    }

    /// [`NamespaceMap::provider`] of an optional namespace (cluster-scoped objects keep none).
    pub fn provider_opt(&self, namespace: Option<&str>) -> Result<Option<String>, TooLong> {
        namespace.map(|n| self.provider(n)).transpose()
    }

    /// The consumer namespace of provider namespace `namespace`; `None` when it is not one of the
    /// boundary's (nothing there is this Connection's).
    pub fn consumer<'a>(&self, namespace: &'a str) -> Option<&'a str> {
        match &self.boundary {
            None => Some(namespace),
            Some(boundary) => namespace
                .strip_prefix(boundary.as_str())?
                .strip_prefix('-')
                .filter(|rest| !rest.is_empty()),
        }
    }

    /// The label a provider namespace kbind creates carries for the boundary.
    pub fn namespace_labels(&self) -> Option<(&'static str, String)> {
        self.boundary.clone().map(|b| (BOUNDARY_LABEL, b))
    }

    /// `labels` of a provider namespace kbind creates, with the boundary's label added.
    pub fn labelled(
        &self,
        labels: impl IntoIterator<Item = (String, String)>,
    ) -> std::collections::BTreeMap<String, String> {
        labels
            .into_iter()
            .chain(self.namespace_labels().map(|(k, v)| (k.to_owned(), v)))
            .collect()
    }
}

/// Where on the provider a Connection's copies in `namespace` (every namespace when `None`) can
/// be listed: that scope itself without a boundary; in a boundary — whose credential cannot list
/// across namespaces — each consumer namespace's provider namespace (one that cannot be mapped
/// holds nothing).
pub async fn provider_scopes(
    consumer: &kube::Client,
    map: &NamespaceMap,
    namespace: Option<&str>,
) -> Result<Vec<Option<String>>, kube::Error> {
    if map.boundary().is_none() {
        return Ok(vec![namespace.map(str::to_owned)]);
    }
    let namespaces = match namespace {
        Some(namespace) => vec![namespace.to_owned()],
        None => kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(consumer.clone())
            .list_metadata(&kube::api::ListParams::default())
            .await?
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect(),
    };
    Ok(namespaces
        .iter()
        .filter_map(|n| map.provider(n).ok())
        .map(Some)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_boundary_names_are_preserved() {
        let map = NamespaceMap::new(None);
        assert_eq!(map.provider("team-a").unwrap(), "team-a");
        assert_eq!(map.consumer("team-a"), Some("team-a"));
        assert_eq!(map.provider_opt(None).unwrap(), None);
        assert_eq!(map.namespace_labels(), None);
        assert_eq!(NamespaceMap::new(Some("")), map);
    }

    #[test]
    fn a_boundary_prefixes_every_namespace_and_maps_back_only_its_own() {
        let map = NamespaceMap::new(Some("kbind-0123456789"));
        assert_eq!(map.provider("team-a").unwrap(), "kbind-0123456789-team-a");
        assert_eq!(
            map.provider_opt(Some("default")).unwrap().as_deref(),
            Some("kbind-0123456789-default")
        );
        let cases = [
            ("kbind-0123456789-team-a", Some("team-a")),
            (
                "kbind-0123456789-kbind-0123456789-x",
                Some("kbind-0123456789-x"),
            ),
            ("kbind-0123456789", None),
            ("kbind-0123456789-", None),
            ("kbind-0123456789x-team-a", None),
            ("kbind-9999999999-team-a", None),
            ("team-a", None),
        ];
        for (provider, consumer) in cases {
            assert_eq!(map.consumer(provider), consumer, "{provider}");
        }
        for n in ["a", "team-a", &"x".repeat(46)] {
            assert_eq!(map.consumer(&map.provider(n).unwrap()), Some(n));
        }
        assert_eq!(
            map.namespace_labels(),
            Some((BOUNDARY_LABEL, "kbind-0123456789".to_owned()))
        );
        let labels = map.labelled([("a".to_owned(), "b".to_owned())]);
        assert_eq!(
            labels.get(BOUNDARY_LABEL).map(String::as_str),
            Some("kbind-0123456789")
        );
        assert_eq!(labels.len(), 2);
        assert_eq!(NamespaceMap::new(None).labelled([]).len(), 0);
    }

    #[test]
    fn a_namespace_too_long_for_the_boundary_is_refused_naming_the_limit() {
        let map = NamespaceMap::new(Some("kbind-0123456789"));
        assert_eq!(map.provider(&"x".repeat(46)).unwrap().len(), 63);
        let error = map.provider(&"x".repeat(47)).unwrap_err();
        let message = error.to_string();
        assert!(message.contains("47 characters"), "{message}");
        assert!(message.contains("at most 46 characters"), "{message}");
        assert!(message.contains("kbind-0123456789"), "{message}");
    }
}
