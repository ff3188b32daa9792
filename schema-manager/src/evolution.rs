//! Schema evolution: whether a provider's schema change can be applied to the consumer CRD without
//! consent. [`breaking_changes`] compares the served CRD with the one kbind would install and lists
//! every change that can make an existing consumer object invalid or lose data; an empty list means
//! compatible (new optional fields, widened enums or bounds, descriptions, printer columns, short
//! names, new versions). [`invalid_under`] is the local structural check that counts the objects a
//! breaking change would affect. Pure functions over plain data; both bound their work, since a
//! provider's schema is hostile until checked.

use std::collections::BTreeSet;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinitionSpec;
use serde_json::Value;

/// The most breaking changes listed for one schema change (the rest are counted).
pub const MAX_LISTED: usize = 100;
/// How deep a schema is compared or an object checked; deeper parts are not looked at. Deeper
/// schemas cannot arrive: the provider's JSON is parsed with a nesting limit of 128, and each
/// schema level takes two (`properties`, then the field).
const MAX_DEPTH: usize = 64;
/// The longest validation rule quoted in a change.
const MAX_RULE_CHARS: usize = 80;

/// One change that needs consent: where, and what.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Breaking {
    /// `spec.size`, `spec.items[].name`, `spec.labels{}`; a version prefix (`v2: spec.size`) when
    /// the CRD has several; `<scope>`/`<versions>` for CRD-level changes.
    pub path: String,
    /// What changed, e.g. `type string → integer`.
    pub change: String,
}

impl std::fmt::Display for Breaking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.change)
    }
}

/// The breaking changes from the served CRD `old` to the desired `new` (empty: compatible), sorted,
/// at most [`MAX_LISTED`] plus how many more there were.
pub fn breaking_changes(
    old: &CustomResourceDefinitionSpec,
    new: &CustomResourceDefinitionSpec,
) -> (Vec<Breaking>, usize) {
    let mut out = Out::default();
    if old.scope != new.scope {
        out.push("<scope>", format!("scope {} → {}", old.scope, new.scope));
    }
    if old.names.kind != new.names.kind {
        out.push(
            "<names>",
            format!("kind {} → {}", old.names.kind, new.names.kind),
        );
    }
    let prefix = new.versions.len() > 1 || old.versions.len() > 1;
    for version in old.versions.iter().filter(|v| v.served) {
        let Some(next) = new
            .versions
            .iter()
            .find(|v| v.name == version.name && v.served)
        else {
            out.push(
                "<versions>",
                format!("version {} is no longer served", version.name),
            );
            continue;
        };
        let root = if prefix {
            format!("{}: ", version.name)
        } else {
            String::new()
        };
        let (a, b) = (
            schema_of(version.schema.as_ref()),
            schema_of(next.schema.as_ref()),
        );
        compare(&root, &a, &b, 0, &mut out);
        let had_status = version
            .subresources
            .as_ref()
            .is_some_and(|s| s.status.is_some());
        let has_status = next
            .subresources
            .as_ref()
            .is_some_and(|s| s.status.is_some());
        if had_status && !has_status {
            out.push(
                &format!("{root}status"),
                "the status subresource is removed".into(),
            );
        }
        // Added, the main resource stops taking status: what writers send there is dropped.
        if !had_status && has_status {
            out.push(
                &format!("{root}status"),
                "the status subresource is added (status written with the object is dropped)"
                    .into(),
            );
        }
        let scale = |v: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinitionVersion| {
            v.subresources.as_ref().and_then(|s| s.scale.clone())
        };
        match (scale(version), scale(next)) {
            (Some(_), None) => out.push(
                &format!("{root}scale"),
                "the scale subresource is removed".into(),
            ),
            (Some(a), Some(b)) if a != b => out.push(
                &format!("{root}scale"),
                format!(
                    "the scale subresource's paths change ({} → {})",
                    a.spec_replicas_path, b.spec_replicas_path
                ),
            ),
            _ => {}
        }
    }
    let storage = |spec: &CustomResourceDefinitionSpec| {
        spec.versions
            .iter()
            .find(|v| v.storage)
            .map(|v| (v.name.clone(), schema_of(v.schema.as_ref())))
    };
    if let (Some((old_name, old_schema)), Some((new_name, new_schema))) =
        (storage(old), storage(new))
        && old_name != new_name
        && !same_structure(&old_schema, &new_schema)
    {
        out.push(
            "<versions>",
            format!("storage version {old_name} → {new_name}, whose schemas differ (not lossless)"),
        );
    }
    out.finish()
}

/// #36: whether a route's provider schema agrees with the schema served on the consumer, so that
/// objects routed there can be written as they are: every object valid under `served` must stay
/// valid and whole under `route` (no breaking change from one to the other). A route that adds
/// optional fields agrees; one that drops, narrows or retypes a field does not, and the message
/// names the first changes.
pub fn route_agreement(
    served: &CustomResourceDefinitionSpec,
    route: &CustomResourceDefinitionSpec,
) -> kbind_shared::routing::Schema {
    let (listed, more) = breaking_changes(served, route);
    if listed.is_empty() {
        return kbind_shared::routing::Schema::Agrees;
    }
    let mut message = listed
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    if more > 0 {
        message.push_str(&format!(" (and {more} more)"));
    }
    kbind_shared::routing::Schema::Mismatch(message)
}

/// Whether two version schemas are identical for storage: the same document once descriptions
/// (which never change what is stored) are set aside.
pub fn same_structure(a: &Value, b: &Value) -> bool {
    strip_descriptions(a) == strip_descriptions(b)
}

fn strip_descriptions(v: &Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| !matches!(k.as_str(), "description" | "example" | "title"))
                .map(|(k, v)| (k.clone(), strip_descriptions(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip_descriptions).collect()),
        other => other.clone(),
    }
}

fn schema_of(
    validation: Option<&k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceValidation>,
) -> Value {
    validation
        .and_then(|v| v.open_api_v3_schema.as_ref())
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or(Value::Null)
}

#[derive(Default)]
struct Out {
    listed: BTreeSet<Breaking>,
    more: usize,
}

impl Out {
    fn push(&mut self, path: &str, change: String) {
        if self.listed.len() < MAX_LISTED {
            self.listed.insert(Breaking {
                path: path.to_owned(),
                change,
            });
        } else {
            self.more += 1;
        }
    }

    fn finish(self) -> (Vec<Breaking>, usize) {
        (self.listed.into_iter().collect(), self.more)
    }
}

fn join(base: &str, name: &str) -> String {
    if base.is_empty() || base.ends_with(": ") {
        format!("{base}{name}")
    } else {
        format!("{base}.{name}")
    }
}

/// The path as shown: the root of a version is `(root)`.
fn shown(path: &str) -> String {
    if path.is_empty() || path.ends_with(": ") {
        format!("{path}(root)")
    } else {
        path.to_owned()
    }
}

fn truthy(v: &Value, key: &str) -> bool {
    v.get(key).and_then(Value::as_bool).unwrap_or(false)
}

fn compare(path: &str, old: &Value, new: &Value, depth: usize, out: &mut Out) {
    if depth > MAX_DEPTH || !old.is_object() || !new.is_object() {
        return;
    }
    let here = shown(path);
    match (old.get("type"), new.get("type")) {
        (Some(a), Some(b)) if a != b => {
            out.push(&here, format!("type {} → {}", text(a), text(b)));
            // Everything below is of another kind now: one change says it.
            return;
        }
        (None, Some(b)) if !truthy(old, "x-kubernetes-int-or-string") => {
            out.push(&here, format!("type (any) → {}", text(b)));
            return;
        }
        _ => {}
    }
    for flag in ["nullable", "x-kubernetes-int-or-string"] {
        if truthy(old, flag) && !truthy(new, flag) {
            out.push(&here, format!("{flag} is no longer allowed"));
        }
    }
    if truthy(old, "x-kubernetes-preserve-unknown-fields")
        && !truthy(new, "x-kubernetes-preserve-unknown-fields")
    {
        out.push(&here, "unknown fields are no longer preserved".into());
    }
    if truthy(new, "x-kubernetes-embedded-resource")
        && !truthy(old, "x-kubernetes-embedded-resource")
    {
        out.push(
            &here,
            "x-kubernetes-embedded-resource added (apiVersion, kind and metadata now required and checked)"
                .into(),
        );
    }
    // A default fills (or, changed, refills) what is stored when objects are read and written.
    match (old.get("default"), new.get("default")) {
        (None, Some(b)) => out.push(
            &here,
            format!("default added: {}", short(&text(b), MAX_RULE_CHARS)),
        ),
        (Some(a), None) => out.push(
            &here,
            format!("default removed (was {})", short(&text(a), MAX_RULE_CHARS)),
        ),
        (Some(a), Some(b)) if a != b => out.push(
            &here,
            format!(
                "default {} → {}",
                short(&text(a), MAX_RULE_CHARS),
                short(&text(b), MAX_RULE_CHARS)
            ),
        ),
        _ => {}
    }
    // Composition constrains values in ways no other keyword shows: any change may reject.
    for key in ["allOf", "anyOf", "oneOf", "not"] {
        match (old.get(key), new.get(key)) {
            (None, Some(_)) => out.push(&here, format!("{key} added")),
            (Some(a), Some(b)) if strip_descriptions(a) != strip_descriptions(b) => {
                out.push(&here, format!("{key} changed"))
            }
            _ => {}
        }
    }
    if let Some(values) = new.get("enum").and_then(Value::as_array) {
        match old.get("enum").and_then(Value::as_array) {
            None => out.push(&here, format!("enum added: {}", list(values))),
            Some(before) => {
                let removed: Vec<Value> = before
                    .iter()
                    .filter(|v| !values.contains(v))
                    .cloned()
                    .collect();
                if !removed.is_empty() {
                    out.push(&here, format!("enum narrowed: {} removed", list(&removed)));
                }
            }
        }
    }
    for key in ["pattern", "format"] {
        if let Some(b) = new.get(key)
            && old.get(key) != Some(b)
        {
            let before = old.get(key).map(text).unwrap_or_else(|| "(none)".into());
            out.push(&here, format!("{key} {before} → {}", text(b)));
        }
    }
    if let Some(b) = new.get("multipleOf")
        && old.get("multipleOf") != Some(b)
    {
        out.push(&here, format!("multipleOf → {}", text(b)));
    }
    for key in ["minimum", "minLength", "minItems", "minProperties"] {
        bound(&here, key, old, new, |before, after| after > before, out);
    }
    for key in ["maximum", "maxLength", "maxItems", "maxProperties"] {
        bound(&here, key, old, new, |before, after| after < before, out);
    }
    for key in ["exclusiveMinimum", "exclusiveMaximum"] {
        if truthy(new, key) && !truthy(old, key) {
            out.push(&here, format!("{key} added"));
        }
    }
    for key in [
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
    ] {
        if old.get(key) != new.get(key) && new.get(key).is_some() {
            let before = old.get(key).map(text).unwrap_or_else(|| "(none)".into());
            out.push(&here, format!("{key} {before} → {}", text(&new[key])));
        }
    }
    let rules = |v: &Value| -> Vec<String> {
        v.get("x-kubernetes-validations")
            .and_then(Value::as_array)
            .map(|rules| {
                rules
                    .iter()
                    .filter_map(|r| r.get("rule").and_then(Value::as_str).map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let before = rules(old);
    for rule in rules(new).iter().filter(|r| !before.contains(r)) {
        out.push(
            &here,
            format!("validation rule added: {}", short(rule, MAX_RULE_CHARS)),
        );
    }

    let names = |v: &Value, key: &str| -> BTreeSet<String> {
        v.get(key)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    let empty = serde_json::Map::new();
    let old_properties = old
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let new_properties = new
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let required_before = names(old, "required");
    for field in names(new, "required").difference(&required_before) {
        // The API server fills a missing field that has a default before validating it.
        if !defaulted(new_properties, field) {
            out.push(&join(path, field), "newly required".into());
        }
    }
    let keeps_unknown = truthy(new, "x-kubernetes-preserve-unknown-fields");
    // kbind's own delivery record is not the provider's schema: adding it never waits.
    let ours = |field: &str| {
        field == kbind_shared::delivery::FIELD && (path == "status" || path.ends_with(": status"))
    };
    if truthy(old, "x-kubernetes-preserve-unknown-fields") {
        // Under preserved unknown fields an undeclared field could hold anything: declaring it
        // constrains values that are already stored.
        for (field, after) in new_properties {
            if !old_properties.contains_key(field) && !unconstrained(after) && !ours(field) {
                out.push(
                    &join(path, field),
                    "now declared (it could hold any value before)".into(),
                );
            }
        }
    }
    for (field, before) in old_properties {
        match new_properties.get(field) {
            Some(after) => compare(&join(path, field), before, after, depth + 1, out),
            None if keeps_unknown || ours(field) => {}
            None => out.push(
                &join(path, field),
                "removed (its data would be pruned)".into(),
            ),
        }
    }
    if let (Some(a), Some(b)) = (old.get("items"), new.get("items")) {
        compare(&format!("{}[]", shown(path)), a, b, depth + 1, out);
    }
    match (
        old.get("additionalProperties"),
        new.get("additionalProperties"),
    ) {
        (Some(a @ Value::Object(_)), Some(b @ Value::Object(_))) => {
            compare(&format!("{}{{}}", shown(path)), a, b, depth + 1, out);
        }
        (Some(Value::Bool(true)) | Some(Value::Object(_)), Some(Value::Bool(false))) => {
            out.push(&here, "additional properties are no longer allowed".into());
        }
        // Without it (and without preserved unknown fields) every map key is pruned.
        (Some(Value::Bool(true)) | Some(Value::Object(_)), None) if !keeps_unknown => {
            out.push(
                &here,
                "additionalProperties removed (every map key would be pruned)".into(),
            );
        }
        _ => {}
    }
}

/// A schema that accepts any value (only descriptions, or preserved unknown fields and nothing else).
fn unconstrained(schema: &Value) -> bool {
    schema.as_object().is_some_and(|m| {
        m.iter().all(|(k, v)| {
            matches!(k.as_str(), "description" | "title" | "example")
                || (k == "x-kubernetes-preserve-unknown-fields" && v == &Value::Bool(true))
        })
    })
}

fn defaulted(properties: &serde_json::Map<String, Value>, field: &str) -> bool {
    properties
        .get(field)
        .is_some_and(|p| p.get("default").is_some())
}

fn bound(
    here: &str,
    key: &str,
    old: &Value,
    new: &Value,
    tighter: fn(f64, f64) -> bool,
    out: &mut Out,
) {
    let Some(after) = new.get(key).and_then(Value::as_f64) else {
        return;
    };
    match old.get(key).and_then(Value::as_f64) {
        None => out.push(here, format!("{key} {} added", number(after))),
        Some(before) if tighter(before, after) => out.push(
            here,
            format!("{key} {} → {}", number(before), number(after)),
        ),
        Some(_) => {}
    }
}

/// A bound as a schema states it: Rust shows a whole `f64` without a fraction (`3`, not `3.0`).
fn number(n: f64) -> String {
    n.to_string()
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => short(s, MAX_RULE_CHARS),
        other => short(&other.to_string(), MAX_RULE_CHARS),
    }
}

fn list(values: &[Value]) -> String {
    let shown: Vec<String> = values.iter().take(10).map(text).collect();
    let more = values.len().saturating_sub(10);
    if more > 0 {
        format!("[{}, … {more} more]", shown.join(", "))
    } else {
        format!("[{}]", shown.join(", "))
    }
}

fn short(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(max).collect::<String>())
    }
}

/// Whether `object` (a whole consumer object) holds data that `schema` would prune: a field no
/// declared property, `additionalProperties` schema or `x-kubernetes-preserve-unknown-fields`
/// keeps. The API server drops such data silently (on write, and when it reads stored objects),
/// so it is lost without any object being rejected (#33.5).
pub fn pruned_under(object: &Value, schema: &Value) -> bool {
    let Some(fields) = object.as_object() else {
        return false;
    };
    fields.iter().any(|(name, value)| {
        !matches!(name.as_str(), "metadata" | "apiVersion" | "kind")
            && loses(name, value, schema, 0)
    })
}

/// Whether the field `name` holding `value`, in an object described by `parent`, loses data.
fn loses(name: &str, value: &Value, parent: &Value, depth: usize) -> bool {
    if depth > MAX_DEPTH || truthy(parent, "x-kubernetes-preserve-unknown-fields") {
        return false;
    }
    let declared = parent
        .get("properties")
        .and_then(Value::as_object)
        .and_then(|p| p.get(name));
    let schema = match (declared, parent.get("additionalProperties")) {
        (Some(schema), _) => schema,
        (None, Some(schema @ Value::Object(_))) => schema,
        (None, Some(Value::Bool(true))) => return false,
        (None, _) => return true,
    };
    match value {
        Value::Object(fields) => fields.iter().any(|(n, v)| loses(n, v, schema, depth + 1)),
        Value::Array(items) => schema.get("items").is_some_and(|item| {
            items.iter().any(|i| match i {
                Value::Object(fields) => fields.iter().any(|(n, v)| loses(n, v, item, depth + 1)),
                _ => false,
            })
        }),
        _ => false,
    }
}

/// The local structural check: whether `object` (a whole consumer object) is invalid under
/// `schema` (a version's `openAPIV3Schema`) by type, required fields, enum, numeric and length
/// bounds, nullability and unknown fields in a closed object. `pattern`, `format` and CEL rules are
/// not evaluated here (an object is then counted only by what is checked). `metadata`, `apiVersion`
/// and `kind` are the API server's, never checked.
pub fn invalid_under(object: &Value, schema: &Value) -> bool {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return false;
    };
    let Some(fields) = object.as_object() else {
        return true;
    };
    let required = schema
        .get("required")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for name in required.iter().filter_map(Value::as_str) {
        if !matches!(name, "metadata" | "apiVersion" | "kind")
            && !fields.contains_key(name)
            && !defaulted(properties, name)
        {
            return true;
        }
    }
    fields.iter().any(|(name, value)| {
        !matches!(name.as_str(), "metadata" | "apiVersion" | "kind")
            && properties.get(name).is_some_and(|s| violates(value, s, 1))
    })
}

fn violates(value: &Value, schema: &Value, depth: usize) -> bool {
    if depth > MAX_DEPTH || !schema.is_object() {
        return false;
    }
    if value.is_null() {
        return !truthy(schema, "nullable");
    }
    if truthy(schema, "x-kubernetes-int-or-string") {
        return !(value.is_i64() || value.is_u64() || value.is_string());
    }
    let kind_ok = match schema.get("type").and_then(Value::as_str) {
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        Some("array") => value.is_array(),
        Some("object") => value.is_object(),
        _ => true,
    };
    if !kind_ok {
        return true;
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array)
        && !values.contains(value)
    {
        return true;
    }
    let limit = |key: &str| schema.get(key).and_then(Value::as_f64);
    let below = |key: &str, n: f64| limit(key).is_some_and(|m| n < m);
    let above = |key: &str, n: f64| limit(key).is_some_and(|m| n > m);
    match value {
        Value::Number(n) => {
            let n = n.as_f64().unwrap_or(0.0);
            if below("minimum", n) || above("maximum", n) {
                return true;
            }
        }
        Value::String(s) => {
            let n = s.chars().count() as f64;
            if below("minLength", n) || above("maxLength", n) {
                return true;
            }
        }
        Value::Array(items) => {
            let n = items.len() as f64;
            if below("minItems", n) || above("maxItems", n) {
                return true;
            }
            if let Some(item) = schema.get("items") {
                return items.iter().any(|i| violates(i, item, depth + 1));
            }
        }
        Value::Object(fields) => {
            let n = fields.len() as f64;
            if below("minProperties", n) || above("maxProperties", n) {
                return true;
            }
            let required = schema
                .get("required")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let properties = schema.get("properties").and_then(Value::as_object);
            let empty = serde_json::Map::new();
            if required
                .iter()
                .filter_map(Value::as_str)
                .any(|r| !fields.contains_key(r) && !defaulted(properties.unwrap_or(&empty), r))
            {
                return true;
            }
            let additional = schema.get("additionalProperties");
            let open = truthy(schema, "x-kubernetes-preserve-unknown-fields");
            for (name, field) in fields {
                match (properties.and_then(|p| p.get(name)), additional) {
                    (Some(s), _) => {
                        if violates(field, s, depth + 1) {
                            return true;
                        }
                    }
                    (None, Some(a @ Value::Object(_))) => {
                        if violates(field, a, depth + 1) {
                            return true;
                        }
                    }
                    // A closed object: an unknown field is pruned on write, not rejected.
                    _ => {
                        let _ = open;
                    }
                }
            }
        }
        _ => {}
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec_with(versions: Value) -> CustomResourceDefinitionSpec {
        serde_json::from_value(json!({
            "group": "example.org",
            "names": { "kind": "Widget", "plural": "widgets" },
            "scope": "Namespaced",
            "versions": versions,
        }))
        .unwrap()
    }

    fn one(schema: Value) -> CustomResourceDefinitionSpec {
        spec_with(json!([{ "name": "v1", "served": true, "storage": true,
            "schema": { "openAPIV3Schema": schema } }]))
    }

    /// A Widget schema whose `spec` has the given properties and extra keywords.
    fn widget(spec_properties: Value, spec_extra: Value) -> Value {
        let mut spec = json!({ "type": "object", "properties": spec_properties });
        if let (Some(s), Some(extra)) = (spec.as_object_mut(), spec_extra.as_object()) {
            s.extend(extra.clone());
        }
        json!({ "type": "object", "properties": { "spec": spec,
            "status": { "type": "object", "x-kubernetes-preserve-unknown-fields": true } } })
    }

    fn changes(old: Value, new: Value) -> Vec<String> {
        let (listed, more) = breaking_changes(&one(old), &one(new));
        assert_eq!(more, 0);
        listed.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_route_agrees_when_every_served_object_fits_it() {
        use kbind_shared::routing::Schema;
        let served = one(widget(
            json!({ "size": { "type": "integer" }, "color": { "type": "string" } }),
            json!({}),
        ));
        let same = served.clone();
        let wider = one(widget(
            json!({ "size": { "type": "integer" }, "color": { "type": "string" },
                    "shape": { "type": "string" } }),
            json!({}),
        ));
        let narrower = one(widget(json!({ "size": { "type": "integer" } }), json!({})));
        let retyped = one(widget(
            json!({ "size": { "type": "string" }, "color": { "type": "string" } }),
            json!({}),
        ));
        assert_eq!(route_agreement(&served, &same), Schema::Agrees);
        assert_eq!(route_agreement(&served, &wider), Schema::Agrees);
        for (name, route, names) in [
            ("a field dropped", &narrower, "spec.color"),
            ("a field retyped", &retyped, "spec.size"),
        ] {
            match route_agreement(&served, route) {
                Schema::Mismatch(message) => assert!(message.contains(names), "{name}: {message}"),
                Schema::Agrees => panic!("{name}: agreed"),
            }
        }
    }

    #[test]
    fn classification_table() {
        let base = || {
            widget(
                json!({ "size": { "type": "integer" }, "color": { "type": "string", "enum": ["red", "blue"] } }),
                json!({}),
            )
        };
        let with = |props: Value, extra: Value| {
            let mut p = json!({ "size": { "type": "integer" }, "color": { "type": "string", "enum": ["red", "blue"] } });
            if let (Some(m), Some(add)) = (p.as_object_mut(), props.as_object()) {
                for (k, v) in add {
                    m.insert(k.clone(), v.clone());
                }
            }
            widget(p, extra)
        };
        let cases: Vec<(&str, Value, Vec<&str>)> = vec![
            // Compatible.
            ("identical", base(), vec![]),
            (
                "new optional field",
                with(json!({ "shape": { "type": "string" } }), json!({})),
                vec![],
            ),
            (
                "enum widened",
                with(
                    json!({ "color": { "type": "string", "enum": ["red", "blue", "green"] } }),
                    json!({}),
                ),
                vec![],
            ),
            (
                "description changed",
                with(
                    json!({ "size": { "type": "integer", "description": "how big" } }),
                    json!({}),
                ),
                vec![],
            ),
            (
                "maximum added",
                with(
                    json!({ "size": { "type": "integer", "maximum": 10 } }),
                    json!({}),
                ),
                vec!["spec.size: maximum 10 added"],
            ),
            (
                "enum removed",
                with(json!({ "color": { "type": "string" } }), json!({})),
                vec![],
            ),
            // Breaking.
            (
                "new required field",
                with(
                    json!({ "shape": { "type": "string" } }),
                    json!({ "required": ["shape"] }),
                ),
                vec!["spec.shape: newly required"],
            ),
            (
                "new required field with a default",
                with(
                    json!({ "shape": { "type": "string", "default": "round" } }),
                    json!({ "required": ["shape"] }),
                ),
                vec![],
            ),
            (
                "existing field now required",
                with(json!({}), json!({ "required": ["size"] })),
                vec!["spec.size: newly required"],
            ),
            (
                "type change",
                with(json!({ "size": { "type": "string" } }), json!({})),
                vec!["spec.size: type integer → string"],
            ),
            (
                "field removed",
                widget(json!({ "size": { "type": "integer" } }), json!({})),
                vec!["spec.color: removed (its data would be pruned)"],
            ),
            (
                "enum narrowed",
                with(
                    json!({ "color": { "type": "string", "enum": ["red"] } }),
                    json!({}),
                ),
                vec!["spec.color: enum narrowed: [blue] removed"],
            ),
            (
                "enum added",
                with(
                    json!({ "size": { "type": "integer", "enum": [1, 2] } }),
                    json!({}),
                ),
                vec!["spec.size: enum added: [1, 2]"],
            ),
            (
                "pattern added",
                with(
                    json!({ "color": { "type": "string", "enum": ["red", "blue"], "pattern": "^r" } }),
                    json!({}),
                ),
                vec!["spec.color: pattern (none) → ^r"],
            ),
            (
                "minimum added",
                with(
                    json!({ "size": { "type": "integer", "minimum": 1 } }),
                    json!({}),
                ),
                vec!["spec.size: minimum 1 added"],
            ),
            (
                "maxLength added",
                with(
                    json!({ "color": { "type": "string", "enum": ["red", "blue"], "maxLength": 3 } }),
                    json!({}),
                ),
                vec!["spec.color: maxLength 3 added"],
            ),
            (
                "validation rule added",
                with(
                    json!({}),
                    json!({ "x-kubernetes-validations": [{ "rule": "self.size > 0" }] }),
                ),
                vec!["spec: validation rule added: self.size > 0"],
            ),
            (
                "fields folded into preserved unknown fields",
                widget(
                    json!({}),
                    json!({ "x-kubernetes-preserve-unknown-fields": true }),
                ),
                vec![],
            ),
        ];
        for (name, new, expected) in cases {
            assert_eq!(changes(base(), new), expected, "{name}");
        }
        // The same tightenings the other way round are compatible.
        let bounded = with(
            json!({ "size": { "type": "integer", "minimum": 1, "maximum": 10 } }),
            json!({}),
        );
        let looser = with(
            json!({ "size": { "type": "integer", "minimum": 0, "maximum": 100 } }),
            json!({}),
        );
        assert_eq!(
            changes(bounded.clone(), looser.clone()),
            Vec::<String>::new(),
            "bounds widened"
        );
        assert_eq!(
            changes(looser, bounded),
            vec!["spec.size: maximum 100 → 10", "spec.size: minimum 0 → 1"],
            "bounds narrowed"
        );
        let open = json!({ "type": "object", "properties": { "spec": { "type": "object", "x-kubernetes-preserve-unknown-fields": true } } });
        let closed = json!({ "type": "object", "properties": { "spec": { "type": "object" } } });
        assert_eq!(
            changes(open.clone(), closed.clone()),
            vec!["spec: unknown fields are no longer preserved"]
        );
        assert_eq!(
            changes(closed, open),
            Vec::<String>::new(),
            "opening an object"
        );
        let nullable = widget(
            json!({ "size": { "type": "integer", "nullable": true } }),
            json!({}),
        );
        let not_null = widget(json!({ "size": { "type": "integer" } }), json!({}));
        assert_eq!(
            changes(nullable, not_null),
            vec!["spec.size: nullable is no longer allowed"]
        );
        let list = |item: Value| {
            widget(
                json!({ "items": { "type": "array", "items": item } }),
                json!({}),
            )
        };
        assert_eq!(
            changes(
                list(json!({ "type": "string" })),
                list(json!({ "type": "integer" }))
            ),
            vec!["spec.items[]: type string → integer"],
            "an array's items"
        );
        let map = |value: Value| {
            widget(
                json!({ "labels": { "type": "object", "additionalProperties": value } }),
                json!({}),
            )
        };
        assert_eq!(
            changes(
                map(json!({ "type": "string", "maxLength": 10 })),
                map(json!({ "type": "string", "maxLength": 5 }))
            ),
            vec!["spec.labels{}: maxLength 10 → 5"],
            "a map's values"
        );
    }

    #[test]
    fn changes_that_prune_reject_or_refill_data_are_breaking() {
        // #33.5: each of these was applied under `Always` without consent.
        let spec = |props: Value| widget(props, json!({}));
        let map_of = |values: Value| json!({ "labels": { "type": "object", "additionalProperties": values } });
        let cases: Vec<(&str, Value, Value, Vec<&str>)> = vec![
            (
                "additionalProperties removed",
                spec(map_of(json!({ "type": "string" }))),
                spec(json!({ "labels": { "type": "object" } })),
                vec!["spec.labels: additionalProperties removed (every map key would be pruned)"],
            ),
            (
                "additionalProperties true removed",
                spec(json!({ "labels": { "type": "object", "additionalProperties": true } })),
                spec(json!({ "labels": { "type": "object" } })),
                vec!["spec.labels: additionalProperties removed (every map key would be pruned)"],
            ),
            (
                "enum narrowed inside additionalProperties",
                spec(map_of(json!({ "type": "string", "enum": ["a", "b"] }))),
                spec(map_of(json!({ "type": "string", "enum": ["a"] }))),
                vec!["spec.labels{}: enum narrowed: [b] removed"],
            ),
            (
                "required inside an array item",
                spec(
                    json!({ "ports": { "type": "array", "items": { "type": "object", "properties": { "port": { "type": "integer" } } } } }),
                ),
                spec(
                    json!({ "ports": { "type": "array", "items": { "type": "object", "required": ["port"], "properties": { "port": { "type": "integer" } } } } }),
                ),
                vec!["spec.ports[].port: newly required"],
            ),
            (
                "allOf added",
                spec(json!({ "size": { "type": "integer" } })),
                spec(json!({ "size": { "type": "integer", "allOf": [{ "minimum": 1 }] } })),
                vec!["spec.size: allOf added"],
            ),
            (
                "anyOf changed",
                spec(json!({ "size": { "type": "integer", "anyOf": [{ "minimum": 1 }] } })),
                spec(json!({ "size": { "type": "integer", "anyOf": [{ "minimum": 5 }] } })),
                vec!["spec.size: anyOf changed"],
            ),
            (
                "oneOf and not added",
                spec(json!({ "size": { "type": "integer" } })),
                spec(
                    json!({ "size": { "type": "integer", "oneOf": [{ "minimum": 1 }], "not": { "maximum": 0 } } }),
                ),
                vec!["spec.size: not added", "spec.size: oneOf added"],
            ),
            (
                "embedded resource added",
                spec(
                    json!({ "template": { "type": "object", "x-kubernetes-preserve-unknown-fields": true } }),
                ),
                spec(
                    json!({ "template": { "type": "object", "x-kubernetes-preserve-unknown-fields": true, "x-kubernetes-embedded-resource": true } }),
                ),
                vec![
                    "spec.template: x-kubernetes-embedded-resource added (apiVersion, kind and metadata now required and checked)",
                ],
            ),
            (
                "default added",
                spec(json!({ "size": { "type": "integer" } })),
                spec(json!({ "size": { "type": "integer", "default": 3 } })),
                vec!["spec.size: default added: 3"],
            ),
            (
                "default changed",
                spec(json!({ "size": { "type": "integer", "default": 3 } })),
                spec(json!({ "size": { "type": "integer", "default": 4 } })),
                vec!["spec.size: default 3 → 4"],
            ),
            (
                "default removed",
                spec(json!({ "size": { "type": "integer", "default": 3 } })),
                spec(json!({ "size": { "type": "integer" } })),
                vec!["spec.size: default removed (was 3)"],
            ),
            (
                "composition unchanged but re-described",
                spec(json!({ "size": { "type": "integer", "allOf": [{ "minimum": 1 }] } })),
                spec(
                    json!({ "size": { "type": "integer", "allOf": [{ "minimum": 1, "description": "at least one" }] } }),
                ),
                vec![],
            ),
        ];
        for (what, old, new, want) in cases {
            assert_eq!(changes(old, new), want, "{what}");
        }
    }

    #[test]
    fn objects_whose_data_would_be_pruned_are_found() {
        let schema = widget(
            json!({
                "size": { "type": "integer" },
                "labels": { "type": "object", "additionalProperties": { "type": "string" } },
                "ports": { "type": "array", "items": { "type": "object", "properties": { "port": { "type": "integer" } } } },
                "free": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
            }),
            json!({}),
        );
        let object = |spec: Value| json!({ "apiVersion": "example.org/v1", "kind": "Widget", "metadata": { "name": "w", "labels": { "x": "y" } }, "spec": spec, "status": { "anything": 1 } });
        for (spec, pruned) in [
            (json!({ "size": 1 }), false),
            (json!({ "size": 1, "colour": "red" }), true),
            (json!({ "labels": { "a": "b", "c": "d" } }), false),
            (json!({ "ports": [{ "port": 80 }] }), false),
            (json!({ "ports": [{ "port": 80, "name": "http" }] }), true),
            (json!({ "free": { "deep": { "er": 1 } } }), false),
        ] {
            assert_eq!(
                pruned_under(&object(spec.clone()), &schema),
                pruned,
                "{spec}"
            );
        }
        // A map whose additionalProperties went away: every key would be pruned.
        let closed_map = widget(json!({ "labels": { "type": "object" } }), json!({}));
        assert!(pruned_under(
            &object(json!({ "labels": { "a": "b" } })),
            &closed_map
        ));
    }

    #[test]
    fn untyped_fields_junk_and_depth() {
        let field = |schema: Value| widget(json!({ "x": schema }), json!({}));
        // An untyped field that gains a type is breaking; one that allowed int-or-string says
        // that instead.
        assert_eq!(
            changes(field(json!({})), field(json!({ "type": "integer" }))),
            ["spec.x: type (any) → integer"]
        );
        assert_eq!(
            changes(
                field(json!({ "x-kubernetes-int-or-string": true })),
                field(json!({ "type": "integer" }))
            ),
            ["spec.x: x-kubernetes-int-or-string is no longer allowed"]
        );
        // A schema that is not an object (no typed CRD holds one) is not compared.
        let compared = |old: Value, new: Value| {
            let mut out = Out::default();
            compare("spec.x", &old, &new, 0, &mut out);
            out.finish().0.len()
        };
        assert_eq!(compared(json!({}), json!({ "type": "string" })), 1);
        assert_eq!(compared(json!("junk"), json!({ "type": "string" })), 0);
        assert_eq!(
            compared(json!({ "type": "string", "nullable": true }), json!(7)),
            0
        );
        assert_eq!(
            compared(json!({ "type": "string" }), json!({ "type": "integer" })),
            1
        );
        // Nesting deeper than MAX_DEPTH is not compared (a bound on the work); at MAX_DEPTH it is.
        let nested = |levels: usize, leaf: &str| {
            let mut schema = json!({ "type": leaf });
            for _ in 0..levels {
                schema = json!({ "type": "object", "properties": { "n": schema } });
            }
            schema
        };
        assert_eq!(
            changes(nested(MAX_DEPTH, "integer"), nested(MAX_DEPTH, "string")).len(),
            1
        );
        assert!(
            changes(
                nested(MAX_DEPTH + 1, "integer"),
                nested(MAX_DEPTH + 1, "string")
            )
            .is_empty()
        );
        // Every way down counts a level: list items and map values too.
        for key in ["items", "additionalProperties"] {
            let nested = |levels: usize, leaf: &str| {
                let mut schema = json!({ "type": leaf });
                for _ in 0..levels {
                    schema = json!({ "type": "object", key: schema });
                }
                schema
            };
            assert_eq!(
                changes(nested(MAX_DEPTH, "integer"), nested(MAX_DEPTH, "string")).len(),
                1,
                "{key}"
            );
            assert!(
                changes(
                    nested(MAX_DEPTH + 1, "integer"),
                    nested(MAX_DEPTH + 1, "string")
                )
                .is_empty(),
                "{key}"
            );
        }
    }

    #[test]
    fn maps_and_unconstrained_fields() {
        let map = |additional: Value, extra: Value| {
            let mut m = json!({ "type": "object" });
            if !additional.is_null() {
                m["additionalProperties"] = additional;
            }
            if let (Some(m), Some(extra)) = (m.as_object_mut(), extra.as_object()) {
                m.extend(extra.clone());
            }
            widget(json!({ "labels": m }), json!({}))
        };
        let strings = json!({ "type": "string" });
        assert_eq!(
            changes(
                map(strings.clone(), json!({})),
                map(json!(false), json!({}))
            ),
            ["spec.labels: additional properties are no longer allowed"]
        );
        assert_eq!(
            changes(map(json!(true), json!({})), map(json!(false), json!({}))),
            ["spec.labels: additional properties are no longer allowed"]
        );
        assert_eq!(
            changes(map(strings.clone(), json!({})), map(Value::Null, json!({}))),
            ["spec.labels: additionalProperties removed (every map key would be pruned)"]
        );
        // Removed while unknown fields are preserved: nothing is pruned.
        let keep = json!({ "x-kubernetes-preserve-unknown-fields": true });
        assert!(changes(map(strings.clone(), keep.clone()), map(Value::Null, keep)).is_empty());
        // Declaring a field that accepts anything constrains nothing.
        let free = |properties: Value| {
            widget(
                json!({}),
                json!({ "x-kubernetes-preserve-unknown-fields": true, "properties": properties }),
            )
        };
        for accepting in [
            json!({ "description": "anything", "title": "t", "example": 1 }),
            json!({ "x-kubernetes-preserve-unknown-fields": true }),
        ] {
            assert!(
                changes(free(json!({})), free(json!({ "x": accepting }))).is_empty(),
                "{accepting}"
            );
        }
        for constraining in [
            json!({ "x-kubernetes-preserve-unknown-fields": false }),
            json!({ "description": "d", "type": "string" }),
        ] {
            assert_eq!(
                changes(free(json!({})), free(json!({ "x": constraining }))).len(),
                1,
                "{constraining}"
            );
        }
    }

    #[test]
    fn keywords_that_stay_the_same_are_no_change() {
        let field = |schema: Value| widget(json!({ "x": schema }), json!({}));
        let kept = json!({
            "type": "array",
            "items": { "type": "integer", "minimum": 1, "maximum": 9, "multipleOf": 2,
                       "exclusiveMinimum": true, "default": 4 },
            "minItems": 1, "maxItems": 5,
            "x-kubernetes-list-type": "set",
        });
        assert!(changes(field(kept.clone()), field(kept.clone())).is_empty());
        // Each one changed, alone, is named.
        let changed = |pointer: &str, value: Value| {
            let mut new = kept.clone();
            *new.pointer_mut(pointer).unwrap() = value;
            changes(field(kept.clone()), field(new))
        };
        assert_eq!(
            changed("/items/multipleOf", json!(3)),
            ["spec.x[]: multipleOf → 3.0"]
        );
        assert_eq!(
            changed("/items/default", json!(5)),
            ["spec.x[]: default 4 → 5"]
        );
        assert_eq!(
            changed("/items/minimum", json!(2)),
            ["spec.x[]: minimum 1 → 2"]
        );
        assert_eq!(
            changed("/items/maximum", json!(8)),
            ["spec.x[]: maximum 9 → 8"]
        );
        assert_eq!(
            changed("/x-kubernetes-list-type", json!("atomic")),
            ["spec.x: x-kubernetes-list-type set → atomic"]
        );
        let mut without = kept.clone();
        without["items"]
            .as_object_mut()
            .unwrap()
            .remove("exclusiveMinimum");
        assert_eq!(
            changes(field(without), field(kept.clone())),
            ["spec.x[]: exclusiveMinimum added"]
        );
    }

    #[test]
    fn declaring_a_field_under_preserved_unknown_fields() {
        let free = |properties: Value| json!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": properties });
        let root = |spec: Value, status: Value| json!({ "type": "object", "properties": { "spec": spec, "status": status } });
        let known = json!({ "size": { "type": "integer" } });
        let before = root(free(known.clone()), free(json!({})));
        // A field declared before, declared again: no change.
        assert!(changes(before.clone(), before.clone()).is_empty());
        // A new constrained field could hold anything before.
        let mut color = known.clone();
        color["color"] = json!({ "type": "string" });
        assert_eq!(
            changes(before.clone(), root(free(color), free(json!({})))),
            ["spec.color: now declared (it could hold any value before)"]
        );
        // kbind's own record under status never waits; the same name elsewhere, or another
        // field under status, does.
        let record = json!({ "kbindSync": { "type": "object" } });
        assert!(
            changes(
                before.clone(),
                root(free(known.clone()), free(record.clone()))
            )
            .is_empty()
        );
        let mut spec_record = known.clone();
        spec_record["kbindSync"] = json!({ "type": "object" });
        assert_eq!(
            changes(before.clone(), root(free(spec_record), free(json!({})))),
            ["spec.kbindSync: now declared (it could hold any value before)"]
        );
        assert_eq!(
            changes(
                before,
                root(free(known), free(json!({ "phase": { "type": "string" } })))
            ),
            ["status.phase: now declared (it could hold any value before)"]
        );
    }

    #[test]
    fn numbers_and_lists_are_shown_short() {
        assert_eq!(number(3.0), "3");
        assert_eq!(number(-3.0), "-3");
        assert_eq!(number(2.5), "2.5");
        assert_eq!(number(1e15), "1000000000000000");
        assert_eq!(number(1e16), "10000000000000000");
        assert_eq!(number(-1e16), "-10000000000000000");
        let values: Vec<Value> = (0..12).map(|i| json!(i)).collect();
        assert_eq!(list(&values[..10]), "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]");
        assert_eq!(
            list(&values[..11]),
            "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, … 1 more]"
        );
        assert_eq!(list(&values[..1]), "[0]");
    }

    #[test]
    fn pruning_and_requirements_at_their_edges() {
        // Unknown data at the bottom of a closed nesting: found down to MAX_DEPTH, not looked
        // for deeper (the work is bounded) — through objects and through list items alike.
        let closed = |levels: usize, through_lists: bool| {
            let (mut schema, mut value) = (
                json!({ "type": "object", "properties": {} }),
                json!({ "unknown": 1 }),
            );
            for _ in 0..levels {
                let field = if through_lists {
                    value = json!({ "n": [value] });
                    json!({ "type": "array", "items": schema })
                } else {
                    value = json!({ "n": value });
                    schema
                };
                schema = json!({ "type": "object", "properties": { "n": field } });
            }
            pruned_under(&value, &schema)
        };
        for through_lists in [false, true] {
            assert!(closed(MAX_DEPTH, through_lists), "lists: {through_lists}");
            assert!(
                !closed(MAX_DEPTH + 2, through_lists),
                "lists: {through_lists}"
            );
        }
        // Required: metadata is the API server's; a defaulted field may be missing.
        let schema = json!({ "type": "object", "required": ["metadata", "spec"], "properties": {
            "spec": { "type": "object", "required": ["size"], "properties": { "size": { "type": "integer" } } },
        } });
        assert!(!invalid_under(&json!({ "spec": { "size": 1 } }), &schema));
        assert!(invalid_under(&json!({ "metadata": {} }), &schema));
        let defaulted = json!({ "type": "object", "required": ["spec"], "properties": {
            "spec": { "type": "object", "default": {} },
        } });
        assert!(!invalid_under(&json!({}), &defaulted));
        // A wrong type at the bottom of a nesting: found down to MAX_DEPTH, not deeper; a schema
        // that is not an object checks nothing.
        let typed = |levels: usize| {
            let (mut schema, mut value) = (json!({ "type": "integer" }), json!("not a number"));
            for _ in 0..levels {
                schema = json!({ "type": "object", "properties": { "n": schema } });
                value = json!({ "n": value });
            }
            invalid_under(
                &json!({ "spec": value }),
                &json!({ "type": "object", "properties": { "spec": schema } }),
            )
        };
        assert!(typed(MAX_DEPTH - 1));
        assert!(!typed(MAX_DEPTH + 1));
        assert!(!violates(&json!("text"), &json!("junk"), 1));
        assert!(violates(&json!("text"), &json!({ "type": "integer" }), 1));
        // Each type takes its own values only.
        let values = [
            json!("s"),
            json!(-1),
            json!(u64::MAX),
            json!(1.5),
            json!(true),
            json!([1]),
            json!({ "a": 1 }),
        ];
        let takes = [
            ("string", vec![0]),
            ("integer", vec![1, 2]),
            ("number", vec![1, 2, 3]),
            ("boolean", vec![4]),
            ("array", vec![5]),
            ("object", vec![6]),
        ];
        for (kind, ok) in takes {
            for (i, value) in values.iter().enumerate() {
                assert_eq!(
                    violates(value, &json!({ "type": kind }), 1),
                    !ok.contains(&i),
                    "{kind} {value}"
                );
            }
        }
        // Bounds: a value at a bound is valid, one past it is not.
        let bounds = [
            (json!({ "minimum": 2 }), json!(2), json!(1)),
            (json!({ "maximum": 2 }), json!(2), json!(3)),
            (json!({ "minLength": 2 }), json!("ab"), json!("a")),
            (json!({ "maxLength": 2 }), json!("ab"), json!("abc")),
            (json!({ "minItems": 2 }), json!([1, 2]), json!([1])),
            (json!({ "maxItems": 2 }), json!([1, 2]), json!([1, 2, 3])),
            (json!({ "minProperties": 1 }), json!({ "a": 1 }), json!({})),
            (
                json!({ "maxProperties": 1 }),
                json!({ "a": 1 }),
                json!({ "a": 1, "b": 2 }),
            ),
        ];
        for (schema, at, past) in bounds {
            assert!(!violates(&at, &schema, 1), "{schema} {at}");
            assert!(violates(&past, &schema, 1), "{schema} {past}");
        }
        // Through list items and map values, at every level.
        let items = json!({ "type": "array", "items": { "type": "integer" } });
        assert!(violates(&json!([1, "x"]), &items, 1));
        assert!(!violates(&json!([1, 2]), &items, 1));
        let deep_items = |levels: usize| {
            let (mut schema, mut value) = (items.clone(), json!(["x"]));
            for _ in 0..levels {
                schema = json!({ "type": "array", "items": schema });
                value = json!([value]);
            }
            violates(&value, &schema, 1)
        };
        assert!(deep_items(MAX_DEPTH - 2));
        assert!(!deep_items(MAX_DEPTH));
        let map = json!({ "type": "object", "additionalProperties": { "type": "integer" } });
        assert!(violates(&json!({ "a": "x" }), &map, 1));
        assert!(!violates(&json!({ "a": 1 }), &map, 1));
        let deep_map = |levels: usize| {
            let (mut schema, mut value) = (map.clone(), json!({ "a": "x" }));
            for _ in 0..levels {
                schema = json!({ "type": "object", "additionalProperties": schema });
                value = json!({ "a": value });
            }
            violates(&value, &schema, 1)
        };
        assert!(deep_map(MAX_DEPTH - 2));
        assert!(!deep_map(MAX_DEPTH));
        let int_or_string = json!({ "x-kubernetes-int-or-string": true });
        for (i, value) in values.iter().enumerate() {
            assert_eq!(
                violates(value, &int_or_string, 1),
                ![0, 1, 2].contains(&i),
                "{value}"
            );
        }
    }

    #[test]
    fn a_versions_root_is_shown_as_root() {
        assert_eq!(super::shown(""), "(root)");
        assert_eq!(super::shown("v1: "), "v1: (root)");
        assert_eq!(super::shown("spec"), "spec");
        assert_eq!(super::shown("v1: spec"), "v1: spec");
        assert_eq!(join("", "spec"), "spec");
        assert_eq!(join("v1: ", "spec"), "v1: spec");
        assert_eq!(join("spec", "size"), "spec.size");
    }

    #[test]
    fn crd_level_changes() {
        let v = |name: &str, served: bool, storage: bool, schema: Value| json!({ "name": name, "served": served, "storage": storage, "schema": { "openAPIV3Schema": schema } });
        let a = widget(json!({ "size": { "type": "integer" } }), json!({}));
        let b = widget(json!({ "size": { "type": "string" } }), json!({}));
        let two = spec_with(json!([
            v("v1", true, true, a.clone()),
            v("v2", true, false, a.clone())
        ]));
        // A new version is compatible.
        let one_version = spec_with(json!([v("v1", true, true, a.clone())]));
        assert!(
            breaking_changes(&one_version, &two).0.is_empty(),
            "a new version"
        );
        // A served version removed.
        let only_v2 = spec_with(json!([v("v2", true, true, a.clone())]));
        let (listed, _) = breaking_changes(&two, &only_v2);
        assert_eq!(
            listed[0].to_string(),
            "<versions>: version v1 is no longer served"
        );
        // Storage moves to an identical version: lossless, compatible.
        let moved = spec_with(json!([
            v("v1", true, false, a.clone()),
            v("v2", true, true, a.clone())
        ]));
        assert!(
            breaking_changes(&two, &moved).0.is_empty(),
            "storage moves losslessly"
        );
        // Storage moves to a different version: breaking, and the version prefix is shown.
        let differs = spec_with(json!([
            v("v1", true, false, a.clone()),
            v("v2", true, true, b.clone())
        ]));
        let (listed, _) = breaking_changes(&two, &differs);
        let shown: Vec<String> = listed.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            vec![
                "<versions>: storage version v1 → v2, whose schemas differ (not lossless)",
                "v2: spec.size: type integer → string",
            ]
        );
        // The version prefix shows whenever either side serves several versions, not otherwise.
        let shown = |old: &CustomResourceDefinitionSpec, new: &CustomResourceDefinitionSpec| {
            breaking_changes(old, new)
                .0
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        };
        let one_b = spec_with(json!([v("v1", true, true, b.clone())]));
        let two_b = spec_with(json!([
            v("v1", true, true, b.clone()),
            v("v2", true, false, a.clone())
        ]));
        assert_eq!(
            shown(&one_version, &one_b),
            ["spec.size: type integer → string"]
        );
        assert_eq!(
            shown(&one_version, &two_b),
            ["v1: spec.size: type integer → string"]
        );
        assert!(
            shown(&two, &one_b).contains(&"v1: spec.size: type integer → string".to_owned()),
            "{:?}",
            shown(&two, &one_b)
        );
        // Scope.
        let mut cluster = one_version.clone();
        cluster.scope = "Cluster".into();
        assert_eq!(
            breaking_changes(&one_version, &cluster).0[0].to_string(),
            "<scope>: scope Namespaced → Cluster"
        );
        // Printer columns and short names are compatible.
        let mut decorated = one_version.clone();
        decorated.names.short_names = Some(vec!["wd".into()]);
        decorated.versions[0].additional_printer_columns = Some(vec![
            serde_json::from_value(
                json!({ "name": "Size", "type": "integer", "jsonPath": ".spec.size" }),
            )
            .unwrap(),
        ]);
        assert!(breaking_changes(&one_version, &decorated).0.is_empty());
        // The status subresource removed.
        let mut with_status = one_version.clone();
        with_status.versions[0].subresources =
            Some(serde_json::from_value(json!({ "status": {} })).unwrap());
        assert_eq!(
            breaking_changes(&with_status, &one_version).0[0].to_string(),
            "status: the status subresource is removed"
        );
        // ... and added (#33.5).
        assert_eq!(
            breaking_changes(&one_version, &with_status).0[0].to_string(),
            "status: the status subresource is added (status written with the object is dropped)"
        );
        // The scale subresource removed, or its paths changed.
        let scaled = |path: &str| {
            let mut spec = with_status.clone();
            spec.versions[0].subresources = Some(
                serde_json::from_value(json!({ "status": {}, "scale": { "specReplicasPath": path, "statusReplicasPath": ".status.replicas" } }))
                    .unwrap(),
            );
            spec
        };
        assert_eq!(
            breaking_changes(&scaled(".spec.replicas"), &with_status).0[0].to_string(),
            "scale: the scale subresource is removed"
        );
        assert_eq!(
            breaking_changes(&scaled(".spec.replicas"), &scaled(".spec.size")).0[0].to_string(),
            "scale: the scale subresource's paths change (.spec.replicas → .spec.size)"
        );
        assert!(
            breaking_changes(&scaled(".spec.replicas"), &scaled(".spec.replicas"))
                .0
                .is_empty()
        );
    }

    #[test]
    fn hostile_schemas_are_bounded() {
        // Thousands of removed fields: at most MAX_LISTED listed, the rest counted.
        let many: serde_json::Map<String, Value> = (0..1000)
            .map(|i| (format!("f{i:04}"), json!({ "type": "string" })))
            .collect();
        let old = widget(Value::Object(many), json!({}));
        let new = widget(json!({}), json!({}));
        let (listed, more) = breaking_changes(&one(old), &one(new));
        assert_eq!((listed.len(), more), (MAX_LISTED, 900));
        // A schema nested deeper than MAX_DEPTH (a provider's answer cannot nest much deeper:
        // JSON is parsed with a recursion limit of 128): compared up to the bound.
        let mut deep = json!({ "type": "string" });
        for _ in 0..100 {
            deep = json!({ "type": "object", "properties": { "x": deep } });
        }
        let _ = breaking_changes(&one(deep.clone()), &one(json!({ "type": "object" })));
        assert!(!invalid_under(&json!({ "x": {} }), &deep));
        // Long rule text is cut.
        let rule = "x".repeat(10_000);
        let (listed, _) = breaking_changes(
            &one(widget(json!({}), json!({}))),
            &one(widget(
                json!({}),
                json!({ "x-kubernetes-validations": [{ "rule": rule }] }),
            )),
        );
        assert!(listed[0].change.chars().count() < 120);
    }

    #[test]
    fn the_structural_check_finds_objects_a_new_schema_rejects() {
        let schema = widget(
            json!({
                "size": { "type": "integer", "minimum": 1, "maximum": 10 },
                "color": { "type": "string", "enum": ["red", "blue"] },
                "shape": { "type": "string", "maxLength": 5 },
                "tags": { "type": "array", "maxItems": 2, "items": { "type": "string" } },
                "labels": { "type": "object", "additionalProperties": { "type": "string" } },
                "port": { "x-kubernetes-int-or-string": true },
                "note": { "type": "string", "nullable": true },
            }),
            json!({ "required": ["size"] }),
        );
        let object = |spec: Value| json!({ "apiVersion": "example.org/v1", "kind": "Widget", "metadata": { "name": "w" }, "spec": spec });
        let cases = [
            (
                "valid",
                json!({ "size": 3, "color": "red", "tags": ["a"], "labels": { "a": "b" }, "port": "http", "note": null }),
                false,
            ),
            ("missing required", json!({ "color": "red" }), true),
            ("wrong type", json!({ "size": "3" }), true),
            ("enum", json!({ "size": 3, "color": "green" }), true),
            ("below minimum", json!({ "size": 0 }), true),
            ("above maximum", json!({ "size": 11 }), true),
            ("too long", json!({ "size": 3, "shape": "circle" }), true),
            (
                "too many items",
                json!({ "size": 3, "tags": ["a", "b", "c"] }),
                true,
            ),
            ("item type", json!({ "size": 3, "tags": [1] }), true),
            (
                "map value type",
                json!({ "size": 3, "labels": { "a": 1 } }),
                true,
            ),
            ("int-or-string", json!({ "size": 3, "port": 8080 }), false),
            (
                "int-or-string wrong",
                json!({ "size": 3, "port": true }),
                true,
            ),
            ("null where not nullable", json!({ "size": null }), true),
            (
                "unknown field (pruned, not rejected)",
                json!({ "size": 3, "extra": 1 }),
                false,
            ),
        ];
        let mut defaulted = schema.clone();
        defaulted["properties"]["spec"]["properties"]["size"]["default"] = json!(1);
        assert!(
            !invalid_under(&object(json!({ "color": "red" })), &defaulted),
            "a defaulted required field"
        );
        for (name, spec, invalid) in cases {
            assert_eq!(invalid_under(&object(spec), &schema), invalid, "{name}");
        }
        // No spec at all while spec is not required at the root: valid.
        assert!(!invalid_under(&json!({ "metadata": {} }), &schema));
        // A root that requires spec.
        let mut strict = schema.clone();
        strict["required"] = json!(["spec"]);
        assert!(invalid_under(&json!({ "metadata": {} }), &strict));
    }
}
