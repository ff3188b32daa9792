//! The minimal client the benchmarks measure kbind against: it syncs one namespace's Widgets the
//! way kbind does (spec up by server-side apply, status down by a merge patch, both watch-fed)
//! and makes only the unavoidable writes: a finalizer on each new consumer object before its first
//! provider write (without it, a deletion could leave the provider copy behind — the one safety
//! write every syncer that propagates deletion needs), one provider apply per spec it has not
//! pushed yet, one consumer status patch per status it has not copied yet. No ownership markers or
//! checks, no delivery record, no conflicts, no deletion handling, no fencing: what is left when
//! everything else kbind does is taken away. It runs with the same concurrency as a kbind syncer
//! (`--workers`, 8): that many objects' writes in flight at once, both directions together.
//!
//! [`Shape::LikeKbind`] makes the same writes carry what kbind's carry — the ownership labels and
//! annotations and the heartbeat record on the provider apply, a resourceVersion precondition and
//! kbind's field manager on the finalizer patch, the delivery record in the status patch — still
//! without any of kbind's reads, checks or state: what the API servers' share of kbind's cost is
//! when the bodies, not the program, are the difference (#50.6).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

/// The minimal client's finalizer.
pub const FINALIZER: &str = "bench.kbind.io/minimal";

/// What was last written per object name, so that an unchanged value is never written again.
type Written = Arc<Mutex<HashMap<String, Value>>>;

/// What the minimal client's writes carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    /// Only the finalizer, the spec and the status.
    Plain,
    /// As kbind's writes, on both clusters (see the module's documentation).
    LikeKbind,
    /// The provider apply as kbind's (ownership labels and annotations, heartbeat record, field
    /// manager); the consumer writes plain.
    ProviderMarkers,
    /// The consumer writes as kbind's (precondition and field manager on the finalizer patch,
    /// the delivery record in the status patch); the provider apply plain.
    ConsumerRecord,
}

impl Shape {
    fn provider_like_kbind(self) -> bool {
        matches!(self, Shape::LikeKbind | Shape::ProviderMarkers)
    }

    fn consumer_like_kbind(self) -> bool {
        matches!(self, Shape::LikeKbind | Shape::ConsumerRecord)
    }
}

/// The consumer cluster UID the kbind-shaped writes name (any text of a UID's length).
const CONSUMER_UID: &str = "00000000-0000-4000-8000-00000000bench";

/// The write one observed value needs: `Some(value)` when it differs from what was last written
/// for `name` (and records it), `None` when it was written already or there is none.
pub fn needs_write(
    written: &Mutex<HashMap<String, Value>>,
    name: &str,
    value: Option<&Value>,
) -> Option<Value> {
    let value = value?;
    let mut written = written.lock().unwrap_or_else(|e| e.into_inner());
    if written.get(name) == Some(value) {
        return None;
    }
    written.insert(name.to_owned(), value.clone());
    Some(value.clone())
}

/// Runs the minimal client for `consumer` → `provider` Widgets until the returned tasks are
/// aborted. `workers`: objects whose writes are in flight at once, both directions together.
pub fn start(
    consumer: Api<DynamicObject>,
    provider: Api<DynamicObject>,
    workers: usize,
    shape: Shape,
) -> Vec<tokio::task::JoinHandle<()>> {
    let (provider_like_kbind, consumer_like_kbind) =
        (shape.provider_like_kbind(), shape.consumer_like_kbind());
    let consumer_params = move || {
        if consumer_like_kbind {
            PatchParams {
                field_manager: Some(kbind_shared::keys::FIELD_MANAGER.into()),
                ..Default::default()
            }
        } else {
            PatchParams::default()
        }
    };
    let pushed: Written = Arc::default();
    let copied: Written = Arc::default();
    let slots = Arc::new(tokio::sync::Semaphore::new(workers));
    let down_slots = slots.clone();
    let up = {
        let (consumer, provider) = (consumer.clone(), provider.clone());
        tokio::spawn(async move {
            watcher(consumer.clone(), watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .filter_map(|o| std::future::ready(o.ok()))
                .map(|object| {
                    let (consumer, provider, pushed, slots) = (
                        consumer.clone(),
                        provider.clone(),
                        pushed.clone(),
                        slots.clone(),
                    );
                    async move {
                        let Ok(_slot) = slots.acquire().await else {
                            return;
                        };
                        let name = object.name_any();
                        let Some(spec) = needs_write(&pushed, &name, object.data.get("spec"))
                        else {
                            return;
                        };
                        if !object.finalizers().iter().any(|f| f == FINALIZER) {
                            let mut finalizers = object.finalizers().to_vec();
                            finalizers.push(FINALIZER.to_owned());
                            let mut patch = json!({ "metadata": { "finalizers": finalizers } });
                            if consumer_like_kbind {
                                patch["metadata"]["resourceVersion"] =
                                    json!(object.resource_version());
                            }
                            if let Err(e) = consumer
                                .patch(&name, &consumer_params(), &Patch::Merge(&patch))
                                .await
                            {
                                eprintln!("minimal client: finalizer {name}: {e}");
                                pushed
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .remove(&name);
                                return;
                            }
                        }
                        let body = if provider_like_kbind {
                            kbind_shared::ownership::spec_up_body(
                                object.types.as_ref().map_or("", |t| t.api_version.as_str()),
                                object.types.as_ref().map_or("", |t| t.kind.as_str()),
                                None,
                                &name,
                                Some(&spec),
                                CONSUMER_UID,
                                object.uid().as_deref().unwrap_or_default(),
                                &kbind_shared::heartbeat::record(None, "bench", CONSUMER_UID),
                            )
                        } else {
                            json!({
                                "apiVersion": object.types.as_ref().map(|t| t.api_version.as_str()),
                                "kind": object.types.as_ref().map(|t| t.kind.as_str()),
                                "metadata": { "name": name },
                                "spec": spec,
                            })
                        };
                        let manager = if provider_like_kbind {
                            kbind_shared::keys::FIELD_MANAGER
                        } else {
                            "kbind-bench-minimal"
                        };
                        let params = PatchParams::apply(manager).force();
                        if let Err(e) = provider.patch(&name, &params, &Patch::Apply(&body)).await {
                            eprintln!("minimal client: apply {name}: {e}");
                            pushed
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .remove(&name);
                        }
                    }
                })
                .buffer_unordered(workers)
                .for_each(|()| async {})
                .await;
        })
    };
    let down = tokio::spawn(async move {
        watcher(provider, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .filter_map(|o| std::future::ready(o.ok()))
            .map(|object| {
                let (consumer, copied, slots) =
                    (consumer.clone(), copied.clone(), down_slots.clone());
                async move {
                    let Ok(_slot) = slots.acquire().await else {
                        return;
                    };
                    let name = object.name_any();
                    let Some(status) = needs_write(&copied, &name, object.data.get("status"))
                    else {
                        return;
                    };
                    let mut patch = json!({ "status": status });
                    if consumer_like_kbind {
                        // The record kbind's status patch carries: the generation the provider
                        // has, and when it took it (its copy's creation stands for that here).
                        patch["status"][kbind_shared::delivery::FIELD] = json!({
                            "state": kbind_shared::delivery::SYNCED,
                            "generation": object.metadata.generation.unwrap_or(1),
                            "time": object.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()),
                        });
                    }
                    if let Err(e) = consumer
                        .patch_status(&name, &consumer_params(), &Patch::Merge(&patch))
                        .await
                    {
                        eprintln!("minimal client: status {name}: {e}");
                        copied
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(&name);
                    }
                }
            })
            .buffer_unordered(workers)
            .for_each(|()| async {})
            .await;
    });
    vec![up, down]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_shape_carries_kbinds_parts_on_the_clusters_it_names() {
        for (shape, provider, consumer) in [
            (Shape::Plain, false, false),
            (Shape::LikeKbind, true, true),
            (Shape::ProviderMarkers, true, false),
            (Shape::ConsumerRecord, false, true),
        ] {
            assert_eq!(
                (shape.provider_like_kbind(), shape.consumer_like_kbind()),
                (provider, consumer),
                "{shape:?}"
            );
        }
    }

    #[test]
    fn only_a_new_value_is_written() {
        let written = Mutex::new(HashMap::new());
        let (a, b) = (json!({ "size": 1 }), json!({ "size": 2 }));
        assert_eq!(needs_write(&written, "w", Some(&a)), Some(a.clone()));
        assert_eq!(needs_write(&written, "w", Some(&a)), None);
        assert_eq!(needs_write(&written, "other", Some(&a)), Some(a.clone()));
        assert_eq!(needs_write(&written, "w", Some(&b)), Some(b.clone()));
        assert_eq!(needs_write(&written, "w", None), None);
        assert_eq!(needs_write(&written, "w", Some(&b)), None);
    }
}
