//! Helpers for sharding tests and benchmarks: example kinds, and who runs which work unit.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::fixtures::KBIND_NAMESPACE;

/// The example kind `kind` of `example.org/v1` (plural: lower case + `s`).
pub fn resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.org", "v1", kind),
        &format!("{}s", kind.to_lowercase()),
    )
}

/// An object of `kind` with `spec.value`.
pub fn object(kind: &str, name: &str, value: i64) -> DynamicObject {
    serde_json::from_value(json!({ "apiVersion": "example.org/v1", "kind": kind, "metadata": { "name": name }, "spec": { "value": value } })).unwrap()
}

/// Units each live syncer reports running, from the membership Leases.
///
/// A Lease counts as live when it is still current once the list has arrived: the list shows
/// the Leases as they were at some instant before that, so a Lease live then was live when it
/// was served. (Judged by a clock read before the request, a Lease that expired while the list
/// was on its way would count as live beside the units its successor took over since.)
pub async fn running(consumer: &Client) -> BTreeMap<String, BTreeSet<String>> {
    let leases: Api<Lease> = Api::namespaced(consumer.clone(), KBIND_NAMESPACE);
    let listed = leases
        .list(&ListParams::default().labels("core.kbind.io/syncer-member=true"))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let now = jiff::Timestamp::now();
    listed
        .into_iter()
        .filter(|l| {
            let spec = l.spec.clone().unwrap_or_default();
            let duration = jiff::SignedDuration::from_secs(i64::from(
                spec.lease_duration_seconds.unwrap_or(0),
            ));
            spec.renew_time.is_some_and(|t| t.0 + duration > now)
        })
        .map(|l| {
            let units = l
                .annotations()
                .get("core.kbind.io/running-units")
                .and_then(|a| serde_json::from_str(a).ok())
                .unwrap_or_default();
            (
                l.spec.and_then(|s| s.holder_identity).unwrap_or_default(),
                units,
            )
        })
        .collect()
}

/// Unit → the live members running it.
pub fn owners(running: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (member, units) in running {
        for unit in units {
            out.entry(unit.clone()).or_default().push(member.clone());
        }
    }
    out
}

/// `<plural>.example.org` of each kind.
pub fn api_names(kinds: &[&str]) -> Vec<String> {
    kinds
        .iter()
        .map(|k| format!("{}s.example.org", k.to_lowercase()))
        .collect()
}

/// Installs an exported CRD for each kind on the provider.
pub async fn export_kinds(provider: &Client, kinds: &[&str]) {
    for kind in kinds {
        crate::fixtures::install_crd(
            provider,
            &crate::fixtures::crd(
                &format!("{}s", kind.to_lowercase()),
                "example.org",
                kind,
                &[("core.kbind.io/exported", "true")],
            ),
        )
        .await
        .unwrap();
    }
}

/// On the consumer: the provider's admin kubeconfig in Secret `p`, Connection `provider`, and
/// ClusterBinding `all` for the kinds' APIs, waited for until Ready. Returns the API names.
pub async fn connect_and_bind_all(
    env: &crate::TestEnv,
    consumer: &Client,
    kinds: &[&str],
) -> Vec<String> {
    use crate::fixtures::*;
    use kbind_shared::api::{ClusterBinding, ClusterBindingSpec, SchemaSource};
    put_secret(
        consumer,
        "p",
        "kubeconfig",
        env.cluster("provider").admin_kubeconfig().as_bytes(),
    )
    .await
    .unwrap();
    create_connection(consumer, &connection("provider", "p", SchemaSource::Crd))
        .await
        .unwrap();
    let apis = api_names(kinds);
    let names: Vec<&str> = apis.iter().map(String::as_str).collect();
    let bindings: Api<ClusterBinding> = Api::all(consumer.clone());
    bindings
        .create(
            &kube::api::PostParams::default(),
            &ClusterBinding::new(
                "all",
                ClusterBindingSpec::from(binding_spec("provider", &names)),
            ),
        )
        .await
        .unwrap();
    wait_binding_condition(&bindings, "all", "Ready", "True", None)
        .await
        .unwrap();
    apis
}

/// The assignment's generation (0: none yet).
pub async fn assignment_generation(consumer: &Client) -> u64 {
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(consumer.clone(), KBIND_NAMESPACE);
    maps.get_opt(kbind_shared::shard::ASSIGNMENT_CONFIGMAP)
        .await
        .ok()
        .flatten()
        .and_then(|m| m.data?.get(kbind_shared::shard::ASSIGNMENT_KEY).cloned())
        .and_then(|text| kbind_shared::shard::Assignment::decode(&text).ok())
        .map_or(0, |a| a.generation)
}

/// Waits until the assignment's generation has not changed for `quiet` (the leader has
/// finished moving units, by count and by objects); returns how long that took.
pub async fn assignment_quiet(
    consumer: &Client,
    quiet: std::time::Duration,
) -> std::time::Duration {
    let started = std::time::Instant::now();
    let (mut generation, mut since) = (
        assignment_generation(consumer).await,
        std::time::Instant::now(),
    );
    while since.elapsed() < quiet && started.elapsed() < std::time::Duration::from_secs(300) {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let now = assignment_generation(consumer).await;
        if now != generation {
            (generation, since) = (now, std::time::Instant::now());
        }
    }
    since.duration_since(started)
}
