//! Deleting a Connection (REFERENCE-BEHAVIOUR CDEL-1 … CDEL-5): only the ClusterBinding autoBind
//! made for it goes, kbind waits for every other binding that references it, then marks the
//! heartbeat Lease as disconnected (the consumer left, it did not die — #38) and releases the
//! Secret's finalizer.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kbind_shared::api::{Binding, ClusterBinding, Connection};
use kbind_shared::conditions::{self, Desired, reasons, types};
use kbind_shared::keys;
use kube::api::ListParams;
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};

use super::autobind;
use super::status::{Error, State, write_status};

/// CDEL-1 … CDEL-5.
pub(super) async fn cleanup(connection: Arc<Connection>, state: &State) -> Result<Action, Error> {
    let client = &state.ctx.client;
    let name = connection.name_any();
    // Only the ClusterBinding this Connection controls; removing it keeps CRDs and objects.
    autobind::delete_owned(client, &connection)
        .await
        .map_err(Error::Provider)?;

    // CDEL-3: wait for every binding that references this Connection.
    let references = |spec_name: &str| spec_name == name;
    let cluster_bindings = Api::<ClusterBinding>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::Consumer)?;
    let bindings = Api::<Binding>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::Consumer)?;
    let count = cluster_bindings
        .items
        .iter()
        .filter(|b| references(&b.spec.connection_ref.name))
        .count()
        + bindings
            .items
            .iter()
            .filter(|b| references(&b.spec.connection_ref.name))
            .count();
    if count > 0 {
        let before = connection.status.clone().unwrap_or_default();
        let mut status = before.clone();
        let message =
            format!("waiting for {count} binding(s) that reference this Connection to be deleted");
        conditions::set(
            &mut status.conditions,
            Desired::new(types::READY, false, reasons::DRAINING_BINDINGS, message),
            connection.meta().generation,
            &Time(jiff::Timestamp::now()),
        );
        state
            .ctx
            .metrics
            .connection_ready
            .with_label_values(&[&name])
            .set(0.0);
        write_status(state, &connection, &before, status).await?;
        return Err(Error::Draining(count));
    }

    mark_disconnected(state, &connection).await;

    // CDEL-4: release the Secret unless another live Connection still uses it.
    let reference = &connection.spec.kubeconfig_secret_ref;
    let others = Api::<Connection>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::Consumer)?;
    let shared = others.items.iter().any(|other| {
        other.name_any() != name
            && other.meta().deletion_timestamp.is_none()
            && other.spec.kubeconfig_secret_ref.namespace == reference.namespace
            && other.spec.kubeconfig_secret_ref.name == reference.name
    });
    if !shared {
        remove_secret_finalizer(state, &connection).await?;
    }
    state.secrets.untrack(&name);
    state.ctx.providers.forget(&name);
    state.ctx.metrics.forget_connection(&name);
    // CDEL-5: the finalizer helper removes the Connection's own finalizer.
    Ok(Action::await_change())
}

/// Marks the Connection's heartbeat Lease as disconnected, through the client kept for it and
/// only while that client reaches the pinned provider (its identity as watched, else read now).
/// Best effort: a provider that cannot be reached or written never holds up the deletion (its
/// Lease then simply stops being renewed).
async fn mark_disconnected(state: &State, connection: &Connection) {
    let name = connection.name_any();
    let Some(status) = connection.status.as_ref() else {
        return;
    };
    let Some(provider) = state.ctx.providers.kept(&name) else {
        return;
    };
    let identity = match provider.watched_identity() {
        Some(identity) => Some(identity),
        None => kbind_shared::identity::cluster_identity(&provider.client)
            .await
            .ok(),
    };
    if status.remote_cluster_uid.is_empty()
        || identity.as_deref() != Some(&status.remote_cluster_uid)
    {
        tracing::info!(connection = %name, "the heartbeat Lease is not marked disconnected: the provider's identity is not the pinned one now");
        return;
    }
    let namespace = super::heartbeat::lease_namespace(provider.kubeconfig.namespace());
    if let Err(e) = super::heartbeat::disconnect(
        &provider.client,
        namespace,
        &name,
        &status.local_cluster_uid,
    )
    .await
    {
        tracing::info!(connection = %name, error = %kbind_shared::redact::remote(&e.to_string()), "the heartbeat Lease is not marked disconnected");
    }
}

async fn remove_secret_finalizer(state: &State, connection: &Connection) -> Result<(), Error> {
    let reference = &connection.spec.kubeconfig_secret_ref;
    let secrets: Api<Secret> = Api::namespaced(state.ctx.client.clone(), &reference.namespace);
    let Some(secret) = secrets
        .get_opt(&reference.name)
        .await
        .map_err(Error::Consumer)?
    else {
        return Ok(());
    };
    kbind_shared::finalizers::set(&secrets, &secret, keys::CLEANUP_FINALIZER, false)
        .await
        .map_err(Error::Consumer)?;
    Ok(())
}
