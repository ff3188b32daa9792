//! Leader election with the `kube-leader-election` crate: only the leader reconciles. A standby
//! is ready but idle. A leader that cannot renew its Lease in time, or sees it taken, stops all
//! reconciling at once; on shutdown it finishes in-flight work and releases the Lease. A leader
//! whose work ends for any other reason (a panic included) releases the Lease and returns an
//! error, so the process exits non-zero and a standby takes over — never a zombie leader that
//! holds the Lease while nothing reconciles.

use std::future::Future;
use std::time::Duration;

use crate::metrics::Metrics;
use kube::Client;
use kube_leader_election::{LeaseLock, LeaseLockParams, LeaseLockResult};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The leader election flags of a program whose leader Lease is named after it by default.
#[derive(clap::Args, Clone, Debug)]
pub struct ElectionArgs {
    /// Lease-based leader election
    #[arg(long, env = "KBIND_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,

    /// Leader Lease name in --namespace [default: the program's name]
    #[arg(long, env = "KBIND_LEADER_ELECTION_ID")]
    pub leader_election_id: Option<String>,

    /// How long a silent leader keeps the leader Lease
    #[arg(long, env = "KBIND_LEADER_ELECTION_LEASE_DURATION", default_value = "15s", value_parser = crate::cli::parse_duration)]
    pub leader_election_lease_duration: Duration,
}

impl ElectionArgs {
    /// How `program`, as `holder`, takes part in leader election in `namespace` (`None`: it does
    /// not, and leads at once).
    pub fn election(&self, program: &str, namespace: String, holder: String) -> Option<Election> {
        self.leader_elect.then(|| Election {
            namespace,
            lease_name: self
                .leader_election_id
                .clone()
                .unwrap_or_else(|| program.to_owned()),
            holder,
            lease_duration: self.leader_election_lease_duration,
        })
    }
}

/// How this process takes part in leader election.
pub struct Election {
    /// Lease namespace.
    pub namespace: String,
    /// Lease name.
    pub lease_name: String,
    /// This process's identity in the Lease.
    pub holder: String,
    /// How long a silent leader keeps the Lease.
    pub lease_duration: Duration,
}

impl Election {
    /// Renew well within the Lease duration, so that a leader never outlives its Lease.
    fn renew_every(&self) -> Duration {
        self.lease_duration / 5
    }

    /// A leader that has not renewed for this long steps down before anyone else may take over.
    fn give_up_after(&self) -> Duration {
        self.lease_duration * 3 / 5
    }
}

struct Term {
    token: CancellationToken,
    task: JoinHandle<()>,
}

impl Term {
    /// Stops the work immediately: no write is started after this.
    fn abort(self) {
        self.token.cancel();
        self.task.abort();
    }
}

/// Runs `lead` under leader election when `election` is given, else at once as the only leader,
/// until `shutdown`; `/readyz` says ready meanwhile (a standby is ready: healthy and waiting).
pub async fn lead_or_run<F, Fut>(
    client: Client,
    election: Option<Election>,
    metrics: Metrics,
    shutdown: CancellationToken,
    readiness: &crate::process::Readiness,
    lead: F,
) -> Result<(), String>
where
    F: Fn(CancellationToken) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    readiness.set(true);
    let outcome = match election {
        Some(election) => run(client, election, metrics, shutdown, lead).await,
        None => {
            metrics.leader.set(1.0);
            lead(shutdown).await;
            Ok(())
        }
    };
    readiness.set(false);
    outcome
}

/// Runs `lead` whenever this process holds the Lease, until `shutdown`. `lead` gets a token that
/// is cancelled when leadership ends gracefully (shutdown); on lost leadership its task is aborted.
/// Returns an error, after releasing the Lease, when the work ends on its own.
pub async fn run<F, Fut>(
    client: Client,
    election: Election,
    metrics: Metrics,
    shutdown: CancellationToken,
    lead: F,
) -> Result<(), String>
where
    F: Fn(CancellationToken) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let lock = LeaseLock::new(
        client,
        &election.namespace,
        LeaseLockParams {
            lease_name: election.lease_name.clone(),
            holder_id: election.holder.clone(),
            lease_ttl: election.lease_duration,
        },
    );
    let mut term: Option<Term> = None;
    let mut last_renewed = Instant::now();
    let mut failed = None;
    loop {
        if let Some(t) = term.take_if(|t| t.task.is_finished()) {
            let why = match t.task.await {
                Err(e) if e.is_panic() => "panicked".to_owned(),
                Err(e) => format!("ended: {e}"),
                Ok(()) => "ended".to_owned(),
            };
            tracing::error!(lease = %election.lease_name, "the reconcilers {why}; releasing the leader Lease and exiting");
            failed = Some(format!("the reconcilers {why} while leading"));
            metrics.leader.set(0.0);
            metrics.forget_leader_state();
            break;
        }
        match lock.try_acquire_or_renew().await {
            Ok(LeaseLockResult::Acquired(_)) => {
                last_renewed = Instant::now();
                if term.is_none() {
                    tracing::info!(lease = %election.lease_name, holder = %election.holder, "became leader");
                    metrics.leader.set(1.0);
                    let token = shutdown.child_token();
                    let task = tokio::spawn(lead(token.clone()));
                    term = Some(Term { token, task });
                }
            }
            Ok(LeaseLockResult::NotAcquired(lease)) => {
                if let Some(t) = term.take() {
                    tracing::warn!(lease = %election.lease_name, "lost the leader Lease; stopped reconciling");
                    t.abort();
                    metrics.leader.set(0.0);
                    metrics.forget_leader_state();
                }
                let holder = lease
                    .spec
                    .and_then(|s| s.holder_identity)
                    .unwrap_or_default();
                tracing::debug!(%holder, "standing by");
            }
            Err(e) => {
                tracing::warn!(error = %e, lease = %election.lease_name, "cannot renew the leader Lease");
                if term.is_some() && last_renewed.elapsed() >= election.give_up_after() {
                    tracing::warn!("leader Lease not renewed in time; stopped reconciling");
                    if let Some(t) = term.take() {
                        t.abort();
                    }
                    metrics.leader.set(0.0);
                    metrics.forget_leader_state();
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(election.renew_every()) => {}
        }
    }
    let held = term.is_some() || failed.is_some();
    if let Some(t) = term.take() {
        // Graceful: the work saw the cancelled token; let in-flight writes finish.
        if tokio::time::timeout(Duration::from_secs(8), t.task)
            .await
            .is_err()
        {
            tracing::warn!("reconcilers did not stop within 8 s");
        }
        metrics.leader.set(0.0);
        metrics.forget_leader_state();
    }
    if held {
        if let Err(e) = lock.step_down().await {
            tracing::warn!(error = %e, "cannot release the leader Lease");
        } else {
            tracing::info!(lease = %election.lease_name, "released the leader Lease");
        }
    }
    failed.map_or(Ok(()), Err)
}

#[cfg(test)]
mod election_args_tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Program {
        #[command(flatten)]
        election: ElectionArgs,
    }

    #[test]
    fn the_leader_lease_is_named_after_the_program_unless_told() {
        let lease = |args: &[&str]| {
            Program::try_parse_from(args)
                .unwrap()
                .election
                .election("kbind-issuer", "ns".into(), "me".into())
                .map(|e| (e.lease_name, e.lease_duration))
        };
        assert_eq!(
            lease(&["p"]),
            Some(("kbind-issuer".into(), Duration::from_secs(15)))
        );
        assert_eq!(
            lease(&[
                "p",
                "--leader-election-id=x",
                "--leader-election-lease-duration=4s"
            ]),
            Some(("x".into(), Duration::from_secs(4)))
        );
        assert_eq!(lease(&["p", "--leader-elect=false"]), None);
    }
}
