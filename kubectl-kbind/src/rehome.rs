//! `kubectl kbind rehome plan|apply` (#53.2): a consumer restored from a backup, or rebuilt, has a
//! new cluster UID and new object UIDs, so every provider copy its previous identity left is
//! another consumer's to kbind (`OwnedByAnother`). Re-homing claims those copies deliberately:
//! for one Connection and one previous consumer identity (`--from <uid>`), each consumer object
//! of an API the Connection serves whose provider copy (same namespace and name) carries that
//! identity's markers gets this consumer's markers, in one server-side apply of exactly what
//! kbind's syncer would write (so the syncer then has nothing to write). Only when the previous
//! identity is gone: its heartbeat Leases stale (not renewed, by the provider's stamps, for two
//! lease durations) or marked disconnected, or absent; refused with one line while one is alive.
//! A copy owned by any other consumer is never touched; the provider's identity must be the one
//! the Connection pinned. The previous identity's related copies are claimed likewise
//! ([`crate::rehome_related`]). `plan` only reads.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_provider::reaper::facts;
use kbind_shared::api::Connection;
use kbind_shared::keys;
use kbind_shared::kubeconfig::Transport;
use kbind_shared::ownership::{Owner, classify};
use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;

use crate::view::{self, cell};

/// Consumer objects listed per request.
const PAGE: u32 = 500;
/// Copies listed in the text report (the JSON has them all).
const SHOWN: usize = 20;

/// What `plan` found and `apply` did.
#[derive(Debug, Serialize)]
pub struct Report {
    pub connection: String,
    /// This consumer cluster's UID (now).
    pub consumer_uid: String,
    /// The previous identity.
    pub from: String,
    /// Whether it is gone, and its Leases.
    pub previous: Previous,
    /// Every consumer object of the Connection's APIs with what becomes of its copy.
    pub copies: Vec<Copy>,
    /// Copies per verdict.
    pub counts: BTreeMap<String, usize>,
    /// Why nothing may be claimed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// Copies claimed (apply).
    pub claimed: usize,
    /// The previous identity's related copies (Secrets, ConfigMaps) on both sides.
    pub related: Vec<crate::rehome_related::RelatedCopy>,
    /// Related copies per verdict.
    pub related_counts: BTreeMap<String, usize>,
    /// Related copies claimed (apply).
    pub related_claimed: usize,
}

/// The previous identity's heartbeat, as the provider records it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Previous {
    /// `alive`, `left` (marked disconnected), `stale`, or `no-lease`.
    pub verdict: String,
    pub leases: Vec<LeaseRow>,
}

/// One heartbeat Lease of the previous identity.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LeaseRow {
    /// `namespace/name`.
    pub lease: String,
    /// Seconds since the API server stamped its last renewal (`None`: no stamp).
    pub renewed_secs_ago: Option<i64>,
    pub duration_secs: i64,
    /// Marked disconnected after its last renewal.
    pub left: bool,
}

/// One consumer object and its provider copy.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Copy {
    pub api: String,
    pub namespace: Option<String>,
    pub name: String,
    /// `claim` (the previous identity's), `ours`, `another` (another consumer's: never touched),
    /// `unmarked` (no consumer's: left to the conflict policy), `absent` (kbind creates it).
    pub verdict: String,
    /// The consumer UID on the copy, when another's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// Whether the previous identity may be taken over: `alive` while any Lease speaking for it was
/// renewed (by the API server's stamp) within two lease durations and not marked disconnected
/// since — also a Lease whose stamps are gone, which cannot be shown dead.
pub fn previous(leases: &[LeaseRow]) -> &'static str {
    if leases.is_empty() {
        return "no-lease";
    }
    let alive = |l: &LeaseRow| {
        !l.left
            && l.renewed_secs_ago
                .is_none_or(|ago| ago <= 2 * l.duration_secs.max(1))
    };
    if leases.iter().any(alive) {
        "alive"
    } else if leases.iter().all(|l| l.left) {
        "left"
    } else {
        "stale"
    }
}

/// What becomes of one copy: its markers (`cluster`, `object`) against this consumer (`uid`,
/// the object's `object_uid`) and the previous identity `from`.
pub fn verdict(
    copy: Option<&BTreeMap<String, String>>,
    uid: &str,
    object_uid: &str,
    from: &str,
) -> (&'static str, Option<String>) {
    let Some(annotations) = copy else {
        return ("absent", None);
    };
    match classify(annotations, uid, object_uid) {
        Owner::Ours => ("ours", None),
        Owner::Unmarked => ("unmarked", None),
        Owner::Another => {
            let owner = annotations
                .get(keys::CONSUMER_CLUSTER_UID_ANNOTATION)
                .cloned()
                .unwrap_or_default();
            if owner == from && !from.is_empty() {
                ("claim", None)
            } else {
                ("another", Some(cell(&owner)))
            }
        }
    }
}

/// The one line that refuses a re-home, or `None`.
pub fn refusal(previous: &Previous, from: &str, uid: &str) -> Option<String> {
    if from == uid {
        return Some(format!(
            "refused: {from} is this consumer cluster's own UID; --from names the identity the copies were written by before the restore"
        ));
    }
    (previous.verdict == "alive").then(|| {
        let lease = previous
            .leases
            .iter()
            .find(|l| !l.left)
            .map(|l| match l.renewed_secs_ago {
                Some(ago) => format!("its Lease {} was renewed {ago}s ago ({}s Leases)", l.lease, l.duration_secs),
                None => format!("its Lease {} carries no renewal stamp, so it cannot be shown gone", l.lease),
            })
            .unwrap_or_default();
        format!(
            "refused: the consumer {from} is alive — {lease}; re-home only once it is gone (its Leases not renewed for two lease durations, or marked disconnected)"
        )
    })
}

/// Reads (and, when `apply`, claims) for Connection `name` and previous identity `from`.
pub async fn run(
    consumer: &Client,
    name: &str,
    from: &str,
    transport: Transport,
    apply: bool,
) -> Result<Report, String> {
    let connection = view::connection(consumer, name)
        .await?
        .ok_or_else(|| format!("no Connection {name} on this cluster"))?;
    let uid = kbind_shared::identity::cluster_identity(consumer)
        .await
        .map_err(|e| format!("cannot read this consumer cluster's identity: {e}"))?;
    let view = view::provider(consumer, &connection.spec, transport).await?;
    match view::pin(connection.status.as_ref(), &view.identity) {
        view::Pin::Matches => {}
        view::Pin::Unpinned => {
            return Err(format!(
                "refused: Connection {name} has not pinned its provider's identity yet; let kbind connect first (Ready), so that nothing is written to an unverified cluster"
            ));
        }
        view::Pin::Mismatch { pinned } => {
            return Err(format!(
                "refused: the credential of Connection {name} reaches cluster {}, not the pinned {pinned}",
                view.identity
            ));
        }
    }
    let provider = view.provider;
    let leases = previous_leases(&provider, &connection, from).await?;
    let previous = Previous {
        verdict: previous(&leases).to_owned(),
        leases,
    };
    let refused = refusal(&previous, from, &uid);
    if apply && let Some(why) = &refused {
        return Err(why.clone());
    }
    let heartbeat = kbind_shared::heartbeat::record(provider.kubeconfig.namespace(), name, &uid);
    let mut copies = Vec::new();
    let mut claimed = 0;
    let map = connection.spec.namespaces();
    for crd in managed_crds(consumer).await? {
        let serving = crd.annotations().get(keys::CONNECTION_ANNOTATION).cloned();
        let Some(resource) = kbind_shared::dynamic::instance_resource(&crd) else {
            continue;
        };
        let api = crd.name_any();
        let objects: Api<DynamicObject> = Api::all_with(consumer.clone(), &resource);
        let mut params = ListParams::default().limit(PAGE);
        loop {
            let page = objects
                .list(&params)
                .await
                .map_err(|e| view::read_error(&api, &e))?;
            for object in &page.items {
                if !through(
                    object.annotations().get(keys::ROUTE_ANNOTATION),
                    serving.as_deref(),
                    name,
                ) {
                    continue;
                }
                let namespace = object.namespace();
                // In a boundary the copy lives in the mapped namespace (#51).
                let copy_namespace = map
                    .provider_opt(namespace.as_deref())
                    .map_err(|e| e.to_string())?;
                let copies_api = kbind_shared::dynamic::scoped(
                    &provider.client,
                    copy_namespace.as_deref(),
                    &resource,
                );
                let copy = copies_api.get_opt(&object.name_any()).await.map_err(|e| {
                    view::read_error(&format!("the provider copy of {}", object.name_any()), &e)
                })?;
                let object_uid = object.uid().unwrap_or_default();
                let (verdict, owner) = verdict(
                    copy.as_ref().map(|c| c.annotations()),
                    &uid,
                    &object_uid,
                    from,
                );
                if apply
                    && refused.is_none()
                    && verdict == "claim"
                    && let Some(copy) = &copy
                {
                    let mut body = kbind_shared::ownership::spec_up_body(
                        &resource.api_version,
                        &resource.kind,
                        copy_namespace.as_deref(),
                        &object.name_any(),
                        object.data.get("spec"),
                        &uid,
                        &object_uid,
                        &heartbeat,
                    );
                    // Exactly the copy just read: a copy changed since is not claimed.
                    body["metadata"]["resourceVersion"] =
                        serde_json::json!(copy.resource_version());
                    copies_api
                        .patch(
                            &object.name_any(),
                            &PatchParams::apply(keys::FIELD_MANAGER).force(),
                            &Patch::Apply(&body),
                        )
                        .await
                        .map_err(|e| {
                            format!(
                                "claim the provider copy of {} {}: {}",
                                api,
                                object.name_any(),
                                kbind_shared::identity::describe_error(&e)
                            )
                        })?;
                    claimed += 1;
                }
                copies.push(Copy {
                    api: cell(&api),
                    namespace: namespace.map(|n| cell(&n)),
                    name: cell(&object.name_any()),
                    verdict: verdict.to_owned(),
                    owner,
                });
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = ListParams::default().limit(PAGE).continue_token(&token),
                None => break,
            }
        }
    }
    let mut counts = BTreeMap::new();
    for c in &copies {
        *counts.entry(c.verdict.clone()).or_insert(0) += 1;
    }
    let claim = apply && refused.is_none();
    let claimants = crate::rehome_related::claimants(consumer, name).await?;
    let provider_scopes = kbind_shared::boundary::provider_scopes(consumer, &map, None)
        .await
        .map_err(|e| view::read_error("namespaces", &e))?;
    let (mut related, mut related_claimed) = (Vec::new(), 0);
    for side in [
        crate::rehome_related::Side {
            client: &provider.client,
            name: "provider",
            direction: kbind_shared::api::RelatedDirection::FromConsumer,
            scopes: provider_scopes.clone(),
            map: map.clone(),
        },
        crate::rehome_related::Side {
            client: consumer,
            name: "consumer",
            direction: kbind_shared::api::RelatedDirection::FromProvider,
            scopes: vec![None],
            map: Default::default(),
        },
    ] {
        let (rows, n) =
            crate::rehome_related::copies(&side, &claimants, from, &uid, &heartbeat, claim).await?;
        related.extend(rows);
        related_claimed += n;
    }
    Ok(Report {
        connection: cell(name),
        consumer_uid: uid,
        from: cell(from),
        previous,
        copies,
        counts,
        refused,
        claimed,
        related_counts: crate::rehome_related::counted(&related),
        related,
        related_claimed,
    })
}

/// Whether an object's copy is on Connection `name`'s provider: the Connection its route pin
/// (`<connection>/<provider UID>`, or a bare `<connection>`) names, else the one serving its CRD.
pub fn through(route: Option<&String>, serving: Option<&str>, name: &str) -> bool {
    match route.filter(|r| !r.is_empty()) {
        Some(route) => route.split('/').next() == Some(name),
        None => serving == Some(name),
    }
}

/// The consumer CRDs kbind manages (for any Connection: a route pins objects of another's).
async fn managed_crds(consumer: &Client) -> Result<Vec<CustomResourceDefinition>, String> {
    let managed = ListParams::default().labels(&format!("{}={}", keys::MANAGED_LABEL, keys::TRUE));
    Ok(Api::<CustomResourceDefinition>::all(consumer.clone())
        .list(&managed)
        .await
        .map_err(|e| view::read_error("CustomResourceDefinitions", &e))?
        .items
        .into_iter()
        .filter(|crd| crd.annotations().contains_key(keys::CONNECTION_ANNOTATION))
        .collect())
}

/// The heartbeat Leases that speak for `from` where kbind and the Go konnector renew them: the
/// Connection's Lease namespace and `kbind` (listed; a credential that may not list there is
/// asked for the two names by GET).
async fn previous_leases(
    provider: &kbind_schema_manager::providers::Provider,
    connection: &Connection,
    from: &str,
) -> Result<Vec<LeaseRow>, String> {
    let now = jiff::Timestamp::now().as_second();
    let mut namespaces = vec![
        kbind_shared::heartbeat::lease_namespace(provider.kubeconfig.namespace()).to_owned(),
        kbind_shared::heartbeat::GO_LEASE_NAMESPACE.to_owned(),
    ];
    namespaces.dedup();
    let mut rows = Vec::new();
    for namespace in namespaces {
        let api: Api<Lease> = Api::namespaced(provider.client.clone(), &namespace);
        let found: Vec<Lease> =
            match api.list(&ListParams::default()).await {
                Ok(list) => list.items,
                Err(kube::Error::Api(s)) if s.is_forbidden() => {
                    let mut found = Vec::new();
                    for lease in [
                        kbind_shared::heartbeat::lease_name(&connection.name_any(), from),
                        kbind_shared::heartbeat::go_lease_name(from),
                    ] {
                        if let Some(l) = api.get_opt(&lease).await.map_err(|e| {
                            view::read_error(&format!("Lease {namespace}/{lease}"), &e)
                        })? {
                            found.push(l);
                        }
                    }
                    found
                }
                Err(e) => return Err(view::read_error(&format!("the Leases in {namespace}"), &e)),
            };
        for lease in &found {
            let Some(seen) = facts::lease_seen(&namespace, lease).filter(|s| s.uid == from) else {
                continue;
            };
            rows.push(LeaseRow {
                lease: cell(&seen.key),
                renewed_secs_ago: facts::written_at(&lease.metadata, &["f:spec", "f:renewTime"])
                    .map(|at| (now - at).max(0)),
                duration_secs: seen.duration_secs,
                left: seen.left,
            });
        }
    }
    Ok(rows)
}

/// The report as text.
pub fn render(report: &Report) -> String {
    let mut out = format!(
        "Connection {}: this consumer is {}; the previous identity {} is {}.\n",
        report.connection, report.consumer_uid, report.from, report.previous.verdict
    );
    if !report.previous.leases.is_empty() {
        let rows: Vec<Vec<String>> = report
            .previous
            .leases
            .iter()
            .map(|l| {
                vec![
                    l.lease.clone(),
                    l.renewed_secs_ago
                        .map(|s| view::age(s.unsigned_abs()))
                        .unwrap_or_else(|| "-".into()),
                    format!("{}s", l.duration_secs),
                    if l.left { "yes" } else { "no" }.into(),
                ]
            })
            .collect();
        out.push_str(&view::table(
            &["LEASE", "RENEWED", "DURATION", "LEFT"],
            &rows,
        ));
    }
    let counts: Vec<String> = report
        .counts
        .iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect();
    out.push_str(&format!(
        "\nCopies: {}\n",
        if counts.is_empty() {
            "none".into()
        } else {
            counts.join(", ")
        }
    ));
    let rows: Vec<Vec<String>> = report
        .copies
        .iter()
        .filter(|c| c.verdict != "ours")
        .take(SHOWN)
        .map(|c| {
            vec![
                c.api.clone(),
                format!(
                    "{}{}",
                    c.namespace
                        .as_deref()
                        .map(|n| format!("{n}/"))
                        .unwrap_or_default(),
                    c.name
                ),
                c.verdict.clone(),
                c.owner.clone().unwrap_or_default(),
            ]
        })
        .collect();
    if !rows.is_empty() {
        out.push_str(&view::table(&["API", "OBJECT", "VERDICT", "OWNER"], &rows));
    }
    if !report.related.is_empty() {
        let counts: Vec<String> = report
            .related_counts
            .iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect();
        out.push_str(&format!("\nRelated copies: {}\n", counts.join(", ")));
        let rows: Vec<Vec<String>> = report
            .related
            .iter()
            .take(SHOWN)
            .map(|r| {
                vec![
                    r.side.clone(),
                    format!("{} {}/{}", r.kind, r.namespace, r.name),
                    r.verdict.clone(),
                    r.binding.clone().unwrap_or_default(),
                ]
            })
            .collect();
        out.push_str(&view::table(&["SIDE", "COPY", "VERDICT", "BINDING"], &rows));
    }
    match (&report.refused, report.claimed) {
        (Some(why), _) => out.push_str(&format!("\n{why}\n")),
        (None, 0) => out.push_str(&format!(
            "\n`kubectl kbind rehome apply --connection {} --from {}` claims the {} copy(ies) and {} related copy(ies) marked claim: one write each.\n",
            report.connection,
            report.from,
            report.counts.get("claim").copied().unwrap_or_default(),
            report.related_counts.get("claim").copied().unwrap_or_default()
        )),
        (None, n) => out.push_str(&format!(
            "\nClaimed {n} copy(ies) and {} related copy(ies).\n",
            report.related_claimed
        )),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(ago: Option<i64>, left: bool) -> LeaseRow {
        LeaseRow {
            lease: "kbind/provider-0123456789".into(),
            renewed_secs_ago: ago,
            duration_secs: 60,
            left,
        }
    }

    #[test]
    fn a_previous_identity_is_gone_only_when_no_lease_says_it_lives() {
        for (leases, want) in [
            (vec![], "no-lease"),
            (vec![lease(Some(30), false)], "alive"),
            (vec![lease(Some(120), false)], "alive"),
            (vec![lease(Some(121), false)], "stale"),
            // No stamp: cannot be shown gone.
            (vec![lease(None, false)], "alive"),
            (vec![lease(Some(5), true)], "left"),
            (vec![lease(Some(5), true), lease(Some(500), false)], "stale"),
            (
                vec![lease(Some(500), false), lease(Some(5), false)],
                "alive",
            ),
        ] {
            assert_eq!(previous(&leases), want, "{leases:?}");
        }
    }

    #[test]
    fn only_the_previous_identitys_copies_are_claimed() {
        let markers = |cluster: &str, object: &str| {
            BTreeMap::from([
                (
                    keys::CONSUMER_CLUSTER_UID_ANNOTATION.to_owned(),
                    cluster.to_owned(),
                ),
                (
                    keys::CONSUMER_OBJECT_UID_ANNOTATION.to_owned(),
                    object.to_owned(),
                ),
            ])
        };
        let (old, new) = ("old-uid", "new-uid");
        assert_eq!(verdict(None, new, "o", old), ("absent", None));
        assert_eq!(
            verdict(Some(&markers(new, "o")), new, "o", old),
            ("ours", None)
        );
        assert_eq!(
            verdict(Some(&BTreeMap::new()), new, "o", old),
            ("unmarked", None)
        );
        assert_eq!(
            verdict(Some(&markers(old, "x")), new, "o", old),
            ("claim", None)
        );
        assert_eq!(
            verdict(Some(&markers("third", "x")), new, "o", old),
            ("another", Some("third".into()))
        );
        // This consumer's copy of another object under the name (a stale object UID) is not
        // the previous identity's.
        assert_eq!(
            verdict(Some(&markers(new, "x")), new, "o", old).0,
            "another"
        );
        assert_eq!(verdict(Some(&markers("", "x")), new, "o", "").0, "another");
    }

    #[test]
    fn an_objects_copy_is_where_its_route_pin_or_its_crd_says() {
        let pin = |c: &str| Some(c.to_owned());
        assert!(through(None, Some("p"), "p"));
        assert!(!through(None, Some("q"), "p"));
        assert!(through(pin("p").as_ref(), Some("q"), "p"));
        assert!(!through(pin("q").as_ref(), Some("p"), "p"));
        assert!(through(pin("").as_ref(), Some("p"), "p"));
        assert!(through(pin("p/0123-provider").as_ref(), Some("q"), "p"));
        assert!(!through(pin("q/0123-provider").as_ref(), Some("p"), "p"));
    }

    #[test]
    fn a_live_previous_identity_or_this_one_is_refused_in_one_line() {
        let alive = Previous {
            verdict: "alive".into(),
            leases: vec![lease(Some(3), false)],
        };
        let why = refusal(&alive, "old", "new").unwrap();
        assert!(
            why.starts_with("refused: the consumer old is alive — its Lease kbind/provider-0123456789 was renewed 3s ago"),
            "{why}"
        );
        assert!(!why.contains('\n'));
        let gone = Previous {
            verdict: "stale".into(),
            leases: vec![lease(Some(300), false)],
        };
        assert_eq!(refusal(&gone, "old", "new"), None);
        assert!(refusal(&gone, "new", "new").unwrap().contains("own UID"));
    }
}
