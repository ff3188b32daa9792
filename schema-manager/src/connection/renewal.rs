//! A provider credential that is a bound ServiceAccount token (a Grant's bundle, #51) is renewed
//! in process before it expires: once `--token-renewal-at` of its lifetime has passed, the
//! Connection's reconcile asks the provider for a new token for the same ServiceAccount and
//! lifetime — with the credential itself, which may create tokens for its own account only — and
//! writes the kubeconfig carrying it back into the Connection's Secret, so that the syncers (which
//! follow the Secret) and a restart use it. The old token stays valid until it expires: no gap.
//!
//! The write is a JSON patch that first tests the Secret's kubeconfig is still the one the
//! renewed token replaces: a Secret edited by hand meanwhile wins (it is read again, and its own
//! token, if bound, is renewed in its time). A token that does not expire (a long-lived Secret
//! token) is never touched.

use base64::Engine;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kbind_shared::api::Connection;
use kbind_shared::bound_token::{self, Claims};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};

use super::status::State;
use crate::providers::Provider;

/// What the renewal of a credential came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Renewal {
    /// Not a bound token, or not due yet.
    NotDue,
    /// A new token was written into the Secret.
    Renewed {
        /// When it expires (seconds since the epoch).
        expires_at: i64,
    },
    /// The Secret changed since it was read: left as it is.
    SecretChanged,
    /// The provider or the consumer refused: the message.
    Failed(String),
}

/// Whether the token `claims` describe is due for renewal at `now` (seconds since the epoch).
pub fn due(claims: &Claims, share: f64, now: i64) -> bool {
    now >= claims.renew_at(share)
}

/// The JSON patch that replaces the Secret's `key` holding `old` by `new`, only if it still holds
/// `old`.
pub fn secret_patch(key: &str, old: &[u8], new: &[u8]) -> serde_json::Value {
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let path = format!("/data/{}", key.replace('~', "~0").replace('/', "~1"));
    serde_json::json!([
        { "op": "test", "path": path, "value": b64(old) },
        { "op": "replace", "path": path, "value": b64(new) },
    ])
}

/// Renews `provider`'s credential — the one in `connection`'s Secret — if it is a bound token
/// that is due; an Event on the Connection says what happened when something did.
pub(super) async fn renew_if_due(
    state: &State,
    connection: &Connection,
    provider: &Provider,
) -> Renewal {
    let Some(token) = provider.kubeconfig.token() else {
        return Renewal::NotDue;
    };
    let Some(claims) = bound_token::claims(&token) else {
        return Renewal::NotDue;
    };
    let now = jiff::Timestamp::now().as_second();
    if !due(&claims, state.ctx.settings.token_renewal_at, now) {
        return Renewal::NotDue;
    }
    let outcome = renew(state, connection, provider, &claims).await;
    let (type_, reason, note) = match &outcome {
        Renewal::Renewed { expires_at } => (
            EventType::Normal,
            "CredentialRenewed",
            format!(
                "the provider token of ServiceAccount {}/{} was renewed; the new one expires at {}",
                claims.namespace,
                claims.service_account,
                jiff::Timestamp::from_second(*expires_at).unwrap_or_default()
            ),
        ),
        Renewal::Failed(message) => (
            EventType::Warning,
            "CredentialRenewalFailed",
            format!(
                "the provider token of ServiceAccount {}/{} expires at {} and could not be renewed: {message}",
                claims.namespace,
                claims.service_account,
                jiff::Timestamp::from_second(claims.expires_at).unwrap_or_default()
            ),
        ),
        Renewal::NotDue | Renewal::SecretChanged => return outcome,
    };
    let name = connection.name_any();
    let key = format!("Connection {name} renewal");
    if type_ == EventType::Normal {
        state.ctx.retries.succeeded(&key);
        tracing::info!(connection = %name, "{note}");
    } else if state.ctx.retries.is_new(&key, &note) {
        tracing::warn!(connection = %name, "{note}");
    } else {
        return outcome;
    }
    state
        .event(connection, type_, reason, "RenewCredential", &note)
        .await;
    outcome
}

async fn renew(
    state: &State,
    connection: &Connection,
    provider: &Provider,
    claims: &Claims,
) -> Renewal {
    let reference = &connection.spec.kubeconfig_secret_ref;
    let key = reference.effective_key();
    let secrets: Api<Secret> = Api::namespaced(state.ctx.client.clone(), &reference.namespace);
    let secret = match secrets.get_opt(&reference.name).await {
        Ok(Some(secret)) => secret,
        Ok(None) => return Renewal::SecretChanged,
        Err(e) => return Renewal::Failed(format!("cannot read its Secret: {e}")),
    };
    let Some(old) = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|d| d.0.clone())
    else {
        return Renewal::SecretChanged;
    };
    // Only the kubeconfig this client was built from is renewed.
    if kbind_shared::credential::digest(&old) != provider.digest {
        return Renewal::SecretChanged;
    }
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(claims.lifetime().max(600)),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let answer = Api::<ServiceAccount>::namespaced(provider.client.clone(), &claims.namespace)
        .create_token_request(&claims.service_account, &PostParams::default(), &request)
        .await;
    let token = match answer {
        Ok(answer) => answer.status.and_then(|s| s.token).unwrap_or_default(),
        Err(e) => {
            return Renewal::Failed(format!(
                "the provider refused a new token: {}",
                kbind_shared::redact::remote(&kbind_shared::identity::describe_error(&e))
            ));
        }
    };
    let Some(expires_at) = bound_token::claims(&token).map(|c| c.expires_at) else {
        return Renewal::Failed("the provider's answer is not a bound token".into());
    };
    let renewed = match provider.kubeconfig.with_token(&token) {
        Ok(text) => text,
        Err(e) => return Renewal::Failed(format!("cannot write the kubeconfig: {e}")),
    };
    let patch: json_patch::Patch =
        match serde_json::from_value(secret_patch(key, &old, renewed.as_bytes())) {
            Ok(patch) => patch,
            Err(e) => return Renewal::Failed(e.to_string()),
        };
    match secrets
        .patch(
            &reference.name,
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        )
        .await
    {
        Ok(_) => Renewal::Renewed { expires_at },
        // Edited meanwhile (the test failed): the edit wins.
        Err(kube::Error::Api(s)) if s.code == 422 || s.is_conflict() => Renewal::SecretChanged,
        Err(e) => Renewal::Failed(format!("cannot write its Secret: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_due_once_its_share_of_the_lifetime_has_passed() {
        let claims = Claims {
            issued_at: 1000,
            expires_at: 1600,
            namespace: "n".into(),
            service_account: "s".into(),
        };
        for (now, share, want) in [
            (1479, 0.8, false),
            (1480, 0.8, true),
            (1599, 0.8, true),
            (1005, 0.01, false),
            (1006, 0.01, true),
        ] {
            assert_eq!(due(&claims, share, now), want, "{now} at {share}");
        }
    }

    #[test]
    fn the_secret_patch_replaces_only_what_it_read() {
        let patch = secret_patch("kube/config~x", b"old", b"new");
        assert_eq!(
            patch,
            serde_json::json!([
                { "op": "test", "path": "/data/kube~1config~0x", "value": "b2xk" },
                { "op": "replace", "path": "/data/kube~1config~0x", "value": "bmV3" },
            ])
        );
        serde_json::from_value::<json_patch::Patch>(patch).unwrap();
    }
}
