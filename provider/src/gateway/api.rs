//! The gateway's API: who the provider is, its catalog, a bind (its Grant recorded and issued,
//! a one-time pickup made) and the pickup (the bundle, once, with a credential minted then).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kbind_shared::api::catalog::{Collection, Export};
use kube::ResourceExt;
use serde_json::{Value, json};

use super::auth;
use super::login::{CSRF_HEADER, SESSION_COOKIE, carries_csrf, cookie, read_session};
use super::pickup::{self, Record};
use super::records::{Failure, Kind};
use super::request::{self, DEFAULT_SECRET_NAMESPACE, Format};
use super::state::{Answer, FIELD_MANAGER, Gateway, json_response, observed, server};
use crate::bundle;

pub(super) async fn provider(State(gateway): State<Arc<Gateway>>) -> Response {
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

pub(super) async fn catalog(State(gateway): State<Arc<Gateway>>) -> Response {
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

pub(super) async fn bind(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
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
    if !carries_csrf(headers, &session) {
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

pub(super) async fn take(
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
