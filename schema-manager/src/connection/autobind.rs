//! autoBind (REFERENCE-BEHAVIOUR §7): a ClusterBinding named after the Connection, listing every
//! exported API, owned by the Connection.

use kbind_shared::api::{ClusterBinding, Connection, ExportedApi};
use kbind_shared::keys;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Value, json};

const FIELD_MANAGER: &str = "kbind-schema-manager";

/// AUTO-1: the ClusterBinding's fields kbind owns (server-side apply leaves the rest, such as
/// `conflictPolicy` and `relatedResources`, to the user).
pub fn desired(connection: &Connection, exports: &[ExportedApi]) -> Value {
    let mut apis: Vec<&str> = exports.iter().map(|a| a.name.as_str()).collect();
    apis.sort_unstable();
    let owner = connection.controller_owner_ref(&()).map(|mut o| {
        o.block_owner_deletion = Some(true);
        o
    });
    json!({
        "apiVersion": "core.kbind.io/v1alpha1",
        "kind": "ClusterBinding",
        "metadata": {
            "name": connection.name_any(),
            "labels": { keys::MANAGED_LABEL: keys::TRUE },
            "ownerReferences": owner.into_iter().collect::<Vec<_>>(),
        },
        "spec": {
            "connectionRef": { "name": connection.name_any() },
            "apis": apis.iter().map(|name| json!({ "name": name })).collect::<Vec<_>>(),
        },
    })
}

/// Whether `binding` is controlled by `connection` (so kbind may delete it).
fn controlled_by(binding: &ClusterBinding, connection: &Connection) -> bool {
    let uid = connection.meta().uid.as_deref();
    binding
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && Some(o.uid.as_str()) == uid)
}

/// What autoBind should do about the ClusterBinding named after the Connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Apply the desired ClusterBinding.
    Apply,
    /// Delete it, if this Connection controls it.
    DeleteOwned,
    /// Leave it as it is.
    Keep,
}

/// AUTO-1/AUTO-3/AUTO-4, improved: turning autoBind off removes the owned ClusterBinding
/// (LIM-12), and a single empty discovery result after a non-empty one tears nothing down — only a
/// second empty result in a row does.
pub fn step(auto_bind: bool, exports: usize, previously_exported: bool) -> Step {
    match (auto_bind, exports, previously_exported) {
        (false, _, _) => Step::DeleteOwned,
        (true, 0, true) => Step::Keep,
        (true, 0, false) => Step::DeleteOwned,
        (true, _, _) => Step::Apply,
    }
}

/// Whether `existing` already is what [`desired`] would apply.
fn is_current(existing: &ClusterBinding, connection: &Connection, exports: &[ExportedApi]) -> bool {
    let mut want: Vec<&str> = exports.iter().map(|a| a.name.as_str()).collect();
    want.sort_unstable();
    let have: Vec<&str> = existing.spec.apis.iter().map(|a| a.name.as_str()).collect();
    controlled_by(existing, connection)
        && have == want
        && existing.spec.connection_ref.name == connection.name_any()
        && existing
            .labels()
            .get(keys::MANAGED_LABEL)
            .map(String::as_str)
            == Some(keys::TRUE)
}

/// Applies [`step`]; writes only when the ClusterBinding differs from what it should be, and only
/// ever deletes a ClusterBinding this Connection controls (the reference deleted any with the
/// name, QRK-6).
pub async fn reconcile(
    consumer: &Client,
    connection: &Connection,
    exports: &[ExportedApi],
    previously_exported: bool,
) -> Result<(), String> {
    let bindings: Api<ClusterBinding> = Api::all(consumer.clone());
    let name = connection.name_any();
    let step = step(
        connection.spec.auto_bind,
        exports.len(),
        previously_exported,
    );
    if step == Step::Keep {
        return Ok(());
    }
    let existing = bindings
        .get_opt(&name)
        .await
        .map_err(|e| format!("read ClusterBinding {name}: {e}"))?;
    match (step, existing) {
        (Step::DeleteOwned, Some(existing)) if controlled_by(&existing, connection) => {
            delete(consumer, &name).await
        }
        (Step::Apply, Some(existing)) if is_current(&existing, connection, exports) => Ok(()),
        (Step::Apply, _) => bindings
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(desired(connection, exports)),
            )
            .await
            .map(drop)
            .map_err(|e| format!("apply autoBind ClusterBinding {name}: {e}")),
        _ => Ok(()),
    }
}

/// CDEL-2: requests deletion of the autoBind ClusterBinding (NotFound is fine).
pub async fn delete(consumer: &Client, name: &str) -> Result<(), String> {
    match Api::<ClusterBinding>::all(consumer.clone())
        .delete(name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(format!("delete autoBind ClusterBinding {name}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kbind_shared::api::{ApiScope, ConnectionSpec, KubeconfigSecretRef};

    #[test]
    fn one_empty_discovery_is_not_enough_to_tear_down() {
        assert_eq!(step(true, 2, false), Step::Apply);
        assert_eq!(
            step(true, 0, true),
            Step::Keep,
            "the first empty result after exports"
        );
        assert_eq!(
            step(true, 0, false),
            Step::DeleteOwned,
            "empty twice in a row"
        );
        assert_eq!(
            step(false, 2, true),
            Step::DeleteOwned,
            "autoBind turned off (LIM-12)"
        );
    }

    #[test]
    fn desired_binding_lists_sorted_exports_and_is_owned_by_the_connection() {
        let mut connection = Connection::new(
            "provider",
            ConnectionSpec {
                kubeconfig_secret_ref: KubeconfigSecretRef {
                    namespace: "kbind".into(),
                    name: "p".into(),
                    key: String::new(),
                },
                schema: Default::default(),
                auto_bind: true,
            },
        );
        connection.metadata.uid = Some("conn-uid".into());
        let export = |name: &str| ExportedApi {
            name: name.into(),
            group: "g".into(),
            resource: "r".into(),
            scope: ApiScope::Namespaced,
            versions: vec!["v1".into()],
        };
        let body = desired(
            &connection,
            &[export("widgets.example.org"), export("gadgets.example.org")],
        );
        assert_eq!(
            body["spec"]["apis"],
            json!([{ "name": "gadgets.example.org" }, { "name": "widgets.example.org" }])
        );
        assert_eq!(body["spec"]["connectionRef"]["name"], "provider");
        assert_eq!(body["metadata"]["labels"]["core.kbind.io/managed"], "true");
        let owner = &body["metadata"]["ownerReferences"][0];
        assert_eq!(
            (
                owner["uid"].as_str(),
                owner["controller"].as_bool(),
                owner["blockOwnerDeletion"].as_bool()
            ),
            (Some("conn-uid"), Some(true), Some(true))
        );
        assert!(body["spec"].get("conflictPolicy").is_none());
    }
}
