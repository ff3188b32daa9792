//! The Connection's view of the consumer CRDs: installing every export under pullPolicy All
//! (CONN-8), the CRDs kept after an automatic unbind, and `SchemaInSync` from its bindings.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_shared::api::{Connection, ConnectionStatus};
use kbind_shared::conditions::{self, Desired, types};
use kbind_shared::keys;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use crate::context::Context;
use crate::providers::Provider;

/// CONN-8: installs the schema of every exported API. A problem with one API does not stop the
/// others; each is returned (`<api>: <why>`).
pub(super) async fn install_all(
    ctx: &Context,
    provider: &Provider,
    connection: &Connection,
    status: &ConnectionStatus,
) -> Vec<String> {
    let consumer = &ctx.client;
    let name = connection.name_any();
    let update = connection.spec.schema.update_policy != kbind_shared::api::UpdatePolicy::Once;
    let mut problems = Vec::new();
    for export in &status.exported_apis {
        let desired = crate::schema::desired_for(
            provider,
            &ctx.documents,
            &name,
            status.active_schema_source,
            export,
        )
        .await;
        let result = match desired {
            Ok((desired, _)) => {
                let policy = crate::schema::Policy {
                    create: true,
                    update,
                    accepted: &connection.spec.schema.accepted_changes,
                };
                // A held breaking change is reported by the bindings of the API (pullPolicy All
                // installs unbound APIs too: theirs simply stay as they are).
                let cached = ctx.cached_crd(&export.name);
                match crate::schema::install(consumer, &desired, &name, policy, cached.as_deref())
                    .await
                {
                    Ok(crate::schema::Installed {
                        plan: crate::schema::Plan::Refuse(message),
                        ..
                    }) => Err(message),
                    // Only a binding drains the serving Connection and takes the CRD over.
                    Ok(crate::schema::Installed {
                        plan: crate::schema::Plan::Handover { from },
                        ..
                    }) => Err(format!(
                        "it serves Connection {from} and is annotated to be adopted by this one: bind the API to take it over (Connection {from}'s provider is drained first)"
                    )),
                    other => other.map(drop),
                }
            }
            Err(e) => Err(e.message().to_owned()),
        };
        if let Err(message) = result {
            problems.push(format!(
                "{}: {}",
                export.name,
                kbind_shared::conditions::bounded(&message, 300)
            ));
        }
    }
    problems
}

/// The CRDs kbind kept for this Connection after their automatic binding went away (metadata
/// only, kbind's managed CRDs only).
pub(super) async fn kept_crds(ctx: &Context, connection: &str) -> Result<Vec<String>, kube::Error> {
    // This term's watch of them, else a LIST.
    let crds: Vec<kube::api::ObjectMeta> = match ctx.managed_crds() {
        Some(crds) => crds.iter().map(|c| c.metadata.clone()).collect(),
        None => {
            let managed = format!("{}={}", keys::MANAGED_LABEL, keys::TRUE);
            Api::<kube::core::PartialObjectMeta<CustomResourceDefinition>>::all(ctx.client.clone())
                .list(&ListParams::default().labels(&managed))
                .await?
                .items
                .into_iter()
                .map(|c| c.metadata)
                .collect()
        }
    };
    let mut kept: Vec<String> = crds
        .iter()
        .filter(|c| {
            let annotations = c.annotations.as_ref();
            annotations
                .and_then(|a| a.get(keys::CONNECTION_ANNOTATION))
                .map(String::as_str)
                == Some(connection)
                && annotations.is_some_and(|a| a.contains_key(keys::UNBOUND_ANNOTATION))
        })
        .filter_map(|c| c.name.clone())
        .collect();
    kept.sort();
    Ok(kept)
}

/// LIM-13: the Connection's `SchemaInSync`, from the bindings that use it (each knows whether
/// the CRDs it installed match the provider).
pub(super) async fn schema_in_sync(
    ctx: &Context,
    connection: &str,
) -> Result<Desired<'static>, kube::Error> {
    let (cluster_bindings, bindings) = ctx.all_bindings().await?;
    let out_of_sync = |status: Option<&kbind_shared::api::BindingStatus>| {
        status
            .and_then(|s| conditions::find(&s.conditions, types::SCHEMA_IN_SYNC))
            .is_some_and(|c| c.status == "False")
    };
    let mut behind: Vec<String> = cluster_bindings
        .iter()
        .filter(|b| b.spec.connection_ref.name == connection && out_of_sync(b.status.as_ref()))
        .map(|b| format!("ClusterBinding {}", b.name_any()))
        .collect();
    behind.extend(
        bindings
            .iter()
            .filter(|b| b.spec.connection_ref.name == connection && out_of_sync(b.status.as_ref()))
            .map(|b| {
                format!(
                    "Binding {}/{}",
                    b.namespace().unwrap_or_default(),
                    b.name_any()
                )
            }),
    );
    let differ = "installed schemas differ from the provider's for ";
    Ok(Desired::schema_in_sync(differ, &behind))
}
