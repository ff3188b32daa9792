//! Property tests over hostile input ("fuzzing" on stable Rust): every parser and decision that
//! sees data from a provider, a Secret or a namespace user, fed arbitrary input, never panics and
//! keeps its output bounded. `cargo test` runs 256 cases each (proptest's default); for a longer
//! run: `PROPTEST_CASES=100000 cargo test --release -p kbind-shared fuzz::`.

use std::collections::BTreeMap;

use proptest::prelude::*;

use crate::kubeconfig::{InlineKubeconfig, Transport};
use crate::ownership::{self, Owner};
use crate::redact;
use crate::shard::{self, Assignment, Drain};

/// A token that must never be repeated by any message.
const TOKEN: &str = "tok-7d1c0ffee";

fn kubeconfig_like() -> impl Strategy<Value = String> {
    let server = prop_oneof![
        Just("https://127.0.0.1:6443".to_owned()),
        Just("http://u:p@h".to_owned()),
        "[a-z:/@.0-9]{0,40}",
    ];
    let user = prop_oneof![
        Just(format!("    token: {TOKEN}\n")),
        Just("    tokenFile: /x\n".to_owned()),
        Just("    exec:\n      command: x\n".to_owned()),
        Just("    auth-provider:\n      name: x\n".to_owned()),
        "[ -~\n]{0,60}",
    ];
    let cluster_extra = prop_oneof![
        Just(String::new()),
        Just("    insecure-skip-tls-verify: true\n".to_owned()),
        Just("    proxy-url: http://user:pw@p:1\n".to_owned()),
        Just("    certificate-authority: /etc/ca\n".to_owned()),
        "[ -~\n]{0,40}",
    ];
    let context = prop_oneof![Just("p".to_owned()), "[a-z]{0,5}"];
    (server, user, cluster_extra, context).prop_map(|(server, user, extra, context)| {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: {context}\nclusters:\n- name: p\n  cluster:\n    server: {server}\n{extra}contexts:\n- name: p\n  context:\n    cluster: p\n    user: u\nusers:\n- name: u\n  user:\n{user}"
        )
    })
}

fn assignment() -> impl Strategy<Value = Assignment> {
    let units = prop::collection::btree_map("[a-z]{1,8}/[a-z.]{1,12}", "[a-z0-9-]{1,12}", 0..20);
    let members = prop::collection::btree_map("[a-z0-9-]{1,12}", any::<u64>(), 0..5);
    let draining = prop::collection::btree_map(
        "[a-z]{1,8}/[a-z.]{1,12}",
        ("[a-z0-9-]{1,12}", any::<u64>(), any::<u64>()).prop_map(|(from, incarnation, since)| {
            Drain {
                from,
                incarnation,
                since,
            }
        }),
        0..5,
    );
    (any::<u64>(), units, members, draining).prop_map(|(generation, units, members, draining)| {
        Assignment {
            format: shard::ASSIGNMENT_FORMAT,
            generation,
            units,
            members,
            draining,
        }
    })
}

proptest! {
    #[test]
    fn the_kubeconfig_parser_never_panics_or_repeats_a_credential(text in kubeconfig_like()) {
        for transport in [Transport::Secure, Transport::AllowInsecure] {
            match InlineKubeconfig::parse_with(text.as_bytes(), transport) {
                Ok(kc) => {
                    let debug = format!("{kc:?}");
                    prop_assert!(!debug.contains(TOKEN), "{}", debug);
                }
                Err(e) => {
                    let message = e.to_string();
                    prop_assert!(!message.contains(TOKEN), "{message}");
                    prop_assert!(!message.contains("user:pw"), "{message}");
                    prop_assert!(message.len() < 2048, "{message}");
                }
            }
        }
    }

    #[test]
    fn the_kubeconfig_parser_takes_any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = InlineKubeconfig::parse(&bytes);
    }

    #[test]
    fn the_assignment_decoder_takes_any_text_and_round_trips(text in "[ -~]{0,200}", a in assignment()) {
        let _ = Assignment::decode(&text);
        let _ = shard::decode_running(&text);
        let _ = text.parse::<shard::Unit>();
        prop_assert_eq!(Assignment::decode(&a.encode()), Ok(a.clone()));
        let units: std::collections::BTreeSet<String> = a.units.keys().cloned().collect();
        let keys = shard::decode_running(&shard::encode_running(&units));
        prop_assert!(units.iter().all(|u| keys.contains(&shard::running_key(u))));
    }

    #[test]
    fn ownership_is_ours_only_for_both_exact_markers(
        cluster in prop::option::of("[a-z0-9-]{0,6}"),
        object in prop::option::of("[a-z0-9-]{0,6}"),
        local in "[a-z0-9-]{0,6}",
        uid in "[a-z0-9-]{0,6}",
        extra in prop::collection::btree_map("[a-z./-]{1,20}", "[ -~]{0,20}", 0..4),
    ) {
        let mut annotations: BTreeMap<String, String> = extra;
        if let Some(c) = &cluster {
            annotations.insert(crate::keys::CONSUMER_CLUSTER_UID_ANNOTATION.into(), c.clone());
        }
        if let Some(o) = &object {
            annotations.insert(crate::keys::CONSUMER_OBJECT_UID_ANNOTATION.into(), o.clone());
        }
        let owner = ownership::classify(&annotations, &local, &uid);
        let both = cluster.as_deref().unwrap_or("") == local && object.as_deref().unwrap_or("") == uid;
        let marked = cluster.as_deref().is_some_and(|c| !c.is_empty()) || object.as_deref().is_some_and(|o| !o.is_empty());
        prop_assert_eq!(owner == Owner::Ours, both && marked);
        for policy in [crate::api::ConflictPolicy::Fail, crate::api::ConflictPolicy::Adopt] {
            let _ = ownership::decide(owner, policy);
        }
    }

    #[test]
    fn userinfo_never_survives_redaction(
        before in "[ -~]{0,30}", user in "[a-z0-9]{1,10}", pass in "[a-z0-9]{1,10}", after in "[ -~]{0,30}",
    ) {
        let text = format!("{before} https://{user}:{pass}@host:1/p {after}");
        let out = redact::remote(&text);
        prop_assert!(!out.contains(&format!("{user}:{pass}@")), "{out}");
        prop_assert!(out.chars().count() <= redact::MAX_REMOTE + 1);
    }
}
