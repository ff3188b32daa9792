//! What every request shares: the gateway's settings, clients, caches and records, and how an
//! answer is made (a refusal is one line with its code) and counted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kbind_shared::api::catalog::{Collection, Export};
use kube::Client;
use kube::runtime::reflector::Store;
use serde_json::Value;

use super::auth::{Authenticator, Denied, Rate};
use super::oidc;
use super::records::{self, Failure, Kind};
use super::request::BadRequest;
use crate::bundle::Refusal;

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
    /// A test's offset for the host's clock (zero otherwise): records are judged by the API
    /// server's clock, so nothing may change by it.
    pub host_clock_offset: jiff::SignedDuration,
}

/// The gateway's state: shared by every request, holding nothing a request left.
pub struct Gateway {
    pub(super) provider: Client,
    pub(super) config: kube::Config,
    pub(super) settings: Settings,
    pub(super) auth: Authenticator,
    pub(super) rate: Rate,
    pub(super) records: records::Store,
    pub(super) exports: Store<Export>,
    pub(super) collections: Store<Collection>,
    pub(super) metrics: kbind_shared::metrics::Metrics,
    pub(super) oidc: Option<Arc<oidc::Oidc>>,
    pub(super) logins: kbind_shared::metrics_auth::ReviewBudget,
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
            records: records::Store::new(provider.clone(), namespace, settings.host_clock_offset),
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

/// A refusal: its code and one line.
pub(super) struct Answer(pub(super) StatusCode, pub(super) String);

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
pub(super) fn json_response(code: StatusCode, value: &Value) -> Response {
    let mut response = (code, value.to_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// Counts and times an answer of `endpoint`.
pub(super) fn observed(
    gateway: &Gateway,
    endpoint: &str,
    started: Instant,
    response: Response,
) -> Response {
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

pub(super) fn server(gateway: &Gateway) -> String {
    gateway.settings.server.clone().unwrap_or_else(|| {
        gateway
            .config
            .cluster_url
            .to_string()
            .trim_end_matches('/')
            .to_owned()
    })
}
