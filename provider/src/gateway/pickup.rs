//! One-time pickups: a bind's answer is a URL that yields the bundle once, within its lifetime
//! ([`TTL`] unless the gateway is told otherwise; the record carries it, so every replica judges
//! it alike), and never again. The bundle itself is never stored: a pickup records only what was
//! asked for and by whom, and the credential is minted when the pickup is taken.
//!
//! The record is a Secret in the gateway's namespace — the store every replica shares, so any
//! replica answers any step and two replicas need nothing else installed. Secrets rather than a
//! CRD: nothing to install or upgrade, the API server's own expiry-free storage is enough for
//! minutes-long records the gateway collects itself, and Secrets are kept from the many roles
//! that may read ConfigMaps. Its name is a digest of the token, so neither a list of the
//! records nor the API server's audit log holds a token, and taking a pickup ends with a delete
//! preconditioned on the record's UID: the API server lets exactly one caller delete an object,
//! so a pickup raced from two replicas is taken once.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};
use kube::{Api, Client, ResourceExt};
use serde::{Deserialize, Serialize};
use sha2::Digest;

use super::request::TOKEN_BYTES;

/// How long a pickup may be taken, by default.
pub const TTL: Duration = Duration::from_secs(300);
/// The longest lifetime a record may carry.
pub const MAX_TTL: Duration = Duration::from_secs(3600);
/// The annotation carrying a record's lifetime in seconds.
pub const TTL_ANNOTATION: &str = "gateway.kbind.io/ttl-seconds";
/// Pickups a caller may hold at once: a caller's binds cost the provider's store a bounded
/// number of records.
pub const PER_CALLER: usize = 5;
/// The label every record carries (and the one its list selects).
pub const LABEL: &str = "gateway.kbind.io/pickup";
/// The label naming the caller (a digest: label values cannot hold every username).
pub const CALLER_LABEL: &str = "gateway.kbind.io/caller";
/// The records' Secret type.
pub const SECRET_TYPE: &str = "gateway.kbind.io/pickup";
/// The key holding the recorded request.
const KEY: &str = "request";

/// What a pickup records: what the caller asked for, and who it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The caller (the Grant's consumer identity).
    pub identity: String,
    /// The Export.
    pub export: String,
    /// The caller's cluster name, if it gave one.
    pub cluster_name: Option<String>,
    /// The Binding's namespace (else a ClusterBinding).
    pub namespace: Option<String>,
    /// The Connection's name.
    pub connection: Option<String>,
    /// The Secret's namespace on the consumer.
    pub secret_namespace: String,
    /// The Grant issued for it.
    pub grant: String,
}

/// A fresh token: [`TOKEN_BYTES`] from the operating system's CSPRNG, unpadded base64url.
pub fn new_token() -> Result<String, String> {
    let mut bytes = [0u8; TOKEN_BYTES];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness: {e}"))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// The record's name for `token`: a digest, never the token.
pub fn record_name(token: &str) -> String {
    let digest = sha2::Sha256::digest(token.as_bytes());
    format!("kbind-pickup-{}", hex(&digest[..20]))
}

/// A caller's label value: a digest of its username.
pub fn caller_label(identity: &str) -> String {
    hex(&sha2::Sha256::digest(identity.as_bytes())[..16])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The Secret recording `record` under `token`, to be taken within `ttl`.
pub fn secret(token: &str, record: &Record, ttl: Duration) -> Result<Secret, String> {
    let json = serde_json::to_string(record).map_err(|e| e.to_string())?;
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(record_name(token)),
            labels: Some(BTreeMap::from([
                (LABEL.to_owned(), "true".to_owned()),
                (CALLER_LABEL.to_owned(), caller_label(&record.identity)),
                (
                    "app.kubernetes.io/managed-by".to_owned(),
                    "kbind-gateway".to_owned(),
                ),
            ])),
            annotations: Some(BTreeMap::from([(
                TTL_ANNOTATION.to_owned(),
                ttl.as_secs().to_string(),
            )])),
            ..Default::default()
        },
        type_: Some(SECRET_TYPE.to_owned()),
        string_data: Some(BTreeMap::from([(KEY.to_owned(), json)])),
        ..Default::default()
    })
}

/// When a record stops being a pickup: its creation as the API server stamped it, plus the
/// lifetime it carries (at most [`MAX_TTL`]; [`TTL`] if it carries none).
pub fn expires(secret: &Secret) -> Option<Timestamp> {
    expires_at(&secret.metadata)
}

/// [`expires`] of a record's metadata.
fn expires_at(meta: &ObjectMeta) -> Option<Timestamp> {
    let created = meta.creation_timestamp.as_ref()?.0;
    let ttl = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(TTL_ANNOTATION))
        .and_then(|t| t.parse::<u64>().ok())
        .map_or(TTL, Duration::from_secs)
        .min(MAX_TTL);
    created.checked_add(ttl).ok()
}

/// What a taken record yields at `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// The request, to be issued now.
    Fresh(Record),
    /// Taken too late (410).
    Expired,
    /// Not a pickup record (someone else's Secret of that name): not ours to read (404).
    Foreign,
}

/// Decides what a record deleted at `now` yields.
pub fn judge(secret: &Secret, now: Timestamp) -> Taken {
    let ours = secret.type_.as_deref() == Some(SECRET_TYPE)
        && secret.labels().get(LABEL).map(String::as_str) == Some("true");
    if !ours {
        return Taken::Foreign;
    }
    match expires(secret) {
        Some(at) if now < at => {}
        _ => return Taken::Expired,
    }
    let record = secret
        .data
        .as_ref()
        .and_then(|d| d.get(KEY))
        .and_then(|v| serde_json::from_slice::<Record>(&v.0).ok());
    match record {
        Some(record) => Taken::Fresh(record),
        None => Taken::Foreign,
    }
}

/// Whether the record is past its expiry at `now` by a grace (a collector never races a taker
/// that is just inside the lifetime).
pub fn collectable(secret: &Secret, now: Timestamp) -> bool {
    expires(secret).is_some_and(|at| now > at + Duration::from_secs(60))
}

/// The pickup records of the gateway's namespace.
#[derive(Clone)]
pub struct Store {
    secrets: Api<Secret>,
    ttl: Duration,
}

/// Why a pickup could not be made or taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// The caller holds [`PER_CALLER`] pickups already (429).
    #[error("you hold {PER_CALLER} pickups not yet taken; take one or wait until they expire")]
    Full,
    /// No such pickup: taken already, or never made (404).
    #[error("no such pickup: it was taken already, or never existed")]
    Unknown,
    /// Taken too late (410).
    #[error("this pickup expired; bind again")]
    Expired,
    /// The API server did not answer (503).
    #[error("{0}")]
    Unavailable(String),
}

impl Store {
    /// The records in `namespace` of the provider `client` reaches; new ones last `ttl`.
    pub fn new(client: Client, namespace: &str, ttl: Duration) -> Self {
        Self {
            secrets: Api::namespaced(client, namespace),
            ttl: ttl.min(MAX_TTL),
        }
    }

    /// Records `record`; returns its token and expiry.
    pub async fn make(&self, record: &Record) -> Result<(String, Timestamp), Failure> {
        let selector = format!("{CALLER_LABEL}={}", caller_label(&record.identity));
        let held = self
            .secrets
            .list_metadata(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| Failure::Unavailable(format!("list pickups: {}", kind(&e))))?;
        let now = Timestamp::now();
        let live = held
            .items
            .iter()
            .filter(|m| expires_at(&m.metadata).is_none_or(|at| at > now))
            .count();
        if live >= PER_CALLER {
            return Err(Failure::Full);
        }
        let token = new_token().map_err(Failure::Unavailable)?;
        let made = self
            .secrets
            .create(
                &PostParams::default(),
                &secret(&token, record, self.ttl).map_err(Failure::Unavailable)?,
            )
            .await
            .map_err(|e| Failure::Unavailable(format!("record the pickup: {}", kind(&e))))?;
        let at = expires(&made).unwrap_or(now + self.ttl);
        Ok((token, at))
    }

    /// Takes the pickup of `token`: reads its record, then deletes it with its UID as the
    /// precondition — the API server lets one caller delete an object, so of two takers racing
    /// (on two replicas) one gets the record and the other finds none.
    pub async fn take(&self, token: &str) -> Result<Record, Failure> {
        let name = record_name(token);
        let unavailable =
            |e: kube::Error| Failure::Unavailable(format!("take the pickup: {}", kind(&e)));
        let secret = self
            .secrets
            .get_opt(&name)
            .await
            .map_err(unavailable)?
            .ok_or(Failure::Unknown)?;
        let taken = judge(&secret, Timestamp::now());
        if taken == Taken::Foreign {
            // Someone else's Secret of that name: neither read nor deleted.
            return Err(Failure::Unknown);
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: secret.uid(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self.secrets.delete(&name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {
                return Err(Failure::Unknown);
            }
            Err(e) => return Err(unavailable(e)),
        }
        match taken {
            Taken::Fresh(record) => Ok(record),
            Taken::Expired => Err(Failure::Expired),
            Taken::Foreign => Err(Failure::Unknown),
        }
    }

    /// Deletes the records past their expiry (each with its UID as precondition); returns how
    /// many went.
    pub async fn collect(&self) -> Result<usize, Failure> {
        let list = self
            .secrets
            .list(&ListParams::default().labels(&format!("{LABEL}=true")))
            .await
            .map_err(|e| Failure::Unavailable(format!("list pickups: {}", kind(&e))))?;
        let now = Timestamp::now();
        let mut gone = 0;
        for secret in list.items.iter().filter(|s| collectable(s, now)) {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: secret.uid(),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match self.secrets.delete(&secret.name_any(), &params).await {
                Ok(_) => gone += 1,
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => {
                    return Err(Failure::Unavailable(format!(
                        "collect pickups: {}",
                        kind(&e)
                    )));
                }
            }
        }
        Ok(gone)
    }
}

fn kind(error: &kube::Error) -> String {
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

    fn record() -> Record {
        Record {
            identity: "system:serviceaccount:team:alice".into(),
            export: "widgets".into(),
            cluster_name: None,
            namespace: None,
            connection: None,
            secret_namespace: "kbind".into(),
            grant: "kbind-0123456789".into(),
        }
    }

    /// The Secret as the API server stores it: `stringData` turned into `data`, a creation time.
    fn stored(token: &str, created: Timestamp) -> Secret {
        let mut s = secret(token, &record(), TTL).unwrap();
        let data = s.string_data.take().unwrap();
        s.data = Some(
            data.into_iter()
                .map(|(k, v)| (k, ByteString(v.into_bytes())))
                .collect(),
        );
        s.metadata.creation_timestamp = Some(Time(created));
        s
    }

    #[test]
    fn a_token_is_fresh_random_and_its_record_names_only_a_digest() {
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert_ne!(a, b);
        assert!(super::super::request::is_pickup_token(&a), "{a}");
        let s = secret(&a, &record(), TTL).unwrap();
        let text = serde_json::to_string(&s).unwrap();
        assert!(!text.contains(&a), "{text}");
        assert_eq!(s.name_any(), record_name(&a));
        assert_eq!(s.name_any().len(), "kbind-pickup-".len() + 40);
        let labels = serde_json::to_string(&s.metadata.labels).unwrap();
        assert!(
            !labels.contains("alice"),
            "the caller's label is a digest: {labels}"
        );
    }

    #[test]
    fn a_record_yields_its_request_within_five_minutes_then_is_expired() {
        let created: Timestamp = "2026-12-07T12:00:00Z".parse().unwrap();
        let s = stored("t", created);
        for (after, expected) in [
            (0, Taken::Fresh(record())),
            (299, Taken::Fresh(record())),
            (300, Taken::Expired),
            (3600, Taken::Expired),
        ] {
            let now = created + Duration::from_secs(after);
            assert_eq!(judge(&s, now), expected, "{after}s");
        }
        // Collected only a minute after it expired.
        assert!(!collectable(&s, created + Duration::from_secs(300)));
        assert!(!collectable(&s, created + Duration::from_secs(360)));
        assert!(collectable(&s, created + Duration::from_secs(361)));
    }

    #[test]
    fn a_record_carries_its_lifetime_bounded_by_an_hour() {
        let created: Timestamp = "2026-12-07T12:00:00Z".parse().unwrap();
        let at = |ttl: Option<&str>| {
            let mut s = stored("t", created);
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
            expires(&s).unwrap().duration_since(created).as_secs()
        };
        for (ttl, seconds) in [
            (Some("2"), 2),
            (Some("300"), 300),
            (Some("999999"), 3600),
            (Some("x"), 300),
            (None, 300),
        ] {
            assert_eq!(at(ttl), seconds, "{ttl:?}");
        }
    }

    #[test]
    fn a_secret_that_is_not_a_record_yields_nothing() {
        let created: Timestamp = "2026-12-07T12:00:00Z".parse().unwrap();
        let mut other_type = stored("t", created);
        other_type.type_ = Some("Opaque".into());
        let mut unlabelled = stored("t", created);
        unlabelled.metadata.labels = None;
        let mut garbled = stored("t", created);
        garbled.data = Some(BTreeMap::from([(KEY.into(), ByteString(b"{".to_vec()))]));
        let mut no_time = stored("t", created);
        no_time.metadata.creation_timestamp = None;
        for (what, s, expected) in [
            ("another type", other_type, Taken::Foreign),
            ("no label", unlabelled, Taken::Foreign),
            ("garbled", garbled, Taken::Foreign),
            ("no creation time", no_time, Taken::Expired),
        ] {
            assert_eq!(judge(&s, created), expected, "{what}");
        }
    }
}
