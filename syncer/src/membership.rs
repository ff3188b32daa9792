//! This replica's membership Lease (`kbind-syncer-<identity>` in kbind's namespace): renewed well
//! within `--membership-lease-duration`, listing the units it runs (its drain acknowledgement),
//! and the fence: a replica that has not renewed in time writes nothing.

use kbind_shared::sync::Locked;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kbind_shared::keys;
use kbind_shared::shard;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// This replica in the membership.
pub struct Membership {
    /// `--identity`.
    pub identity: String,
    /// kbind's namespace (the Lease's and the assignment's).
    pub namespace: String,
    leases: Api<Lease>,
    duration: Duration,
    renewed_at_ms: AtomicI64,
    /// Units running now and the assignment generation they conform to.
    running: Mutex<(BTreeSet<String>, u64)>,
    /// Objects per unit, as the workers last counted them (reported for running units only).
    objects: Mutex<BTreeMap<String, u64>>,
    changed: Notify,
    /// Changes when this replica (re)joins: at start, and after a lapse.
    incarnation: AtomicU64,
    /// Set by a renewal that follows a lapse (no renewal within the fence window); cleared once
    /// every unit of the old incarnation has stopped. No writes while set.
    lapsed: AtomicBool,
    /// Set by a lapse, cleared by the next successful renewal: one lapse (one new incarnation)
    /// per outage, not one per failed renewal.
    rejoining: AtomicBool,
}

/// Whether a renewal about to be tried starts a lapse: the Lease was renewed once, not within
/// the fence since, and this outage has not lapsed already (a lapse being cleaned up, or one
/// cleaned up whose rejoining renewal has not succeeded yet).
fn starts_lapse(ever_renewed: bool, within_fence: bool, lapsed: bool, rejoining: bool) -> bool {
    ever_renewed && !within_fence && !lapsed && !rejoining
}

fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

impl Membership {
    /// Membership of `identity` in `namespace`.
    pub fn new(client: Client, namespace: &str, identity: String, duration: Duration) -> Self {
        Self {
            identity,
            namespace: namespace.to_owned(),
            leases: Api::namespaced(client, namespace),
            duration,
            renewed_at_ms: AtomicI64::new(i64::MIN / 2),
            running: Mutex::default(),
            objects: Mutex::default(),
            changed: Notify::new(),
            incarnation: AtomicU64::new(now_ms().unsigned_abs()),
            lapsed: AtomicBool::new(false),
            rejoining: AtomicBool::new(false),
        }
    }

    /// A restarted replica (same identity: same pod, so the previous process has exited) keeps
    /// the incarnation its Lease records, and with it the work still assigned to it — a restart
    /// moves nothing. A replica that paused without exiting is caught by the lapse check instead.
    pub async fn resume_incarnation(&self) {
        let Ok(Some(lease)) = self.leases.get_opt(&self.lease_name()).await else {
            return;
        };
        let holder = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref());
        let recorded = lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(shard::INCARNATION_ANNOTATION))
            .and_then(|i| i.parse::<u64>().ok());
        if holder == Some(self.identity.as_str())
            && let Some(incarnation) = recorded
        {
            self.incarnation.store(incarnation, Ordering::SeqCst);
            tracing::info!(
                incarnation,
                "resuming the incarnation of this replica's Lease"
            );
        }
    }

    /// This replica's current incarnation (see `kbind_shared::shard::INCARNATION_ANNOTATION`).
    pub fn incarnation(&self) -> u64 {
        self.incarnation.load(Ordering::SeqCst)
    }

    /// Whether a lapse is being cleaned up (every worker must stop; nothing is written).
    pub fn is_lapsed(&self) -> bool {
        self.lapsed.load(Ordering::SeqCst)
    }

    /// Ends a lapse: called once nothing of the old incarnation runs any more.
    pub fn clear_lapse(&self) {
        if self.lapsed.swap(false, Ordering::SeqCst) {
            tracing::info!(
                incarnation = self.incarnation(),
                "membership rejoined after a lapse"
            );
            self.changed.notify_one();
        }
    }

    /// The Lease was renewed just now (a test's fence, current).
    #[cfg(test)]
    pub fn renewed_now(&self) {
        self.renewed_at_ms.store(now_ms(), Ordering::SeqCst);
    }

    fn within_fence(&self) -> bool {
        now_ms() - self.renewed_at_ms.load(Ordering::SeqCst)
            < (self.duration.as_millis() as i64) * 2 / 3
    }

    fn lease_name(&self) -> String {
        format!("{}{}", shard::MEMBER_LEASE_PREFIX, self.identity)
    }

    /// The fence: true while the Lease was renewed within 2/3 of its duration, so this replica
    /// stops writing before anyone else may consider it gone; and false after a lapse until every
    /// worker of the old incarnation has stopped, so it cannot resume writing after a pause
    /// without re-reading its assignment as a new incarnation.
    pub fn is_current(&self) -> bool {
        !self.is_lapsed() && self.within_fence()
    }

    /// Records the units this replica runs now and renews the Lease at once (the acknowledgement
    /// the assignment waits for when it moves a unit away).
    pub fn set_running(&self, units: BTreeSet<String>, observed_generation: u64) {
        let mut running = self.running.locked();
        if *running != (units.clone(), observed_generation) {
            *running = (units, observed_generation);
            self.changed.notify_one();
        }
    }

    /// Records how many objects each of `counts`' units holds, for the next renewal to report
    /// (the leader places units by them; a count alone never renews early).
    pub fn set_objects(&self, counts: impl IntoIterator<Item = (String, u64)>) {
        self.objects.locked().extend(counts);
    }

    /// Forgets the counts of `units` (their worker stopped).
    pub fn forget_objects<'a>(&self, units: impl IntoIterator<Item = &'a String>) {
        let mut objects = self.objects.locked();
        for unit in units {
            objects.remove(unit);
        }
    }

    async fn renew(&self) -> Result<(), kube::Error> {
        let ever_renewed = self.renewed_at_ms.load(Ordering::SeqCst) > i64::MIN / 4;
        if starts_lapse(
            ever_renewed,
            self.within_fence(),
            self.is_lapsed(),
            self.rejoining.load(Ordering::SeqCst),
        ) {
            // Paused or cut off past the fence: others may own our units by now. Rejoin as a new
            // incarnation that owns nothing until the leader says so.
            self.lapsed.store(true, Ordering::SeqCst);
            self.rejoining.store(true, Ordering::SeqCst);
            self.incarnation
                .store(now_ms().unsigned_abs(), Ordering::SeqCst);
            tracing::warn!(
                incarnation = self.incarnation(),
                "the membership Lease lapsed; stopping all work and rejoining"
            );
        }
        let (running, observed): (Vec<String>, u64) = {
            let guard = self.running.locked();
            (guard.0.iter().cloned().collect(), guard.1)
        };
        // While a lapse is cleaned up nothing is written, so nothing is claimed either.
        let running = if self.is_lapsed() {
            Vec::new()
        } else {
            running
        };
        let objects: BTreeMap<String, u64> = {
            let counts = self.objects.locked();
            running
                .iter()
                .filter_map(|u| counts.get(u).map(|c| (u.clone(), *c)))
                .collect()
        };
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.lease_name(),
                "labels": { keys::SYNCER_MEMBER_LABEL: keys::TRUE },
                "annotations": {
                    shard::RUNNING_UNITS_ANNOTATION: shard::encode_running(&running.iter().cloned().collect()),
                    shard::INCARNATION_ANNOTATION: self.incarnation().to_string(),
                    shard::OBSERVED_ASSIGNMENT_ANNOTATION: observed.to_string(),
                    shard::UNIT_OBJECTS_ANNOTATION: shard::encode_objects(&objects),
                },
            },
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.duration.as_secs().max(1),
                "renewTime": MicroTime(jiff::Timestamp::now()),
            },
        });
        let started = now_ms();
        self.leases
            .patch(
                &self.lease_name(),
                &PatchParams::apply("kbind-syncer").force(),
                &Patch::Apply(&lease),
            )
            .await?;
        self.renewed_at_ms.store(started, Ordering::SeqCst);
        self.rejoining.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Renews until `stop`, then releases the Lease (the assignment moves the units at once).
    pub async fn run(&self, stop: CancellationToken) {
        let every = (self.duration / 4).max(Duration::from_millis(250));
        loop {
            if let Err(e) = self.renew().await {
                tracing::warn!(error = %e, "cannot renew the membership Lease");
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(every) => {}
                _ = self.changed.notified() => {}
            }
        }
    }

    /// Deletes the Lease: this replica leaves the membership.
    pub async fn release(&self) {
        self.renewed_at_ms.store(i64::MIN / 2, Ordering::SeqCst);
        match self
            .leases
            .delete(&self.lease_name(), &DeleteParams::default())
            .await
        {
            Ok(_) => tracing::info!(lease = %self.lease_name(), "released the membership Lease"),
            Err(e) => tracing::warn!(error = %e, "cannot release the membership Lease"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_lapse_per_outage() {
        // (ever renewed, within the fence, lapsed, rejoining) → a renewal starts a lapse?
        let cases = [
            ((false, false, false, false), false), // never renewed: nothing to lapse from
            ((true, true, false, false), false),   // renewed in time
            ((true, false, false, false), true),   // past the fence: lapse
            ((true, false, true, true), false),    // the lapse is being cleaned up
            ((true, false, false, true), false),   // cleaned up, not renewed since: same outage
            ((true, true, false, true), false),
        ];
        for ((ever, within, lapsed, rejoining), want) in cases {
            assert_eq!(
                starts_lapse(ever, within, lapsed, rejoining),
                want,
                "{ever} {within} {lapsed} {rejoining}"
            );
        }
    }
}
