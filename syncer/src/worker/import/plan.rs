//! What observe-first import writes on the consumer (#54), decided from plain data: the provider
//! objects no consumer has marked, in the scope of the bindings that import, and the consumer
//! objects that stand under their names. Pure; table-tested.

use std::time::{Duration, Instant};

use kbind_shared::cache::Json;

use crate::bindings::ImportRule;
use kbind_shared::import::Standing;

/// A provider object no consumer has marked, in a namespace some importing binding covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offered<'a> {
    /// Its namespace, as the consumer names it.
    pub namespace: Option<&'a str>,
    /// Its name.
    pub name: &'a str,
    /// Its spec.
    pub spec: Option<&'a Json>,
    /// The consumer status that mirrors it: its status with kbind's `Observed` record.
    pub status: Option<&'a Json>,
}

/// A consumer object under the name of an offered object, or imported by this Connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Present<'a> {
    /// Its namespace.
    pub namespace: Option<&'a str>,
    /// Its name.
    pub name: &'a str,
    /// Where it stands.
    pub standing: Standing,
    /// It is being deleted.
    pub deleting: bool,
    /// Its spec.
    pub spec: Option<&'a Json>,
    /// Its status.
    pub status: Option<&'a Json>,
    /// Its spec changed since import last wrote it (a user's edit of a read-only mirror).
    pub edited: bool,
}

/// A write of import's, on the consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// Create the mirror of offered object `offered`.
    Create {
        /// Its index in the offered objects.
        offered: usize,
    },
    /// Bring the mirror `present` back to offered object `offered`: its spec (when it differs;
    /// `revert`: a user changed it), its status (when it differs).
    Mirror {
        /// Its index in the present objects.
        present: usize,
        /// Its offered object's.
        offered: usize,
        /// Write the spec.
        spec: bool,
        /// Write the status.
        status: bool,
        /// The spec differs because a user edited the mirror: the write reverts it.
        revert: bool,
    },
    /// Delete the mirror `present`: nothing offered stands for it any more (the provider object
    /// is gone or marked, or no binding imports it now).
    Delete {
        /// Its index in the present objects.
        present: usize,
    },
}

/// The objects an import rule leaves out: past its limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverLimit {
    /// The rule (binding) — its namespace and name.
    pub rule: usize,
    /// How many offered objects it leaves out.
    pub left_out: usize,
}

/// The plan of one look.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// The writes, in the order of the objects.
    pub writes: Vec<Write>,
    /// The rules whose limit leaves objects out.
    pub over_limit: Vec<OverLimit>,
    /// How many objects are imported (mirrored or to be).
    pub imported: usize,
}

/// The rule that covers an object in `namespace`: its namespace's Binding's (the first by name),
/// else a ClusterBinding's.
fn rule_of(rules: &[ImportRule], namespace: Option<&str>) -> Option<usize> {
    let first = |namespaced: bool| {
        rules
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                if namespaced {
                    r.namespace.is_some() && r.namespace.as_deref() == namespace
                } else {
                    r.namespace.is_none()
                }
            })
            .min_by(|a, b| a.1.binding.cmp(&b.1.binding))
            .map(|(i, _)| i)
    };
    first(true).or_else(|| first(false))
}

/// Decides the writes that make the consumer mirror `offered` within `rules`: `bound(namespace)`
/// says whether the API is bound there for this Connection (nothing is imported where it is not).
/// Objects are taken by namespace and name, so that a limit always leaves out the same ones.
pub fn plan(
    rules: &[ImportRule],
    bound: impl Fn(Option<&str>) -> bool,
    offered: &[Offered<'_>],
    present: &[Present<'_>],
) -> Plan {
    let mut plan = Plan::default();
    let mut order: Vec<usize> = (0..offered.len()).collect();
    order.sort_by(|&a, &b| {
        (offered[a].namespace, offered[a].name).cmp(&(offered[b].namespace, offered[b].name))
    });
    let index: std::collections::HashMap<(Option<&str>, &str), usize> = present
        .iter()
        .enumerate()
        .map(|(i, p)| ((p.namespace, p.name), i))
        .collect();
    let mut taken = vec![0usize; rules.len()];
    let mut mirrored = vec![false; present.len()];
    for o in order {
        let object = &offered[o];
        let Some(rule) = rule_of(rules, object.namespace) else {
            continue;
        };
        if !bound(object.namespace) {
            continue;
        }
        if taken[rule] >= rules[rule].limit {
            match plan.over_limit.iter_mut().find(|l| l.rule == rule) {
                Some(over) => over.left_out += 1,
                None => plan.over_limit.push(OverLimit { rule, left_out: 1 }),
            }
            continue;
        }
        taken[rule] += 1;
        let Some(&p) = index.get(&(object.namespace, object.name)) else {
            plan.imported += 1;
            plan.writes.push(Write::Create { offered: o });
            continue;
        };
        let mirror = &present[p];
        if mirror.standing != Standing::Observed {
            // The user's own object, a claimed one, another Connection's: not import's.
            continue;
        }
        plan.imported += 1;
        mirrored[p] = true;
        if mirror.deleting {
            continue;
        }
        let spec = mirror.spec != object.spec;
        let status = mirror.status != object.status;
        if spec || status {
            plan.writes.push(Write::Mirror {
                present: p,
                offered: o,
                spec,
                status,
                revert: spec && mirror.edited,
            });
        }
    }
    for (p, mirror) in present.iter().enumerate() {
        if mirror.standing == Standing::Observed && !mirrored[p] && !mirror.deleting {
            plan.writes.push(Write::Delete { present: p });
        }
    }
    plan
}

/// How long a mirror just created may be missing from the consumer cache before it is created
/// again (someone deleted it).
pub const CACHE_CATCHES_UP: Duration = Duration::from_secs(5);
/// How long a mirror whose creation failed waits before it is tried again.
pub const RETRY_AFTER: Duration = Duration::from_secs(30);

/// When a mirror created at `created` (its cache not showing it yet), or whose creation failed at
/// `failed`, may be created (again): `None` — now.
pub fn creation_due(
    now: Instant,
    created: Option<Instant>,
    failed: Option<Instant>,
) -> Option<Instant> {
    let created = created.map(|at| at + CACHE_CATCHES_UP);
    let failed = failed.map(|at| at + RETRY_AFTER);
    created
        .into_iter()
        .chain(failed)
        .filter(|due| *due > now)
        .max()
}

/// Whether a mirror still holds exactly what import last wrote to it: the same wanted contents
/// (`wanted`, a digest) and the resourceVersion import's write left (`version`, the cache's) —
/// nobody changed it since, so a difference that remains is the consumer API server's doing.
pub fn written_so(last: Option<&(u64, String)>, wanted: u64, version: Option<&str>) -> bool {
    last.is_some_and(|(digest, left)| *digest == wanted && version == Some(left.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(namespace: Option<&str>, binding: &str, limit: usize) -> ImportRule {
        ImportRule {
            namespace: namespace.map(str::to_owned),
            binding: binding.to_owned(),
            limit,
        }
    }

    fn json(text: &str) -> Json {
        Json::new(&serde_json::from_str(text).unwrap())
    }

    #[test]
    fn offered_objects_are_created_mirrored_left_alone_or_their_mirrors_deleted() {
        let (spec1, spec2, status) = (json(r#"{"size":1}"#), json(r#"{"size":2}"#), json("{}"));
        let offer = |namespace, name, spec| Offered {
            namespace: Some(namespace),
            name,
            spec: Some(spec),
            status: Some(&status),
        };
        let offered = [
            offer("a", "new", &spec1),
            offer("a", "same", &spec1),
            offer("a", "changed", &spec2),
            offer("a", "edited", &spec1),
            offer("a", "mine", &spec1),
            offer("a", "claimed", &spec1),
            offer("x", "uncovered", &spec1),
            offer("u", "unbound", &spec1),
        ];
        let mirror = |name, standing, spec, edited| Present {
            namespace: Some("a"),
            name,
            standing,
            deleting: false,
            spec: Some(spec),
            status: Some(&status),
            edited,
        };
        let present = [
            mirror("same", Standing::Observed, &spec1, false),
            mirror("changed", Standing::Observed, &spec1, false),
            mirror("edited", Standing::Observed, &spec2, true),
            mirror("mine", Standing::NotImported, &spec2, true),
            mirror("claimed", Standing::Claimed, &spec2, true),
            mirror("gone", Standing::Observed, &spec1, false),
            mirror("gone-claimed", Standing::Claimed, &spec1, false),
            Present {
                deleting: true,
                ..mirror("gone-deleting", Standing::Observed, &spec1, false)
            },
        ];
        let rules = [rule(Some("a"), "b", 100), rule(Some("u"), "b", 100)];
        let plan = plan(&rules, |ns| ns != Some("u"), &offered, &present);
        assert_eq!(
            plan.writes,
            [
                Write::Mirror {
                    present: 1,
                    offered: 2,
                    spec: true,
                    status: false,
                    revert: false
                },
                Write::Mirror {
                    present: 2,
                    offered: 3,
                    spec: true,
                    status: false,
                    revert: true
                },
                Write::Create { offered: 0 },
                Write::Delete { present: 5 },
            ]
        );
        assert_eq!(plan.imported, 4, "new, same, changed, edited");
        assert!(plan.over_limit.is_empty());
    }

    #[test]
    fn a_status_that_differs_is_mirrored_alone() {
        let (spec, old, new) = (
            json("{}"),
            json(r#"{"ready":false}"#),
            json(r#"{"ready":true}"#),
        );
        let offered = [Offered {
            namespace: None,
            name: "c",
            spec: Some(&spec),
            status: Some(&new),
        }];
        let present = [Present {
            namespace: None,
            name: "c",
            standing: Standing::Observed,
            deleting: false,
            spec: Some(&spec),
            status: Some(&old),
            edited: false,
        }];
        let plan = plan(&[rule(None, "all", 5)], |_| true, &offered, &present);
        assert_eq!(
            plan.writes,
            [Write::Mirror {
                present: 0,
                offered: 0,
                spec: false,
                status: true,
                revert: false
            }]
        );
    }

    #[test]
    fn a_limit_takes_the_first_by_namespace_and_name_and_counts_the_rest() {
        let spec = json("{}");
        let names = ["d", "b", "e", "a", "c"];
        let offered: Vec<Offered<'_>> = names
            .iter()
            .map(|name| Offered {
                namespace: Some("n"),
                name,
                spec: Some(&spec),
                status: None,
            })
            .collect();
        // A mirror past the limit (the limit was lowered) is deleted.
        let present = [Present {
            namespace: Some("n"),
            name: "e",
            standing: Standing::Observed,
            deleting: false,
            spec: Some(&spec),
            status: None,
            edited: false,
        }];
        let rules = [rule(None, "cluster", 100), rule(Some("n"), "team", 2)];
        let plan = plan(&rules, |_| true, &offered, &present);
        let created: Vec<&str> = plan
            .writes
            .iter()
            .filter_map(|w| match w {
                Write::Create { offered: o } => Some(offered[*o].name),
                _ => None,
            })
            .collect();
        assert_eq!(
            created,
            ["a", "b"],
            "the namespace's Binding wins over the ClusterBinding"
        );
        assert!(plan.writes.contains(&Write::Delete { present: 0 }));
        assert_eq!(
            plan.over_limit,
            [OverLimit {
                rule: 1,
                left_out: 3
            }]
        );
        assert_eq!(plan.imported, 2);
    }

    #[test]
    fn a_creation_waits_for_the_cache_after_one_and_longer_after_a_failure() {
        let t = Instant::now();
        let s = Duration::from_secs;
        assert_eq!(creation_due(t, None, None), None, "never tried: now");
        assert_eq!(creation_due(t + s(1), Some(t), None), Some(t + s(5)));
        assert_eq!(
            creation_due(t + s(5), Some(t), None),
            None,
            "the wait is over"
        );
        assert_eq!(creation_due(t + s(6), Some(t), None), None);
        assert_eq!(creation_due(t + s(29), None, Some(t)), Some(t + s(30)));
        assert_eq!(creation_due(t + s(30), None, Some(t)), None);
        assert_eq!(
            creation_due(t + s(1), Some(t), Some(t)),
            Some(t + s(30)),
            "the later of both"
        );
        assert_eq!(
            creation_due(t + s(10), Some(t + s(8)), Some(t)),
            Some(t + s(30))
        );
        assert_eq!(
            creation_due(t + s(31), Some(t + s(30)), Some(t)),
            Some(t + s(35))
        );
    }

    #[test]
    fn a_mirror_holds_what_was_written_only_with_the_same_contents_and_version() {
        let last = (7, "12".to_owned());
        assert!(written_so(Some(&last), 7, Some("12")));
        assert!(
            !written_so(Some(&last), 8, Some("12")),
            "the provider changed"
        );
        assert!(
            !written_so(Some(&last), 7, Some("13")),
            "someone changed the mirror"
        );
        assert!(!written_so(Some(&last), 7, None));
        assert!(!written_so(None, 7, Some("12")), "never written");
    }

    #[test]
    fn of_two_bindings_in_a_namespace_the_first_by_name_rules() {
        let rules = [
            rule(Some("n"), "z", 1),
            rule(Some("n"), "a", 1),
            rule(None, "c", 1),
        ];
        assert_eq!(rule_of(&rules, Some("n")), Some(1));
        assert_eq!(rule_of(&rules, Some("m")), Some(2));
        assert_eq!(rule_of(&rules[..2], Some("m")), None);
        assert_eq!(rule_of(&rules[..2], None), None);
    }
}
