//! autoBind (REFERENCE-BEHAVIOUR §7): a ClusterBinding named after the Connection, listing every
//! exported API, owned by the Connection.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kbind_shared::api::{ClusterBinding, Connection, ConnectionStatus, MissingExport};
use kbind_shared::conditions::{Desired, reasons, types};
use kbind_shared::keys;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Value, json};

use crate::caches::Cached;

const FIELD_MANAGER: &str = "kbind-schema-manager";

/// AUTO-1: the ClusterBinding's fields kbind owns (server-side apply leaves the rest, such as
/// `conflictPolicy` and `relatedResources`, to the user).
pub fn desired(connection: &Connection, apis: &[String]) -> Value {
    let owner = connection.controller_owner_ref(&()).map(|mut o| {
        o.block_owner_deletion = Some(true);
        o
    });
    json!({
        "apiVersion": "core.kbind.io/v1alpha1",
        "kind": "ClusterBinding",
        "metadata": {
            "name": connection.name_any(),
            "labels": { keys::MANAGED_LABEL: keys::TRUE },
            "ownerReferences": owner.into_iter().collect::<Vec<_>>(),
        },
        "spec": {
            "connectionRef": { "name": connection.name_any() },
            "apis": apis.iter().map(|name| json!({ "name": name })).collect::<Vec<_>>(),
        },
    })
}

/// Whether `binding` is controlled by `connection` (so kbind may delete it).
fn controlled_by(binding: &ClusterBinding, connection: &Connection) -> bool {
    let uid = connection.meta().uid.as_deref();
    binding
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && Some(o.uid.as_str()) == uid)
}

/// The APIs the autoBind ClusterBinding lists, and the missing exports still in their grace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// Sorted names to list.
    pub apis: Vec<String>,
    /// APIs listed though no longer exported, with when that was first seen.
    pub missing: Vec<MissingExport>,
    /// APIs whose grace ran out now: no longer listed (their CRDs and objects are kept).
    pub dropped: Vec<String>,
}

/// Safe by default (improving AUTO-3/AUTO-4): an API the binding lists stays listed until it has
/// been missing from the exports for `grace` of wall-clock time, counted from `missing` (kept in
/// the Connection's status, so a restart or a fast second discovery resets nothing).
pub fn listing(
    exports: &[String],
    listed: &[String],
    missing: &[MissingExport],
    now: jiff::Timestamp,
    grace: std::time::Duration,
) -> Listing {
    let mut apis: Vec<String> = exports.to_vec();
    let (mut still_missing, mut dropped) = (Vec::new(), Vec::new());
    for name in listed.iter().filter(|l| !exports.contains(l)) {
        let since = missing
            .iter()
            .find(|m| m.name == *name)
            .map_or(now, |m| m.since.0);
        let expired = jiff::SignedDuration::try_from(grace)
            .ok()
            .and_then(|g| since.checked_add(g).ok())
            .is_some_and(|end| end <= now);
        if expired {
            dropped.push(name.clone());
        } else {
            apis.push(name.clone());
            still_missing.push(MissingExport {
                name: name.clone(),
                since: Time(since),
            });
        }
    }
    apis.sort_unstable();
    apis.dedup();
    still_missing.sort_by(|a, b| a.name.cmp(&b.name));
    Listing {
        apis,
        missing: still_missing,
        dropped,
    }
}

/// The Connection's `Unbound` condition: exports missing within their grace, and CRDs kept after
/// their automatic binding went away (annotated `core.kbind.io/unbound`).
pub fn unbound_condition(
    missing: &[MissingExport],
    kept: &[String],
    grace: std::time::Duration,
) -> Desired<'static> {
    if !missing.is_empty() {
        let list: Vec<String> = missing
            .iter()
            .map(|m| format!("{} (since {})", m.name, m.since.0))
            .collect();
        return Desired::new(
            types::UNBOUND,
            true,
            EXPORTS_MISSING,
            format!(
                "missing from the provider's exports: {}; autoBind stops binding them after {} (their CRDs and objects are kept)",
                list.join(", "),
                humantime::format_duration(grace)
            ),
        );
    }
    if !kept.is_empty() {
        return Desired::new(
            types::UNBOUND,
            true,
            CRDS_KEPT,
            format!(
                "no longer bound automatically; kbind kept their CRDs and objects (annotated {}): {}",
                keys::UNBOUND_ANNOTATION,
                kept.join(", ")
            ),
        );
    }
    Desired::new(types::UNBOUND, false, reasons::AS_EXPECTED, "")
}

/// Reason: exports are missing, within their grace period.
pub const EXPORTS_MISSING: &str = "ExportsMissing";
/// Reason: CRDs were kept after their automatic binding went away.
pub const CRDS_KEPT: &str = "CRDsKept";

/// Whether `existing` already is what [`desired`] would apply.
fn is_current(existing: &ClusterBinding, connection: &Connection, apis: &[String]) -> bool {
    let have: Vec<&str> = existing.spec.apis.iter().map(|a| a.name.as_str()).collect();
    controlled_by(existing, connection)
        && have == apis.iter().map(String::as_str).collect::<Vec<_>>()
        && existing.spec.connection_ref.name == connection.name_any()
        && existing
            .labels()
            .get(keys::MANAGED_LABEL)
            .map(String::as_str)
            == Some(keys::TRUE)
}

/// What autoBind does about the ClusterBinding named after the Connection.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    /// autoBind is on and a ClusterBinding of that name is someone else's: never taken over.
    LeaveTheirs,
    /// Nothing to write: the missing exports to record, the APIs dropped.
    Stand(Vec<MissingExport>, Vec<String>),
    /// Delete autoBind's ClusterBinding (autoBind is off, or nothing is left to list).
    Delete(Vec<MissingExport>, Vec<String>),
    /// Apply the listing of `apis`.
    Apply {
        apis: Vec<String>,
        missing: Vec<MissingExport>,
        dropped: Vec<String>,
    },
}

/// AUTO-1 … AUTO-4, safe by default, decided from `existing` (the ClusterBinding named after the
/// Connection, if any) at `now`: write only when the ClusterBinding differs, record the missing
/// exports, and delete the ClusterBinding only when autoBind is off or nothing is left to list —
/// and only one this Connection controls (the reference deleted any with the name, QRK-6).
fn plan(
    existing: Option<&ClusterBinding>,
    connection: &Connection,
    status: &ConnectionStatus,
    now: jiff::Timestamp,
    grace: std::time::Duration,
) -> Step {
    let ours = existing.filter(|b| controlled_by(b, connection));
    if !connection.spec.auto_bind {
        // Nothing missing is recorded; someone else's binding of that name is theirs.
        return match ours {
            Some(_) => Step::Delete(Vec::new(), Vec::new()),
            None => Step::Stand(Vec::new(), Vec::new()),
        };
    }
    if existing.is_some() && ours.is_none() {
        return Step::LeaveTheirs;
    }
    let exports: Vec<String> = status
        .exported_names()
        .into_iter()
        .map(str::to_owned)
        .collect();
    let listed: Vec<String> = ours
        .map(|b| b.spec.apis.iter().map(|a| a.name.clone()).collect())
        .unwrap_or_default();
    let Listing {
        apis,
        missing,
        dropped,
    } = listing(&exports, &listed, &status.missing_exports, now, grace);
    match ours {
        _ if apis.is_empty() && listed.is_empty() => Step::Stand(missing, dropped),
        _ if apis.is_empty() => Step::Delete(missing, dropped),
        Some(ours) if is_current(ours, connection, &apis) => Step::Stand(missing, dropped),
        _ => Step::Apply {
            apis,
            missing,
            dropped,
        },
    }
}

/// Carries out [`plan`]: applies or deletes the ClusterBinding when it must, and records the
/// missing exports in `status`. Removing the ClusterBinding never deletes a CRD or an object (see
/// `binding::release`). Returns the APIs dropped now.
///
/// `cached`: the ClusterBinding named after the Connection as the term's watch shows it. A plan
/// from it that writes nothing stands; anything else is planned again from a fresh read.
pub async fn reconcile(
    consumer: &Client,
    connection: &Connection,
    status: &mut ConnectionStatus,
    grace: std::time::Duration,
    cached: Cached<&ClusterBinding>,
) -> Result<Vec<String>, String> {
    let shown = match cached {
        Cached::NoTerm => None,
        Cached::Absent => Some(None),
        Cached::Present(binding) => Some(Some(binding)),
    };
    if let Some(shown) = shown
        && let Step::Stand(missing, dropped) =
            plan(shown, connection, status, jiff::Timestamp::now(), grace)
    {
        status.missing_exports = missing;
        return Ok(dropped);
    }
    let bindings: Api<ClusterBinding> = Api::all(consumer.clone());
    let name = connection.name_any();
    let existing = bindings.get_opt(&name).await.map_err(|e| {
        format!(
            "read ClusterBinding {name}: {}",
            kbind_shared::identity::describe_error(&e)
        )
    })?;
    match plan(
        existing.as_ref(),
        connection,
        status,
        jiff::Timestamp::now(),
        grace,
    ) {
        Step::LeaveTheirs => {
            tracing::warn!(connection = %name, "a ClusterBinding named after the Connection exists and is not autoBind's; autoBind leaves it alone");
            Ok(Vec::new())
        }
        Step::Stand(missing, dropped) => {
            status.missing_exports = missing;
            Ok(dropped)
        }
        Step::Delete(missing, dropped) => {
            status.missing_exports = missing;
            delete_owned(consumer, connection).await?;
            Ok(dropped)
        }
        Step::Apply {
            apis,
            missing,
            dropped,
        } => {
            status.missing_exports = missing;
            bindings
                .patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(desired(connection, &apis)),
                )
                .await
                .map_err(|e| {
                    format!(
                        "apply autoBind ClusterBinding {name}: {}",
                        kbind_shared::identity::describe_error(&e)
                    )
                })?;
            Ok(dropped)
        }
    }
}

/// CDEL-2: requests deletion of the autoBind ClusterBinding — only if this Connection controls
/// it, never a user's ClusterBinding that happens to have the Connection's name.
pub async fn delete_owned(consumer: &Client, connection: &Connection) -> Result<(), String> {
    let name = connection.name_any();
    let api = Api::<ClusterBinding>::all(consumer.clone());
    let Some(existing) = api.get_opt(&name).await.map_err(|e| {
        format!(
            "read ClusterBinding {name}: {}",
            kbind_shared::identity::describe_error(&e)
        )
    })?
    else {
        return Ok(());
    };
    if !controlled_by(&existing, connection) {
        return Ok(());
    }
    let params = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: existing.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    delete_precise(consumer, &name, &params).await
}

async fn delete_precise(
    consumer: &Client,
    name: &str,
    params: &DeleteParams,
) -> Result<(), String> {
    match Api::<ClusterBinding>::all(consumer.clone())
        .delete(name, params)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => Ok(()),
        Err(e) => Err(format!(
            "delete autoBind ClusterBinding {name}: {}",
            kbind_shared::identity::describe_error(&e)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kbind_shared::api::ConnectionSpec;

    #[test]
    fn a_missing_export_stays_listed_for_the_grace_period() {
        let t0 = jiff::Timestamp::from_second(1_000_000).unwrap();
        let grace = std::time::Duration::from_secs(600);
        let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let missing = |name: &str, at: jiff::Timestamp| MissingExport {
            name: name.into(),
            since: Time(at),
        };
        let at = |secs: i64| {
            t0.checked_add(jiff::SignedDuration::from_secs(secs))
                .unwrap()
        };
        // (exports, listed, recorded missing, now) → (apis, missing, dropped)
        let cases = [
            // New exports are listed, sorted.
            (
                names(&["b", "a"]),
                names(&[]),
                vec![],
                t0,
                names(&["a", "b"]),
                vec![],
                names(&[]),
            ),
            // Gone now: still listed, its absence recorded from now.
            (
                names(&["a"]),
                names(&["a", "b"]),
                vec![],
                t0,
                names(&["a", "b"]),
                vec![missing("b", t0)],
                names(&[]),
            ),
            // Two empty discoveries in a row, a moment apart: nothing dropped (the old guard).
            (
                names(&[]),
                names(&["a"]),
                vec![missing("a", t0)],
                at(1),
                names(&["a"]),
                vec![missing("a", t0)],
                names(&[]),
            ),
            // Back before the grace ran out: the record is cleared.
            (
                names(&["a", "b"]),
                names(&["a", "b"]),
                vec![missing("b", t0)],
                at(599),
                names(&["a", "b"]),
                vec![],
                names(&[]),
            ),
            // Missing for the whole grace: dropped.
            (
                names(&["a"]),
                names(&["a", "b"]),
                vec![missing("b", t0)],
                at(600),
                names(&["a"]),
                vec![],
                names(&["b"]),
            ),
            (
                names(&[]),
                names(&["a"]),
                vec![missing("a", t0)],
                at(601),
                names(&[]),
                vec![],
                names(&["a"]),
            ),
        ];
        for (exports, listed, recorded, now, apis, still, dropped) in cases {
            let got = listing(&exports, &listed, &recorded, now, grace);
            assert_eq!(
                got,
                Listing {
                    apis,
                    missing: still,
                    dropped
                },
                "{exports:?} {listed:?} {recorded:?} {now}"
            );
        }
        // A grace no timestamp can hold never expires (and never panics).
        let got = listing(
            &[],
            &names(&["a"]),
            &[missing("a", t0)],
            at(10),
            std::time::Duration::MAX,
        );
        assert_eq!(got.apis, names(&["a"]));
    }

    #[test]
    fn the_unbound_condition_says_what_is_missing_and_what_was_kept() {
        use kbind_shared::conditions::Status;
        let grace = std::time::Duration::from_secs(600);
        let t0 = Time(jiff::Timestamp::from_second(1_000_000).unwrap());
        let missing = [MissingExport {
            name: "widgets.example.org".into(),
            since: t0,
        }];
        let kept = ["gadgets.example.org".to_owned()];
        let none = unbound_condition(&[], &[], grace);
        assert_eq!((none.status, none.reason), (Status::False, "AsExpected"));
        let pending = unbound_condition(&missing, &kept, grace);
        assert_eq!(
            (pending.status, pending.reason),
            (Status::True, EXPORTS_MISSING)
        );
        assert!(
            pending
                .message
                .contains("widgets.example.org (since 1970-01-12T13:46:40Z)")
                && pending.message.contains("after 10m"),
            "{}",
            pending.message
        );
        let dropped = unbound_condition(&[], &kept, grace);
        assert_eq!((dropped.status, dropped.reason), (Status::True, CRDS_KEPT));
        assert!(
            dropped.message.ends_with("gadgets.example.org"),
            "{}",
            dropped.message
        );
    }

    #[test]
    fn desired_binding_lists_sorted_exports_and_is_owned_by_the_connection() {
        let mut connection = Connection::new(
            "provider",
            ConnectionSpec {
                auto_bind: true,
                ..ConnectionSpec::for_secret("kbind", "p")
            },
        );
        connection.metadata.uid = Some("conn-uid".into());
        let body = desired(
            &connection,
            &[
                "gadgets.example.org".to_owned(),
                "widgets.example.org".to_owned(),
            ],
        );
        assert_eq!(
            body["spec"]["apis"],
            json!([{ "name": "gadgets.example.org" }, { "name": "widgets.example.org" }])
        );
        assert_eq!(body["spec"]["connectionRef"]["name"], "provider");
        assert_eq!(body["metadata"]["labels"]["core.kbind.io/managed"], "true");
        let owner = &body["metadata"]["ownerReferences"][0];
        assert_eq!(
            (
                owner["uid"].as_str(),
                owner["controller"].as_bool(),
                owner["blockOwnerDeletion"].as_bool()
            ),
            (Some("conn-uid"), Some(true), Some(true))
        );
        assert!(body["spec"].get("conflictPolicy").is_none());
    }

    #[test]
    fn the_plan_writes_only_what_differs_and_never_takes_a_users_binding() {
        use kbind_shared::api::{ApiScope, ExportedApi};
        let t0 = jiff::Timestamp::from_second(1_000_000).unwrap();
        let grace = std::time::Duration::from_secs(600);
        let connection = |auto_bind: bool| {
            let mut c = Connection::new(
                "provider",
                ConnectionSpec {
                    auto_bind,
                    ..ConnectionSpec::for_secret("kbind", "p")
                },
            );
            c.metadata.uid = Some("conn-uid".into());
            c
        };
        let ours = |apis: &[&str]| -> ClusterBinding {
            let apis: Vec<String> = apis.iter().map(|a| (*a).to_owned()).collect();
            serde_json::from_value(desired(&connection(true), &apis)).unwrap()
        };
        let mut users = ours(&["a"]);
        users.metadata.owner_references = None;
        let status = |exports: &[&str], missing: &[(&str, i64)]| ConnectionStatus {
            exported_apis: exports
                .iter()
                .map(|name| ExportedApi {
                    name: (*name).into(),
                    group: "example.org".into(),
                    resource: (*name).into(),
                    scope: ApiScope::Namespaced,
                    versions: vec!["v1".into()],
                    omitted_versions: Vec::new(),
                })
                .collect(),
            missing_exports: missing
                .iter()
                .map(|(name, at)| MissingExport {
                    name: (*name).into(),
                    since: Time(jiff::Timestamp::from_second(*at).unwrap()),
                })
                .collect(),
            ..Default::default()
        };
        let recorded = |name: &str, at: i64| MissingExport {
            name: name.into(),
            since: Time(jiff::Timestamp::from_second(at).unwrap()),
        };
        let nothing = Step::Stand(Vec::new(), Vec::new());
        let cases: Vec<(&str, bool, Option<ClusterBinding>, ConnectionStatus, Step)> = vec![
            (
                "off, none",
                false,
                None,
                status(&["a"], &[]),
                nothing.clone(),
            ),
            (
                "off, ours: delete",
                false,
                Some(ours(&["a"])),
                status(&["a"], &[]),
                Step::Delete(Vec::new(), Vec::new()),
            ),
            (
                "off, the user's: theirs, and nothing missing is recorded",
                false,
                Some(users.clone()),
                status(&["a"], &[("a", 1)]),
                nothing.clone(),
            ),
            (
                "on, the user's: left alone",
                true,
                Some(users),
                status(&["a"], &[]),
                Step::LeaveTheirs,
            ),
            (
                "on, none: create",
                true,
                None,
                status(&["a"], &[]),
                Step::Apply {
                    apis: vec!["a".into()],
                    missing: Vec::new(),
                    dropped: Vec::new(),
                },
            ),
            (
                "on, current",
                true,
                Some(ours(&["a"])),
                status(&["a"], &[]),
                nothing.clone(),
            ),
            (
                "on, a new export: apply",
                true,
                Some(ours(&["a"])),
                status(&["a", "b"], &[]),
                Step::Apply {
                    apis: vec!["a".into(), "b".into()],
                    missing: Vec::new(),
                    dropped: Vec::new(),
                },
            ),
            (
                "on, an export missing within its grace",
                true,
                Some(ours(&["a", "b"])),
                status(&["a"], &[("b", 999_900)]),
                Step::Stand(vec![recorded("b", 999_900)], Vec::new()),
            ),
            (
                "on, an export missing past its grace: apply",
                true,
                Some(ours(&["a", "b"])),
                status(&["a"], &[("b", 1)]),
                Step::Apply {
                    apis: vec!["a".into()],
                    missing: Vec::new(),
                    dropped: vec!["b".into()],
                },
            ),
            (
                "on, the last export missing past its grace: delete",
                true,
                Some(ours(&["b"])),
                status(&[], &[("b", 1)]),
                Step::Delete(Vec::new(), vec!["b".into()]),
            ),
            (
                "on, no exports, none",
                true,
                None,
                status(&[], &[]),
                nothing,
            ),
        ];
        for (name, auto_bind, existing, status, want) in cases {
            let got = plan(
                existing.as_ref(),
                &connection(auto_bind),
                &status,
                t0,
                grace,
            );
            assert_eq!(got, want, "{name}");
        }
    }
}
