//! What one synced object costs in the syncer's caches, as resident memory (no cluster needed):
//! N objects shaped like the ones the API servers send in `kbind-bench` (metadata with
//! three managers' `managedFields`, kubectl's last-applied copy, kbind's finalizer and markers),
//! fed as watch events through each cache's transform into a kube-runtime reflector store, as the
//! syncer does. Prints the growth of this process's RSS per object for each cache (allocator
//! overhead included), beside what a full `DynamicObject` cache of the same objects costs.
//! `kbind-bench` measures the syncer's RSS as a whole, which adds the sync state and the
//! scheduler's to these.

use std::sync::Arc;

use clap::Parser;
use kbind_shared::cache::{Instance, InstanceType, ProviderCopy, consumer_metadata, map_event};
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::Event;
use serde_json::{Value, json};

#[derive(Parser)]
#[command(name = "kbind-bench-cache")]
struct Args {
    /// Objects cached.
    #[arg(long, default_value_t = 10_000)]
    objects: usize,
}

/// A Widget as an API server sends it (consumer side when `provider` is false).
fn widget(i: usize, provider: bool) -> Value {
    let manager = |name: &str, op: &str, fields: Value| {
        json!({ "manager": name, "operation": op, "apiVersion": "example.org/v1",
                "time": "2026-12-01T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": fields })
    };
    let mut annotations = json!({
        "kubectl.kubernetes.io/last-applied-configuration":
            format!("{{\"apiVersion\":\"example.org/v1\",\"kind\":\"Widget\",\"metadata\":{{\"name\":\"w{i}\",\"namespace\":\"bench\"}},\"spec\":{{\"size\":{i}}}}}\n"),
    });
    if provider {
        annotations["core.kbind.io/consumer-cluster-uid"] =
            json!("0b2e4c9a-5d1f-4e8b-9a7c-3f6d2e1b0a98");
        annotations["core.kbind.io/consumer-object-uid"] =
            json!(format!("7f3a9c2e-1b4d-4e6f-8a0c-{i:012}"));
    }
    json!({
        "apiVersion": "example.org/v1",
        "kind": "Widget",
        "metadata": {
            "name": format!("w{i}"),
            "namespace": "bench",
            "uid": format!("5e8d1a7c-3b2f-4c9e-a6d0-{i:012}"),
            "resourceVersion": format!("{}", 100_000 + i),
            "generation": 2,
            "creationTimestamp": "2026-12-01T00:00:00Z",
            "labels": if provider { json!({ "core.kbind.io/managed": "true" }) } else { json!({ "app": "bench" }) },
            "annotations": annotations,
            "finalizers": if provider { json!(null) } else { json!(["core.kbind.io/syncer"]) },
            "managedFields": [
                manager("kubectl", "Update", json!({ "f:spec": { ".": {}, "f:size": {} } })),
                manager("kbind", if provider { "Apply" } else { "Update" }, json!({ "f:metadata": { "f:finalizers": { ".": {}, "v:\"core.kbind.io/syncer\"": {} } } })),
                manager("provider-controller", "Update", json!({ "f:status": { ".": {}, "f:observedSize": {}, "f:phase": {} } })),
            ],
        },
        "spec": { "size": i },
        "status": {
            "observedSize": i,
            "phase": "Ready",
            "kbindSync": { "generation": 2, "state": "Delivered", "time": "2026-12-01T00:00:00Z" },
        },
    })
}

/// This process's resident memory, in bytes.
fn allocated() -> isize {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<isize>().ok())
        .unwrap_or_default()
        * 1024
}

/// Bytes per object a store holds after `n` objects went through `event`.
fn per_object<K, F>(n: usize, mut writer: Writer<K>, mut event: F) -> (f64, Writer<K>)
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
    F: FnMut(usize) -> Event<K>,
{
    let before = allocated();
    writer.apply_watcher_event(&Event::Init);
    for i in 0..n {
        writer.apply_watcher_event(&event(i));
    }
    writer.apply_watcher_event(&Event::InitDone);
    let bytes = allocated() - before;
    (bytes as f64 / n as f64, writer)
}

fn main() {
    let args = Args::parse();
    let n = args.objects;
    let resource = ApiResource {
        group: "example.org".into(),
        version: "v1".into(),
        api_version: "example.org/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    };
    let dyntype: InstanceType = Arc::new(resource.clone());
    let parse = |v: Value| serde_json::from_value::<Instance>(v).expect("a valid Widget");

    let (consumer, consumer_store) = per_object(n, Writer::<Instance>::new(dyntype.clone()), |i| {
        Event::InitApply(parse(widget(i, false))).modify(|o| consumer_metadata(&mut o.metadata))
    });
    let (provider, provider_store) =
        per_object(n, Writer::<ProviderCopy>::new(dyntype.clone()), |i| {
            map_event(Event::InitApply(parse(widget(i, true))), |o| {
                ProviderCopy::of(o, "0b2e4c9a-5d1f-4e8b-9a7c-3f6d2e1b0a98")
            })
        });
    let sample = consumer_store.as_reader().state();
    let sample_bytes = sample
        .first()
        .map(|o| {
            o.spec.as_ref().map_or(0, |s| s.as_str().len())
                + o.status.as_ref().map_or(0, |s| s.as_str().len())
        })
        .unwrap_or_default();
    drop(sample);
    // Last: freed memory is reused before the process grows, so a cache measured after one that
    // was dropped would look free.
    let (full, full_store) = per_object(n, Writer::<DynamicObject>::new(resource), |i| {
        Event::InitApply(serde_json::from_value(widget(i, false)).expect("a valid Widget"))
    });
    drop(full_store);
    println!("syncer cache footprint, {n} objects (growth of resident memory)");
    println!("  a full DynamicObject cache, for comparison: {full:>7.0} B per object");
    println!("  consumer cache (Instance):                  {consumer:>7.0} B per object");
    println!("  provider cache (ProviderCopy):              {provider:>7.0} B per object");
    println!(
        "  both, per synced object:                    {:>7.0} B  (spec + status text: {sample_bytes} B)",
        consumer + provider
    );
    println!(
        "  sizes: Instance {} B, ObjectMeta {} B, ProviderCopy {} B, a cache key {} B",
        std::mem::size_of::<Instance>(),
        std::mem::size_of::<kube::api::ObjectMeta>(),
        std::mem::size_of::<ProviderCopy>(),
        std::mem::size_of::<kube::runtime::reflector::ObjectRef<Instance>>(),
    );
    drop(provider_store);
}
