//! Version skew, both ways, on two real clusters: the schema manager of kbind's previous version
//! (`e2e/tools/previous-version`, built once into the cache) with a syncer of the current tree,
//! and the reverse. Objects sync both ways, and the work assignment one version writes is read and
//! acknowledged by the other.

use std::collections::BTreeSet;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kbind_e2e::fixtures::*;
use kbind_e2e::sharding::running;
use kbind_e2e::tools::{previous_build, previous_commit};
use kbind_e2e::wait::{wait_for, wait_gone};
use kbind_shared::shard::{
    ASSIGNMENT_CONFIGMAP, ASSIGNMENT_FORMAT, ASSIGNMENT_KEY, Assignment,
    OBSERVED_ASSIGNMENT_ANNOTATION,
};
use kube::{Api, ResourceExt};

async fn skew_syncs(test: &str, manager: Build, syncer: Build) {
    eprintln!(
        "version skew: schema manager {manager:?}, syncer {syncer:?} (previous = {})",
        previous_commit().unwrap()
    );
    let mut s = SyncEnv::start_built(test, &[0, 1, 2], None, &[], &[], (&manager, &syncer)).await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;

    // The processes run the builds asked for.
    let (manager_index, syncer_index) = (s.manager.index, s.syncer.index);
    for (index, program, build) in [
        (manager_index, "kbind-schema-manager", &manager),
        (syncer_index, "kbind-syncer", &syncer),
    ] {
        let pid = s.env.process(index).pid().unwrap();
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
        let expected = match build {
            Build::Binaries(dir) => dir.join(program),
            _ => kbind_e2e::controlplane::kbind_bin(program).unwrap(),
        };
        assert_eq!(exe, expected.canonicalize().unwrap(), "{program}");
    }
    let binding = Api::<kbind_shared::api::ClusterBinding>::all(s.consumer.clone())
        .get("widgets")
        .await
        .unwrap();
    eprintln!(
        "the schema manager wrote per-API status entries: {}",
        binding.status.is_some_and(|st| !st.apis.is_empty())
    );

    // The assignment the schema manager wrote, in the format this tree reads …
    let config_maps: Api<ConfigMap> = Api::namespaced(s.consumer.clone(), KBIND_NAMESPACE);
    let assignment = wait_for("an assignment giving the syncer its unit", 60, || async {
        let Some(cm) = config_maps
            .get_opt(ASSIGNMENT_CONFIGMAP)
            .await
            .map_err(|e| e.to_string())?
        else {
            return Ok(None);
        };
        let text = cm
            .data
            .unwrap_or_default()
            .remove(ASSIGNMENT_KEY)
            .unwrap_or_default();
        let assignment: Assignment = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        Ok((assignment.units.values().any(|m| m == "syncer-0")).then_some(assignment))
    })
    .await;
    assert_eq!(assignment.format, ASSIGNMENT_FORMAT);
    let assigned: BTreeSet<String> = assignment
        .units
        .iter()
        .filter(|(_, m)| *m == "syncer-0")
        .map(|(u, _)| u.clone())
        .collect();

    // … which the syncer applied (its Lease acknowledges the generation) and runs.
    let leases: Api<Lease> = Api::namespaced(s.consumer.clone(), KBIND_NAMESPACE);
    wait_for("the syncer acknowledging the assignment", 60, || {
        let leases = leases.clone();
        let consumer = s.consumer.clone();
        let assigned = assigned.clone();
        async move {
            let lease = leases
                .get("kbind-syncer-syncer-0")
                .await
                .map_err(|e| e.to_string())?;
            let observed: u64 = lease
                .annotations()
                .get(OBSERVED_ASSIGNMENT_ANNOTATION)
                .and_then(|g| g.parse().ok())
                .unwrap_or(0);
            let runs = running(&consumer)
                .await
                .remove("syncer-0")
                .unwrap_or_default();
            Ok((observed >= assignment.generation && runs == assigned).then_some(()))
        }
    })
    .await;

    // Objects sync: spec up, status down, a change up, deletion cleans up.
    kbind_e2e::cluster::ensure_namespace(&s.consumer, "team-a")
        .await
        .unwrap();
    let consumer_widgets = widgets(&s.consumer, "team-a");
    let provider_widgets = widgets(&s.provider, "team-a");
    for name in ["w1", "w2"] {
        create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", name, 3).await;
    }
    wait_status_down(&consumer_widgets, "w1", 3).await;
    resize_and_wait_upstream(&consumer_widgets, &provider_widgets, "w2", 7).await;
    consumer_widgets
        .delete("w1", &Default::default())
        .await
        .unwrap();
    wait_gone(&provider_widgets, "w1", "w1's provider copy", 30).await;
    wait_gone(&consumer_widgets, "w1", "w1 on the consumer", 30).await;
}

#[tokio::test]
async fn previous_schema_manager_with_current_syncer() {
    let previous = Build::Binaries(previous_build().unwrap());
    skew_syncs("skew_previous_manager", previous, Build::Current).await;
}

#[tokio::test]
async fn current_schema_manager_with_previous_syncer() {
    let previous = Build::Binaries(previous_build().unwrap());
    skew_syncs("skew_previous_syncer", Build::Current, previous).await;
}
