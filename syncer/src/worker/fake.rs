//! The step executors' unit tests run against recorded API answers: a fake consumer and a fake
//! provider — kube `Client`s over a `tower` service — that answer each request from the test's
//! table and record it, so a test says exactly which requests a step makes and what it leaves in
//! the object's record. Lists are answered empty and watches never end: the worker's caches stay
//! as the test leaves them. (End-to-end behaviour is proven on real API servers in `e2e/`; this is
//! the narrow unit layer.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::BodyExt;
use kbind_shared::cache::Instance;
use kube::Client;
use kube::api::ApiResource;
use serde_json::{Value, json};

use super::buckets::Buckets;
use super::state::{RouteSpec, Worker, WorkerSpec};
use crate::context::{Context, Limits, Settings};

/// One request a fake API server received.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// The query: e.g. the field manager of an apply.
    pub query: String,
    pub body: Value,
}

/// Every request a fake received, in order.
pub type Requests = Arc<Mutex<Vec<Request>>>;

/// A test's table: the answer (HTTP code and body) to a request by method and path; `None` for a
/// request it does not expect — a list is then answered empty, an Event created as sent, and
/// anything else `404`.
pub type Table = dyn Fn(&str, &str) -> Option<(u16, Value)> + Send + Sync;

/// A fake API server answering from `table`, and what it receives.
pub fn server(
    table: impl Fn(&str, &str) -> Option<(u16, Value)> + Send + Sync + 'static,
) -> (Client, Requests) {
    let table: Arc<Table> = Arc::new(table);
    let requests = Requests::default();
    let seen = requests.clone();
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let (table, seen) = (table.clone(), seen.clone());
        async move {
            let (parts, body) = request.into_parts();
            let bytes = body
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            let query = parts.uri.query().unwrap_or_default().to_owned();
            if query
                .split('&')
                .any(|p| p == "watch=true" || p == "watch=1")
            {
                // A watch: nothing ever changes.
                std::future::pending::<()>().await;
            }
            let (method, path) = (parts.method.to_string(), parts.uri.path().to_owned());
            let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let answer = table(&method, &path).unwrap_or_else(|| unexpected(&method, &path, &body));
            seen.lock().unwrap().push(Request {
                method,
                path,
                query,
                body,
            });
            let (code, body) = answer;
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
                    .unwrap(),
            )
        }
    });
    (Client::new(service, "default"), requests)
}

/// The answer to a request the table does not name.
fn unexpected(method: &str, path: &str, body: &Value) -> (u16, Value) {
    if method == "GET" && is_collection(path) {
        let list = json!({ "apiVersion": "v1", "kind": "List", "metadata": { "resourceVersion": "1" }, "items": [] });
        return (200, list);
    }
    if method == "POST" && path.ends_with("/events") {
        return (201, body.clone());
    }
    status(404, "NotFound", &format!("{method} {path}"))
}

/// Whether `path` names a collection (a list), not one object: `/api/v1[/namespaces/N]/R` or
/// `/apis/G/V[/namespaces/N]/R`.
fn is_collection(path: &str) -> bool {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let base = if segments.first() == Some(&"api") {
        2
    } else {
        3
    };
    let namespaced = segments.get(base) == Some(&"namespaces") && segments.len() > base + 2;
    segments.len() == base + 1 + if namespaced { 2 } else { 0 }
}

/// An API server's `Status` answer.
pub fn status(code: u16, reason: &str, message: &str) -> (u16, Value) {
    let status = json!({ "apiVersion": "v1", "kind": "Status", "status": "Failure",
        "code": code, "reason": reason, "message": message });
    (code, status)
}

/// The test API: `widgets.example.org`, namespaced, with a status subresource and kbind's
/// delivery record.
pub fn widgets() -> ApiResource {
    ApiResource {
        group: "example.org".into(),
        version: "v1".into(),
        api_version: "example.org/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    }
}

/// The path of the widget `namespace/name` (`suffix`: a subresource, e.g. `/status`).
pub fn widget_path(namespace: &str, name: &str, suffix: &str) -> String {
    format!("/apis/example.org/v1/namespaces/{namespace}/widgets/{name}{suffix}")
}

const KUBECONFIG: &str = "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {cluster: p, user: u}\nclusters:\n- name: p\n  cluster: {server: 'https://provider.example:6443'}\nusers:\n- name: u\n  user: {token: abc}\n";

/// A worker of Connection `c` (consumer cluster UID `consumer-uid`) for [`widgets`], on the
/// fake `consumer` and `provider`, its fence current.
pub async fn worker(consumer: Client, provider: Client) -> Arc<Worker> {
    worker_and_caches(consumer, provider).await.0
}

/// [`worker`], with the writers of its caches (for a test that fills them).
pub async fn worker_and_caches(
    consumer: Client,
    provider: Client,
) -> (Arc<Worker>, super::state::Writers) {
    worker_with(consumer, provider, |_| {}).await
}

/// [`worker_and_caches`] with its spec changed by `edit` (e.g. a CRD without kbind's record).
pub async fn worker_with(
    consumer: Client,
    provider: Client,
    edit: impl FnOnce(&mut WorkerSpec),
) -> (Arc<Worker>, super::state::Writers) {
    let membership = Arc::new(crate::membership::Membership::new(
        consumer.clone(),
        "kbind-system",
        "test".into(),
        Duration::from_secs(30),
    ));
    membership.renewed_now();
    let ctx = Context::start(
        consumer,
        kbind_shared::metrics::Metrics::new(),
        kube::runtime::events::Reporter {
            controller: "kbind".into(),
            instance: None,
        },
        membership,
        Settings {
            resync_interval: Duration::from_secs(3600),
            workers: 1,
            provider_secrets: kbind_shared::credential::SecretPolicy {
                namespaces: Vec::new(),
                transport: kbind_shared::kubeconfig::Transport::Secure,
            },
            limits: Limits {
                max_status_bytes: 1024,
                status_min_interval: Duration::ZERO,
                related: crate::related::plan::CopyLimits {
                    copies_per_entry: 10,
                    bytes_per_entry: 10_000,
                },
            },
            max_bindings_per_namespace: 100,
        },
    )
    .await;
    let route = kbind_shared::routing::Route {
        connection: "c".into(),
        cluster: String::new(),
    };
    let spec = WorkerSpec {
        api: "widgets.example.org".into(),
        resource: widgets(),
        has_status_subresource: true,
        has_delivery: true,
        connection: "c".into(),
        local_uid: "consumer-uid".into(),
        kubeconfig: kbind_shared::kubeconfig::InlineKubeconfig::parse(KUBECONFIG.as_bytes())
            .unwrap(),
        digest: String::new(),
        buckets: Buckets::All,
        namespaces: Default::default(),
        cluster_wide: true,
        route: RouteSpec {
            route,
            served_by: "c".into(),
        },
    };
    let mut spec = spec;
    edit(&mut spec);
    Worker::new(Arc::new(ctx), spec, provider)
}

/// A fake consumer whose kbind objects are Connection `c` (access: its defaults) and these
/// `bindings` (lists answered from them), and whose other answers come from `table`.
pub fn consumer_with(
    bindings: Vec<Value>,
    table: impl Fn(&str, &str) -> Option<(u16, Value)> + Send + Sync + 'static,
) -> (Client, Requests) {
    let connection = json!({ "apiVersion": "core.kbind.io/v1alpha1", "kind": "Connection",
        "metadata": { "name": "c", "resourceVersion": "1" },
        "spec": { "kubeconfigSecretRef": { "namespace": "kbind", "name": "s" } } });
    consumer_of(vec![connection], bindings, table)
}

/// A fake consumer whose kbind objects are these `connections` and `bindings`, and whose other
/// answers come from `table`.
pub fn consumer_of(
    connections: Vec<Value>,
    bindings: Vec<Value>,
    table: impl Fn(&str, &str) -> Option<(u16, Value)> + Send + Sync + 'static,
) -> (Client, Requests) {
    let list = |items: Vec<Value>| json!({ "apiVersion": "v1", "kind": "List", "metadata": { "resourceVersion": "1" }, "items": items });
    server(move |method, path| match (method, path) {
        ("GET", "/apis/core.kbind.io/v1alpha1/connections") => {
            Some((200, list(connections.clone())))
        }
        ("GET", "/apis/core.kbind.io/v1alpha1/bindings") => Some((200, list(bindings.clone()))),
        _ => table(method, path),
    })
}

/// A Connection `name` pinned to provider cluster `cluster` (access: its defaults).
pub fn connection(name: &str, cluster: &str) -> Value {
    json!({ "apiVersion": "core.kbind.io/v1alpha1", "kind": "Connection",
        "metadata": { "name": name, "resourceVersion": "1" },
        "spec": { "kubeconfigSecretRef": { "namespace": "kbind", "name": name } },
        "status": { "remoteClusterUID": cluster } })
}

/// A fake consumer of a routed API (#36): Widgets served by Connection `c` (provider `cl-c`),
/// which binds them in `team-a`; Connection `r` (provider `cl-r`) offers itself as their route in
/// `team-b`. Its other answers come from `table`.
pub fn routed_consumer(
    table: impl Fn(&str, &str) -> Option<(u16, Value)> + Send + Sync + 'static,
) -> (Client, Requests) {
    consumer_of(
        vec![connection("c", "cl-c"), connection("r", "cl-r")],
        vec![binding("team-a"), binding_of("team-b", "r", Some("c"))],
        table,
    )
}

/// The worker of route `r` (provider `cl-r`) on a [`routed_consumer`]; with `serving`, the
/// serving Connection `c`'s own worker instead.
pub async fn route_worker(consumer: Client, provider: Client, serving: bool) -> Arc<Worker> {
    worker_with(consumer, provider, |spec| {
        if serving {
            spec.route.route.cluster = "cl-c".into();
        } else {
            spec.connection = "r".into();
            spec.route.route = kbind_shared::routing::Route {
                connection: "r".into(),
                cluster: "cl-r".into(),
            };
        }
    })
    .await
    .0
}

/// A Binding `widgets` in `namespace` of Connection `c`, its status saying it binds Widgets.
pub fn binding(namespace: &str) -> Value {
    binding_of(namespace, "c", None)
}

/// A Binding in `namespace` of Connection `connection` (`widgets`, or `widgets-<connection>`
/// for another than `c`), its status saying it binds Widgets — as a route of an API `served_by` another Connection, when that is given (#36).
pub fn binding_of(namespace: &str, connection: &str, served_by: Option<&str>) -> Value {
    let mut entry = json!({ "name": "widgets.example.org", "connection": connection,
        "bound": true, "reason": "AsExpected", "message": "" });
    if let Some(served_by) = served_by {
        entry["route"] = json!({ "servedBy": served_by, "schemaAgrees": true });
    }
    let name = match connection {
        "c" => "widgets".to_owned(),
        other => format!("widgets-{other}"),
    };
    json!({ "apiVersion": "core.kbind.io/v1alpha1", "kind": "Binding",
        "metadata": { "name": name, "namespace": namespace, "uid": format!("b-{namespace}-{connection}"),
            "resourceVersion": "1", "creationTimestamp": "2026-01-01T00:00:00Z" },
        "spec": { "connectionRef": { "name": connection }, "apis": [{ "name": "widgets.example.org" }] },
        "status": { "apis": [entry] } })
}

/// A consumer widget `team-a/w` (UID `w-uid`, generation 2, resourceVersion 10) as the cache
/// holds it, with `metadata` merged over that.
pub fn widget(metadata: Value, status: Value) -> Instance {
    let mut object = json!({
        "apiVersion": "example.org/v1", "kind": "Widget",
        "metadata": { "name": "w", "namespace": "team-a", "uid": "w-uid", "generation": 2,
            "resourceVersion": "10" },
        "spec": { "size": 3 },
    });
    if let (Some(into), Some(from)) = (object["metadata"].as_object_mut(), metadata.as_object()) {
        into.extend(from.clone());
    }
    if !status.is_null() {
        object["status"] = status;
    }
    serde_json::from_value(object).unwrap()
}

/// The `managedFields` of a mirror import created: kbind's field manager owns its import label.
pub fn imported_fields() -> Value {
    json!([{ "manager": kbind_shared::keys::FIELD_MANAGER, "operation": "Update",
        "fieldsType": "FieldsV1",
        "fieldsV1": { "f:metadata": { "f:labels": { ".": {}, "f:core.kbind.io/imported": {} } } } }])
}

/// [`widget`] holding kbind's finalizer (a copy may exist), its status empty.
pub fn bound_widget() -> Instance {
    widget(
        json!({ "finalizers": [kbind_shared::keys::SYNCER_FINALIZER] }),
        Value::Null,
    )
}

/// The requests to the test API (`example.org`), namespace writes and Events, in order: what a step wrote or read
/// — the reflectors' lists left out.
pub fn calls(requests: &Requests) -> Vec<Request> {
    requests
        .lock()
        .unwrap()
        .iter()
        .filter(|r| {
            let test_api = r.path.starts_with("/apis/example.org/")
                && (r.method != "GET" || r.path.contains("/widgets/"));
            let namespace_write = r.path.starts_with("/api/v1/namespaces") && r.method != "GET";
            test_api || namespace_write || r.path.contains("/events")
        })
        .cloned()
        .collect()
}

/// What a merge `patch` leaves on an object that had nothing there: the patch without its nulls
/// (a null deletes), as the API server stores it.
pub fn merged(patch: &Value) -> Value {
    match patch {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), merged(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}
