//! Letting go of an API (REFERENCE-BEHAVIOUR §14 BCL, exact; BIND-16, AUTO-2, LIM-22, QRK-25
//! fixed): deleting a binding, removing an API from one and moving an API to another Connection
//! all release it the same way — the instances no remaining binding covers are drained (provider
//! copies deleted and awaited, PGAP-1, or orphaned), their syncer finalizers released, and the
//! consumer CRD removed only on an explicit unbind of its last ClusterBinding when kbind created
//! it (LIM-9). A move then hands a CRD kbind created to the new Connection.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_shared::api::{Binding, ClusterBinding, Connection};
use kbind_shared::keys;
use kbind_shared::ownership::{self, Owner};
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use super::kinds::{Error, Scoped};
use super::ledger::{Held, Left};
use crate::context::Context;
use crate::providers::Provider;
use kbind_shared::dynamic::{instance_resource, scoped};

/// Why an API is being let go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Unbound (the binding deleted, or the API removed from it).
    Unbind,
    /// Moved to another Connection: the old provider is drained first, whatever made the binding,
    /// and a provider that cannot be reached is waited for rather than orphaned.
    Move,
}

/// The bindings that exist while one lets go, listed once per reconcile.
pub struct Others {
    cluster_bindings: Vec<ClusterBinding>,
    bindings: Vec<Binding>,
}

impl Others {
    /// Lists both kinds.
    pub async fn list(client: &Client) -> Result<Self, Error> {
        let cluster_bindings = Api::<ClusterBinding>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map_err(Error::Consumer)?
            .items;
        let bindings = Api::<Binding>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map_err(Error::Consumer)?
            .items;
        Ok(Self {
            cluster_bindings,
            bindings,
        })
    }
}

/// The provider side of the Connection that holds an API.
pub(super) struct Holder {
    /// The Connection exists and is not being deleted.
    present: bool,
    /// The Connection exists (perhaps being deleted: it waits for its bindings, and its
    /// credential with it).
    pub(super) exists: bool,
    /// Its verified provider client.
    pub(super) provider: Result<Provider, String>,
    local_uid: String,
    /// How it names consumer namespaces on the provider (its boundary, #51).
    pub(super) namespaces: kbind_shared::boundary::NamespaceMap,
}

pub(super) async fn holder(ctx: &Context, connection: &str) -> Result<Holder, Error> {
    let found = Api::<Connection>::all(ctx.client.clone())
        .get_opt(connection)
        .await
        .map_err(Error::Consumer)?;
    let Some(c) = found else {
        return Ok(Holder {
            present: false,
            exists: false,
            provider: Err(format!("Connection {connection} not found")),
            local_uid: String::new(),
            namespaces: Default::default(),
        });
    };
    let provider = ctx
        .providers
        .for_connection(
            &ctx.client,
            &c,
            &ctx.settings.provider_secrets,
            &ctx.metrics,
        )
        .await;
    Ok(Holder {
        present: c.metadata.deletion_timestamp.is_none(),
        exists: true,
        provider,
        local_uid: c
            .status
            .as_ref()
            .map(|s| s.local_cluster_uid.clone())
            .unwrap_or_default(),
        namespaces: c.spec.namespaces(),
    })
}

/// Takes over the consumer CRD `api`, which Connection `from` serves, for Connection `to` — the
/// user annotated it `core.kbind.io/adopt=<to>` — the way a `connectionRef` move does: no object
/// ever reaches two providers. First the CRD is annotated `core.kbind.io/handover-to`, so that it
/// has no work units and every syncer stops working on it; once no syncer reports a unit of it,
/// `from`'s provider copies of every instance are deleted (UID preconditions; orphan-policy
/// objects are left) and awaited; then the CRD is re-marked for `to`. `Ok(None)`: done;
/// `Ok(Some(why))`: still under way.
pub async fn adopt_from(
    ctx: &Context,
    api: &str,
    from: &str,
    to: &str,
) -> Result<Option<String>, Error> {
    let crds: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    let Some(crd) = crds.get_opt(api).await.map_err(Error::Consumer)? else {
        return Ok(Some(format!("the consumer CRD {api} is gone")));
    };
    let patch = |value: serde_json::Value| {
        let crds = crds.clone();
        async move {
            crds.patch(api, &PatchParams::default(), &Patch::Merge(&value))
                .await
                .map(drop)
                .map_err(Error::Consumer)
        }
    };
    if crd
        .annotations()
        .get(keys::HANDOVER_ANNOTATION)
        .map(String::as_str)
        != Some(to)
    {
        patch(json!({ "metadata": {
            "resourceVersion": crd.resource_version(),
            "annotations": { keys::HANDOVER_ANNOTATION: to },
        } }))
        .await?;
        return Ok(Some(format!(
            "stopping Connection {from}'s sync of {api} before Connection {to} takes the CRD over (core.kbind.io/adopt)"
        )));
    }
    if ctx.runs_api(from, api) {
        return Ok(Some(format!(
            "waiting for the syncers to stop Connection {from}'s sync of {api}"
        )));
    }
    let holder = holder(ctx, from).await?;
    let mut waiting = 0;
    if holder.present {
        let provider = match &holder.provider {
            Ok(provider) => provider,
            Err(message) => {
                return Ok(Some(format!(
                    "cannot reach the provider of Connection {from} to drain it: {}",
                    kbind_shared::conditions::bounded(message, 300)
                )));
            }
        };
        let Some(resource) = instance_resource(&crd) else {
            return Ok(Some(format!("the consumer CRD {api} serves no version")));
        };
        let objects = match Api::<DynamicObject>::all_with(ctx.client.clone(), &resource)
            .list(&ListParams::default())
            .await
        {
            Ok(list) => list.items,
            Err(kube::Error::Api(s)) if s.is_not_found() => Vec::new(),
            Err(e) => return Err(Error::Consumer(e)),
        };
        for object in &objects {
            let synced = object
                .finalizers()
                .iter()
                .any(|f| f == keys::SYNCER_FINALIZER);
            let orphan = object
                .annotations()
                .get(keys::DELETION_POLICY_ANNOTATION)
                .map(String::as_str)
                == Some(keys::DELETION_POLICY_ORPHAN);
            if synced
                && !orphan
                && delete_provider_copy(&provider.client, &resource, object, &holder.local_uid)
                    .await?
            {
                waiting += 1;
            }
        }
    }
    if waiting > 0 {
        return Ok(Some(format!(
            "waiting for {waiting} provider object(s) of Connection {from} to be deleted before Connection {to} takes CRD {api} over"
        )));
    }
    patch(json!({ "metadata": {
        "labels": { keys::MANAGED_LABEL: keys::TRUE },
        "annotations": {
            keys::CONNECTION_ANNOTATION: to,
            keys::HANDOVER_ANNOTATION: null,
            keys::UNBOUND_ANNOTATION: null,
        },
    } }))
    .await?;
    Ok(None)
}

/// Lets go of `held` in `binding`'s scope. On a finished move, a CRD kbind created for the old
/// Connection is handed to `to` when no other binding holds it there.
pub async fn release_api<B: Scoped>(
    binding: &B,
    held: &Held,
    mode: Mode,
    to: Option<&str>,
    ctx: &Context,
    others: &Others,
) -> Result<Left, Error> {
    let client = &ctx.client;
    let holder = holder(ctx, &held.connection).await?;
    // A move never lets two providers receive one object: it waits for the old provider rather
    // than orphan its copies (unless the Connection is gone, and with it any way to reach them).
    if mode == Mode::Move
        && holder.present
        && let Err(message) = &holder.provider
    {
        return Ok(Left::Unreachable(format!(
            "cannot reach the provider of Connection {} to drain it: {}",
            held.connection,
            kbind_shared::conditions::bounded(message, 300)
        )));
    }
    let uid = binding.meta().uid.clone().unwrap_or_default();
    let coverage = remaining_coverage(
        &held.api,
        &held.connection,
        &uid,
        &others.cluster_bindings,
        &others.bindings,
    );
    if coverage.everywhere {
        return Ok(Left::Nothing);
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let Some(crd) = crds.get_opt(&held.api).await.map_err(Error::Consumer)? else {
        return Ok(Left::Nothing);
    };
    // A binding lets go only of what it could have bound: instances of a CRD that serves its
    // Connection. A refused entry (another Connection serves the CRD, or it is not kbind's) holds
    // nothing — releasing it would strip the serving Connection's finalizers and, when both
    // Connections reach one provider, delete that Connection's copies.
    // A route's copies (#36: another Connection serves the CRD, this one routed some of its
    // objects) are held by the route's own finalizer; only those are let go, and the CRD is
    // never touched for a route.
    let route = route_finalizer(&crd, &held.connection, B::NAMESPACED);
    if route.is_none() && !releasable(&crd, &held.connection, B::NAMESPACED) {
        return Ok(Left::Nothing);
    }
    let finalizer = route
        .clone()
        .unwrap_or_else(|| keys::SYNCER_FINALIZER.to_owned());
    let Some(resource) = instance_resource(&crd) else {
        return Ok(Left::Nothing);
    };
    // Safe by default: a binding autoBind made goes away without a user asking for it (autoBind
    // off, an export missing past its grace, the Connection deleted). Its instances are orphaned
    // — finalizers released, provider copies kept — and its CRDs are kept, marked unbound.
    let automatic = mode == Mode::Unbind && is_automatic(binding.meta());
    // The user's explicit choice to keep the provider copies of everything the binding lets go.
    let keep_copies = keeps_copies(binding.meta());
    let scope = binding.covered_namespace();
    let list = match scoped(client, scope.as_deref(), &resource)
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(kube::Error::Api(s)) if s.is_not_found() => Vec::new(),
        Err(e) => return Err(Error::Consumer(e)),
    };
    let (mut waiting, mut owed) = (0, 0);
    // Why the provider did not answer, once a request to it failed so: the rest are owed without
    // waiting for each to time out.
    let mut unanswered: Option<String> = holder.provider.as_ref().err().cloned();
    for object in list {
        if object
            .namespace()
            .is_some_and(|ns| coverage.namespaces.contains(&ns))
        {
            continue;
        }
        // #54: an unclaimed mirror of an imported provider object goes with the binding that
        // let go of its API — on the consumer only; its provider object was never written.
        if kbind_shared::import::standing_of(&object.metadata, &held.connection, &finalizer)
            == kbind_shared::import::Standing::Observed
        {
            delete_mirror(client, &resource, &object).await?;
            continue;
        }
        if !object.finalizers().contains(&finalizer) {
            continue;
        }
        let orphan = object
            .annotations()
            .get(keys::DELETION_POLICY_ANNOTATION)
            .map(String::as_str)
            == Some(keys::DELETION_POLICY_ORPHAN);
        if !orphan && !automatic && !keep_copies {
            match (&holder.provider, &unanswered) {
                (Ok(provider), None) => match delete_provider_copy(
                    &provider.client,
                    &resource,
                    &object,
                    &holder.local_uid,
                )
                .await
                {
                    Ok(true) => {
                        waiting += 1;
                        continue;
                    }
                    Ok(false) => {}
                    Err(Error::Provider { action, source }) if unreachable(&source) => {
                        unanswered = Some(format!(
                            "{action}: {}",
                            kbind_shared::identity::describe_error(&source)
                        ));
                        owed += 1;
                        continue;
                    }
                    Err(e) => return Err(e),
                },
                // #53.1: the provider cannot be reached, but the Connection (and its
                // credential) is still there: the copy is owed. The object keeps its finalizer —
                // the durable record, on the consumer, of what is owed — until the provider
                // answers and the copy is deleted.
                _ if holder.exists => {
                    owed += 1;
                    continue;
                }
                // No Connection: nothing can reach the copies any more.
                _ => {}
            }
        }
        release_syncer_finalizer(client, &resource, &object, &finalizer).await?;
    }
    if owed > 0 {
        let why = unanswered.unwrap_or_default();
        return Ok(Left::Unreachable(owed_message(
            owed,
            &held.connection,
            &why,
        )));
    }
    if waiting > 0 {
        return Ok(Left::Draining(waiting));
    }
    if route.is_some() {
        return Ok(Left::Nothing);
    }
    let last = LastBinding {
        crds: &crds,
        crd: &crd,
        connection: &held.connection,
        api: &held.api,
        leaving_uid: &uid,
        cluster_bindings: &others.cluster_bindings,
        bindings: &others.bindings,
    };
    match (mode, to) {
        (Mode::Move, Some(to)) => last.hand_over(to).await?,
        (Mode::Move, None) => {}
        // A namespaced Binding never removes a cluster-wide CRD.
        (Mode::Unbind, _) if B::NAMESPACED => {}
        (Mode::Unbind, _) if automatic => last.mark_unbound(&binding.name_any()).await?,
        (Mode::Unbind, _) => last.delete_crd_if_ours().await?,
    }
    Ok(Left::Nothing)
}

/// Whether a binding of `connection` (namespaced or not) may let go of instances of `crd`: only
/// when the CRD serves that Connection (its `core.kbind.io/connection` marker), and a namespaced
/// Binding never of a cluster-scoped API, which it cannot have bound.
pub fn releasable(crd: &CustomResourceDefinition, connection: &str, namespaced: bool) -> bool {
    let serves = crd
        .annotations()
        .get(keys::CONNECTION_ANNOTATION)
        .is_some_and(|c| c == connection);
    serves && !(namespaced && crd.spec.scope == "Cluster")
}

/// When `connection` is a route for the instances of `crd` — kbind manages the CRD for another
/// Connection (#36) — the finalizer its copies are held by; `None` otherwise. A namespaced
/// Binding never has a cluster-scoped API routed.
pub fn route_finalizer(
    crd: &CustomResourceDefinition,
    connection: &str,
    namespaced: bool,
) -> Option<String> {
    let managed = crd.labels().get(keys::MANAGED_LABEL).map(String::as_str) == Some(keys::TRUE);
    let served_by = crd
        .annotations()
        .get(keys::CONNECTION_ANNOTATION)
        .filter(|_| managed)?;
    (served_by != connection && !(namespaced && crd.spec.scope == "Cluster"))
        .then(|| kbind_shared::routing::finalizer(connection, served_by))
}

/// Where an API's instances stay covered after `leaving` goes: by a remaining ClusterBinding
/// (everywhere) or by remaining Bindings (their namespaces). LIM-22: exact, per namespace.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    /// A remaining ClusterBinding covers every namespace.
    pub everywhere: bool,
    /// Namespaces a remaining Binding covers.
    pub namespaces: Vec<String>,
}

/// Computes the [`Coverage`] that remains for `api` of `connection` without the leaving binding.
pub fn remaining_coverage(
    api: &str,
    connection: &str,
    leaving_uid: &str,
    cluster_bindings: &[ClusterBinding],
    bindings: &[Binding],
) -> Coverage {
    let remains = |meta: &kube::api::ObjectMeta, spec: &kbind_shared::api::BindingSpec| {
        meta.deletion_timestamp.is_none()
            && meta.uid.as_deref() != Some(leaving_uid)
            && spec.connection_ref.name == connection
            && spec.apis.iter().any(|a| a.name == api)
    };
    Coverage {
        everywhere: cluster_bindings
            .iter()
            .any(|b| remains(&b.metadata, &b.spec)),
        namespaces: bindings
            .iter()
            .filter(|b| remains(&b.metadata, &b.spec))
            .filter_map(|b| b.namespace())
            .collect(),
    }
}

/// Deletes the provider copy of `object` if it is ours. Returns whether it still exists.
async fn delete_provider_copy(
    provider: &Client,
    resource: &ApiResource,
    object: &DynamicObject,
    local_uid: &str,
) -> Result<bool, Error> {
    let api = scoped(provider, object.namespace().as_deref(), resource);
    let name = object.name_any();
    let copy = api.get_opt(&name).await.map_err(|source| Error::Provider {
        action: format!("read the provider copy of {name}"),
        source,
    })?;
    let Some(copy) = copy else { return Ok(false) };
    let object_uid = object.metadata.uid.as_deref().unwrap_or_default();
    if ownership::classify(copy.annotations(), local_uid, object_uid) != Owner::Ours {
        return Ok(false);
    }
    if copy.metadata.deletion_timestamp.is_none() {
        // Exactly the copy just classified as ours: its UID is the precondition (a foreign object
        // re-created under the name since is never deleted).
        let params = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: copy.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(false),
            Err(kube::Error::Api(s)) if s.is_conflict() => return Ok(true),
            Err(source) => {
                return Err(Error::Provider {
                    action: format!("delete the provider copy of {name}"),
                    source,
                });
            }
        }
    }
    Ok(true)
}

/// Deletes an unclaimed import mirror, if it is still the one listed (UID and resourceVersion: a
/// mirror claimed meanwhile is kept). Gone already: nothing to do; changed since the list: an
/// error, and the release looks again.
async fn delete_mirror(
    client: &Client,
    resource: &ApiResource,
    object: &DynamicObject,
) -> Result<(), Error> {
    let params = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: object.uid(),
            resource_version: object.resource_version(),
        }),
        ..Default::default()
    };
    match scoped(client, object.namespace().as_deref(), resource)
        .delete(&object.name_any(), &params)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(Error::Consumer(e)),
    }
}

async fn release_syncer_finalizer(
    client: &Client,
    resource: &ApiResource,
    object: &DynamicObject,
    finalizer: &str,
) -> Result<(), Error> {
    let api = scoped(client, object.namespace().as_deref(), resource);
    kbind_shared::finalizers::set(&api, object, finalizer, false)
        .await
        .map(drop)
        .map_err(Error::Consumer)
}

/// What an unbind owes the provider it cannot reach (#53.1): `owed` copies to delete once it
/// answers, and how to keep them instead.
pub fn owed_message(owed: usize, connection: &str, why: &str) -> String {
    format!(
        "{owed} provider copy(ies) owed: cannot reach the provider of Connection {connection} to delete them ({}); they are deleted when it answers (annotate the binding {}={} to keep them instead)",
        kbind_shared::conditions::bounded(why, 300),
        keys::DELETION_POLICY_ANNOTATION,
        keys::DELETION_POLICY_ORPHAN
    )
}

/// Whether a provider request failed because the provider did not answer (no connection, a
/// timeout, a gateway or server error) rather than by saying no.
pub(super) fn unreachable(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code >= 500 || s.code == 429 || s.code == 408,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// Whether the user annotated a binding to keep the provider copies of what it lets go
/// ([`keys::DELETION_POLICY_ANNOTATION`]` = Orphan`, as on one object).
pub fn keeps_copies(meta: &kube::api::ObjectMeta) -> bool {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(keys::DELETION_POLICY_ANNOTATION))
        .map(String::as_str)
        == Some(keys::DELETION_POLICY_ORPHAN)
}

/// Whether a binding was made by autoBind: controlled by a Connection.
fn is_automatic(meta: &kube::api::ObjectMeta) -> bool {
    meta.owner_references.iter().flatten().any(|o| {
        o.controller == Some(true)
            && o.kind == "Connection"
            && o.api_version.starts_with(&format!("{}/", keys::GROUP))
    })
}

/// An API's consumer CRD as its (possibly last) binding goes.
struct LastBinding<'a> {
    crds: &'a Api<CustomResourceDefinition>,
    crd: &'a CustomResourceDefinition,
    connection: &'a str,
    api: &'a str,
    leaving_uid: &'a str,
    cluster_bindings: &'a [ClusterBinding],
    bindings: &'a [Binding],
}

impl LastBinding<'_> {
    /// Whether a binding other than the leaving one lists the API (through `connection` only,
    /// if given).
    fn listed_elsewhere(&self, connection: Option<&str>) -> bool {
        self.cluster_bindings
            .iter()
            .map(|b| (&b.metadata, &b.spec.binding))
            .chain(self.bindings.iter().map(|b| (&b.metadata, &b.spec)))
            .any(|(meta, spec)| {
                meta.deletion_timestamp.is_none()
                    && meta.uid.as_deref() != Some(self.leaving_uid)
                    && connection.is_none_or(|c| spec.connection_ref.name == c)
                    && spec.apis.iter().any(|a| a.name == self.api)
            })
    }

    /// Whether kbind created the CRD for this Connection and it still serves it.
    fn created_and_served(&self) -> bool {
        let annotation = |key: &str| self.crd.annotations().get(key).map(String::as_str);
        annotation(keys::CREATED_BY_ANNOTATION) == Some(self.connection)
            && annotation(keys::CONNECTION_ANNOTATION) == Some(self.connection)
    }

    /// Whether kbind created the CRD for this Connection, it still serves it, and no other
    /// binding lists the API.
    fn ours_and_last(&self) -> bool {
        self.created_and_served() && !self.listed_elsewhere(None)
    }

    /// LIM-9: only the explicit deletion of the last binding removes a CRD kbind created (its UID
    /// is the precondition).
    async fn delete_crd_if_ours(&self) -> Result<(), Error> {
        if !self.ours_and_last() {
            return Ok(());
        }
        let params = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: self.crd.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self.crds.delete(self.api, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => Ok(()),
            Err(e) => Err(Error::Consumer(e)),
        }
    }

    /// Whether kbind created the CRD for the old Connection, it serves it, and no other binding
    /// binds the API through that Connection: then a finished move may take it along.
    fn movable(&self) -> bool {
        self.created_and_served() && !self.listed_elsewhere(Some(self.connection))
    }

    /// A finished move: the CRD kbind created for the old Connection now serves `to` (and counts
    /// as created for it, so its last explicit unbind may remove it). The user's edit of the
    /// binding is the consent; a CRD kbind did not create still needs the user's opt-in
    /// (`core.kbind.io/adopt`), which the new Connection's schema plan asks for.
    async fn hand_over(&self, to: &str) -> Result<(), Error> {
        if !self.movable() {
            return Ok(());
        }
        self.patch(json!({ "metadata": {
            "resourceVersion": self.crd.resource_version(),
            "annotations": {
                keys::CONNECTION_ANNOTATION: to,
                keys::CREATED_BY_ANNOTATION: to,
                keys::UNBOUND_ANNOTATION: null,
            }
        } }))
        .await
    }

    /// The automatic unbind: the CRD (and so every object) stays, annotated to say why.
    async fn mark_unbound(&self, binding: &str) -> Result<(), Error> {
        if !self.ours_and_last() {
            return Ok(());
        }
        let note = format!(
            "ClusterBinding {binding} made by autoBind went away without a user deleting it; kbind kept this CRD and its objects (delete the CRD yourself if they are no longer wanted)"
        );
        self.patch(json!({ "metadata": { "annotations": { keys::UNBOUND_ANNOTATION: note } } }))
            .await
    }

    /// A merge patch of the CRD's metadata; a CRD gone meanwhile needs nothing.
    async fn patch(&self, patch: serde_json::Value) -> Result<(), Error> {
        match self
            .crds
            .patch(self.api, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
            Err(e) => Err(Error::Consumer(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kbind_shared::api::{BindingSpec, ClusterBindingSpec};

    fn spec(connection: &str, apis: &[&str]) -> BindingSpec {
        BindingSpec::new(connection, apis)
    }

    #[test]
    fn an_unbind_owes_what_it_cannot_delete_and_says_how_to_keep_it() {
        let message = owed_message(2, "provider", "read the provider copy of a: timed out");
        assert!(
            message.starts_with(
                "2 provider copy(ies) owed: cannot reach the provider of Connection provider"
            ),
            "{message}"
        );
        assert!(
            message.contains("core.kbind.io/deletion-policy=Orphan"),
            "{message}"
        );
        let mut meta = kube::api::ObjectMeta::default();
        assert!(!keeps_copies(&meta));
        meta.annotations = Some(
            [(
                keys::DELETION_POLICY_ANNOTATION.to_owned(),
                "Delete".to_owned(),
            )]
            .into(),
        );
        assert!(!keeps_copies(&meta));
        meta.annotations = Some(
            [(
                keys::DELETION_POLICY_ANNOTATION.to_owned(),
                keys::DELETION_POLICY_ORPHAN.to_owned(),
            )]
            .into(),
        );
        assert!(keeps_copies(&meta));
        let status = crate::context::api_error;
        for (code, want) in [
            (503, true),
            (504, true),
            (429, true),
            (403, false),
            (404, false),
            (409, false),
        ] {
            assert_eq!(unreachable(&status(code)), want, "{code}");
        }
    }

    #[test]
    fn only_a_crd_serving_the_bindings_connection_is_released() {
        // (case, connection marker, scope, namespaced binding, releasable)
        let cases = [
            (
                "serves this Connection",
                Some("p"),
                "Namespaced",
                false,
                true,
            ),
            (
                "serves this Connection, Binding",
                Some("p"),
                "Namespaced",
                true,
                true,
            ),
            (
                "serves another Connection",
                Some("q"),
                "Namespaced",
                false,
                false,
            ),
            ("not kbind's", None, "Namespaced", false, false),
            (
                "cluster-scoped, ClusterBinding",
                Some("p"),
                "Cluster",
                false,
                true,
            ),
            ("cluster-scoped, Binding", Some("p"), "Cluster", true, false),
        ];
        for (case, marker, scope, namespaced, want) in cases {
            let mut crd = CustomResourceDefinition::default();
            crd.spec.scope = scope.into();
            if let Some(m) = marker {
                crd.metadata.annotations =
                    Some([(keys::CONNECTION_ANNOTATION.to_owned(), m.to_owned())].into());
            }
            assert_eq!(releasable(&crd, "p", namespaced), want, "{case}");
        }
    }

    #[test]
    fn remaining_coverage_is_exact_per_namespace_and_connection() {
        // LIM-22
        let w = "widgets.example.org";
        let mut leaving = ClusterBinding::new("leaving", ClusterBindingSpec::from(spec("p", &[w])));
        leaving.metadata.uid = Some("leaving".into());
        let other_connection =
            ClusterBinding::new("other", ClusterBindingSpec::from(spec("q", &[w])));
        let mut team_a = Binding::new("a", spec("p", &[w]));
        team_a.metadata.namespace = Some("team-a".into());
        let mut team_b_other_api = Binding::new("b", spec("p", &["gadgets.example.org"]));
        team_b_other_api.metadata.namespace = Some("team-b".into());
        let coverage = remaining_coverage(
            w,
            "p",
            "leaving",
            &[leaving.clone(), other_connection],
            &[team_a, team_b_other_api],
        );
        assert_eq!(
            coverage,
            Coverage {
                everywhere: false,
                namespaces: vec!["team-a".into()]
            }
        );

        let still = ClusterBinding::new("still", ClusterBindingSpec::from(spec("p", &[w])));
        assert!(remaining_coverage(w, "p", "leaving", &[leaving, still], &[]).everywhere);
    }
}
