//! Login with OpenID Connect (#52): the gateway is a confidential client of the provider's
//! identity provider and logs browsers in with the authorization code flow and PKCE. What the
//! flow decides is pure here — the authorization URL, the PKCE challenge, the ID token's
//! signature (RS256 against the issuer's published keys) and claims, the username — and the I/O
//! (discovery, the code exchange, the keys, userinfo) is bounded in size and time: an identity
//! provider is someone else's program.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use http_body_util::Full;
use hyper::body::Bytes;
use kbind_shared::https::{self, Client};
use serde::Deserialize;
use serde_json::Value;
use sha2::Digest;

/// The largest answer read from the identity provider.
const MAX_ANSWER_BYTES: usize = 1024 * 1024;
/// How long one request to it may take.
const TIMEOUT: Duration = Duration::from_secs(10);
/// How long its keys are kept before they are read again (a key not among them is looked up at
/// once, at most every [`KEYS_MIN_AGE`]).
const KEYS_TTL: Duration = Duration::from_secs(3600);
const KEYS_MIN_AGE: Duration = Duration::from_secs(10);
/// How far the identity provider's clock may be from ours.
const LEEWAY_SECONDS: i64 = 60;

/// What the operator configured.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The issuer URL (`https://`; plain `http://` only on loopback).
    pub issuer: String,
    /// The gateway's client ID there.
    pub client_id: String,
    /// Its client secret.
    pub client_secret: String,
    /// Where the identity provider sends the browser back: `<gateway URL>/callback`.
    pub redirect_uri: String,
    /// The claim naming the user (`email` by default, as kube-apiserver's `--oidc-username-claim`).
    pub username_claim: String,
    /// Put before the claim's value: the username RBAC rules name (`oidc:` by default).
    pub username_prefix: String,
}

/// The identity provider's endpoints, from its discovery document.
#[derive(Debug, Clone, Deserialize)]
pub struct Endpoints {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
    #[serde(default)]
    userinfo_endpoint: Option<String>,
    jwks_uri: String,
}

/// One published key.
#[derive(Debug, Clone, Deserialize)]
pub struct Jwk {
    #[serde(default)]
    kid: Option<String>,
    kty: String,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
}

/// The identity provider, discovered.
pub struct Oidc {
    settings: Settings,
    endpoints: Endpoints,
    http: Client,
    keys: Mutex<Option<(Instant, Vec<Jwk>)>>,
}

/// Whether `url` may be used: `https://`, or `http://` to a loopback host.
pub fn allowed_url(url: &str) -> bool {
    if url.starts_with("https://") {
        return true;
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let host = rest.split(['/', '?']).next().unwrap_or("");
    let host = host.rsplit_once(':').map_or(host, |(h, _)| h);
    matches!(host, "localhost" | "127.0.0.1" | "[::1]")
}

/// The PKCE S256 challenge of `verifier`.
pub fn challenge(verifier: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(sha2::Sha256::digest(verifier.as_bytes()))
}

/// The authorization URL a browser is sent to.
pub fn authorize_url(
    endpoint: &str,
    settings: &Settings,
    state: &str,
    verifier: &str,
    nonce: &str,
) -> String {
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("response_type", "code")
        .append_pair("client_id", &settings.client_id)
        .append_pair("redirect_uri", &settings.redirect_uri)
        .append_pair("scope", "openid email profile")
        .append_pair("state", state)
        .append_pair("nonce", nonce)
        .append_pair("code_challenge", &challenge(verifier))
        .append_pair("code_challenge_method", "S256")
        .finish();
    let separator = if endpoint.contains('?') { '&' } else { '?' };
    format!("{endpoint}{separator}{query}")
}

/// An ID token's claims, once its signature is verified against `keys` (RS256 only: the
/// algorithm every OpenID provider must offer; `none` and symmetric ones are refused).
pub fn verify(token: &str, keys: &[Jwk]) -> Result<Value, String> {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut parts = token.split('.');
    let (Some(header), Some(payload), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("the ID token is not a signed JWT".into());
    };
    let header: Value = serde_json::from_slice(
        &b64.decode(header)
            .map_err(|_| "the ID token's header is not base64url")?,
    )
    .map_err(|_| "the ID token's header is not JSON")?;
    if header["alg"] != "RS256" {
        return Err(format!(
            "the ID token is signed with {}, not RS256",
            header["alg"]
        ));
    }
    let kid = header["kid"].as_str();
    let signature = b64
        .decode(signature)
        .map_err(|_| "the ID token's signature is not base64url")?;
    let signed = &token[..header_and_payload_len(token)];
    let candidates = keys
        .iter()
        .filter(|k| k.kty == "RSA")
        .filter(|k| kid.is_none() || k.kid.as_deref() == kid);
    for key in candidates {
        let (Some(n), Some(e)) = (&key.n, &key.e) else {
            continue;
        };
        let (Ok(n), Ok(e)) = (b64.decode(n), b64.decode(e)) else {
            continue;
        };
        let public = ring::signature::RsaPublicKeyComponents { n: &n, e: &e };
        if public
            .verify(
                &ring::signature::RSA_PKCS1_2048_8192_SHA256,
                signed.as_bytes(),
                &signature,
            )
            .is_ok()
        {
            return serde_json::from_slice(
                &b64.decode(payload)
                    .map_err(|_| "the ID token's payload is not base64url")?,
            )
            .map_err(|_| "the ID token's payload is not JSON".into());
        }
    }
    Err(format!(
        "the ID token's signature matches no key the issuer publishes (kid {kid:?})"
    ))
}

fn header_and_payload_len(token: &str) -> usize {
    token.rfind('.').unwrap_or(0)
}

/// Checks an ID token's claims: issued by `issuer` for `client_id`, with our `nonce`, current at
/// `now` (seconds since the epoch).
pub fn check_claims(
    claims: &Value,
    issuer: &str,
    client_id: &str,
    nonce: &str,
    now: i64,
) -> Result<(), String> {
    if claims["iss"] != issuer {
        return Err(format!(
            "the ID token's issuer is {}, not {issuer}",
            claims["iss"]
        ));
    }
    let audience_ok = match &claims["aud"] {
        Value::String(aud) => aud == client_id,
        Value::Array(auds) => auds.iter().any(|a| a == client_id),
        _ => false,
    };
    if !audience_ok {
        return Err(format!("the ID token is not for client {client_id}"));
    }
    if claims["nonce"] != nonce {
        return Err("the ID token's nonce is not this login's".into());
    }
    let expires = claims["exp"].as_i64().ok_or("the ID token has no expiry")?;
    if expires + LEEWAY_SECONDS < now {
        return Err("the ID token expired".into());
    }
    if claims["iat"]
        .as_i64()
        .is_some_and(|iat| iat - LEEWAY_SECONDS > now)
    {
        return Err("the ID token was issued in the future".into());
    }
    if claims["sub"].as_str().is_none_or(str::is_empty) {
        return Err("the ID token names no subject".into());
    }
    Ok(())
}

/// The username: `prefix` and the `claim`'s value. An `email` claim counts only when it is not
/// marked unverified.
pub fn username(claims: &Value, claim: &str, prefix: &str) -> Result<String, String> {
    let value = claims[claim]
        .as_str()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| format!("the identity provider gave no {claim} claim"))?;
    if claim == "email" && claims["email_verified"] == Value::Bool(false) {
        return Err(format!("the email {value} is not verified"));
    }
    if value.len() > 253 || value.chars().any(char::is_control) {
        return Err(format!("the {claim} claim is not a usable name"));
    }
    Ok(format!("{prefix}{value}"))
}

impl Oidc {
    /// Reads the issuer's discovery document (retrying for up to a minute: the identity provider
    /// may start after the gateway).
    pub async fn discover(settings: Settings) -> Result<Self, String> {
        if !allowed_url(&settings.issuer) {
            return Err(format!(
                "the OIDC issuer must be https:// (plain http only on loopback): {}",
                settings.issuer
            ));
        }
        // Plain http only to loopback: every URL is checked with `allowed_url` first.
        let http = https::client(None, true)?;
        let url = format!(
            "{}/.well-known/openid-configuration",
            settings.issuer.trim_end_matches('/')
        );
        let started = Instant::now();
        let endpoints: Endpoints = loop {
            match get_json(&http, &url).await.and_then(|v| {
                serde_json::from_value(v)
                    .map_err(|e| format!("{url}: not a discovery document: {e}"))
            }) {
                Ok(endpoints) => break endpoints,
                Err(e) if started.elapsed() > Duration::from_secs(60) => return Err(e),
                Err(error) => {
                    tracing::warn!(%error, "the OIDC issuer does not answer yet; retrying");
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
        };
        if endpoints.issuer != settings.issuer {
            return Err(format!(
                "the discovery document names issuer {}, not {}",
                endpoints.issuer, settings.issuer
            ));
        }
        for url in [
            &endpoints.authorization_endpoint,
            &endpoints.token_endpoint,
            &endpoints.jwks_uri,
        ] {
            if !allowed_url(url) {
                return Err(format!("the issuer's endpoint {url} is not https://"));
            }
        }
        Ok(Self {
            settings,
            endpoints,
            http,
            keys: Mutex::new(None),
        })
    }

    /// Where a browser logging in is sent.
    pub fn authorize_url(&self, state: &str, verifier: &str, nonce: &str) -> String {
        authorize_url(
            &self.endpoints.authorization_endpoint,
            &self.settings,
            state,
            verifier,
            nonce,
        )
    }

    /// Finishes a login: exchanges `code` (with the PKCE `verifier`), verifies the ID token and
    /// its `nonce`, and returns the username.
    pub async fn finish(&self, code: &str, verifier: &str, nonce: &str) -> Result<String, String> {
        let form = form_urlencoded::Serializer::new(String::new())
            .append_pair("grant_type", "authorization_code")
            .append_pair("code", code)
            .append_pair("redirect_uri", &self.settings.redirect_uri)
            .append_pair("code_verifier", verifier)
            .finish();
        let basic = base64::engine::general_purpose::STANDARD.encode(format!(
            "{}:{}",
            form_urlencoded::byte_serialize(self.settings.client_id.as_bytes()).collect::<String>(),
            form_urlencoded::byte_serialize(self.settings.client_secret.as_bytes())
                .collect::<String>()
        ));
        let request = hyper::Request::post(&self.endpoints.token_endpoint)
            .header("Content-Type", "application/x-www-form-urlencoded")
            .header("Accept", "application/json")
            .header("Authorization", format!("Basic {basic}"))
            .body(Full::new(Bytes::from(form)))
            .map_err(|e| e.to_string())?;
        let (code, answer) = send(&self.http, request).await?;
        let answer: Value = serde_json::from_slice(&answer)
            .map_err(|_| format!("the token endpoint answered {code} without JSON"))?;
        if code != 200 {
            return Err(format!(
                "the identity provider refused the code ({code}): {}",
                answer["error"].as_str().unwrap_or("no reason")
            ));
        }
        let id_token = answer["id_token"]
            .as_str()
            .ok_or("the identity provider returned no ID token")?;
        let claims = match verify(id_token, &self.keys(false).await?) {
            Ok(claims) => claims,
            // A key rotated since they were read: read them again, once.
            Err(_) => verify(id_token, &self.keys(true).await?)?,
        };
        let now = jiff::Timestamp::now().as_second();
        check_claims(
            &claims,
            &self.settings.issuer,
            &self.settings.client_id,
            nonce,
            now,
        )?;
        let claim = &self.settings.username_claim;
        if claims.get(claim).is_some() {
            return username(&claims, claim, &self.settings.username_prefix);
        }
        // Not in the ID token: asked of userinfo with the access token, for the same subject.
        let endpoint = self.endpoints.userinfo_endpoint.as_deref().ok_or_else(|| {
            format!("the ID token has no {claim} claim and the issuer no userinfo")
        })?;
        let access = answer["access_token"]
            .as_str()
            .ok_or("the identity provider returned no access token")?;
        let request = hyper::Request::get(endpoint)
            .header("Accept", "application/json")
            .header("Authorization", format!("Bearer {access}"))
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let (code, info) = send(&self.http, request).await?;
        if code != 200 {
            return Err(format!("userinfo answered {code}"));
        }
        let info: Value =
            serde_json::from_slice(&info).map_err(|_| "userinfo answered without JSON")?;
        if info["sub"] != claims["sub"] {
            return Err("userinfo names another subject than the ID token".into());
        }
        username(&info, claim, &self.settings.username_prefix)
    }

    /// The issuer's keys: cached for [`KEYS_TTL`]; `fresh` reads them again (at most every
    /// [`KEYS_MIN_AGE`]).
    async fn keys(&self, fresh: bool) -> Result<Vec<Jwk>, String> {
        let cached = self
            .keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some((at, keys)) = cached {
            let max_age = if fresh { KEYS_MIN_AGE } else { KEYS_TTL };
            if at.elapsed() < max_age {
                return Ok(keys);
            }
        }
        #[derive(Deserialize)]
        struct Set {
            keys: Vec<Jwk>,
        }
        let set: Set =
            serde_json::from_value(get_json(&self.http, &self.endpoints.jwks_uri).await?)
                .map_err(|e| format!("the issuer's keys: {e}"))?;
        *self
            .keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((Instant::now(), set.keys.clone()));
        Ok(set.keys)
    }
}

async fn get_json(http: &Client, url: &str) -> Result<Value, String> {
    let request = hyper::Request::get(url)
        .header("Accept", "application/json")
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let (code, body) = send(http, request).await?;
    if code != 200 {
        return Err(format!("{url} answered {code}"));
    }
    serde_json::from_slice(&body).map_err(|_| format!("{url} answered without JSON"))
}

/// One bounded exchange.
async fn send(http: &Client, request: hyper::Request<Full<Bytes>>) -> Result<(u16, Bytes), String> {
    let what = format!("{} {}", request.method(), request.uri().path());
    https::send(http, request, &what, MAX_ANSWER_BYTES, TIMEOUT).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn settings() -> Settings {
        Settings {
            issuer: "https://id.example".into(),
            client_id: "kbind".into(),
            client_secret: "s".into(),
            redirect_uri: "https://kbind.example/callback".into(),
            username_claim: "email".into(),
            username_prefix: "oidc:".into(),
        }
    }

    #[test]
    fn only_https_or_loopback_http() {
        for (url, ok) in [
            ("https://id.example", true),
            ("http://localhost:9998/", true),
            ("http://127.0.0.1/x", true),
            ("http://[::1]:80/", true),
            ("http://id.example", false),
            ("http://localhost.evil.example/", false),
            ("ftp://x", false),
        ] {
            assert_eq!(allowed_url(url), ok, "{url}");
        }
    }

    #[test]
    fn the_authorization_url_asks_for_a_code_with_pkce_s256() {
        // RFC 7636, appendix B.
        assert_eq!(
            challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
        let url = authorize_url("https://id.example/auth", &settings(), "ST", "V", "N");
        let (base, query) = url.split_once('?').unwrap();
        assert_eq!(base, "https://id.example/auth");
        let pairs: std::collections::BTreeMap<String, String> =
            form_urlencoded::parse(query.as_bytes())
                .into_owned()
                .collect();
        assert_eq!(pairs["response_type"], "code");
        assert_eq!(pairs["code_challenge_method"], "S256");
        assert_eq!(pairs["code_challenge"], challenge("V"));
        assert_eq!(pairs["state"], "ST");
        assert_eq!(pairs["nonce"], "N");
        assert_eq!(pairs["redirect_uri"], "https://kbind.example/callback");
        assert!(
            !url.contains("V&"),
            "the verifier itself never leaves the gateway: {url}"
        );
    }

    #[test]
    fn claims_are_the_issuers_for_us_with_our_nonce_and_current() {
        let good = json!({ "iss": "https://id.example", "aud": "kbind", "nonce": "N", "exp": 1000, "iat": 900, "sub": "u1" });
        assert_eq!(
            check_claims(&good, "https://id.example", "kbind", "N", 950),
            Ok(())
        );
        let with = |key: &str, value: Value| {
            let mut c = good.clone();
            c[key] = value;
            c
        };
        for (claims, now, says) in [
            (with("iss", json!("https://evil")), 950, "issuer"),
            (with("aud", json!("other")), 950, "not for client"),
            (with("aud", json!(["other", "kbind"])), 950, ""),
            (with("nonce", json!("M")), 950, "nonce"),
            (good.clone(), 1061, "expired"),
            (good.clone(), 1060, ""),
            (with("iat", json!(2000)), 950, "future"),
            (with("sub", json!("")), 950, "subject"),
        ] {
            let got = check_claims(&claims, "https://id.example", "kbind", "N", now);
            if says.is_empty() {
                assert_eq!(got, Ok(()), "{claims}");
            } else {
                assert!(
                    got.as_ref().is_err_and(|e| e.contains(says)),
                    "{claims}: {got:?}"
                );
            }
        }
    }

    #[test]
    fn the_username_is_the_prefixed_claim_and_an_unverified_email_is_no_name() {
        let claims = json!({ "email": "alice@example.org", "sub": "u1", "email_verified": true });
        assert_eq!(
            username(&claims, "email", "oidc:").unwrap(),
            "oidc:alice@example.org"
        );
        assert_eq!(username(&claims, "sub", "").unwrap(), "u1");
        let unverified = json!({ "email": "alice@example.org", "email_verified": false });
        assert!(
            username(&unverified, "email", "oidc:")
                .unwrap_err()
                .contains("not verified")
        );
        assert!(username(&json!({}), "email", "oidc:").is_err());
        assert!(username(&json!({ "email": "a\nb" }), "email", "").is_err());
    }

    #[test]
    fn a_token_verifies_only_with_rs256_and_a_published_key() {
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let none = format!(
            "{}.{}.",
            b64.encode(br#"{"alg":"none"}"#),
            b64.encode(br#"{"sub":"u"}"#)
        );
        assert!(verify(&none, &[]).unwrap_err().contains("not RS256"));
        let hs = format!(
            "{}.{}.sig",
            b64.encode(br#"{"alg":"HS256"}"#),
            b64.encode(br#"{"sub":"u"}"#)
        );
        assert!(verify(&hs, &[]).unwrap_err().contains("not RS256"));
        let rs = format!(
            "{}.{}.{}",
            b64.encode(br#"{"alg":"RS256","kid":"k"}"#),
            b64.encode(br#"{"sub":"u"}"#),
            b64.encode(b"forged")
        );
        let key = Jwk {
            kid: Some("k".into()),
            kty: "RSA".into(),
            n: Some(b64.encode([0xc5u8; 256])),
            e: Some(b64.encode([1u8, 0, 1])),
        };
        assert!(verify(&rs, &[key]).unwrap_err().contains("matches no key"));
        assert!(verify("a.b", &[]).unwrap_err().contains("not a signed JWT"));
    }
}
