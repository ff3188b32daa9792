//! Logging browsers in (OpenID Connect, [`super::oidc`]) and their sessions: the login's state
//! bound to the browser that started it, taken once; sessions read on each call, their
//! state-changing calls carrying a CSRF token. Both are records in the provider's API server
//! ([`super::records`]), so a login started on one replica finishes on another.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::records::{self, Failure, Kind};
use super::request;
use super::state::{Answer, Gateway, json_response, observed};

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
    /// A command line's login: the session is handed to it, not to the browser.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff: Option<Handoff>,
}

/// Where a command line's login is handed over, and the challenge its code is redeemed with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handoff {
    /// The loopback port the command line listens on; none: it shows the code to paste.
    pub port: Option<u16>,
    /// The S256 challenge of the command line's verifier.
    pub challenge: String,
}

/// Whether a call carries `session`'s CSRF token in [`CSRF_HEADER`] (compared as digests).
pub fn carries_csrf(headers: &HeaderMap, session: &Session) -> bool {
    headers
        .get(CSRF_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| records::digest(c) == records::digest(&session.csrf))
}

/// Takes the `kind` record of `token` if `matches` says it is this caller's; otherwise `403`
/// with `refusal`, and the record stays for its own.
async fn take_if<T: serde::de::DeserializeOwned>(
    gateway: &Gateway,
    kind: Kind,
    token: &str,
    matches: impl FnOnce(&T) -> bool,
    refusal: &str,
) -> Result<T, Answer> {
    gateway
        .records
        .take(
            kind,
            token,
            |content: &T| if matches(content) { Ok(()) } else { Err(()) },
        )
        .await?
        .map_err(|()| Answer(StatusCode::FORBIDDEN, refusal.to_owned()))
}

/// A handed-over session, as recorded until the command line redeems it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handed {
    /// The session's token.
    pub session: String,
    /// Who logged in.
    pub username: String,
    /// The session's CSRF token.
    pub csrf: String,
    /// When the session ends.
    pub expires: String,
    /// The S256 challenge the redeeming verifier must match.
    pub challenge: String,
}

/// How long a handed-over login may wait to be redeemed.
pub const HANDOFF_TTL: Duration = Duration::from_secs(120);

/// A command line's handoff from a login's query (`cli=<port>` or `cli=paste`, `challenge`):
/// `None` for a browser's login, an error for a malformed one.
pub fn handoff(
    query: &std::collections::HashMap<String, String>,
) -> Result<Option<Handoff>, String> {
    let Some(cli) = query.get("cli") else {
        return Ok(None);
    };
    let port = match cli.as_str() {
        "paste" => None,
        port => Some(
            port.parse::<u16>()
                .ok()
                .filter(|p| *p >= 1024)
                .ok_or("cli is a loopback port (1024-65535) or paste")?,
        ),
    };
    let challenge = query
        .get("challenge")
        .filter(|c| request::is_pickup_token(c))
        .ok_or("a command line's login carries its S256 challenge (43 base64url characters)")?;
    Ok(Some(Handoff {
        port,
        challenge: challenge.clone(),
    }))
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
pub(super) fn query_of(uri: &axum::http::Uri) -> std::collections::HashMap<String, String> {
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

pub(super) async fn read_session(gateway: &Gateway, token: &str) -> Result<Session, Answer> {
    if !request::is_pickup_token(token) {
        return Err(Failure::Unknown(Kind::Session).into());
    }
    Ok(gateway.records.read(Kind::Session, token).await?)
}

/// `GET /api/session`: who is logged in, and the CSRF token the page's calls carry.
pub(super) async fn session(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
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
pub(super) async fn logout(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
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
    if !carries_csrf(headers, &session) {
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
pub(super) async fn login(State(gateway): State<Arc<Gateway>>, uri: axum::http::Uri) -> Response {
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
    let handoff = handoff(query).map_err(|e| Answer(StatusCode::BAD_REQUEST, e))?;
    let fresh = || records::new_token().map_err(|e| Answer(StatusCode::SERVICE_UNAVAILABLE, e));
    let (binding, verifier, nonce) = (fresh()?, fresh()?, fresh()?);
    let state = LoginState {
        verifier: verifier.clone(),
        nonce: nonce.clone(),
        browser: records::digest(&binding),
        then,
        handoff,
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
pub(super) async fn callback(
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
    let login: LoginState = take_if(
        gateway,
        Kind::Login,
        state,
        |l: &LoginState| l.browser == browser,
        "this login was started in another browser",
    )
    .await?;
    let username = oidc
        .finish(code, &login.verifier, &login.nonce)
        .await
        .map_err(|e| Answer(StatusCode::FORBIDDEN, format!("login failed: {e}")))?;
    let csrf = records::new_token().map_err(|e| Answer(StatusCode::SERVICE_UNAVAILABLE, e))?;
    let csrf_of_session = csrf.clone();
    let (token, expires) = gateway
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
    if let Some(handoff) = &login.handoff {
        return hand_over(
            gateway,
            handoff,
            &username,
            &token,
            csrf_of_session,
            expires,
        )
        .await;
    }
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

/// Hands a command line's session over: recorded for [`HANDOFF_TTL`] under a one-time code
/// the command line redeems with its verifier; the browser is sent to its loopback listener
/// with the code, or shown the code to paste.
async fn hand_over(
    gateway: &Gateway,
    handoff: &Handoff,
    username: &str,
    session: &str,
    csrf: String,
    expires: jiff::Timestamp,
) -> Result<Response, Answer> {
    let handed = Handed {
        session: session.to_owned(),
        username: username.to_owned(),
        csrf,
        expires: expires.to_string(),
        challenge: handoff.challenge.clone(),
    };
    let (code, _) = gateway
        .records
        .make(Kind::Handoff, &handed, HANDOFF_TTL, None, None)
        .await?;
    let mut response = match handoff.port {
        Some(port) => {
            let mut response = StatusCode::FOUND.into_response();
            response.headers_mut().insert(
                header::LOCATION,
                HeaderValue::from_str(&format!("http://127.0.0.1:{port}/callback?code={code}"))
                    .map_err(|e| Answer(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?,
            );
            response
        }
        None => {
            let page = format!(
                "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>kbind login</title></head><body><main><h1>Logged in as {}</h1><p>Paste this code where <code>kubectl kbind login</code> asks for it (it works once, for two minutes):</p><p><output id=\"code\">{code}</output></p></main></body></html>",
                html_escape(username)
            );
            let mut response = (StatusCode::OK, page).into_response();
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            );
            response
        }
    };
    let out = response.headers_mut();
    out.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(clear) = set_cookie(LOGIN_COOKIE, "", Duration::ZERO) {
        out.append(header::SET_COOKIE, clear);
    }
    Ok(response)
}

/// `text` safe inside HTML.
pub fn html_escape(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '<' => "&lt;".to_owned(),
            '>' => "&gt;".to_owned(),
            '&' => "&amp;".to_owned(),
            '"' => "&quot;".to_owned(),
            '\'' => "&#39;".to_owned(),
            c => c.to_string(),
        })
        .collect()
}

/// What a command line sends to redeem its login's code.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Redeem {
    code: String,
    verifier: String,
}

/// `POST /api/session/handoff` (`{"code", "verifier"}`): the command line's session, once, for
/// the verifier whose challenge started the login.
pub(super) async fn redeem(
    State(gateway): State<Arc<Gateway>>,
    body: axum::body::Bytes,
) -> Response {
    let started = Instant::now();
    let response = match redeem_inner(&gateway, &body).await {
        Ok(response) => response,
        Err(answer) => answer.into_response(),
    };
    observed(&gateway, "session", started, response)
}

async fn redeem_inner(gateway: &Gateway, body: &[u8]) -> Result<Response, Answer> {
    let asked: Redeem = serde_json::from_slice(body).map_err(|e| {
        Answer(
            StatusCode::BAD_REQUEST,
            format!("not a handoff request: {e}"),
        )
    })?;
    if !request::is_pickup_token(&asked.code) || asked.verifier.len() > 128 {
        return Err(Failure::Unknown(Kind::Handoff).into());
    }
    let challenge = super::oidc::challenge(&asked.verifier);
    let handed: Handed = take_if(
        gateway,
        Kind::Handoff,
        &asked.code,
        |h: &Handed| records::digest(&h.challenge) == records::digest(&challenge),
        "this code belongs to another login (its verifier does not match)",
    )
    .await?;
    let mut response = json_response(
        StatusCode::OK,
        &json!({
            "session": handed.session,
            "username": handed.username,
            "csrfToken": handed.csrf,
            "expiresAt": handed.expires,
        }),
    );
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
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
    fn a_command_lines_login_names_a_port_or_paste_and_its_challenge() {
        let query = |pairs: &[(&str, &str)]| -> std::collections::HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let challenge = "A".repeat(43);
        assert_eq!(handoff(&query(&[])), Ok(None));
        assert_eq!(
            handoff(&query(&[("cli", "49152"), ("challenge", &challenge)])),
            Ok(Some(Handoff {
                port: Some(49152),
                challenge: challenge.clone()
            }))
        );
        assert_eq!(
            handoff(&query(&[("cli", "paste"), ("challenge", &challenge)])),
            Ok(Some(Handoff {
                port: None,
                challenge: challenge.clone()
            }))
        );
        for bad in [
            query(&[("cli", "80"), ("challenge", &challenge)]),
            query(&[("cli", "evil.example"), ("challenge", &challenge)]),
            query(&[("cli", "49152")]),
            query(&[("cli", "49152"), ("challenge", "short")]),
        ] {
            assert!(handoff(&bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            html_escape("<a href=\"x\">'&"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;"
        );
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

    proptest::proptest! {
        /// Whatever a browser sends as cookies, the parser answers, and a found value is a
        /// non-empty, trimmed part of what was sent.
        #[test]
        fn any_cookie_header_is_answered(raw in "\\PC{0,300}") {
            let mut headers = HeaderMap::new();
            if let Ok(value) = HeaderValue::from_str(&raw) {
                headers.insert(header::COOKIE, value);
            }
            if let Some(found) = cookie(&headers, SESSION_COOKIE) {
                proptest::prop_assert!(!found.is_empty() && raw.contains(found));
            }
        }

        /// Whatever `then` a login is given, it returns to a path of the gateway or to `/`.
        #[test]
        fn a_login_never_returns_to_another_site(then in "\\PC{0,100}") {
            if safe_return(&then) {
                proptest::prop_assert!(then.starts_with('/') && !then.starts_with("//"));
                proptest::prop_assert!(!then.contains("://") || then.find("://") > then.find('/'));
            }
        }

        /// Whatever a command line's login carries, it is a port ≥ 1024 or paste, with a
        /// challenge of the token's shape — or refused.
        #[test]
        fn any_handoff_query_is_answered(cli in "\\PC{0,12}", challenge in "[A-Za-z0-9_-]{0,50}") {
            let query: std::collections::HashMap<String, String> =
                [("cli".to_owned(), cli), ("challenge".to_owned(), challenge)].into_iter().collect();
            if let Ok(Some(handoff)) = handoff(&query) {
                proptest::prop_assert!(handoff.port.is_none_or(|p| p >= 1024));
                proptest::prop_assert_eq!(handoff.challenge.len(), 43);
            }
        }
    }
}
