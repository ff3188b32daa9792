//! The per-namespace cap on Bindings (`--max-bindings-per-namespace`, both programs): a
//! namespace's first `cap` Bindings by age are served; the rest say so on their `Ready` condition
//! (`TooManyBindings`) and cost the syncer nothing. Oldest first, so that a flood of new Bindings
//! never pushes out one that already works; a Binding being deleted no longer counts.
//! ClusterBindings (made by administrators) are not capped.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// `--max-bindings-per-namespace` when not set.
pub const DEFAULT_MAX_PER_NAMESPACE: u32 = 100;

/// The `Ready` reason of a Binding past the cap.
pub const TOO_MANY_BINDINGS: &str = "TooManyBindings";

/// A Binding's place in its namespace's queue: the older first; between equals, the name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Seniority {
    /// `true` without a creation time (never from an API server): last.
    undated: bool,
    created: Option<jiff::Timestamp>,
    name: String,
}

impl Seniority {
    /// The place of the Binding with `meta`; `None` while it is being deleted (it no longer
    /// counts).
    pub fn of(meta: &ObjectMeta) -> Option<Self> {
        if meta.deletion_timestamp.is_some() {
            return None;
        }
        let created = meta.creation_timestamp.as_ref().map(|t| t.0);
        Some(Seniority {
            undated: created.is_none(),
            created,
            name: meta.name.clone().unwrap_or_default(),
        })
    }

    /// The Binding's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Whether the Binding at `me` is served, with `others` the places of the other Bindings in its
/// namespace: fewer than `cap` of them come before it.
pub fn served<'a>(
    me: &Seniority,
    others: impl IntoIterator<Item = &'a Seniority>,
    cap: u32,
) -> bool {
    let ahead = others
        .into_iter()
        .filter(|o| *o < me)
        .take(cap as usize)
        .count();
    ahead < cap as usize
}

/// [`served`] over metadata, without building a place per Binding (the schema manager asks it
/// of every Binding of a namespace that may hold thousands): `me` is served when fewer than
/// `cap` of `others` (its namespace's other Bindings; those being deleted do not count) come
/// before it. Not served while being deleted.
pub fn served_among<'a>(
    me: &ObjectMeta,
    others: impl IntoIterator<Item = &'a ObjectMeta>,
    cap: u32,
) -> bool {
    fn place(meta: &ObjectMeta) -> (bool, Option<jiff::Timestamp>, &str) {
        let created = meta.creation_timestamp.as_ref().map(|t| t.0);
        (
            created.is_none(),
            created,
            meta.name.as_deref().unwrap_or_default(),
        )
    }
    if me.deletion_timestamp.is_some() {
        return false;
    }
    let mine = place(me);
    let ahead = others
        .into_iter()
        .filter(|o| o.deletion_timestamp.is_none() && place(o) < mine)
        .take(cap as usize)
        .count();
    ahead < cap as usize
}

/// The Binding a departure lets in: with `remaining` the places left in the namespace (sorted),
/// the last one served — the one that was first past the cap, if the namespace was full.
pub fn let_in(remaining: &[Seniority], cap: u32) -> Option<&Seniority> {
    remaining.get((cap as usize).checked_sub(1)?)
}

/// The `Ready` message of a Binding past the cap.
pub fn message(namespace: &str, cap: u32) -> String {
    format!(
        "namespace {namespace} has more Bindings than kbind serves there: the {cap} oldest (--max-bindings-per-namespace); this one binds nothing until older ones go (a ResourceQuota on count/bindings.core.kbind.io keeps a namespace below the cap)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn meta(name: &str, created: Option<i64>, deleting: bool) -> ObjectMeta {
        let at = |s: i64| Time(jiff::Timestamp::from_second(s).expect("valid"));
        ObjectMeta {
            name: Some(name.into()),
            creation_timestamp: created.map(at),
            deletion_timestamp: deleting.then(|| at(0)),
            ..Default::default()
        }
    }

    fn place(name: &str, created: Option<i64>) -> Seniority {
        Seniority::of(&meta(name, created, false)).expect("not deleting")
    }

    /// A caller that passes a namespace's Bindings whole, the one asked about among them, gets
    /// the same answer: a Binding is never ahead of itself.
    #[test]
    fn a_binding_among_the_others_is_not_ahead_of_itself() {
        let (first, second) = (place("a", Some(1)), place("b", Some(2)));
        assert!(served(&second, [&first, &second], 2));
        assert!(!served(&second, [&first, &second], 1));
        let (first, second) = (meta("a", Some(1), false), meta("b", Some(2), false));
        assert!(served_among(&second, [&first, &second], 2));
        assert!(!served_among(&second, [&first, &second], 1));
    }

    #[test]
    fn the_oldest_are_served_and_names_break_ties() {
        let old = place("z-old", Some(10));
        let tie_a = place("a", Some(20));
        let tie_b = place("b", Some(20));
        let undated = place("0-undated", None);
        let all = [&old, &tie_a, &tie_b, &undated];
        let others = |me: &Seniority| all.iter().copied().filter(|o| *o != me).collect::<Vec<_>>();
        // (who, cap) → served
        let cases = [
            (&old, 1, true),
            (&tie_a, 1, false),
            (&tie_a, 2, true),
            (&tie_b, 2, false),
            (&tie_b, 3, true),
            (&undated, 3, false),
            (&undated, 4, true),
            (&old, 0, false),
        ];
        for (me, cap, want) in cases {
            assert_eq!(served(me, others(me), cap), want, "{me:?} cap {cap}");
        }
    }

    #[test]
    fn served_among_agrees_with_served() {
        let metas = [
            meta("z-old", Some(10), false),
            meta("a", Some(20), false),
            meta("b", Some(20), false),
            meta("0-undated", None, false),
            meta("0-leaving", Some(1), true),
        ];
        for cap in 0..5 {
            for (i, me) in metas.iter().enumerate() {
                let others = || {
                    metas
                        .iter()
                        .enumerate()
                        .filter(move |(j, _)| *j != i)
                        .map(|(_, m)| m)
                };
                let by_place = Seniority::of(me).is_some_and(|mine| {
                    let places: Vec<Seniority> = others().filter_map(Seniority::of).collect();
                    served(&mine, &places, cap)
                });
                assert_eq!(
                    served_among(me, others(), cap),
                    by_place,
                    "{me:?} cap {cap}"
                );
            }
        }
        // The one leaving does not count: with cap 1, the oldest staying is served.
        assert!(served_among(&metas[0], &metas[1..], 1));
        assert!(!served_among(&metas[4], &metas[..4], 5));
    }

    #[test]
    fn a_binding_being_deleted_no_longer_counts() {
        assert_eq!(Seniority::of(&meta("gone", Some(1), true)), None);
        assert_eq!(place("b", Some(1)).name(), "b");
    }

    #[test]
    fn a_departure_lets_in_the_first_past_the_cap() {
        let remaining = [
            place("a", Some(1)),
            place("b", Some(2)),
            place("c", Some(3)),
        ];
        assert_eq!(let_in(&remaining, 2), Some(&remaining[1]));
        assert_eq!(let_in(&remaining, 3), Some(&remaining[2]));
        assert_eq!(let_in(&remaining, 4), None);
        assert_eq!(let_in(&remaining, 0), None);
    }

    #[test]
    fn the_message_names_the_namespace_the_cap_and_the_remedy() {
        let m = message("team-a", 100);
        for part in [
            "team-a",
            "100 oldest",
            "--max-bindings-per-namespace",
            "ResourceQuota",
        ] {
            assert!(m.contains(part), "{m}");
        }
    }
}
