//! Writing a binding's status (BIND-12): only when it changed, with a Warning Event when a new
//! schema conflict needs the user.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kbind_shared::api::BindingStatus;
use kbind_shared::conditions::{self, Desired, reasons, types};
use kube::ResourceExt;
use kube::api::PostParams;

use super::kinds::{Error, Scoped};
use crate::context::Context;

/// BIND-12: writes the status when anything changed.
pub(crate) async fn write_status<B: Scoped>(
    binding: &B,
    ctx: &Context,
    desired: Vec<Desired<'_>>,
    bound_apis: Option<Vec<kbind_shared::api::BoundApi>>,
    apis: Option<Vec<kbind_shared::api::ApiStatus>>,
) -> Result<(), Error> {
    let before = binding.binding_status().cloned().unwrap_or_default();
    let mut status: BindingStatus = before.clone();
    let now = Time(jiff::Timestamp::now());
    let ready = desired
        .iter()
        .any(|d| d.type_ == types::READY && d.status == conditions::Status::True);
    for d in desired {
        conditions::set(&mut status.conditions, d, binding.meta().generation, &now);
    }
    if let Some(bound) = bound_apis {
        status.bound_apis = bound;
    }
    if let Some(apis) = apis {
        status.apis = apis;
    }
    let namespace = binding.namespace().unwrap_or_default();
    ctx.metrics
        .binding_ready
        .with_label_values(&[namespace.as_str(), &binding.name_any()])
        .set(if ready { 1.0 } else { 0.0 });
    if status == before {
        return Ok(());
    }
    warn_on_new_schema_conflict(binding, ctx, &before, &status).await;
    warn_on_new_breaking_change(binding, ctx, &before, &status).await;
    let mut updated = binding.clone();
    updated.set_binding_status(status);
    B::api(&ctx.client, binding)
        .replace_status(&binding.name_any(), &PostParams::default(), &updated)
        .await
        .map_err(Error::Consumer)?;
    Ok(())
}

/// The schema hashes a `SchemaInSync=False/BreakingChange` condition names.
fn held_hashes(status: &BindingStatus) -> std::collections::BTreeSet<String> {
    conditions::find(&status.conditions, types::SCHEMA_IN_SYNC)
        .filter(|c| c.reason == super::outcome::BREAKING_CHANGE)
        .map(|c| {
            c.message
                .match_indices("sha256:")
                .filter_map(|(at, _)| c.message.get(at..at + kbind_shared::keys::SCHEMA_HASH_LEN))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// A `BreakingChange` Warning Event once per held schema: when the condition starts naming a hash
/// it did not name before (a changing object count does not repeat it).
async fn warn_on_new_breaking_change<B: Scoped>(
    binding: &B,
    ctx: &Context,
    before: &BindingStatus,
    after: &BindingStatus,
) {
    let (old, new) = (held_hashes(before), held_hashes(after));
    if new.is_subset(&old) {
        return;
    }
    let Some(message) =
        conditions::find(&after.conditions, types::SCHEMA_IN_SYNC).map(|c| c.message.clone())
    else {
        return;
    };
    // An Event's note holds at most 1 KiB.
    let mut note = String::new();
    for c in message.chars() {
        if note.len() + c.len_utf8() > 1000 {
            break;
        }
        note.push(c);
    }
    let recorder = kube::runtime::events::Recorder::new(ctx.client.clone(), ctx.reporter.clone());
    let event = kube::runtime::events::Event {
        type_: kube::runtime::events::EventType::Warning,
        reason: super::outcome::BREAKING_CHANGE.into(),
        note: Some(note),
        action: "UpdateSchema".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &binding.object_ref(&())).await {
        tracing::debug!(error = %e, "cannot publish Event");
    }
}

/// A `SchemaConflict` Warning Event when the Ready message about one starts or changes: the
/// user must act (annotate the CRD, or drop the API), so it is announced, once per change.
async fn warn_on_new_schema_conflict<B: Scoped>(
    binding: &B,
    ctx: &Context,
    before: &BindingStatus,
    after: &BindingStatus,
) {
    let conflict = |status: &BindingStatus| {
        conditions::find(&status.conditions, types::READY)
            .filter(|c| c.reason == reasons::SCHEMA_CONFLICT)
            .map(|c| c.message.clone())
    };
    let Some(message) = conflict(after) else {
        return;
    };
    if conflict(before).as_ref() == Some(&message) {
        return;
    }
    let recorder = kube::runtime::events::Recorder::new(ctx.client.clone(), ctx.reporter.clone());
    let event = kube::runtime::events::Event {
        type_: kube::runtime::events::EventType::Warning,
        reason: reasons::SCHEMA_CONFLICT.into(),
        note: Some(message),
        action: "InstallSchema".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &binding.object_ref(&())).await {
        tracing::debug!(error = %e, "cannot publish Event");
    }
}
