//! Talking to a provider's `kbind-gateway` (#52): `kubectl kbind catalog` and `kubectl kbind bind`.
//! HTTPS only, the system's roots plus an optional CA file; every answer bounded in size and time
//! (a gateway is someone else's program); the caller's token read from a file or the environment,
//! never from the command line (where `ps` shows it), and never printed.

use std::path::Path;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use kbind_shared::https;
use serde_json::Value;

/// The largest answer read from a gateway (a bundle is a few KiB; a catalog of thousands of
/// Exports well under this).
const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;
/// How long one request may take (a bind waits for the issuer: up to 30 s).
const TIMEOUT: Duration = Duration::from_secs(60);

/// How the caller proves who it is.
#[derive(Debug, Clone)]
pub enum Credential {
    /// A token the provider's API server knows.
    Bearer(String),
    /// A login session (`kubectl kbind login`) and its CSRF token.
    Session { session: String, csrf: String },
}

/// A gateway's address and the caller's credential.
pub struct Gateway {
    base: String,
    credential: Option<Credential>,
    client: https::Client,
}

/// An answer: status code and body.
pub struct Answer {
    pub code: u16,
    pub body: String,
}

impl Gateway {
    /// A client of the gateway at `url` (`https://…`), trusting the system's roots and the PEM
    /// certificates in `ca_file`, calling with `credential`.
    pub fn new(
        url: &str,
        ca_file: Option<&Path>,
        credential: Option<Credential>,
    ) -> Result<Self, String> {
        let base = url.trim_end_matches('/').to_owned();
        if !base.starts_with("https://") {
            return Err(format!(
                "the gateway's URL must be https:// (tokens and credentials cross it): {base}"
            ));
        }
        let client = https::client(ca_file, false)?;
        Ok(Self {
            base,
            credential,
            client,
        })
    }

    /// One request: `method path`, `accept`, a JSON `body`.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        accept: &str,
        body: Option<&Value>,
    ) -> Result<Answer, String> {
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("Accept", accept);
        match &self.credential {
            Some(Credential::Bearer(token)) => {
                request = request.header("Authorization", format!("Bearer {token}"));
            }
            Some(Credential::Session { session, csrf }) => {
                request = request
                    .header("Cookie", format!("__Host-kbind-session={session}"))
                    .header("X-CSRF-Token", csrf.as_str());
            }
            None => {}
        }
        let body = match body {
            Some(body) => {
                request = request.header("Content-Type", "application/json");
                Full::new(Bytes::from(body.to_string()))
            }
            None => Full::new(Bytes::new()),
        };
        let request = request.body(body).map_err(|e| e.to_string())?;
        let what = format!("{method} {}{}", self.base, redacted(path));
        let (code, body) =
            https::send(&self.client, request, &what, MAX_ANSWER_BYTES, TIMEOUT).await?;
        Ok(Answer {
            code,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }
}

impl Gateway {
    /// Its URL, as given (without a trailing slash).
    pub fn url(&self) -> &str {
        &self.base
    }
}

/// A path with a pickup token hidden (an error message must not carry it).
fn redacted(path: &str) -> String {
    match path.strip_prefix("/api/pickup/") {
        Some(_) => "/api/pickup/…".to_owned(),
        None => path.to_owned(),
    }
}

/// The caller's token: the file's first line, else `KBIND_GATEWAY_TOKEN`.
pub fn token(file: Option<&Path>) -> Result<Option<String>, String> {
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("read the token file {}: {e}", path.display()))?;
        let token = text.lines().next().unwrap_or_default().trim().to_owned();
        if token.is_empty() {
            return Err(format!("the token file {} is empty", path.display()));
        }
        return Ok(Some(token));
    }
    Ok(std::env::var("KBIND_GATEWAY_TOKEN")
        .ok()
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty()))
}

/// A refusal's one line, with its code.
pub fn refused(answer: &Answer) -> String {
    format!(
        "the gateway answered {}: {}",
        answer.code,
        crate::view::line(answer.body.trim(), 500)
    )
}

/// The catalog as a table: each offered Export with its APIs and title; each Collection.
pub fn render_catalog(catalog: &Value) -> String {
    let cell = |v: &Value| crate::view::cell(v.as_str().unwrap_or(""));
    let mut rows = Vec::new();
    for export in catalog["exports"].as_array().into_iter().flatten() {
        let apis: Vec<String> = export["apis"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| cell(&a["name"]))
            .collect();
        rows.push(vec![
            cell(&export["name"]),
            cell(&export["title"]),
            apis.join(","),
            cell(&export["docs"]),
        ]);
    }
    let mut out = crate::view::table(&["EXPORT", "TITLE", "APIS", "DOCS"], &rows);
    let collections: Vec<&Value> = catalog["collections"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    if !collections.is_empty() {
        let mut rows = Vec::new();
        for collection in collections {
            let exports: Vec<String> = collection["exports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(cell)
                .collect();
            rows.push(vec![
                cell(&collection["name"]),
                cell(&collection["title"]),
                exports.join(","),
            ]);
        }
        out.push('\n');
        out.push_str(&crate::view::table(
            &["COLLECTION", "TITLE", "EXPORTS"],
            &rows,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_catalog_prints_each_export_with_its_apis_and_each_collection() {
        let text = render_catalog(&json!({
            "exports": [{ "name": "widgets", "title": "Widgets\u{1b}[31m", "apis": [{ "name": "widgets.example.org" }, { "name": "gizmos.example.org" }] }],
            "collections": [{ "name": "all", "title": "All", "exports": ["widgets"] }],
        }));
        assert!(
            text.contains("widgets.example.org,gizmos.example.org"),
            "{text}"
        );
        assert!(text.contains("COLLECTION"), "{text}");
        assert!(
            !text.contains('\u{1b}'),
            "control characters removed: {text:?}"
        );
    }

    #[test]
    fn only_https_and_no_token_in_a_path_shown() {
        assert!(Gateway::new("http://gw", None, None).is_err());
        assert!(Gateway::new("https://gw/", None, None).is_ok());
        assert_eq!(redacted("/api/pickup/SECRET"), "/api/pickup/…");
        assert_eq!(redacted("/api/catalog"), "/api/catalog");
    }

    #[test]
    fn the_token_comes_from_its_file() {
        let dir = std::env::temp_dir().join(format!("kbind-token-{}", std::process::id()));
        std::fs::write(&dir, "  abc \nrest").unwrap();
        assert_eq!(token(Some(&dir)).unwrap(), Some("abc".into()));
        std::fs::write(&dir, "\n").unwrap();
        assert!(token(Some(&dir)).is_err());
        let _ = std::fs::remove_file(&dir);
    }
}
