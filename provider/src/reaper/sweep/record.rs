//! The reaper's record ([`super::super::memory`]) kept where only the reaper writes: the
//! ConfigMap [`MEMORY_CONFIGMAP`] in its namespace, a key per policy, read once per term as
//! leader and written only when what must survive a restart changed.

use k8s_openapi::api::core::v1::ConfigMap;
use kbind_shared::sync::Locked;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::super::memory::Memory;
use super::{FIELD_MANAGER, Reaper};

/// The reaper's own ConfigMap (in its namespace) holding its record per policy: a key
/// `<policy>.json` each.
pub const MEMORY_CONFIGMAP: &str = "kbind-reaper-memory";

impl Reaper {
    /// Reads the record of `policy` from [`MEMORY_CONFIGMAP`] once per term as leader.
    pub(super) async fn restore(&self, policy: &str) -> Result<(), String> {
        if self.memory.locked().contains_key(policy) {
            return Ok(());
        }
        let maps: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let found = maps.get_opt(MEMORY_CONFIGMAP).await.map_err(|e| {
            format!(
                "read the reaper's record {}/{MEMORY_CONFIGMAP}: {e}",
                self.namespace
            )
        })?;
        let text = found
            .and_then(|m| m.data)
            .and_then(|mut d| d.remove(&memory_key(policy)));
        let memory = match text.as_deref().map(Memory::restore) {
            Some(Ok(memory)) => memory,
            Some(Err(error)) => {
                // Every grace starts afresh: longer, never shorter.
                tracing::warn!(policy, %error, "the reaper's record is unreadable; starting anew");
                Memory::default()
            }
            None => Memory::default(),
        };
        tracing::info!(
            policy,
            remembered = memory.len(),
            "the reaper's record read"
        );
        self.memory
            .locked()
            .insert(policy.to_owned(), (memory, text.unwrap_or_default()));
        Ok(())
    }

    /// Writes the record of `policy` when what must survive a restart changed.
    pub(super) async fn persist(&self, policy: &str) -> Result<(), String> {
        let text = {
            let memories = self.memory.locked();
            let Some((memory, written)) = memories.get(policy) else {
                return Ok(());
            };
            let text = memory.persisted();
            if text == *written || (written.is_empty() && text == "{}") {
                return Ok(());
            }
            text
        };
        let body = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": { "name": MEMORY_CONFIGMAP },
            "data": { memory_key(policy): text },
        });
        Api::<ConfigMap>::namespaced(self.client.clone(), &self.namespace)
            .patch(
                MEMORY_CONFIGMAP,
                &PatchParams::apply(&format!("{FIELD_MANAGER}-{policy}")).force(),
                &Patch::Apply(&body),
            )
            .await
            .map_err(|e| {
                format!(
                    "write the reaper's record {}/{MEMORY_CONFIGMAP}: {e}",
                    self.namespace
                )
            })?;
        if let Some((_, written)) = self.memory.locked().get_mut(policy) {
            *written = text;
        }
        Ok(())
    }
}

/// The data key of a policy's record in [`MEMORY_CONFIGMAP`].
fn memory_key(policy: &str) -> String {
    format!("{policy}.json")
}
