//! `kubectl kbind migrate rollback plan|apply` (#53.4): handing a consumer back to the Go
//! konnector, told truly. The Go konnector shares kbind's kinds, markers, finalizers and field
//! managers, but not its fences: it serves every namespace (`spec.access.bindingNamespaces`),
//! sends Secrets to the provider (`spec.access.secretsToProvider`), lets Bindings adopt
//! (`spec.access.bindingsMayAdopt`), syncs paused objects and suspended bindings, and knows no
//! routes — an object routed to another Connection would reach a second provider, and a route
//! finalizer would never be removed. `plan` lists each; `apply` refuses while objects are routed,
//! stops kbind (its pods gone), strips the route finalizers the Go konnector would strand, and
//! starts the Go konnector found stopped. Decisions are pure functions; reads and writes at the
//! edge.

use kbind_shared::api::{Binding, ClusterBinding, ConflictPolicy, Connection, RelatedDirection};
use kbind_shared::keys;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use serde_json::json;

use crate::migrate::{self, Konnector};
use crate::view::{self, cell};

/// Objects listed per request.
const PAGE: u32 = 500;

/// What `rollback plan` found, and what `apply` did.
#[derive(Debug, Serialize)]
pub struct Report {
    /// kbind's own workloads (schema manager, syncer).
    pub kbind: Vec<Konnector>,
    /// The Go konnector's workloads.
    pub konnectors: Vec<Konnector>,
    /// What loses its fence under the Go konnector.
    pub fences: Vec<String>,
    /// Objects routed to another Connection than their CRD's (`api ns/name → connection`).
    pub routed: Vec<String>,
    /// Route finalizers on objects no route holds (`api ns/name finalizer`): stripped by `apply`.
    pub stranded: Vec<String>,
    pub steps: Vec<String>,
    pub done: Vec<String>,
}

/// Whether a container image or command is one of kbind's consumer programs.
pub fn is_kbind(image: &str, command: &[String]) -> bool {
    let program = |word: &str| {
        let last = word.rsplit('/').next().unwrap_or(word);
        let repository = last.split(['@', ':']).next().unwrap_or(last);
        repository == "kbind-syncer" || repository == "kbind-schema-manager"
    };
    program(image) || command.first().is_some_and(|c| program(c))
}

/// What the Go konnector would do that kbind's Connections forbid, in words.
pub fn fences(
    connections: &[Connection],
    cluster_bindings: &[ClusterBinding],
    bindings: &[Binding],
) -> Vec<String> {
    let mut out = Vec::new();
    for connection in connections {
        let name = connection.name_any();
        let access = &connection.spec.access;
        let uses = |spec: &kbind_shared::api::BindingSpec| spec.connection_ref.name == name;
        if let Some(allowed) = &access.binding_namespaces {
            let outside: std::collections::BTreeSet<String> = bindings
                .iter()
                .filter(|b| uses(&b.spec))
                .filter_map(|b| b.namespace())
                .filter(|ns| !allowed.contains(ns))
                .collect();
            if !outside.is_empty() {
                out.push(format!(
                    "Connection {name} serves Bindings only in {}: the Go konnector serves every namespace — the Bindings in {} start syncing",
                    cell(&allowed.join(", ")),
                    cell(&outside.into_iter().collect::<Vec<_>>().join(", "))
                ));
            }
        }
        let secrets_out = |spec: &kbind_shared::api::BindingSpec| {
            spec.related_resources.iter().any(|r| {
                r.direction == RelatedDirection::FromConsumer
                    && r.resource == kbind_shared::api::RelatedResourceKind::Secrets
            })
        };
        if !access.secrets_to_provider {
            let sending: Vec<String> = cluster_bindings
                .iter()
                .filter(|b| uses(&b.spec.binding) && secrets_out(&b.spec.binding))
                .map(|b| format!("ClusterBinding {}", b.name_any()))
                .chain(
                    bindings
                        .iter()
                        .filter(|b| uses(&b.spec) && secrets_out(&b.spec))
                        .map(|b| {
                            format!(
                                "Binding {}/{}",
                                b.namespace().unwrap_or_default(),
                                b.name_any()
                            )
                        }),
                )
                .collect();
            if !sending.is_empty() {
                out.push(format!(
                    "Connection {name} sends no Secrets to the provider: the Go konnector sends those {} select (FromConsumer)",
                    cell(&sending.join(", "))
                ));
            }
        }
        if !access.bindings_may_adopt {
            let adopting: Vec<String> = bindings
                .iter()
                .filter(|b| uses(&b.spec) && b.spec.conflict_policy == ConflictPolicy::Adopt)
                .map(|b| format!("{}/{}", b.namespace().unwrap_or_default(), b.name_any()))
                .collect();
            if !adopting.is_empty() {
                out.push(format!(
                    "Connection {name} lets no Binding adopt: the Go konnector lets Bindings {} take over provider objects kbind did not create",
                    cell(&adopting.join(", "))
                ));
            }
        }
    }
    let suspended: Vec<String> = cluster_bindings
        .iter()
        .filter(|b| b.spec.binding.suspend)
        .map(|b| format!("ClusterBinding {}", b.name_any()))
        .chain(bindings.iter().filter(|b| b.spec.suspend).map(|b| {
            format!(
                "Binding {}/{}",
                b.namespace().unwrap_or_default(),
                b.name_any()
            )
        }))
        .collect();
    if !suspended.is_empty() {
        out.push(format!(
            "suspended: {} — the Go konnector syncs them",
            cell(&suspended.join(", "))
        ));
    }
    out
}

/// One consumer object's routing, from its CRD's serving Connection, its route pin and its
/// finalizers: whether it is routed to another Connection, and the route finalizers no route
/// holds.
pub fn routing(
    serving: &str,
    route: Option<&str>,
    finalizers: &[String],
) -> (Option<String>, Vec<String>) {
    let routed_to = route
        .and_then(|r| r.split('/').next())
        .filter(|c| !c.is_empty() && *c != serving)
        .map(str::to_owned);
    let route_finalizers = finalizers
        .iter()
        .filter(|f| f.starts_with(keys::ROUTE_FINALIZER_PREFIX));
    let stranded = match &routed_to {
        // A routed object's route finalizer holds its copy there: not stranded (and refused).
        Some(_) => Vec::new(),
        None => route_finalizers.cloned().collect(),
    };
    (routed_to, stranded)
}

/// The steps, in order.
pub fn steps(report: &Report) -> Vec<String> {
    let mut steps = Vec::new();
    if !report.routed.is_empty() {
        steps.push(format!(
            "move the {} routed object(s) back to their CRD's Connection (remove the route pin or the route Binding) and let kbind drain their route copies: the Go konnector knows no routes and would send them to a second provider — apply refuses until then",
            report.routed.len()
        ));
    }
    for k in report.kbind.iter().filter(|k| k.running()) {
        steps.push(format!(
            "scale {} {}/{} to 0 and wait until its {} pod(s) are gone (apply)",
            k.kind, k.namespace, k.name, k.pods
        ));
    }
    if !report.stranded.is_empty() {
        steps.push(format!(
            "strip {} route finalizer(s) no route holds — the Go konnector never removes them, so those objects could not be deleted (apply)",
            report.stranded.len()
        ));
    }
    let stopped: Vec<&Konnector> = report.konnectors.iter().filter(|k| k.stopped).collect();
    if stopped.is_empty() && report.konnectors.is_empty() {
        steps.push("install the Go konnector (its chart, with its CRD installation off: kbind's core CRDs stay, kept by helm.sh/resource-policy: keep, and are a superset of its own)".into());
    }
    for k in stopped {
        steps.push(match k.kind.as_str() {
            "DaemonSet" => format!(
                "start DaemonSet {}/{} again (remove the node selector {}) (apply)",
                k.namespace,
                k.name,
                migrate::STOPPED_LABEL
            ),
            kind => format!("scale {kind} {}/{} to 1 (apply)", k.namespace, k.name),
        });
    }
    steps.push("kbind's extra fields (delivery records, its annotations) stay and the Go konnector ignores them; coming back to kbind is `kubectl kbind migrate plan|apply` again".into());
    steps
}

/// Reads what a rollback involves. Only GETs and LISTs.
pub async fn gather(consumer: &Client) -> Result<Report, String> {
    let kbind = migrate::running(consumer, |c| {
        is_kbind(
            c.image.as_deref().unwrap_or_default(),
            c.command.as_deref().unwrap_or_default(),
        )
    })
    .await?;
    let konnectors = migrate::running(consumer, |c| {
        c.image.as_deref().is_some_and(migrate::is_go_konnector)
            || migrate::runs_go_konnector(
                c.command.as_deref().unwrap_or_default(),
                c.args.as_deref().unwrap_or_default(),
            )
    })
    .await?;
    let connections =
        migrate::list_all(&Api::<Connection>::all(consumer.clone()), "Connections").await?;
    let cluster_bindings = migrate::list_all(
        &Api::<ClusterBinding>::all(consumer.clone()),
        "ClusterBindings",
    )
    .await?;
    let bindings = migrate::list_all(&Api::<Binding>::all(consumer.clone()), "Bindings").await?;
    let mut fences = fences(&connections, &cluster_bindings, &bindings);
    let (mut routed, mut stranded, mut paused) = (Vec::new(), Vec::new(), 0usize);
    let crds = migrate::list_all(
        &Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(consumer.clone()),
        "CustomResourceDefinitions",
    )
    .await?;
    for crd in crds
        .iter()
        .filter(|c| c.labels().get(keys::MANAGED_LABEL).map(String::as_str) == Some(keys::TRUE))
    {
        let Some(serving) = crd.annotations().get(keys::CONNECTION_ANNOTATION).cloned() else {
            continue;
        };
        let Some(resource) = kbind_shared::dynamic::instance_resource(crd) else {
            continue;
        };
        let api: Api<DynamicObject> = Api::all_with(consumer.clone(), &resource);
        let mut params = ListParams::default().limit(PAGE);
        loop {
            let page = api
                .list_metadata(&params)
                .await
                .map_err(|e| view::read_error(&crd.name_any(), &e))?;
            for o in &page.items {
                let key = format!(
                    "{} {}{}",
                    crd.name_any(),
                    o.namespace().map(|n| format!("{n}/")).unwrap_or_default(),
                    o.name_any()
                );
                let (to, left) = routing(
                    &serving,
                    o.annotations()
                        .get(keys::ROUTE_ANNOTATION)
                        .map(String::as_str),
                    o.finalizers(),
                );
                if let Some(to) = to {
                    routed.push(cell(&format!("{key} → {to}")));
                }
                stranded.extend(left.into_iter().map(|f| cell(&format!("{key} {f}"))));
                if o.annotations()
                    .get(keys::PAUSED_ANNOTATION)
                    .map(String::as_str)
                    == Some(keys::TRUE)
                {
                    paused += 1;
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = ListParams::default().limit(PAGE).continue_token(&token),
                None => break,
            }
        }
    }
    if paused > 0 {
        fences.push(format!(
            "{paused} paused object(s) ({}=true): the Go konnector syncs them",
            keys::PAUSED_ANNOTATION
        ));
    }
    let mut report = Report {
        kbind,
        konnectors,
        fences,
        routed,
        stranded,
        steps: Vec::new(),
        done: Vec::new(),
    };
    report.steps = steps(&report);
    Ok(report)
}

/// Carries out the rollback: refused while objects are routed; kbind stopped (its pods gone),
/// stranded route finalizers stripped, the Go konnector started again.
pub async fn apply(consumer: &Client) -> Result<Report, String> {
    let before = gather(consumer).await?;
    if let Some(first) = before.routed.first() {
        return Err(format!(
            "refused: {} object(s) are routed to another Connection (first: {first}); the Go konnector knows no routes — move them back first; nothing was changed",
            before.routed.len()
        ));
    }
    let params = PatchParams {
        field_manager: Some("kubectl-kbind".into()),
        ..Default::default()
    };
    let mut done = Vec::new();
    for k in before.kbind.iter().filter(|k| k.running()) {
        migrate::workload(consumer, k)
            .patch(
                &k.name,
                &params,
                &Patch::Merge(json!({ "spec": { "replicas": 0 } })),
            )
            .await
            .map_err(|e| format!("stop {} {}/{}: {e}", k.kind, k.namespace, k.name))?;
        migrate::wait_pods_gone(consumer, k).await?;
        done.push(format!(
            "scaled {} {}/{} to 0; its pods are gone",
            k.kind, k.namespace, k.name
        ));
    }
    // kbind is stopped now: nothing adds a route finalizer again. Read afresh.
    let crds = migrate::list_all(
        &Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(consumer.clone()),
        "CustomResourceDefinitions",
    )
    .await?;
    let mut stripped = 0;
    for crd in crds
        .iter()
        .filter(|c| c.labels().get(keys::MANAGED_LABEL).map(String::as_str) == Some(keys::TRUE))
    {
        let (Some(serving), Some(resource)) = (
            crd.annotations().get(keys::CONNECTION_ANNOTATION).cloned(),
            kbind_shared::dynamic::instance_resource(crd),
        ) else {
            continue;
        };
        for object in migrate::list_all(
            &Api::<DynamicObject>::all_with(consumer.clone(), &resource),
            &crd.name_any(),
        )
        .await?
        {
            let (to, left) = routing(
                &serving,
                object
                    .annotations()
                    .get(keys::ROUTE_ANNOTATION)
                    .map(String::as_str),
                object.finalizers(),
            );
            if to.is_some() {
                return Err(format!(
                    "refused: {} {} became routed meanwhile; {}",
                    crd.name_any(),
                    object.name_any(),
                    done.join("; ")
                ));
            }
            let api =
                kbind_shared::dynamic::scoped(consumer, object.namespace().as_deref(), &resource);
            for finalizer in left {
                kbind_shared::finalizers::set(&api, &object, &finalizer, false)
                    .await
                    .map_err(|e| format!("strip {finalizer} from {}: {e}", object.name_any()))?;
                stripped += 1;
            }
        }
    }
    if stripped > 0 {
        done.push(format!(
            "stripped {stripped} route finalizer(s) no route holds"
        ));
    }
    for k in before.konnectors.iter().filter(|k| k.stopped) {
        let patch = match k.kind.as_str() {
            "DaemonSet" => json!({ "spec": { "template": { "spec": { "nodeSelector": {
                migrate::STOPPED_LABEL: null } } } } }),
            _ => json!({ "spec": { "replicas": 1 } }),
        };
        migrate::workload(consumer, k)
            .patch(&k.name, &params, &Patch::Merge(patch))
            .await
            .map_err(|e| format!("start {} {}/{}: {e}", k.kind, k.namespace, k.name))?;
        done.push(format!(
            "started {} {}/{} again",
            k.kind, k.namespace, k.name
        ));
    }
    let mut after = gather(consumer).await?;
    after.done = done;
    Ok(after)
}

/// The report as text.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    out.push_str(&migrate::workloads_table("kbind", &report.kbind));
    out.push_str(&migrate::workloads_table(
        "Go konnector",
        &report.konnectors,
    ));
    for (title, lines) in [
        (
            "What loses its fence under the Go konnector",
            &report.fences,
        ),
        (
            "Routed objects (the Go konnector knows no routes)",
            &report.routed,
        ),
        ("Route finalizers no route holds", &report.stranded),
        ("Done", &report.done),
    ] {
        if !lines.is_empty() {
            out.push_str(&format!("{title}:\n"));
            for line in lines.iter().take(20) {
                out.push_str(&format!("  - {line}\n"));
            }
            if lines.len() > 20 {
                out.push_str(&format!("  … and {} more\n", lines.len() - 20));
            }
        }
    }
    out.push_str(&view::steps(&report.steps));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kbinds_programs_are_known_by_image_or_command() {
        for (image, command, want) in [
            ("ghcr.io/kbind-dev/kbind-syncer:0.1.0", vec![], true),
            (
                "registry.local/x/kbind-schema-manager@sha256:ab",
                vec![],
                true,
            ),
            (
                "registry.local/x/renamed:1",
                vec!["/kbind-syncer".to_owned()],
                true,
            ),
            ("ghcr.io/kbind-dev/konnector:v0.4.0", vec![], false),
            ("ghcr.io/kbind-dev/kbind-reaper:0.1.0", vec![], false),
        ] {
            assert_eq!(is_kbind(image, &command), want, "{image} {command:?}");
        }
    }

    #[test]
    fn a_routed_object_is_refused_and_only_unheld_route_finalizers_are_stranded() {
        let route = format!("{}second", keys::ROUTE_FINALIZER_PREFIX);
        let fins = vec![keys::SYNCER_FINALIZER.to_owned(), route.clone()];
        assert_eq!(
            routing("provider", Some("second/uid-2"), &fins),
            (Some("second".into()), vec![])
        );
        assert_eq!(
            routing("provider", None, &fins),
            (None, vec![route.clone()])
        );
        // Pinned to its own CRD's Connection: not routed.
        assert_eq!(
            routing("provider", Some("provider/uid-1"), &fins),
            (None, vec![route])
        );
        assert_eq!(
            routing("provider", None, &[keys::SYNCER_FINALIZER.to_owned()]),
            (None, vec![])
        );
    }

    #[test]
    fn every_fence_the_go_konnector_drops_is_named() {
        let connection: Connection = serde_json::from_value(json!({
            "apiVersion": "core.kbind.io/v1alpha1", "kind": "Connection",
            "metadata": { "name": "provider" },
            "spec": { "kubeconfigSecretRef": { "namespace": "kbind", "name": "k" },
                      "access": { "bindingNamespaces": ["team-a"] } } }))
        .unwrap();
        let binding = |ns: &str, name: &str, extra: serde_json::Value| -> Binding {
            let mut spec = json!({ "connectionRef": { "name": "provider" },
                                   "apis": [{ "name": "widgets.example.org" }] });
            for (k, v) in extra.as_object().unwrap() {
                spec[k] = v.clone();
            }
            serde_json::from_value(json!({
                "apiVersion": "core.kbind.io/v1alpha1", "kind": "Binding",
                "metadata": { "name": name, "namespace": ns }, "spec": spec }))
            .unwrap()
        };
        let bindings = vec![
            binding("team-a", "ok", json!({})),
            binding("team-b", "outside", json!({ "conflictPolicy": "Adopt" })),
            binding(
                "team-a",
                "secrets",
                json!({ "suspend": true, "relatedResources": [
                { "resource": "secrets", "direction": "FromConsumer",
                  "selector": { "names": ["s"] } }] }),
            ),
        ];
        let found = fences(std::slice::from_ref(&connection), &[], &bindings);
        assert_eq!(found.len(), 4, "{found:#?}");
        assert!(
            found[0].contains("the Bindings in team-b start syncing"),
            "{}",
            found[0]
        );
        assert!(
            found[1].contains("sends those Binding team-a/secrets select"),
            "{}",
            found[1]
        );
        assert!(
            found[2].contains("lets Bindings team-b/outside take over"),
            "{}",
            found[2]
        );
        assert!(
            found[3].starts_with("suspended: Binding team-a/secrets"),
            "{}",
            found[3]
        );
        let open: Connection = serde_json::from_value(json!({
            "apiVersion": "core.kbind.io/v1alpha1", "kind": "Connection",
            "metadata": { "name": "provider" },
            "spec": { "kubeconfigSecretRef": { "namespace": "kbind", "name": "k" },
                      "access": { "secretsToProvider": true, "bindingsMayAdopt": true } } }))
        .unwrap();
        assert_eq!(fences(&[open], &[], &bindings[..2]), Vec::<String>::new());
    }
}
