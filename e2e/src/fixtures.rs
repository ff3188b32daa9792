//! Objects and steps e2e tests share: provider CRDs, kubeconfig Secrets, Connections, and
//! running the schema manager with test-speed intervals.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_shared::api::{
    Connection, ConnectionSpec, KubeconfigSecretRef, SchemaPolicy, SchemaSource,
};
use kbind_shared::conditions;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::{ensure_namespace, free_port};
use crate::env::TestEnv;
use crate::kbind::{http_get, wait_established};
use crate::wait::eventually;

/// Namespace of the kubeconfig Secrets tests create on the consumer.
pub const SECRET_NAMESPACE: &str = "kbind";

/// A namespaced CRD `<plural>.<group>` with a status subresource and an open schema.
pub fn crd(
    plural: &str,
    group: &str,
    kind: &str,
    labels: &[(&str, &str)],
) -> CustomResourceDefinition {
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": format!("{plural}.{group}"),
            "labels": labels.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect::<serde_json::Map<_, _>>(),
        },
        "spec": {
            "group": group,
            "names": { "plural": plural, "singular": kind.to_lowercase(), "kind": kind, "listKind": format!("{kind}List") },
            "scope": "Namespaced",
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "subresources": { "status": {} },
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
                        "status": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
                    },
                }},
            }],
        },
    });
    serde_json::from_value(crd).expect("a valid CRD")
}

/// Applies a CRD and waits until it is Established.
pub async fn install_crd(client: &Client, crd: &CustomResourceDefinition) -> Result<(), String> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply("kbind-e2e").force(),
        &Patch::Apply(crd),
    )
    .await
    .map_err(|e| format!("apply CRD {name}: {e}"))?;
    wait_established(&api, &name).await
}

/// The user's explicit opt-in: lets `connection` take over the consumer CRD `name`.
pub async fn adopt_crd(client: &Client, name: &str, connection: &str) -> Result<(), String> {
    let patch = json!({ "metadata": { "annotations": { "core.kbind.io/adopt": connection } } });
    Api::<CustomResourceDefinition>::all(client.clone())
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(drop)
        .map_err(|e| format!("annotate CRD {name}: {e}"))
}

/// Sets (or removes, with `None`) a label on a CRD.
pub async fn label_crd(
    client: &Client,
    name: &str,
    key: &str,
    value: Option<&str>,
) -> Result<(), String> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let patch = json!({ "metadata": { "labels": { key: value } } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(drop)
        .map_err(|e| format!("label CRD {name}: {e}"))
}

/// Creates or replaces the Secret `kbind/<name>` with `data` under `key`.
pub async fn put_secret(client: &Client, name: &str, key: &str, data: &[u8]) -> Result<(), String> {
    ensure_namespace(client, SECRET_NAMESPACE).await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), SECRET_NAMESPACE);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            key.to_owned(),
            ByteString(data.to_vec()),
        )])),
        ..Default::default()
    };
    secrets
        .patch(
            name,
            &PatchParams::apply("kbind-e2e").force(),
            &Patch::Apply(&secret),
        )
        .await
        .map(drop)
        .map_err(|e| format!("apply Secret {SECRET_NAMESPACE}/{name}: {e}"))
}

/// A Connection to the kubeconfig in Secret `kbind/<secret>`.
pub fn connection(name: &str, secret: &str, source: SchemaSource) -> Connection {
    Connection::new(
        name,
        ConnectionSpec {
            kubeconfig_secret_ref: KubeconfigSecretRef {
                namespace: SECRET_NAMESPACE.into(),
                name: secret.into(),
                key: "kubeconfig".into(),
            },
            schema: SchemaPolicy {
                source,
                ..Default::default()
            },
            auto_bind: false,
            access: Default::default(),
        },
    )
}

/// Creates a Connection.
pub async fn create_connection(client: &Client, connection: &Connection) -> Result<(), String> {
    Api::<Connection>::all(client.clone())
        .create(&PostParams::default(), connection)
        .await
        .map(drop)
        .map_err(|e| format!("create Connection: {e}"))
}

/// Waits until the Connection's condition `type_` has `status` (and `reason`, if given), and
/// returns the Connection.
pub async fn wait_condition(
    client: &Client,
    name: &str,
    type_: &str,
    status: &str,
    reason: Option<&str>,
) -> Result<Connection, String> {
    let api: Api<Connection> = Api::all(client.clone());
    eventually(
        &format!(
            "Connection {name} {type_}={status} {}",
            reason.unwrap_or("")
        ),
        Duration::from_secs(30),
        || async {
            let connection = api.get(name).await.map_err(|e| e.to_string())?;
            let conds = connection
                .status
                .as_ref()
                .map(|s| s.conditions.clone())
                .unwrap_or_default();
            let Some(c) = conditions::find(&conds, type_) else {
                return Err(format!("no {type_} condition yet"));
            };
            if c.status == status && reason.is_none_or(|r| c.reason == r) {
                Ok(Some(connection))
            } else {
                Err(format!(
                    "{type_} is {} ({}): {}",
                    c.status, c.reason, c.message
                ))
            }
        },
    )
    .await
}

/// A running kbind program: its process index and endpoints.
pub struct Program {
    /// Index for [`TestEnv::process`].
    pub index: usize,
    /// `127.0.0.1:<port>` of `/metrics`.
    pub metrics: String,
    /// `127.0.0.1:<port>` of `/healthz` and `/readyz`.
    pub probes: String,
}

impl Program {
    /// The current `/metrics` text.
    pub async fn metrics(&self) -> Result<String, String> {
        http_get(&self.metrics, "/metrics")
            .await
            .map(|(_, body)| body)
    }
}

/// kbind's own namespace in tests (`--namespace`).
pub const KBIND_NAMESPACE: &str = "kbind-system";

/// Starts `kbind-schema-manager` against `cluster` as its admin, with 1 s intervals. `extra` adds
/// flags or overrides the defaults.
pub async fn start_schema_manager(
    env: &mut TestEnv,
    cluster: &str,
    name: &str,
    extra: &[&str],
) -> Result<Program, String> {
    ensure_namespace(&env.cluster(cluster).admin_client().await?, KBIND_NAMESPACE).await?;
    let kubeconfig = env.cluster(cluster).admin_kubeconfig_path();
    start_schema_manager_as(env, &kubeconfig, name, extra)
}

/// Starts `kbind-schema-manager` with the given kubeconfig file (e.g. a ServiceAccount's).
pub fn start_schema_manager_as(
    env: &mut TestEnv,
    kubeconfig: &std::path::Path,
    name: &str,
    extra: &[&str],
) -> Result<Program, String> {
    let defaults = [
        "--discovery-interval=1s",
        "--binding-resync-interval=1s",
        "--log-level=info,kbind_schema_manager=debug",
    ];
    start_program(
        env,
        "kbind-schema-manager",
        kubeconfig,
        name,
        &defaults,
        extra,
    )
}

/// Starts a `kbind-syncer` replica named `name` against `cluster` as its admin.
pub async fn start_syncer(
    env: &mut TestEnv,
    cluster: &str,
    name: &str,
    extra: &[&str],
) -> Result<Program, String> {
    ensure_namespace(&env.cluster(cluster).admin_client().await?, KBIND_NAMESPACE).await?;
    let kubeconfig = env.cluster(cluster).admin_kubeconfig_path();
    start_syncer_as(env, &kubeconfig, name, extra)
}

/// Starts a `kbind-syncer` replica with the given kubeconfig file (e.g. a ServiceAccount's).
pub fn start_syncer_as(
    env: &mut TestEnv,
    kubeconfig: &std::path::Path,
    name: &str,
    extra: &[&str],
) -> Result<Program, String> {
    let identity = format!("--identity={name}");
    start_program(
        env,
        "kbind-syncer",
        kubeconfig,
        name,
        // A short membership Lease, so that a killed replica's work moves on quickly.
        &[
            &identity,
            "--membership-lease-duration=3s",
            "--log-level=info,kbind_syncer=debug",
        ],
        extra,
    )
}

/// Starts one of kbind's programs with free loopback ports for its endpoints, `--namespace` set to
/// [`KBIND_NAMESPACE`], the given defaults, and `extra` (which overrides a default of the same flag).
fn start_program(
    env: &mut TestEnv,
    program: &str,
    kubeconfig: &std::path::Path,
    name: &str,
    defaults: &[&str],
    extra: &[&str],
) -> Result<Program, String> {
    let (metrics, probes) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let flag = |arg: &str| arg.split('=').next().unwrap_or(arg).to_owned();
    let overridden: Vec<String> = extra.iter().map(|a| flag(a)).collect();
    let mut args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--metrics-bind-address={metrics}"),
        format!("--health-probe-bind-address={probes}"),
        format!("--namespace={KBIND_NAMESPACE}"),
        format!("--provider-secret-namespaces={SECRET_NAMESPACE},{KBIND_NAMESPACE}"),
    ];
    args.extend(defaults.iter().map(|a| (*a).to_owned()));
    args.retain(|a| !overridden.contains(&flag(a)));
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let index = env.start_kbind(program, name, &args, &[("POD_NAME", name)])?;
    Ok(Program {
        index,
        metrics,
        probes,
    })
}

/// Applies a multi-document YAML manifest to a cluster with server-side apply, in file order.
pub async fn apply_manifest(client: &Client, yaml: &str) -> Result<(), String> {
    apply_manifest_with(client, yaml, false).await
}

/// The documents of a multi-document YAML stream, empty ones left out.
pub fn yaml_documents(yaml: &str) -> Result<Vec<serde_json::Value>, String> {
    use serde::Deserialize;
    let mut documents = Vec::new();
    for document in serde_yaml::Deserializer::from_str(yaml) {
        let document = serde_json::Value::deserialize(document).map_err(|e| e.to_string())?;
        if !document.is_null() {
            documents.push(document);
        }
    }
    Ok(documents)
}

/// [`apply_manifest`], optionally as a server-side dry run (validated and admitted, not stored).
pub async fn apply_manifest_with(client: &Client, yaml: &str, dry_run: bool) -> Result<(), String> {
    let discovery = kube::Discovery::new(client.clone())
        .run()
        .await
        .map_err(|e| e.to_string())?;
    for object in yaml_documents(yaml)? {
        let object: kube::api::DynamicObject =
            serde_json::from_value(object).map_err(|e| e.to_string())?;
        let types = object
            .types
            .clone()
            .ok_or("a manifest document without apiVersion/kind")?;
        let gvk = kube::api::GroupVersionKind::try_from(&types).map_err(|e| e.to_string())?;
        let (resource, capabilities) = discovery
            .resolve_gvk(&gvk)
            .ok_or_else(|| format!("{gvk:?} is not served"))?;
        let name = object
            .metadata
            .name
            .clone()
            .ok_or("a manifest document without a name")?;
        let api: Api<kube::api::DynamicObject> =
            if capabilities.scope == kube::discovery::Scope::Namespaced {
                Api::namespaced_with(
                    client.clone(),
                    object.metadata.namespace.as_deref().unwrap_or("default"),
                    &resource,
                )
            } else {
                Api::all_with(client.clone(), &resource)
            };
        let mut params = PatchParams::apply("kbind-e2e").force();
        params.dry_run = dry_run;
        api.patch(&name, &params, &Patch::Apply(&object))
            .await
            .map_err(|e| format!("apply {} {name}: {e}", types.kind))?;
    }
    Ok(())
}

/// The `widgets.example.org` API used by sync tests and the demo: `spec.size` (integer) and a
/// status subresource, labelled exported.
pub fn widget_crd() -> CustomResourceDefinition {
    crd(
        "widgets",
        "example.org",
        "Widget",
        &[(kbind_shared::keys::EXPORTED_LABEL, kbind_shared::keys::TRUE)],
    )
}

/// The Widget API resource.
pub fn widget_resource() -> kube::api::ApiResource {
    kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("example.org", "v1", "Widget"),
        "widgets",
    )
}

/// A tiny stand-in for the provider's own controller: it sets each Widget's
/// `status.phase = "Ready"` and `status.observedSize = spec.size`, so status flowing back is
/// visible. Runs until the returned handle is aborted.
pub fn run_provider_widget_controller(provider: Client) -> tokio::task::JoinHandle<()> {
    use kube::runtime::{WatchStreamExt, watcher};
    tokio::spawn(async move {
        let api: Api<kube::api::DynamicObject> =
            Api::all_with(provider.clone(), &widget_resource());
        let mut events = std::pin::pin!(
            watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
        );
        while let Some(event) = futures::StreamExt::next(&mut events).await {
            let Ok(widget) = event else { continue };
            let size = widget.data["spec"]["size"].clone();
            let status = json!({ "phase": "Ready", "observedSize": size });
            if widget.data.get("status") == Some(&status)
                || widget.metadata.deletion_timestamp.is_some()
            {
                continue;
            }
            let namespace = widget.metadata.namespace.clone().unwrap_or_default();
            let name = widget.metadata.name.clone().unwrap_or_default();
            let api: Api<kube::api::DynamicObject> =
                Api::namespaced_with(provider.clone(), &namespace, &widget_resource());
            let _ = api
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({ "status": status })),
                )
                .await;
        }
    })
}

/// Waits until a binding's condition `type_` has `status` (and `reason`, if given).
pub async fn wait_binding_condition<B>(
    api: &Api<B>,
    name: &str,
    type_: &str,
    status: &str,
    reason: Option<&str>,
) -> Result<B, String>
where
    B: kbind_shared::resolve::BindingObject,
{
    eventually(
        &format!("{name} {type_}={status} {}", reason.unwrap_or("")),
        Duration::from_secs(30),
        || async {
            let binding = api.get(name).await.map_err(|e| e.to_string())?;
            let conds = binding
                .binding_status()
                .map(|s| s.conditions.clone())
                .unwrap_or_default();
            let Some(c) = conditions::find(&conds, type_) else {
                return Err(format!("no {type_} condition yet"));
            };
            if c.status == status && reason.is_none_or(|r| c.reason == r) {
                Ok(Some(binding))
            } else {
                Err(format!(
                    "{type_} is {} ({}): {}",
                    c.status, c.reason, c.message
                ))
            }
        },
    )
    .await
}

/// Waits until the ClusterBinding `name` is Ready.
pub async fn wait_cluster_binding_ready(consumer: &Client, name: &str) {
    wait_binding_condition(
        &Api::<kbind_shared::api::ClusterBinding>::all(consumer.clone()),
        name,
        "Ready",
        "True",
        None,
    )
    .await
    .expect("the ClusterBinding becomes Ready");
}

/// Merges `spec` into the Connection `name`.
pub async fn patch_connection(consumer: &Client, name: &str, spec: serde_json::Value) {
    Api::<Connection>::all(consumer.clone())
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": spec })),
        )
        .await
        .expect("the Connection patch applies");
}

/// Creates the Widget `namespace/name` on the consumer and waits for its provider copy.
pub async fn create_widget_and_wait_upstream(
    consumer: &Client,
    provider: &Client,
    namespace: &str,
    name: &str,
    size: i64,
) {
    widgets(consumer, namespace)
        .create(&PostParams::default(), &widget(name, size))
        .await
        .expect("the Widget is created");
    crate::wait::wait_for(
        &format!("Widget {namespace}/{name} upstream"),
        30,
        || async {
            widgets(provider, namespace)
                .get_opt(name)
                .await
                .map_err(|e| e.to_string())
        },
    )
    .await;
}

/// Secret → Connection → Ready: connects the consumer to the cluster whose `kubeconfig` is given,
/// as Connection `name` (CRD schema source) over the Secret `kbind/<name>`.
pub async fn connect_to(consumer: &Client, name: &str, kubeconfig: &str) {
    put_secret(consumer, name, "kubeconfig", kubeconfig.as_bytes())
        .await
        .expect("the Secret applies");
    create_connection(consumer, &connection(name, name, SchemaSource::Crd))
        .await
        .expect("the Connection is created");
    wait_condition(consumer, name, "Ready", "True", None)
        .await
        .expect("the Connection becomes Ready");
}

/// Deletes the Connection `name` and waits until it is gone.
pub async fn delete_connection(consumer: &Client, name: &str) {
    let api = Api::<Connection>::all(consumer.clone());
    api.delete(name, &Default::default())
        .await
        .expect("the Connection deletion is accepted");
    crate::wait::wait_gone(&api, name, "the Connection to go", 60).await;
}

/// Sets a consumer Widget's `spec.size` and waits until its provider copy has it.
pub async fn resize_and_wait_upstream(
    consumer: &Api<kube::api::DynamicObject>,
    provider: &Api<kube::api::DynamicObject>,
    name: &str,
    size: i64,
) {
    consumer
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "size": size } })),
        )
        .await
        .expect("the Widget patch applies");
    crate::wait::wait_for(&format!("size {size} of {name} upstream"), 30, || async {
        let copy = provider.get(name).await.map_err(|e| e.to_string())?;
        Ok((copy.data["spec"]["size"] == size).then_some(()))
    })
    .await;
}

/// Waits until the consumer Widget `name` carries the conflict annotation `reason` (`None`: none).
pub async fn wait_conflict(
    consumer: &Api<kube::api::DynamicObject>,
    name: &str,
    reason: Option<&str>,
) {
    crate::wait::wait_for(&format!("{name}: conflict {reason:?}"), 30, || async {
        let w = consumer.get(name).await.map_err(|e| e.to_string())?;
        let current = w
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("core.kbind.io/conflict"))
            .map(String::as_str);
        Ok((current == reason).then_some(()))
    })
    .await;
}

/// Widgets in a namespace.
pub fn widgets(client: &Client, namespace: &str) -> Api<kube::api::DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &widget_resource())
}

/// A Widget with `spec.size`.
pub fn widget(name: &str, size: i64) -> kube::api::DynamicObject {
    serde_json::from_value(json!({ "apiVersion": "example.org/v1", "kind": "Widget", "metadata": { "name": name }, "spec": { "size": size } }))
        .expect("a valid Widget")
}

/// The file a user applies on the consumer: the provider kubeconfig Secret, a Connection
/// (`provider`, CRD source) and a ClusterBinding (`widgets`), as documents 0, 1, 2 in `order`.
pub fn one_file(kubeconfig: &str, order: &[usize]) -> String {
    let documents = [
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: provider-kubeconfig\n  namespace: kbind\nstringData:\n  kubeconfig: |\n{}",
            kubeconfig.lines().map(|l| format!("    {l}\n")).collect::<String>()
        ),
        "apiVersion: core.kbind.io/v1alpha1\nkind: Connection\nmetadata:\n  name: provider\nspec:\n  kubeconfigSecretRef:\n    namespace: kbind\n    name: provider-kubeconfig\n  schema:\n    source: CRD\n".to_owned(),
        "apiVersion: core.kbind.io/v1alpha1\nkind: ClusterBinding\nmetadata:\n  name: widgets\nspec:\n  connectionRef:\n    name: provider\n  apis:\n  - name: widgets.example.org\n".to_owned(),
    ];
    order
        .iter()
        .map(|i| documents[*i].clone())
        .collect::<Vec<_>>()
        .join("---\n")
}

/// Two clusters with Widgets exported by the provider (and its stand-in controller), kbind's
/// programs running on the consumer, and [`one_file`] applied.
pub struct SyncEnv {
    /// The environment.
    pub env: TestEnv,
    /// Consumer admin client.
    pub consumer: Client,
    /// Provider admin client.
    pub provider: Client,
    /// The syncer.
    pub syncer: Program,
    _provider_controller: tokio::task::JoinHandle<()>,
}

impl SyncEnv {
    /// Starts it; `kubeconfig` is the provider credential in the Secret (default: the admin's).
    pub async fn start(test: &str, order: &[usize], kubeconfig: Option<String>) -> Self {
        Self::start_with(test, order, kubeconfig, &[]).await
    }

    /// [`SyncEnv::start`] with more clusters, which kbind is not told about.
    pub async fn start_with(
        test: &str,
        order: &[usize],
        kubeconfig: Option<String>,
        extra_clusters: &[&str],
    ) -> Self {
        Self::start_full(test, order, kubeconfig, extra_clusters, &[]).await
    }

    /// [`SyncEnv::start_with`], with more flags for the schema manager.
    pub async fn start_full(
        test: &str,
        order: &[usize],
        kubeconfig: Option<String>,
        extra_clusters: &[&str],
        manager_args: &[&str],
    ) -> Self {
        let mut names = vec!["consumer", "provider"];
        names.extend_from_slice(extra_clusters);
        let mut env = TestEnv::start(test, &names).await.expect("clusters start");
        let consumer = env
            .cluster("consumer")
            .admin_client()
            .await
            .expect("consumer client");
        let provider = env
            .cluster("provider")
            .admin_client()
            .await
            .expect("provider client");
        crate::kbind::install_crds(&consumer)
            .await
            .expect("kbind CRDs");
        install_crd(&provider, &widget_crd())
            .await
            .expect("widgets CRD");
        let mut args = vec!["--leader-elect=false"];
        args.extend_from_slice(manager_args);
        start_schema_manager(&mut env, "consumer", "schema-manager", &args)
            .await
            .expect("schema manager");
        let syncer = start_syncer(&mut env, "consumer", "syncer-0", &[])
            .await
            .expect("syncer");
        ensure_namespace(&consumer, SECRET_NAMESPACE)
            .await
            .expect("kbind namespace");
        let kubeconfig = kubeconfig.unwrap_or_else(|| env.cluster("provider").admin_kubeconfig());
        apply_manifest(&consumer, &one_file(&kubeconfig, order))
            .await
            .expect("the one file applies");
        let provider_controller = run_provider_widget_controller(provider.clone());
        Self {
            env,
            consumer,
            provider,
            syncer,
            _provider_controller: provider_controller,
        }
    }
}

/// An RBAC rule: `verbs` on `resources` of `group`.
pub fn rule(
    group: &str,
    resources: &[&str],
    verbs: &[&str],
) -> k8s_openapi::api::rbac::v1::PolicyRule {
    k8s_openapi::api::rbac::v1::PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(resources.iter().map(|r| (*r).into()).collect()),
        verbs: verbs.iter().map(|v| (*v).into()).collect(),
        ..Default::default()
    }
}

/// A binding spec for `connection` listing `apis`.
pub fn binding_spec(connection: &str, apis: &[&str]) -> kbind_shared::api::BindingSpec {
    kbind_shared::api::BindingSpec::new(connection, apis)
}

/// `"<reason>: <message>"` of every Warning Event about `object` (by name) in `namespace` (all
/// namespaces when `None`); empty when Events cannot be listed.
pub async fn warning_events(client: &Client, namespace: Option<&str>, object: &str) -> Vec<String> {
    let events: Api<k8s_openapi::api::core::v1::Event> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    events
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            e.involved_object.name.as_deref() == Some(object)
                && e.type_.as_deref() == Some("Warning")
        })
        .map(|e| {
            format!(
                "{}: {}",
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default()
            )
        })
        .collect()
}

/// What a provider credential needs for the Connection: identity, CRD discovery, heartbeat.
pub fn connection_rules() -> Vec<k8s_openapi::api::rbac::v1::PolicyRule> {
    vec![
        rule("core.kcp.io", &["logicalclusters"], &["get"]),
        rule("", &["namespaces"], &["get", "create"]),
        rule(
            "apiextensions.k8s.io",
            &["customresourcedefinitions"],
            &["get", "list", "watch"],
        ),
        rule(
            "coordination.k8s.io",
            &["leases"],
            &["get", "create", "update", "patch"],
        ),
    ]
}

/// [`connection_rules`] and Widgets (read-only when `widgets_writable` is false); no Secrets.
pub fn provider_rules(widgets_writable: bool) -> Vec<k8s_openapi::api::rbac::v1::PolicyRule> {
    let widget_verbs: &[&str] = if widgets_writable {
        &[
            "get", "list", "watch", "create", "update", "patch", "delete",
        ]
    } else {
        &["get", "list", "watch"]
    };
    let mut rules = connection_rules();
    rules.push(rule("example.org", &["widgets"], widget_verbs));
    rules
}
