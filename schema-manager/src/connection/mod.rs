//! The Connection reconciler (REFERENCE-BEHAVIOUR §4 CONN, §5 ID, §6 DISC, §7 AUTO, §8 CDEL,
//! §11 HB): credentials → provider identity → pinning → heartbeat → discovery → autoBind →
//! status, with every status change persisted (QRK-1) and an Event per condition transition.

mod autobind;
mod cleanup;
pub mod heartbeat;
pub mod outcome;
mod renewal;
mod schemas;
mod secrets;
mod status;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kbind_shared::api::{Connection, ConnectionStatus};
use kbind_shared::conditions::{self, reasons, types};
use kbind_shared::identity::{IdentityError, cluster_identity_and_source};
use kbind_shared::keys;
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::caches::TermCaches;
use crate::changes::{Change, Kind, Topic};
use crate::context::Context;
use crate::discovery;
use crate::providers::{Provider, ProviderError};
use outcome::Outcome;
use schemas::{install_all, kept_crds, schema_in_sync};
use secrets::SecretWatches;
pub use status::Error;
use status::{State, write_status};

/// How long a deleting Connection waits between checks for bindings that still reference it.
const DRAIN_RECHECK: Duration = Duration::from_secs(2);

/// How long in-flight reconciles may run after shutdown begins.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Runs the Connection controller on this term's caches until `stop` is cancelled.
pub async fn run(ctx: Arc<Context>, caches: TermCaches, stop: CancellationToken) {
    kbind_shared::metrics::Metrics::init_counters(
        &ctx.metrics.reconcile_errors_total,
        "connection",
        &status::REASONS,
    );
    let client = ctx.client.clone();
    // A Connection's kubeconfig Secret or its provider's identity changed (identity watches
    // started in an earlier term announce too); every Connection after missed changes.
    let store = caches.connections.clone();
    let inputs = ctx
        .changes
        .subscribe(&[Topic::ConnectionInput, Topic::Cached(Kind::Crd)])
        .flat_map(move |change| {
            futures::stream::iter(match change {
                Some(Change::ConnectionInput(name)) => vec![ObjectRef::new(&name)],
                // A core CRD changed: whether it keeps kbind's fields is every Connection's
                // `Ready` (#53.6).
                Some(Change::Cached(Kind::Crd, key)) if crate::caches::core(&key.name) => store
                    .state()
                    .iter()
                    .map(|c| ObjectRef::from_obj(c.as_ref()))
                    .collect(),
                Some(_) => Vec::new(),
                None => store
                    .state()
                    .iter()
                    .map(|c| ObjectRef::from_obj(c.as_ref()))
                    .collect(),
            })
        });
    let state = Arc::new(State {
        secrets: SecretWatches::new(client.clone(), ctx.changes.clone()),
        recorder: Recorder::new(client.clone(), ctx.reporter.clone()),
        ctx,
    });
    let graceful = stop.clone();
    let store = caches.connections.clone();
    let controller =
        Controller::for_shared_stream(caches.triggers(Kind::Connection, store.clone()), store)
            .reconcile_on(inputs)
            .graceful_shutdown_on(async move { graceful.cancelled().await })
            .run(reconcile, error_policy, state)
            .for_each(|result| async move {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection reconcile");
                }
            });
    // In-flight reconciles get a bounded grace period after `stop`; then the controller is dropped.
    tokio::select! {
        _ = controller => {}
        _ = async { stop.cancelled().await; tokio::time::sleep(SHUTDOWN_GRACE).await } => {
            tracing::warn!("Connection reconciles did not finish within {SHUTDOWN_GRACE:?} of shutdown");
        }
    }
}

fn error_policy(connection: Arc<Connection>, error: &Error, state: Arc<State>) -> Action {
    state.ctx.count_error("connection", error);
    match error {
        Error::Draining(_) => Action::requeue(DRAIN_RECHECK),
        // A provider failure (discovery, a denied heartbeat) is retried with exponential backoff,
        // logged once per message, at most 4 discovery intervals apart (#33.8).
        Error::Provider(message) => {
            let key = format!("Connection {}", connection.name_any());
            let retry = state.ctx.retries.failed(&key, message);
            if retry.log {
                tracing::warn!(connection = %connection.name_any(), error = %kbind_shared::redact::remote(message), retry_in = ?retry.after, "provider request failed");
            }
            Action::requeue(retry.after.min(4 * state.ctx.settings.discovery_interval))
        }
        // A status write raced with another: retry at once, without a warning.
        Error::Consumer(kube::Error::Api(s)) if s.is_conflict() => {
            tracing::debug!(connection = %connection.name_any(), "write conflict; retrying");
            Action::requeue(Duration::from_millis(200))
        }
        e => {
            let key = format!("Connection {}", connection.name_any());
            Action::requeue(state.ctx.retry_after(&key, e))
        }
    }
}

async fn reconcile(connection: Arc<Connection>, state: Arc<State>) -> Result<Action, Error> {
    let name = connection.name_any();
    let reference = &connection.spec.kubeconfig_secret_ref;
    let api: Api<Connection> = Api::all(state.ctx.client.clone());

    let allowed = kbind_shared::credential::check_secret_namespace(
        reference,
        &state.ctx.settings.provider_secrets.namespaces,
    )
    .is_ok();
    if connection.meta().deletion_timestamp.is_none() && allowed {
        state
            .secrets
            .track(&name, &reference.namespace, &reference.name);
        // CONN-2.1: hold the Secret before anything else, so credentials outlive teardown.
        add_secret_finalizer(&state, &connection).await?;
    }
    let key = format!("Connection {name}");
    let result = crate::context::finalized(
        &api,
        connection,
        |c| apply(c, &state),
        |c| cleanup::cleanup(c, &state),
    )
    .await;
    if result.is_ok() {
        state.ctx.retries.succeeded(&key);
    }
    result
}

async fn add_secret_finalizer(state: &State, connection: &Connection) -> Result<(), Error> {
    let reference = &connection.spec.kubeconfig_secret_ref;
    let secrets: Api<Secret> = Api::namespaced(state.ctx.client.clone(), &reference.namespace);
    // From the Secret's watch once it has listed (the finalizer patch is guarded by the
    // resourceVersion it saw, so a stale copy only costs a retry), else read.
    let secret = match state.secrets.cached(&reference.namespace, &reference.name) {
        Some(cached) => cached.map(|s| s.as_ref().clone()),
        None => secrets.get_opt(&reference.name).await.ok().flatten(),
    };
    let Some(secret) = secret else {
        // Missing or unreadable: the status reports it (CONN-3).
        return Ok(());
    };
    kbind_shared::finalizers::set(&secrets, &secret, keys::CLEANUP_FINALIZER, true)
        .await
        .map_err(Error::Consumer)?;
    Ok(())
}

/// CONN-3 … CONN-13.
async fn apply(connection: Arc<Connection>, state: &State) -> Result<Action, Error> {
    let ctx = &state.ctx;
    let name = connection.name_any();
    let before = connection.status.clone().unwrap_or_default();
    let mut status = before.clone();
    let (outcome, provider_error) = connect(&connection, state, &mut status).await?;
    conditions_for(&mut status, &outcome, &connection);
    let core_lack = ctx.core_crds_lack();
    if let Some(ready) = outcome::core_schema_condition(core_lack.as_deref()) {
        let said = conditions::find(&before.conditions, types::READY).is_some_and(|r| {
            r.reason == reasons::CORE_SCHEMA_OUTDATED && r.message == ready.message
        });
        if !said {
            tracing::error!(connection = %name, "{}", ready.message);
        }
        conditions::set(
            &mut status.conditions,
            ready,
            connection.meta().generation,
            &Time(jiff::Timestamp::now()),
        );
    }
    let kept = kept_crds(ctx, &name).await.map_err(Error::Consumer)?;
    conditions::set(
        &mut status.conditions,
        autobind::unbound_condition(
            &status.missing_exports,
            &kept,
            ctx.settings.autobind_grace_period,
        ),
        connection.meta().generation,
        &Time(jiff::Timestamp::now()),
    );
    if let Outcome::Ready { not_installed, .. } = &outcome {
        let from_bindings = schema_in_sync(ctx, &connection.name_any())
            .await
            .map_err(Error::Consumer)?;
        let schema = outcome::not_installed_condition(not_installed).unwrap_or(from_bindings);
        conditions::set(
            &mut status.conditions,
            schema,
            connection.meta().generation,
            &Time(jiff::Timestamp::now()),
        );
    }

    expire_consent(ctx, &connection, &mut status).await?;

    ctx.metrics
        .connection_ready
        .with_label_values(&[&name])
        .set(
            if matches!(outcome, Outcome::Ready { .. }) && core_lack.is_none() {
                1.0
            } else {
                0.0
            },
        );
    ctx.metrics
        .connection_exported_apis
        .with_label_values(&[&name])
        .set(status.exported_apis.len() as f64);
    write_status(state, &connection, &before, status).await?;
    match provider_error {
        Some(e) => Err(Error::Provider(e)),
        None => Ok(Action::requeue(ctx.settings.discovery_interval)),
    }
}

/// #33.6: records which accepted breaking change is served since when, and prunes from the spec
/// an accepted entry whose schema was served and no longer is ([`crate::consent::review`]). The
/// spec write is a JSON patch that first tests the list it read, so a user's concurrent edit is
/// never overwritten (the next reconcile reviews again).
async fn expire_consent(
    ctx: &crate::context::Context,
    connection: &Connection,
    status: &mut ConnectionStatus,
) -> Result<(), Error> {
    let Some(crds) = ctx.managed_crds() else {
        return Ok(());
    };
    let name = connection.name_any();
    let served: std::collections::BTreeMap<String, String> = crds
        .iter()
        .filter(|c| c.annotations().get(keys::CONNECTION_ANNOTATION) == Some(&name))
        .filter_map(|c| {
            let hash = c.annotations().get(keys::SCHEMA_HASH_ANNOTATION)?;
            Some((c.name_any(), hash.clone()))
        })
        .collect();
    let accepted = &connection.spec.schema.accepted_changes;
    let review = crate::consent::review(
        accepted,
        &status.applied_changes,
        &served,
        &Time(jiff::Timestamp::now()),
    );
    status.applied_changes = review.applied;
    if review.accepted != *accepted {
        let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
            { "op": "test", "path": "/spec/schema/acceptedChanges", "value": accepted },
            { "op": "replace", "path": "/spec/schema/acceptedChanges", "value": review.accepted },
        ]))
        .map_err(|e| Error::Consumer(kube::Error::SerdeError(e)))?;
        let pruned: Vec<String> = accepted
            .iter()
            .filter(|a| !review.accepted.contains(a))
            .map(|a| format!("{} {}", a.api, a.schema_hash))
            .collect();
        match Api::<Connection>::all(ctx.client.clone())
            .patch(
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::<()>::Json(patch),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(connection = %name, pruned = ?pruned, "accepted schema changes no longer served were pruned");
            }
            // The list changed meanwhile (the test failed): reviewed again next time.
            Err(kube::Error::Api(s)) if s.code == 422 || s.is_conflict() => {}
            Err(e) => return Err(Error::Consumer(e)),
        }
    }
    Ok(())
}

fn conditions_for(status: &mut ConnectionStatus, outcome: &Outcome, connection: &Connection) {
    outcome::apply(
        &mut status.conditions,
        outcome,
        connection.meta().generation,
        &Time(jiff::Timestamp::now()),
    );
}

/// Walks the steps of CONN-3 … CONN-10, recording UIDs and exports in `status`. Returns the
/// outcome, and an error to retry with backoff after the status is written (CONN-7).
async fn connect(
    connection: &Connection,
    state: &State,
    status: &mut ConnectionStatus,
) -> Result<(Outcome, Option<String>), Error> {
    let ctx = &state.ctx;
    let name = connection.name_any();

    // CONN-3: credentials.
    let reference = &connection.spec.kubeconfig_secret_ref;
    let credential = match crate::providers::read_credential_cached(
        &ctx.client,
        reference,
        &ctx.settings.provider_secrets,
        state.secrets.cached(&reference.namespace, &reference.name),
    )
    .await
    {
        Ok(found) => found,
        Err(message) => return Ok((Outcome::SecretInvalid(message), None)),
    };
    let provider = match ctx.providers.build(&name, credential, &ctx.metrics).await {
        Ok(provider) => provider,
        Err(message) => return Ok((Outcome::SecretInvalid(message), None)),
    };

    // CONN-4: provider identity — as the identity watch of this verified client shows it for
    // certain, else read (two GETs).
    let (remote_uid, read_from) = match provider.watched_identity() {
        Some(uid) => (uid, None),
        None => match cluster_identity_and_source(&provider.client).await {
            Ok((uid, source)) => (uid, Some(source)),
            Err(e @ IdentityError::Forbidden { .. }) => {
                return Ok((Outcome::IdentityForbidden(e.to_string()), None));
            }
            Err(e) => {
                return Ok((
                    Outcome::Unreachable(format!(
                        "provider {}: {}",
                        kbind_shared::redact::strip_userinfo(provider.kubeconfig.server()),
                        kbind_shared::redact::remote(&e.to_string())
                    )),
                    None,
                ));
            }
        },
    };
    // CONN-5: consumer identity.
    let local_uid = ctx.local_identity().await.map_err(Error::LocalIdentity)?;

    // CONN-6: pinning.
    if !status.remote_cluster_uid.is_empty() && status.remote_cluster_uid != remote_uid {
        let pinned = status.remote_cluster_uid.clone();
        return Ok((
            Outcome::IdentityChanged {
                current: remote_uid,
                pinned,
            },
            None,
        ));
    }
    status.remote_cluster_uid = remote_uid;
    if status.local_cluster_uid.is_empty() {
        status.local_cluster_uid = local_uid;
    }
    // Only now may this credential be used for writes, here and by the syncers.
    status.verified_credential = provider.digest.clone();
    ctx.providers.verified(&name, &provider);
    // From now on the identity object is watched: the next checks read nothing, and a change of
    // what the credential reaches reconciles the Connection at once.
    if let Some(source) = read_from {
        ctx.providers.watch_identity(&provider, source, connection);
    }
    // A bound token is renewed before it expires (#51); the Secret's change then brings the new
    // one here, verified like any credential.
    renewal::renew_if_due(state, connection, &provider).await;

    // CONN-10: the heartbeat, renewed as soon as the provider's identity is verified — before
    // discovery, so that a failing discovery or autoBind never makes a live consumer look dead to
    // whoever reads the Lease on the provider (#38; the reference renews only after a fully
    // successful reconcile, HB-1).
    let denied = renew_heartbeat(ctx, &provider, &name, &status.local_cluster_uid).await;

    // CONN-7: discovery.
    let exports = match discovery::discover(
        &provider,
        &ctx.documents,
        &connection.spec.schema,
        connection
            .status
            .as_ref()
            .and_then(|s| s.active_schema_source),
    )
    .await
    {
        Ok(exports) => exports,
        Err(ProviderError::Forbidden(message)) => {
            return Ok((Outcome::DiscoveryForbidden(message), None));
        }
        Err(ProviderError::Failed(message)) => {
            return Ok((Outcome::DiscoveryFailed(message.clone()), Some(message)));
        }
    };
    status.active_schema_source = Some(exports.source);
    status.exported_apis = exports.apis;

    // CONN-8: pullPolicy All installs every export now (create, and update unless Once); an
    // export that cannot be installed is named in SchemaInSync, the others and the Connection go on.
    let not_installed = if connection.spec.schema.pull_policy == kbind_shared::api::PullPolicy::All
    {
        install_all(ctx, &provider, connection, status).await
    } else {
        Vec::new()
    };

    // CONN-9: autoBind (and removal of the owned ClusterBinding when it is turned off, LIM-12),
    // with a wall-clock grace for missing exports.
    let cached = ctx.cached_cluster_binding(&name);
    match autobind::reconcile(
        &ctx.client,
        connection,
        status,
        ctx.settings.autobind_grace_period,
        cached.as_deref(),
    )
    .await
    {
        Ok(dropped) => {
            for api in dropped {
                let note = format!(
                    "{api} was missing from the provider's exports for longer than {}; autoBind no longer binds it. Its CRD and objects are kept",
                    humantime::format_duration(ctx.settings.autobind_grace_period)
                );
                tracing::info!(connection = %name, %api, "autoBind dropped an API after its grace period");
                state
                    .event(
                        connection,
                        EventType::Warning,
                        "AutoBindDropped",
                        "AutoBind",
                        &note,
                    )
                    .await;
            }
        }
        Err(message) => {
            return Ok((Outcome::DiscoveryFailed(message.clone()), Some(message)));
        }
    }

    let server = provider.kubeconfig.server().to_owned();
    Ok((
        Outcome::Ready {
            server,
            exported: status.exported_apis.len(),
            not_installed,
            denied: denied.clone(),
        },
        denied,
    ))
}

/// After a takeover, the Go konnector's Lease of this consumer is renewed beside kbind's while it
/// exists (#53.3): a reaper that knows only the Go name never reads a live consumer as dead.
/// Logged when that starts or stops; a failure is logged and retried at the next renewal.
async fn renew_go_heartbeat(ctx: &Context, provider: &Provider, name: &str, local_uid: &str) {
    use kbind_shared::heartbeat::{GO_LEASE_NAMESPACE, GoLease, go_lease_name};
    let lease = format!("{GO_LEASE_NAMESPACE}/{}", go_lease_name(local_uid));
    match heartbeat::renew_go(
        &provider.client,
        provider.kubeconfig.server(),
        local_uid,
        &ctx.heartbeats,
    )
    .await
    {
        Ok(None) | Ok(Some(GoLease::Absent)) => {}
        Ok(Some(GoLease::Renew)) => {
            tracing::info!(connection = %name, %lease, "the Go konnector's heartbeat Lease is renewed beside kbind's until it is deleted")
        }
        Ok(Some(GoLease::NotThisConsumers)) => {
            tracing::warn!(connection = %name, %lease, "a Lease under the Go konnector's name for this consumer is held by another: left alone")
        }
        Err(e) => {
            tracing::info!(connection = %name, error = %kbind_shared::redact::remote(&e.to_string()), "the Go konnector's heartbeat Lease not renewed")
        }
    }
}

/// CONN-10: renews the Connection's heartbeat Lease. A failure is logged (HB-4); one RBAC denies
/// is returned as the `PermissionDenied` message (the watches that serve discovery stay open
/// after a credential's RBAC is revoked, so this renewal is what notices it) and retried with
/// backoff (#33.8).
async fn renew_heartbeat(
    ctx: &Context,
    provider: &Provider,
    name: &str,
    local_uid: &str,
) -> Option<String> {
    let namespace = heartbeat::lease_namespace(provider.kubeconfig.namespace());
    let timing = heartbeat::Timing {
        duration: ctx.settings.heartbeat_lease_duration,
        interval: ctx.settings.discovery_interval,
    };
    match heartbeat::renew(
        &provider.client,
        provider.kubeconfig.server(),
        namespace,
        name,
        local_uid,
        timing,
        &ctx.heartbeats,
    )
    .await
    {
        Ok(()) => {
            ctx.metrics.heartbeat_renewed(name);
            renew_go_heartbeat(ctx, provider, name, local_uid).await;
            None
        }
        Err(e) if e.forbidden => Some(format!(
            "the provider credential may not get/create/update leases (coordination.k8s.io) in namespace {namespace}: {}",
            kbind_shared::conditions::bounded(&e.message, 300)
        )),
        Err(e) => {
            tracing::info!(connection = %name, error = %kbind_shared::redact::remote(&e.to_string()), "heartbeat not renewed");
            None
        }
    }
}
