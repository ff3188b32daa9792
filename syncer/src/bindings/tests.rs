use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kbind_shared::api::{ApiStatus, BindingSpec, BindingStatus, ClusterBindingSpec, RouteStatus};

const W: &str = "widgets.example.org";
const G: &str = "gadgets.example.org";

fn status(apis: &[&str], connection: &str) -> BindingStatus {
    BindingStatus {
        apis: apis
            .iter()
            .map(|a| ApiStatus {
                name: (*a).into(),
                connection: connection.into(),
                bound: true,
                reason: "AsExpected".into(),
                message: String::new(),
                route: None,
            })
            .collect(),
        ..Default::default()
    }
}

fn binding(namespace: &str, name: &str, created: i64, apis: &[&str]) -> Arc<Binding> {
    let mut b = Binding::new(name, BindingSpec::new("p", apis));
    b.metadata.namespace = Some(namespace.into());
    b.metadata.creation_timestamp =
        Some(Time(jiff::Timestamp::from_second(created).expect("valid")));
    b.status = Some(status(apis, "p"));
    Arc::new(b)
}

fn cluster_binding(name: &str, apis: &[&str]) -> Arc<ClusterBinding> {
    let mut b = ClusterBinding::new(name, ClusterBindingSpec::from(BindingSpec::new("p", apis)));
    b.status = Some(status(apis, "p"));
    Arc::new(b)
}

fn in_ns(apis: &[&str], namespace: &str) -> Option<Touched> {
    Some(Touched::Apis {
        apis: apis.iter().map(|a| (*a).to_owned()).collect(),
        namespace: Some(namespace.into()),
    })
}

/// The status of a binding of Connection `r` that binds W as a route of the API `p` serves.
fn routed_status() -> BindingStatus {
    let mut s = status(&[W], "r");
    s.apis[0].route = Some(RouteStatus {
        served_by: "p".into(),
        schema_agrees: true,
        schema_message: String::new(),
    });
    s
}

fn resolved(index: &Index, namespace: &str) -> Option<String> {
    index
        .resolve("p", W, Some(namespace), Some(&Default::default()))
        .map(|r| r.name)
}

#[test]
fn a_binding_is_found_in_its_own_namespace_only() {
    let mut index = Index::new(10);
    assert_eq!(
        index.apply_binding(binding("a", "one", 1, &[W])),
        in_ns(&[W], "a")
    );
    assert_eq!(resolved(&index, "a").as_deref(), Some("one"));
    assert_eq!(resolved(&index, "b"), None);
    assert_eq!(index.resolve("p", G, Some("a"), None), None);
    // Another Connection's binding does not cover the API served by `p`.
    assert_eq!(index.resolve("q", W, Some("a"), None), None);
}

#[test]
fn a_cluster_binding_wins_everywhere_and_touches_every_namespace() {
    let mut index = Index::new(10);
    index.apply_binding(binding("a", "one", 1, &[W]));
    assert_eq!(
        index.apply_cluster(cluster_binding("all", &[W])),
        Some(Touched::Apis {
            apis: [W.to_owned()].into(),
            namespace: None
        })
    );
    assert_eq!(resolved(&index, "a").as_deref(), Some("all"));
    assert_eq!(resolved(&index, "z").as_deref(), Some("all"));
    assert!(index.remove_cluster("all").is_some());
    assert_eq!(resolved(&index, "z"), None);
    assert_eq!(index.remove_cluster("all"), None);
}

#[test]
fn a_flood_past_the_cap_is_indexed_by_nobody_and_wakes_nobody() {
    let mut index = Index::new(2);
    assert!(
        index
            .apply_binding(binding("a", "old-1", 1, &[W]))
            .is_some()
    );
    assert!(
        index
            .apply_binding(binding("a", "old-2", 2, &[G]))
            .is_some()
    );
    for n in 0..50 {
        // Older by name ("0-…" < "old-…") but newer by age: never let in.
        let flood = binding("a", &format!("0-flood-{n}"), 100 + n, &[W]);
        assert_eq!(index.apply_binding(flood.clone()), None, "flood {n}");
        // Patched again and again: still nothing.
        assert_eq!(index.apply_binding(flood), None, "flood {n} again");
    }
    assert_eq!(resolved(&index, "a").as_deref(), Some("old-1"));
    assert_eq!(index.past_cap(), [("a".to_owned(), 50)].into());
    // An older one going lets in the first of the flood, and says so for both APIs.
    assert_eq!(index.remove_binding("a", "old-2"), in_ns(&[G, W], "a"));
    assert_eq!(index.past_cap(), [("a".to_owned(), 49)].into());
    // The flood in a namespace never touches another's lookups.
    assert!(index.apply_binding(binding("b", "mine", 5, &[W])).is_some());
    assert_eq!(resolved(&index, "b").as_deref(), Some("mine"));
}

#[test]
fn a_served_binding_deleted_lets_the_next_in() {
    let mut index = Index::new(1);
    index.apply_binding(binding("a", "first", 1, &[W]));
    index.apply_binding(binding("a", "second", 2, &[W]));
    assert_eq!(resolved(&index, "a").as_deref(), Some("first"));
    let mut deleting = (*binding("a", "first", 1, &[W])).clone();
    deleting.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
    assert_eq!(index.apply_binding(Arc::new(deleting)), in_ns(&[W], "a"));
    assert_eq!(resolved(&index, "a").as_deref(), Some("second"));
    assert_eq!(index.past_cap(), BTreeMap::new());
}

#[test]
fn an_equal_version_alters_nothing_and_a_changed_one_says_what() {
    let mut index = Index::new(10);
    index.apply_binding(binding("a", "one", 1, &[W]));
    let mut labelled = (*binding("a", "one", 1, &[W])).clone();
    labelled.metadata.labels = Some([("x".to_owned(), "y".to_owned())].into());
    assert_eq!(index.apply_binding(Arc::new(labelled)), None);
    // Moved from W to G: both are touched; W is no longer found.
    assert_eq!(
        index.apply_binding(binding("a", "one", 1, &[G])),
        in_ns(&[G, W], "a")
    );
    assert_eq!(resolved(&index, "a"), None);
    let mut cluster = (*cluster_binding("all", &[W])).clone();
    index.apply_cluster(Arc::new(cluster.clone()));
    cluster.metadata.labels = Some([("x".to_owned(), "y".to_owned())].into());
    assert_eq!(index.apply_cluster(Arc::new(cluster)), None);
}

#[test]
fn routes_are_counted_as_bindings_come_and_go() {
    let mut index = Index::new(10);
    let route = |namespace: &str, name: &str, created: i64| {
        let mut b = (*binding(namespace, name, created, &[W])).clone();
        b.spec.connection_ref.name = "r".into();
        b.status = Some(routed_status());
        Arc::new(b)
    };
    index.apply_binding(route("a", "to-r", 1));
    index.apply_binding(route("b", "to-r", 1));
    let r: BTreeSet<String> = ["r".to_owned()].into();
    assert_eq!(index.route_connections(W, "p"), r);
    assert_eq!(index.route_connections(W, "r"), BTreeSet::new());
    index.remove_binding("a", "to-r");
    assert_eq!(index.route_connections(W, "p"), r);
    index.remove_binding("b", "to-r");
    assert_eq!(index.route_connections(W, "p"), BTreeSet::new());
    // Offers: only the ClusterBindings and the instance's own namespace's Bindings.
    index.apply_binding(route("a", "to-r", 1));
    index.apply_binding(route("c", "to-r", 1));
    let offers = index.offers(W, Some("a"), |_| None);
    assert_eq!(
        offers
            .iter()
            .map(|o| o.binding.as_str())
            .collect::<Vec<_>>(),
        ["a/to-r"]
    );
}

#[test]
fn events_scope_follows_the_served_bindings() {
    let mut index = Index::new(10);
    let asking = |namespace: &str, name: &str| {
        let mut b = (*binding(namespace, name, 1, &[W])).clone();
        b.spec.provider_events = Some(serde_json::from_str("{}").expect("valid"));
        Arc::new(b)
    };
    assert_eq!(
        index.provider_events_scope("p", W),
        resolve::EventsScope::Nowhere
    );
    index.apply_binding(asking("a", "one"));
    assert_eq!(
        index.provider_events_scope("p", W),
        resolve::EventsScope::Namespaces(["a".to_owned()].into())
    );
    let mut cluster = (*cluster_binding("all", &[W])).clone();
    cluster.spec.binding.provider_events = Some(serde_json::from_str("{}").expect("valid"));
    index.apply_cluster(Arc::new(cluster));
    assert_eq!(
        index.provider_events_scope("p", W),
        resolve::EventsScope::Everywhere
    );
}

#[test]
fn a_relist_holds_exactly_what_it_lists() {
    let mut index = Index::new(10);
    index.apply_binding(binding("a", "gone", 1, &[W]));
    index.apply_cluster(cluster_binding("gone", &[G]));
    assert_eq!(
        index.relist_bindings(vec![binding("b", "kept", 1, &[W])]),
        Touched::Everything
    );
    assert_eq!(index.relist_cluster(Vec::new()), Touched::Everything);
    assert_eq!(resolved(&index, "a"), None);
    assert_eq!(resolved(&index, "b").as_deref(), Some("kept"));
    assert_eq!(index.resolve("p", G, None, Some(&Default::default())), None);
    // A re-list applies the cap as events do.
    let mut capped = Index::new(1);
    capped.relist_bindings(vec![
        binding("a", "young", 2, &[W]),
        binding("a", "old", 1, &[W]),
    ]);
    assert_eq!(resolved(&capped, "a").as_deref(), Some("old"));
    assert_eq!(capped.past_cap(), [("a".to_owned(), 1)].into());
    assert_eq!(capped.remove_binding("a", "old"), in_ns(&[W], "a"));
    assert_eq!(resolved(&capped, "a").as_deref(), Some("young"));
}

#[test]
fn touched_and_reach_name_the_instances_to_look_at() {
    let apis = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<_>>();
    let a = Touched::Apis {
        apis: apis(&[W]),
        namespace: Some("a".into()),
    };
    let everywhere = Touched::Apis {
        apis: apis(&[W]),
        namespace: None,
    };
    let other = Touched::Apis {
        apis: apis(&[G]),
        namespace: None,
    };
    assert!(a.reaches(Some("a")) && !a.reaches(Some("b")) && !a.reaches(None));
    assert!(everywhere.reaches(None) && everywhere.reaches(Some("z")));
    assert!(Touched::Everything.reaches(None));
    assert!(Touched::Everything.concerns_api(G) && !a.concerns_api(G));
    // (burst) → reach of W
    let cases: [(Vec<&Touched>, Reach); 5] = [
        (vec![], Reach::Nothing),
        (vec![&other], Reach::Nothing),
        (vec![&a, &other], Reach::Namespaces(["a".to_owned()].into())),
        (vec![&a, &everywhere], Reach::All),
        (vec![&Touched::Everything, &a], Reach::All),
    ];
    for (burst, want) in cases {
        assert_eq!(Reach::of(W, burst.iter().copied()), want);
    }
    let reach = Reach::Namespaces(["a".to_owned()].into());
    assert!(reach.covers(Some("a")) && !reach.covers(Some("b")) && !reach.covers(None));
    assert!(Reach::All.covers(None) && !Reach::Nothing.covers(Some("a")));
}

/// A route offered by a ClusterBinding of Connection `r` for the API `p` serves.
fn cluster_route(name: &str) -> Arc<ClusterBinding> {
    let mut b = (*cluster_binding(name, &[W])).clone();
    b.spec.binding.connection_ref.name = "r".into();
    b.status = Some(routed_status());
    Arc::new(b)
}

#[test]
fn an_api_is_routed_while_a_served_binding_offers_another_route() {
    let mut index = Index::new(10);
    assert!(!index.routed(W, "p"));
    index.apply_cluster(cluster_binding("all", &[W]));
    assert!(
        !index.routed(W, "p"),
        "the serving Connection's own binding is no route"
    );
    index.apply_cluster(cluster_route("to-r"));
    assert!(index.routed(W, "p"));
    assert!(
        !index.routed(W, "r"),
        "routed for the Connection serving the CRD only"
    );
    assert!(!index.routed(G, "p"));
    index.remove_cluster("to-r");
    assert!(
        !index.routed(W, "p"),
        "a ClusterBinding's route goes with it"
    );
    assert_eq!(index.route_connections(W, "p"), BTreeSet::new());
    index.remove_cluster("all");
    assert!(
        index.by_api.is_empty(),
        "nothing is kept of an API no binding lists"
    );
    index.apply_binding(binding("a", "one", 1, &[W, G]));
    index.remove_binding("a", "one");
    assert!(index.by_api.is_empty(), "nor of a namespace's");
}

#[test]
fn past_the_cap_is_counted_per_namespace() {
    let mut index = Index::new(2);
    for n in 0..5 {
        index.apply_binding(binding("a", &format!("b{n}"), n, &[W]));
    }
    index.apply_binding(binding("b", "only", 1, &[W]));
    assert_eq!(index.past_cap_in("a"), 3);
    assert_eq!(index.past_cap_in("b"), 0);
    assert_eq!(index.past_cap_in("none"), 0);
}

#[test]
fn a_binding_is_the_same_only_if_spec_and_status_both_are() {
    let one = binding("a", "one", 1, &[W]);
    let mut status_changed = (*one).clone();
    status_changed.status = Some(status(&[W], "other"));
    let mut spec_changed = (*one).clone();
    spec_changed.spec.apis.clear();
    assert!(same(one.as_ref(), one.as_ref()));
    assert!(!same(one.as_ref(), &status_changed));
    assert!(!same(one.as_ref(), &spec_changed));
}

#[test]
fn an_api_stays_indexed_while_any_binding_lists_it() {
    let mut index = Index::new(10);
    index.apply_cluster(cluster_binding("all", &[W]));
    index.apply_binding(binding("a", "one", 1, &[W]));
    index.remove_binding("a", "one");
    assert_eq!(resolved(&index, "a").as_deref(), Some("all"));
    index.apply_binding(binding("a", "one", 1, &[W]));
    index.remove_cluster("all");
    assert_eq!(resolved(&index, "a").as_deref(), Some("one"));
}

#[test]
fn where_an_api_is_read_follows_every_binding_listing_it_and_its_changes_are_announced() {
    let mut index = Index::new(1);
    let scope = |index: &Index| index.watch_scope(W);
    assert_eq!(scope(&index), WatchScope::Namespaces(Default::default()));
    index.apply_binding(binding("a", "one", 1, &[W]));
    // Past the cap: not served, but its namespace is read all the same (it may hold objects).
    assert_eq!(
        index.apply_binding(binding("b", "one", 1, &[W])),
        in_ns(&[W], "b")
    );
    let mut flood = (*binding("a", "two", 2, &[W])).clone();
    flood.status = None;
    assert_eq!(
        index.apply_binding(Arc::new(flood)),
        None,
        "past a's cap: nothing"
    );
    assert_eq!(
        scope(&index),
        WatchScope::Namespaces(["a".to_owned(), "b".to_owned()].into())
    );
    // Being deleted, it still holds W (its objects are let go of): b is read until it is gone.
    let mut deleting = (*binding("b", "one", 1, &[W])).clone();
    deleting.metadata.deletion_timestamp =
        Some(Time(jiff::Timestamp::from_second(9).expect("valid")));
    index.apply_binding(Arc::new(deleting));
    assert!(index.watch_scope(W) != WatchScope::Namespaces(["a".to_owned()].into()));
    assert_eq!(
        index.remove_binding("b", "one"),
        in_ns(&[W], "b"),
        "announced"
    );
    assert_eq!(
        scope(&index),
        WatchScope::Namespaces(["a".to_owned()].into())
    );
    // A ClusterBinding makes it cluster-wide, announced to every namespace.
    let touched = index.apply_cluster(cluster_binding("all", &[W]));
    assert!(
        touched
            .as_ref()
            .is_some_and(|t| t.reaches(None) && t.concerns_api(W))
    );
    assert_eq!(scope(&index), WatchScope::Cluster);
    index.remove_cluster("all");
    assert_eq!(
        scope(&index),
        WatchScope::Namespaces(["a".to_owned()].into())
    );
}
