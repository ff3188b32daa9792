//! What the gateway reads from a request and how it answers, as pure functions: the bind
//! request's body, the bundle's format by content negotiation, a pickup token's shape. Everything
//! a caller sends is bounded and checked here before any of it reaches the provider's API server.

use serde::Deserialize;

/// The largest request body the gateway reads (a bind request is a few hundred bytes).
pub const MAX_BODY_BYTES: usize = 4 * 1024;

/// A bind request's body (`POST /api/bind`, `application/json`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BindRequest {
    /// The Export to bind.
    pub export: String,
    /// Which of the caller's clusters (one Grant and boundary per cluster).
    #[serde(default)]
    pub cluster_name: Option<String>,
    /// A Binding in this consumer namespace instead of a ClusterBinding.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The Connection's name on the consumer (default: the Export's).
    #[serde(default)]
    pub connection: Option<String>,
    /// Where on the consumer the kubeconfig Secret goes (default `kbind`).
    #[serde(default)]
    pub secret_namespace: Option<String>,
}

/// Where the bundle's Secret goes when the request does not say.
pub const DEFAULT_SECRET_NAMESPACE: &str = "kbind";

/// A request the gateway refuses before asking anyone: 400 with this one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

/// Whether `name` is a DNS-1123 label (a namespace's name): ≤ 63 lowercase alphanumerics and
/// '-', starting and ending alphanumeric.
pub fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

/// Whether `name` is a DNS-1123 subdomain (an object's name): ≤ 253, labels joined by '.'.
pub fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(is_dns_label)
}

/// Parses and checks a bind request's body: JSON of [`BindRequest`], every name a valid
/// Kubernetes name (a cluster name: ≤ 63 printable ASCII characters).
pub fn parse_bind(body: &[u8]) -> Result<BindRequest, BadRequest> {
    if body.len() > MAX_BODY_BYTES {
        return Err(BadRequest(format!(
            "the request body is larger than {MAX_BODY_BYTES} bytes"
        )));
    }
    let request: BindRequest = serde_json::from_slice(body)
        .map_err(|e| BadRequest(format!("the request body is not a bind request: {e}")))?;
    if !is_dns_subdomain(&request.export) {
        return Err(BadRequest(format!(
            "export {:?} is not an Export's name",
            clip(&request.export)
        )));
    }
    for (what, value) in [
        ("namespace", &request.namespace),
        ("secretNamespace", &request.secret_namespace),
    ] {
        if let Some(value) = value
            && !is_dns_label(value)
        {
            return Err(BadRequest(format!(
                "{what} {:?} is not a namespace's name",
                clip(value)
            )));
        }
    }
    if let Some(connection) = &request.connection
        && !is_dns_subdomain(connection)
    {
        return Err(BadRequest(format!(
            "connection {:?} is not a Connection's name",
            clip(connection)
        )));
    }
    if let Some(cluster) = &request.cluster_name
        && (cluster.is_empty()
            || cluster.len() > 63
            || !cluster.bytes().all(|b| b.is_ascii_graphic()))
    {
        return Err(BadRequest(format!(
            "clusterName {:?} is not 1-63 printable characters without spaces",
            clip(cluster)
        )));
    }
    Ok(request)
}

/// At most 64 characters of what a caller sent, for a message.
fn clip(text: &str) -> String {
    text.chars().take(64).collect()
}

/// The format a bundle is sent in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// YAML documents (`application/yaml`): the default.
    Yaml,
    /// One JSON `List` (`application/json`).
    Json,
}

impl Format {
    /// Its `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Yaml => "application/yaml",
            Self::Json => "application/json",
        }
    }
}

/// The bundle's format for an `Accept` header: JSON when the caller prefers
/// `application/json` to YAML (by q-value, then order), else YAML; `None` when it accepts
/// neither (406).
pub fn negotiate(accept: Option<&str>) -> Option<Format> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Some(Format::Yaml);
    };
    let mut best: Option<(f32, Format)> = None;
    for range in accept.split(',') {
        let mut parts = range.split(';');
        let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.trim().strip_prefix("q="))
            .filter_map(|q| q.trim().parse::<f32>().ok())
            .next()
            .unwrap_or(1.0);
        if q.is_nan() || q <= 0.0 {
            continue;
        }
        let format = match media.as_str() {
            "application/json" => Format::Json,
            "application/yaml" | "application/x-yaml" | "text/yaml" | "application/*" | "*/*" => {
                Format::Yaml
            }
            _ => continue,
        };
        if best.is_none_or(|(b, _)| q > b) {
            best = Some((q, format));
        }
    }
    best.map(|(_, f)| f)
}

/// Bytes of a pickup token (256 bits).
pub const TOKEN_BYTES: usize = 32;

/// Whether `token` has a pickup token's shape: [`TOKEN_BYTES`] bytes as unpadded base64url. Any
/// other path is 404 without a request to the API server.
pub fn is_pickup_token(token: &str) -> bool {
    token.len() == TOKEN_BYTES.div_ceil(3) * 4 - 1
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_bind_request_names_valid_kubernetes_names_only() {
        let ok = parse_bind(br#"{"export":"widgets"}"#).unwrap();
        assert_eq!(ok.export, "widgets");
        assert_eq!(ok.namespace, None);
        let full = parse_bind(
            br#"{"export":"widgets.v2","clusterName":"prod-eu/1","namespace":"team-a","connection":"w","secretNamespace":"kbind"}"#,
        )
        .unwrap();
        assert_eq!(full.cluster_name.as_deref(), Some("prod-eu/1"));
        for (body, says) in [
            (&br#"{}"#[..], "not a bind request"),
            (br#"not json"#, "not a bind request"),
            (br#"{"export":"widgets","extra":1}"#, "unknown field"),
            (br#"{"export":"Widgets"}"#, "not an Export's name"),
            (br#"{"export":""}"#, "not an Export's name"),
            (
                br#"{"export":"w","namespace":"a.b"}"#,
                "not a namespace's name",
            ),
            (
                br#"{"export":"w","secretNamespace":"-x"}"#,
                "not a namespace's name",
            ),
            (
                br#"{"export":"w","connection":"A"}"#,
                "not a Connection's name",
            ),
            (br#"{"export":"w","clusterName":"a b"}"#, "printable"),
            (br#"{"export":"w","clusterName":""}"#, "printable"),
        ] {
            let err = parse_bind(body).unwrap_err();
            assert!(
                err.0.contains(says),
                "{}: {err}",
                String::from_utf8_lossy(body)
            );
        }
        let big = format!(
            r#"{{"export":"w","connection":"{}"}}"#,
            "a".repeat(MAX_BODY_BYTES)
        );
        assert!(
            parse_bind(big.as_bytes())
                .unwrap_err()
                .0
                .contains("larger than")
        );
    }

    #[test]
    fn the_bundle_is_yaml_unless_json_is_preferred() {
        for (accept, format) in [
            (None, Some(Format::Yaml)),
            (Some(""), Some(Format::Yaml)),
            (Some("*/*"), Some(Format::Yaml)),
            (Some("application/json"), Some(Format::Json)),
            (Some("application/yaml"), Some(Format::Yaml)),
            (
                Some("application/yaml, application/json"),
                Some(Format::Yaml),
            ),
            (
                Some("application/yaml;q=0.5, application/json"),
                Some(Format::Json),
            ),
            (Some("application/json;q=0, */*"), Some(Format::Yaml)),
            (Some("text/html"), None),
            (Some("application/json;q=0"), None),
        ] {
            assert_eq!(negotiate(accept), format, "{accept:?}");
        }
    }

    #[test]
    fn a_pickup_token_is_43_base64url_characters() {
        assert!(is_pickup_token(&"A".repeat(43)));
        assert!(is_pickup_token(&format!("{}-_", "a".repeat(41))));
        assert!(!is_pickup_token(&"A".repeat(42)));
        assert!(!is_pickup_token(&"A".repeat(44)));
        assert!(!is_pickup_token(&format!("{}=", "a".repeat(42))));
        assert!(!is_pickup_token(&format!("{}/", "a".repeat(42))));
    }

    proptest! {
        /// Whatever the body, parsing answers (never panics), and what it accepts is valid.
        #[test]
        fn any_body_is_answered_and_only_valid_names_pass(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(request) = parse_bind(&body) {
                prop_assert!(is_dns_subdomain(&request.export));
            }
        }

        /// Bind requests built from arbitrary strings: accepted exactly when every name is valid.
        #[test]
        fn accepted_exactly_when_every_name_is_valid(
            export in "[a-z0-9.-]{0,70}|\\PC{0,20}",
            namespace in proptest::option::of("[a-z0-9-]{0,70}|\\PC{0,10}"),
        ) {
            let body = serde_json::json!({ "export": export, "namespace": namespace }).to_string();
            let valid = is_dns_subdomain(&export) && namespace.as_deref().is_none_or(is_dns_label);
            prop_assert_eq!(parse_bind(body.as_bytes()).is_ok(), valid);
        }

        /// Any `Accept` header is answered.
        #[test]
        fn any_accept_header_is_answered(accept in "\\PC{0,200}") {
            let _ = negotiate(Some(&accept));
        }

        /// Any path segment is answered; only the token shape passes.
        #[test]
        fn any_token_is_answered(token in "\\PC{0,100}") {
            if is_pickup_token(&token) {
                prop_assert_eq!(token.len(), 43);
            }
        }
    }
}
