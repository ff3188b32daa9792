//! This replica's membership Lease (`kbind-syncer-<identity>` in kbind's namespace): renewed well
//! within `--membership-lease-duration`, listing the units it runs (its drain acknowledgement),
//! and the fence: a replica that has not renewed in time writes nothing.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
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
    running: Mutex<BTreeSet<String>>,
    changed: Notify,
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
            changed: Notify::new(),
        }
    }

    fn lease_name(&self) -> String {
        format!("{}{}", shard::MEMBER_LEASE_PREFIX, self.identity)
    }

    /// The fence: true while the Lease was renewed within 2/3 of its duration, so this replica
    /// stops writing before anyone else may consider it gone.
    pub fn is_current(&self) -> bool {
        now_ms() - self.renewed_at_ms.load(Ordering::Relaxed)
            < (self.duration.as_millis() as i64) * 2 / 3
    }

    /// Records the units this replica runs now and renews the Lease at once (the acknowledgement
    /// the assignment waits for when it moves a unit away).
    pub fn set_running(&self, units: BTreeSet<String>) {
        let mut running = self.running.lock().expect("not poisoned");
        if *running != units {
            *running = units;
            self.changed.notify_one();
        }
    }

    async fn renew(&self) -> Result<(), kube::Error> {
        let running: Vec<String> = self
            .running
            .lock()
            .expect("not poisoned")
            .iter()
            .cloned()
            .collect();
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.lease_name(),
                "labels": { keys::SYNCER_MEMBER_LABEL: keys::TRUE },
                "annotations": { shard::RUNNING_UNITS_ANNOTATION: serde_json::to_string(&running).expect("strings serialize") },
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
        self.renewed_at_ms.store(started, Ordering::Relaxed);
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
        self.renewed_at_ms.store(i64::MIN / 2, Ordering::Relaxed);
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
