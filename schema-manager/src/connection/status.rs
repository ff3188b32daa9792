//! What the Connection controller's parts share: its state, why a reconcile did not finish, and
//! the status write (with an Event per condition transition).

use std::sync::Arc;

use kbind_shared::api::{Connection, ConnectionStatus};
use kbind_shared::identity::IdentityError;
use kube::api::PostParams;
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::finalizer;
use kube::{Api, ResourceExt};

use super::outcome;
use super::secrets::SecretWatches;
use crate::context::Context;

/// Why a reconcile did not finish; the controller retries with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request to the consumer cluster failed.
    #[error("consumer API: {0}")]
    Consumer(#[from] kube::Error),
    /// The consumer's own identity could not be read (CONN-5).
    #[error("consumer identity: {0}")]
    LocalIdentity(#[source] IdentityError),
    /// Bindings still reference a deleting Connection (CDEL-3): not a failure, a wait.
    #[error("{0} binding(s) still reference this Connection")]
    Draining(usize),
    /// Discovery or autoBind failed; already reported in the status.
    #[error("{0}")]
    Provider(String),
    /// The finalizer helper failed.
    #[error("finalizer: {0}")]
    Finalizer(#[from] Box<finalizer::Error<Error>>),
}

/// Every reason a failed Connection reconcile is counted under ([`Error`]'s metric labels).
pub const REASONS: [&str; 4] = ["consumer", "local_identity", "provider", "finalizer"];

impl crate::context::ReconcileError for Error {
    fn metric_label(&self) -> Option<&'static str> {
        Some(match self {
            Error::Draining(_) => return None,
            Error::Consumer(e) if crate::context::raced(e) => return None,
            Error::Consumer(_) => "consumer",
            Error::LocalIdentity(_) => "local_identity",
            Error::Provider(_) => "provider",
            Error::Finalizer(_) => "finalizer",
        })
    }
}

/// Per-controller state beyond the shared [`Context`].
pub(super) struct State {
    pub(super) ctx: Arc<Context>,
    pub(super) secrets: SecretWatches,
    pub(super) recorder: Recorder,
}

impl State {
    /// Publishes an Event of `type_` on `connection` (a failure to publish is only logged).
    pub(super) async fn event(
        &self,
        connection: &Connection,
        type_: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        let event = kube::runtime::events::Event {
            type_,
            reason: reason.into(),
            note: Some(kbind_shared::conditions::bounded(note, 1000)),
            action: action.into(),
            secondary: None,
        };
        let reference = kube::Resource::object_ref(connection, &());
        if let Err(e) = self.recorder.publish(&event, &reference).await {
            tracing::debug!(error = %e, "cannot publish Event");
        }
    }
}

/// CONN-12, without QRK-1: any status change is written (optimistically locked on the
/// resourceVersion the reconcile read), and each condition transition becomes an Event.
pub(super) async fn write_status(
    state: &State,
    connection: &Connection,
    before: &ConnectionStatus,
    status: ConnectionStatus,
) -> Result<(), Error> {
    if *before == status {
        return Ok(());
    }
    let transitions = outcome::transitions(&before.conditions, &status.conditions);
    let mut updated = connection.clone();
    updated.status = Some(status);
    Api::<Connection>::all(state.ctx.client.clone())
        .replace_status(&connection.name_any(), &PostParams::default(), &updated)
        .await
        .map_err(Error::Consumer)?;
    for condition in transitions {
        let type_ = if outcome::is_healthy(&condition) {
            EventType::Normal
        } else {
            EventType::Warning
        };
        let note = format!(
            "{} is {}: {}",
            condition.type_, condition.status, condition.message
        );
        state
            .event(connection, type_, &condition.reason, "Reconcile", &note)
            .await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::ReconcileError;

    #[test]
    fn every_failed_reconcile_is_counted_under_a_reason_initialized_at_start() {
        let api = crate::context::api_error;
        for error in [
            Error::Consumer(api(500)),
            Error::Provider("refused".into()),
            Error::Finalizer(Box::new(finalizer::Error::UnnamedObject)),
        ] {
            let label = error.metric_label().unwrap();
            assert!(REASONS.contains(&label), "{label}");
        }
        // A race (409) and a drain wait are not failures.
        assert_eq!(Error::Consumer(api(409)).metric_label(), None);
        assert_eq!(Error::Draining(1).metric_label(), None);
    }
}
