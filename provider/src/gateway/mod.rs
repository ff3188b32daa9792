//! `kbind-gateway`: the provider's front door for consumers (#52). Stateless — everything it
//! remembers between two requests (one-time pickups, logins in progress, sessions) lives in the
//! provider's API server, so any replica answers any step. Its endpoints:
//!
//! - `GET /api/provider`: who this provider is and how to log in;
//! - `GET /api/catalog`: the offered Exports (their APIs and docs) and the Collections;
//! - `POST /api/bind` (`application/json`, a bearer token): the caller authenticated by the
//!   provider's API server, allowed to `bind` the Export, its Grant recorded and issued through
//!   the issuer → `201` with a one-time pickup URL;
//! - `GET /api/pickup/{token}`: the bundle, once, within 5 minutes — YAML, or a JSON `List` when
//!   `Accept` prefers `application/json` — with a credential minted at that moment.
//!
//! - `GET /login`, `GET /callback`, `GET|DELETE /api/session`: browser login with OpenID Connect
//!   ([`login`]).
//!
//! Cross-site requests cannot act: a bearer token is nothing a browser sends by itself, a
//! session's state-changing calls must carry its CSRF token, and a bind must be
//! `application/json` (which no form can send without a CORS preflight, and the gateway answers
//! none).

mod api;
pub mod auth;
pub mod login;
pub mod oidc;
mod page;
pub mod pickup;
pub mod records;
pub mod request;
mod state;
pub mod tls;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

pub use api::catalog_json;
pub use state::{FIELD_MANAGER, Gateway, Settings};

/// The endpoints.
pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/api/provider", get(api::provider))
        .route("/api/catalog", get(api::catalog))
        .route("/api/bind", post(api::bind))
        .route("/api/pickup/{token}", get(api::take))
        .route("/api/session", get(login::session).delete(login::logout))
        .route("/api/session/handoff", post(login::redeem))
        .route("/", get(page::index))
        .route("/assets/page.js", get(page::script))
        .route("/assets/page.css", get(page::style))
        .route("/login", get(login::login))
        .route("/callback", get(login::callback))
        .layer(DefaultBodyLimit::max(request::MAX_BODY_BYTES))
        .with_state(gateway)
}

/// Reads the API server's clock at once, then collects expired records every minute until
/// `stop` (every replica does; a record two collect is deleted once).
pub async fn collect(store: records::Store, stop: tokio_util::sync::CancellationToken) {
    if let Err(error) = store.now().await {
        tracing::warn!(%error, "cannot read the API server's clock yet");
    }
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
