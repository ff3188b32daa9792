//! What each part of kbind's provider apply costs a real API server (#50.6): the same Widgets
//! written with bodies that differ only in kbind's markers, batches of each interleaved round by
//! round on one provider, so that the machine's drift falls on every body alike. Prints figures;
//! asserts nothing about time.
//!
//! Each batch, in a namespace of its own with one watch on it (as a syncer's): `--objects`
//! server-side applies (16 in flight, kbind's field manager, forced), then one status patch per
//! object (as the provider's controller makes), then a second for the watch to deliver. Measured:
//! the control plane's CPU (API server, etcd, controller manager) per object over the batch, and
//! the size of one stored object as the API server returns it (`managedFields` included). The
//! bodies: `plain` (name and spec), then each marker alone — `labels` (managed, consumer cluster
//! UID), `uid-annotations` (consumer cluster and object UIDs), `heartbeat` (the heartbeat
//! record) — and `kbind` (all of them: [`kbind_shared::ownership::spec_up_body`]).

use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use kbind_e2e::TestEnv;
use kbind_e2e::cluster::ensure_namespace;
use kbind_e2e::fixtures::*;
use kbind_shared::keys;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use serde_json::{Value, json};

#[derive(Parser)]
#[command(name = "kbind-bench-bodies")]
struct Args {
    /// Objects per batch.
    #[arg(long, default_value_t = 2000)]
    objects: usize,
    /// Rounds: each body is written this many times, interleaved with the others.
    #[arg(long, default_value_t = 4)]
    rounds: usize,
}

const BODIES: [&str; 5] = ["plain", "labels", "uid-annotations", "heartbeat", "kbind"];
const CONSUMER_UID: &str = "0b7e3a52-1c1e-4a8e-9d55-3f3b2a0c9e11";

/// The apply of Widget `name` (consumer object UID `uid`) with the markers of `body`.
fn body(kind: &str, name: &str, uid: &str) -> Value {
    let heartbeat = kbind_shared::heartbeat::record(None, "provider", CONSUMER_UID);
    let spec = json!({ "size": 3 });
    if kind == "kbind" {
        return kbind_shared::ownership::spec_up_body(
            "example.org/v1",
            "Widget",
            None,
            name,
            Some(&spec),
            CONSUMER_UID,
            uid,
            &heartbeat,
        );
    }
    let mut metadata = json!({ "name": name });
    match kind {
        "labels" => {
            metadata["labels"] = json!({ keys::MANAGED_LABEL: keys::TRUE,
                keys::CONSUMER_CLUSTER_UID_LABEL: CONSUMER_UID });
        }
        "uid-annotations" => {
            metadata["annotations"] = json!({ keys::CONSUMER_CLUSTER_UID_ANNOTATION: CONSUMER_UID,
                keys::CONSUMER_OBJECT_UID_ANNOTATION: uid });
        }
        "heartbeat" => {
            metadata["annotations"] = json!({ keys::HEARTBEAT_ANNOTATION: heartbeat });
        }
        _ => {}
    }
    json!({ "apiVersion": "example.org/v1", "kind": "Widget", "metadata": metadata, "spec": spec })
}

/// One batch of `kind` in `namespace`: control-plane CPU seconds and the stored object's bytes.
async fn batch(
    env: &TestEnv,
    client: &kube::Client,
    namespace: &str,
    kind: &str,
    n: usize,
) -> (f64, usize) {
    ensure_namespace(client, namespace).await.unwrap();
    let api = widgets(client, namespace);
    let watch =
        tokio::spawn(watcher(api.clone(), watcher::Config::default()).for_each(|_| async {}));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cpu = || env.cluster("provider").cpu_seconds();
    let before = cpu();
    let apply = PatchParams::apply(keys::FIELD_MANAGER).force();
    futures::stream::iter(0..n)
        .map(|i| {
            let (api, apply) = (api.clone(), apply.clone());
            async move {
                let name = format!("w{i}");
                // A consumer object UID of the usual form, one per object.
                let uid = format!("{:08x}-0000-4000-8000-{:012x}", i, i);
                api.patch(&name, &apply, &Patch::Apply(body(kind, &name, &uid)))
                    .await
                    .unwrap();
                api.patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": { "phase": "Ready" } })),
                )
                .await
                .unwrap();
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let used = cpu() - before;
    watch.abort();
    let stored = api.get("w0").await.unwrap();
    (used, serde_json::to_vec(&stored).unwrap().len())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    println!(
        "kbind's provider apply, part by part, on a real API server: {} objects per batch, {} \
         rounds of {} bodies (apply + status patch per object; this machine: 2 cores)",
        args.objects,
        args.rounds,
        BODIES.len()
    );
    let env = TestEnv::start("bench-bodies", &["provider"]).await.unwrap();
    let client = env.cluster("provider").admin_client().await.unwrap();
    install_crd(&client, &widget_crd()).await.unwrap();
    let started = Instant::now();
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); BODIES.len()];
    let mut bytes = vec![0; BODIES.len()];
    for round in 0..args.rounds {
        // Each round in another order, so that no body always follows the same one.
        let mut order: Vec<usize> = (0..BODIES.len()).collect();
        order.rotate_left(round % BODIES.len());
        for b in order {
            let namespace = format!("bodies-{}-{round}", BODIES[b]);
            let (used, size) = batch(&env, &client, &namespace, BODIES[b], args.objects).await;
            cpu[b].push(used * 1000.0 / args.objects as f64);
            bytes[b] = size;
            println!(
                "  round {} {:<16} {:>6.2} ms per object, {:>5} bytes stored",
                round + 1,
                BODIES[b],
                used * 1000.0 / args.objects as f64,
                size
            );
        }
    }
    let plain = median(&mut cpu[0].clone());
    println!("medians (control plane CPU per object, against plain):");
    for (b, name) in BODIES.iter().enumerate() {
        let m = median(&mut cpu[b]);
        println!(
            "  {name:<16} {m:>6.2} ms ({:+.2} ms, {:+.1} %), {} bytes stored ({:+})",
            m - plain,
            100.0 * (m - plain) / plain,
            bytes[b],
            bytes[b] as i64 - bytes[0] as i64
        );
    }
    println!("took {:.0?}", started.elapsed());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_body_carries_only_the_markers_it_names() {
        let metadata = |kind| body(kind, "w", "u")["metadata"].clone();
        assert_eq!(metadata("plain"), json!({ "name": "w" }));
        let labels = metadata("labels");
        assert_eq!(
            labels["labels"][keys::CONSUMER_CLUSTER_UID_LABEL],
            CONSUMER_UID
        );
        assert_eq!(labels.get("annotations"), None);
        let uids = metadata("uid-annotations");
        assert_eq!(
            uids["annotations"][keys::CONSUMER_OBJECT_UID_ANNOTATION],
            "u"
        );
        assert_eq!(uids["annotations"].as_object().unwrap().len(), 2);
        assert_eq!(uids.get("labels"), None);
        let heartbeat = metadata("heartbeat");
        assert_eq!(heartbeat["annotations"].as_object().unwrap().len(), 1);
        assert!(heartbeat["annotations"][keys::HEARTBEAT_ANNOTATION].is_string());
        // All of them: exactly what the syncer applies.
        let kbind = metadata("kbind");
        assert_eq!(kbind["labels"], labels["labels"]);
        let mut annotations = uids["annotations"].as_object().unwrap().clone();
        annotations.extend(heartbeat["annotations"].as_object().unwrap().clone());
        assert_eq!(kbind["annotations"], Value::Object(annotations));
    }
}
