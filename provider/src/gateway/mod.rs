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
pub mod oidc;
pub mod pickup;
pub mod records;
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
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::bundle::{self, Refusal};
use auth::{Authenticator, Denied, Rate};
use pickup::Record;
use records::{Failure, Kind};
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
    /// Token reviews per second, all callers together (per replica).
    pub reviews_per_second: u32,
    /// How long a login session lasts.
    pub session_ttl: Duration,
    /// Logins started per second, all browsers together (per replica): each costs a record.
    pub logins_per_second: u32,
}

/// The cookie binding a login in progress to the browser that started it.
pub const LOGIN_COOKIE: &str = "__Host-kbind-login";
/// The session cookie.
pub const SESSION_COOKIE: &str = "__Host-kbind-session";
/// The header a session's state-changing call carries its CSRF token in.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// How long a login may take.
pub const LOGIN_TTL: Duration = Duration::from_secs(300);
/// Sessions one user may hold at once.
pub const SESSIONS_PER_USER: usize = 20;

/// A login in progress, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoginState {
    /// The PKCE verifier (never leaves the gateway and the store).
    pub verifier: String,
    /// The ID token's expected nonce.
    pub nonce: String,
    /// A digest of the browser's login cookie.
    pub browser: String,
    /// Where the browser goes once logged in (a path of the gateway).
    pub then: String,
}

/// A logged-in browser, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    /// Who logged in.
    pub username: String,
    /// The token its state-changing calls must carry in [`CSRF_HEADER`].
    pub csrf: String,
}

/// The value of cookie `name` in the `Cookie` headers.
pub fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// A request's query parameters (the first of each name).
fn query_of(uri: &axum::http::Uri) -> std::collections::HashMap<String, String> {
    let mut query = std::collections::HashMap::new();
    for (key, value) in form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()) {
        query.entry(key.into_owned()).or_insert(value.into_owned());
    }
    query
}

/// Whether `then` is a path of this gateway to return to (not another site: no scheme, no
/// `//host`, no backslash).
pub fn safe_return(then: &str) -> bool {
    then.starts_with('/')
        && !then.starts_with("//")
        && !then.contains('\\')
        && then.len() <= 512
        && then.chars().all(|c| c.is_ascii_graphic())
}

/// A `Set-Cookie` value for `name`: secure, HTTP-only, for the whole gateway.
fn set_cookie(name: &str, value: &str, max_age: Duration) -> Option<HeaderValue> {
    HeaderValue::from_str(&format!(
        "{name}={value}; Path=/; Secure; HttpOnly; SameSite=Lax; Max-Age={}",
        max_age.as_secs()
    ))
    .ok()
}

/// The gateway's state: shared by every request, holding nothing a request left.
pub struct Gateway {
    provider: Client,
    config: kube::Config,
    settings: Settings,
    auth: Authenticator,
    rate: Rate,
    records: records::Store,
    exports: Store<Export>,
    collections: Store<Collection>,
    metrics: kbind_shared::metrics::Metrics,
    oidc: Option<Arc<oidc::Oidc>>,
    logins: kbind_shared::metrics_auth::ReviewBudget,
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
        oidc: Option<oidc::Oidc>,
    ) -> Self {
        Self {
            oidc: oidc.map(Arc::new),
            logins: kbind_shared::metrics_auth::ReviewBudget::per_second(
                settings.logins_per_second,
            ),
            auth: Authenticator::new(provider.clone(), settings.reviews_per_second),
            rate: Rate::new(settings.binds_per_minute),
            records: records::Store::new(provider.clone(), namespace),
            provider,
            config,
            settings,
            exports,
            collections,
            metrics,
        }
    }

    /// The records' store (its collector runs beside the server).
    pub fn records(&self) -> &records::Store {
        &self.records
    }
}

/// The endpoints.
pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/api/provider", get(provider))
        .route("/api/catalog", get(catalog))
        .route("/api/bind", post(bind))
        .route("/api/pickup/{token}", get(take))
        .route("/api/session", get(session).delete(logout))
        .route("/login", get(login))
        .route("/callback", get(callback))
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
            Failure::Full(_) => StatusCode::TOO_MANY_REQUESTS,
            Failure::Unknown(Kind::Session) | Failure::Expired(Kind::Session) => {
                StatusCode::UNAUTHORIZED
            }
            Failure::Unknown(_) => StatusCode::NOT_FOUND,
            Failure::Expired(_) => StatusCode::GONE,
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
        "authentication": authentication(&gateway),
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

/// How callers may authenticate here.
fn authentication(gateway: &Gateway) -> Value {
    let mut ways = vec![json!({ "type": "kubernetes", "header": "Authorization: Bearer <token>" })];
    if gateway.oidc.is_some() {
        ways.push(json!({ "type": "oidc", "login": "/login" }));
    }
    Value::Array(ways)
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
    let caller = caller(gateway, headers).await?;
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
    let (token, expires) = gateway
        .records
        .make(
            Kind::Pickup,
            &record,
            gateway.settings.pickup_ttl,
            Some(&record.identity),
            Some(pickup::PER_CALLER),
        )
        .await?;
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

/// Who calls: a bearer token the provider's API server knows, else a login session — whose calls
/// must carry its CSRF token (a cookie is sent by the browser on its own; the token only by the
/// gateway's own page, which read it from `/api/session`).
async fn caller(gateway: &Gateway, headers: &HeaderMap) -> Result<auth::Caller, Answer> {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if authorization.is_some() {
        return Ok(gateway.auth.authenticate(authorization).await?);
    }
    let Some(token) = cookie(headers, SESSION_COOKIE) else {
        return Ok(gateway.auth.authenticate(None).await?);
    };
    let session = read_session(gateway, token).await?;
    let csrf = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok());
    if csrf.is_none_or(|c| records::digest(c) != records::digest(&session.csrf)) {
        return Err(Answer(
            StatusCode::FORBIDDEN,
            format!(
                "a session's call must carry its CSRF token in {CSRF_HEADER} (from GET /api/session)"
            ),
        ));
    }
    Ok(auth::Caller {
        username: session.username.clone(),
        user: k8s_openapi::api::authentication::v1::UserInfo {
            username: Some(session.username),
            ..Default::default()
        },
    })
}

async fn read_session(gateway: &Gateway, token: &str) -> Result<Session, Answer> {
    if !request::is_pickup_token(token) {
        return Err(Failure::Unknown(Kind::Session).into());
    }
    Ok(gateway.records.read(Kind::Session, token).await?)
}

/// `GET /api/session`: who is logged in, and the CSRF token the page's calls carry.
async fn session(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let started = Instant::now();
    let response = match cookie(&headers, SESSION_COOKIE) {
        None => Failure::Unknown(Kind::Session).into(),
        Some(token) => match read_session(&gateway, token).await {
            Ok(session) => {
                let mut response = json_response(
                    StatusCode::OK,
                    &json!({ "username": session.username, "csrfToken": session.csrf }),
                );
                response
                    .headers_mut()
                    .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
                return observed(&gateway, "session", started, response);
            }
            Err(answer) => answer,
        },
    };
    observed(&gateway, "session", started, response.into_response())
}

/// `DELETE /api/session`: logs out (with the session's CSRF token).
async fn logout(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let started = Instant::now();
    let response = match logout_inner(&gateway, &headers).await {
        Ok(response) => response,
        Err(answer) => answer.into_response(),
    };
    observed(&gateway, "session", started, response)
}

async fn logout_inner(gateway: &Gateway, headers: &HeaderMap) -> Result<Response, Answer> {
    let token = cookie(headers, SESSION_COOKIE).ok_or(Failure::Unknown(Kind::Session))?;
    let session = read_session(gateway, token).await?;
    let csrf = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok());
    if csrf.is_none_or(|c| records::digest(c) != records::digest(&session.csrf)) {
        return Err(Answer(
            StatusCode::FORBIDDEN,
            format!("logging out needs the session's CSRF token in {CSRF_HEADER}"),
        ));
    }
    gateway.records.end(Kind::Session, token).await?;
    let mut response = StatusCode::NO_CONTENT.into_response();
    if let Some(clear) = set_cookie(SESSION_COOKIE, "", Duration::ZERO) {
        response.headers_mut().insert(header::SET_COOKIE, clear);
    }
    Ok(response)
}

/// `GET /login[?then=/path]`: starts a login — recorded (state, PKCE verifier, nonce, a digest
/// of the browser's login cookie) where every replica reads it — and sends the browser to the
/// identity provider.
async fn login(State(gateway): State<Arc<Gateway>>, uri: axum::http::Uri) -> Response {
    let started = Instant::now();
    let response = match login_inner(&gateway, &query_of(&uri)).await {
        Ok(response) => response,
        Err(answer) => answer.into_response(),
    };
    observed(&gateway, "login", started, response)
}

async fn login_inner(
    gateway: &Gateway,
    query: &std::collections::HashMap<String, String>,
) -> Result<Response, Answer> {
    let Some(oidc) = &gateway.oidc else {
        return Err(Answer(
            StatusCode::NOT_FOUND,
            "login is not configured on this gateway (--oidc-issuer); use a bearer token".into(),
        ));
    };
    if !gateway.logins.take(Instant::now()) {
        return Err(Answer(
            StatusCode::TOO_MANY_REQUESTS,
            "too many logins are starting right now; try again in a second".into(),
        ));
    }
    let then = query
        .get("then")
        .map(String::as_str)
        .filter(|t| safe_return(t))
        .unwrap_or("/")
        .to_owned();
    let fresh = || records::new_token().map_err(|e| Answer(StatusCode::SERVICE_UNAVAILABLE, e));
    let (binding, verifier, nonce) = (fresh()?, fresh()?, fresh()?);
    let state = LoginState {
        verifier: verifier.clone(),
        nonce: nonce.clone(),
        browser: records::digest(&binding),
        then,
    };
    let (token, _) = gateway
        .records
        .make(Kind::Login, &state, LOGIN_TTL, None, None)
        .await?;
    let location = oidc.authorize_url(&token, &verifier, &nonce);
    let mut response = StatusCode::FOUND.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::LOCATION,
        HeaderValue::from_str(&location)
            .map_err(|e| Answer(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?,
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(cookie) = set_cookie(LOGIN_COOKIE, &binding, LOGIN_TTL) {
        headers.insert(header::SET_COOKIE, cookie);
    }
    Ok(response)
}

/// `GET /callback?code&state`: the identity provider's answer. The login is taken once, only in
/// the browser that started it; the code is exchanged with its PKCE verifier; the session is
/// recorded and its cookie set.
async fn callback(
    State(gateway): State<Arc<Gateway>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    let started = Instant::now();
    let response = match callback_inner(&gateway, &query_of(&uri), &headers).await {
        Ok(response) => response,
        Err(answer) => answer.into_response(),
    };
    observed(&gateway, "callback", started, response)
}

async fn callback_inner(
    gateway: &Gateway,
    query: &std::collections::HashMap<String, String>,
    headers: &HeaderMap,
) -> Result<Response, Answer> {
    let Some(oidc) = &gateway.oidc else {
        return Err(Answer(
            StatusCode::NOT_FOUND,
            "login is not configured on this gateway".into(),
        ));
    };
    if let Some(error) = query.get("error") {
        let error: String = error
            .chars()
            .filter(|c| c.is_ascii_graphic())
            .take(100)
            .collect();
        return Err(Answer(
            StatusCode::FORBIDDEN,
            format!("the identity provider did not log you in: {error}"),
        ));
    }
    let (Some(code), Some(state)) = (query.get("code"), query.get("state")) else {
        return Err(Answer(
            StatusCode::BAD_REQUEST,
            "a callback carries a code and a state".into(),
        ));
    };
    if !request::is_pickup_token(state) || code.len() > 2048 {
        return Err(Failure::Unknown(Kind::Login).into());
    }
    let Some(binding) = cookie(headers, LOGIN_COOKIE) else {
        return Err(Answer(
            StatusCode::FORBIDDEN,
            "this login was not started in this browser (no login cookie)".into(),
        ));
    };
    let browser = records::digest(binding);
    let login: LoginState = gateway
        .records
        .take(Kind::Login, state, |l: &LoginState| {
            if l.browser == browser {
                Ok(())
            } else {
                Err(())
            }
        })
        .await?
        .map_err(|()| {
            Answer(
                StatusCode::FORBIDDEN,
                "this login was started in another browser".into(),
            )
        })?;
    let username = oidc
        .finish(code, &login.verifier, &login.nonce)
        .await
        .map_err(|e| Answer(StatusCode::FORBIDDEN, format!("login failed: {e}")))?;
    let csrf = records::new_token().map_err(|e| Answer(StatusCode::SERVICE_UNAVAILABLE, e))?;
    let (token, _) = gateway
        .records
        .make(
            Kind::Session,
            &Session {
                username: username.clone(),
                csrf,
            },
            gateway.settings.session_ttl,
            Some(&username),
            Some(SESSIONS_PER_USER),
        )
        .await?;
    tracing::info!(%username, "logged in");
    let mut response = StatusCode::FOUND.into_response();
    let out = response.headers_mut();
    out.insert(
        header::LOCATION,
        HeaderValue::from_str(&login.then).unwrap_or(HeaderValue::from_static("/")),
    );
    out.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(cookie) = set_cookie(SESSION_COOKIE, &token, gateway.settings.session_ttl) {
        out.append(header::SET_COOKIE, cookie);
    }
    if let Some(clear) = set_cookie(LOGIN_COOKIE, "", Duration::ZERO) {
        out.append(header::SET_COOKIE, clear);
    }
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
        return Err(Failure::Unknown(Kind::Pickup).into());
    }
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let Some(format) = request::negotiate(accept) else {
        return Err(Answer(
            StatusCode::NOT_ACCEPTABLE,
            "the bundle is application/yaml or application/json".into(),
        ));
    };
    let record: Record = gateway
        .records
        .take(Kind::Pickup, token, |_: &Record| Ok::<(), ()>(()))
        .await?
        .map_err(|()| Failure::Unknown(Kind::Pickup))?;
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

/// Collects expired records every minute until `stop` (every replica does; a record two collect
/// is deleted once).
pub async fn collect(store: records::Store, stop: tokio_util::sync::CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(60)) => {}
            _ = stop.cancelled() => return,
        }
        match store.collect().await {
            Ok(0) => {}
            Ok(gone) => tracing::info!(gone, "expired records collected"),
            Err(error) => tracing::warn!(%error, "cannot collect expired records"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cookie_is_found_by_its_exact_name() {
        let mut headers = HeaderMap::new();
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; __Host-kbind-session=S ; b=2"),
        );
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("__Host-kbind-login=L"),
        );
        assert_eq!(cookie(&headers, SESSION_COOKIE), Some("S"));
        assert_eq!(cookie(&headers, LOGIN_COOKIE), Some("L"));
        assert_eq!(cookie(&headers, "kbind-session"), None);
        let mut empty = HeaderMap::new();
        empty.append(
            header::COOKIE,
            HeaderValue::from_static("__Host-kbind-session="),
        );
        assert_eq!(cookie(&empty, SESSION_COOKIE), None);
    }

    #[test]
    fn a_login_returns_only_to_a_path_of_the_gateway() {
        for (then, ok) in [
            ("/", true),
            ("/#export=widgets", true),
            ("//evil.example/", false),
            ("https://evil.example/", false),
            ("/\\evil.example", false),
            ("", false),
            ("/a b", false),
        ] {
            assert_eq!(safe_return(then), ok, "{then:?}");
        }
    }
}
