//! The heartbeat Lease on the provider (REFERENCE-BEHAVIOUR §11, newer form HB-2/HB-3).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kbind_shared::keys;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// The field manager of kbind's heartbeat writes.
const FIELD_MANAGER: &str = "kbind-schema-manager";

use kbind_shared::heartbeat::{GO_LEASE_NAMESPACE, GoLease, go_lease_name};
pub use kbind_shared::heartbeat::{lease_name, lease_namespace};

/// When each heartbeat Lease was acquired, by provider server, namespace and name: read from the
/// provider once, then a renewal is one request (the apply) instead of a read and an apply. And
/// whether the Go konnector's Lease of a consumer is renewed beside it (by provider server and
/// consumer UID): read once per process, then renewed until it goes.
#[derive(Default)]
pub struct Acquired {
    times: std::sync::Mutex<std::collections::HashMap<String, MicroTime>>,
    go: std::sync::Mutex<std::collections::HashMap<String, GoLease>>,
}

impl Acquired {
    fn get(&self, key: &str) -> Option<MicroTime> {
        use kbind_shared::sync::Locked;
        self.times.locked().get(key).cloned()
    }

    fn set(&self, key: String, time: MicroTime) {
        use kbind_shared::sync::Locked;
        self.times.locked().insert(key, time);
    }

    fn go(&self, key: &str) -> Option<GoLease> {
        use kbind_shared::sync::Locked;
        self.go.locked().get(key).cloned()
    }

    fn set_go(&self, key: String, lease: GoLease) {
        use kbind_shared::sync::Locked;
        self.go.locked().insert(key, lease);
    }
}

/// How a heartbeat Lease is written: its duration and how often kbind renews it.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// `leaseDurationSeconds`.
    pub duration: Duration,
    /// The renew interval (the Connection's re-discovery period), in the Lease's
    /// [`keys::HEARTBEAT_INTERVAL_ANNOTATION`].
    pub interval: Duration,
}

/// Renews (creating if needed) the heartbeat Lease on the provider at `server`. Errors are for
/// logging only (HB-4).
pub async fn renew(
    provider: &Client,
    server: &str,
    namespace: &str,
    connection: &str,
    local_uid: &str,
    timing: Timing,
    acquired_times: &Acquired,
) -> Result<(), RenewError> {
    let leases: Api<Lease> = Api::namespaced(provider.clone(), namespace);
    let name = lease_name(connection, local_uid);
    let now = MicroTime(jiff::Timestamp::now());
    let key = format!("{server} {namespace}/{name}");
    let acquired = match acquired_times.get(&key) {
        Some(known) => known,
        None => leases
            .get_opt(&name)
            .await
            .map_err(|e| RenewError::of(format!("read heartbeat Lease {namespace}/{name}"), &e))?
            .and_then(|l| l.spec)
            .and_then(|s| s.acquire_time)
            .unwrap_or_else(|| now.clone()),
    };
    let lease_body = kbind_shared::heartbeat::lease_body(
        connection,
        local_uid,
        timing.duration.as_secs(),
        Some(timing.interval.as_secs()),
        Some(&acquired),
        &now,
    );
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut result = leases
        .patch(&name, &params, &Patch::Apply(&lease_body))
        .await;
    if matches!(&result, Err(kube::Error::Api(s)) if s.is_not_found()) {
        // The namespace is missing: create it once, not on every renewal.
        ensure_namespace(provider, namespace)
            .await
            .map_err(|message| RenewError {
                message,
                forbidden: false,
            })?;
        result = leases
            .patch(&name, &params, &Patch::Apply(&lease_body))
            .await;
    }
    // A Lease created by this very renewal (it was deleted since the time was remembered) is
    // acquired now, as a fresh read would have said: written again with that time.
    let recreated = |lease: &Lease| {
        lease
            .metadata
            .creation_timestamp
            .as_ref()
            .is_some_and(|created| created.0 > acquired.0)
    };
    if let Ok(lease) = &result
        && recreated(lease)
    {
        let mut again = lease_body.clone();
        again["spec"]["acquireTime"] = json!(now);
        result = leases.patch(&name, &params, &Patch::Apply(&again)).await;
        return result
            .map(|_| acquired_times.set(key, now))
            .map_err(|e| renew_error(namespace, &name, &e));
    }
    match result {
        Ok(_) => {
            acquired_times.set(key, acquired);
            Ok(())
        }
        Err(e) => Err(renew_error(namespace, &name, &e)),
    }
}

/// Renews the Go konnector's heartbeat Lease of the consumer `local_uid`
/// (`kbind/consumer-<uid>`) on the provider at `server` after a takeover (#53.3): read once per
/// process; renewed (its `renewTime` only, while its holder is this consumer) when it is this
/// consumer's; never created, and no longer renewed once it is gone or held by another. Returns
/// what was done, for a log line when it changed.
pub async fn renew_go(
    provider: &Client,
    server: &str,
    local_uid: &str,
    known: &Acquired,
) -> Result<Option<GoLease>, RenewError> {
    let leases: Api<Lease> = Api::namespaced(provider.clone(), GO_LEASE_NAMESPACE);
    let name = go_lease_name(local_uid);
    let key = format!("{server} {local_uid}");
    let (state, first) = match known.go(&key) {
        Some(state) => (state, false),
        None => {
            let found = match leases.get_opt(&name).await {
                Ok(found) => found,
                // A credential that may not read there cannot have renewed it either.
                Err(kube::Error::Api(s)) if s.is_forbidden() => None,
                Err(e) => {
                    return Err(RenewError::of(
                        format!("read the Go konnector's Lease {GO_LEASE_NAMESPACE}/{name}"),
                        &e,
                    ));
                }
            };
            let holder = found
                .as_ref()
                .map(|l| l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()));
            (kbind_shared::heartbeat::go_lease(holder, local_uid), true)
        }
    };
    if state != GoLease::Renew {
        known.set_go(key, state.clone());
        return Ok(first.then_some(state));
    }
    let now = MicroTime(jiff::Timestamp::now());
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let patch: json_patch::Patch = serde_json::from_value(kbind_shared::heartbeat::go_renewal(
        local_uid, &now,
    ))
    .map_err(|e| RenewError {
        message: e.to_string(),
        forbidden: false,
    })?;
    let after = match leases
        .patch(&name, &params, &Patch::<()>::Json(patch))
        .await
    {
        Ok(_) => GoLease::Renew,
        Err(kube::Error::Api(s)) if s.is_not_found() => GoLease::Absent,
        // The `test` of the holder failed: it is another's now.
        Err(kube::Error::Api(s)) if s.code == 422 => GoLease::NotThisConsumers,
        Err(e) => {
            return Err(RenewError::of(
                format!("renew the Go konnector's Lease {GO_LEASE_NAMESPACE}/{name}"),
                &e,
            ));
        }
    };
    let changed = first || after != GoLease::Renew;
    known.set_go(key, after.clone());
    Ok(changed.then_some(after))
}

/// Marks the heartbeat Lease of a Connection deleted in an orderly way (its bindings drained) with
/// [`keys::DISCONNECTED_ANNOTATION`]: the consumer left. A merge patch of that one annotation
/// (the renewals' own fields stay as they are); a Lease that is not there is left absent.
pub async fn disconnect(
    provider: &Client,
    namespace: &str,
    connection: &str,
    local_uid: &str,
) -> Result<(), RenewError> {
    let leases: Api<Lease> = Api::namespaced(provider.clone(), namespace);
    let name = lease_name(connection, local_uid);
    let now = jiff::Timestamp::now().to_string();
    let patch = json!({ "metadata": { "annotations": { keys::DISCONNECTED_ANNOTATION: now } } });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match leases.patch(&name, &params, &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(renew_error(namespace, &name, &e)),
    }
}

/// Why a heartbeat was not renewed; `forbidden` when the provider's RBAC said no (the
/// Connection then reports `PermissionDenied`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenewError {
    /// What failed, and the provider's answer.
    pub message: String,
    /// RBAC denied the request.
    pub forbidden: bool,
}

impl RenewError {
    fn of(what: String, e: &kube::Error) -> Self {
        Self {
            message: format!("{what}: {}", kbind_shared::identity::describe_error(e)),
            forbidden: matches!(e, kube::Error::Api(s) if s.is_forbidden()),
        }
    }
}

impl std::fmt::Display for RenewError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

fn renew_error(namespace: &str, name: &str, e: &kube::Error) -> RenewError {
    RenewError::of(format!("renew heartbeat Lease {namespace}/{name}"), e)
}

/// Creates the Lease's namespace on the provider unless it exists; Forbidden is tolerated (HB-2),
/// since restricted credentials usually may not create namespaces but the namespace may exist.
async fn ensure_namespace(provider: &Client, namespace: &str) -> Result<(), String> {
    let namespaces: Api<Namespace> = Api::all(provider.clone());
    let object = Namespace {
        metadata: ObjectMeta {
            name: Some(namespace.to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    match namespaces.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_already_exists() || s.is_forbidden() => Ok(()),
        Err(e) => Err(format!(
            "create heartbeat namespace {namespace}: {}",
            kbind_shared::identity::describe_error(&e)
        )),
    }
}
