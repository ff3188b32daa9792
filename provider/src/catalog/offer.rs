//! Whether an `Export` is offered and a `Collection` holds offered Exports: pure decisions over
//! what the provider serves. The exported label on a CRD stays the truth; the catalog only
//! presents it, so an `Export` naming anything else is not offered and says why.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kbind_shared::api::catalog::{
    CollectionSpec, CollectionStatus, ExportSpec, ExportStatus, ExportedApi, OFFERED,
};
use kbind_shared::conditions::{self, Desired};

/// Reasons of the `Offered` condition.
pub mod reasons {
    /// Every API the Export names is exported.
    pub const EXPORTED: &str = "Exported";
    /// An API the Export names is served but its CRD is not labelled exported.
    pub const NOT_EXPORTED: &str = "NotExported";
    /// An API the Export names is not served by this provider at all.
    pub const UNKNOWN_API: &str = "UnknownAPI";
    /// Every Export a Collection lists exists and is offered.
    pub const ALL_OFFERED: &str = "AllOffered";
    /// A Collection lists an Export that does not exist or is not offered.
    pub const EXPORTS_NOT_OFFERED: &str = "ExportsNotOffered";
}

/// How the provider serves one API (`<plural>.<group>`), as its CRDs say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Served {
    /// A CRD of that name labelled `core.kbind.io/exported=true`; its scope.
    Exported(String),
    /// A CRD of that name without the label; its scope.
    Unlabelled(String),
    /// No CRD of that name.
    Absent,
}

/// The status an `Export` of `generation` gets when the provider serves its APIs as `served`
/// says, starting from the `previous` status (its conditions keep their transition times).
pub fn export_status(
    spec: &ExportSpec,
    generation: Option<i64>,
    served: &BTreeMap<String, Served>,
    previous: Option<&ExportStatus>,
    now: &Time,
) -> ExportStatus {
    let mut apis = Vec::with_capacity(spec.apis.len());
    let mut unlabelled = Vec::new();
    let mut absent = Vec::new();
    for api in &spec.apis {
        let name = api.name.clone();
        let (exported, scope) = match served.get(&name).unwrap_or(&Served::Absent) {
            Served::Exported(scope) => (true, Some(scope.clone())),
            Served::Unlabelled(scope) => {
                unlabelled.push(name.clone());
                (false, Some(scope.clone()))
            }
            Served::Absent => {
                absent.push(name.clone());
                (false, None)
            }
        };
        apis.push(ExportedApi {
            name,
            exported,
            scope,
        });
    }
    let desired = if !absent.is_empty() {
        Desired::new(
            OFFERED,
            false,
            reasons::UNKNOWN_API,
            format!("not served by this provider: {}", absent.join(", ")),
        )
    } else if !unlabelled.is_empty() {
        Desired::new(
            OFFERED,
            false,
            reasons::NOT_EXPORTED,
            format!(
                "served but not exported (its CRD lacks the label core.kbind.io/exported=true): {}",
                unlabelled.join(", ")
            ),
        )
    } else {
        Desired::new(
            OFFERED,
            true,
            reasons::EXPORTED,
            format!("every API is exported ({})", spec.apis.len()),
        )
    };
    let mut conditions = previous.map(|p| p.conditions.clone()).unwrap_or_default();
    conditions::set(&mut conditions, desired, generation, now);
    ExportStatus {
        observed_generation: generation,
        apis,
        conditions,
    }
}

/// Whether an `Export`'s status says it is offered (for the generation it describes).
pub fn offered(status: Option<&ExportStatus>) -> bool {
    status.is_some_and(|s| conditions::is_true(&s.conditions, OFFERED))
}

/// The status a `Collection` of `generation` gets when `exports` holds, by name, whether each
/// existing Export is offered.
pub fn collection_status(
    spec: &CollectionSpec,
    generation: Option<i64>,
    exports: &BTreeMap<String, bool>,
    previous: Option<&CollectionStatus>,
    now: &Time,
) -> CollectionStatus {
    let mut missing = Vec::new();
    let mut not_offered = Vec::new();
    let mut count = 0;
    for export in &spec.exports {
        match exports.get(&export.name) {
            Some(true) => count += 1,
            Some(false) => not_offered.push(export.name.as_str()),
            None => missing.push(export.name.as_str()),
        }
    }
    let desired = if missing.is_empty() && not_offered.is_empty() {
        Desired::new(
            OFFERED,
            true,
            reasons::ALL_OFFERED,
            format!("every Export is offered ({count})"),
        )
    } else {
        let mut parts = Vec::new();
        if !missing.is_empty() {
            parts.push(format!("no such Export: {}", missing.join(", ")));
        }
        if !not_offered.is_empty() {
            parts.push(format!("not offered: {}", not_offered.join(", ")));
        }
        Desired::new(
            OFFERED,
            false,
            reasons::EXPORTS_NOT_OFFERED,
            parts.join("; "),
        )
    };
    let mut conditions = previous.map(|p| p.conditions.clone()).unwrap_or_default();
    conditions::set(&mut conditions, desired, generation, now);
    CollectionStatus {
        observed_generation: generation,
        offered: count,
        conditions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kbind_shared::api::ApiRef;
    use kbind_shared::api::catalog::ExportRef;

    fn now() -> Time {
        Time(jiff::Timestamp::from_second(1_000).unwrap_or_default())
    }

    fn export(apis: &[&str]) -> ExportSpec {
        ExportSpec {
            title: "Widgets".into(),
            description: None,
            docs: None,
            apis: apis.iter().map(|a| ApiRef { name: (*a).into() }).collect(),
            defaults: None,
        }
    }

    fn served(entries: &[(&str, Served)]) -> BTreeMap<String, Served> {
        entries
            .iter()
            .map(|(n, s)| ((*n).to_owned(), s.clone()))
            .collect()
    }

    fn offered_condition(status: &ExportStatus) -> (String, String, String) {
        let c = conditions::find(&status.conditions, OFFERED).expect("an Offered condition");
        (c.status.clone(), c.reason.clone(), c.message.clone())
    }

    #[test]
    fn an_export_is_offered_only_when_every_api_it_names_is_exported() {
        let ns = || Served::Exported("Namespaced".into());
        let cases = [
            (
                vec!["widgets.example.org"],
                served(&[("widgets.example.org", ns())]),
                ("True", "Exported", "every API is exported (1)"),
            ),
            (
                vec!["widgets.example.org", "gadgets.example.org"],
                served(&[
                    ("widgets.example.org", ns()),
                    ("gadgets.example.org", Served::Unlabelled("Cluster".into())),
                ]),
                (
                    "False",
                    "NotExported",
                    "served but not exported (its CRD lacks the label core.kbind.io/exported=true): gadgets.example.org",
                ),
            ),
            (
                vec!["widgets.example.org", "nope.example.org"],
                served(&[(
                    "widgets.example.org",
                    Served::Unlabelled("Namespaced".into()),
                )]),
                (
                    "False",
                    "UnknownAPI",
                    "not served by this provider: nope.example.org",
                ),
            ),
        ];
        for (apis, served, (status, reason, message)) in cases {
            let s = export_status(&export(&apis), Some(3), &served, None, &now());
            assert_eq!(
                offered_condition(&s),
                (status.into(), reason.into(), message.into()),
                "{apis:?}"
            );
            assert_eq!(s.observed_generation, Some(3));
            assert_eq!(s.apis.len(), apis.len());
            assert_eq!(offered(Some(&s)), status == "True");
        }
    }

    #[test]
    fn each_api_says_how_it_is_served() {
        let s = export_status(
            &export(&["a.x", "b.x", "c.x"]),
            None,
            &served(&[
                ("a.x", Served::Exported("Namespaced".into())),
                ("b.x", Served::Unlabelled("Cluster".into())),
            ]),
            None,
            &now(),
        );
        let seen: Vec<(&str, bool, Option<&str>)> = s
            .apis
            .iter()
            .map(|a| (a.name.as_str(), a.exported, a.scope.as_deref()))
            .collect();
        assert_eq!(
            seen,
            [
                ("a.x", true, Some("Namespaced")),
                ("b.x", false, Some("Cluster")),
                ("c.x", false, None)
            ]
        );
    }

    #[test]
    fn an_unchanged_truth_keeps_the_status_as_it_was() {
        let spec = export(&["a.x"]);
        let truth = served(&[("a.x", Served::Exported("Namespaced".into()))]);
        let first = export_status(&spec, Some(1), &truth, None, &now());
        let later = Time(jiff::Timestamp::from_second(2_000).unwrap_or_default());
        let again = export_status(&spec, Some(1), &truth, Some(&first), &later);
        assert_eq!(again, first, "nothing to write");
    }

    #[test]
    fn a_collection_names_what_it_lists_that_is_missing_or_not_offered() {
        let spec = CollectionSpec {
            title: "Databases".into(),
            description: None,
            exports: ["a", "b", "c"]
                .iter()
                .map(|n| ExportRef { name: (*n).into() })
                .collect(),
        };
        let all: BTreeMap<String, bool> =
            [("a".into(), true), ("b".into(), true), ("c".into(), true)].into();
        let s = collection_status(&spec, Some(1), &all, None, &now());
        assert_eq!(s.offered, 3);
        assert!(conditions::is_true(&s.conditions, OFFERED));

        let some: BTreeMap<String, bool> = [("a".into(), true), ("b".into(), false)].into();
        let s = collection_status(&spec, Some(1), &some, None, &now());
        assert_eq!(s.offered, 1);
        let c = conditions::find(&s.conditions, OFFERED).expect("an Offered condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            (
                "False",
                "ExportsNotOffered",
                "no such Export: c; not offered: b"
            )
        );
    }
}
