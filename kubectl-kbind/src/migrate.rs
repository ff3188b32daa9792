//! `kubectl kbind migrate plan|apply` (#37): replacing a running Go konnector with kbind.
//!
//! `plan` only reads the consumer: the Go konnector's Deployments (by image or command), how kbind will
//! treat each CRD the konnector pulled (its schema hash form, whether kbind created it), who owns
//! kbind's core CRDs in Helm, and the steps in order. `apply` carries out the kbind-side steps:
//! the Go Deployments scaled to 0 and their pods waited for, the core CRDs kept and handed to
//! kbind's Helm release (so `helm install` adopts them and no `helm uninstall` of the Go release
//! deletes them), and — only when asked — `core.kbind.io/created-by` stamped on the pulled CRDs.
//! The decisions are pure functions below; the rest is reads and those writes.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_shared::api::{Connection, UpdatePolicy};
use kbind_shared::keys;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use serde_json::json;

use crate::view::{self, cell};

/// kbind's core CRDs (what its chart installs).
pub const CORE_CRDS: [&str; 3] = [
    "connections.core.kbind.io",
    "clusterbindings.core.kbind.io",
    "bindings.core.kbind.io",
];
const HELM_RELEASE_NAME: &str = "meta.helm.sh/release-name";
const HELM_RELEASE_NAMESPACE: &str = "meta.helm.sh/release-namespace";
const HELM_KEEP: &str = "helm.sh/resource-policy";
const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// How long `apply` waits for the Go konnector's pods to be gone.
const POD_WAIT: Duration = Duration::from_secs(180);
/// The most objects of a kind read (Deployments, CRDs, Connections).
const MAX_LIST: u32 = 500;

/// Where kbind is (to be) installed.
#[derive(Debug, Clone, Serialize)]
pub struct Release {
    pub name: String,
    pub namespace: String,
}

/// What `plan` found, and what `apply` did.
#[derive(Debug, Serialize)]
pub struct Report {
    pub konnectors: Vec<Konnector>,
    pub apis: Vec<PulledCrd>,
    pub core_crds: Vec<CoreCrd>,
    pub related: RelatedCopies,
    /// The Go konnector's heartbeat Lease on each Connection's provider, and what becomes of it.
    pub go_leases: Vec<crate::handover::GoLeaseRow>,
    /// The Go konnector's field manager's writes of the last minutes, on both clusters, newest
    /// first: evidence that it runs, here or elsewhere.
    pub go_writes: Vec<crate::handover::GoWrite>,
    /// What kbind does differently from the Go konnector with the state found.
    pub differences: Vec<String>,
    pub steps: Vec<String>,
    pub done: Vec<String>,
}

/// A workload running the Go konnector.
#[derive(Debug, Clone, Serialize)]
pub struct Konnector {
    /// `Deployment`, `StatefulSet` or `DaemonSet`.
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub image: String,
    pub replicas: i32,
    pub pods: usize,
    /// Stopped: no replicas, or a DaemonSet with the node selector `apply` sets.
    pub stopped: bool,
    /// The pod label selector (`k=v,…`).
    #[serde(skip)]
    pub selector: String,
    /// When stopped: the last write to its spec (no earlier than the stop).
    #[serde(skip)]
    pub stopped_at: Option<jiff::Timestamp>,
}

impl Konnector {
    /// Whether it runs, or may run (a DaemonSet not stopped schedules a pod on every node that
    /// comes), or its pods are still there.
    pub fn running(&self) -> bool {
        !self.stopped || self.pods > 0
    }
}

/// A consumer CRD pulled for a Connection.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PulledCrd {
    pub name: String,
    pub connection: String,
    pub hash: HashForm,
    /// What kbind will write to it.
    pub rewrite: String,
    pub created_by_kbind: bool,
}

/// The form of a CRD's `core.kbind.io/schema-hash`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub enum HashForm {
    /// `sha256:` and 16 hex digits: the Go konnector's.
    Go,
    /// `sha256:` and 64 hex digits: kbind's.
    Kbind,
    /// None, or neither form.
    Other,
}

/// One of kbind's core CRDs and its Helm ownership.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CoreCrd {
    pub name: String,
    pub present: bool,
    pub release: Option<String>,
    pub release_namespace: Option<String>,
    pub kept: bool,
    /// Fields kbind writes that the installed schema drops (the Go konnector's CRDs lack
    /// `status.verifiedCredential`): nothing syncs until kbind's CRDs are installed (#53.6).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lacks: Vec<String>,
}

/// The related copies (Secrets, ConfigMaps) on this cluster.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct RelatedCopies {
    pub copies: usize,
    /// Those without kbind's per-entry record (`core.kbind.io/related-entries`): written by the
    /// Go konnector.
    pub without_record: usize,
}

/// Whether a container image is the Go konnector's: its repository's last segment is
/// `konnector`, `konnector-<variant>` or `kbind-konnector` (never one of kbind's programs).
pub fn is_go_konnector(image: &str) -> bool {
    let without_digest = image.split('@').next().unwrap_or(image);
    let last = without_digest.rsplit('/').next().unwrap_or(without_digest);
    let repository = last.split(':').next().unwrap_or(last);
    repository == "konnector"
        || repository.starts_with("konnector-")
        || repository == "kbind-konnector"
}

/// Whether a container runs the Go konnector's binary (`konnector` or `kbind-konnector`, by any
/// path) by its `command` and `args` — for images renamed in a private registry: the program, or
/// behind a wrapper (a shell's `-c` script, `tini`, `dumb-init`, `env`, `exec`) the first word
/// that is neither a wrapper nor a flag.
pub fn runs_go_konnector(command: &[String], args: &[String]) -> bool {
    const WRAPPERS: [&str; 8] = [
        "sh",
        "bash",
        "ash",
        "dash",
        "tini",
        "dumb-init",
        "env",
        "exec",
    ];
    let name = |word: &str| word.rsplit('/').next().unwrap_or(word).to_owned();
    command
        .iter()
        .chain(args)
        .flat_map(|s| s.split_whitespace())
        .filter(|w| !w.starts_with('-'))
        .map(name)
        .find(|w| !WRAPPERS.contains(&w.as_str()))
        .is_some_and(|program| program == "konnector" || program == "kbind-konnector")
}

/// The form of a schema hash annotation.
pub fn hash_form(hash: Option<&str>) -> HashForm {
    let Some(hex) = hash.and_then(|h| h.strip_prefix("sha256:")) else {
        return HashForm::Other;
    };
    let is_hex = hex
        .chars()
        .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase());
    match (hex.len(), is_hex) {
        (16, true) => HashForm::Go,
        (64, true) => HashForm::Kbind,
        _ => HashForm::Other,
    }
}

/// What kbind writes to a pulled CRD when it takes over, by its hash form and the Connection's
/// update policy.
pub fn rewrite(hash: HashForm, policy: UpdatePolicy) -> &'static str {
    match (hash, policy) {
        (HashForm::Kbind, _) => "none",
        (_, UpdatePolicy::Always) => "once: kbind's schema hash (updatePolicy Always)",
        (_, UpdatePolicy::Once) => "none (updatePolicy Once)",
    }
}

/// What kbind does differently from the Go konnector with the state found — each a read, at
/// most one write on this cluster, none on the provider.
pub fn differences(apis: &[PulledCrd], related: RelatedCopies) -> Vec<String> {
    let mut out = Vec::new();
    for form in [HashForm::Go, HashForm::Other] {
        let (once, kept) =
            apis.iter()
                .filter(|a| a.hash == form)
                .fold((0, 0), |(once, kept), a| {
                    if a.rewrite.starts_with("once") {
                        (once + 1, kept)
                    } else {
                        (once, kept + 1)
                    }
                });
        if once + kept > 0 {
            let what = match form {
                HashForm::Go => "the Go konnector's schema hash (sha256: + 16 hex)",
                _ => "no schema hash kbind recognises",
            };
            out.push(format!(
                "{} pulled CRD(s) carry {what}: {once} rewritten once with kbind's 64-hex hash (updatePolicy Always), {kept} left as they are (updatePolicy Once)",
                once + kept
            ));
        }
    }
    let unstamped = apis.iter().filter(|a| !a.created_by_kbind).count();
    if unstamped > 0 {
        out.push(format!(
            "{unstamped} pulled CRD(s) lack core.kbind.io/created-by: kbind serves them but never deletes them unless stamped (apply --stamp-created-by)"
        ));
    }
    if related.without_record > 0 {
        out.push(format!(
            "{} of {} related copies here lack kbind's per-entry record (core.kbind.io/related-entries): kbind takes each as current and writes it only when its source changes",
            related.without_record, related.copies
        ));
    }
    out.push(
        "provider namespaces: the Go syncer marks the consumer UID as a label, its related path as an annotation; kbind reads both forms and rewrites neither".into(),
    );
    out.push(
        "finalizers (core.kbind.io/syncer, core.kbind.io/cleanup), field managers (kbind-konnector, kbind-konnector-related) and the heartbeat Lease name are the same: adopted without a write".into(),
    );
    out
}

/// The steps, in order, for what was found.
pub fn steps(
    konnectors: &[Konnector],
    core: &[CoreCrd],
    apis: &[PulledCrd],
    release: &Release,
) -> Vec<String> {
    let mut steps = Vec::new();
    for k in konnectors.iter().filter(|k| k.running()) {
        let stop = match k.kind.as_str() {
            "DaemonSet" => format!(
                "stop DaemonSet {}/{} (a node selector no node matches)",
                k.namespace, k.name
            ),
            kind => format!("scale {kind} {}/{} to 0", k.namespace, k.name),
        };
        steps.push(format!(
            "{stop} and wait until its {} pod(s) are gone — the Go konnector may hold no Lease to fence on — then until its field manager ({}) has written nothing on either cluster for --quiet-for (apply)",
            k.pods,
            crate::handover::GO_MANAGER
        ));
    }
    let foreign: Vec<&CoreCrd> = core
        .iter()
        .filter(|c| c.present && (!c.kept || c.release.as_deref() != Some(release.name.as_str())))
        .collect();
    if !foreign.is_empty() {
        let owners: Vec<String> = foreign
            .iter()
            .filter_map(|c| c.release.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let warning = if owners.is_empty() {
            String::new()
        } else {
            format!(
                "; never `helm uninstall` {} before this — it would delete every Connection and binding",
                owners.join(", ")
            )
        };
        steps.push(format!(
            "keep the core CRDs and hand them to release {} in {} (helm.sh/resource-policy=keep and Helm's ownership annotations){warning} (apply)",
            release.name, release.namespace
        ));
    }
    let lacking: Vec<String> = core
        .iter()
        .filter(|c| !c.lacks.is_empty())
        .map(|c| format!("{} lacks {}", c.name, c.lacks.join(", ")))
        .collect();
    let lacking = if lacking.is_empty() {
        String::new()
    } else {
        format!(
            "; the core CRDs installed are not kbind's ({}) — keep the chart's CRD installation on (or kubectl apply -f deploy/crds/): with them every Connection stays Ready=False/CoreSchemaOutdated and nothing syncs",
            lacking.join("; ")
        )
    };
    steps.push(format!(
        "install kbind: helm upgrade --install {} deploy/charts/kbind -n {} — it adopts the core CRDs and then every Connection, binding, copy and heartbeat Lease as they are{lacking}",
        release.name, release.namespace
    ));
    let rewrites = apis
        .iter()
        .filter(|a| a.rewrite.starts_with("once"))
        .count();
    if rewrites > 0 {
        steps.push(format!(
            "kbind then rewrites {rewrites} pulled CRD(s) once on this cluster (the schema hash in kbind's form); nothing on the provider"
        ));
    }
    let unstamped = apis.iter().filter(|a| !a.created_by_kbind).count();
    if unstamped > 0 {
        steps.push(format!(
            "optional: `apply --stamp-created-by` records kbind as the creator of {unstamped} CRD(s) the Go konnector pulled, so kbind deletes them when their last binding goes, as it does CRDs it created; without it they stay"
        ));
    }
    steps
}

/// The patch that keeps a core CRD and hands it to `release`.
pub fn adoption_patch(release: &Release) -> serde_json::Value {
    json!({ "metadata": {
        "labels": { MANAGED_BY: "Helm" },
        "annotations": {
            HELM_KEEP: "keep",
            HELM_RELEASE_NAME: release.name,
            HELM_RELEASE_NAMESPACE: release.namespace,
        },
    } })
}

/// A workload that may run the Go konnector, as `gather` reads it.
struct Workload {
    kind: &'static str,
    namespace: String,
    name: String,
    template: Option<k8s_openapi::api::core::v1::PodSpec>,
    selector: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    /// Desired replicas (a DaemonSet: its scheduled pods).
    replicas: i32,
    stopped: bool,
    /// The last write to its spec or metadata.
    changed: Option<jiff::Timestamp>,
}

/// Every Deployment, StatefulSet and DaemonSet of the cluster, read page by page (a large cluster
/// hides no konnector behind a first page).
async fn workloads(consumer: &Client) -> Result<Vec<Workload>, String> {
    use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
    let mut all = Vec::new();
    for d in list_all(&Api::<Deployment>::all(consumer.clone()), "Deployments").await? {
        let spec = d.spec.clone().unwrap_or_default();
        all.push(Workload {
            kind: "Deployment",
            namespace: d.namespace().unwrap_or_default(),
            name: d.name_any(),
            template: spec.template.spec,
            selector: spec.selector,
            replicas: spec.replicas.unwrap_or(1),
            stopped: spec.replicas == Some(0),
            changed: crate::handover::last_spec_write(d.metadata.managed_fields.as_deref()),
        });
    }
    for s in list_all(&Api::<StatefulSet>::all(consumer.clone()), "StatefulSets").await? {
        let spec = s.spec.clone().unwrap_or_default();
        all.push(Workload {
            kind: "StatefulSet",
            namespace: s.namespace().unwrap_or_default(),
            name: s.name_any(),
            template: spec.template.spec,
            selector: spec.selector,
            replicas: spec.replicas.unwrap_or(1),
            stopped: spec.replicas == Some(0),
            changed: crate::handover::last_spec_write(s.metadata.managed_fields.as_deref()),
        });
    }
    for d in list_all(&Api::<DaemonSet>::all(consumer.clone()), "DaemonSets").await? {
        let spec = d.spec.clone().unwrap_or_default();
        let stopped = spec
            .template
            .spec
            .as_ref()
            .and_then(|p| p.node_selector.as_ref())
            .is_some_and(|n| n.contains_key(STOPPED_LABEL));
        all.push(Workload {
            kind: "DaemonSet",
            namespace: d.namespace().unwrap_or_default(),
            name: d.name_any(),
            template: spec.template.spec,
            selector: spec.selector,
            changed: crate::handover::last_spec_write(d.metadata.managed_fields.as_deref()),
            replicas: d.status.map_or(0, |s| s.desired_number_scheduled),
            stopped,
        });
    }
    Ok(all)
}

/// Every object `api` lists, [`MAX_LIST`] a page.
pub(crate) async fn list_all<K>(api: &Api<K>, what: &str) -> Result<Vec<K>, String>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    list_selected(api, &ListParams::default(), what).await
}

/// Every object `api` lists with `selected`'s selectors, [`MAX_LIST`] a page.
async fn list_selected<K>(api: &Api<K>, selected: &ListParams, what: &str) -> Result<Vec<K>, String>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut items = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut params = selected.clone().limit(MAX_LIST);
        if let Some(token) = &token {
            params = params.continue_token(token);
        }
        let page = api
            .list(&params)
            .await
            .map_err(|e| view::read_error(what, &e))?;
        items.extend(page.items);
        match page.metadata.continue_ {
            Some(next) if !next.is_empty() => token = Some(next),
            _ => return Ok(items),
        }
    }
}

/// The API of the workload `k` (a Deployment, StatefulSet or DaemonSet) in its namespace.
pub(crate) fn workload(consumer: &Client, k: &Konnector) -> Api<kube::api::DynamicObject> {
    let resource = kube::api::ApiResource {
        group: "apps".into(),
        version: "v1".into(),
        api_version: "apps/v1".into(),
        kind: k.kind.clone(),
        plural: format!("{}s", k.kind.to_lowercase()),
    };
    Api::namespaced_with(consumer.clone(), &k.namespace, &resource)
}

/// The patch that stops a `kind` running the Go konnector: no replicas — or, for a DaemonSet,
/// which has none, a node selector no node matches.
pub(crate) fn stop_patch(kind: &str) -> serde_json::Value {
    match kind {
        "DaemonSet" => json!({ "spec": { "template": { "spec": { "nodeSelector": {
            STOPPED_LABEL: "true" } } } } }),
        _ => json!({ "spec": { "replicas": 0 } }),
    }
}

/// The node label a stopped DaemonSet's pods would need (no node has it).
pub(crate) const STOPPED_LABEL: &str = "core.kbind.io/go-konnector-stopped-for-kbind";

/// The workloads (every Deployment, StatefulSet and DaemonSet) with a container `runs`, and their
/// pods.
pub(crate) async fn running(
    consumer: &Client,
    runs: impl Fn(&k8s_openapi::api::core::v1::Container) -> bool,
) -> Result<Vec<Konnector>, String> {
    let mut found = Vec::new();
    for workload in workloads(consumer).await? {
        let Some(image) = workload
            .template
            .iter()
            .flat_map(|p| &p.containers)
            .find(|c| runs(c))
            .map(|c| c.image.clone().unwrap_or_default())
        else {
            continue;
        };
        let selector: String = workload
            .selector
            .match_labels
            .unwrap_or_default()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let pods = if selector.is_empty() {
            0
        } else {
            Api::<Pod>::namespaced(consumer.clone(), &workload.namespace)
                .list(&ListParams::default().labels(&selector).limit(MAX_LIST))
                .await
                .map_err(|e| view::read_error("Pods", &e))?
                .items
                .len()
        };
        found.push(Konnector {
            kind: workload.kind.to_owned(),
            namespace: workload.namespace,
            name: workload.name,
            image: cell(&image),
            replicas: workload.replicas,
            stopped: workload.stopped,
            stopped_at: workload.changed.filter(|_| workload.stopped),
            pods,
            selector,
        });
    }
    Ok(found)
}

/// Reads what the migration needs from the consumer. Only GETs and LISTs.
pub async fn gather(
    consumer: &Client,
    release: &Release,
    transport: kbind_shared::kubeconfig::Transport,
) -> Result<Report, String> {
    let konnectors = running(consumer, |c| {
        c.image.as_deref().is_some_and(is_go_konnector)
            || runs_go_konnector(
                c.command.as_deref().unwrap_or_default(),
                c.args.as_deref().unwrap_or_default(),
            )
    })
    .await?;
    let connections = list_all(&Api::<Connection>::all(consumer.clone()), "Connections").await?;
    let policies: BTreeMap<String, UpdatePolicy> = connections
        .iter()
        .map(|c| (c.name_any(), c.spec.schema.update_policy))
        .collect();
    let crds: Api<CustomResourceDefinition> = Api::all(consumer.clone());
    let pulled = list_selected(
        &crds,
        &ListParams::default().labels(&format!("{}={}", keys::MANAGED_LABEL, keys::TRUE)),
        "CustomResourceDefinitions",
    )
    .await?;
    let apis = pulled
        .iter()
        .filter_map(|crd| {
            let annotations = crd.annotations();
            let connection = annotations.get(keys::CONNECTION_ANNOTATION)?.clone();
            let hash = hash_form(
                annotations
                    .get(keys::SCHEMA_HASH_ANNOTATION)
                    .map(String::as_str),
            );
            let policy = policies.get(&connection).copied().unwrap_or_default();
            Some(PulledCrd {
                name: crd.name_any(),
                created_by_kbind: annotations.get(keys::CREATED_BY_ANNOTATION) == Some(&connection),
                connection: cell(&connection),
                hash,
                rewrite: rewrite(hash, policy).to_owned(),
            })
        })
        .collect::<Vec<_>>();
    let mut core_crds = Vec::new();
    for name in CORE_CRDS {
        let crd = crds
            .get_opt(name)
            .await
            .map_err(|e| view::read_error(&format!("CRD {name}"), &e))?;
        let annotation = |key: &str| {
            crd.as_ref()
                .and_then(|c| c.annotations().get(key).cloned())
                .map(|v| cell(&v))
        };
        let expected = kbind_shared::api::crds()
            .into_iter()
            .map(|(_, c)| c)
            .find(|c| c.metadata.name.as_deref() == Some(name));
        let lacks = match (expected, crd.as_ref()) {
            (Some(expected), Some(installed)) => {
                match kbind_shared::api::installed::lack(&expected, Some(installed)) {
                    Some(kbind_shared::api::installed::Lack::Fields(fields)) => fields,
                    Some(kbind_shared::api::installed::Lack::Version(version)) => {
                        vec![format!("version {version}")]
                    }
                    _ => Vec::new(),
                }
            }
            _ => Vec::new(),
        };
        core_crds.push(CoreCrd {
            lacks,
            name: name.to_owned(),
            present: crd.is_some(),
            release: annotation(HELM_RELEASE_NAME),
            release_namespace: annotation(HELM_RELEASE_NAMESPACE),
            kept: annotation(HELM_KEEP).as_deref() == Some("keep"),
        });
    }
    let related = related_copies(consumer).await?;
    let mut steps = steps(&konnectors, &core_crds, &apis, release);
    let now = jiff::Timestamp::now();
    let pulled_by_connection: Vec<CustomResourceDefinition> = pulled
        .into_iter()
        .filter(|crd| crd.annotations().contains_key(keys::CONNECTION_ANNOTATION))
        .collect();
    let mut go_writes =
        crate::handover::consumer_writes(consumer, &connections, &pulled_by_connection, now)
            .await?;
    let (go_leases, provider_writes) =
        crate::handover::leases(consumer, &connections, transport, now).await;
    go_writes.extend(provider_writes);
    let go_writes = crate::handover::after(&go_writes, jiff::Timestamp::UNIX_EPOCH);
    let quiet = kbind_shared::cli::parse_duration(crate::handover::DEFAULT_QUIET)?;
    let evidence = crate::handover::after(
        &go_writes,
        crate::handover::evidence_since(now, quiet, stopped_at(&konnectors)),
    );
    if let Some(step) =
        crate::handover::elsewhere(konnectors.iter().any(Konnector::running), &evidence)
    {
        steps.insert(0, step);
    }
    Ok(Report {
        go_leases,
        go_writes,
        differences: differences(&apis, related),
        konnectors,
        apis,
        core_crds,
        related,
        steps,
        done: Vec::new(),
    })
}

/// How `apply` runs.
pub struct ApplyOptions {
    /// Also stamp `core.kbind.io/created-by` on the pulled CRDs.
    pub stamp_created_by: bool,
    /// How long the Go konnector's field manager must have been silent.
    pub quiet_for: Duration,
    pub transport: kbind_shared::kubeconfig::Transport,
}

/// When the Go konnectors stopped here were stopped.
fn stopped_at(konnectors: &[Konnector]) -> Vec<jiff::Timestamp> {
    konnectors.iter().filter_map(|k| k.stopped_at).collect()
}

/// Carries out the kbind-side steps of `plan`, then reads again. Refuses, handing nothing over,
/// while the Go konnector's field manager writes on either cluster: when no Go konnector runs
/// here, any write of the last `quiet_for`; after stopping those that run here, any write once
/// their pods are gone (waited for `quiet_for`).
pub async fn apply(
    consumer: &Client,
    release: &Release,
    options: &ApplyOptions,
) -> Result<Report, String> {
    let quiet = format!("{}s", options.quiet_for.as_secs());
    let before = gather(consumer, release, options.transport).await?;
    if !before.konnectors.iter().any(Konnector::running) {
        let since = crate::handover::evidence_since(
            jiff::Timestamp::now(),
            options.quiet_for,
            stopped_at(&before.konnectors),
        );
        if let Some(why) =
            crate::handover::refusal(&crate::handover::after(&before.go_writes, since), &quiet)
        {
            return Err(why);
        }
    }
    let mut done = Vec::new();
    let params = PatchParams {
        field_manager: Some("kubectl-kbind".into()),
        ..Default::default()
    };
    for k in before.konnectors.iter().filter(|k| k.running()) {
        workload(consumer, k)
            .patch(&k.name, &params, &Patch::Merge(stop_patch(&k.kind)))
            .await
            .map_err(|e| format!("stop {} {}/{}: {e}", k.kind, k.namespace, k.name))?;
        wait_pods_gone(consumer, k).await?;
        done.push(match k.kind.as_str() {
            "DaemonSet" => format!(
                "stopped DaemonSet {}/{} (node selector {STOPPED_LABEL}=true, which no node has); its pods are gone",
                k.namespace, k.name
            ),
            kind => format!(
                "scaled {kind} {}/{} to 0; its pods are gone",
                k.namespace, k.name
            ),
        });
    }
    if !done.is_empty() {
        // The pods of the Go konnectors found here are gone: from now on, a write of its field
        // manager comes from another one.
        let gone = jiff::Timestamp::now();
        tokio::time::sleep(options.quiet_for).await;
        let since = gather(consumer, release, options.transport).await?;
        let evidence = crate::handover::evidence_since(
            jiff::Timestamp::now(),
            options.quiet_for,
            stopped_at(&since.konnectors).into_iter().chain([gone]),
        );
        if let Some(why) =
            crate::handover::refusal(&crate::handover::after(&since.go_writes, evidence), &quiet)
        {
            return Err(format!("{}; {why}", done.join("; ")));
        }
    }
    let crds: Api<CustomResourceDefinition> = Api::all(consumer.clone());
    for core in before.core_crds.iter().filter(|c| c.present) {
        crds.patch(&core.name, &params, &Patch::Merge(adoption_patch(release)))
            .await
            .map_err(|e| format!("keep CRD {}: {e}", core.name))?;
        done.push(format!(
            "CRD {} kept (helm.sh/resource-policy=keep) and handed to release {} in {}",
            core.name, release.name, release.namespace
        ));
    }
    if options.stamp_created_by {
        for api in before.apis.iter().filter(|a| !a.created_by_kbind) {
            let patch = json!({ "metadata": { "annotations": { keys::CREATED_BY_ANNOTATION: api.connection } } });
            crds.patch(&api.name, &params, &Patch::Merge(patch))
                .await
                .map_err(|e| format!("stamp CRD {}: {e}", api.name))?;
            done.push(format!(
                "CRD {} stamped created-by {}",
                api.name, api.connection
            ));
        }
    }
    let mut after = gather(consumer, release, options.transport).await?;
    after.done = done;
    Ok(after)
}

/// Counts the related copies (managed Secrets and ConfigMaps with a related-binding) on the
/// consumer, by their metadata only.
async fn related_copies(consumer: &Client) -> Result<RelatedCopies, String> {
    let managed = ListParams::default()
        .labels(&format!("{}={}", keys::MANAGED_LABEL, keys::TRUE))
        .limit(MAX_LIST);
    let mut annotations = Vec::new();
    for (what, api) in [
        (
            "Secrets",
            Api::<kube::api::DynamicObject>::all_with(
                consumer.clone(),
                &kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Secret>(&()),
            ),
        ),
        (
            "ConfigMaps",
            Api::<kube::api::DynamicObject>::all_with(
                consumer.clone(),
                &kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
            ),
        ),
    ] {
        let mut params = managed.clone();
        loop {
            let page = api
                .list_metadata(&params)
                .await
                .map_err(|e| view::read_error(what, &e))?;
            annotations.extend(
                page.items
                    .into_iter()
                    .map(|o| o.metadata.annotations.unwrap_or_default()),
            );
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = managed.clone().continue_token(&token),
                None => break,
            }
        }
    }
    let copies: Vec<_> = annotations
        .iter()
        .filter(|a| a.contains_key(keys::RELATED_BINDING_ANNOTATION))
        .collect();
    Ok(RelatedCopies {
        copies: copies.len(),
        without_record: copies
            .iter()
            .filter(|a| !a.contains_key(keys::RELATED_ENTRIES_ANNOTATION))
            .count(),
    })
}

pub(crate) async fn wait_pods_gone(consumer: &Client, k: &Konnector) -> Result<(), String> {
    if k.selector.is_empty() {
        return Ok(());
    }
    let pods: Api<Pod> = Api::namespaced(consumer.clone(), &k.namespace);
    let deadline = tokio::time::Instant::now() + POD_WAIT;
    loop {
        let left = pods
            .list(&ListParams::default().labels(&k.selector).limit(MAX_LIST))
            .await
            .map_err(|e| view::read_error("Pods", &e))?
            .items
            .len();
        if left == 0 {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "{left} pod(s) of {} {}/{} are still there after {}s; the other program must not start while it runs",
                k.kind,
                k.namespace,
                k.name,
                POD_WAIT.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Workloads under `title` (nothing when there are none), and a blank line.
pub(crate) fn workloads_table(title: &str, rows: &[Konnector]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|k| {
            vec![
                format!("{} {}/{}", k.kind, cell(&k.namespace), cell(&k.name)),
                k.image.clone(),
                k.replicas.to_string(),
                k.pods.to_string(),
            ]
        })
        .collect();
    format!(
        "{title}:\n{}\n",
        view::table(&["WORKLOAD", "IMAGE", "REPLICAS", "PODS"], &rows)
    )
}

/// The report as text.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    if report.konnectors.is_empty() {
        out.push_str(
            "No Go konnector found on this cluster (Deployments, StatefulSets and DaemonSets read, by image, command and args).\n\n",
        );
    } else {
        out.push_str(&workloads_table("Go konnector", &report.konnectors));
    }
    if !report.apis.is_empty() {
        let rows: Vec<Vec<String>> = report
            .apis
            .iter()
            .map(|a| {
                vec![
                    cell(&a.name),
                    a.connection.clone(),
                    format!("{:?}", a.hash),
                    a.rewrite.clone(),
                    if a.created_by_kbind { "yes" } else { "no" }.into(),
                ]
            })
            .collect();
        out.push_str("Pulled CRDs:\n");
        out.push_str(&view::table(
            &[
                "CRD",
                "CONNECTION",
                "HASH",
                "KBIND WRITES",
                "CREATED-BY KBIND",
            ],
            &rows,
        ));
        out.push('\n');
    }
    let rows: Vec<Vec<String>> = report
        .core_crds
        .iter()
        .map(|c| {
            vec![
                c.name.clone(),
                if c.present { "yes" } else { "no" }.into(),
                c.release.clone().unwrap_or_else(|| "-".into()),
                if c.kept { "yes" } else { "no" }.into(),
            ]
        })
        .collect();
    out.push_str("Core CRDs:\n");
    out.push_str(&view::table(
        &["CRD", "PRESENT", "HELM RELEASE", "KEPT"],
        &rows,
    ));
    if !report.go_leases.is_empty() {
        let rows: Vec<Vec<String>> = report
            .go_leases
            .iter()
            .map(|l| {
                vec![
                    l.connection.clone(),
                    l.lease.clone(),
                    l.found.clone(),
                    view::maybe_age(l.renewed_secs_ago),
                    l.fate.clone(),
                ]
            })
            .collect();
        out.push_str("\nThe Go konnector's heartbeat Lease on each provider:\n");
        out.push_str(&view::table(
            &[
                "CONNECTION",
                "LEASE",
                "FOUND",
                "RENEWED",
                "WHAT BECOMES OF IT",
            ],
            &rows,
        ));
    }
    if !report.go_writes.is_empty() {
        let rows: Vec<Vec<String>> = report
            .go_writes
            .iter()
            .map(|w| vec![w.cluster.clone(), w.object.clone(), view::age(w.secs_ago)])
            .collect();
        out.push_str(&format!(
            "\nWritten by the Go konnector's field manager ({}) in the last minutes:\n",
            crate::handover::GO_MANAGER
        ));
        out.push_str(&view::table(&["CLUSTER", "OBJECT", "AGO"], &rows));
    }
    if !report.differences.is_empty() {
        out.push_str("\nWhat kbind does differently:\n");
        for d in &report.differences {
            out.push_str(&format!("  - {d}\n"));
        }
    }
    if !report.done.is_empty() {
        out.push_str("\nDone:\n");
        for d in &report.done {
            out.push_str(&format!("  - {d}\n"));
        }
    }
    out.push('\n');
    out.push_str(&view::steps(&report.steps));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_go_konnector_is_known_by_its_image_or_command() {
        for (image, want) in [
            ("ghcr.io/kbind-dev/konnector:v0.4.0", true),
            ("ghcr.io/kbind-dev/konnector-v2:v2.0.0", true),
            ("registry.local:5000/team/konnector@sha256:abc", true),
            ("kbind-konnector:latest", true),
            ("ghcr.io/kbind-dev/kbind-syncer:0.1.0", false),
            ("ghcr.io/kbind-dev/kbind-schema-manager:0.1.0", false),
            ("ghcr.io/someone/konnectors-exporter:1", false),
        ] {
            assert_eq!(is_go_konnector(image), want, "{image}");
        }
        let words = |c: &[&str]| c.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        for (command, args, want) in [
            (
                words(&["/konnector", "--leader-elect=false"]),
                words(&[]),
                true,
            ),
            (words(&["/usr/local/bin/kbind-konnector"]), words(&[]), true),
            (words(&["konnector"]), words(&[]), true),
            (words(&["/kbind-syncer"]), words(&[]), false),
            // Behind a shell or an init wrapper, or given as args to the image's entrypoint.
            (
                words(&["/bin/sh", "-c", "exec /konnector --v=2"]),
                words(&[]),
                true,
            ),
            (words(&["/bin/sh", "-c"]), words(&["konnector"]), true),
            (
                words(&["/sbin/tini", "--"]),
                words(&["/usr/bin/konnector"]),
                true,
            ),
            (words(&[]), words(&["/konnector", "--kubeconfig=/k"]), true),
            (
                words(&["/bin/sh", "-c", "/kbind-syncer --konnector"]),
                words(&[]),
                false,
            ),
            (words(&[]), words(&["--konnector-mode"]), false),
            (words(&[]), words(&[]), false),
        ] {
            assert_eq!(
                runs_go_konnector(&command, &args),
                want,
                "{command:?} {args:?}"
            );
        }
    }

    #[tokio::test]
    async fn every_page_of_a_list_is_read() {
        // #53.3: a cluster with more workloads than one page hides no konnector after the first.
        // The API server is mocked at the HTTP layer: three pages linked by continue tokens.
        let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = requests.clone();
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let query = request.uri().query().unwrap_or_default().to_owned();
            seen.lock().unwrap().push(query.clone());
            async move {
                let (names, next) = if query.contains("continue=p3") {
                    (vec!["konnector"], "")
                } else if query.contains("continue=p2") {
                    (vec!["c", "d"], "p3")
                } else {
                    (vec!["a", "b"], "p2")
                };
                let items: Vec<_> = names
                    .iter()
                    .map(|n| {
                        json!({ "apiVersion": "apps/v1", "kind": "Deployment",
                        "metadata": { "name": n, "namespace": "x" } })
                    })
                    .collect();
                let body = json!({ "apiVersion": "apps/v1", "kind": "DeploymentList",
                    "metadata": { "resourceVersion": "7", "continue": next }, "items": items });
                Ok::<_, std::convert::Infallible>(http::Response::new(kube::client::Body::from(
                    serde_json::to_vec(&body).unwrap(),
                )))
            }
        });
        let client = Client::new(service, "default");
        let listed = list_all(&Api::<Deployment>::all(client), "Deployments")
            .await
            .unwrap();
        let names: Vec<String> = listed.iter().map(|d| d.name_any()).collect();
        assert_eq!(names, ["a", "b", "c", "d", "konnector"]);
        let requests = requests.lock().unwrap().clone();
        assert_eq!(requests.len(), 3, "{requests:?}");
        assert!(
            requests
                .iter()
                .all(|q| q.contains(&format!("limit={MAX_LIST}"))),
            "{requests:?}"
        );
    }

    #[test]
    fn schema_hashes_are_told_apart_and_the_rewrite_follows_the_policy() {
        let go = "sha256:0123456789abcdef";
        let kbind = format!("sha256:{}", "a".repeat(64));
        for (hash, form) in [
            (Some(go), HashForm::Go),
            (Some(kbind.as_str()), HashForm::Kbind),
            (Some("sha256:0123456789ABCDEF"), HashForm::Other),
            (Some("md5:0123456789abcdef"), HashForm::Other),
            (None, HashForm::Other),
        ] {
            assert_eq!(hash_form(hash), form, "{hash:?}");
        }
        assert!(rewrite(HashForm::Go, UpdatePolicy::Always).starts_with("once"));
        assert_eq!(
            rewrite(HashForm::Go, UpdatePolicy::Once),
            "none (updatePolicy Once)"
        );
        assert_eq!(rewrite(HashForm::Kbind, UpdatePolicy::Always), "none");
    }

    #[test]
    fn the_differences_count_what_kbind_rewrites_and_what_it_takes_as_it_is() {
        let pulled = |name: &str, hash: HashForm, policy: UpdatePolicy, stamped: bool| PulledCrd {
            name: name.into(),
            connection: "p".into(),
            hash,
            rewrite: rewrite(hash, policy).into(),
            created_by_kbind: stamped,
        };
        let apis = [
            pulled("a", HashForm::Go, UpdatePolicy::Always, false),
            pulled("b", HashForm::Go, UpdatePolicy::Once, false),
            pulled("c", HashForm::Kbind, UpdatePolicy::Always, true),
        ];
        let found = differences(
            &apis,
            RelatedCopies {
                copies: 3,
                without_record: 2,
            },
        );
        assert!(
            found[0].starts_with("2 pulled CRD(s) carry the Go konnector's schema hash")
                && found[0].contains(": 1 rewritten once")
                && found[0].contains(", 1 left as they are"),
            "{found:#?}"
        );
        assert!(found[1].starts_with("2 pulled CRD(s) lack core.kbind.io/created-by"));
        assert!(found[2].starts_with("2 of 3 related copies here lack"));
        assert_eq!(found.len(), 5, "{found:#?}");
        // Nothing Go-shaped: only the two fixed facts.
        let none = differences(&apis[2..], RelatedCopies::default());
        assert_eq!(none.len(), 2, "{none:#?}");
    }

    #[test]
    fn the_steps_come_in_order_and_only_as_needed() {
        let release = Release {
            name: "kbind".into(),
            namespace: "kbind-system".into(),
        };
        let konnector = Konnector {
            kind: "Deployment".into(),
            namespace: "kbind".into(),
            name: "konnector".into(),
            image: "ghcr.io/kbind-dev/konnector:v0.4.0".into(),
            replicas: 1,
            pods: 1,
            stopped: false,
            selector: "app=konnector".into(),
            stopped_at: None,
        };
        let go_owned = CoreCrd {
            name: CORE_CRDS[0].into(),
            present: true,
            release: Some("konnector".into()),
            release_namespace: Some("kbind".into()),
            kept: false,
            lacks: vec!["status.verifiedCredential".into()],
        };
        let pulled = PulledCrd {
            name: "widgets.example.org".into(),
            connection: "provider".into(),
            hash: HashForm::Go,
            rewrite: rewrite(HashForm::Go, UpdatePolicy::Always).into(),
            created_by_kbind: false,
        };
        let all = steps(
            std::slice::from_ref(&konnector),
            std::slice::from_ref(&go_owned),
            std::slice::from_ref(&pulled),
            &release,
        );
        assert_eq!(all.len(), 5, "{all:#?}");
        assert!(all[0].starts_with("scale Deployment kbind/konnector to 0"));
        assert!(
            all[1].contains("never `helm uninstall` konnector"),
            "{}",
            all[1]
        );
        assert!(all[2].starts_with("install kbind"));
        assert!(
            all[2].contains(&format!(
                "the core CRDs installed are not kbind's ({} lacks status.verifiedCredential)",
                CORE_CRDS[0]
            )),
            "{}",
            all[2]
        );
        assert!(all[3].contains("rewrites 1 pulled CRD"));
        assert!(all[4].starts_with("optional"));
        // After apply: scaled down, the CRDs kept by kbind's release, the hashes kbind's.
        let stopped = Konnector {
            replicas: 0,
            pods: 0,
            stopped: true,
            ..konnector
        };
        let kept = CoreCrd {
            release: Some("kbind".into()),
            kept: true,
            lacks: Vec::new(),
            ..go_owned
        };
        let current = PulledCrd {
            hash: HashForm::Kbind,
            rewrite: "none".into(),
            created_by_kbind: true,
            ..pulled
        };
        let left = steps(&[stopped], &[kept], &[current], &release);
        assert_eq!(left.len(), 1, "only the install: {left:#?}");
    }
}
