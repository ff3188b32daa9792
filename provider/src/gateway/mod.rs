//! `kbind-gateway`: the provider's front door for consumers (#52). Stateless — everything it
//! remembers between two requests (the one-time pickups) lives in the provider's API server, so
//! any replica answers any step. Its endpoints:
//!
//! - `GET /api/provider`: who this provider is and how to log in;
//! - `GET /api/catalog`: the offered Exports (their APIs and docs) and the Collections;
//! - `POST /api/bind` (`application/json`, a bearer token): the caller authenticated by the
//!   provider's API server, allowed to `bind` the Export, its Grant recorded and issued through
//!   the issuer → `201` with a one-time pickup URL;
//! - `GET /api/pickup/{token}`: the bundle, once, within 5 minutes — YAML, or a JSON `List` when
//!   `Accept` prefers `application/json` — with a credential minted at that moment.
//!
//! Cross-site requests cannot act: the only credential accepted is a bearer token in the
//! `Authorization` header (nothing a browser sends by itself), and a bind must be
//! `application/json` (which no form can send without a CORS preflight, and the gateway answers
//! none).

pub mod auth;
pub mod pickup;
pub mod request;
pub mod tls;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use kbind_shared::api::catalog::{Collection, Export};
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::bundle::{self, Refusal};
use auth::{Authenticator, Denied, Rate};
use pickup::{Failure, Record};
use request::{BadRequest, DEFAULT_SECRET_NAMESPACE, Format};

/// The Grants' field manager.
pub const FIELD_MANAGER: &str = "kbind-gateway";

/// What an operator sets.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The provider's name, as consumers see it.
    pub provider_name: String,
    /// The provider's API server as consumers reach it (default: the gateway's own kubeconfig's).
    pub server: Option<String>,
    /// A bundle's credential lifetime.
    pub expiration_seconds: i64,
    /// Binds per caller per minute (per replica).
    pub binds_per_minute: u32,
    /// How long a pickup lasts.
    pub pickup_ttl: Duration,
}

/// The gateway's state: shared by every request, holding nothing a request left.
pub struct Gateway {
    provider: Client,
    config: kube::Config,
    settings: Settings,
    auth: Authenticator,
    rate: Rate,
    pickups: pickup::Store,
    exports: Store<Export>,
    collections: Store<Collection>,
    metrics: kbind_shared::metrics::Metrics,
}

impl Gateway {
    /// A gateway acting on the provider `provider` (reached with `config`), its pickups in
    /// `namespace`, its catalog read from the caches `exports` and `collections`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        provider: Client,
        config: kube::Config,
        settings: Settings,
        namespace: &str,
        exports: Store<Export>,
        collections: Store<Collection>,
        metrics: kbind_shared::metrics::Metrics,
    ) -> Self {
        Self {
            auth: Authenticator::new(provider.clone()),
            rate: Rate::new(settings.binds_per_minute),
            pickups: pickup::Store::new(provider.clone(), namespace, settings.pickup_ttl),
            provider,
            config,
            settings,
            exports,
            collections,
            metrics,
        }
    }

    /// The pickups' store (its collector runs beside the server).
    pub fn pickups(&self) -> &pickup::Store {
        &self.pickups
    }
}

/// The endpoints.
pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/api/provider", get(provider))
        .route("/api/catalog", get(catalog))
        .route("/api/bind", post(bind))
        .route("/api/pickup/{token}", get(take))
        .layer(DefaultBodyLimit::max(request::MAX_BODY_BYTES))
        .with_state(gateway)
}

/// A refusal: its code and one line.
struct Answer(StatusCode, String);

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let mut response = (self.0, format!("{}\n", self.1)).into_response();
        response
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        response
    }
}

impl From<Denied> for Answer {
    fn from(denied: Denied) -> Self {
        let code = match &denied {
            Denied::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Denied::Forbidden(_) => StatusCode::FORBIDDEN,
            Denied::Throttled(_) => StatusCode::TOO_MANY_REQUESTS,
            Denied::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        Self(code, denied.to_string())
    }
}

impl From<Refusal> for Answer {
    fn from(refusal: Refusal) -> Self {
        let code = match &refusal {
            Refusal::NoExport(_) => StatusCode::NOT_FOUND,
            Refusal::NotIssued(_) => StatusCode::CONFLICT,
            Refusal::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        Self(code, refusal.to_string())
    }
}

impl From<Failure> for Answer {
    fn from(failure: Failure) -> Self {
        let code = match &failure {
            Failure::Full => StatusCode::TOO_MANY_REQUESTS,
            Failure::Unknown => StatusCode::NOT_FOUND,
            Failure::Expired => StatusCode::GONE,
            Failure::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        Self(code, failure.to_string())
    }
}

impl From<BadRequest> for Answer {
    fn from(bad: BadRequest) -> Self {
        Self(StatusCode::BAD_REQUEST, bad.0)
    }
}

/// `value` as an `application/json` answer.
fn json_response(code: StatusCode, value: &Value) -> Response {
    let mut response = (code, value.to_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// Counts and times an answer of `endpoint`.
fn observed(gateway: &Gateway, endpoint: &str, started: Instant, response: Response) -> Response {
    let code = response.status().as_u16().to_string();
    gateway
        .metrics
        .gateway_requests_total
        .with_label_values(&[endpoint, &code])
        .inc();
    gateway
        .metrics
        .gateway_request_seconds
        .with_label_values(&[endpoint])
        .observe(started.elapsed().as_secs_f64());
    response
}

async fn provider(State(gateway): State<Arc<Gateway>>) -> Response {
    let started = Instant::now();
    let body = json!({
        "name": gateway.settings.provider_name,
        "server": server(&gateway),
        "authentication": [{ "type": "kubernetes", "header": "Authorization: Bearer <token>" }],
        "catalog": "/api/catalog",
        "bind": "/api/bind",
    });
    observed(
        &gateway,
        "provider",
        started,
        json_response(StatusCode::OK, &body),
    )
}

fn server(gateway: &Gateway) -> String {
    gateway.settings.server.clone().unwrap_or_else(|| {
        gateway
            .config
            .cluster_url
            .to_string()
            .trim_end_matches('/')
            .to_owned()
    })
}

async fn catalog(State(gateway): State<Arc<Gateway>>) -> Response {
    let started = Instant::now();
    let exports: Vec<Arc<Export>> = gateway.exports.state();
    let body = catalog_json(&exports, &gateway.collections.state());
    observed(
        &gateway,
        "catalog",
        started,
        json_response(StatusCode::OK, &body),
    )
}

/// The catalog as the gateway shows it: offered Exports only (by name), with their APIs, docs
/// and scopes; each Collection with the offered Exports it lists.
pub fn catalog_json(exports: &[Arc<Export>], collections: &[Arc<Collection>]) -> Value {
    let mut offered: Vec<&Export> = exports
        .iter()
        .map(AsRef::as_ref)
        .filter(|e| crate::issuer::plan::offered(&e.name_any(), Some(e)).is_ok())
        .collect();
    offered.sort_by_key(|e| e.name_any());
    let names: std::collections::BTreeSet<String> = offered.iter().map(|e| e.name_any()).collect();
    let exports: Vec<Value> = offered
        .iter()
        .map(|e| {
            let scopes = e.status.as_ref().map(|s| &s.apis);
            json!({
                "name": e.name_any(),
                "title": e.spec.title,
                "description": e.spec.description,
                "docs": e.spec.docs,
                "apis": e.spec.apis.iter().map(|a| json!({
                    "name": a.name,
                    "scope": scopes.and_then(|s| s.iter().find(|x| x.name == a.name)).map(|x| &x.scope),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let mut collections: Vec<&Collection> = collections.iter().map(AsRef::as_ref).collect();
    collections.sort_by_key(|c| c.name_any());
    let collections: Vec<Value> = collections
        .iter()
        .map(|c| {
            json!({
                "name": c.name_any(),
                "title": c.spec.title,
                "description": c.spec.description,
                "exports": c.spec.exports.iter().map(|e| &e.name).filter(|n| names.contains(*n)).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({ "exports": exports, "collections": collections })
}

async fn bind(State(gateway): State<Arc<Gateway>>, headers: HeaderMap, body: Bytes) -> Response {
    let started = Instant::now();
    let response = match bind_inner(&gateway, &headers, &body).await {
        Ok(response) => response,
        Err(answer) => answer.into_response(),
    };
    observed(&gateway, "bind", started, response)
}

async fn bind_inner(
    gateway: &Gateway,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, Answer> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return Err(Answer(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "a bind request is application/json".into(),
        ));
    }
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let caller = gateway.auth.authenticate(authorization).await?;
    gateway.rate.take(&caller.username, Instant::now())?;
    let asked = request::parse_bind(body)?;
    gateway.auth.may_bind(&caller, &asked.export).await?;
    let bundle_request = bundle_request(
        gateway,
        &caller.username,
        &asked.export,
        asked.cluster_name.clone(),
        asked.namespace.clone(),
        asked.connection.clone(),
        asked
            .secret_namespace
            .clone()
            .unwrap_or_else(|| DEFAULT_SECRET_NAMESPACE.to_owned()),
    );
    let grant = bundle::record(&gateway.provider, &bundle_request, FIELD_MANAGER).await?;
    if grant.spec.revoked {
        return Err(Answer(
            StatusCode::CONFLICT,
            format!(
                "Grant {} is revoked: ask the provider's admins",
                grant.name_any()
            ),
        ));
    }
    let record = Record {
        identity: caller.username.clone(),
        export: asked.export.clone(),
        cluster_name: asked.cluster_name,
        namespace: asked.namespace,
        connection: asked.connection,
        secret_namespace: bundle_request.secret_namespace.clone(),
        grant: grant.name_any(),
    };
    let (token, expires) = gateway.pickups.make(&record).await?;
    tracing::info!(caller = %caller.username, export = %record.export, grant = %record.grant, "bound; pickup made");
    let body = json!({
        "pickup": format!("/api/pickup/{token}"),
        "expiresAt": expires.to_string(),
        "grant": record.grant,
        "boundary": record.grant,
    });
    let mut response = json_response(StatusCode::CREATED, &body);
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

/// The bundle request for a caller's ask.
fn bundle_request(
    gateway: &Gateway,
    identity: &str,
    export: &str,
    cluster_name: Option<String>,
    namespace: Option<String>,
    connection: Option<String>,
    secret_namespace: String,
) -> bundle::Request {
    bundle::Request {
        export: export.to_owned(),
        identity: identity.to_owned(),
        cluster_name,
        namespace,
        connection,
        secret_namespace,
        long_lived: false,
        expiration_seconds: gateway.settings.expiration_seconds,
        server: Some(server(gateway)),
    }
}

async fn take(
    State(gateway): State<Arc<Gateway>>,
    Path(token): Path<String>,
    headers: HeaderMap,
) -> Response {
    let started = Instant::now();
    let response = match take_inner(&gateway, &token, &headers).await {
        Ok(response) => response,
        Err(answer) => answer.into_response(),
    };
    observed(&gateway, "pickup", started, response)
}

async fn take_inner(
    gateway: &Gateway,
    token: &str,
    headers: &HeaderMap,
) -> Result<Response, Answer> {
    if !request::is_pickup_token(token) {
        return Err(Failure::Unknown.into());
    }
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let Some(format) = request::negotiate(accept) else {
        return Err(Answer(
            StatusCode::NOT_ACCEPTABLE,
            "the bundle is application/yaml or application/json".into(),
        ));
    };
    let record = gateway.pickups.take(token).await?;
    let grant = bundle::still_issued(&gateway.provider, &record.grant).await?;
    let asked = bundle_request(
        gateway,
        &record.identity,
        &record.export,
        record.cluster_name.clone(),
        record.namespace.clone(),
        record.connection.clone(),
        record.secret_namespace.clone(),
    );
    let documents = bundle::assemble(&gateway.provider, &gateway.config, &asked, &grant).await?;
    let body = match format {
        Format::Yaml => bundle::yaml(&documents)?,
        Format::Json => bundle::json_list(&documents),
    };
    tracing::info!(caller = %record.identity, export = %record.export, grant = %record.grant, "pickup taken; bundle sent");
    let connection = record.connection.as_deref().unwrap_or(&record.export);
    let extension = match format {
        Format::Yaml => "yaml",
        Format::Json => "json",
    };
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(format.content_type()),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Ok(disposition) = HeaderValue::from_str(&format!(
        "attachment; filename=\"{connection}.{extension}\""
    )) {
        headers.insert(header::CONTENT_DISPOSITION, disposition);
    }
    Ok(response)
}

/// Collects expired pickups every minute until `stop` (every replica does; a record two collect
/// is deleted once).
pub async fn collect(store: pickup::Store, stop: tokio_util::sync::CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(60)) => {}
            _ = stop.cancelled() => return,
        }
        match store.collect().await {
            Ok(0) => {}
            Ok(gone) => tracing::info!(gone, "expired pickups collected"),
            Err(error) => tracing::warn!(%error, "cannot collect expired pickups"),
        }
    }
}
