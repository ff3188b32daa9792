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

/// AUTO-1/AUTO-3: applies the ClusterBinding, or deletes it when nothing is exported — but only a
/// ClusterBinding this Connection controls (the reference deleted any with the name, QRK-6).
pub async fn reconcile(
    consumer: &Client,
    connection: &Connection,
    exports: &[ExportedApi],
) -> Result<(), String> {
    let bindings: Api<ClusterBinding> = Api::all(consumer.clone());
    let name = connection.name_any();
    if exports.is_empty() {
        if let Some(existing) = bindings
            .get_opt(&name)
            .await
            .map_err(|e| format!("read ClusterBinding {name}: {e}"))?
            && controlled_by(&existing, connection)
        {
            delete(consumer, &name).await?;
        }
        return Ok(());
    }
    bindings
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(desired(connection, exports)),
        )
        .await
        .map(drop)
        .map_err(|e| format!("apply autoBind ClusterBinding {name}: {e}"))
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
