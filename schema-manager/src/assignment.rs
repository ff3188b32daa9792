//! Assigning sync work to the live syncer replicas (REFERENCE: INTERFACES.md, the sharding
//! issue): each managed CRD of each Connection is a work unit; units go to members by rendezvous
//! hashing, move only after their old owner drained them, and the result is written to a
//! versioned ConfigMap that syncers watch. See `kbind_shared::shard` for the rules.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_shared::keys;
use kbind_shared::shard::{self, Assignment};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::context::Context;

/// How often the assignment is recomputed.
const ROUND: Duration = Duration::from_millis(500);

/// The live members and what each runs, from the membership Leases.
fn members(
    leases: &[Lease],
    now: jiff::Timestamp,
) -> (BTreeSet<String>, BTreeMap<String, BTreeSet<String>>) {
    let mut live = BTreeSet::new();
    let mut running = BTreeMap::new();
    for lease in leases {
        let Some(spec) = &lease.spec else { continue };
        let Some(member) = spec.holder_identity.clone().filter(|h| !h.is_empty()) else {
            continue;
        };
        let duration =
            jiff::SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(15)));
        let current = spec
            .renew_time
            .as_ref()
            .is_some_and(|t| t.0 + duration > now);
        if lease.metadata.deletion_timestamp.is_some() || !current {
            continue;
        }
        let units: BTreeSet<String> = lease
            .annotations()
            .get(shard::RUNNING_UNITS_ANNOTATION)
            .and_then(|a| serde_json::from_str(a).ok())
            .unwrap_or_default();
        live.insert(member.clone());
        running.insert(member, units);
    }
    (live, running)
}

/// Runs assignment rounds until `stop` (only on the leader).
pub async fn run(ctx: Arc<Context>, stop: CancellationToken) {
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let crds: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    let member_selector = format!("{}={}", keys::SYNCER_MEMBER_LABEL, keys::TRUE);
    let managed_selector = format!("{}={}", keys::MANAGED_LABEL, keys::TRUE);
    loop {
        if let Err(e) = round(
            &ctx,
            &leases,
            &maps,
            &crds,
            &member_selector,
            &managed_selector,
        )
        .await
        {
            tracing::warn!(error = %e, "assignment round failed");
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(ROUND) => {}
        }
    }
}

async fn round(
    ctx: &Context,
    leases: &Api<Lease>,
    maps: &Api<ConfigMap>,
    crds: &Api<CustomResourceDefinition>,
    member_selector: &str,
    managed_selector: &str,
) -> Result<(), kube::Error> {
    let members_list = leases
        .list(&ListParams::default().labels(member_selector))
        .await?;
    let (live, running) = members(&members_list.items, jiff::Timestamp::now());
    let units: BTreeSet<String> = crds
        .list_metadata(&ListParams::default().labels(managed_selector))
        .await?
        .items
        .iter()
        .filter(|crd| crd.metadata.deletion_timestamp.is_none())
        .filter_map(|crd| {
            crd.annotations()
                .get(keys::CONNECTION_ANNOTATION)
                .map(|c| shard::unit(c, &crd.name_any()))
        })
        .collect();
    let current = maps
        .get_opt(shard::ASSIGNMENT_CONFIGMAP)
        .await?
        .and_then(|m| m.data.and_then(|d| d.get(shard::ASSIGNMENT_KEY).cloned()))
        .and_then(|text| Assignment::decode(&text).ok())
        .unwrap_or_default();
    ctx.metrics
        .assignment_overlaps
        .set(shard::overlaps(&live, &running) as f64);
    let next = shard::next(&units, &live, &running, &current);
    if next == current {
        return Ok(());
    }
    tracing::info!(
        units = next.units.len(),
        members = live.len(),
        "work assignment changed"
    );
    let map = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": shard::ASSIGNMENT_CONFIGMAP, "labels": { keys::MANAGED_LABEL: keys::TRUE } },
        "data": { shard::ASSIGNMENT_KEY: next.encode() },
    });
    maps.patch(
        shard::ASSIGNMENT_CONFIGMAP,
        &PatchParams::apply("kbind-schema-manager").force(),
        &Patch::Apply(&map),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn lease(holder: &str, renewed_secs_ago: i64, units: &str) -> Lease {
        let mut lease = Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(10),
                renew_time: Some(MicroTime(
                    jiff::Timestamp::from_second(1000 - renewed_secs_ago).unwrap(),
                )),
                ..Default::default()
            }),
            ..Default::default()
        };
        lease.metadata.annotations =
            Some([(shard::RUNNING_UNITS_ANNOTATION.to_owned(), units.to_owned())].into());
        lease
    }

    #[test]
    fn only_current_leases_are_live_members() {
        let now = jiff::Timestamp::from_second(1000).unwrap();
        let (live, running) = members(
            &[
                lease("a", 2, r#"["p/x.y"]"#),
                lease("b", 11, "[]"),
                lease("c", 0, "garbage"),
            ],
            now,
        );
        assert_eq!(live.into_iter().collect::<Vec<_>>(), ["a", "c"]);
        assert_eq!(running["a"].iter().collect::<Vec<_>>(), ["p/x.y"]);
        assert!(
            running["c"].is_empty(),
            "an unreadable annotation counts as running nothing"
        );
    }
}
