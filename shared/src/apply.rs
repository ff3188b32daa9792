//! Server-side apply that only creates: ownership is decided on fresh facts.
//!
//! When kbind's cache shows no object under a name, a forced apply would silently take over an
//! object someone created in the instant the cache had not seen yet. A resourceVersion is a
//! precondition in an apply too, and a creation ignores it; so an apply carrying a
//! resourceVersion that no stored object can have creates the object when it is absent and is
//! answered `409 Conflict` when anything exists — then the caller classifies the object it finds,
//! and never forces. (Checked on kube-apiserver v1.36: the created object's managedFields hold an
//! `Apply` entry, so later applies still remove fields they drop.)

use serde_json::Value;

/// A resourceVersion no stored object ever has: etcd revisions count up from 1 and never reach
/// the largest unsigned 64-bit number.
pub const CREATE_ONLY_RESOURCE_VERSION: &str = "18446744073709551615";

/// Makes an apply `body` create-only (see the module documentation).
pub fn create_only(body: &mut Value) {
    if let Some(metadata) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.insert(
            "resourceVersion".into(),
            Value::String(CREATE_ONLY_RESOURCE_VERSION.into()),
        );
    }
}

/// Whether an apply made [`create_only`] was refused because something exists under the name.
pub fn exists(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.is_conflict())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sets_the_impossible_resource_version_and_nothing_else() {
        let mut body = json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "a", "namespace": "n" }, "data": { "k": "v" } });
        create_only(&mut body);
        assert_eq!(
            body,
            json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "a", "namespace": "n", "resourceVersion": CREATE_ONLY_RESOURCE_VERSION }, "data": { "k": "v" } })
        );
        assert_eq!(
            CREATE_ONLY_RESOURCE_VERSION.parse::<u64>().ok(),
            Some(u64::MAX)
        );
        let mut no_metadata = json!({ "kind": "x" });
        create_only(&mut no_metadata);
        assert_eq!(no_metadata, json!({ "kind": "x" }));
    }
}
