//! Assigning sync work to the live syncer replicas (REFERENCE: INTERFACES.md, the sharding
//! issue): each managed CRD of each Connection (or each of its namespace buckets) and each binding
//! with related resources is a work unit; units go to members by bounded-load rendezvous
//! hashing, move only after their old owner drained them, and the result is written to a
//! versioned ConfigMap that syncers watch. See `kbind_shared::shard` for the rules.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kbind_shared::keys;
use kbind_shared::shard::{self, Assignment, Member};
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::caches::TermCaches;
use crate::context::Context;

/// How often the assignment is recomputed without a change event.
const ROUND: Duration = Duration::from_millis(500);

/// How long a route's units stay assigned after the last binding offering it went (#50.3): a
/// tenant's route Binding deleted and created again within this time starts no syncer worker
/// and re-lists nothing (a route worker with no route has nothing to do).
const ROUTE_LINGER: Duration = Duration::from_secs(300);

/// The routes recently offered per API, and when each was last offered.
#[derive(Debug, Default)]
struct Lingering(BTreeMap<(String, String), std::time::Instant>);

impl Lingering {
    /// The route Connections of `api` to assign at `now`: those `offered` now (remembered as
    /// offered at `now`), and those offered less than [`ROUTE_LINGER`] ago.
    fn routes(
        &mut self,
        api: &str,
        offered: &BTreeSet<String>,
        now: std::time::Instant,
    ) -> BTreeSet<String> {
        for connection in offered {
            self.0.insert((api.to_owned(), connection.clone()), now);
        }
        self.0
            .iter()
            .filter(|((a, _), at)| a == api && now.saturating_duration_since(**at) < ROUTE_LINGER)
            .map(|((_, connection), _)| connection.clone())
            .collect()
    }

    /// Forgets what lingered past [`ROUTE_LINGER`] at `now`, and every route of an API not in
    /// `apis` (its CRD is gone, deleting or being handed over: its units go at once).
    fn retain(&mut self, apis: &BTreeSet<String>, now: std::time::Instant) {
        self.0.retain(|(api, _), at| {
            apis.contains(api) && now.saturating_duration_since(*at) < ROUTE_LINGER
        });
    }
}

/// The live members (current Leases) and what each reports: incarnation, the assignment
/// generation it applied, the units it runs. An unreadable annotation reads as zero or nothing.
fn members(leases: &[Lease], now: jiff::Timestamp) -> BTreeMap<String, Member> {
    let mut live = BTreeMap::new();
    for lease in leases {
        let Some(spec) = &lease.spec else { continue };
        let Some(member) = spec.holder_identity.clone().filter(|h| !h.is_empty()) else {
            continue;
        };
        let current = spec
            .renew_time
            .as_ref()
            .is_some_and(|t| lease_current(t.0, spec.lease_duration_seconds.unwrap_or(15), now));
        if lease.metadata.deletion_timestamp.is_some() || !current {
            continue;
        }
        let annotations = lease.annotations();
        let number = |key: &str| {
            annotations
                .get(key)
                .and_then(|a| a.parse::<u64>().ok())
                .unwrap_or_default()
        };
        let running = annotations
            .get(shard::RUNNING_UNITS_ANNOTATION)
            .map(|a| shard::decode_running(a))
            .unwrap_or_default();
        let objects = annotations
            .get(shard::UNIT_OBJECTS_ANNOTATION)
            .map(|a| shard::decode_objects(a))
            .unwrap_or_default();
        live.insert(
            member,
            Member {
                incarnation: number(shard::INCARNATION_ANNOTATION),
                observed: number(shard::OBSERVED_ASSIGNMENT_ANNOTATION),
                running,
                objects,
            },
        );
    }
    live
}

/// The longest member Lease duration honoured: a Lease claiming more is read as this.
const MAX_LEASE_SECONDS: i64 = 3600;
/// How far in the future a renewal may lie (clock skew between nodes).
const MAX_CLOCK_SKEW: jiff::SignedDuration = jiff::SignedDuration::from_secs(60);

/// Whether a member Lease renewed at `renewed` for `seconds` is current at `now`. A renewal in the
/// future beyond clock skew (say, year 9999) is not current, a duration is capped at
/// [`MAX_LEASE_SECONDS`], and nothing here can overflow: a hostile Lease neither panics the
/// leader nor holds work forever.
fn lease_current(renewed: jiff::Timestamp, seconds: i32, now: jiff::Timestamp) -> bool {
    let seconds = i64::from(seconds).clamp(0, MAX_LEASE_SECONDS);
    let not_ahead = now
        .checked_add(MAX_CLOCK_SKEW)
        .is_ok_and(|limit| renewed <= limit);
    let not_expired = renewed
        .checked_add(jiff::SignedDuration::from_secs(seconds))
        .is_ok_and(|end| end > now);
    not_ahead && not_expired
}

/// Annotation on a consumer CRD: split its API into this many namespace buckets (overrides
/// `--namespace-buckets`).
pub const BUCKETS_ANNOTATION: &str = "core.kbind.io/sync-buckets";

/// Runs assignment rounds until `stop` (only on the leader). Members, managed CRDs, bindings and
/// the assignment itself are read from watch-fed caches; a round runs on any change to them and
/// at least every [`ROUND`] (Lease expiry is a matter of time, not of events).
pub async fn run(ctx: Arc<Context>, caches: TermCaches, stop: CancellationToken) {
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let mut changes = std::pin::pin!(ctx.changes.subscribe(&crate::changes::Topic::cached()));
    let mut weights = Weights::default();
    let mut lingering = Lingering::default();
    loop {
        if let Err(e) = round(&ctx, &caches, &maps, &mut weights, &mut lingering).await {
            tracing::warn!(error = %e, "assignment round failed");
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(ROUND) => {}
            _ = changes.next() => {
                // One round for a burst: it reads the caches as they are by then.
                while let Some(Some(_)) = changes.next().now_or_never() {}
            }
        }
    }
}

/// Every unit of work in priority order — each managed API (split into its namespace
/// buckets), then the related resources of each binding that lists some and is admitted
/// ([`shard::related_admission`]) — only of Connections that exist and are Ready (a binding
/// naming anything else adds nothing to the assignment); and how many bindings' related
/// resources were not admitted. A route that went away stays a while ([`Lingering`]).
fn units(
    caches: &TermCaches,
    settings: &crate::context::Settings,
    lingering: &mut Lingering,
) -> (Vec<String>, usize) {
    let now = std::time::Instant::now();
    let ready: BTreeSet<String> = caches
        .connections
        .state()
        .iter()
        .filter(|c| shard::connection_ready(c))
        .map(|c| c.name_any())
        .collect();
    let cluster_bindings = caches.cluster_bindings.state();
    let bindings = caches.bindings.state();
    let mut apis = BTreeSet::new();
    let mut served = BTreeSet::new();
    for crd in caches.managed_crds() {
        // A CRD being handed over to another Connection has no units: its syncers stop, and
        // the binding taking it over waits for that (`Context::runs_api`).
        if crd.metadata.deletion_timestamp.is_some()
            || crd.annotations().contains_key(keys::HANDOVER_ANNOTATION)
        {
            continue;
        }
        let Some(connection) = crd
            .annotations()
            .get(keys::CONNECTION_ANNOTATION)
            .filter(|c| ready.contains(*c))
        else {
            continue;
        };
        let buckets = crd
            .annotations()
            .get(BUCKETS_ANNOTATION)
            .and_then(|b| b.parse::<u32>().ok())
            .filter(|b| (1..=MAX_BUCKETS).contains(b))
            .unwrap_or(settings.namespace_buckets);
        // Each route of the API (#36: a binding of another Connection admitted for the objects
        // it selects) is a unit of its own, so sharding spreads routes.
        let offered = kbind_shared::resolve::route_connections(
            &crd.name_any(),
            connection,
            cluster_bindings.iter().map(|b| b.as_ref()),
            bindings.iter().map(|b| b.as_ref()),
        );
        served.insert(crd.name_any());
        let routes = lingering.routes(&crd.name_any(), &offered, now);
        for connection in
            std::iter::once(connection).chain(routes.iter().filter(|c| ready.contains(*c)))
        {
            apis.extend(
                shard::api_units(connection, &crd.name_any(), buckets)
                    .iter()
                    .map(ToString::to_string),
            );
        }
    }
    lingering.retain(&served, now);
    let connection = |name: &str| {
        caches
            .connections
            .get(&kube::runtime::reflector::ObjectRef::new(name))
    };
    let candidates: Vec<shard::RelatedBinding> = cluster_bindings
        .iter()
        .map(|b| (&b.metadata, &b.spec.binding))
        .chain(bindings.iter().map(|b| (&b.metadata, &b.spec)))
        .filter_map(|(meta, spec)| {
            shard::RelatedBinding::of(meta, spec, connection(&spec.connection_ref.name).as_deref())
        })
        .collect();
    let admitted = shard::related_admission(
        &candidates,
        settings.related_resources,
        settings.max_related_bindings_per_namespace,
    );
    let refused = admitted.iter().filter(|r| r.is_err()).count();
    let mut related: Vec<String> = admitted
        .into_iter()
        .filter_map(Result::ok)
        .map(|u| u.to_string())
        .collect();
    related.sort();
    (apis.into_iter().chain(related).collect(), refused)
}

/// The most namespace buckets one API may be split into.
pub const MAX_BUCKETS: u32 = 64;

/// The objects each unit held when its runner last reported them: kept while the unit moves
/// (nobody runs it, so nobody reports it) and for this leadership term.
#[derive(Debug, Default)]
struct Weights(BTreeMap<String, u64>);

impl Weights {
    /// Takes in what the live members report for `units` and forgets every other unit; returns
    /// each unit's last known weight (empty: no member reports any).
    fn update(
        &mut self,
        units: &BTreeSet<String>,
        live: &BTreeMap<String, Member>,
    ) -> &BTreeMap<String, u64> {
        self.0.retain(|unit, _| units.contains(unit));
        if live.values().all(|m| m.objects.is_empty()) {
            return &self.0;
        }
        for unit in units {
            let key = shard::running_key(unit);
            if let Some(count) = live.values().filter_map(|m| m.objects.get(&key)).max() {
                self.0.insert(unit.clone(), *count);
            }
        }
        &self.0
    }
}

async fn round(
    ctx: &Context,
    caches: &TermCaches,
    maps: &Api<ConfigMap>,
    weights: &mut Weights,
    lingering: &mut Lingering,
) -> Result<(), kube::Error> {
    let leases: Vec<Lease> = caches
        .member_leases
        .state()
        .iter()
        .map(|l| l.as_ref().clone())
        .collect();
    let live = members(&leases, jiff::Timestamp::now());
    let running: BTreeMap<String, BTreeSet<String>> = live
        .iter()
        .map(|(m, s)| (m.clone(), s.running.clone()))
        .collect();
    let names: BTreeSet<String> = live.keys().cloned().collect();
    ctx.set_running_units(running.values().flatten().cloned().collect());
    let (candidates, refused) = units(caches, &ctx.settings, lingering);
    let (units, left_out) = shard::fit(&candidates, &names);
    ctx.metrics
        .assignment_unassigned_units
        .set((left_out + refused) as f64);
    if left_out > 0 {
        tracing::debug!(
            left_out,
            "work units left unassigned: the assignment is full"
        );
    }
    let current = caches
        .assignment
        .state()
        .first()
        .and_then(|m| m.data.as_ref()?.get(shard::ASSIGNMENT_KEY).cloned())
        .and_then(|text| Assignment::decode(&text).ok())
        .unwrap_or_default();
    ctx.metrics
        .assignment_overlaps
        .set(shard::overlaps(&names, &running) as f64);
    let next = shard::next(&units, &live, &current, weights.update(&units, &live));
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

    #[test]
    fn a_route_that_went_away_stays_assigned_a_while() {
        let t0 = std::time::Instant::now();
        let set = |names: &[&str]| -> BTreeSet<String> {
            names.iter().map(|n| (*n).to_owned()).collect()
        };
        let mut l = Lingering::default();
        let api = "widgets.example.org";
        // (case, offered now, seconds after t0, routes assigned)
        let cases: [(&str, &[&str], u64, &[&str]); 6] = [
            ("offered", &["second"], 0, &["second"]),
            ("gone: still assigned", &[], 10, &["second"]),
            ("back: nothing moved", &["second"], 20, &["second"]),
            ("gone again, within the linger", &[], 300, &["second"]),
            ("gone for the whole linger", &[], 320, &[]),
            ("another route", &["third"], 330, &["third"]),
        ];
        for (case, offered, after, want) in cases {
            let now = t0 + Duration::from_secs(after);
            assert_eq!(l.routes(api, &set(offered), now), set(want), "{case}");
            l.retain(&set(&[api]), now);
        }
        // What lingered its whole time is forgotten, not only left unassigned.
        let mut m = Lingering::default();
        m.routes(api, &set(&["second"]), t0);
        m.retain(&set(&[api]), t0 + ROUTE_LINGER - Duration::from_secs(1));
        assert_eq!(m.0.len(), 1);
        m.retain(&set(&[api]), t0 + ROUTE_LINGER);
        assert!(m.0.is_empty());
        // Another API's routes are its own; an API whose CRD goes forgets its routes at once.
        assert_eq!(
            l.routes("other", &set(&[]), t0 + Duration::from_secs(331)),
            set(&[])
        );
        l.retain(&set(&["other"]), t0 + Duration::from_secs(331));
        assert_eq!(
            l.routes(api, &set(&[]), t0 + Duration::from_secs(331)),
            set(&[])
        );
    }

    #[test]
    fn hostile_lease_times_neither_panic_nor_hold_work() {
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let at = |s: i64| jiff::Timestamp::from_second(s).unwrap();
        // (renewed, seconds) → current?
        let cases = [
            (at(1_800_000_000 - 5), 15, true),
            (at(1_800_000_000 - 20), 15, false),
            (at(1_800_000_000 + 30), 15, true), // a little clock skew
            (jiff::Timestamp::MAX, i32::MAX, false), // year 9999, the largest duration
            (jiff::Timestamp::MIN, i32::MAX, false), // capped: not current for ever
            (at(1_800_000_000 - 1), -5, false),
            (at(1_800_000_000 - 7200), i32::MAX, false),
            (at(1_800_000_000 - 1800), i32::MAX, true),
        ];
        for (renewed, seconds, want) in cases {
            assert_eq!(
                lease_current(renewed, seconds, now),
                want,
                "{renewed} {seconds}"
            );
        }
    }
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
        let mut with_numbers = lease("a", 2, r#"["p/x.y"]"#);
        with_numbers.metadata.annotations.as_mut().unwrap().extend([
            (shard::INCARNATION_ANNOTATION.to_owned(), "17".to_owned()),
            (
                shard::OBSERVED_ASSIGNMENT_ANNOTATION.to_owned(),
                "4".to_owned(),
            ),
        ]);
        let live = members(
            &[with_numbers, lease("b", 11, "[]"), lease("c", 0, "garbage")],
            now,
        );
        assert_eq!(live.keys().collect::<Vec<_>>(), ["a", "c"]);
        assert_eq!(
            live["a"].running.iter().collect::<Vec<_>>(),
            [&shard::running_key("p/x.y")]
        );
        assert_eq!((live["a"].incarnation, live["a"].observed), (17, 4));
        assert!(
            live["c"].running.is_empty() && live["c"].incarnation == 0,
            "an unreadable annotation counts as running nothing"
        );
    }

    #[test]
    fn unit_weights_are_remembered_while_a_unit_moves_and_forgotten_when_it_goes() {
        let (u1, u2) = (
            "p/a.example.org#0/2".to_owned(),
            "p/a.example.org#1/2".to_owned(),
        );
        let reporting = |counts: &[(&String, u64)]| Member {
            objects: counts
                .iter()
                .map(|(u, c)| (shard::running_key(u), *c))
                .collect(),
            ..Member::default()
        };
        let units: BTreeSet<String> = [u1.clone(), u2.clone()].into();
        let mut weights = Weights::default();
        // Members that report nothing (an earlier version): no weights at all.
        let silent: BTreeMap<String, Member> = [("a".to_owned(), Member::default())].into();
        assert!(weights.update(&units, &silent).is_empty());
        let live: BTreeMap<String, Member> = [
            ("a".to_owned(), reporting(&[(&u1, 40)])),
            ("b".to_owned(), reporting(&[(&u2, 7)])),
        ]
        .into();
        assert_eq!(
            weights.update(&units, &live),
            &BTreeMap::from([(u1.clone(), 40), (u2.clone(), 7)])
        );
        // u1 moves: nobody reports it for a while; its weight stays.
        let moving: BTreeMap<String, Member> = [("b".to_owned(), reporting(&[(&u2, 9)]))].into();
        assert_eq!(
            weights.update(&units, &moving),
            &BTreeMap::from([(u1.clone(), 40), (u2.clone(), 9)])
        );
        // u2 is no longer a unit: forgotten.
        let only_u1: BTreeSet<String> = [u1.clone()].into();
        assert_eq!(
            weights.update(&only_u1, &moving),
            &BTreeMap::from([(u1.clone(), 40)])
        );
    }

    #[test]
    fn a_members_unit_objects_are_read_from_its_lease() {
        let now = jiff::Timestamp::from_second(1000).unwrap();
        let mut reporting = lease("a", 1, r#"["p/x.y"]"#);
        let counts: BTreeMap<String, u64> = [("p/x.y".to_owned(), 12)].into();
        reporting.metadata.annotations.as_mut().unwrap().insert(
            shard::UNIT_OBJECTS_ANNOTATION.to_owned(),
            shard::encode_objects(&counts),
        );
        let mut hostile = lease("b", 1, "[]");
        hostile.metadata.annotations.as_mut().unwrap().insert(
            shard::UNIT_OBJECTS_ANNOTATION.to_owned(),
            "x".repeat(300_000),
        );
        let live = members(&[reporting, hostile], now);
        assert_eq!(
            live["a"].objects,
            BTreeMap::from([(shard::running_key("p/x.y"), 12)])
        );
        assert!(live["b"].objects.is_empty());
    }
}
