use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kbind_shared::api::ApiRef;
use kbind_shared::api::catalog::{ExportStatus, OFFERED};
use kbind_shared::api::iam::{GrantConsumer, GrantSpec};
use std::collections::BTreeMap;

const B: &str = "kbind-0123456789";

fn ns(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Namespace {
    let map = |pairs: &[(&str, &str)]| {
        Some(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>(),
        )
    };
    Namespace {
        metadata: ObjectMeta {
            name: Some(B.into()),
            labels: map(labels),
            annotations: map(annotations),
            resource_version: Some("7".into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    }
}

fn issuers(grant: &str, uid: &str) -> Namespace {
    ns(
        &[(BOUNDARY_LABEL, B), (MANAGED_BY_LABEL, MANAGED_BY)],
        &[(GRANT_ANNOTATION, grant), (GRANT_UID_ANNOTATION, uid)],
    )
}

#[test]
fn a_boundary_is_created_held_reclaimed_or_refused_never_adopted() {
    let live = |name: &str| match name {
        "other" => Some("u-other".to_owned()),
        "mine" => Some("u-mine".to_owned()),
        _ => None,
    };
    let cases: [(&str, Option<Namespace>, Claim); 8] = [
        ("nothing there", None, Claim::Create),
        ("ours", Some(issuers("mine", "u-mine")), Claim::Held),
        (
            "another live Grant's",
            Some(issuers("other", "u-other")),
            Claim::ClaimedBy("other".into()),
        ),
        (
            "a deleted Grant's",
            Some(issuers("gone", "u-gone")),
            Claim::Reclaim("7".into()),
        ),
        (
            "an earlier Grant of this name (re-granted)",
            Some(issuers("mine", "u-old")),
            Claim::Reclaim("7".into()),
        ),
        (
            "a live name whose UID is not the claim's (recreated)",
            Some(issuers("other", "u-older")),
            Claim::Reclaim("7".into()),
        ),
        ("someone's namespace", Some(ns(&[], &[])), Claim::Taken),
        (
            "the boundary label forged without the issuer's",
            Some(ns(
                &[(BOUNDARY_LABEL, B)],
                &[(GRANT_UID_ANNOTATION, "u-mine")],
            )),
            Claim::Taken,
        ),
    ];
    for (what, namespace, want) in cases {
        assert_eq!(
            claim("mine", "u-mine", B, namespace.as_ref(), live),
            want,
            "{what}"
        );
    }
}

fn export(generation: i64, observed: i64, offered: bool) -> Export {
    let mut export = Export::new(
        "widgets",
        kbind_shared::api::catalog::ExportSpec {
            title: "W".into(),
            description: None,
            docs: None,
            apis: vec![ApiRef {
                name: "widgets.example.org".into(),
            }],
            defaults: None,
        },
    );
    export.metadata.generation = Some(generation);
    let mut conditions = Vec::new();
    conditions::set(
        &mut conditions,
        Desired::new(OFFERED, offered, "X", "not served: widgets.example.org"),
        Some(observed),
        &now(),
    );
    export.status = Some(ExportStatus {
        observed_generation: Some(observed),
        apis: Vec::new(),
        conditions,
    });
    export
}

fn now() -> Time {
    Time(jiff::Timestamp::from_second(1_000).unwrap_or_default())
}

#[test]
fn an_export_is_offered_only_when_its_current_status_says_so() {
    assert!(offered("widgets", Some(&export(2, 2, true))).is_ok());
    let reason = |e: Option<&Export>| offered("widgets", e).err().map(|(r, _)| r);
    assert_eq!(reason(None), Some(reasons::EXPORT_NOT_FOUND));
    assert_eq!(
        reason(Some(&export(2, 2, false))),
        Some(reasons::EXPORT_NOT_OFFERED)
    );
    // Edited and not looked at yet: not offered until it is.
    assert_eq!(
        reason(Some(&export(3, 2, true))),
        Some(reasons::EXPORT_NOT_OFFERED)
    );
    let (_, message) = offered("widgets", Some(&export(2, 2, false)))
        .err()
        .unwrap_or_default();
    assert!(
        message.contains("not served: widgets.example.org"),
        "{message}"
    );
}

#[test]
fn only_a_held_boundary_is_kept_without_an_offer_and_a_taken_one_is_refused_first() {
    let spec = export(1, 1, true).spec;
    let ok: Result<&ExportSpec, (&str, String)> = Ok(&spec);
    let gone: Result<&ExportSpec, (&str, String)> = Err((reasons::EXPORT_NOT_FOUND, "no".into()));
    let refused = |d: Decision<'_>| match d {
        Decision::Refuse { reason, .. } => Some(reason),
        Decision::Provision { .. } => None,
    };
    assert_eq!(
        refused(decide(Claim::Taken, &ok, B)),
        Some(reasons::BOUNDARY_TAKEN)
    );
    assert_eq!(
        refused(decide(Claim::ClaimedBy("x".into()), &ok, B)),
        Some(reasons::BOUNDARY_CLAIMED)
    );
    assert_eq!(
        refused(decide(Claim::Create, &gone, B)),
        Some(reasons::EXPORT_NOT_FOUND)
    );
    assert_eq!(
        refused(decide(Claim::Reclaim("1".into()), &gone, B)),
        Some(reasons::EXPORT_NOT_FOUND)
    );
    assert_eq!(
        decide(Claim::Held, &gone, B),
        Decision::Provision {
            claim: Claim::Held,
            export: None
        }
    );
    assert_eq!(
        decide(Claim::Create, &ok, B),
        Decision::Provision {
            claim: Claim::Create,
            export: Some(&spec)
        }
    );
}

fn names(objects: &[Object]) -> Vec<(Kind, Option<&str>, &str)> {
    objects
        .iter()
        .map(|o| (o.kind, o.namespace.as_deref(), o.name.as_str()))
        .collect()
}

#[test]
fn a_grant_has_its_account_roles_and_bindings_and_a_revoked_one_loses_only_the_bindings() {
    let spec = export(1, 1, true).spec;
    let sub = vec![format!("{B}-team-a")];
    let (wanted, unwanted) = objects(("g", "u"), B, Some(&spec), false, &sub);
    let sync = sync_role(B);
    let cluster = cluster_role(B);
    let sub_ns = sub[0].as_str();
    assert_eq!(
        names(&wanted),
        [
            (Kind::ServiceAccount, Some(B), "kbind-consumer"),
            (Kind::Role, Some(B), "kbind-consumer"),
            (Kind::ClusterRole, None, sync.as_str()),
            (Kind::ClusterRole, None, cluster.as_str()),
            (Kind::RoleBinding, Some(B), "kbind-consumer"),
            (Kind::ClusterRoleBinding, None, cluster.as_str()),
            (Kind::RoleBinding, Some(sub_ns), "kbind-consumer"),
        ]
    );
    assert!(unwanted.is_empty());
    for o in &wanted {
        let meta = &o.body["metadata"];
        assert_eq!(meta["labels"][BOUNDARY_LABEL], B);
        assert_eq!(meta["annotations"][GRANT_ANNOTATION], "g");
        assert_eq!(meta["ownerReferences"][0]["uid"], "u");
        assert_eq!(meta["ownerReferences"][0]["kind"], "Grant");
    }
    // The sub-namespace's binding grants the sync rules, to the boundary's account.
    let sub_binding = &wanted[6].body;
    assert_eq!(sub_binding["roleRef"]["name"], sync.as_str());
    assert_eq!(sub_binding["subjects"][0]["namespace"], B);

    let (kept, removed) = objects(("g", "u"), B, Some(&spec), true, &sub);
    assert_eq!(names(&kept), names(&wanted)[..4]);
    assert_eq!(names(&removed), names(&wanted)[4..]);

    // No offer: the roles written before stay as they were.
    let (kept, _) = objects(("g", "u"), B, None, false, &[]);
    assert!(kept.iter().all(|o| o.kind != Kind::ClusterRole));
}

#[test]
fn the_namespaces_of_a_boundary_are_named_after_it_and_labelled_with_it() {
    let labelled = [
        (B, B),
        ("kbind-0123456789-team-a", B),
        ("kbind-01234567890", B),
        ("other", B),
        ("kbind-0123456789-b", B),
        // Named like one of it, labelled with another boundary: not its.
        ("kbind-0123456789-c", "kbind-9999999999"),
    ];
    assert_eq!(
        namespaces_of(B, labelled),
        ["kbind-0123456789-b", "kbind-0123456789-team-a"]
    );
}

#[test]
fn a_cached_object_holds_what_is_wanted_when_every_wanted_field_matches() {
    let want = json!({ "metadata": { "labels": { "a": "1" } }, "rules": [{ "verbs": ["get"] }] });
    let cases = [
        (
            json!({ "metadata": { "labels": { "a": "1", "b": "2" }, "uid": "x" }, "rules": [{ "verbs": ["get"], "apiGroups": [""] }] }),
            true,
        ),
        (
            json!({ "metadata": { "labels": { "a": "2" } }, "rules": [{ "verbs": ["get"] }] }),
            false,
        ),
        (
            json!({ "metadata": { "labels": { "a": "1" } }, "rules": [{ "verbs": ["get", "list"] }] }),
            false,
        ),
        (
            json!({ "metadata": { "labels": { "a": "1" } }, "rules": [{ "verbs": ["get"] }, {}] }),
            false,
        ),
        (
            json!({ "metadata": {} , "rules": [{ "verbs": ["get"] }] }),
            false,
        ),
    ];
    for (i, (cached, want_holds)) in cases.into_iter().enumerate() {
        assert_eq!(holds(&cached, &want), want_holds, "case {i}");
    }
    // A null wanted (an absent optional) is no difference.
    assert!(holds(&json!({}), &json!({ "resourceNames": null })));
}

fn grant(revoked: bool) -> Grant {
    let mut g = Grant::new(
        "g",
        GrantSpec {
            export: "widgets".into(),
            consumer: GrantConsumer {
                identity: "alice".into(),
                cluster_name: None,
            },
            credential: Default::default(),
            revoked,
        },
    );
    g.metadata.generation = Some(4);
    g
}

#[test]
fn the_status_says_issued_revoked_or_refused_and_keeps_the_offer_apart() {
    let spec = export(1, 1, true).spec;
    let ok: Result<&ExportSpec, (&str, String)> = Ok(&spec);
    let gone: Result<&ExportSpec, (&str, String)> =
        Err((reasons::EXPORT_NOT_FOUND, "no Export widgets".into()));
    let provision = Decision::Provision {
        claim: Claim::Held,
        export: None,
    };
    let condition = |s: &GrantStatus, t: &str| {
        conditions::find(&s.conditions, t)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
            .unwrap_or_default()
    };

    let issued = status(&grant(false), B, &provision, &ok, &now());
    assert_eq!(issued.boundary.as_deref(), Some(B));
    assert_eq!(issued.service_account.as_deref(), Some("kbind-consumer"));
    assert_eq!(issued.observed_generation, Some(4));
    let (s, r, m) = condition(&issued, types::ISSUED);
    assert_eq!((s.as_str(), r.as_str()), ("True", reasons::ISSUED));
    assert!(m.contains("kbind-0123456789/kbind-consumer"), "{m}");

    let revoked = status(&grant(true), B, &provision, &ok, &now());
    assert_eq!(condition(&revoked, types::ISSUED).1, reasons::REVOKED);
    assert_eq!(revoked.boundary.as_deref(), Some(B));

    // Held without an offer: still issued, and the offer's condition says what it keeps.
    let kept = status(&grant(false), B, &provision, &gone, &now());
    assert_eq!(condition(&kept, types::ISSUED).0, "True");
    let (s, r, m) = condition(&kept, types::EXPORT_OFFERED);
    assert_eq!(
        (s.as_str(), r.as_str()),
        ("False", reasons::EXPORT_NOT_FOUND)
    );
    assert!(m.contains("keeps the rights it was issued"), "{m}");

    let refused = Decision::Refuse {
        reason: reasons::BOUNDARY_TAKEN,
        message: "taken".into(),
    };
    let refused = status(&grant(false), B, &refused, &ok, &now());
    assert_eq!(
        condition(&refused, types::ISSUED).1,
        reasons::BOUNDARY_TAKEN
    );
    assert_eq!(refused.boundary, None);
}
