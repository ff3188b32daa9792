//! The provider side's status writes: one server-side apply of a status as `kbind-issuer`, and
//! the memo that keeps a reconcile from writing again what it just wrote.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource};
use serde_json::json;

/// The field manager of the issuer's writes.
pub const FIELD_MANAGER: &str = "kbind-issuer";

/// A failed reconcile: the status write the API server refused or could not take.
#[derive(Debug, thiserror::Error)]
#[error("writing the status of {what}: {source}")]
pub struct Error {
    /// What was written.
    pub what: String,
    /// The API server's answer.
    #[source]
    pub source: kube::Error,
}

/// The status each object was last written with, and the resourceVersion the object had when
/// it was: until the cache shows a newer version of the object, a reconcile compares with what
/// was written, not with the cache's older status. (A second trigger arriving before the watch
/// event of the issuer's own write — a new CRD is announced twice, created and established —
/// would otherwise write the same status again — and, computed from the cache's older conditions
/// a moment later, with a later transition time: the times are left out of that comparison.) A
/// status changed by anyone else afterwards is a newer version, compared as it is.
#[derive(Default)]
pub struct Written(std::sync::Mutex<std::collections::HashMap<String, (Option<String>, String)>>);

impl Written {
    fn entries(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, (Option<String>, String)>>
    {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether `computed` must be written for the object `key` whose cached version is
    /// `version` with status `cached`.
    pub fn needed<T: serde::Serialize + PartialEq>(
        &self,
        key: &str,
        version: Option<&String>,
        cached: Option<&T>,
        computed: &T,
    ) -> bool {
        if cached == Some(computed) {
            return false;
        }
        let computed = timeless(computed);
        self.entries()
            .get(key)
            .is_none_or(|(at, status)| at.as_ref() != version || *status != computed)
    }

    /// Records that `status` was written to `key` while its cached version was `version`.
    pub fn wrote<T: serde::Serialize>(&self, key: &str, version: Option<&String>, status: &T) {
        let status = timeless(status);
        self.entries()
            .insert(key.to_owned(), (version.cloned(), status));
    }
}

/// `status` as JSON text without its conditions' `lastTransitionTime`s: what a status says, not
/// when it was computed.
fn timeless<T: serde::Serialize>(status: &T) -> String {
    fn strip(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                map.remove("lastTransitionTime");
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut value = serde_json::to_value(status).unwrap_or_default();
    strip(&mut value);
    value.to_string()
}

/// Now, as a condition's time.
pub fn now() -> Time {
    Time(jiff::Timestamp::now())
}

/// One server-side apply of `status` as the issuer's field manager.
pub async fn write_status<K>(
    client: &Client,
    name: &str,
    status: &impl serde::Serialize,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let body = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    Api::<K>::all(client.clone())
        .patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map(|_| ())
        .map_err(|source| Error {
            what: format!("{} {name}", K::kind(&())),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_just_written_is_not_written_again_from_a_cache_that_has_not_seen_it() {
        let written = Written::default();
        let rv = |v: &str| Some(v.to_owned());
        // The cache says "old"; "new" is computed and written while the object is at 1.
        assert!(written.needed("e", rv("1").as_ref(), Some(&"old"), &"new"));
        written.wrote("e", rv("1").as_ref(), &"new");
        // A second trigger before the write's own event: the cache still has 1 and "old".
        assert!(!written.needed("e", rv("1").as_ref(), Some(&"old"), &"new"));
        // The write's event: version 2 with "new".
        assert!(!written.needed("e", rv("2").as_ref(), Some(&"new"), &"new"));
        // Someone else rewrote the status (version 3): corrected, although "new" was written.
        assert!(written.needed("e", rv("3").as_ref(), Some(&"forged"), &"new"));
        // A new truth at the old version is written too.
        assert!(written.needed("e", rv("1").as_ref(), Some(&"old"), &"newer"));
        // Another object is its own.
        assert!(written.needed("f", rv("1").as_ref(), Some(&"old"), &"new"));
    }

    #[test]
    fn the_same_status_computed_a_second_later_from_the_old_cache_is_not_written_again() {
        // The catalog test once saw two writes of one Export 20 ms apart: the second trigger
        // computed the same condition from the cache's older status across a second boundary,
        // so with a later transition time.
        let condition = |status: &str, at: &str| {
            json!({ "conditions": [{ "type": "Offered", "status": status,
                "reason": "Exported", "message": "m", "lastTransitionTime": at }] })
        };
        let written = Written::default();
        let rv = Some("1".to_owned());
        let old = condition("False", "2026-12-07T02:40:00Z");
        let first = condition("True", "2026-12-07T02:47:04Z");
        assert!(written.needed("e", rv.as_ref(), Some(&old), &first));
        written.wrote("e", rv.as_ref(), &first);
        let again = condition("True", "2026-12-07T02:47:05Z");
        assert!(!written.needed("e", rv.as_ref(), Some(&old), &again));
        // What it says changed: written.
        let changed = condition("False", "2026-12-07T02:47:05Z");
        assert!(written.needed("e", rv.as_ref(), Some(&old), &changed));
    }
}
