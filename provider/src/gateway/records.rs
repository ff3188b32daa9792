//! The gateway's state, kept where every replica sees it: short-lived records in the provider's
//! API server — one-time pickups of bundles, logins in progress, login sessions — so any replica
//! answers any step and two replicas need nothing else installed.
//!
//! Each record is a Secret in the gateway's namespace. Secrets rather than a CRD: nothing to
//! install or upgrade for records that live minutes, and Secrets are kept from the many roles
//! that may read ConfigMaps. A record's name is a digest of its token, so neither a list of the
//! records nor the API server's audit log holds a token; it carries its own lifetime (every
//! replica judges it alike, from the creation time the API server stamped); taking a record ends
//! with a delete preconditioned on its UID — the API server lets exactly one caller delete an
//! object, so a record raced from two replicas is taken once. Every replica collects expired
//! records.
//!
//! "Now" is the API server's time too, not the replica's: each replica measures the offset of
//! its clock from a time the API server stamps (a dry-run create at its first need and each
//! minute, and every record it makes), so a replica whose clock is off neither cuts nor stretches
//! a lifetime.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kbind_shared::sync::Locked;
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::Digest;

use super::request::TOKEN_BYTES;

/// The longest lifetime a record may carry.
pub const MAX_TTL: Duration = Duration::from_secs(3600);
/// The annotation carrying a record's lifetime in seconds.
pub const TTL_ANNOTATION: &str = "gateway.kbind.io/ttl-seconds";
/// The label every record carries, naming its kind (the one the collector selects by).
pub const LABEL: &str = "gateway.kbind.io/record";
/// The label naming the caller a record is for (a digest: label values cannot hold every
/// username).
pub const CALLER_LABEL: &str = "gateway.kbind.io/caller";
/// The key holding a record's content.
const KEY: &str = "record";

/// What a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A bind's one-time pickup.
    Pickup,
    /// A login in progress (its state, PKCE verifier, nonce, browser binding).
    Login,
    /// A logged-in browser.
    Session,
    /// A command line's login, handed over once for its verifier.
    Handoff,
}

impl Kind {
    /// Its label value and the suffix of its Secret type.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pickup => "pickup",
            Self::Login => "login",
            Self::Session => "session",
            Self::Handoff => "handoff",
        }
    }

    /// Its Secret type (the admission fence lets the gateway write Secrets of these types only).
    pub fn secret_type(self) -> String {
        format!("gateway.kbind.io/{}", self.as_str())
    }

    /// What a caller is told when there is no such record.
    pub fn unknown(self) -> &'static str {
        match self {
            Self::Pickup => "no such pickup: it was taken already, or never existed",
            Self::Login => {
                "no such login in progress: it was finished already, or expired; log in again"
            }
            Self::Session => "not logged in, or the session ended; log in again",
            Self::Handoff => {
                "no such login code: it was used already, or never existed; log in again"
            }
        }
    }

    /// What a caller is told when the record expired.
    pub fn expired(self) -> &'static str {
        match self {
            Self::Pickup => "this pickup expired; bind again",
            Self::Login => "this login took too long; log in again",
            Self::Session => "the session ended; log in again",
            Self::Handoff => "this login code expired; log in again",
        }
    }
}

/// A fresh token: [`TOKEN_BYTES`] from the operating system's CSPRNG, unpadded base64url.
pub fn new_token() -> Result<String, String> {
    let mut bytes = [0u8; TOKEN_BYTES];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness: {e}"))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// The record's name for `token`: a digest, never the token.
pub fn record_name(kind: Kind, token: &str) -> String {
    let digest = sha2::Sha256::digest(token.as_bytes());
    format!("kbind-{}-{}", kind.as_str(), hex(&digest[..20]))
}

/// A digest of `text`, as hex (a caller's label value, a browser binding).
pub fn digest(text: &str) -> String {
    hex(&sha2::Sha256::digest(text.as_bytes())[..16])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The Secret recording `content` of `kind` under `token`, to be used within `ttl`, for `caller`.
pub fn secret<T: Serialize>(
    kind: Kind,
    token: &str,
    content: &T,
    ttl: Duration,
    caller: Option<&str>,
) -> Result<Secret, String> {
    let json = serde_json::to_string(content).map_err(|e| e.to_string())?;
    let mut labels = BTreeMap::from([
        (LABEL.to_owned(), kind.as_str().to_owned()),
        (
            "app.kubernetes.io/managed-by".to_owned(),
            "kbind-gateway".to_owned(),
        ),
    ]);
    if let Some(caller) = caller {
        labels.insert(CALLER_LABEL.to_owned(), digest(caller));
    }
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(record_name(kind, token)),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                TTL_ANNOTATION.to_owned(),
                ttl.min(MAX_TTL).as_secs().to_string(),
            )])),
            ..Default::default()
        },
        type_: Some(kind.secret_type()),
        string_data: Some(BTreeMap::from([(KEY.to_owned(), json)])),
        ..Default::default()
    })
}

/// When a record stops being usable: its creation as the API server stamped it, plus the
/// lifetime it carries (at most [`MAX_TTL`]; `fallback` if it carries none).
pub fn expires(meta: &ObjectMeta, fallback: Duration) -> Option<Timestamp> {
    let created = meta.creation_timestamp.as_ref()?.0;
    let ttl = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(TTL_ANNOTATION))
        .and_then(|t| t.parse::<u64>().ok())
        .map_or(fallback, Duration::from_secs)
        .min(MAX_TTL);
    created.checked_add(ttl).ok()
}

/// What a record yields at a moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read<T> {
    /// Its content.
    Fresh(T),
    /// Too late (410, or 401 for a session).
    Expired,
    /// Not a record of that kind (someone else's Secret of that name): not ours to read.
    Foreign,
}

/// The kind of record `secret` is: its label names a kind and its type is that kind's. Anything
/// else — a Secret someone else made or labelled — is not the gateway's to read or delete.
pub fn kind_of(secret: &Secret) -> Option<Kind> {
    let label = secret.labels().get(LABEL)?;
    [Kind::Pickup, Kind::Login, Kind::Session, Kind::Handoff]
        .into_iter()
        .find(|k| k.as_str() == label)
        .filter(|k| secret.type_.as_deref() == Some(k.secret_type().as_str()))
}

/// Decides what a `kind` record yields at `now`.
pub fn judge<T: DeserializeOwned>(kind: Kind, secret: &Secret, now: Timestamp) -> Read<T> {
    if kind_of(secret) != Some(kind) {
        return Read::Foreign;
    }
    match expires(&secret.metadata, MAX_TTL) {
        Some(at) if now < at => {}
        _ => return Read::Expired,
    }
    let content = secret
        .data
        .as_ref()
        .and_then(|d| d.get(KEY))
        .and_then(|v| serde_json::from_slice::<T>(&v.0).ok());
    match content {
        Some(content) => Read::Fresh(content),
        None => Read::Foreign,
    }
}

/// Whether `secret` is a record past its expiry at `now` by a grace (a collector never races a
/// taker that is just inside the lifetime). Only the gateway's records are ever collectable.
pub fn collectable(secret: &Secret, now: Timestamp) -> bool {
    kind_of(secret).is_some()
        && expires(&secret.metadata, MAX_TTL).is_some_and(|at| now > at + Duration::from_secs(60))
}

/// Why a record could not be made or used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// The caller holds as many records of the kind as it may (429).
    #[error("you hold {0} pickups not yet taken; take one or wait until they expire")]
    Full(usize),
    /// No such record (404; a session: 401).
    #[error("{}", .0.unknown())]
    Unknown(Kind),
    /// Used too late (410; a session: 401).
    #[error("{}", .0.expired())]
    Expired(Kind),
    /// The API server did not answer (503).
    #[error("{0}")]
    Unavailable(String),
}

/// The records of the gateway's namespace.
#[derive(Clone)]
pub struct Store {
    secrets: Api<Secret>,
    /// A test's offset for the host's clock (zero otherwise).
    host_offset: SignedDuration,
    /// How far the API server's clock is ahead of the host's, as last measured.
    server_offset: Arc<Mutex<Option<SignedDuration>>>,
    /// Held while the first measurement is made: requests arriving together make one.
    first_measure: Arc<tokio::sync::Mutex<()>>,
}

impl Store {
    /// The records in `namespace` of the provider `client` reaches; `host_offset` moves the
    /// host's clock (tests only: no verdict may change by it).
    pub fn new(client: Client, namespace: &str, host_offset: SignedDuration) -> Self {
        Self {
            secrets: Api::namespaced(client, namespace),
            host_offset,
            server_offset: Arc::default(),
            first_measure: Arc::default(),
        }
    }

    /// The API server's time now, by the offset last measured (measured first if never).
    pub async fn now(&self) -> Result<Timestamp, Failure> {
        let known = *self.server_offset.locked();
        let offset = match known {
            Some(offset) => offset,
            None => {
                let _first = self.first_measure.lock().await;
                let measured = *self.server_offset.locked();
                match measured {
                    Some(offset) => offset,
                    None => self.measure().await?,
                }
            }
        };
        let host = crate::clock::host_now(self.host_offset);
        Ok(host.checked_add(offset).unwrap_or(host))
    }

    /// Measures the API server's clock: a dry-run create of a record (nothing is stored, nothing
    /// watched sees it) comes back with the time the server stamped on it.
    pub async fn measure(&self) -> Result<SignedDuration, Failure> {
        let token = new_token().map_err(Failure::Unavailable)?;
        let probe = secret(Kind::Pickup, &token, &(), Duration::from_secs(1), None)
            .map_err(Failure::Unavailable)?;
        let asked = crate::clock::host_now(self.host_offset);
        let made = self
            .secrets
            .create(
                &PostParams {
                    dry_run: true,
                    ..Default::default()
                },
                &probe,
            )
            .await
            .map_err(|e| {
                Failure::Unavailable(format!("read the API server's clock: {}", describe(&e)))
            })?;
        self.learn(&made.metadata, asked).ok_or_else(|| {
            Failure::Unavailable("the API server stamped no creation time on a dry run".into())
        })
    }

    /// Learns the server's offset from `meta`, created on a request sent at `asked`.
    fn learn(&self, meta: &ObjectMeta, asked: Timestamp) -> Option<SignedDuration> {
        let stamped = meta.creation_timestamp.as_ref()?.0;
        let offset = crate::clock::server_offset(stamped, asked);
        *self.server_offset.locked() = Some(offset);
        Some(offset)
    }

    /// Records `content` of `kind` for `ttl`; with `cap`, refused when `caller` holds that many
    /// live records of the kind already. Returns its token and expiry.
    pub async fn make<T: Serialize>(
        &self,
        kind: Kind,
        content: &T,
        ttl: Duration,
        caller: Option<&str>,
        cap: Option<usize>,
    ) -> Result<(String, Timestamp), Failure> {
        let now = self.now().await?;
        if let (Some(caller), Some(cap)) = (caller, cap) {
            let selector = format!(
                "{LABEL}={},{CALLER_LABEL}={}",
                kind.as_str(),
                digest(caller)
            );
            let held = self
                .secrets
                .list_metadata(&ListParams::default().labels(&selector))
                .await
                .map_err(|e| Failure::Unavailable(format!("list records: {}", describe(&e))))?;
            let live = held
                .items
                .iter()
                .filter(|m| expires(&m.metadata, MAX_TTL).is_none_or(|at| at > now))
                .count();
            if live >= cap {
                return Err(Failure::Full(cap));
            }
        }
        let token = new_token().map_err(Failure::Unavailable)?;
        let asked = crate::clock::host_now(self.host_offset);
        let made = self
            .secrets
            .create(
                &PostParams::default(),
                &secret(kind, &token, content, ttl, caller).map_err(Failure::Unavailable)?,
            )
            .await
            .map_err(|e| {
                Failure::Unavailable(format!("record the {}: {}", kind.as_str(), describe(&e)))
            })?;
        self.learn(&made.metadata, asked);
        let at = expires(&made.metadata, ttl).unwrap_or(now + ttl.min(MAX_TTL));
        Ok((token, at))
    }

    /// The `kind` record of `token`, left in place (a session is read on every call).
    pub async fn read<T: DeserializeOwned>(&self, kind: Kind, token: &str) -> Result<T, Failure> {
        let secret = self.get(kind, token).await?;
        match judge(kind, &secret, self.now().await?) {
            Read::Fresh(content) => Ok(content),
            Read::Expired => Err(Failure::Expired(kind)),
            Read::Foreign => Err(Failure::Unknown(kind)),
        }
    }

    async fn get(&self, kind: Kind, token: &str) -> Result<Secret, Failure> {
        self.secrets
            .get_opt(&record_name(kind, token))
            .await
            .map_err(|e| {
                Failure::Unavailable(format!("read the {}: {}", kind.as_str(), describe(&e)))
            })?
            .ok_or(Failure::Unknown(kind))
    }

    /// Takes the `kind` record of `token`: reads it and, if `accept` agrees, deletes it with its
    /// UID as the precondition — of two takers racing (on two replicas) one gets it and the
    /// other finds none. A record `accept` refuses is left as it was.
    pub async fn take<T: DeserializeOwned, E>(
        &self,
        kind: Kind,
        token: &str,
        accept: impl FnOnce(&T) -> Result<(), E>,
    ) -> Result<Result<T, E>, Failure> {
        let secret = self.get(kind, token).await?;
        let read = judge::<T>(kind, &secret, self.now().await?);
        if matches!(read, Read::Foreign) {
            // Someone else's Secret of that name: neither read nor deleted.
            return Err(Failure::Unknown(kind));
        }
        if let Read::Fresh(content) = &read
            && let Err(refused) = accept(content)
        {
            return Ok(Err(refused));
        }
        self.delete(&secret).await.map_err(|e| match e {
            None => Failure::Unknown(kind),
            Some(e) => {
                Failure::Unavailable(format!("take the {}: {}", kind.as_str(), describe(&e)))
            }
        })?;
        match read {
            Read::Fresh(content) => Ok(Ok(content)),
            Read::Expired => Err(Failure::Expired(kind)),
            Read::Foreign => Err(Failure::Unknown(kind)),
        }
    }

    /// Ends the `kind` record of `token`, if there is one.
    pub async fn end(&self, kind: Kind, token: &str) -> Result<(), Failure> {
        match self.get(kind, token).await {
            // Someone else's Secret of that name: not ours to delete.
            Ok(secret) if kind_of(&secret) != Some(kind) => Ok(()),
            Ok(secret) => self.delete(&secret).await.or_else(|e| match e {
                None => Ok(()),
                Some(e) => Err(Failure::Unavailable(describe(&e))),
            }),
            Err(Failure::Unknown(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Deletes `secret` if it is still that object: `Err(None)` when someone else did first.
    async fn delete(&self, secret: &Secret) -> Result<(), Option<kube::Error>> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: secret.uid(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self.secrets.delete(&secret.name_any(), &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Err(None),
            Err(e) => Err(Some(e)),
        }
    }

    /// Deletes the records past their expiry (read whole: a record is known by its type as well
    /// as its label) by the API server's clock, measured again first; returns how many went.
    pub async fn collect(&self) -> Result<usize, Failure> {
        self.measure().await?;
        let list = self
            .secrets
            .list(&ListParams::default().labels(LABEL))
            .await
            .map_err(|e| Failure::Unavailable(format!("list records: {}", describe(&e))))?;
        let now = self.now().await?;
        let mut gone = 0;
        for secret in list.items.iter().filter(|s| collectable(s, now)) {
            match self.delete(secret).await {
                Ok(()) => gone += 1,
                Err(None) => {}
                Err(Some(e)) => {
                    return Err(Failure::Unavailable(format!(
                        "collect records: {}",
                        describe(&e)
                    )));
                }
            }
        }
        Ok(gone)
    }
}

fn describe(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => {
            format!("{} {}: {}", status.code, status.reason, status.message)
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde::Deserialize;

    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    struct Content {
        identity: String,
    }

    fn content() -> Content {
        Content {
            identity: "system:serviceaccount:team:alice".into(),
        }
    }

    /// The Secret as the API server stores it: `stringData` turned into `data`, a creation time.
    fn stored(kind: Kind, token: &str, ttl: Duration, created: Timestamp) -> Secret {
        let mut s = secret(kind, token, &content(), ttl, Some(&content().identity)).unwrap();
        let data = s.string_data.take().unwrap();
        s.data = Some(
            data.into_iter()
                .map(|(k, v)| (k, ByteString(v.into_bytes())))
                .collect(),
        );
        s.metadata.creation_timestamp = Some(Time(created));
        s
    }

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn a_token_is_fresh_random_and_its_record_names_only_a_digest() {
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert_ne!(a, b);
        assert!(super::super::request::is_pickup_token(&a), "{a}");
        let s = secret(
            Kind::Pickup,
            &a,
            &content(),
            Duration::from_secs(300),
            Some("alice"),
        )
        .unwrap();
        let text = serde_json::to_string(&s).unwrap();
        assert!(!text.contains(&a), "{text}");
        assert_eq!(s.name_any(), record_name(Kind::Pickup, &a));
        assert_eq!(s.name_any().len(), "kbind-pickup-".len() + 40);
        assert_ne!(record_name(Kind::Login, &a), record_name(Kind::Session, &a));
        let labels = serde_json::to_string(&s.metadata.labels).unwrap();
        assert!(
            !labels.contains("alice"),
            "the caller's label is a digest: {labels}"
        );
        assert_eq!(s.type_.as_deref(), Some("gateway.kbind.io/pickup"));
    }

    #[test]
    fn a_record_yields_its_content_within_its_lifetime_then_is_expired() {
        let created = at("2026-12-07T12:00:00Z");
        let s = stored(Kind::Pickup, "t", Duration::from_secs(300), created);
        for (after, expected) in [
            (0, Read::Fresh(content())),
            (299, Read::Fresh(content())),
            (300, Read::Expired),
            (3600, Read::Expired),
        ] {
            let now = created + Duration::from_secs(after);
            assert_eq!(judge(Kind::Pickup, &s, now), expected, "{after}s");
        }
        // Collected only a minute after it expired, and only when it is the gateway's record: a
        // Secret someone else labelled (another type, an unknown kind) is never collected.
        assert!(!collectable(&s, created + Duration::from_secs(360)));
        assert!(collectable(&s, created + Duration::from_secs(361)));
        let mut labelled = s.clone();
        labelled.type_ = Some("Opaque".into());
        assert!(!collectable(&labelled, created + Duration::from_secs(3600)));
        let mut unknown = s.clone();
        unknown
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(LABEL.into(), "other".into());
        assert!(!collectable(&unknown, created + Duration::from_secs(3600)));
    }

    #[test]
    fn a_record_carries_its_lifetime_bounded_by_an_hour() {
        let created = at("2026-12-07T12:00:00Z");
        let lifetime = |ttl: Option<&str>| {
            let mut s = stored(Kind::Session, "t", Duration::from_secs(1), created);
            match ttl {
                Some(ttl) => {
                    s.metadata
                        .annotations
                        .as_mut()
                        .unwrap()
                        .insert(TTL_ANNOTATION.into(), ttl.into());
                }
                None => s.metadata.annotations = None,
            }
            expires(&s.metadata, Duration::from_secs(300))
                .unwrap()
                .duration_since(created)
                .as_secs()
        };
        for (ttl, seconds) in [
            (Some("2"), 2),
            (Some("300"), 300),
            (Some("999999"), 3600),
            (Some("x"), 300),
            (None, 300),
        ] {
            assert_eq!(lifetime(ttl), seconds, "{ttl:?}");
        }
        let made = secret(
            Kind::Login,
            "t",
            &content(),
            Duration::from_secs(99_999),
            None,
        )
        .unwrap();
        assert_eq!(made.annotations()[TTL_ANNOTATION], "3600");
    }

    #[test]
    fn a_secret_that_is_not_a_record_of_the_kind_yields_nothing() {
        let created = at("2026-12-07T12:00:00Z");
        let ttl = Duration::from_secs(300);
        let mut other_type = stored(Kind::Pickup, "t", ttl, created);
        other_type.type_ = Some("Opaque".into());
        let mut unlabelled = stored(Kind::Pickup, "t", ttl, created);
        unlabelled.metadata.labels = None;
        let mut garbled = stored(Kind::Pickup, "t", ttl, created);
        garbled.data = Some(BTreeMap::from([(KEY.into(), ByteString(b"{".to_vec()))]));
        let mut no_time = stored(Kind::Pickup, "t", ttl, created);
        no_time.metadata.creation_timestamp = None;
        let session = stored(Kind::Session, "t", ttl, created);
        for (what, s, expected) in [
            ("another type", other_type, Read::Foreign),
            ("no label", unlabelled, Read::Foreign),
            ("garbled", garbled, Read::Foreign),
            ("another kind", session, Read::Foreign),
            ("no creation time", no_time, Read::Expired),
        ] {
            assert_eq!(
                judge::<Content>(Kind::Pickup, &s, created),
                expected,
                "{what}"
            );
        }
    }
}
