//! What a binding must do per API after an edit (BIND-16, AUTO-2, LIM-22, QRK-25 fixed): the
//! binding's `status.apis` records, per API, the Connection whose provider holds its copies; the
//! spec says what is wanted now. Comparing the two tells which APIs to bind, which to release
//! (exactly as if a binding covering only that API in this scope were deleted) and which to move
//! to another Connection (drain the old provider first, so no object ever reaches two). Pure.

use kbind_shared::api::{BindingSpec, BindingStatus};

/// An API and the Connection through which a binding bound it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Held {
    /// `<plural>.<group>`.
    pub api: String,
    /// The Connection whose provider holds the API's copies.
    pub connection: String,
}

/// One thing to do for one API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Listed under the binding's Connection, nothing held elsewhere: install and bind it.
    Bind(String),
    /// Held but no longer listed (or the binding is going): release it — copies deleted (or
    /// orphaned), finalizers removed, the CRD removed only where an explicit unbind allows.
    Release(Held),
    /// Listed under another Connection than the one holding it: release `from` first, then hand
    /// the API to the binding's Connection. Nothing is installed for the new one before that.
    Move {
        /// What is held now.
        from: Held,
        /// The Connection the spec names.
        to: String,
    },
}

/// What letting go of one API left to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Left {
    /// Done: nothing of it remains in this binding's scope.
    Nothing,
    /// Provider copies still being deleted.
    Draining(usize),
    /// A move waits for the old provider to be reachable.
    Unreachable(String),
}

/// An API being let go that is not done yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Going {
    /// What is held.
    pub held: Held,
    /// The Connection it moves to; `None` when it is released.
    pub to: Option<String>,
    /// What is left.
    pub left: Left,
}

/// What a binding holds per its status. A status written before per-API entries existed holds
/// its `boundAPIs` through the Connection the spec names.
pub fn held(status: Option<&BindingStatus>, spec: &BindingSpec) -> Vec<Held> {
    let Some(status) = status else {
        return Vec::new();
    };
    let mut held: Vec<Held> = if status.apis.is_empty() {
        status
            .bound_apis
            .iter()
            .map(|a| Held {
                api: a.name.clone(),
                connection: spec.connection_ref.name.clone(),
            })
            .collect()
    } else {
        status
            .apis
            .iter()
            .map(|a| Held {
                api: a.name.clone(),
                connection: a.connection.clone(),
            })
            .collect()
    };
    held.sort();
    held.dedup();
    held
}

/// The steps that take a binding from what it `held` to its `spec`, in the spec's order with
/// releases last. A binding being deleted wants nothing: everything it holds or lists is
/// released.
pub fn steps(held: &[Held], spec: &BindingSpec, deleting: bool) -> Vec<Step> {
    let connection = &spec.connection_ref.name;
    let mut out = Vec::new();
    if deleting {
        let mut all: Vec<Held> = held.to_vec();
        all.extend(spec.apis.iter().map(|a| Held {
            api: a.name.clone(),
            connection: connection.clone(),
        }));
        all.sort();
        all.dedup();
        return all.into_iter().map(Step::Release).collect();
    }
    for api in &spec.apis {
        let elsewhere = held
            .iter()
            .find(|h| h.api == api.name && h.connection != *connection);
        let here = held
            .iter()
            .any(|h| h.api == api.name && h.connection == *connection);
        out.push(match elsewhere {
            // Held under both (a move that handed over before its record was written): what
            // the old Connection still holds is released; the new one binds.
            Some(from) if here => Step::Release(from.clone()),
            Some(from) => Step::Move {
                from: from.clone(),
                to: connection.clone(),
            },
            None => Step::Bind(api.name.clone()),
        });
        if here && elsewhere.is_some() {
            out.push(Step::Bind(api.name.clone()));
        }
    }
    for h in held {
        if !spec.apis.iter().any(|a| a.name == h.api) {
            out.push(Step::Release(h.clone()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kbind_shared::api::{ApiStatus, BoundApi};

    const W: &str = "widgets.example.org";
    const G: &str = "gadgets.example.org";

    fn spec(connection: &str, apis: &[&str]) -> BindingSpec {
        BindingSpec::new(connection, apis)
    }

    fn h(api: &str, connection: &str) -> Held {
        Held {
            api: api.into(),
            connection: connection.into(),
        }
    }

    fn bind(api: &str) -> Step {
        Step::Bind(api.into())
    }

    fn release(api: &str, connection: &str) -> Step {
        Step::Release(h(api, connection))
    }

    fn moving(api: &str, from: &str, to: &str) -> Step {
        Step::Move {
            from: h(api, from),
            to: to.into(),
        }
    }

    #[test]
    fn steps_from_held_to_spec() {
        // (case, held, spec, deleting, steps)
        type Case = (&'static str, Vec<Held>, BindingSpec, bool, Vec<Step>);
        let cases: Vec<Case> = vec![
            (
                "new binding",
                vec![],
                spec("a", &[W, G]),
                false,
                vec![bind(W), bind(G)],
            ),
            (
                "unchanged",
                vec![h(W, "a")],
                spec("a", &[W]),
                false,
                vec![bind(W)],
            ),
            (
                "an API added",
                vec![h(W, "a")],
                spec("a", &[W, G]),
                false,
                vec![bind(W), bind(G)],
            ),
            (
                "an API removed",
                vec![h(G, "a"), h(W, "a")],
                spec("a", &[W]),
                false,
                vec![bind(W), release(G, "a")],
            ),
            (
                "connectionRef changed",
                vec![h(W, "a")],
                spec("b", &[W]),
                false,
                vec![moving(W, "a", "b")],
            ),
            (
                "connectionRef changed and an API removed at once",
                vec![h(G, "a"), h(W, "a")],
                spec("b", &[W]),
                false,
                vec![moving(W, "a", "b"), release(G, "a")],
            ),
            (
                "moved back before the move finished",
                vec![h(W, "a")],
                spec("a", &[W]),
                false,
                vec![bind(W)],
            ),
            (
                "a move that handed over before its record was written",
                vec![h(W, "a"), h(W, "b")],
                spec("b", &[W]),
                false,
                vec![release(W, "a"), bind(W)],
            ),
            (
                "deleting releases what is held and what is listed",
                vec![h(G, "a"), h(W, "a")],
                spec("b", &[W]),
                true,
                vec![release(G, "a"), release(W, "a"), release(W, "b")],
            ),
            (
                "deleting a binding that never recorded anything",
                vec![],
                spec("a", &[W]),
                true,
                vec![release(W, "a")],
            ),
            (
                "an API removed while another is moving",
                vec![h(G, "b"), h(W, "a")],
                spec("b", &[W]),
                false,
                vec![moving(W, "a", "b"), release(G, "b")],
            ),
        ];
        for (name, held, spec, deleting, want) in cases {
            assert_eq!(steps(&held, &spec, deleting), want, "{name}");
        }
    }

    #[test]
    fn held_reads_entries_or_falls_back_to_bound_apis() {
        let s = spec("a", &[W]);
        assert!(held(None, &s).is_empty());
        let old = BindingStatus {
            bound_apis: vec![BoundApi {
                name: G.into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(held(Some(&old), &s), vec![h(G, "a")]);
        let entry = |name: &str, connection: &str| ApiStatus {
            name: name.into(),
            connection: connection.into(),
            ..Default::default()
        };
        let new = BindingStatus {
            apis: vec![entry(W, "b"), entry(G, "a"), entry(G, "a")],
            ..old
        };
        assert_eq!(held(Some(&new), &s), vec![h(G, "a"), h(W, "b")]);
    }
}
