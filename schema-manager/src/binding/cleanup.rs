//! Deleting a binding (REFERENCE-BEHAVIOUR §14 BCL): every API it holds or lists is let go
//! ([`super::release`]), its related copies are deleted on both clusters, and the finalizer goes
//! once nothing is left.

use std::sync::Arc;

use kbind_shared::conditions::{Desired, types};
use kbind_shared::dynamic::scoped;
use kbind_shared::keys;
use kube::api::{ApiResource, DeleteParams, ListParams};
use kube::runtime::controller::Action;
use kube::{Client, ResourceExt};

use super::kinds::{Error, Scoped};
use super::ledger::{self, Left, Step};
use super::outcome;
use super::release::{Mode, Others, holder, release_api};
use super::status::write_status;
use crate::context::Context;

/// The binding is being deleted: let go of everything it holds or lists, delete its related
/// copies, and finish once nothing is left (BCL).
pub async fn cleanup<B: Scoped>(binding: Arc<B>, ctx: &Context) -> Result<Action, Error> {
    let spec = binding.binding_spec();
    let held = ledger::held(binding.binding_status(), spec);
    let others = Others::list(&ctx.client).await?;
    let (mut waiting, mut unreachable) = (0, Vec::new());
    for step in ledger::steps(&held, spec, true) {
        let Step::Release(held) = step else { continue };
        match release_api(binding.as_ref(), &held, Mode::Unbind, None, ctx, &others).await? {
            Left::Nothing => {}
            Left::Draining(n) => waiting += n,
            // An unbind waits for an unreachable provider while its Connection exists (#53.1).
            Left::Unreachable(message) => unreachable.push(message),
        }
    }
    // BCL-4, for every kind and side (not only the declared entries: an entry removed while no
    // syncer ran may have left copies): delete this binding's related copies. Sources are never
    // touched (REL-7). Deleting is immediate; the next pass confirms none came back.
    let connection = holder(ctx, &spec.connection_ref.name).await?;
    // Related copies on the provider (FromConsumer entries) are owed like object copies while the
    // Connection exists and its provider cannot be reached (#53.1).
    let owes_related = connection.exists
        && !super::release::keeps_copies(binding.meta())
        && spec
            .related_resources
            .iter()
            .any(|r| r.direction == kbind_shared::api::RelatedDirection::FromConsumer);
    let owed = |why: &str| {
        format!(
            "the related copies on the provider are owed: cannot reach the provider of Connection {} to delete them ({}); they are deleted when it answers",
            spec.connection_ref.name,
            kbind_shared::conditions::bounded(why, 300)
        )
    };
    if let Err(why) = &connection.provider
        && owes_related
    {
        unreachable.push(owed(why));
    }
    let exists = connection.exists;
    let provider = connection.provider.ok();
    let uid = binding.meta().uid.clone().unwrap_or_default();
    let scope = binding.covered_namespace();
    let related = match delete_related_copies(
        &ctx.client,
        true,
        provider
            .as_ref()
            .map(|p| (&p.client, &connection.namespaces)),
        scope.as_deref(),
        &uid,
    )
    .await
    {
        Ok(found) => found,
        // The provider stopped answering: the consumer's side now, the provider's when it answers.
        Err(Error::Provider { action, source })
            if exists && super::release::unreachable(&source) =>
        {
            if owes_related {
                unreachable.push(owed(&format!(
                    "{action}: {}",
                    kbind_shared::identity::describe_error(&source)
                )));
            }
            delete_related_copies(&ctx.client, true, None, scope.as_deref(), &uid).await?
        }
        Err(e) => return Err(e),
    };
    if let Some(message) = outcome::unbind_wait(waiting, related, &unreachable) {
        let desired = vec![Desired::new(
            types::READY,
            false,
            outcome::DRAINING_OBJECTS,
            message.clone(),
        )];
        write_status(binding.as_ref(), ctx, desired, None, None).await?;
        return Err(Error::Draining(message));
    }
    let namespace = binding.namespace().unwrap_or_default();
    // A Binding with related resources leaving may let another of its namespace in.
    if !namespace.is_empty() && !spec.related_resources.is_empty() {
        ctx.related_left(&namespace);
    }
    let _ = ctx
        .metrics
        .binding_ready
        .remove_label_values(&[namespace.as_str(), &binding.name_any()]);
    Ok(Action::await_change())
}

/// BCL-4: deletes the Secrets and ConfigMaps this binding copied (labelled managed, annotated with
/// its UID) on both clusters in its scope — on the consumer when `on_consumer`, on the provider
/// when its client (and how the Connection names namespaces there) is given. Returns how many it
/// found. Without a provider client only the consumer side is cleaned (best effort, like the
/// reference).
pub(super) async fn delete_related_copies(
    consumer: &Client,
    on_consumer: bool,
    provider: Option<(&Client, &kbind_shared::boundary::NamespaceMap)>,
    namespace: Option<&str>,
    binding_uid: &str,
) -> Result<usize, Error> {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let mut found = 0;
    let selector = format!("{}={}", keys::MANAGED_LABEL, keys::TRUE);
    let mut sides = Vec::new();
    if on_consumer {
        sides.push(("consumer", consumer, vec![namespace.map(str::to_owned)]));
    }
    if let Some((client, map)) = provider {
        let scopes = kbind_shared::boundary::provider_scopes(consumer, map, namespace)
            .await
            .map_err(Error::Consumer)?;
        sides.push(("provider", client, scopes));
    }
    for (side, client, scopes) in sides {
        let mut lists = Vec::new();
        for resource in [
            ApiResource::erase::<Secret>(&()),
            ApiResource::erase::<ConfigMap>(&()),
        ] {
            for scope in &scopes {
                lists.push((resource.clone(), scope.clone()));
            }
        }
        for (resource, scope) in lists {
            let api = scoped(client, scope.as_deref(), &resource);
            let list = match api
                .list_metadata(&ListParams::default().labels(&selector))
                .await
            {
                Ok(list) => list.items,
                // Credentials that may not list a kind cannot have made copies of it.
                Err(kube::Error::Api(s)) if s.is_forbidden() || s.is_not_found() => continue,
                Err(source) => {
                    return Err(Error::Provider {
                        action: format!("list related {} on the {side}", resource.plural),
                        source,
                    });
                }
            };
            for copy in list {
                if copy
                    .annotations()
                    .get(keys::RELATED_BINDING_ANNOTATION)
                    .map(String::as_str)
                    != Some(binding_uid)
                    // Taken over under Adopt, not created: kbind never deletes it.
                    || copy
                        .annotations()
                        .get(keys::RELATED_ADOPTED_ANNOTATION)
                        .map(String::as_str)
                        == Some(keys::TRUE)
                {
                    continue;
                }
                found += 1;
                let namespace = copy.namespace().unwrap_or_default();
                let params = DeleteParams {
                    preconditions: Some(kube::api::Preconditions {
                        uid: copy.metadata.uid.clone(),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                match scoped(client, Some(&namespace), &resource)
                    .delete(&copy.name_any(), &params)
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => {}
                    Err(source) => {
                        return Err(Error::Provider {
                            action: format!(
                                "delete related {} {namespace}/{} on the {side}",
                                resource.kind,
                                copy.name_any()
                            ),
                            source,
                        });
                    }
                }
            }
        }
    }
    Ok(found)
}
