//! Bound ServiceAccount tokens (the TokenRequest API's): what kbind reads of one to renew it before
//! it expires — its issue and expiry times and whose ServiceAccount it is. Read, not verified: the
//! token is this consumer's own credential, and the provider verifies every use of it.

use base64::Engine;
use serde::Deserialize;

/// What a bound token says of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// Issued at (seconds since the epoch).
    pub issued_at: i64,
    /// Expires at (seconds since the epoch).
    pub expires_at: i64,
    /// The ServiceAccount's namespace.
    pub namespace: String,
    /// The ServiceAccount's name.
    pub service_account: String,
}

#[derive(Deserialize)]
struct Payload {
    iat: Option<i64>,
    exp: Option<i64>,
    #[serde(rename = "kubernetes.io")]
    kubernetes: Option<Kubernetes>,
}

#[derive(Deserialize)]
struct Kubernetes {
    namespace: Option<String>,
    serviceaccount: Option<Named>,
}

#[derive(Deserialize)]
struct Named {
    name: Option<String>,
}

/// The claims of `token` when it is a bound ServiceAccount token that expires; `None` for
/// anything else (a long-lived Secret token has no expiry and is never renewed).
pub fn claims(token: &str) -> Option<Claims> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let payload: Payload = serde_json::from_slice(&bytes).ok()?;
    let kubernetes = payload.kubernetes?;
    let (issued_at, expires_at) = (payload.iat?, payload.exp?);
    (expires_at > issued_at).then_some(Claims {
        issued_at,
        expires_at,
        namespace: kubernetes.namespace?,
        service_account: kubernetes.serviceaccount?.name?,
    })
}

impl Claims {
    /// Its lifetime in seconds.
    pub fn lifetime(&self) -> i64 {
        self.expires_at - self.issued_at
    }

    /// When it is renewed: once `share` (0 < share < 1) of its lifetime has passed.
    pub fn renew_at(&self, share: f64) -> i64 {
        let share = share.clamp(0.0, 1.0);
        self.issued_at + (self.lifetime() as f64 * share) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(payload: serde_json::Value) -> String {
        let encode = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        format!(
            "{}.{}.signature",
            encode(br#"{"alg":"RS256"}"#),
            encode(payload.to_string().as_bytes())
        )
    }

    #[test]
    fn a_bound_token_says_when_it_expires_and_whose_it_is() {
        let bound = token(serde_json::json!({
            "iat": 1000, "exp": 1600, "sub": "system:serviceaccount:kbind-x:kbind-consumer",
            "kubernetes.io": { "namespace": "kbind-x", "serviceaccount": { "name": "kbind-consumer", "uid": "u" } },
        }));
        let claims = claims(&bound).expect("claims");
        assert_eq!(
            claims,
            Claims {
                issued_at: 1000,
                expires_at: 1600,
                namespace: "kbind-x".into(),
                service_account: "kbind-consumer".into(),
            }
        );
        assert_eq!(claims.lifetime(), 600);
        assert_eq!(claims.renew_at(0.8), 1480);
        assert_eq!(claims.renew_at(0.01), 1006);
        assert_eq!(claims.renew_at(7.0), 1600, "never after it expires");
    }

    #[test]
    fn anything_else_is_not_renewed() {
        // A legacy Secret token: no expiry.
        let legacy = token(serde_json::json!({
            "iss": "kubernetes/serviceaccount", "kubernetes.io/serviceaccount/namespace": "x",
        }));
        for other in [
            legacy.as_str(),
            "not-a-jwt",
            "a.b.c",
            "",
            &token(
                serde_json::json!({ "iat": 5, "exp": 5, "kubernetes.io": { "namespace": "x", "serviceaccount": { "name": "y" } } }),
            ),
            &token(serde_json::json!({ "iat": 5, "exp": 9 })),
        ] {
            assert_eq!(claims(other), None, "{other}");
        }
    }
}
