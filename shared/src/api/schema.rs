//! Schema adjustments that `schemars` cannot express from Rust types alone: CEL rules,
//! server-side-apply list semantics and string formats. Each is a `schemars` transform used with
//! `#[schemars(transform = …)]` beside the field it shapes.

use schemars::Schema;
use serde_json::{Value, json};

/// `<plural>.<group>`: lowercase DNS labels, at least one dot (API-B3, QRK-2).
pub const API_NAME_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$";

fn set(schema: &mut Schema, key: &str, value: Value) {
    schema.ensure_object().insert(key.to_owned(), value);
}

fn add_rule(schema: &mut Schema, rule: &str, message: &str) {
    let object = schema.ensure_object();
    let rules = object
        .entry("x-kubernetes-validations")
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(rules) = rules {
        rules.push(json!({ "rule": rule, "message": message }));
    }
}

/// API-C3: the whole `kubeconfigSecretRef` never changes after creation.
pub fn immutable_secret_ref(schema: &mut Schema) {
    add_rule(
        schema,
        "self == oldSelf",
        "kubeconfigSecretRef is immutable",
    );
}

/// A Grant is one consumer's credential for one Export: its Export and consumer never change
/// (an edit would leave the old boundary's credential working under a Grant that no longer names
/// it).
pub fn grant_target_immutable(schema: &mut Schema) {
    add_rule(
        schema,
        "self.export == oldSelf.export && self.consumer == oldSelf.consumer",
        "export and consumer are immutable: a Grant is one consumer's credential for one Export (create another Grant instead)",
    );
}

/// A Connection's boundary is set when it is created and never changes: its copies live in the
/// boundary's namespaces (a new boundary is a new Connection).
pub fn boundary_immutable(schema: &mut Schema) {
    add_rule(
        schema,
        "has(self.boundary) == has(oldSelf.boundary) && (!has(self.boundary) || self.boundary == oldSelf.boundary)",
        "boundary is immutable: the Connection's provider copies live in its namespaces (create another Connection instead)",
    );
}

/// A boundary: a DNS label short enough to leave 32 characters for the consumer namespace.
pub fn boundary_name(schema: &mut Schema) {
    set(schema, "pattern", json!(NAMESPACE_PATTERN));
    set(schema, "minLength", json!(1));
    set(schema, "maxLength", json!(30));
}

/// API-C6: a pinned cluster UID never changes, and cannot be dropped to get around that either
/// (a transition rule on the field itself would not run when the field is removed).
pub fn pinned_uids_immutable(schema: &mut Schema) {
    for field in ["remoteClusterUID", "localClusterUID"] {
        add_rule(
            schema,
            &format!(
                "!has(oldSelf.{field}) || oldSelf.{field} == '' || \
                 (has(self.{field}) && self.{field} == oldSelf.{field})"
            ),
            &format!("{field} is immutable once set"),
        );
    }
}

/// A list whose items are merged by their `name` (server-side apply) and must be unique by it.
pub fn list_map_by_name(schema: &mut Schema) {
    set(schema, "x-kubernetes-list-type", json!("map"));
    set(schema, "x-kubernetes-list-map-keys", json!(["name"]));
}

/// A list of `metav1.Condition`s, keyed by `type`.
pub fn list_map_by_type(schema: &mut Schema) {
    set(schema, "x-kubernetes-list-type", json!("map"));
    set(schema, "x-kubernetes-list-map-keys", json!(["type"]));
}

/// A list replaced as a whole by its single writer.
pub fn atomic_list(schema: &mut Schema) {
    set(schema, "x-kubernetes-list-type", json!("atomic"));
}

/// A list of unique scalars.
pub fn set_list(schema: &mut Schema) {
    set(schema, "x-kubernetes-list-type", json!("set"));
}

/// A map replaced as a whole by its single writer.
pub fn atomic_map(schema: &mut Schema) {
    set(schema, "x-kubernetes-map-type", json!("atomic"));
}

/// An exported API's name: `<plural>.<group>` (API-B3), validated unlike the reference (QRK-2).
pub fn api_name(schema: &mut Schema) {
    set(schema, "pattern", json!(API_NAME_PATTERN));
    set(schema, "minLength", json!(1));
    set(schema, "maxLength", json!(253));
}

/// A schema hash as kbind writes it: `sha256:` and the 64 lowercase hex digits of the digest. (The
/// 16-digit form of earlier versions is still accepted, so stored objects stay valid; it matches
/// no schema kbind serves now, and is pruned once it was applied.)
pub fn schema_hash(schema: &mut Schema) {
    set(
        schema,
        "pattern",
        json!("^sha256:([0-9a-f]{16}|[0-9a-f]{64})$"),
    );
    set(schema, "maxLength", json!(71));
}

/// A required, non-empty string.
pub fn non_empty(schema: &mut Schema) {
    set(schema, "minLength", json!(1));
}

/// The name of an object (a DNS subdomain: lowercase, at most 253 characters).
pub const OBJECT_NAME_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// A namespace name (a DNS label: at most 63 characters).
pub const NAMESPACE_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// An object name: a DNS subdomain.
pub fn object_name(schema: &mut Schema) {
    set(schema, "pattern", json!(OBJECT_NAME_PATTERN));
    set(schema, "minLength", json!(1));
    set(schema, "maxLength", json!(253));
}

/// A namespace name: a DNS label.
pub fn namespace_name(schema: &mut Schema) {
    set(schema, "pattern", json!(NAMESPACE_PATTERN));
    set(schema, "minLength", json!(1));
    set(schema, "maxLength", json!(63));
}

/// A Secret data key (empty: the default).
pub fn secret_key(schema: &mut Schema) {
    set(schema, "pattern", json!(r"^[-._a-zA-Z0-9]*$"));
    set(schema, "maxLength", json!(253));
}

/// A set of object names, bounded.
pub fn object_name_set(schema: &mut Schema) {
    set(schema, "x-kubernetes-list-type", json!("set"));
    set(schema, "maxItems", json!(1024));
    set(
        schema,
        "items",
        json!({ "type": "string", "minLength": 1, "maxLength": 253, "pattern": OBJECT_NAME_PATTERN }),
    );
}

/// A set of namespace names (DNS labels), bounded.
pub fn namespace_set(schema: &mut Schema) {
    set(schema, "x-kubernetes-list-type", json!("set"));
    set(schema, "maxItems", json!(256));
    set(
        schema,
        "items",
        json!({ "type": "string", "maxLength": 63 }),
    );
    add_rule(
        schema,
        "self.all(n, size(n) <= 63 && n.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'))",
        "each entry must be a namespace name (a DNS label)",
    );
}
